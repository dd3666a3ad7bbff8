//! Replicas and the AOF must end up with exactly the primary's keys: the module propagates the
//! effects of each SEM.* command (ZADD/ZREM/SET/PEXPIREAT with absolute values), never the
//! command itself, whose outcome depends on the clock and on random identifiers.

mod common;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::time::Duration;

use common::state::snapshot_of_all_keys;
use common::stream::{aof_commands, Command, ReplicationStream};
use common::*;

/// Short leases that expire during the workload, in seconds.
const SHORT_LEASE: &str = "0.15";
/// Leases that must outlive the whole test, restarts included.
const LONG_LEASE: &str = "60";

/// The semaphores [`mixed_workload`] uses.
const SEMAPHORES: [&str; 4] = ["jobs", "mixed", "queue", "burst"];

/// The module's write commands: none may ever appear in a replicated stream or an AOF.
const SEM_COMMANDS: [&str; 5] = [
    "SEM.ACQUIRE",
    "SEM.ACQUIREFAIR",
    "SEM.REFRESH",
    "SEM.RELEASE",
    "SEM.GET",
];

/// A server whose every write reaches the AOF before it replies.
const AOF_ARGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
];

// ---------------------------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------------------------

/// `SEM.ACQUIREFAIR ... WITHTICKET`: the identifier and ticket granted, or `None` when refused.
fn acquire_fair_with_ticket(
    conn: &mut redis::Connection,
    name: &str,
    limit: &str,
    lease: &str,
    id: Option<&str>,
) -> Option<(String, u64)> {
    let mut args = vec!["SEM.ACQUIREFAIR", name, limit, lease];
    if let Some(id) = id {
        args.extend(["ID", id]);
    }
    args.push("WITHTICKET");
    run(conn, &args)
}

