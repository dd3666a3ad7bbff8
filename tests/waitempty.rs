//! `SEM.WAITEMPTY name seconds`: SysV's wait for zero. Woken by every way a semaphore's permits
//! reach 0 (release, lease end, a BOUND connection closing, a delete or flush), answered 0 when
//! its time is up, never in anybody's way, and answered at once where a client cannot block.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use redis::Value;

const EVENTUALLY: Duration = Duration::from_secs(10);

/// Sends `SEM.WAITEMPTY name seconds` from a connection of its own, and returns once the
/// server counts it among those waiting for `name` to empty.
fn wait_empty(server: &Server, conn: &mut redis::Connection, name: &str, seconds: &str) -> Pending {
    let before = sem_json(conn, name)["waiting_for_empty"].as_u64().unwrap();
    let pending = Pending::send(server, &["SEM.WAITEMPTY", name, seconds]);
    wait_until("the client waits for empty", EVENTUALLY, || {
        assert!(!pending.is_done(), "SEM.WAITEMPTY did not wait");
        sem_json(conn, name)["waiting_for_empty"].as_u64().unwrap() == before + 1
    });
    pending
}

fn assert_still_waiting(pending: &Pending) {
    sleep(Duration::from_millis(50));
    assert!(
        !pending.is_done(),
        "answered while the semaphore had holders"
    );
}

fn one(pending: Pending) {
    assert_eq!(pending.reply().expect("a reply"), Value::Int(1));
}

#[test]
fn it_answers_1_at_once_when_empty_and_0_when_the_time_is_up() {
    let server = Server::start();
    let mut c = server.connection();
    let empty: i64 = run(&mut c, &["SEM.WAITEMPTY", "nothere", "5"]);
    assert_eq!(empty, 1);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "busy", "2", "30", "ID", "a"]);
    let started = Instant::now();
    let timed_out: i64 = run(&mut c, &["SEM.WAITEMPTY", "busy", "0.2"]);
    assert_eq!(timed_out, 0);
    assert!(started.elapsed() >= Duration::from_millis(200));
    // Expired holders do not count: the permits in use are 0.
    let _: String = run(&mut c, &["SEM.ACQUIRE", "gone", "2", "0.05", "ID", "a"]);
    sleep(Duration::from_millis(100));
    let empty: i64 = run(&mut c, &["SEM.WAITEMPTY", "gone", "5"]);
    assert_eq!(empty, 1);
    let info = info_sem(&mut c);
    assert_eq!(info["sem_empty_waits_started"], 1, "{info:?}");
    assert_eq!(info["sem_empty_waits_timed_out"], 1, "{info:?}");
    assert_eq!(info["sem_waiting_for_empty"], 0, "{info:?}");
    assert_eq!(
        info["sem_waits_started"], 0,
        "not a wait for permits: {info:?}"
    );
    // The timer stops when nobody waits, once the events the waits followed end (a second
    // after the last).
    wait_until("the timer stops", Duration::from_secs(10), || {
        info_sem(&mut c)["sem_armed_timers"] == 0
    });
}

#[test]
fn the_last_release_wakes_every_waiter_for_empty() {
    let server = Server::start();
    let mut c = server.connection();
    for id in ["a", "b"] {
        let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "jobs", "3", "30", "ID", id]);
    }
    let _: String = run(&mut c, &["SEM.ACQUIRE", "other", "1", "30", "ID", "x"]);
    let first = wait_empty(&server, &mut c, "jobs", "10");
    let second = wait_empty(&server, &mut c, "jobs", "0");
    let elsewhere = wait_empty(&server, &mut c, "other", "10");
    assert_eq!(sem_json(&mut c, "jobs")["waiting_for_empty"], 2);
    assert_eq!(
        sem_json(&mut c, "jobs")["waiters"],
        0,
        "not in the line for permits"
    );
    let released: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "a"]);
    assert_eq!(released, 1);
    assert_still_waiting(&first);
    let released: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "b"]);
    assert_eq!(released, 1);
    one(first);
    one(second);
    assert_still_waiting(&elsewhere);
    assert_eq!(info_sem(&mut c)["sem_empty_waits_emptied"], 2);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "other", "x"]);
    one(elsewhere);
}

