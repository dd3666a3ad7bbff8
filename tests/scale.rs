//! Waiting at scale: what other clients' commands cost while many clients wait, and a storm of
//! lease ends served in slices with every lease stamped at its own grant. Waiters are raw
//! sockets (hundreds of them), each blocked in one acquire; the work the module does is
//! counted by `INFO sem` (`sem_lines_served`, `sem_timer_runs_continued`), not timed.

mod common;

use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// The tests here each load the server with many clients: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn lines_served(conn: &mut redis::Connection) -> u64 {
    info_sem(conn)["sem_lines_served"]
}

/// Waits until `n` clients wait in all.
fn wait_for_waiters(conn: &mut redis::Connection, n: u64) {
    wait_until(
        &format!("{n} clients wait"),
        Duration::from_secs(30),
        || info_sem(conn)["sem_waiters"] == n,
    );
}

/// Lets the module's timer run whatever a command may have scheduled.
fn settle() {
    thread::sleep(Duration::from_millis(100));
}

/// A full semaphore `name` (limit 1, one holder with a long lease) in `db`, and a client
/// waiting for it.
fn full_with_a_waiter(server: &Server, db: u32, name: &str) -> RawClient {
    let mut waiter = RawClient::connect(server);
    waiter.send(&["SELECT", &db.to_string()]);
    assert_eq!(waiter.reply(), "OK");
    waiter.send(&["SEM.ACQUIRE", name, "1", "600", "ID", "holder"]);
    assert_eq!(waiter.reply(), "holder");
    waiter.send(&["SEM.ACQUIRE", name, "1", "600", "WAIT", "120"]);
    waiter
}

/// Reads of waited-on keys, however many they name and however many clients wait, make the
/// module serve no line at all; a change to one waited key serves that line only, and a flush
/// of one database serves the lines of that database only.
#[test]
fn other_clients_reads_serve_nothing_and_a_change_serves_only_its_own_line() {
    let _one = one_at_a_time();
    const IN_DB0: usize = 400;
    const IN_DB1: usize = 20;
    let server = Server::start();
    let mut conn = server.connection();
    let names: Vec<String> = (0..IN_DB0).map(|i| format!("w{i}")).collect();
    let mut waiters: Vec<RawClient> = names
        .iter()
        .map(|name| full_with_a_waiter(&server, 0, name))
        .collect();
    let mut in_db1: Vec<RawClient> = (0..IN_DB1)
        .map(|i| full_with_a_waiter(&server, 1, &format!("w{i}")))
        .collect();
    wait_for_waiters(&mut conn, (IN_DB0 + IN_DB1) as u64);
    let before = lines_served(&mut conn);

    // Reads, naming every waited key and its derived keys.
    let mut exists = vec!["EXISTS"];
    exists.extend(names.iter().map(String::as_str));
    let derived: Vec<String> = names
        .iter()
        .flat_map(|n| {
            [
                format!("{n}:owner"),
                format!("{n}:counter"),
                format!("{n}:permits"),
            ]
        })
        .collect();
    exists.extend(derived.iter().map(String::as_str));
    let found: i64 = run(&mut conn, &exists);
    assert_eq!(
        found, IN_DB0 as i64,
        "each waited semaphore has its holder set"
    );
    for name in names.iter().take(50) {
        let _: String = run(&mut conn, &["TYPE", name]);
        let _: Vec<String> = run(&mut conn, &["ZRANGE", name, "0", "-1"]);
        let _: Option<String> = run(&mut conn, &["GET", &format!("{name}:counter")]);
        let _: i64 = run(&mut conn, &["PTTL", name]);
        let _: String = run(&mut conn, &["SEM.GET", name, "JSON"]);
    }
    let _: redis::Value = run(&mut conn, &["SCAN", "0", "COUNT", "10000"]);
    // Writes of keys nobody waits on.
    let _: () = run(&mut conn, &["SET", "unrelated", "1"]);
    let _: i64 = run(&mut conn, &["DEL", "unrelated", "w-none"]);
    settle();
    assert_eq!(
        lines_served(&mut conn),
        before,
        "reads and unrelated writes served a line"
    );
    assert_eq!(info_sem(&mut conn)["sem_waiters"], (IN_DB0 + IN_DB1) as u64);

    // Another client fills one semaphore more and writes a derived key: the module does not
    // follow such writes (they wait for the line's next lease end); then it deletes, renames,
    // moves and expires waited keys, each of which serves its own line at once.
    let far = (server_ms(&mut conn) + 600_000).to_string();
    let steps: [(&[&str], usize, u64); 6] = [
        (&["ZADD", "w7", &far, "intruder"], 7, 0),
        (&["SET", "w8:counter", "5"], 8, 0),
        (&["DEL", "w9"], 9, 1),
        (&["RENAME", "w10", "moved"], 10, 1),
        (&["MOVE", "w11", "5"], 11, 1),
        (&["PEXPIRE", "w12", "1"], 12, 1),
    ];
    // Where the module follows the key server event (src/server/events.rs), the overwritten
    // counter serves its line too (which grants nothing: the semaphore is still full).
    let key_event = key_watch(&mut conn, &[]) == Some(KeyWatch::KeyEvent);
    let mut answered = 0;
    for (command, index, expected) in steps {
        answered += expected.min(1) as usize;
        let before = lines_served(&mut conn);
        let _: redis::Value = run(&mut conn, command);
        if expected > 0 {
            let reply = waiters[index].reply();
            assert!(
                !reply.starts_with('-') && reply != "nil",
                "{command:?}: {reply}"
            );
        }
        settle();
        // PEXPIRE's own event serves the line (nothing is free yet), then the expiry does;
        // the two may come before one turn of the timer, which serves the line once.
        let served = lines_served(&mut conn) - before;
        let expected = if command[0] == "PEXPIRE" {
            1..=2
        } else if command[0] == "SET" && key_event {
            0..=1
        } else {
            expected..=expected
        };
        assert!(
            expected.contains(&served),
            "{command:?} served {served} lines, not {expected:?}"
        );
    }
    wait_for_waiters(&mut conn, (IN_DB0 + IN_DB1 - answered) as u64);

    // A flush of database 1 serves its 20 lines, not the 398 of database 0.
    let before = lines_served(&mut conn);
    let mut db1 = server.connection();
    let _: () = run(&mut db1, &["SELECT", "1"]);
    let _: () = run(&mut db1, &["FLUSHDB"]);
    for waiter in &mut in_db1 {
        let reply = waiter.reply();
        assert!(!reply.starts_with('-') && reply != "nil", "{reply}");
    }
    settle();
    assert_eq!(lines_served(&mut conn), before + IN_DB1 as u64);
    assert_eq!(
        info_sem(&mut conn)["sem_waiters"],
        (IN_DB0 - answered) as u64,
        "database 0's waiters still wait"
    );
}

