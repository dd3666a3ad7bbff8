//! Waiting never costs the host its data: waiting clients' memory is bounded (a share of
//! `maxmemory`, and never the room the server has left; a byte bound without `maxmemory`),
//! shown in `INFO sem`, and follows `CONFIG SET`; keys of semaphores the server evicts are
//! counted and logged. Each scenario runs against a real server, the cache ones side by side
//! with the same number of clients blocked in `BLPOP`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;

/// `INFO` fields of one section as numbers (the others left out).
fn info_numbers(conn: &mut redis::Connection, section: &str) -> BTreeMap<String, u64> {
    let info: String = run(conn, &["INFO", section]);
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .filter_map(|(key, value)| Some((key.to_string(), value.trim().parse().ok()?)))
        .collect()
}

fn used_memory(conn: &mut redis::Connection) -> u64 {
    info_numbers(conn, "memory")["used_memory"]
}

/// A server holding `keys` user keys of 1 KB, then `maxmemory` set to what it uses plus
/// `room` bytes under `policy`, and one holder of a limit-1 semaphore `{w}`.
fn filled_server(keys: usize, room: u64, policy: &str) -> Server {
    let server = Server::start();
    let mut conn = server.connection();
    let value = "v".repeat(1000);
    for chunk in (0..keys).collect::<Vec<_>>().chunks(500) {
        let mut mset = vec!["MSET".to_string()];
        for i in chunk {
            mset.extend([format!("user:{i}"), value.clone()]);
        }
        let args: Vec<&str> = mset.iter().map(String::as_str).collect();
        let _: String = run(&mut conn, &args);
    }
    let id: String = run(
        &mut conn,
        &["SEM.ACQUIRE", "{w}", "1", "600", "ID", "theholder"],
    );
    assert_eq!(id, "theholder");
    let maxmemory = (used_memory(&mut conn) + room).to_string();
    let _: String = run(&mut conn, &["CONFIG", "SET", "maxmemory", &maxmemory]);
    let _: String = run(&mut conn, &["CONFIG", "SET", "maxmemory-policy", policy]);
    server
}

/// `clients` connections, each sending `args` one after the other; their replies so far.
fn block_clients(server: &Server, clients: usize, args: &[&str]) -> Vec<RawClient> {
    (0..clients)
        .map(|_| {
            let mut client = RawClient::connect(server);
            client.send(args);
            client
        })
        .collect()
}

/// What a scenario left: user keys evicted, and the replies of the clients that were answered
/// within a moment (the others wait).
struct Outcome {
    evicted: u64,
    answered: Vec<String>,
    waiting: u64,
    /// The connections, kept open while the test looks.
    _clients: Vec<RawClient>,
}

fn run_scenario(
    server: &Server,
    clients: usize,
    args: &[&str],
    waiting: impl Fn() -> u64,
) -> Outcome {
    let mut conn = server.connection();
    let mut blocked = block_clients(server, clients, args);
    // The clients that are answered at once are answered within this.
    std::thread::sleep(Duration::from_millis(500));
    let waiting_now = waiting();
    let evicted = info_numbers(&mut conn, "stats")["evicted_keys"];
    let mut answered = Vec::new();
    for client in &mut blocked {
        client.set_read_timeout(Duration::from_millis(20));
        if let Some(reply) = client.try_reply() {
            answered.push(reply);
        }
    }
    Outcome {
        evicted,
        answered,
        waiting: waiting_now,
        _clients: blocked,
    }
}

