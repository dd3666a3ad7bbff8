//! Semaphore sets: `SEM.ACQUIREALL` takes permits of several semaphores all or none,
//! `SEM.RELEASEALL` and `SEM.REFRESHALL` act on all of them in one step. Checked against real
//! servers: all or nothing under 50 concurrent clients, nothing changed by a refusal or an
//! error, the layout a single acquire leaves, BOUND sets, waiters served by RELEASEALL, ACLs,
//! and a replica and an AOF holding exactly the primary's keys.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::state::snapshot_of_all_keys;
use common::*;
use redis::Value;

/// Every key with its value and expiry, and its DUMP (encoding included).
fn everything(conn: &mut redis::Connection) -> (String, BTreeMap<String, Vec<u8>>) {
    let state = format!("{:?}", snapshot_of_all_keys(conn));
    let names: Vec<String> = run(conn, &["KEYS", "*"]);
    let dumps = names
        .into_iter()
        .map(|name| {
            let dump: Vec<u8> = run(conn, &["DUMP", &name]);
            (name, dump)
        })
        .collect();
    (state, dumps)
}

fn acquire_all(conn: &mut redis::Connection, args: &[&str]) -> Value {
    let mut all = vec!["SEM.ACQUIREALL"];
    all.extend_from_slice(args);
    run(conn, &all)
}

#[test]
fn a_set_is_taken_whole_or_not_at_all_and_a_refusal_changes_nothing() {
    let server = Server::start();
    let mut c = server.connection();
    // `a` has an expired holder: a refused set acquire does not even remove it.
    let _: String = run(&mut c, &["SEM.ACQUIRE", "a", "2", "0.05", "ID", "old"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "b", "1", "30", "ID", "full"]);
    thread::sleep(Duration::from_millis(100));
    let before = everything(&mut c);
    let mut watcher = server.connection();
    let _: () = run(&mut watcher, &["WATCH", "a", "b", "a:owner", "b:permits"]);
    let refused = acquire_all(
        &mut c,
        &["2", "a", "2", "1", "b", "1", "1", "30", "ID", "x"],
    );
    assert_eq!(refused, Value::Nil);
    assert_eq!(everything(&mut c), before, "a refusal changed a key");
    let exec: Option<Vec<String>> = redis::pipe()
        .atomic()
        .cmd("PING")
        .query(&mut watcher)
        .expect("EXEC");
    assert!(exec.is_some(), "a refusal fired WATCH");
    assert_eq!(info_sem(&mut c)["sem_set_refused"], 1);

    let _: i64 = run(&mut c, &["SEM.RELEASE", "b", "full"]);
    let granted = acquire_all(
        &mut c,
        &["2", "a", "2", "1", "b", "1", "1", "30", "ID", "x"],
    );
    assert_eq!(granted, Value::BulkString(b"x".to_vec()));
    // Each semaphore holds x with the same deadline, as a single acquire leaves it; the
    // expired holder went with the grant.
    let in_a = zset(&mut c, "a");
    let in_b = zset(&mut c, "b");
    assert_eq!(in_a.len(), 1, "{in_a:?}");
    assert_eq!(in_a, in_b);
    assert_eq!(in_a[0].0, "x");
    let info = info_sem(&mut c);
    assert_eq!((info["sem_set_acquired"], info["sem_acquired"]), (1, 4));
}

