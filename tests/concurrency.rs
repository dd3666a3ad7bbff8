//! Many clients at once, and semaphores with very many holders: the limit holds under real
//! contention, and size changes nothing about the answers.

mod common;

use std::collections::HashSet;
use std::sync::Barrier;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use common::*;

/// Connections hammering one semaphore, each from its own thread.
const CLIENTS: usize = 50;
/// The limit they compete for.
const LIMIT: i64 = 3;
/// How long they hammer, and a bound on each client's attempts in case the server is fast.
const HAMMER_FOR: Duration = Duration::from_secs(2);
const MAX_ATTEMPTS_PER_CLIENT: u64 = 20_000;
/// Long enough that no holder expires mid-test: every permit is given back by SEM.RELEASE.
const HAMMER_LEASE: &str = "10";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Fair,
}

/// What the clients saw while hammering.
#[derive(Debug, Default)]
struct Tally {
    grants: u64,
    releases: u64,
    refusals: u64,
    /// The highest `INCR inside` reply: how many holders were in the critical section at once.
    max_inside: i64,
    /// Fair grants' tickets, in no particular order.
    tickets: Vec<u64>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.grants += other.grants;
        self.releases += other.releases;
        self.refusals += other.refusals;
        self.max_inside = self.max_inside.max(other.max_inside);
        self.tickets.extend(other.tickets);
    }
}

/// One acquisition attempt: the identifier (and, fair, the ticket) granted, or `None`.
fn try_acquire(conn: &mut redis::Connection, kind: Kind, name: &str) -> Option<(String, u64)> {
    let limit = LIMIT.to_string();
    match kind {
        Kind::Plain => run::<Option<String>>(conn, &["SEM.ACQUIRE", name, &limit, HAMMER_LEASE])
            .map(|id| (id, 0)),
        Kind::Fair => run(
            conn,
            &["SEM.ACQUIREFAIR", name, &limit, HAMMER_LEASE, "WITHTICKET"],
        ),
    }
}

/// One client: acquire, enter the critical section (`inside` counts its occupants), leave,
/// release; until time is up.
fn client(server: &Server, kind: Kind, name: &str, start: &Barrier) -> Tally {
    let mut conn = server.connection();
    let mut tally = Tally::default();
    start.wait();
    let until = Instant::now() + HAMMER_FOR;
    for _ in 0..MAX_ATTEMPTS_PER_CLIENT {
        if Instant::now() >= until {
            break;
        }
        let Some((id, ticket)) = try_acquire(&mut conn, kind, name) else {
            tally.refusals += 1;
            continue;
        };
        tally.grants += 1;
        if kind == Kind::Fair {
            tally.tickets.push(ticket);
        }
        let inside: i64 = run(&mut conn, &["INCR", "inside"]);
        tally.max_inside = tally.max_inside.max(inside);
        let _: i64 = run(&mut conn, &["DECR", "inside"]);
        let released: i64 = run(&mut conn, &["SEM.RELEASE", name, &id]);
        assert_eq!(released, 1, "{id} lost its permit before releasing it");
        tally.releases += 1;
    }
    tally
}

/// [`CLIENTS`] clients, started together, hammer `name`; their tallies summed.
fn hammer(server: &Server, kind: Kind, name: &str) -> Tally {
    let start = Barrier::new(CLIENTS);
    let mut total = Tally::default();
    thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| scope.spawn(|| client(server, kind, name, &start)))
            .collect();
        for handle in clients {
            total.add(handle.join().expect("a client panicked"));
        }
    });
    total
}

/// What must hold after any hammering, whatever the kind.
fn assert_the_limit_held(conn: &mut redis::Connection, name: &str, tally: &Tally) {
    assert!(tally.grants > 0, "nothing was granted: {tally:?}");
    assert!(tally.refusals > 0, "nobody was ever refused: {tally:?}");
    assert_eq!(tally.grants, tally.releases, "{tally:?}");
    assert!(tally.max_inside <= LIMIT, "limit exceeded: {tally:?}");
    assert!(
        tally.max_inside > 1,
        "never two holders at once: no real contention: {tally:?}"
    );
    let live: i64 = run(conn, &["SEM.GET", name]);
    assert_eq!(live, 0);
    let inside: i64 = run(conn, &["GET", "inside"]);
    assert_eq!(inside, 0);
}