/// A cache of user keys (`allkeys-lru`) with one holder; then 400 clients ask to wait. The same
/// 400 clients blocked in `BLPOP` on a server holding the same show what the connections alone
/// evict; waiters evict no more than that and the share waiters may take, the holder keeps its
/// permit, and the clients refused a wait are told why.
#[test]
fn waiting_leaves_the_data_of_a_full_cache_alone() {
    const CLIENTS: usize = 400;
    const KEYS: usize = 8000;
    // Room for the connections themselves (18 to 38 KB each, by server), not for 400 waiters
    // on top (about 36 KB more each): unbounded, they would evict every user key.
    let room = 20 * 1024 * 1024;

    let plain = filled_server(KEYS, room, "allkeys-lru");
    let baseline = run_scenario(&plain, CLIENTS, &["BLPOP", "nothing", "600"], || {
        info_numbers(&mut plain.connection(), "clients")["blocked_clients"]
    });
    assert!(baseline.answered.is_empty(), "{:?}", baseline.answered);

    let server = filled_server(KEYS, room, "allkeys-lru");
    let mut conn = server.connection();
    let limit = info_sem(&mut conn)["sem_waiters_memory_limit"];
    let maxmemory = info_numbers(&mut conn, "memory")["maxmemory"];
    assert_eq!(limit, maxmemory / 100 * 5 + maxmemory % 100 * 5 / 100);
    let outcome = run_scenario(
        &server,
        CLIENTS,
        &["SEM.ACQUIRE", "{w}", "1", "600", "WAIT", "300"],
        || info_sem(&mut server.connection())["sem_waiters"],
    );
    let sem = info_sem(&mut conn);
    assert_eq!(sem["sem_waiters"], outcome.waiting);
    eprintln!(
        "BLPOP: {} keys evicted; waiters: {} keys evicted, {} wait ({} bytes, limit {limit}), {} \
         refused",
        baseline.evicted,
        outcome.evicted,
        outcome.waiting,
        sem["sem_waiters_memory"],
        outcome.answered.len()
    );
    // Waiters took at most their share; the rest were refused, each with the reason.
    assert!(sem["sem_waiters_memory"] <= limit, "{sem:?}");
    assert!(sem["sem_waiters_memory"] + 40_000 > limit, "{sem:?}");
    assert_eq!(outcome.waiting as usize + outcome.answered.len(), CLIENTS);
    assert!(!outcome.answered.is_empty(), "the bound refused nobody");
    for reply in &outcome.answered {
        assert!(
            reply.starts_with("-ERR waiting clients would take more than")
                || reply.starts_with("-ERR no memory left below maxmemory")
                || reply.starts_with("-OOM"),
            "{reply}"
        );
    }
    let refused = outcome
        .answered
        .iter()
        .filter(|reply| reply.starts_with("-ERR"))
        .count() as u64;
    assert_eq!(sem["sem_waits_refused_memory"], refused);
    // No more keys evicted than the BLPOP clients evict.
    assert!(
        outcome.evicted <= baseline.evicted,
        "{} evicted with waiters, {} with BLPOP",
        outcome.evicted,
        baseline.evicted
    );
    // The holder still holds its permit, and nobody else was granted it.
    let json = sem_json(&mut conn, "{w}");
    let holders = json["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 1, "{json}");
    assert_eq!(holders[0]["id"], "theholder", "{json}");
    assert_eq!(sem["sem_acquired"], 1);
}

/// Under `noeviction`, waiters never take the memory other clients' writes need: a 2 MB write
/// still fits after 300 clients asked to wait.
#[test]
fn under_noeviction_other_writes_keep_their_room() {
    // Room for 300 connections (18 to 38 KB each, by server) and a 2 MB write, not for 300
    // waiters on top (about 36 KB more each).
    let room = 24 * 1024 * 1024;
    let server = filled_server(2000, room, "noeviction");
    let mut conn = server.connection();
    let outcome = run_scenario(
        &server,
        300,
        &["SEM.ACQUIRE", "{w}", "1", "600", "WAIT", "300"],
        || info_sem(&mut server.connection())["sem_waiters"],
    );
    assert!(!outcome.answered.is_empty(), "the bound refused nobody");
    let sem = info_sem(&mut conn);
    assert!(sem["sem_waiters"] > 0);
    assert!(sem["sem_waiters_memory"] <= sem["sem_waiters_memory_limit"]);
    // A 2 MB write fits in what the waiters left.
    let big = "x".repeat(2 * 1024 * 1024);
    let written: redis::RedisResult<String> =
        redis::cmd("SET").arg("after").arg(&big).query(&mut conn);
    assert_eq!(
        written.map_err(|err| error_text(&err)),
        Ok("OK".to_string())
    );
    let _: i64 = run(&mut conn, &["DEL", "after"]);
}

/// The bound follows `CONFIG SET maxmemory` and the module's settings at run time, and holds
/// exactly: with room for two waiters, the third is refused until `maxmemory` grows.
#[test]
fn the_bound_follows_config_set_at_run_time() {
    let server = Server::start();
    let mut conn = server.connection();
    let limit = |conn: &mut redis::Connection| info_sem(conn)["sem_waiters_memory_limit"];
    assert_eq!(limit(&mut conn), 1024 * 1024 * 1024, "no maxmemory: 1 GB");
    let _: String = run(
        &mut conn,
        &["CONFIG", "SET", "sem.max-waiters-memory", "64mb"],
    );
    assert_eq!(limit(&mut conn), 64 * 1024 * 1024);

    let _: String = run(&mut conn, &["CONFIG", "SET", "maxmemory", "1000mb"]);
    assert_eq!(limit(&mut conn), 50 * 1024 * 1024, "5 % of maxmemory");
    let _: String = run(
        &mut conn,
        &["CONFIG", "SET", "sem.waiters-maxmemory-percent", "1"],
    );
    assert_eq!(limit(&mut conn), 10 * 1024 * 1024);
    // Room for two waiters of about 36 KB in 1 % of 8 MB (83,886 bytes).
    let _: String = run(&mut conn, &["CONFIG", "SET", "maxmemory", "8mb"]);
    assert_eq!(limit(&mut conn), 83_886);
    let _: String = run(&mut conn, &["SEM.ACQUIRE", "s", "1", "60", "ID", "h"]);
    let mut first = block_clients(&server, 2, &["SEM.ACQUIRE", "s", "1", "60", "WAIT", "30"]);
    wait_until("two wait", Duration::from_secs(10), || {
        info_sem(&mut conn)["sem_waiters"] == 2
    });
    let err = error_of(&mut conn, &["SEM.ACQUIRE", "s", "1", "60", "WAIT", "30"]);
    assert!(
        err.starts_with("ERR waiting clients would take more than 83886 bytes"),
        "{err}"
    );
    let err = error_of(&mut conn, &["SEM.WAITEMPTY", "s", "30"]);
    assert!(err.starts_with("ERR waiting clients"), "{err}");
    assert_eq!(info_sem(&mut conn)["sem_waits_refused_memory"], 2);
    // Without WAIT nothing changes: full is nil.
    let none: Option<String> = run(&mut conn, &["SEM.ACQUIRE", "s", "1", "60"]);
    assert_eq!(none, None);

    let _: String = run(&mut conn, &["CONFIG", "SET", "maxmemory", "16mb"]);
    let mut third = block_clients(&server, 1, &["SEM.ACQUIRE", "s", "1", "60", "WAIT", "30"]);
    wait_until("a third waits", Duration::from_secs(10), || {
        info_sem(&mut conn)["sem_waiters"] == 3
    });
    let memory = info_sem(&mut conn)["sem_waiters_memory"];
    assert!((3 * 34_000..=3 * 37_000).contains(&memory), "{memory}");

    // Every waiter is served in turn as the holder leaves.
    let released: i64 = run(&mut conn, &["SEM.RELEASE", "s", "h"]);
    assert_eq!(released, 1);
    let id = first[0].reply();
    assert!(!id.starts_with('-'), "{id}");
    let _: i64 = run(&mut conn, &["SEM.RELEASE", "s", &id]);
    let id = first[1].reply();
    let _: i64 = run(&mut conn, &["SEM.RELEASE", "s", &id]);
    assert!(!third[0].reply().starts_with('-'));
}

/// A semaphore key the server evicts is counted, and the first is logged with the policy.
#[test]
fn evicted_semaphore_keys_are_counted_and_logged_once() {
    let server = Server::start();
    let mut conn = server.connection();
    for i in 0..300 {
        let name = format!("fair{i}");
        let _: (String, u64) = run(
            &mut conn,
            &[
                "SEM.ACQUIREFAIR",
                &name,
                "1",
                "600",
                "ID",
                "h",
                "WITHTICKET",
            ],
        );
        let _: i64 = run(&mut conn, &["SEM.RELEASE", &name, "h"]);
    }
    assert_eq!(info_sem(&mut conn)["sem_evicted_keys"], 0);
    let maxmemory = (used_memory(&mut conn) + 256 * 1024).to_string();
    let _: String = run(
        &mut conn,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-random"],
    );
    let _: String = run(&mut conn, &["CONFIG", "SET", "maxmemory", &maxmemory]);
    let value = "v".repeat(1000);
    for i in 0..2000 {
        let _: String = run(&mut conn, &["SET", &format!("user:{i}"), &value]);
    }
    let evicted = info_numbers(&mut conn, "stats")["evicted_keys"];
    let counted = info_sem(&mut conn)["sem_evicted_keys"];
    let counters_left: Vec<String> = run(&mut conn, &["KEYS", "fair*:counter"]);
    assert_eq!(
        counted,
        300 - counters_left.len() as u64,
        "evicted {evicted}"
    );
    assert!(counted > 0 && counted <= evicted);
    let log = server.log();
    assert_eq!(
        log.matches("a semaphore's key, under maxmemory-policy allkeys-random")
            .count(),
        1,
        "{log}"
    );
}
