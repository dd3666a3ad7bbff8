//! The waiting side's exact promises where another client changes a semaphore in ways the
//! module is not told of: a waiter whose time ends while a permit it could take is free is
//! granted, not timed out, and the head of a line is never skipped for whoever stands behind it;
//! a fair name whose counter went with a flush, swap or move goes on with tickets above those
//! its old holders still use.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use redis::Value;

const EVENTUALLY: Duration = Duration::from_secs(10);

fn bulk(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        _ => None,
    }
}

fn holders(conn: &mut redis::Connection, name: &str) -> Vec<String> {
    let mut ids: Vec<String> = zset(conn, name).into_iter().map(|(id, _)| id).collect();
    ids.sort();
    ids
}

/// Sends an acquire that waits, from a connection of its own, once the line has grown by one.
fn wait_in_line(server: &Server, conn: &mut redis::Connection, args: &[&str]) -> Pending {
    let name = args[1];
    let before = waiters_in_line(conn, name);
    let pending = Pending::send(server, args);
    wait_until("the acquire waits in line", EVENTUALLY, || {
        assert!(!pending.is_done(), "{args:?} did not wait");
        waiters_in_line(conn, name) == before + 1
    });
    pending
}

#[test]
fn a_waiter_whose_time_ends_while_a_permit_is_free_takes_it() {
    for command in ["SEM.ACQUIRE", "SEM.ACQUIREFAIR"] {
        let server = Server::start();
        let mut c = server.connection();
        for holder in ["h1", "h2"] {
            let granted: String = run(&mut c, &[command, "k", "2", "60", "ID", holder]);
            assert_eq!(granted, holder);
        }
        let w1 = wait_in_line(
            &server,
            &mut c,
            &[command, "k", "2", "60", "ID", "w1", "WAIT", "1"],
        );
        let w2 = wait_in_line(
            &server,
            &mut c,
            &[command, "k", "2", "60", "ID", "w2", "WAIT", "20"],
        );
        // Another client takes a holder away by hand: a change no key event reports.
        let removed: i64 = run(&mut c, &["ZREM", "k", "h1"]);
        assert_eq!(removed, 1);
        let sent = Instant::now();
        let reply = w1.reply().expect("w1's reply");
        assert_eq!(
            bulk(&reply).as_deref(),
            Some("w1"),
            "{command}: the head of the line, at its deadline with a permit free, got {reply:?}"
        );
        assert!(
            sent.elapsed() < Duration::from_secs(3),
            "answered at its deadline"
        );
        assert_eq!(holders(&mut c, "k"), ["h2", "w1"], "{command}");
        assert!(
            !w2.is_done(),
            "{command}: w2 was served past a full semaphore"
        );
        assert_eq!(waiters_in_line(&mut c, "k"), 1, "{command}: w2 still waits");
        let released: i64 = run(&mut c, &["SEM.RELEASE", "k", "h2"]);
        assert_eq!(released, 1);
        let reply = w2.reply().expect("w2's reply");
        assert_eq!(bulk(&reply).as_deref(), Some("w2"), "{command}");
    }
}