/// The keys a set acquire leaves are, semaphore by semaphore, the keys single acquires leave.
#[test]
fn each_semaphore_records_the_holder_as_a_single_acquire_would() {
    let server = Server::start();
    let mut c = server.connection();
    let mut single = server.connection();
    let _: () = run(&mut single, &["SELECT", "1"]);
    let fresh = FirstGrant::before(&mut c);
    let got = acquire_all(
        &mut c,
        &[
            "3", "p", "5", "1", "q", "5", "3", "r", "2", "2", "30", "ID", "h", "FAIR",
        ],
    );
    assert_eq!(got, Value::BulkString(b"h".to_vec()));
    // No name had a counter: each first ticket is the clock of its grant.
    let tickets = ["p", "q", "r"].map(|name| fresh.holder(&mut c, name, "h"));
    let fresh = FirstGrant::before(&mut single);
    for (name, count) in [("p", "1"), ("q", "3"), ("r", "2")] {
        let args = [
            "SEM.ACQUIREFAIR",
            name,
            "5",
            "30",
            "ID",
            "h",
            "COUNT",
            count,
        ];
        let _: String = run(&mut single, &args);
        let ticket = fresh.holder(&mut single, name, "h");
        let counter: i64 = run(&mut single, &["GET", &format!("{name}:counter")]);
        assert_eq!(counter, ticket, "{name}");
    }
    let deadline: i64 = run(&mut c, &["ZSCORE", "p", "h"]);
    let shift = |conn: &mut redis::Connection| {
        // The single acquires ran a moment later: compare with deadlines and tickets set equal.
        for (name, ticket) in ["p", "q", "r"].into_iter().zip(tickets) {
            let ticket = ticket.to_string();
            let _: i64 = run(conn, &["ZADD", name, &deadline.to_string(), "h"]);
            let _: i64 = run(conn, &["ZADD", &format!("{name}:owner"), &ticket, "h"]);
            let _: () = run(
                conn,
                &["SET", &format!("{name}:counter"), &ticket, "KEEPTTL"],
            );
            for key in [
                name.to_string(),
                format!("{name}:owner"),
                format!("{name}:permits"),
            ] {
                let _: i64 = run(conn, &["PEXPIREAT", &key, &deadline.to_string()]);
            }
        }
    };
    shift(&mut single);
    let mut in_db1 = server.connection();
    let _: () = run(&mut in_db1, &["SELECT", "1"]);
    assert_eq!(everything(&mut c), everything(&mut in_db1));
}

#[test]
fn fair_sets_reply_a_ticket_per_semaphore_and_renew_what_they_hold() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "t1", "3", "30", "ID", "early"]);
    let t1 = fresh.holder(&mut c, "t1", "early");
    let fresh = FirstGrant::before(&mut c);
    let got = acquire_all(
        &mut c,
        &[
            "2",
            "t1",
            "3",
            "1",
            "t2",
            "3",
            "1",
            "30",
            "ID",
            "w",
            "FAIR",
            "WITHTICKET",
        ],
    );
    // t2 had no counter: its first ticket is the clock of this grant.
    let t2 = fresh.holder(&mut c, "t2", "w");
    assert_eq!(
        got,
        Value::Array(vec![
            Value::BulkString(b"w".to_vec()),
            Value::Array(vec![Value::Int(t1 + 1), Value::Int(t2)]),
        ])
    );
    // w holds t1 and t2; asking again with t3 renews those (same tickets) and takes t3.
    let deadline_before: i64 = run(&mut c, &["ZSCORE", "t1", "w"]);
    thread::sleep(Duration::from_millis(20));
    let fresh = FirstGrant::before(&mut c);
    let got = acquire_all(
        &mut c,
        &[
            "3",
            "t3",
            "1",
            "1",
            "t1",
            "3",
            "1",
            "t2",
            "3",
            "1",
            "30",
            "ID",
            "w",
            "FAIR",
            "WITHTICKET",
        ],
    );
    let t3 = fresh.holder(&mut c, "t3", "w");
    assert_eq!(
        got,
        Value::Array(vec![
            Value::BulkString(b"w".to_vec()),
            Value::Array(vec![Value::Int(t3), Value::Int(t1 + 1), Value::Int(t2)]),
        ])
    );
    let deadline_after: i64 = run(&mut c, &["ZSCORE", "t1", "w"]);
    assert!(
        deadline_after > deadline_before,
        "the renewal moved the deadline"
    );
    // t3 full for anyone else: a set that needs it is refused, and w's deadlines stay.
    let refused = acquire_all(
        &mut c,
        &["2", "t1", "3", "1", "t3", "1", "1", "30", "ID", "z", "FAIR"],
    );
    assert_eq!(refused, Value::Nil);
    assert_eq!(zset(&mut c, "t1").len(), 2, "z took nothing");
}

