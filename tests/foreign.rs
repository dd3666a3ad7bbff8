//! Another client frees a semaphore somebody waits for: it deletes, unlinks, renames or moves
//! the holders away, expires them early, flushes or swaps their database, or memory pressure
//! evicts them. On every server the line is served at once (by the time the command's own
//! reply is read; an expiry as the server's expiry cycle removes the key), whatever waits there:
//! a plain, fair, weighted or set waiter, or `SEM.WAITEMPTY`. The waiter holds a real permit on
//! the keys as they are now, and a replica ends with the primary's keys.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::state::{snapshot_of_all_keys, KeyState};
use common::{
    info_sem, key_watch, run, start_replica_of, wait_for_replica, wait_until, zset, KeyWatch,
    Pending, Server,
};
use redis::Value;

/// What waits on the semaphore `k` (held by `h`, limit 1 or 3, leases of a minute).
#[derive(Debug, Clone, Copy)]
enum Waiter {
    Plain,
    Fair,
    Weighted,
    Set,
    Empty,
}

const WAITERS: [Waiter; 5] = [
    Waiter::Plain,
    Waiter::Fair,
    Waiter::Weighted,
    Waiter::Set,
    Waiter::Empty,
];

impl Waiter {
    fn hold(self, conn: &mut redis::Connection) {
        let args: &[&str] = match self {
            Waiter::Fair => &["SEM.ACQUIREFAIR", "k", "1", "60", "ID", "h"],
            Waiter::Weighted => &["SEM.ACQUIRE", "k", "3", "60", "ID", "h", "COUNT", "2"],
            _ => &["SEM.ACQUIRE", "k", "1", "60", "ID", "h"],
        };
        let held: String = run(conn, args);
        assert_eq!(held, "h");
    }

    fn wait(self) -> &'static [&'static str] {
        match self {
            Waiter::Plain => &["SEM.ACQUIRE", "k", "1", "60", "ID", "w", "WAIT", "10"],
            Waiter::Fair => &["SEM.ACQUIREFAIR", "k", "1", "60", "ID", "w", "WAIT", "10"],
            Waiter::Weighted => &[
                "SEM.ACQUIRE",
                "k",
                "3",
                "60",
                "ID",
                "w",
                "COUNT",
                "3",
                "WAIT",
                "10",
            ],
            Waiter::Set => &[
                "SEM.ACQUIREALL",
                "2",
                "k",
                "1",
                "1",
                "other",
                "1",
                "1",
                "60",
                "ID",
                "w",
                "WAIT",
                "10",
            ],
            Waiter::Empty => &["SEM.WAITEMPTY", "k", "10"],
        }
    }

    fn granted(self) -> Value {
        match self {
            Waiter::Empty => Value::Int(1),
            _ => Value::BulkString(b"w".to_vec()),
        }
    }

    /// `k`'s holders once the waiter was served (a wait for empty takes nothing).
    fn holders_after(self) -> Vec<(String, i64)> {
        match self {
            Waiter::Empty => vec![],
            _ => vec![("w".into(), 0)],
        }
    }
}

/// The commands of another client that free `k` in database 0, and whether the line is served
/// only when the server's expiry cycle removes the key.
const FREEING: [(&[&str], bool); 8] = [
    (&["DEL", "k"], false),
    (&["UNLINK", "k"], false),
    (&["RENAME", "k", "k-renamed"], false),
    (&["MOVE", "k", "5"], false),
    (&["PEXPIRE", "k", "50"], true),
    (&["FLUSHDB"], false),
    (&["FLUSHALL"], false),
    (&["SWAPDB", "0", "5"], false),
];

/// Blocks `waiter` on `k` and returns once it stands in line.
fn queue(server: &Server, conn: &mut redis::Connection, waiter: Waiter) -> Pending {
    let before = info_sem(conn);
    let count = |info: &BTreeMap<String, u64>| info["sem_waiters"] + info["sem_waiting_for_empty"];
    let pending = Pending::send(server, waiter.wait());
    wait_until("the client waits", Duration::from_secs(10), || {
        count(&info_sem(conn)) == count(&before) + 1
    });
    pending
}

/// Every key of databases 0 and 5, with what it holds and its expiry.
fn keys_of(conn: &mut redis::Connection) -> Vec<BTreeMap<String, KeyState>> {
    let keys = [0, 5]
        .iter()
        .map(|db| {
            let _: () = run(conn, &["SELECT", &db.to_string()]);
            snapshot_of_all_keys(conn)
        })
        .collect();
    let _: () = run(conn, &["SELECT", "0"]);
    keys
}

fn zset_members(conn: &mut redis::Connection, key: &str) -> Vec<(String, i64)> {
    zset(conn, key).into_iter().map(|(m, _)| (m, 0)).collect()
}