#[test]
fn fifty_clients_never_exceed_a_plain_limit() {
    let server = Server::start();
    let tally = hammer(&server, Kind::Plain, "plain");
    let mut conn = server.connection();
    assert_the_limit_held(&mut conn, "plain", &tally);
}

#[test]
fn fifty_clients_never_exceed_a_fair_limit_and_take_one_ticket_per_grant() {
    let server = Server::start();
    let mut conn = server.connection();
    let fresh = FirstGrant::before(&mut conn);
    let tally = hammer(&server, Kind::Fair, "fair");
    assert_the_limit_held(&mut conn, "fair", &tally);

    // Refusals take no ticket, and every grant takes the next one: exactly `grants` tickets
    // from the clock of the first grant on.
    let lowest = *tally.tickets.iter().min().expect("fair grants");
    let first = fresh.ticket(&mut conn, lowest as i64) as u64;
    let counter: u64 = run(&mut conn, &["GET", "fair:counter"]);
    assert_eq!(counter, first + tally.grants - 1);
    let unique: HashSet<u64> = tally.tickets.iter().copied().collect();
    assert_eq!(
        unique.len(),
        tally.tickets.len(),
        "a ticket was handed out twice"
    );
    assert_eq!(
        unique,
        (first..first + tally.grants).collect::<HashSet<u64>>()
    );
}

/// Acquires `count` permits of `name`, pipelined in batches; returns the identifiers granted.
fn fill(
    conn: &mut redis::Connection,
    command: &str,
    name: &str,
    count: usize,
    lease: &str,
) -> Vec<String> {
    const BATCH: usize = 1000;
    let mut ids = Vec::with_capacity(count);
    while ids.len() < count {
        let mut pipe = redis::pipe();
        for _ in 0..BATCH.min(count - ids.len()) {
            pipe.cmd(command).arg(name).arg(1_000_000).arg(lease);
        }
        let granted: Vec<String> = pipe.query(conn).expect("pipelined acquisitions");
        ids.extend(granted);
    }
    ids
}

/// A semaphore holding this many live permits.
const MANY: usize = 100_000;
const HOUR: &str = "3600";

#[test]
fn a_plain_semaphore_with_100k_holders_still_answers() {
    let server = Server::start();
    let mut conn = server.connection();
    let ids = fill(&mut conn, "SEM.ACQUIRE", "big", MANY, HOUR);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        MANY,
        "identifiers are unique"
    );
    let zcard: usize = run(&mut conn, &["ZCARD", "big"]);
    assert_eq!(zcard, MANY);
    let live: usize = run(&mut conn, &["SEM.GET", "big"]);
    assert_eq!(live, MANY);

    let full = MANY.to_string();
    let refused: Option<String> = run(&mut conn, &["SEM.ACQUIRE", "big", &full, HOUR]);
    assert_eq!(refused, None, "exactly at the limit");
    let extra: String = run(
        &mut conn,
        &["SEM.ACQUIRE", "big", "1000000", HOUR, "ID", "extra"],
    );
    assert_eq!(extra, "extra");
    let live: usize = run(&mut conn, &["SEM.GET", "big"]);
    assert_eq!(live, MANY + 1);

    // Refreshing the first holder makes it the latest deadline, hence the key's expiry.
    let refreshed: i64 = run(&mut conn, &["SEM.REFRESH", "big", &ids[0], "7200"]);
    assert_eq!(refreshed, 1);
    let deadline: i64 = run(&mut conn, &["ZSCORE", "big", &ids[0]]);
    let expire_at: i64 = run(&mut conn, &["PEXPIRETIME", "big"]);
    assert_eq!(expire_at, deadline);

    let released: i64 = run(&mut conn, &["SEM.RELEASE", "big", "extra"]);
    assert_eq!(released, 1);
    let live: usize = run(&mut conn, &["SEM.GET", "big"]);
    assert_eq!(live, MANY);
}