#[test]
fn a_waiter_behind_a_head_that_cannot_fit_still_times_out() {
    // The head asks for 2 permits, the one behind for 1: one permit freed by hand lets the
    // second fit but not the head, and a line is served head first, so both time out.
    let server = Server::start();
    let mut c = server.connection();
    for holder in ["h1", "h2"] {
        let _: String = run(&mut c, &["SEM.ACQUIRE", "k", "2", "60", "ID", holder]);
    }
    let head = wait_in_line(
        &server,
        &mut c,
        &[
            "SEM.ACQUIRE",
            "k",
            "2",
            "60",
            "ID",
            "big",
            "COUNT",
            "2",
            "WAIT",
            "1",
        ],
    );
    let behind = wait_in_line(
        &server,
        &mut c,
        &["SEM.ACQUIRE", "k", "2", "60", "ID", "w", "WAIT", "1"],
    );
    let _: i64 = run(&mut c, &["ZREM", "k", "h1"]);
    assert_eq!(head.reply().expect("a reply"), Value::Nil);
    // The head leaves at its time; the one behind fits, and its time is up a moment later
    // (its deadline is the same second): either it takes the free permit as the head left or
    // it timed out first, never while the head still stood there.
    let reply = behind.reply().expect("a reply");
    let held = holders(&mut c, "k");
    match bulk(&reply).as_deref() {
        Some("w") => assert_eq!(held, ["h2", "w"]),
        None => assert_eq!(held, ["h2"]),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_set_waiter_whose_time_ends_while_its_permits_are_free_takes_them() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "{s}a", "1", "60", "ID", "h"]);
    let set = Pending::send(
        &server,
        &[
            "SEM.ACQUIREALL",
            "2",
            "{s}a",
            "1",
            "1",
            "{s}b",
            "1",
            "1",
            "60",
            "ID",
            "w",
            "WAIT",
            "1",
        ],
    );
    wait_until("the set waits", EVENTUALLY, || {
        waiters_in_line(&mut c, "{s}a") == 1
    });
    let _: i64 = run(&mut c, &["ZREM", "{s}a", "h"]);
    let reply = set.reply().expect("a reply");
    assert_eq!(bulk(&reply).as_deref(), Some("w"), "{reply:?}");
    assert_eq!(holders(&mut c, "{s}a"), ["w"]);
    assert_eq!(holders(&mut c, "{s}b"), ["w"]);
}

#[test]
fn a_wait_for_empty_whose_time_ends_on_an_empty_semaphore_answers_1() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "k", "1", "60", "ID", "h"]);
    let pending = Pending::send(&server, &["SEM.WAITEMPTY", "k", "1"]);
    wait_until("the client waits for empty", EVENTUALLY, || {
        sem_json(&mut c, "k")["waiting_for_empty"].as_u64() == Some(1)
    });
    // The holder's deadline moved into the past by hand: it is gone for every rule, and
    // nothing told the module, whose next look at the line was the old lease end.
    let _: i64 = run(&mut c, &["ZADD", "k", "XX", "1", "h"]);
    assert_eq!(pending.reply().expect("a reply"), Value::Int(1));
}

/// Whether the server runs a module's work right after the command that fired a key event
/// (post-notification jobs: Redis 7.2 and later, Valkey).
fn serves_before_the_next_command(conn: &mut redis::Connection) -> bool {
    let (valkey, major, minor) = server_version(conn);
    valkey || (major, minor) >= (7, 2)
}

/// A connection that writes commands without reading their replies first, so several reach
/// the server in one read.
struct Raw(BufReader<TcpStream>);

impl Raw {
    fn connect(server: &Server) -> Raw {
        let socket = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        Raw(BufReader::new(socket))
    }

    /// Writes all `commands` in one write.
    fn send(&mut self, commands: &[&[&str]]) {
        let mut bytes = String::new();
        for args in commands {
            bytes.push_str(&format!("*{}\r\n", args.len()));
            for arg in *args {
                bytes.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
            }
        }
        self.0.get_mut().write_all(bytes.as_bytes()).expect("send");
    }

    /// The next reply, a number, nil or a bulk string, as text ("nil" for nil).
    fn reply(&mut self) -> String {
        let mut line = String::new();
        self.0.read_line(&mut line).expect("a reply");
        let line = line.trim_end().to_string();
        match line.as_bytes().first() {
            Some(b'$') if line == "$-1" => "nil".into(),
            Some(b'$') => {
                let mut value = String::new();
                self.0.read_line(&mut value).expect("a bulk string");
                value.trim_end().to_string()
            }
            Some(b':' | b'+') => line[1..].to_string(),
            _ => panic!("unexpected reply {line}"),
        }
    }
}

/// What another client sends to free a waited semaphore: its holder set goes, one way or
/// another.
const FREEING: [&[&str]; 6] = [
    &["DEL", "k"],
    &["UNLINK", "k"],
    &["RENAME", "k", "gone"],
    &["MOVE", "k", "9"],
    &["FLUSHDB"],
    &["SWAPDB", "0", "9"],
];