/// Each freeing command, on each kind of waiter, with a replica attached: served at once, a real
/// permit on the keys as they are now, the old holder's permit gone with its key, and the
/// replica's keys the primary's.
#[test]
fn another_clients_change_that_frees_a_semaphore_serves_its_line_at_once() {
    let server = Server::start();
    let replica = start_replica_of(&server);
    let mut conn = server.connection();
    let mut replica_conn = replica.connection();
    for (command, by_expiry) in FREEING {
        for waiter in WAITERS {
            let case = format!("{command:?} with a {waiter:?} waiter");
            let _: () = run(&mut conn, &["FLUSHALL"]);
            waiter.hold(&mut conn);
            let pending = queue(&server, &mut conn, waiter);
            let started = Instant::now();
            let _: Value = run(&mut conn, command);
            if !by_expiry {
                // Served before this connection's next command.
                assert_eq!(
                    zset_members(&mut conn, "k"),
                    waiter.holders_after(),
                    "{case}: k's holders right after"
                );
            }
            let (reply, _) = pending.finish();
            assert_eq!(reply.expect("a reply"), waiter.granted(), "{case}");
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{case}: served after {:?}",
                started.elapsed()
            );
            assert_eq!(
                zset_members(&mut conn, "k"),
                waiter.holders_after(),
                "{case}: k's holders"
            );
            let in_use: i64 = run(&mut conn, &["SEM.GET", "k"]);
            let expected = match waiter {
                Waiter::Empty => 0,
                Waiter::Weighted => 3,
                _ => 1,
            };
            assert_eq!(in_use, expected, "{case}: permits in use");
            wait_for_replica(&mut conn);
            assert_eq!(
                keys_of(&mut replica_conn),
                keys_of(&mut conn),
                "{case}: the replica's keys"
            );
        }
    }
}

/// Memory pressure evicts a waited semaphore's holder set (the only key with a TTL, under
/// `volatile-ttl`): its waiter is served at once.
#[test]
fn an_evicted_holder_set_serves_its_line() {
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = run(&mut conn, &["SEM.ACQUIRE", "k", "1", "60", "ID", "h"]);
    let pending = queue(&server, &mut conn, Waiter::Plain);
    let _: () = run(
        &mut conn,
        &["CONFIG", "SET", "maxmemory-policy", "volatile-ttl"],
    );
    let started = Instant::now();
    // Below what the server uses: the next write evicts what it can (the holder set only).
    let _: () = run(&mut conn, &["CONFIG", "SET", "maxmemory", "1"]);
    let _: Result<(), redis::RedisError> = redis::cmd("SET").arg("x").arg("1").query(&mut conn);
    let (reply, _) = pending.finish();
    let _: () = run(&mut conn, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(reply.expect("a reply"), Value::BulkString(b"w".to_vec()));
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(info_sem(&mut conn)["sem_evicted_keys"] >= 1);
}

/// Another client overwrites a waited holder set with a string. Where the module follows the
/// key server event (Redis 7.2 to 8.1 and Valkey by default; Redis 8.2 and later with
/// `key-events server`), the waiters are answered `WRONGTYPE` at once; elsewhere at their
/// timeout, when the line is looked at once more (src/server/events.rs). The other client's value stays.
#[test]
fn an_overwrite_with_another_type_answers_the_waiters_where_the_server_tells() {
    let server = Server::start();
    let watch = key_watch(&mut server.connection(), &[]);
    overwrite_a_waited_key(&server, watch);
    let with_server_event = key_watch(&mut server.connection(), &["key-events", "server"]);
    drop(server);
    if with_server_event.is_some() {
        let server = Server::start_configured("", &["key-events", "server"], &[]);
        overwrite_a_waited_key(&server, with_server_event);
    }
}

fn overwrite_a_waited_key(server: &Server, watch: Option<KeyWatch>) {
    let mut conn = server.connection();
    let _: String = run(&mut conn, &["SEM.ACQUIRE", "k", "1", "60", "ID", "h"]);
    let pending = Pending::send(server, &["SEM.ACQUIRE", "k", "1", "60", "WAIT", "1"]);
    wait_until("the client waits", Duration::from_secs(10), || {
        info_sem(&mut conn)["sem_waiters"] == 1
    });
    let started = Instant::now();
    let _: () = run(&mut conn, &["SET", "k", "x"]);
    let (reply, _) = pending.finish();
    // Either way the answer is WRONGTYPE: at its timeout the line is looked at once more
    // before a waiter is told its time is up.
    let err = reply.expect_err("WRONGTYPE");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    if watch == Some(KeyWatch::KeyEvent) {
        assert!(started.elapsed() < Duration::from_millis(900));
    } else {
        assert!(started.elapsed() >= Duration::from_millis(500));
    }
    let value: String = run(&mut conn, &["GET", "k"]);
    assert_eq!(value, "x", "the other client's value stays");
}