/// Plain and fair semaphores through grants, refusals, renewals, refreshes, releases, short
/// leases that expire and are pruned by later commands, and a fair semaphore that goes idle
/// (its keys expire) while its counter lives on. Asserts the primary's replies on the way.
/// Afterwards every holder left has a lease of [`LONG_LEASE`] or more.
fn mixed_workload(conn: &mut redis::Connection) {
    // Plain, limit 2: grants, a refusal, a renewal by identifier, refresh, release.
    let a: String = run(conn, &["SEM.ACQUIRE", "jobs", "2", LONG_LEASE, "ID", "a"]);
    assert_eq!(a, "a");
    let b: String = run(conn, &["SEM.ACQUIRE", "jobs", "2", LONG_LEASE]);
    let refused: Option<String> = run(conn, &["SEM.ACQUIRE", "jobs", "2", LONG_LEASE]);
    assert_eq!(refused, None, "jobs is full");
    let renewed: String = run(conn, &["SEM.ACQUIRE", "jobs", "2", LONG_LEASE, "ID", "a"]);
    assert_eq!(renewed, "a", "re-acquiring with the same ID renews");
    let refreshed: i64 = run(conn, &["SEM.REFRESH", "jobs", &b, "120"]);
    assert_eq!(refreshed, 1);
    let released: i64 = run(conn, &["SEM.RELEASE", "jobs", "a"]);
    assert_eq!(released, 1);
    let released_twice: i64 = run(conn, &["SEM.RELEASE", "jobs", "a"]);
    assert_eq!(released_twice, 0);
    // A refused command of the wrong kind changes nothing anywhere.
    assert!(error_of(conn, &["SEM.ACQUIREFAIR", "jobs", "5", LONG_LEASE]).starts_with("ERR "));

    // Plain with short holders beside a long one: their expiry is pruning by a later command
    // (ZREM), not the key's own expiry, since the anchor keeps the key alive.
    let _: String = run(
        conn,
        &["SEM.ACQUIRE", "mixed", "5", LONG_LEASE, "ID", "anchor"],
    );
    for id in ["s1", "s2", "s3"] {
        let _: String = run(conn, &["SEM.ACQUIRE", "mixed", "5", SHORT_LEASE, "ID", id]);
    }

    // Fair: tickets, a refusal (takes no ticket), a renewal (keeps its ticket). The refusal
    // comes before the short holder, so it cannot depend on how fast the commands run.
    // A fresh name's first fair ticket is the clock of its grant, its n-th that + n - 1.
    let fresh = FirstGrant::before(conn);
    let (f1, queue) = acquire_fair_with_ticket(conn, "queue", "2", LONG_LEASE, Some("f1"))
        .expect("a free permit");
    assert_eq!(f1, "f1");
    let queue = fresh.ticket(conn, queue as i64) as u64;
    assert_eq!(
        acquire_fair_with_ticket(conn, "queue", "1", LONG_LEASE, None),
        None
    );
    let f2 = acquire_fair_with_ticket(conn, "queue", "2", SHORT_LEASE, Some("f2"));
    assert_eq!(f2, Some(("f2".into(), queue + 1)));
    let f1_again = acquire_fair_with_ticket(conn, "queue", "2", LONG_LEASE, Some("f1"));
    assert_eq!(f1_again, Some(("f1".into(), queue)));

    // Fair with short holders only: the whole semaphore goes idle and its keys expire.
    let fresh = FirstGrant::before(conn);
    let (_, burst) = acquire_fair_with_ticket(conn, "burst", "3", SHORT_LEASE, Some("b1"))
        .expect("a free permit");
    let burst = fresh.ticket(conn, burst as i64) as u64;
    for (id, ticket) in [("b2", burst + 1), ("b3", burst + 2)] {
        let got = acquire_fair_with_ticket(conn, "burst", "3", SHORT_LEASE, Some(id));
        assert_eq!(got, Some((id.into(), ticket)));
    }

    // SEM.GET only reads, so it sees the expiry without pruning anything.
    wait_until("the short leases expired", Duration::from_secs(5), || {
        let mixed: i64 = run(conn, &["SEM.GET", "mixed"]);
        let queue: i64 = run(conn, &["SEM.GET", "queue"]);
        let burst: i64 = run(conn, &["SEM.GET", "burst"]);
        (mixed, queue, burst) == (1, 1, 0)
    });
    assert_eq!(zset(conn, "mixed").len(), 4, "reads prune nothing");

    // Later writes prune the expired holders.
    let late: String = run(
        conn,
        &["SEM.ACQUIRE", "mixed", "2", LONG_LEASE, "ID", "late"],
    );
    assert_eq!(late, "late", "the expired holders no longer count");
    let ids: Vec<String> = zset(conn, "mixed").into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, ["anchor", "late"]);
    let lost: i64 = run(conn, &["SEM.REFRESH", "mixed", "s1", LONG_LEASE]);
    assert_eq!(lost, 0, "an expired holder cannot refresh");
    let released_expired: i64 = run(conn, &["SEM.RELEASE", "queue", "f2"]);
    assert_eq!(released_expired, 0, "an expired holder's release says so");
    // burst's grants came between: the node's floor is one past its last ticket.
    let floor = ticket_floor(conn) as u64;
    let f3 = acquire_fair_with_ticket(conn, "queue", "2", LONG_LEASE, Some("f3"));
    assert_eq!(f3, Some(("f3".into(), (queue + 2).max(floor))));

    // burst's keys expire at its latest deadline (PEXPIREAT); its counter has no expiry, so
    // tickets keep growing after the idle period.
    wait_until("burst's keys expired", Duration::from_secs(5), || {
        run::<i64>(conn, &["EXISTS", "burst", "burst:owner"]) == 0
    });
    let floor = ticket_floor(conn) as u64;
    let after_idle = acquire_fair_with_ticket(conn, "burst", "3", LONG_LEASE, None);
    assert_eq!(
        after_idle.map(|(_, ticket)| ticket),
        Some((burst + 3).max(floor))
    );
}