#[test]
fn a_lease_end_wakes_it_at_the_deadline() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "lease", "5", "0.3", "ID", "a"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "lease", "5", "0.5", "ID", "b"]);
    let deadline: i64 = run(&mut c, &["ZSCORE", "lease", "b"]);
    let pending = wait_empty(&server, &mut c, "lease", "10");
    let (reply, mut own) = pending.finish();
    let answered = server_ms(&mut own);
    assert_eq!(reply.expect("a reply"), Value::Int(1));
    assert!(
        (deadline..deadline + 200).contains(&answered),
        "answered {} ms after the last deadline",
        answered - deadline
    );
}

#[test]
fn a_bound_connection_closing_a_delete_and_a_flush_wake_it() {
    let server = Server::start();
    let mut c = server.connection();
    let mut holder = server.connection();
    let holder_id: i64 = run(&mut holder, &["CLIENT", "ID"]);
    let _: String = run(&mut holder, &["SEM.ACQUIRE", "bound", "1", "30", "BOUND"]);
    let pending = wait_empty(&server, &mut c, "bound", "10");
    let killed: i64 = run(&mut c, &["CLIENT", "KILL", "ID", &holder_id.to_string()]);
    assert_eq!(killed, 1);
    one(pending);

    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "del", "1", "30"]);
    let pending = wait_empty(&server, &mut c, "del", "10");
    let deleted: i64 = run(&mut c, &["DEL", "del"]);
    assert_eq!(deleted, 1);
    one(pending);

    let _: String = run(&mut c, &["SEM.ACQUIRE", "flushed", "1", "30"]);
    let pending = wait_empty(&server, &mut c, "flushed", "10");
    let _: () = run(&mut c, &["FLUSHDB"]);
    one(pending);
}

/// It takes nothing and is in nobody's way: a waiter for permits is served first, and a fair
/// acquire without WAIT is not refused on its account.
#[test]
fn it_holds_nobody_back() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "line", "1", "30", "ID", "h"]);
    let empty = wait_empty(&server, &mut c, "line", "10");
    let next = Pending::send(
        &server,
        &[
            "SEM.ACQUIREFAIR",
            "line",
            "1",
            "30",
            "ID",
            "w",
            "WAIT",
            "10",
        ],
    );
    wait_until("the waiter for a permit queues", EVENTUALLY, || {
        sem_json(&mut c, "line")["waiters"] == 1
    });
    let _: i64 = run(&mut c, &["SEM.RELEASE", "line", "h"]);
    assert_eq!(
        next.reply().expect("granted"),
        Value::BulkString(b"w".to_vec())
    );
    assert_still_waiting(&empty);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "line", "w"]);
    let again: String = run(&mut c, &["SEM.ACQUIREFAIR", "line", "1", "30", "ID", "x"]);
    assert_eq!(again, "x", "a newcomer without WAIT is not refused");
    // The release of w emptied it first: the waiter for empty was answered then.
    one(empty);
}

#[test]
fn where_a_client_cannot_block_it_answers_for_that_moment() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "m", "1", "30"]);
    let replies: Vec<i64> = redis::pipe()
        .atomic()
        .cmd("SEM.WAITEMPTY")
        .arg("m")
        .arg("5")
        .cmd("SEM.WAITEMPTY")
        .arg("none")
        .arg("5")
        .query(&mut c)
        .expect("MULTI/EXEC");
    assert_eq!(replies, [0, 1]);
    let script = "return {redis.call('SEM.WAITEMPTY', KEYS[1], '5'), \
                  redis.call('SEM.WAITEMPTY', KEYS[2], '5')}";
    let replies: Vec<i64> = run(&mut c, &["EVAL", script, "2", "m", "none"]);
    assert_eq!(replies, [0, 1]);
    assert_eq!(info_sem(&mut c)["sem_empty_waits_started"], 0);
}