#[test]
fn bad_calls_are_errors_that_change_nothing() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "f", "3", "30", "ID", "h"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "p", "3", "30", "ID", "h"]);
    let _: () = run(&mut c, &["SET", "s", "text"]);
    let before = everything(&mut c);
    let cases: &[(&[&str], &str)] = &[
        (&["SEM.ACQUIREALL", "0", "f", "1", "1", "30"], "ERR numsems"),
        (
            &["SEM.ACQUIREALL", "65", "f", "1", "1", "30"],
            "ERR numsems",
        ),
        (&["SEM.ACQUIREALL", "x", "f", "1", "1", "30"], "ERR numsems"),
        (
            &["SEM.ACQUIREALL", "2", "f", "1", "1", "30"],
            "ERR wrong number",
        ),
        (
            &["SEM.ACQUIREALL", "2", "n", "1", "1", "n", "1", "1", "30"],
            "ERR a semaphore is named twice",
        ),
        (
            &[
                "SEM.ACQUIREALL",
                "2",
                "n",
                "1",
                "1",
                "n:owner",
                "1",
                "1",
                "30",
            ],
            "ERR a semaphore is named twice",
        ),
        (&["SEM.ACQUIREALL", "1", "n", "2", "0", "30"], "ERR COUNT"),
        (&["SEM.ACQUIREALL", "1", "n", "2", "3", "30"], "ERR COUNT"),
        (&["SEM.ACQUIREALL", "1", "n", "0", "1", "30"], "ERR limit"),
        (&["SEM.ACQUIREALL", "1", "n", "2", "1", "0"], "ERR lease"),
        (
            &["SEM.ACQUIREALL", "1", "n", "2", "1", "30", "WITHTICKET"],
            "ERR syntax error",
        ),
        (
            &["SEM.ACQUIREALL", "1", "n", "2", "1", "30", "WAIT", "-1"],
            "ERR WAIT must be",
        ),
        (
            &["SEM.ACQUIREALL", "1", "n", "2", "1", "30", "FAIR", "FAIR"],
            "ERR syntax error",
        ),
        (
            &["SEM.ACQUIREALL", "1", "", "2", "1", "30"],
            "ERR semaphore name must not be empty",
        ),
        (
            &["SEM.ACQUIREALL", "2", "n", "2", "1", "f", "3", "1", "30"],
            "ERR the semaphore has live fair holders",
        ),
        (
            &[
                "SEM.ACQUIREALL",
                "2",
                "n",
                "2",
                "1",
                "p",
                "3",
                "1",
                "30",
                "FAIR",
            ],
            "ERR the semaphore has live plain holders",
        ),
        (
            &["SEM.ACQUIREALL", "2", "n", "2", "1", "s", "3", "1", "30"],
            "WRONGTYPE",
        ),
        (
            &[
                "SEM.ACQUIREALL",
                "2",
                "f",
                "3",
                "2",
                "p",
                "3",
                "1",
                "30",
                "ID",
                "h",
                "FAIR",
            ],
            "ERR the holder holds 1 permits",
        ),
        (&["SEM.RELEASEALL", "2", "f", "p"], "ERR wrong number"),
        (
            &["SEM.RELEASEALL", "2", "f", "f", "h"],
            "ERR a semaphore is named twice",
        ),
        (&["SEM.RELEASEALL", "2", "f", "s", "h"], "WRONGTYPE"),
        (
            &["SEM.RELEASEALL", "1", "f", ""],
            "ERR identifier must not be empty",
        ),
        (&["SEM.REFRESHALL", "2", "f", "p", "h", "-1"], "ERR lease"),
        (&["SEM.REFRESHALL", "2", "f", "p", "h"], "ERR wrong number"),
    ];
    for (args, want) in cases {
        let err = error_of(&mut c, args);
        assert!(err.starts_with(want), "{args:?}: {err}");
    }
    assert_eq!(everything(&mut c), before, "an error changed a key");
    let keys: Vec<String> = run(
        &mut c,
        &[
            "COMMAND",
            "GETKEYS",
            "SEM.ACQUIREALL",
            "2",
            "a",
            "1",
            "1",
            "b",
            "1",
            "1",
            "30",
        ],
    );
    assert_eq!(keys, ["a", "b"]);
}