/// 2,000 semaphores whose holders' leases all end in the same millisecond, each with a waiter:
/// the timer serves them in slices, so the server keeps answering other clients; every grant
/// starts at or after the deadline it follows (no two leases overlap) and is stamped when it
/// is made, not when the storm began.
#[test]
fn a_storm_of_lease_ends_is_served_in_slices_each_lease_stamped_at_its_grant() {
    let _one = one_at_a_time();
    const N: usize = 2_000;
    const LEASE_MS: i64 = 5_000;
    let server = Server::start();
    let mut conn = server.connection();
    // The recipe's layout, written directly, so that every lease ends at exactly `deadline`
    // (the keys live on: Redis's own expiry, which paces itself, is not what is tested).
    let deadline = server_ms(&mut conn) + 4_000;
    let mut pipe = redis::pipe();
    for i in 0..N {
        let name = format!("s{i}");
        pipe.cmd("ZADD")
            .arg(&name)
            .arg(deadline)
            .arg("old")
            .ignore();
        pipe.cmd("PEXPIREAT")
            .arg(&name)
            .arg(deadline + 60_000)
            .ignore();
    }
    let _: () = pipe.query(&mut conn).expect("fill the holders");
    let mut waiters: Vec<RawClient> = (0..N)
        .map(|i| {
            let mut waiter = RawClient::connect(&server);
            let name = format!("s{i}");
            waiter.send(&["SEM.ACQUIRE", &name, "1", "5", "WAIT", "60"]);
            waiter
        })
        .collect();
    wait_for_waiters(&mut conn, N as u64);
    let queued_at = server_ms(&mut conn);
    assert!(
        queued_at < deadline - 200,
        "the waiters took too long to queue: the storm would not be one"
    );
    let continued_before = info_sem(&mut conn)["sem_timer_runs_continued"];

    // Another connection asks how many still wait, all through the storm. Served in one run,
    // the storm would show it only "all" and then "none".
    let mut watcher = server.connection();
    thread::sleep(Duration::from_millis(
        (deadline - queued_at - 20).max(0) as u64
    ));
    let mut midway: Vec<(i64, u64)> = Vec::new();
    let give_up = Instant::now() + Duration::from_secs(20);
    let storm_end = loop {
        assert!(Instant::now() < give_up, "the waiters were not all served");
        let asked_at = server_ms(&mut watcher);
        let waiting = info_sem(&mut watcher)["sem_waiters"];
        if waiting == 0 {
            break asked_at;
        }
        if waiting < N as u64 {
            midway.push((asked_at, waiting));
        }
    };
    eprintln!(
        "storm: {} ms from the deadline to the last grant, {} answers midway",
        storm_end - deadline,
        midway.len()
    );

    let mut starts = Vec::with_capacity(N);
    for (i, waiter) in waiters.iter_mut().enumerate() {
        let id = waiter.reply();
        assert!(!id.starts_with('-') && id != "nil", "waiter {i}: {id}");
        let name = format!("s{i}");
        let recorded: i64 = run(&mut conn, &["ZSCORE", &name, &id]);
        starts.push(recorded - LEASE_MS);
    }
    let first = *starts.iter().min().expect("N > 0");
    assert!(
        first >= deadline,
        "a lease starts {} ms before the one it follows ended",
        deadline - first
    );
    assert!(
        !midway.is_empty(),
        "no other client was answered during the storm"
    );
    // Clients still waiting when the server was asked at `asked_at` were granted later: their
    // leases start no earlier.
    for (asked_at, waiting) in midway {
        let later = starts.iter().filter(|start| **start >= asked_at).count();
        assert!(
            later as u64 >= waiting,
            "{waiting} waited at {asked_at}, but only {later} leases start after it"
        );
    }
    assert!(
        info_sem(&mut conn)["sem_timer_runs_continued"] > continued_before,
        "the storm was served in one run"
    );
}

