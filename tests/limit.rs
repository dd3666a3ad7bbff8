//! `SEM.LIMIT`: an operator's limit for a live semaphore. Raised, it serves the line at once;
//! lowered or 0, nobody loses a permit and new grants wait; cleared, callers' own limits apply
//! again. Every change replicates, survives AOF, and fires `sem.limit`.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::state::snapshot_of_all_keys;
use common::*;
use redis::Value;

fn granted(pending: Pending) -> String {
    match pending.reply() {
        Ok(Value::BulkString(id)) => String::from_utf8(id).expect("UTF-8"),
        other => panic!("not granted: {other:?}"),
    }
}

#[test]
fn a_raised_limit_serves_the_line_at_once_in_order() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "jobs", "1", "30", "ID", "h"]);
    let waiters: Vec<Pending> = (0..3)
        .map(|i| {
            let id = format!("w{i}");
            let pending = Pending::send(
                &server,
                &[
                    "SEM.ACQUIREFAIR",
                    "jobs",
                    "1",
                    "30",
                    "ID",
                    &id,
                    "WAIT",
                    "10",
                ],
            );
            until_in_line(&mut c, "jobs", i + 1);
            pending
        })
        .collect();
    let ok: String = run(&mut c, &["SEM.LIMIT", "jobs", "3"]);
    assert_eq!(ok, "OK");
    let mut waiters = waiters.into_iter();
    assert_eq!(granted(waiters.next().unwrap()), "w0");
    assert_eq!(granted(waiters.next().unwrap()), "w1");
    let last = waiters.next().unwrap();
    thread::sleep(Duration::from_millis(50));
    assert!(!last.is_done(), "three hold the three permits");
    let doc = sem_json(&mut c, "jobs");
    assert_eq!(
        (doc["stored_limit"].clone(), doc["limit_in_force"].clone()),
        (3.into(), true.into())
    );
    assert_eq!(doc["in_use"], 3);
    assert_eq!(doc["waiter_ages_ms"].as_array().map(Vec::len), Some(1));
    let limit: i64 = run(&mut c, &["SEM.LIMIT", "jobs"]);
    assert_eq!(limit, 3);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "w0"]);
    assert_eq!(granted(last), "w2");
}

#[test]
fn zero_pauses_and_a_lowered_limit_takes_no_permit_away() {
    let server = Server::start();
    let mut c = server.connection();
    for id in ["a", "b", "c"] {
        let _: String = run(&mut c, &["SEM.ACQUIRE", "p", "5", "30", "ID", id]);
    }
    let ok: String = run(&mut c, &["SEM.LIMIT", "p", "1"]);
    assert_eq!(ok, "OK");
    let in_use: i64 = run(&mut c, &["SEM.GET", "p"]);
    assert_eq!(in_use, 3, "nobody loses a permit");
    let refused: Option<String> = run(&mut c, &["SEM.ACQUIRE", "p", "5", "30"]);
    assert_eq!(refused, None);
    let renewed: String = run(&mut c, &["SEM.ACQUIRE", "p", "5", "30", "ID", "a"]);
    assert_eq!(renewed, "a", "a holder still renews");
    for id in ["a", "b"] {
        let _: i64 = run(&mut c, &["SEM.RELEASE", "p", id]);
    }
    let refused: Option<String> = run(&mut c, &["SEM.ACQUIRE", "p", "5", "30"]);
    assert_eq!(refused, None, "one in use, limit 1");
    let _: i64 = run(&mut c, &["SEM.RELEASE", "p", "c"]);

    let ok: String = run(&mut c, &["SEM.LIMIT", "p", "0"]);
    assert_eq!(ok, "OK");
    let started = Instant::now();
    let paused: Option<String> = run(&mut c, &["SEM.ACQUIRE", "p", "5", "30", "WAIT", "0.2"]);
    assert_eq!(paused, None);
    assert!(started.elapsed() >= Duration::from_millis(200), "it waited");
    let set: Value = run(
        &mut c,
        &["SEM.ACQUIREALL", "2", "p", "5", "1", "q", "5", "1", "30"],
    );
    assert_eq!(set, Value::Nil, "a set with a paused member is refused");
    let cleared: i64 = run(&mut c, &["SEM.LIMIT", "p", "CLEAR"]);
    assert_eq!(cleared, 1);
    let cleared: i64 = run(&mut c, &["SEM.LIMIT", "p", "CLEAR"]);
    assert_eq!(cleared, 0);
    let limit: Option<i64> = run(&mut c, &["SEM.LIMIT", "p"]);
    assert_eq!(limit, None);
    let got: String = run(&mut c, &["SEM.ACQUIRE", "p", "5", "30", "ID", "z"]);
    assert_eq!(got, "z");
    assert_eq!(info_sem(&mut c)["sem_limits_set"], 3);
}