#[test]
fn releaseall_and_refreshall_count_what_was_held_and_serve_waiters() {
    let server = Server::start();
    let mut c = server.connection();
    let got = acquire_all(
        &mut c,
        &["2", "x", "1", "1", "y", "2", "2", "0.5", "ID", "h"],
    );
    assert_eq!(got, Value::BulkString(b"h".to_vec()));
    let waiter = Pending::send(
        &server,
        &["SEM.ACQUIRE", "x", "1", "30", "ID", "w", "WAIT", "10"],
    );
    wait_until("the waiter queues", Duration::from_secs(10), || {
        info_sem(&mut c)["sem_waiters"] == 1
    });
    let refreshed: i64 = run(&mut c, &["SEM.REFRESHALL", "3", "x", "y", "z", "h", "30"]);
    assert_eq!(refreshed, 2, "z was never held");
    let deadline_x: i64 = run(&mut c, &["ZSCORE", "x", "h"]);
    let deadline_y: i64 = run(&mut c, &["ZSCORE", "y", "h"]);
    assert_eq!(deadline_x, deadline_y);
    assert!(!waiter.is_done());
    let released: i64 = run(&mut c, &["SEM.RELEASEALL", "3", "z", "y", "x", "h"]);
    assert_eq!(released, 2);
    assert_eq!(
        waiter.reply().expect("granted"),
        Value::BulkString(b"w".to_vec())
    );
    let keys: Vec<String> = run(&mut c, &["KEYS", "*"]);
    assert_eq!(
        keys,
        ["x"],
        "y and its permits key went with the last holder"
    );
    let released: i64 = run(&mut c, &["SEM.RELEASEALL", "2", "y", "x", "h"]);
    assert_eq!(released, 0);
}

#[test]
fn a_bound_set_comes_back_whole_when_its_connection_closes() {
    let server = Server::start();
    let mut c = server.connection();
    let mut holder = server.connection();
    let id: i64 = run(&mut holder, &["CLIENT", "ID"]);
    let got = acquire_all(
        &mut holder,
        &["2", "b1", "1", "1", "b2", "3", "2", "30", "BOUND"],
    );
    assert!(matches!(got, Value::BulkString(_)), "{got:?}");
    assert_eq!(info_sem(&mut c)["sem_bound_holders"], 2);
    let _: i64 = run(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    wait_until("both permits come back", Duration::from_secs(10), || {
        let keys: Vec<String> = run(&mut c, &["KEYS", "*"]);
        keys.is_empty()
    });
    assert_eq!(info_sem(&mut c)["sem_bound_released"], 2);
}

#[test]
fn a_key_outside_the_callers_acl_refuses_the_whole_set() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(
        &mut c,
        &["ACL", "SETUSER", "u", "on", "nopass", "+@all", "~a*"],
    );
    let mut user = server.connection();
    let _: String = run(&mut user, &["AUTH", "u", "x"]);
    let err = error_of(
        &mut user,
        &["SEM.ACQUIREALL", "2", "a1", "1", "1", "b1", "1", "1", "30"],
    );
    assert!(err.starts_with("NOPERM"), "{err}");
    let keys: Vec<String> = run(&mut c, &["KEYS", "*"]);
    assert!(keys.is_empty(), "{keys:?}");
    let got: String = run(
        &mut user,
        &[
            "SEM.ACQUIREALL",
            "2",
            "a1",
            "1",
            "1",
            "a2",
            "1",
            "1",
            "30",
            "ID",
            "ok",
        ],
    );
    assert_eq!(got, "ok");
}

/// 50 clients take random sets of 4 semaphores (limits 1 to 3, counts 1 or 2) in random
/// orders, hold them briefly and give them back; meanwhile atomic snapshots of all four prove
/// that no semaphore is ever over its limit and that every holder holds its whole set. Every
/// client gets its sets in the end.
#[test]
fn fifty_clients_never_hold_part_of_a_set_nor_pass_a_limit() {
    fifty_clients(false);
}

/// The same with `WAIT`: every set waits in all of its lines, and every client is served.
#[test]
fn fifty_waiting_clients_are_all_served_without_deadlock() {
    fifty_clients(true);
}