/// The keys [`mixed_workload`] leaves behind.
fn keys_after_mixed_workload() -> BTreeSet<String> {
    [
        "jobs",
        "mixed",
        "queue",
        "queue:owner",
        "queue:counter",
        "burst",
        "burst:owner",
        "burst:counter",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

// ---------------------------------------------------------------------------------------------
// Snapshots of a server's state
// ---------------------------------------------------------------------------------------------

/// What SEM.GET reports for each of `names`: the count, and the JSON document without the
/// `ms_left` fields (which depend on when it is asked).
fn sem_get_reports(conn: &mut redis::Connection, names: &[&str]) -> Vec<(i64, serde_json::Value)> {
    names
        .iter()
        .map(|name| {
            let count: i64 = run(conn, &["SEM.GET", name]);
            let text: String = run(conn, &["SEM.GET", name, "JSON"]);
            let mut doc: serde_json::Value = serde_json::from_str(&text).expect("SEM.GET JSON");
            for holder in doc["holders"].as_array_mut().expect("holders") {
                holder
                    .as_object_mut()
                    .expect("holder")
                    .remove("ms_left")
                    .expect("ms_left");
            }
            (count, doc)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Propagated commands: the replication stream and the AOF
// ---------------------------------------------------------------------------------------------

/// The propagated commands carry effects only: no SEM.* command, the ZADD/ZREM/SET/PEXPIREAT
/// the workload implies, and expiries as absolute Unix ms.
fn assert_effects_only(commands: &[Command], started_at_ms: i64) {
    let names: BTreeSet<String> = commands.iter().map(|c| c[0].to_uppercase()).collect();
    for sem in SEM_COMMANDS {
        assert!(!names.contains(sem), "{sem} was propagated: {commands:?}");
    }
    for effect in ["ZADD", "ZREM", "SET", "PEXPIREAT"] {
        assert!(names.contains(effect), "no {effect} in {names:?}");
    }
    for command in commands.iter().filter(|c| c[0] == "PEXPIREAT") {
        let at: i64 = command[2].parse().expect("PEXPIREAT time");
        assert!(at >= started_at_ms, "not an absolute time: {command:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn a_replica_holds_exactly_the_primarys_keys() {
    let primary = Server::start_with(&PRIMARY_ARGS);
    let replica = start_replica_of(&primary);
    let mut on_primary = primary.connection();
    let mut on_replica = replica.connection();

    mixed_workload(&mut on_primary);
    wait_for_replica(&mut on_primary);

    let primary_keys = snapshot_of_all_keys(&mut on_primary);
    let names: BTreeSet<String> = primary_keys.keys().cloned().collect();
    assert_eq!(names, keys_after_mixed_workload());
    assert_eq!(snapshot_of_all_keys(&mut on_replica), primary_keys);
    assert_eq!(
        sem_get_reports(&mut on_replica, &SEMAPHORES),
        sem_get_reports(&mut on_primary, &SEMAPHORES)
    );

    // The SEM.* write commands are refused on the replica, before touching anything.
    for write in [
        &["SEM.ACQUIRE", "jobs", "5", "10"][..],
        &["SEM.ACQUIREFAIR", "queue", "5", "10"],
        &["SEM.REFRESH", "mixed", "anchor", "10"],
        &["SEM.RELEASE", "mixed", "anchor"],
    ] {
        let err = error_of(&mut on_replica, write);
        assert!(
            err.starts_with("READONLY"),
            "{write:?} on the replica: {err}"
        );
    }

    // Releasing every holder deletes the sorted sets on both; the counters stay.
    let holders: Vec<(&str, String)> = SEMAPHORES
        .iter()
        .flat_map(|&name| {
            zset(&mut on_primary, name)
                .into_iter()
                .map(move |(id, _)| (name, id))
        })
        .collect();
    for (name, id) in &holders {
        let released: i64 = run(&mut on_primary, &["SEM.RELEASE", name, id]);
        assert_eq!(released, 1, "release {id} of {name}");
    }
    wait_for_replica(&mut on_primary);
    let primary_keys = snapshot_of_all_keys(&mut on_primary);
    let names: Vec<&str> = primary_keys.keys().map(String::as_str).collect();
    assert_eq!(names, ["burst:counter", "queue:counter"]);
    assert_eq!(snapshot_of_all_keys(&mut on_replica), primary_keys);
}

#[test]
fn the_replication_stream_carries_effects_never_sem_commands() {
    let started_at_ms = unix_ms_now();
    let primary = Server::start_with(&PRIMARY_ARGS);
    let mut stream = ReplicationStream::attach(primary.port);
    let mut conn = primary.connection();

    mixed_workload(&mut conn);
    // The stream is ordered: once the marker arrives, everything before it has too.
    let _: () = run(&mut conn, &["SET", "end-of-workload", "1"]);
    let commands = stream.commands_until_set("end-of-workload");

    assert_effects_only(&commands, started_at_ms);
}

#[test]
fn pruning_propagates_one_zrem_per_key() {
    let primary = Server::start_with(&PRIMARY_ARGS);
    let mut conn = primary.connection();
    let _: String = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "crowd", "10", "60", "ID", "stays"],
    );
    for id in ["a", "b", "c"] {
        let _: String = run(
            &mut conn,
            &["SEM.ACQUIREFAIR", "crowd", "10", "0.2", "ID", id],
        );
    }
    wait_until("the short holders expired", Duration::from_secs(5), || {
        run::<i64>(&mut conn, &["SEM.GET", "crowd"]) == 1
    });
    let mut stream = ReplicationStream::attach(primary.port);

    let _: String = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "crowd", "10", "60", "ID", "d"],
    );
    let _: () = run(&mut conn, &["SET", "end-of-prune", "1"]);
    let zrems: Vec<Command> = stream
        .commands_until_set("end-of-prune")
        .into_iter()
        .filter(|command| command[0].eq_ignore_ascii_case("ZREM"))
        .collect();
    let expected =
        |key: &str| -> Command { ["ZREM", key, "a", "b", "c"].map(String::from).to_vec() };
    assert_eq!(zrems, [expected("crowd"), expected("crowd:owner")]);
}

#[test]
fn an_aof_reload_restores_exactly_the_same_state() {
    let started_at_ms = unix_ms_now();
    let server = Server::start_with(&AOF_ARGS);
    let mut conn = server.connection();
    mixed_workload(&mut conn);
    let before = snapshot_of_all_keys(&mut conn);
    let names: BTreeSet<String> = before.keys().cloned().collect();
    assert_eq!(names, keys_after_mixed_workload());
    let reports_before = sem_get_reports(&mut conn, &SEMAPHORES);
    drop(conn);

    let dir = server.stop();
    assert_effects_only(&aof_commands(&dir), started_at_ms);

    let restarting_at_ms = unix_ms_now();
    let restarted = Server::restart_in(&dir, &AOF_ARGS);
    let mut conn = restarted.connection();
    assert_eq!(snapshot_of_all_keys(&mut conn), before);
    assert_eq!(sem_get_reports(&mut conn, &SEMAPHORES), reports_before);

    // Loading took a fencing floor from the clock (in microseconds), past any grant the file
    // may have missed: the reloaded counter goes on from there, then one by one again.
    let floor = info_sem(&mut conn)["sem_ticket_floor"];
    assert!(
        floor >= restarting_at_ms as u64 * 1000 && floor <= unix_ms_now() as u64 * 1000,
        "floor {floor} is the clock of the load"
    );
    let (holder, ticket) =
        acquire_fair_with_ticket(&mut conn, "queue", "3", LONG_LEASE, None).expect("a free permit");
    assert_eq!(ticket, floor);
    let _: i64 = run(&mut conn, &["SEM.RELEASE", "queue", &holder]);
    let after = acquire_fair_with_ticket(&mut conn, "queue", "3", LONG_LEASE, None);
    assert_eq!(after.map(|(_, ticket)| ticket), Some(floor + 1));
}

#[test]
fn a_write_that_finds_its_keys_expired_replicates_in_order() {
    // With active expiry off, the expired keys are still there when the SEM.* write opens
    // them: the write itself deletes them (propagating DEL) before adding the new holder, and
    // the replica must apply both in that order.
    let mut args = PRIMARY_ARGS.to_vec();
    args.extend(["--enable-debug-command", "yes"]);
    let primary = Server::start_with(&args);
    let replica = start_replica_of(&primary);
    let mut on_primary = primary.connection();
    let mut on_replica = replica.connection();
    let _: () = run(&mut on_primary, &["DEBUG", "SET-ACTIVE-EXPIRE", "0"]);

    let fresh = FirstGrant::before(&mut on_primary);
    let (x, first) = acquire_fair_with_ticket(&mut on_primary, "fair", "2", "0.1", Some("x"))
        .expect("a free permit");
    assert_eq!(x, "x");
    let first = fresh.ticket(&mut on_primary, first as i64) as u64;
    let _: String = run(
        &mut on_primary,
        &["SEM.ACQUIRE", "plain", "2", "0.1", "ID", "p"],
    );
    let _: String = run(
        &mut on_primary,
        &["SEM.ACQUIRE", "gone", "2", "0.1", "ID", "g"],
    );
    let expiry: i64 = ["fair", "plain", "gone"]
        .iter()
        .map(|key| run::<i64>(&mut on_primary, &["PEXPIRETIME", key]))
        .max()
        .expect("three keys");
    wait_until("the keys expired", Duration::from_secs(5), || {
        server_ms(&mut on_primary) > expiry
    });
    // DBSIZE counts keys without expiring any: all five are still there to be found expired.
    let still_there: i64 = run(&mut on_primary, &["DBSIZE"]);
    assert_eq!(
        still_there, 5,
        "fair, fair:owner, fair:counter, plain, gone"
    );

    let second = acquire_fair_with_ticket(&mut on_primary, "fair", "2", LONG_LEASE, Some("y"));
    assert_eq!(
        second,
        Some(("y".into(), first + 1)),
        "the counter outlived the sets"
    );
    let _: String = run(
        &mut on_primary,
        &["SEM.ACQUIRE", "plain", "1", LONG_LEASE, "ID", "q"],
    );
    let released: i64 = run(&mut on_primary, &["SEM.RELEASE", "gone", "g"]);
    assert_eq!(released, 0);
    wait_for_replica(&mut on_primary);

    let primary_keys = snapshot_of_all_keys(&mut on_primary);
    let names: Vec<&str> = primary_keys.keys().map(String::as_str).collect();
    assert_eq!(names, ["fair", "fair:counter", "fair:owner", "plain"]);
    assert_eq!(snapshot_of_all_keys(&mut on_replica), primary_keys);
    let names = ["fair", "plain", "gone"];
    assert_eq!(
        sem_get_reports(&mut on_replica, &names),
        sem_get_reports(&mut on_primary, &names)
    );
}

#[test]
fn a_replica_promoted_two_terms_behind_never_repeats_a_ticket() {
    // P hands out five tickets from the clock of its first grant on, which both replicas
    // receive. R2 then stops following (it keeps its data, as a paused or cut-off replica
    // would); R1 is promoted and hands out five tickets that R2 never sees; P and R1 die; R2 is
    // promoted last. Its own counter is two terms behind, so only the clock floor keeps it past
    // R1's tickets.
    let primary = Server::start_with(&PRIMARY_ARGS);
    let r1 = start_replica_of(&primary);
    let r2 = start_replica_of(&primary);
    let mut on_primary = primary.connection();
    let fresh = FirstGrant::before(&mut on_primary);
    let first: Vec<u64> = (0..5)
        .map(|_| acquire_fair_with_ticket(&mut on_primary, "job", "100", LONG_LEASE, None))
        .map(|granted| granted.expect("a free permit").1)
        .collect();
    let p_first = fresh.ticket(&mut on_primary, first[0] as i64) as u64;
    assert_eq!(first, (p_first..p_first + 5).collect::<Vec<u64>>());
    let acked: i64 = run(&mut on_primary, &["WAIT", "2", "5000"]);
    assert_eq!(acked, 2, "both replicas have P's five tickets");

    let mut on_r2 = r2.connection();
    let nobody = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let nobody_port = nobody.local_addr().expect("its address").port().to_string();
    drop(nobody);
    let _: () = run(&mut on_r2, &["REPLICAOF", "127.0.0.1", &nobody_port]);

    // P's tickets start from the clock of its first grant: a promotion in that same
    // millisecond would take a floor below them. Real failovers take seconds.
    std::thread::sleep(Duration::from_millis(10));
    let mut on_r1 = r1.connection();
    let _: () = run(&mut on_r1, &["REPLICAOF", "NO", "ONE"]);
    let r1_floor = info_sem(&mut on_r1)["sem_ticket_floor"];
    let second: Vec<u64> = (0..5)
        .map(|_| acquire_fair_with_ticket(&mut on_r1, "job", "100", LONG_LEASE, None))
        .map(|granted| granted.expect("a free permit").1)
        .collect();
    assert_eq!(
        info_sem(&mut on_r1)["sem_ticket_floor"],
        second[4] + 1,
        "R1's floor moved past its last ticket"
    );
    assert!(
        r1_floor > first[4],
        "R1's promotion took a floor above P's tickets"
    );
    assert_eq!(second[0], r1_floor, "R1 goes on from its floor");
    assert!(second.windows(2).all(|pair| pair[1] == pair[0] + 1));
    drop((on_primary, on_r1));
    drop((primary, r1));

    // Two promotions in one millisecond would take the same floor: real failovers take seconds.
    std::thread::sleep(Duration::from_millis(10));
    let _: () = run(&mut on_r2, &["REPLICAOF", "NO", "ONE"]);
    let counter: u64 = run(&mut on_r2, &["GET", "job:counter"]);
    assert_eq!(counter, first[4], "R2 never saw R1's tickets");
    let r2_floor = info_sem(&mut on_r2)["sem_ticket_floor"];
    let (_, third) = acquire_fair_with_ticket(&mut on_r2, "job", "100", LONG_LEASE, None)
        .expect("a free permit");
    assert!(
        third > *second.last().unwrap(),
        "R2 handed out {third} after R1's {second:?}"
    );
    assert_eq!(third, r2_floor);
}