#[test]
fn client_unblock_ends_it_with_0_or_an_error() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "u", "1", "30"]);
    let pending = wait_empty(&server, &mut c, "u", "0");
    let unblocked: i64 = run(
        &mut c,
        &["CLIENT", "UNBLOCK", &pending.client_id.to_string()],
    );
    assert_eq!(unblocked, 1);
    assert_eq!(pending.reply().expect("a reply"), Value::Int(0));
    let pending = wait_empty(&server, &mut c, "u", "0");
    let id = pending.client_id.to_string();
    let _: i64 = run(&mut c, &["CLIENT", "UNBLOCK", &id, "ERROR"]);
    let err = pending.reply().expect_err("an error");
    assert_eq!(err.code(), Some("UNBLOCKED"), "{err}");
    let info = info_sem(&mut c);
    assert_eq!(info["sem_empty_waits_cancelled"], 2, "{info:?}");
    assert_eq!(info["sem_waiting_for_empty"], 0);
    assert_eq!(sem_json(&mut c, "u")["waiting_for_empty"], 0);
}

#[test]
fn bad_arguments_are_errors_that_change_nothing() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "s", "1", "30", "ID", "a"]);
    let _: () = run(&mut c, &["SET", "str", "x"]);
    let before: i64 = run(&mut c, &["PEXPIRETIME", "s"]);
    for (args, want) in [
        (&["SEM.WAITEMPTY", "s"][..], "ERR wrong number of arguments"),
        (
            &["SEM.WAITEMPTY", "s", "1", "2"],
            "ERR wrong number of arguments",
        ),
        (&["SEM.WAITEMPTY", "s", "-1"], "ERR timeout must be"),
        (&["SEM.WAITEMPTY", "s", "1.0001"], "ERR timeout must be"),
        (&["SEM.WAITEMPTY", "s", "abc"], "ERR timeout must be"),
        (&["SEM.WAITEMPTY", "s", "31536001"], "ERR timeout must be"),
        (
            &["SEM.WAITEMPTY", "", "1"],
            "ERR semaphore name must not be empty",
        ),
        (&["SEM.WAITEMPTY", "str", "1"], "WRONGTYPE"),
    ] {
        let err = error_of(&mut c, args);
        assert!(err.starts_with(want), "{args:?}: {err}");
    }
    assert_eq!(zset(&mut c, "s").len(), 1);
    let after: i64 = run(&mut c, &["PEXPIRETIME", "s"]);
    assert_eq!(after, before);
    assert_eq!(info_sem(&mut c)["sem_empty_waits_started"], 0);
}

#[test]
fn a_replica_does_not_wait_and_a_primary_that_becomes_one_answers_its_waiters() {
    let primary = Server::start();
    let mut p = primary.connection();
    let _: String = run(&mut p, &["SEM.ACQUIRE", "r", "1", "30", "ID", "a"]);
    let replica = start_replica_of(&primary);
    wait_for_replica(&mut p);
    let mut r = replica.connection();
    let err = error_of(&mut r, &["SEM.WAITEMPTY", "r", "5"]);
    assert!(err.starts_with("READONLY"), "{err}");
    let empty: i64 = run(&mut r, &["SEM.WAITEMPTY", "nothere", "5"]);
    assert_eq!(empty, 1);

    let pending = wait_empty(&primary, &mut p, "r", "10");
    let port = replica.port.to_string();
    let _: () = run(&mut p, &["REPLICAOF", "127.0.0.1", &port]);
    // Redis and Valkey answer blocked clients themselves as the instance becomes a replica,
    // before the module hears of it; the module's own answer is READONLY.
    let err = pending.reply().expect_err("an error");
    assert!(
        matches!(err.code(), Some("UNBLOCKED" | "READONLY")),
        "{err}"
    );
    let mut r = primary.connection();
    assert_eq!(info_sem(&mut r)["sem_waiting_for_empty"], 0);
}