fn fifty_clients(wait: bool) {
    const NAMES: [&str; 4] = ["c0", "c1", "c2", "c3"];
    const LIMITS: [u64; 4] = [1, 2, 3, 2];
    let server = Server::start();
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(3);
    let clients: Vec<_> = (0..50u64)
        .map(|client| {
            let mut conn = server.connection();
            conn.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("read timeout");
            thread::spawn(move || {
                let mut seed = client * 7919 + 17;
                let mut next = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                let mut granted = 0u64;
                let mut round = 0u64;
                while Instant::now() < deadline || granted == 0 {
                    round += 1;
                    let mut picked: Vec<usize> = (0..4).filter(|_| next() % 2 == 0).collect();
                    if picked.is_empty() {
                        picked.push((next() % 4) as usize);
                    }
                    // A random order: the order names are given in must not matter.
                    for i in (1..picked.len()).rev() {
                        picked.swap(i, (next() % (i as u64 + 1)) as usize);
                    }
                    let counts: Vec<u64> = picked
                        .iter()
                        .map(|&s| 1 + next() % LIMITS[s].min(2))
                        .collect();
                    // The identifier tells which permits its holder must hold.
                    let mut id = format!("k{client}-{round}");
                    for (&s, &count) in picked.iter().zip(&counts) {
                        id.push_str(&format!("-{s}x{count}"));
                    }
                    let mut args = vec!["SEM.ACQUIREALL".to_string(), picked.len().to_string()];
                    for (&s, &count) in picked.iter().zip(&counts) {
                        args.extend([
                            NAMES[s].to_string(),
                            LIMITS[s].to_string(),
                            count.to_string(),
                        ]);
                    }
                    args.extend(["30".into(), "ID".into(), id.clone()]);
                    if wait {
                        args.extend(["WAIT".into(), "20".into()]);
                    }
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let got: Value = run(&mut conn, &args);
                    if got == Value::Nil {
                        assert!(!wait, "client {client} waited 20 s in vain");
                        thread::sleep(Duration::from_micros(200));
                        continue;
                    }
                    granted += 1;
                    let mut release = vec!["SEM.RELEASEALL".to_string(), picked.len().to_string()];
                    release.extend(picked.iter().map(|&s| NAMES[s].to_string()));
                    release.push(id);
                    let release: Vec<&str> = release.iter().map(String::as_str).collect();
                    let released: i64 = run(&mut conn, &release);
                    assert_eq!(
                        released,
                        picked.len() as i64,
                        "client {client} lost a permit"
                    );
                }
                granted
            })
        })
        .collect();
    let checker = {
        let stop = stop.clone();
        let mut conn = server.connection();
        thread::spawn(move || {
            let mut snapshots = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut pipe = redis::pipe();
                pipe.atomic();
                for name in NAMES {
                    pipe.cmd("SEM.GET").arg(name).arg("JSON");
                }
                let docs: Vec<String> = pipe.query(&mut conn).expect("snapshot");
                let mut held: BTreeMap<String, BTreeSet<(usize, u64)>> = BTreeMap::new();
                for (s, doc) in docs.iter().enumerate() {
                    let doc: serde_json::Value = serde_json::from_str(doc).expect("JSON");
                    let in_use = doc["in_use"].as_u64().expect("in_use");
                    assert!(in_use <= LIMITS[s], "{} over its limit: {doc}", NAMES[s]);
                    for holder in doc["holders"].as_array().expect("holders") {
                        let id = holder["id"].as_str().expect("id").to_string();
                        let permits = holder["permits"].as_u64().expect("permits");
                        held.entry(id).or_default().insert((s, permits));
                    }
                }
                for (id, permits) in held {
                    let want: BTreeSet<(usize, u64)> = id
                        .split('-')
                        .skip(2)
                        .map(|part| {
                            let (s, count) = part.split_once('x').expect("s x count");
                            (s.parse().expect("s"), count.parse().expect("count"))
                        })
                        .collect();
                    assert_eq!(permits, want, "{id} holds part of its set");
                }
                snapshots += 1;
            }
            snapshots
        })
    };
    let grants: Vec<u64> = clients
        .into_iter()
        .map(|c| c.join().expect("a client failed"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    let snapshots = checker.join().expect("the checker failed");
    assert!(
        grants.iter().all(|&g| g > 0),
        "a client was never served: {grants:?}"
    );
    assert!(snapshots > 10, "only {snapshots} snapshots");
    let mut c = server.connection();
    let info = info_sem(&mut c);
    if wait {
        assert!(info["sem_waits_started"] > 0, "nobody waited: {info:?}");
        assert_eq!(
            info["sem_waits_granted"], info["sem_waits_started"],
            "{info:?}"
        );
    }
    eprintln!("{grants:?} sets granted; {info:?}");
    let keys: Vec<String> = run(&mut c, &["KEYS", "*"]);
    assert!(
        keys.iter()
            .all(|k| k.ends_with(":counter") || !k.contains(':'))
            && !keys.iter().any(|k| NAMES.contains(&k.as_str())),
        "everything was given back: {keys:?}"
    );
}

#[test]
fn a_replica_and_an_aof_hold_exactly_the_primarys_keys() {
    let primary = Server::start_with(&AOF_PRIMARY_ARGS);
    let replica = start_replica_of(&primary);
    let mut p = primary.connection();
    let long = "600";
    let _: Value = acquire_all(
        &mut p,
        &["2", "r1", "2", "1", "r2", "3", "2", long, "ID", "a"],
    );
    let _: Value = acquire_all(
        &mut p,
        &["2", "r4", "2", "1", "r3", "1", "1", long, "ID", "b", "FAIR"],
    );
    let _: Value = acquire_all(
        &mut p,
        &[
            "3", "f1", "2", "1", "f2", "3", "2", "f3", "1", "1", long, "ID", "c", "FAIR",
        ],
    );
    let _: Value = acquire_all(&mut p, &["1", "r1", "2", "1", long, "ID", "d"]);
    let _: i64 = run(&mut p, &["SEM.REFRESHALL", "2", "r1", "r2", "a", long]);
    let _: i64 = run(&mut p, &["SEM.RELEASEALL", "2", "f2", "f3", "c"]);
    let _: Value = acquire_all(
        &mut p,
        &["2", "r2", "3", "1", "x", "1", "1", "0.05", "ID", "gone"],
    );
    thread::sleep(Duration::from_millis(100));
    let _: Value = acquire_all(
        &mut p,
        &["2", "r2", "3", "1", "x", "1", "1", long, "ID", "e"],
    );
    wait_for_replica(&mut p);
    let on_primary = snapshot_of_all_keys(&mut p);
    assert!(on_primary.len() >= 6, "{on_primary:?}");
    let mut r = replica.connection();
    assert_eq!(snapshot_of_all_keys(&mut r), on_primary);
    let dir = primary.stop();
    let reloaded = Server::restart_in(&dir, &["--appendonly", "yes"]);
    let mut again = reloaded.connection();
    assert_eq!(snapshot_of_all_keys(&mut again), on_primary);
}

fn assert_waits(pending: &Pending, what: &str) {
    thread::sleep(Duration::from_millis(50));
    assert!(
        !pending.is_done(),
        "{what} got a reply while it should wait"
    );
}

/// A set at the head of a line holds it even where its permit is free: a later single waiter
/// for that free semaphore waits behind it; the set is granted both semaphores at once when
/// the other frees, and the single waiter after it.
#[test]
fn a_waiting_set_holds_the_head_of_each_of_its_lines() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "x", "1", "30", "ID", "h"]);
    let set = Pending::send(
        &server,
        &[
            "SEM.ACQUIREALL",
            "2",
            "y",
            "1",
            "1",
            "x",
            "1",
            "1",
            "30",
            "ID",
            "s",
            "WAIT",
            "10",
        ],
    );
    until_in_line(&mut c, "y", 1);
    assert_eq!(waiters_in_line(&mut c, "x"), 1);
    let single = Pending::send(
        &server,
        &["SEM.ACQUIRE", "y", "1", "30", "ID", "w", "WAIT", "10"],
    );
    until_in_line(&mut c, "y", 2);
    assert_waits(&single, "a single waiter behind the set");
    assert!(
        zset(&mut c, "y").is_empty(),
        "y stays free while the set waits"
    );
    let _: i64 = run(&mut c, &["SEM.RELEASE", "x", "h"]);
    assert_eq!(
        set.reply().expect("granted"),
        Value::BulkString(b"s".to_vec())
    );
    assert_eq!(zset(&mut c, "x")[0].0, "s");
    assert_eq!(zset(&mut c, "y")[0].0, "s");
    assert_waits(&single, "the single waiter while the set holds y");
    let released: i64 = run(&mut c, &["SEM.RELEASEALL", "2", "x", "y", "s"]);
    assert_eq!(released, 2);
    assert_eq!(
        single.reply().expect("granted"),
        Value::BulkString(b"w".to_vec())
    );
}