/// A write the module does not follow (another client's `ZREM` of a holder) frees the permit
/// at the line's next lease end: a waiter for two permits, behind a holder with a long lease
/// that another client removes and one whose lease ends soon, is granted at that lease end,
/// not at the write. (A `ZREM` of the last member deletes the key, and a deletion is served at
/// once.)
#[test]
fn a_foreign_zrem_is_served_at_the_lines_next_lease_end() {
    let _one = one_at_a_time();
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = run(&mut conn, &["SEM.ACQUIRE", "z", "2", "600", "ID", "long"]);
    let _: String = run(&mut conn, &["SEM.ACQUIRE", "z", "2", "1.5", "ID", "short"]);
    let lease_end = server_ms(&mut conn) + 1_500;
    let mut waiter = RawClient::connect(&server);
    waiter.send(&[
        "SEM.ACQUIRE",
        "z",
        "2",
        "600",
        "ID",
        "next",
        "COUNT",
        "2",
        "WAIT",
        "30",
    ]);
    wait_for_waiters(&mut conn, 1);
    let before = lines_served(&mut conn);
    let _: i64 = run(&mut conn, &["ZREM", "z", "long"]);
    settle();
    assert_eq!(lines_served(&mut conn), before, "a ZREM is not followed");
    assert_eq!(info_sem(&mut conn)["sem_waiters"], 1);
    assert_eq!(waiter.reply(), "next");
    let granted_at = server_ms(&mut conn);
    assert!(
        granted_at >= lease_end - 50 && granted_at <= lease_end + 1_000,
        "granted at {granted_at}, the lease ended at {lease_end}"
    );
}

/// Once the module follows keyspace events (after a wait), a command that fires an event in
/// another database (`MOVE`, `COPY ... DB`) leaves its caller in its own database: Valkey 8
/// delivers such an event through the caller's connection and would leave it in the other one.
#[test]
fn moving_and_copying_keys_across_databases_keep_the_callers_database() {
    let _one = one_at_a_time();
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = run(&mut conn, &["SEM.ACQUIRE", "held", "1", "600", "ID", "h"]);
    let nil: Option<String> = run(
        &mut conn,
        &["SEM.ACQUIRE", "held", "1", "600", "WAIT", "0.05"],
    );
    assert_eq!(nil, None, "the wait timed out");
    let _: () = run(&mut conn, &["SET", "a", "1"]);
    let moved: i64 = run(&mut conn, &["MOVE", "a", "5"]);
    assert_eq!(moved, 1);
    let copied: i64 = run(&mut conn, &["COPY", "held", "held2", "DB", "6"]);
    assert_eq!(copied, 1);
    let info: String = run(&mut conn, &["CLIENT", "INFO"]);
    assert!(info.contains(" db=0 "), "{info}");
    let here: i64 = run(&mut conn, &["EXISTS", "held"]);
    assert_eq!(here, 1, "commands still run in database 0");
}