/// Cleared: waiters are served by the limit each asked with, head of line first.
#[test]
fn a_cleared_limit_serves_waiters_by_their_own_limits() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.LIMIT", "s", "0"]);
    let two = Pending::send(
        &server,
        &["SEM.ACQUIRE", "s", "2", "30", "ID", "two", "WAIT", "10"],
    );
    until_in_line(&mut c, "s", 1);
    let one = Pending::send(
        &server,
        &["SEM.ACQUIRE", "s", "1", "30", "ID", "one", "WAIT", "10"],
    );
    until_in_line(&mut c, "s", 2);
    let keys: Vec<String> = run(&mut c, &["KEYS", "*"]);
    assert_eq!(keys, ["s:limit"], "the stored limit is the only key");
    let _: i64 = run(&mut c, &["SEM.LIMIT", "s", "CLEAR"]);
    assert_eq!(granted(two), "two");
    thread::sleep(Duration::from_millis(50));
    assert!(
        !one.is_done(),
        "asked with limit 1 while one permit is in use"
    );
    let _: i64 = run(&mut c, &["SEM.RELEASE", "s", "two"]);
    assert_eq!(granted(one), "one");
}

#[test]
fn bad_limits_are_errors_that_change_nothing() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "x", "2", "30", "ID", "h"]);
    let _: i64 = run(&mut c, &["LPUSH", "l:limit", "v"]);
    let before = format!("{:?}", snapshot_of_all_keys_but_lists(&mut c));
    for (args, want) in [
        (
            &["SEM.LIMIT", "x", "-1"][..],
            "ERR limit must be an integer from 0",
        ),
        (
            &["SEM.LIMIT", "x", "abc"],
            "ERR limit must be an integer from 0",
        ),
        (
            &["SEM.LIMIT", "x", "4294967296"],
            "ERR limit must be an integer from 0",
        ),
        (
            &["SEM.LIMIT", "x", "1", "2"],
            "ERR wrong number of arguments",
        ),
        (&["SEM.LIMIT", "l", "1"], "WRONGTYPE"),
        (&["SEM.ACQUIRE", "l", "1", "30"], "WRONGTYPE"),
        (
            &["SEM.LIMIT", "", "1"],
            "ERR semaphore name must not be empty",
        ),
    ] {
        let err = error_of(&mut c, args);
        assert!(err.starts_with(want), "{args:?}: {err}");
    }
    assert_eq!(
        format!("{:?}", snapshot_of_all_keys_but_lists(&mut c)),
        before
    );
    // A limit key another client filled with something else: acquires refuse to guess.
    let _: () = run(&mut c, &["SET", "x:limit", "many"]);
    let err = error_of(&mut c, &["SEM.ACQUIRE", "x", "2", "30"]);
    assert!(err.starts_with("ERR the semaphore's limit key"), "{err}");
    assert_eq!(zset(&mut c, "x").len(), 1);
}

fn snapshot_of_all_keys_but_lists(
    conn: &mut redis::Connection,
) -> Vec<(String, String, Option<String>)> {
    let mut keys: Vec<String> = run(conn, &["KEYS", "*"]);
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let kind: String = run(conn, &["TYPE", &key]);
            let dump: Option<Vec<u8>> = run(conn, &["DUMP", &key]);
            (key, kind, dump.map(|d| format!("{d:?}")))
        })
        .collect()
}

/// A change fires `sem.limit`; the same limit again changes nothing and fires nothing; a
/// replica and an AOF reload hold exactly the primary's keys, the stored limit included.
#[test]
fn changes_fire_an_event_and_replicate_exactly() {
    let primary =
        Server::start_with(&[&AOF_PRIMARY_ARGS[..], &["--notify-keyspace-events", "Kd"]].concat());
    let replica = start_replica_of(&primary);
    let mut p = primary.connection();
    let mut events = primary.connection();
    events
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut pubsub = events.as_pubsub();
    pubsub.subscribe("__keyspace@0__:e").expect("subscribe");
    let _: String = run(&mut p, &["SEM.LIMIT", "e", "4"]);
    let message = pubsub.get_message().expect("an event");
    assert_eq!(message.get_payload::<String>().unwrap(), "sem.limit");
    let _: String = run(&mut p, &["SEM.LIMIT", "e", "4"]);
    assert!(
        pubsub.get_message().is_err(),
        "the same limit fired an event"
    );
    drop(pubsub);
    let _: String = run(&mut p, &["SEM.ACQUIRE", "e", "1", "600", "ID", "a"]);
    let _: String = run(&mut p, &["SEM.ACQUIRE", "e", "1", "600", "ID", "b"]);
    let _: String = run(&mut p, &["SEM.LIMIT", "f", "0"]);
    let _: String = run(&mut p, &["SEM.LIMIT", "g", "7"]);
    let _: i64 = run(&mut p, &["SEM.LIMIT", "g", "CLEAR"]);
    wait_for_replica(&mut p);
    let keys = snapshot_of_all_keys(&mut p);
    let names: Vec<&String> = keys.keys().collect();
    assert_eq!(names, ["e", "e:limit", "f:limit"]);
    let mut r = replica.connection();
    assert_eq!(snapshot_of_all_keys(&mut r), keys);
    let dir = primary.stop();
    let reloaded = Server::restart_in(&dir, &["--appendonly", "yes"]);
    let mut again = reloaded.connection();
    assert_eq!(snapshot_of_all_keys(&mut again), keys);
    let limit: i64 = run(&mut again, &["SEM.LIMIT", "e"]);
    assert_eq!(limit, 4);
}