/// Two sets naming the same semaphores in opposite orders: the earlier is served first, the
/// later next, with the tickets in that order; no deadlock.
#[test]
fn sets_named_in_opposite_orders_are_served_in_arrival_order() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "p", "1", "30", "ID", "h1"]);
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "q", "1", "30", "ID", "h2"]);
    let p = fresh.holder(&mut c, "p", "h1");
    let q = fresh.holder(&mut c, "q", "h2");
    let first = Pending::send(
        &server,
        &[
            "SEM.ACQUIREALL",
            "2",
            "p",
            "1",
            "1",
            "q",
            "1",
            "1",
            "30",
            "ID",
            "a",
            "FAIR",
            "WITHTICKET",
            "WAIT",
            "10",
        ],
    );
    until_in_line(&mut c, "p", 1);
    let second = Pending::send(
        &server,
        &[
            "SEM.ACQUIREALL",
            "2",
            "q",
            "1",
            "1",
            "p",
            "1",
            "1",
            "30",
            "ID",
            "b",
            "FAIR",
            "WITHTICKET",
            "WAIT",
            "10",
        ],
    );
    until_in_line(&mut c, "p", 2);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "q", "h2"]);
    assert_waits(&first, "the first set while p is held");
    let _: i64 = run(&mut c, &["SEM.RELEASE", "p", "h1"]);
    // The tickets: in the order named, each above every one the node handed out before.
    let ticketed = |reply: Value, id: &[u8]| -> Vec<i64> {
        let Value::Array(items) = reply else {
            panic!("a set's grant with tickets: {reply:?}")
        };
        assert_eq!(items[0], Value::BulkString(id.to_vec()));
        let Value::Array(tickets) = &items[1] else {
            panic!("tickets: {items:?}")
        };
        tickets
            .iter()
            .map(|t| match t {
                Value::Int(t) => *t,
                other => panic!("a ticket: {other:?}"),
            })
            .collect()
    };
    let a = ticketed(first.reply().expect("granted"), b"a");
    assert!(a[0] > p.max(q) && a[1] > a[0], "{a:?} after p {p}, q {q}");
    assert_waits(&second, "the second set while the first holds both");
    let _: i64 = run(&mut c, &["SEM.RELEASEALL", "2", "p", "q", "a"]);
    let b = ticketed(second.reply().expect("granted"), b"b");
    assert!(b[0] > a[1] && b[1] > b[0], "{b:?} after {a:?}");
    let info = info_sem(&mut c);
    assert_eq!(info["sem_waits_granted"], 2, "{info:?}");
    assert_eq!(info["sem_waiters"], 0, "{info:?}");
}