#[test]
fn a_fair_semaphore_with_100k_holders_still_answers() {
    let server = Server::start();
    let mut conn = server.connection();
    let fresh = FirstGrant::before(&mut conn);
    let ids = fill(&mut conn, "SEM.ACQUIREFAIR", "bigfair", MANY, HOUR);
    let first = fresh.holder(&mut conn, "bigfair", &ids[0]) as u64;
    let holders: usize = run(&mut conn, &["ZCARD", "bigfair"]);
    let owners: usize = run(&mut conn, &["ZCARD", "bigfair:owner"]);
    let counter: u64 = run(&mut conn, &["GET", "bigfair:counter"]);
    assert_eq!(
        (holders, owners, counter),
        (MANY, MANY, first + MANY as u64 - 1)
    );
    let live: usize = run(&mut conn, &["SEM.GET", "bigfair"]);
    assert_eq!(live, MANY);
    let last_ticket: u64 = run(&mut conn, &["ZSCORE", "bigfair:owner", &ids[MANY - 1]]);
    assert_eq!(
        last_ticket,
        first + MANY as u64 - 1,
        "tickets follow the grant order"
    );

    let (id, ticket): (String, u64) = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "bigfair", "1000000", HOUR, "WITHTICKET"],
    );
    assert_eq!(ticket, first + MANY as u64);
    let refreshed: i64 = run(&mut conn, &["SEM.REFRESH", "bigfair", &ids[0], "7200"]);
    assert_eq!(refreshed, 1);
    let released: i64 = run(&mut conn, &["SEM.RELEASE", "bigfair", &id]);
    assert_eq!(released, 1);
    let owners: usize = run(&mut conn, &["ZCARD", "bigfair:owner"]);
    assert_eq!(owners, MANY, "the release removed its owner entry");
    let live: usize = run(&mut conn, &["SEM.GET", "bigfair"]);
    assert_eq!(live, MANY);
}

/// Fills `name` with `count` holders on a short lease, none of which expires before the fill
/// is over: otherwise the fill's own acquisitions would prune the first ones. The lease starts
/// at 0.2 s and doubles while filling took longer than the lease (a busy machine).
fn fill_with_short_leases(conn: &mut redis::Connection, name: &str, count: usize) {
    let mut lease_ms = 200;
    for _ in 0..5 {
        let _: i64 = run(conn, &["DEL", name]);
        let lease = format!("{}.{:03}", lease_ms / 1000, lease_ms % 1000);
        let started = Instant::now();
        fill(conn, "SEM.ACQUIRE", name, count, &lease);
        // The first holder's deadline is at least `started + lease`, after the last grant.
        if started.elapsed() < Duration::from_millis(lease_ms) {
            return;
        }
        lease_ms *= 2;
    }
    panic!("filling {count} holders took longer than {lease_ms} ms, five times");
}

#[test]
fn one_acquire_prunes_10k_expired_holders() {
    const EXPIRING: usize = 10_000;
    let server = Server::start();
    let mut conn = server.connection();
    fill_with_short_leases(&mut conn, "crowd", EXPIRING);
    // Without its expiry, Redis cannot delete the whole key at its PEXPIREAT first (which
    // would leave nothing to prune): the holders must go by pruning.
    let persisted: i64 = run(&mut conn, &["PERSIST", "crowd"]);
    assert_eq!(persisted, 1);
    let zcard: usize = run(&mut conn, &["ZCARD", "crowd"]);
    assert_eq!(zcard, EXPIRING);

    let deadline = Instant::now() + Duration::from_secs(10);
    while run::<i64>(&mut conn, &["SEM.GET", "crowd"]) > 0 {
        assert!(Instant::now() < deadline, "the holders never expired");
        sleep(Duration::from_millis(10));
    }
    let zcard: usize = run(&mut conn, &["ZCARD", "crowd"]);
    assert_eq!(zcard, EXPIRING, "SEM.GET prunes nothing");

    // Limit 1: granted only because none of the expired holders counts.
    let id: Option<String> = run(
        &mut conn,
        &["SEM.ACQUIRE", "crowd", "1", "60", "ID", "last"],
    );
    assert_eq!(id.as_deref(), Some("last"));
    assert_eq!(zset(&mut conn, "crowd").len(), 1);
    let deadline: i64 = run(&mut conn, &["ZSCORE", "crowd", "last"]);
    let expire_at: i64 = run(&mut conn, &["PEXPIRETIME", "crowd"]);
    assert_eq!(
        expire_at, deadline,
        "the key expires with its one holder again"
    );
}