#[test]
fn a_newcomer_sent_with_a_deletion_never_takes_the_permit_a_waiter_was_owed() {
    for command in ["SEM.ACQUIRE", "SEM.ACQUIREFAIR"] {
        for pipelined in [true, false] {
            let server = Server::start();
            let mut c = server.connection();
            let before_next = serves_before_the_next_command(&mut c);
            for (round, freeing) in FREEING.iter().cycle().take(12).enumerate() {
                let h = format!("h{round}");
                let w = format!("w{round}");
                let x = format!("x{round}");
                let granted: String = run(&mut c, &[command, "k", "1", "60", "ID", &h]);
                assert_eq!(granted, h);
                let waiter = wait_in_line(
                    &server,
                    &mut c,
                    &[command, "k", "1", "60", "ID", &w, "WAIT", "10"],
                );
                let newcomer: &[&str] = &[command, "k", "1", "60", "ID", &x];
                let (freed, took) = if pipelined {
                    let mut raw = Raw::connect(&server);
                    raw.send(&[freeing, newcomer]);
                    (raw.reply(), raw.reply())
                } else {
                    let (mut a, mut b) = (Raw::connect(&server), Raw::connect(&server));
                    a.send(&[freeing]);
                    b.send(&[newcomer]);
                    (a.reply(), b.reply())
                };
                assert!(matches!(freed.as_str(), "1" | "OK"), "{freeing:?}: {freed}");
                let what = format!("{command} after {freeing:?}, pipelined {pipelined}");
                if before_next {
                    assert_eq!(took, "nil", "{what}: the newcomer took the waiter's permit");
                    let reply = waiter.reply().expect("the waiter's reply");
                    assert_eq!(bulk(&reply), Some(w.clone()), "{what}");
                    assert_eq!(holders(&mut c, "k"), std::slice::from_ref(&w), "{what}");
                } else {
                    // Redis 7.0: the line is served at the end of this turn of the event loop,
                    // after the commands the server has already read: one of them holds it.
                    let held = holders(&mut c, "k");
                    assert_eq!(held.len(), 1, "{what}: {held:?}");
                    if took == "nil" {
                        assert_eq!(bulk(&waiter.reply().expect("a reply")), Some(w.clone()));
                    } else {
                        assert_eq!(took, x, "{what}");
                        let _: i64 = run(&mut c, &["SEM.RELEASE", "k", &x]);
                        assert_eq!(bulk(&waiter.reply().expect("a reply")), Some(w.clone()));
                    }
                }
                let _: () = run(&mut c, &["FLUSHALL"]);
            }
        }
    }
}

#[test]
fn a_wait_for_empty_sees_the_empty_moment_a_deletion_makes_before_the_next_command() {
    let server = Server::start();
    let mut c = server.connection();
    let before_next = serves_before_the_next_command(&mut c);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "k", "1", "60", "ID", "h"]);
    let pending = Pending::send(&server, &["SEM.WAITEMPTY", "k", "2"]);
    wait_until("the client waits for empty", EVENTUALLY, || {
        sem_json(&mut c, "k")["waiting_for_empty"].as_u64() == Some(1)
    });
    let mut raw = Raw::connect(&server);
    raw.send(&[&["DEL", "k"], &["SEM.ACQUIRE", "k", "1", "60", "ID", "x"]]);
    assert_eq!(raw.reply(), "1");
    assert_eq!(raw.reply(), "x");
    let answer = pending.reply().expect("a reply");
    if before_next {
        assert_eq!(answer, Value::Int(1), "the empty moment was missed");
    } else {
        // Redis 7.0: the acquire the server had already read ran first.
        assert!(matches!(answer, Value::Int(0 | 1)), "{answer:?}");
    }
}