/// A waiting set that times out, disconnects or is unblocked leaves every line at once, and
/// whoever stood behind it is served.
#[test]
fn a_set_that_stops_waiting_leaves_every_line() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "full", "1", "30", "ID", "h"]);
    for how in ["timeout", "kill", "unblock"] {
        let wait = if how == "timeout" { "0.3" } else { "10" };
        let set = Pending::send(
            &server,
            &[
                "SEM.ACQUIREALL",
                "2",
                "free",
                "1",
                "1",
                "full",
                "1",
                "1",
                "30",
                "ID",
                "s",
                "WAIT",
                wait,
            ],
        );
        until_in_line(&mut c, "free", 1);
        let single = Pending::send(
            &server,
            &["SEM.ACQUIRE", "free", "1", "30", "ID", "w", "WAIT", "10"],
        );
        until_in_line(&mut c, "free", 2);
        let id = set.client_id.to_string();
        match how {
            "kill" => {
                let _: i64 = run(&mut c, &["CLIENT", "KILL", "ID", &id]);
            }
            "unblock" => {
                let _: i64 = run(&mut c, &["CLIENT", "UNBLOCK", &id]);
            }
            _ => {}
        }
        assert_eq!(
            single.reply().expect("granted"),
            Value::BulkString(b"w".to_vec()),
            "{how}"
        );
        if how != "kill" {
            assert_eq!(set.reply().expect("a reply"), Value::Nil, "{how}");
        }
        assert_eq!(
            waiters_in_line(&mut c, "full"),
            0,
            "{how}: the set left the other line"
        );
        let _: i64 = run(&mut c, &["SEM.RELEASE", "free", "w"]);
    }
}

/// A set granted after waiting, with BOUND, comes back whole when its connection closes; the
/// grant made by the timer reaches a replica as the primary made it.
#[test]
fn a_bound_waiting_set_comes_back_whole_and_replicates_exactly() {
    let primary = Server::start_with(&PRIMARY_ARGS);
    let replica = start_replica_of(&primary);
    let mut p = primary.connection();
    let _: String = run(&mut p, &["SEM.ACQUIREFAIR", "u", "1", "30", "ID", "h"]);
    let set = Pending::send(
        &primary,
        &[
            "SEM.ACQUIREALL",
            "2",
            "u",
            "1",
            "1",
            "v",
            "2",
            "2",
            "30",
            "FAIR",
            "WAIT",
            "10",
            "BOUND",
        ],
    );
    until_in_line(&mut p, "u", 1);
    let _: i64 = run(&mut p, &["SEM.RELEASE", "u", "h"]);
    let (reply, conn) = set.finish();
    assert!(matches!(reply, Ok(Value::BulkString(_))), "{reply:?}");
    wait_for_replica(&mut p);
    let mut r = replica.connection();
    let granted = snapshot_of_all_keys(&mut p);
    assert_eq!(snapshot_of_all_keys(&mut r), granted);
    assert_eq!(info_sem(&mut p)["sem_bound_holders"], 2);
    drop(conn);
    wait_until("the set comes back", Duration::from_secs(10), || {
        zset(&mut p, "u").is_empty() && zset(&mut p, "v").is_empty()
    });
    wait_for_replica(&mut p);
    assert_eq!(snapshot_of_all_keys(&mut r), snapshot_of_all_keys(&mut p));
}

/// An error found in any of the named semaphores leaves all of them as they were, the ones
/// named before it included.
#[test]
fn a_set_release_or_refresh_that_fails_anywhere_changes_nothing() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "a", "2", "60", "ID", "x"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "b", "2", "60", "ID", "y"]);
    let _: i64 = run(&mut c, &["HSET", "b:permits", "", "not a count"]);
    let before = everything(&mut c);
    for args in [
        &["SEM.RELEASEALL", "2", "a", "b", "x"][..],
        &["SEM.REFRESHALL", "2", "a", "b", "x", "30"],
    ] {
        let err = error_of(&mut c, args);
        assert!(
            err.starts_with("ERR the semaphore's permits key"),
            "{args:?}: {err}"
        );
        assert_eq!(everything(&mut c), before, "{args:?} changed a key");
    }
}

/// A broken stored limit on a semaphore the set only renews is found before anything changes.
#[test]
fn a_broken_limit_key_anywhere_refuses_the_set_before_any_grant() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "x", "5", "60", "ID", "h"]);
    let _: () = run(&mut c, &["SET", "x:limit", "garbage"]);
    let before = everything(&mut c);
    let err = error_of(
        &mut c,
        &[
            "SEM.ACQUIREALL",
            "2",
            "y",
            "1",
            "1",
            "x",
            "5",
            "1",
            "60",
            "ID",
            "h",
        ],
    );
    assert!(err.starts_with("ERR the semaphore's limit key"), "{err}");
    assert_eq!(everything(&mut c), before, "y was granted before x's error");
}