/// Another client overwrites a waited semaphore's keys with values of the same type: a
/// `ZUNIONSTORE` over the holder set that drops a holder, a `SET` of `<name>:limit` that lifts
/// a pause. Where the module follows the key server event (Redis 7.2 to 8.1, Valkey) the line is
/// served at once; elsewhere (Redis 7.0 and 8.2 and later, whose keyspace events of those
/// classes the module does not follow) at the waiter's timeout, with the permit.
#[test]
fn same_type_overwrites_serve_the_line() {
    let server = Server::start();
    let mut c = server.connection();
    let at_once = key_watch(&mut c, &[]) == Some(KeyWatch::KeyEvent);
    // ZUNIONSTORE over the holder set: h1 and h2 become x alone.
    for holder in ["h1", "h2"] {
        let _: String = run(&mut c, &["SEM.ACQUIRE", "k", "2", "60", "ID", holder]);
    }
    let deadline = (server_ms(&mut c) + 60_000).to_string();
    let _: i64 = run(&mut c, &["ZADD", "src", &deadline, "x"]);
    let w = wait_in_line(
        &server,
        &mut c,
        &["SEM.ACQUIRE", "k", "2", "60", "ID", "w", "WAIT", "2"],
    );
    let started = Instant::now();
    let stored: i64 = run(&mut c, &["ZUNIONSTORE", "k", "1", "src"]);
    assert_eq!(stored, 1);
    let reply = w.reply().expect("a reply");
    assert_eq!(bulk(&reply).as_deref(), Some("w"), "{reply:?}");
    let took = started.elapsed();
    assert_eq!(
        at_once,
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    assert_eq!(holders(&mut c, "k"), ["w", "x"]);

    // A SET of <name>:limit over a paused semaphore.
    let _: String = run(&mut c, &["SEM.LIMIT", "p", "0"]);
    let w = wait_in_line(
        &server,
        &mut c,
        &["SEM.ACQUIRE", "p", "1", "60", "ID", "w", "WAIT", "2"],
    );
    let started = Instant::now();
    let _: () = run(&mut c, &["SET", "p:limit", "5"]);
    let reply = w.reply().expect("a reply");
    assert_eq!(bulk(&reply).as_deref(), Some("w"), "{reply:?}");
    let took = started.elapsed();
    assert_eq!(
        at_once,
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
}

/// A newcomer that joins a line after a lease that frees the head's permits has ended, and
/// before the timer has run (the server was busy past that end), leaves that lease end in
/// place: the head is granted at it, not when something else happens. The newcomer looks at
/// the holders only after that end, when the lease is no longer live.
#[test]
fn a_newcomer_after_a_lease_end_leaves_the_head_served_at_it() {
    for command in ["SEM.ACQUIRE", "SEM.ACQUIREFAIR"] {
        let server = Server::start_with(&DEBUG_ARGS);
        let mut c = server.connection();
        // Two of three permits held: one for 0.3 s, one for a minute.
        for (holder, lease) in [("short", "0.3"), ("long", "60")] {
            let granted: String = run(&mut c, &[command, "k", "3", lease, "ID", holder]);
            assert_eq!(granted, holder);
        }
        // The head needs two permits: it waits for the short lease to end.
        let head = wait_in_line(
            &server,
            &mut c,
            &[
                command, "k", "3", "60", "ID", "head", "COUNT", "2", "WAIT", "4",
            ],
        );
        // The server is busy past that end; the newcomer's call, read with the busy one, runs
        // before the timer does.
        let mut raw = Raw::connect(&server);
        raw.send(&[
            &["DEBUG", "SLEEP", "0.5"],
            &[command, "k", "3", "60", "ID", "new", "WAIT", "8"],
        ]);
        assert_eq!(raw.reply(), "OK");
        let served = Instant::now();
        let reply = head.reply().expect("the head's reply");
        assert_eq!(
            bulk(&reply).as_deref(),
            Some("head"),
            "{command}: the head, its permits free since the short lease ended, got {reply:?}"
        );
        assert!(
            served.elapsed() < Duration::from_secs(1),
            "{command}: the head was granted {:?} after the server woke",
            served.elapsed()
        );
        assert_eq!(holders(&mut c, "k"), ["head", "long"], "{command}");
        // Three permits are held: the newcomer still waits.
        assert_eq!(waiters_in_line(&mut c, "k"), 1, "{command}");
        let released: i64 = run(&mut c, &["SEM.RELEASE", "k", "long"]);
        assert_eq!(released, 1);
        assert_eq!(raw.reply(), "new", "{command}");
    }
}
