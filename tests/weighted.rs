//! Weighted holders (`COUNT n`): one identifier takes n permits, all or none, and gives back
//! some or all of them. Holders of one permit keep the recipe's key layout exactly; a weighted
//! one adds `<name>:permits`, which lives and dies with the holders and replicates like them.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::Barrier;
use std::thread::{self, sleep, JoinHandle};
use std::time::{Duration, Instant};

use common::state::{snapshot_of_all_keys, Contents, KeyState};
use common::stream::{aof_commands, Command};
use common::*;
use redis::{Connection, Value};

/// The error of a COUNT outside 1..=limit (or, for a release, outside 1..=4294967295).
const COUNT_ERR: &str = "ERR COUNT must be an integer from 1 to the limit (at most 4294967295)";
const RELEASE_COUNT_ERR: &str = "ERR COUNT must be an integer from 1 to 4294967295";

/// How long anything that must happen soon may take on a busy machine.
const SOON: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Fair,
}

impl Kind {
    fn acquire(self) -> &'static str {
        match self {
            Kind::Plain => "SEM.ACQUIRE",
            Kind::Fair => "SEM.ACQUIREFAIR",
        }
    }
}

/// Byte for byte: every key the module left serializes (DUMP: what RDB files, replicas and
/// MIGRATE carry) exactly as the same key written by the recipe's own commands (ZADD, SET) in
/// another database of the same server, and each sorted set has the same encoding. (The
/// counter is written in place, so in memory it is a raw string where SET makes an integer;
/// its serialized bytes are the same, as the DUMP shows.)
fn assert_dumps_like_the_recipes(conn: &mut Connection, keys: &BTreeMap<String, KeyState>) {
    const RECIPE_DB: &str = "9";
    for (name, state) in keys {
        let sorted_set = matches!(state.contents, Contents::SortedSet(_));
        let dump = |conn: &mut Connection| -> (Vec<u8>, Option<String>) {
            let bytes: Vec<u8> = run(conn, &["DUMP", name]);
            let encoding = sorted_set.then(|| run(conn, &["OBJECT", "ENCODING", name]));
            (bytes, encoding)
        };
        let module = dump(conn);
        run::<()>(conn, &["SELECT", RECIPE_DB]);
        match &state.contents {
            Contents::SortedSet(members) => {
                for (member, score) in members {
                    run::<()>(conn, &["ZADD", name, &score.to_string(), member]);
                }
            }
            Contents::Text(text) => run::<()>(conn, &["SET", name, text]),
            Contents::Hash(_) => panic!("{name}: a one-permit semaphore has no hash"),
        }
        let recipe = dump(conn);
        run::<()>(conn, &["DEL", name]);
        run::<()>(conn, &["SELECT", "0"]);
        assert_eq!(
            module, recipe,
            "{name}: the module's key against the recipe's"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Reading a semaphore back
// ---------------------------------------------------------------------------------------------

/// `SEM.GET name JSON`, parsed.
fn doc(conn: &mut Connection, name: &str) -> serde_json::Value {
    let text: String = run(conn, &["SEM.GET", name, "JSON"]);
    serde_json::from_str(&text).expect("SEM.GET JSON")
}

/// Each live holder as SEM.GET JSON lists it: identifier and permits, in grant order.
fn holders(conn: &mut Connection, name: &str) -> Vec<(String, u64)> {
    doc(conn, name)["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| {
            let id = h["id"].as_str().expect("id").to_string();
            (id, h["permits"].as_u64().expect("permits"))
        })
        .collect()
}

/// Clients waiting for `name`.
fn waiters(conn: &mut Connection, name: &str) -> u64 {
    doc(conn, name)["waiters"].as_u64().expect("waiters")
}

/// `SEM.GET name`: the permits in use.
fn in_use(conn: &mut Connection, name: &str) -> i64 {
    run(conn, &["SEM.GET", name])
}

/// `<name>:permits`, sorted by field.
fn permits_key(conn: &mut Connection, name: &str) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = run(conn, &["HGETALL", &format!("{name}:permits")]);
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
}

fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(f, v)| (f.to_string(), v.to_string()))
        .collect()
}

fn owned(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(id, n)| (id.to_string(), *n)).collect()
}

fn pexpiretime(conn: &mut Connection, key: &str) -> i64 {
    run(conn, &["PEXPIRETIME", key])
}

/// PEXPIRETIME of two keys, read in one script: the server's clock stands still in a script,
/// so both are read at the same instant, even as they expire.
fn expiry_pair(conn: &mut Connection, a: &str, b: &str) -> (i64, i64) {
    const SCRIPT: &str = "return {redis.call('PEXPIRETIME', KEYS[1]), \
                          redis.call('PEXPIRETIME', KEYS[2])}";
    run(conn, &["EVAL", SCRIPT, "2", a, b])
}

fn score(conn: &mut Connection, key: &str, member: &str) -> i64 {
    run(conn, &["ZSCORE", key, member])
}

/// Waits until `name` has `n` waiters.
fn wait_for_waiters(conn: &mut Connection, name: &str, n: u64) {
    wait_until(&format!("{name} has {n} waiters"), SOON, || {
        waiters(conn, name) == n
    });
}

/// The names of every key, sorted.
fn key_names(conn: &mut Connection) -> Vec<String> {
    let mut names: Vec<String> = run(conn, &["KEYS", "*"]);
    names.sort();
    names
}

// ---------------------------------------------------------------------------------------------
// Callers that wait inside the server
// ---------------------------------------------------------------------------------------------

/// A command sent on its own connection from its own thread, whose reply comes later: a caller
/// that may wait inside the server.
struct Pending {
    what: String,
    reply: mpsc::Receiver<Result<Value, String>>,
    thread: Option<JoinHandle<()>>,
}

/// Sends `args` on a new connection; the connection is open before this returns.
fn send(server: &Server, args: &[&str]) -> Pending {
    let mut conn = server.connection();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    let owned_args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let (tx, rx) = mpsc::channel();
    let thread = thread::spawn(move || {
        let args: Vec<&str> = owned_args.iter().map(String::as_str).collect();
        let reply = try_run::<Value>(&mut conn, &args).map_err(|err| error_text(&err));
        let _ = tx.send(reply);
    });
    Pending {
        what: format!("{args:?}"),
        reply: rx,
        thread: Some(thread),
    }
}

impl Pending {
    /// Asserts that no reply came: the caller still waits.
    fn assert_waiting(&self) {
        match self.reply.try_recv() {
            Err(TryRecvError::Empty) => {}
            other => panic!("{} answered {other:?}: it should still wait", self.what),
        }
    }

    /// The reply, which must come within [`SOON`].
    fn reply(mut self) -> Value {
        let reply = match self.reply.recv_timeout(SOON) {
            Ok(Ok(value)) => value,
            Ok(Err(err)) => panic!("{} failed: {err}", self.what),
            Err(RecvTimeoutError::Timeout) => panic!("{} got no reply in {SOON:?}", self.what),
            Err(RecvTimeoutError::Disconnected) => panic!("{}: the thread died", self.what),
        };
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the waiting thread");
        }
        reply
    }

    /// The identifier granted.
    fn granted(self) -> String {
        let what = self.what.clone();
        let reply = self.reply();
        redis::from_redis_value(&reply)
            .unwrap_or_else(|_| panic!("{what}: not an identifier: {reply:?}"))
    }

    /// The identifier and ticket granted (WITHTICKET).
    fn granted_with_ticket(self) -> (String, u64) {
        let what = self.what.clone();
        let reply = self.reply();
        redis::from_redis_value(&reply)
            .unwrap_or_else(|_| panic!("{what}: not [identifier, ticket]: {reply:?}"))
    }
}

/// A small deterministic random generator (splitmix64): the tests need no crate for it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number from 1 to `n`.
    fn one_to(&mut self, n: u64) -> u64 {
        1 + self.next() % n
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Errors, and the key layout
// ---------------------------------------------------------------------------------------------

/// Runs `f` and returns the deadline bounds of a lease of `lease_ms` that `f` started: the
/// server's clock before and after, plus the lease.
fn deadline_bounds(
    conn: &mut Connection,
    lease_ms: i64,
    f: impl FnOnce(&mut Connection),
) -> (i64, i64) {
    let before = server_ms(conn);
    f(conn);
    let after = server_ms(conn);
    (before + lease_ms, after + lease_ms)
}

fn assert_within(what: &str, value: i64, (low, high): (i64, i64)) {
    assert!(
        (low..=high).contains(&value),
        "{what} = {value}, not within [{low}, {high}]"
    );
}

fn sorted_set(members: &[(&str, i64)]) -> Contents {
    Contents::SortedSet(members.iter().map(|(m, s)| (m.to_string(), *s)).collect())
}

#[test]
fn count_errors_change_nothing_and_single_permits_keep_the_old_layout() {
    let server = Server::start();
    let mut c = server.connection();

    // Holders of one permit, with and without COUNT 1, through grants, a refusal, renewals,
    // a refresh and releases: the recipe's layout, exactly.
    let a = deadline_bounds(&mut c, 60_000, |c| {
        let id: String = run(c, &["SEM.ACQUIRE", "jobs", "3", "60", "ID", "a"]);
        assert_eq!(id, "a");
    });
    let b: String = run(
        &mut c,
        &["SEM.ACQUIRE", "jobs", "3", "60", "ID", "b", "COUNT", "1"],
    );
    assert_eq!(b, "b");
    let _ = deadline_bounds(&mut c, 60_000, |c| {
        let id: String = run(
            c,
            &["SEM.ACQUIRE", "jobs", "3", "60", "ID", "c", "COUNT", "1"],
        );
        assert_eq!(id, "c");
    });
    let full: Option<String> = run(&mut c, &["SEM.ACQUIRE", "jobs", "3", "60", "ID", "d"]);
    assert_eq!(full, None);
    let a_renewed = deadline_bounds(&mut c, 90_000, |c| {
        let id: String = run(
            c,
            &["SEM.ACQUIRE", "jobs", "3", "90", "ID", "a", "COUNT", "1"],
        );
        assert_eq!(id, "a", "a renewal with COUNT 1 of a one-permit holder");
    });
    assert!(a_renewed.0 > a.1, "the renewal moved a's deadline");
    let released: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "b"]);
    assert_eq!(released, 1);
    let c_refreshed = deadline_bounds(&mut c, 120_000, |c| {
        let refreshed: i64 = run(c, &["SEM.REFRESH", "jobs", "c", "120"]);
        assert_eq!(refreshed, 1);
    });
    let not_held: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "b", "COUNT", "1"]);
    assert_eq!(not_held, 0, "a released holder holds nothing");

    let fair = |c: &mut Connection, args: &[&str]| -> Option<(String, u64)> { run(c, args) };
    let fresh = FirstGrant::before(&mut c);
    let x = fair(
        &mut c,
        &[
            "SEM.ACQUIREFAIR",
            "printers",
            "3",
            "60",
            "ID",
            "x",
            "WITHTICKET",
        ],
    );
    let first = fresh.ticket(&mut c, x.as_ref().expect("a free permit").1 as i64);
    let ticket = |n: i64| (first + n - 1) as u64;
    assert_eq!(x, Some(("x".into(), ticket(1))));
    let _ = deadline_bounds(&mut c, 60_000, |c| {
        let y = fair(
            c,
            &[
                "SEM.ACQUIREFAIR",
                "printers",
                "3",
                "60",
                "ID",
                "y",
                "COUNT",
                "1",
                "WITHTICKET",
            ],
        );
        assert_eq!(y, Some(("y".into(), ticket(2))));
    });
    let _ = deadline_bounds(&mut c, 60_000, |c| {
        let z = fair(
            c,
            &[
                "SEM.ACQUIREFAIR",
                "printers",
                "3",
                "60",
                "ID",
                "z",
                "COUNT",
                "1",
                "WITHTICKET",
            ],
        );
        assert_eq!(z, Some(("z".into(), ticket(3))));
    });
    let refused = fair(
        &mut c,
        &[
            "SEM.ACQUIREFAIR",
            "printers",
            "3",
            "60",
            "ID",
            "w",
            "WITHTICKET",
        ],
    );
    assert_eq!(refused, None);
    let y_renewed = deadline_bounds(&mut c, 90_000, |c| {
        let y = fair(
            c,
            &[
                "SEM.ACQUIREFAIR",
                "printers",
                "3",
                "90",
                "ID",
                "y",
                "WITHTICKET",
            ],
        );
        assert_eq!(
            y,
            Some(("y".into(), ticket(2))),
            "a renewal keeps its ticket"
        );
    });
    let released: i64 = run(&mut c, &["SEM.RELEASE", "printers", "x", "COUNT", "1"]);
    assert_eq!(released, 1, "COUNT 1 of a one-permit holder releases it");
    let z_refreshed = deadline_bounds(&mut c, 120_000, |c| {
        let refreshed: i64 = run(c, &["SEM.REFRESH", "printers", "z", "120"]);
        assert_eq!(refreshed, 1);
    });

    // The golden description of the old layout: the holder sets scored by deadlines, the
    // owner set by tickets, both expiring at the latest deadline; the counter without expiry.
    let jobs = zset(&mut c, "jobs");
    let printers = zset(&mut c, "printers");
    let ids =
        |set: &[(String, i64)]| -> Vec<String> { set.iter().map(|(id, _)| id.clone()).collect() };
    assert_eq!(ids(&jobs), ["a", "c"]);
    assert_eq!(ids(&printers), ["y", "z"]);
    assert_within("a's deadline", jobs[0].1, a_renewed);
    assert_within("c's deadline", jobs[1].1, c_refreshed);
    assert_within("y's deadline", printers[0].1, y_renewed);
    assert_within("z's deadline", printers[1].1, z_refreshed);
    let golden: BTreeMap<String, KeyState> = [
        ("jobs", Contents::SortedSet(jobs.clone()), jobs[1].1),
        (
            "printers",
            Contents::SortedSet(printers.clone()),
            printers[1].1,
        ),
        (
            "printers:owner",
            sorted_set(&[("y", first + 1), ("z", first + 2)]),
            printers[1].1,
        ),
        (
            "printers:counter",
            Contents::Text((first + 2).to_string()),
            -1,
        ),
    ]
    .into_iter()
    .map(|(name, contents, expire_at_ms)| {
        let state = KeyState {
            contents,
            expire_at_ms,
        };
        (name.to_string(), state)
    })
    .collect();
    assert_eq!(snapshot_of_all_keys(&mut c), golden);
    assert_dumps_like_the_recipes(&mut c, &golden);
    assert_eq!(in_use(&mut c, "jobs"), 2, "permits in use = holders");
    assert_eq!(holders(&mut c, "jobs"), owned(&[("a", 1), ("c", 1)]));
    assert_eq!(holders(&mut c, "printers"), owned(&[("y", 1), ("z", 1)]));
    assert_eq!(doc(&mut c, "printers")["in_use"], 2);

    // Bad COUNTs are errors that change nothing (no key either: `fresh` is never created).
    let cases: &[(&[&str], &str)] = &[
        (&["SEM.ACQUIRE", "jobs", "3", "60", "COUNT", "0"], COUNT_ERR),
        (&["SEM.ACQUIRE", "jobs", "3", "60", "COUNT", "4"], COUNT_ERR),
        (&["SEM.ACQUIRE", "jobs", "3", "60", "COUNT", "x"], COUNT_ERR),
        (
            &["SEM.ACQUIRE", "jobs", "3", "60", "COUNT", "-1"],
            COUNT_ERR,
        ),
        (
            &["SEM.ACQUIRE", "jobs", "3", "60", "COUNT", "1.0"],
            COUNT_ERR,
        ),
        (&["SEM.ACQUIRE", "jobs", "3", "60", "COUNT", ""], COUNT_ERR),
        (
            &["SEM.ACQUIRE", "fresh", "2", "60", "COUNT", "3"],
            COUNT_ERR,
        ),
        (
            &[
                "SEM.ACQUIRE",
                "fresh",
                "2",
                "60",
                "ID",
                "f",
                "COUNT",
                "0",
                "WAIT",
                "1",
            ],
            COUNT_ERR,
        ),
        (
            &["SEM.ACQUIREFAIR", "printers", "3", "60", "COUNT", "0"],
            COUNT_ERR,
        ),
        (
            &[
                "SEM.ACQUIREFAIR",
                "printers",
                "3",
                "60",
                "COUNT",
                "4",
                "WITHTICKET",
            ],
            COUNT_ERR,
        ),
        (
            &[
                "SEM.ACQUIREFAIR",
                "fresh",
                "4294967295",
                "60",
                "COUNT",
                "4294967296",
            ],
            COUNT_ERR,
        ),
        (
            &["SEM.ACQUIRE", "jobs", "3", "60", "COUNT", "1", "COUNT", "1"],
            "ERR syntax error",
        ),
        (
            &[
                "SEM.ACQUIREFAIR",
                "printers",
                "3",
                "60",
                "COUNT",
                "2",
                "WITHTICKET",
                "COUNT",
                "2",
            ],
            "ERR syntax error",
        ),
        (
            &["SEM.ACQUIRE", "jobs", "3", "60", "COUNT"],
            "ERR syntax error",
        ),
        // A different COUNT for a live holder.
        (
            &["SEM.ACQUIRE", "jobs", "3", "60", "ID", "a", "COUNT", "2"],
            "ERR the holder holds 1 permits: renew with that COUNT, or none",
        ),
        (
            &[
                "SEM.ACQUIREFAIR",
                "printers",
                "3",
                "60",
                "ID",
                "y",
                "COUNT",
                "3",
                "WITHTICKET",
            ],
            "ERR the holder holds 1 permits: renew with that COUNT, or none",
        ),
        // Releases.
        (
            &["SEM.RELEASE", "jobs", "a", "COUNT", "0"],
            RELEASE_COUNT_ERR,
        ),
        (
            &["SEM.RELEASE", "jobs", "a", "COUNT", "x"],
            RELEASE_COUNT_ERR,
        ),
        (
            &["SEM.RELEASE", "jobs", "a", "COUNT", "2"],
            "ERR COUNT is more than the 1 permits the holder holds",
        ),
        (
            &["SEM.RELEASE", "printers", "z", "COUNT", "5"],
            "ERR COUNT is more than the 1 permits the holder holds",
        ),
        (&["SEM.RELEASE", "jobs", "a", "COUNT"], "ERR syntax error"),
        (
            &["SEM.RELEASE", "jobs", "a", "COUNTS", "1"],
            "ERR syntax error",
        ),
    ];
    for (args, want) in cases {
        assert_eq!(error_of(&mut c, args), *want, "{args:?}");
        assert_eq!(
            snapshot_of_all_keys(&mut c),
            golden,
            "{args:?} changed something"
        );
    }

    // A weighted grant adds `<name>:permits`: its own field and the extra total, expiring with
    // the holders (c's deadline is the latest, not w's).
    let w = deadline_bounds(&mut c, 60_000, |c| {
        let id: String = run(
            c,
            &["SEM.ACQUIRE", "jobs", "10", "60", "ID", "w", "COUNT", "3"],
        );
        assert_eq!(id, "w");
    });
    assert_within("w's deadline", score(&mut c, "jobs", "w"), w);
    assert_eq!(
        permits_key(&mut c, "jobs"),
        fields(&[("", "2"), ("w", "3")])
    );
    assert_eq!(pexpiretime(&mut c, "jobs:permits"), jobs[1].1);
    assert_eq!(pexpiretime(&mut c, "jobs"), jobs[1].1);
    assert_eq!(in_use(&mut c, "jobs"), 5);
    let jobs_doc = doc(&mut c, "jobs");
    assert_eq!(jobs_doc["in_use"], 5);
    assert_eq!(
        holders(&mut c, "jobs"),
        owned(&[("w", 3), ("a", 1), ("c", 1)])
    );
    let v: String = run(
        &mut c,
        &["SEM.ACQUIRE", "jobs", "10", "30", "ID", "v", "COUNT", "2"],
    );
    assert_eq!(v, "v");
    assert_eq!(
        permits_key(&mut c, "jobs"),
        fields(&[("", "3"), ("v", "2"), ("w", "3")])
    );
    assert_eq!(in_use(&mut c, "jobs"), 7);

    // Errors and a refusal on weighted holders change nothing either.
    let weighted = snapshot_of_all_keys(&mut c);
    assert!(matches!(
        weighted["jobs:permits"].contents,
        Contents::Hash(_)
    ));
    let cases: &[(&[&str], &str)] = &[
        (
            &["SEM.ACQUIRE", "jobs", "10", "60", "ID", "w", "COUNT", "2"],
            "ERR the holder holds 3 permits: renew with that COUNT, or none",
        ),
        (
            &["SEM.ACQUIRE", "jobs", "10", "60", "ID", "w", "COUNT", "1"],
            "ERR the holder holds 3 permits: renew with that COUNT, or none",
        ),
        (
            &["SEM.ACQUIRE", "jobs", "10", "60", "ID", "v", "COUNT", "3"],
            "ERR the holder holds 2 permits: renew with that COUNT, or none",
        ),
        (
            &["SEM.RELEASE", "jobs", "w", "COUNT", "4"],
            "ERR COUNT is more than the 3 permits the holder holds",
        ),
        (
            &["SEM.RELEASE", "jobs", "w", "COUNT", "0"],
            RELEASE_COUNT_ERR,
        ),
        (
            &["SEM.ACQUIRE", "jobs", "10", "60", "ID", "u", "COUNT", "11"],
            COUNT_ERR,
        ),
    ];
    for (args, want) in cases {
        assert_eq!(error_of(&mut c, args), *want, "{args:?}");
        assert_eq!(
            snapshot_of_all_keys(&mut c),
            weighted,
            "{args:?} changed something"
        );
    }
    let refused: Option<String> = run(
        &mut c,
        &["SEM.ACQUIRE", "jobs", "10", "60", "ID", "u", "COUNT", "4"],
    );
    assert_eq!(refused, None, "7 + 4 > 10: all or nothing");
    assert_eq!(snapshot_of_all_keys(&mut c), weighted);
    let not_held: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "u", "COUNT", "2"]);
    assert_eq!(not_held, 0, "a non-holder gives back nothing");
    assert_eq!(snapshot_of_all_keys(&mut c), weighted);

    // A renewal without COUNT keeps the count; v's deadline becomes the latest, and both keys
    // expire there.
    let v_renewed = deadline_bounds(&mut c, 300_000, |c| {
        let id: String = run(c, &["SEM.ACQUIRE", "jobs", "10", "300", "ID", "v"]);
        assert_eq!(id, "v");
    });
    let v_deadline = score(&mut c, "jobs", "v");
    assert_within("v's deadline", v_deadline, v_renewed);
    assert_eq!(pexpiretime(&mut c, "jobs"), v_deadline);
    assert_eq!(pexpiretime(&mut c, "jobs:permits"), v_deadline);
    let w_again: String = run(
        &mut c,
        &["SEM.ACQUIRE", "jobs", "10", "60", "ID", "w", "COUNT", "3"],
    );
    assert_eq!(w_again, "w", "a renewal with the COUNT it holds");
    assert_eq!(
        permits_key(&mut c, "jobs"),
        fields(&[("", "3"), ("v", "2"), ("w", "3")])
    );

    // Partial releases: w keeps the rest; at one permit its field goes.
    let released: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "w", "COUNT", "2"]);
    assert_eq!(released, 1);
    assert_eq!(
        permits_key(&mut c, "jobs"),
        fields(&[("", "1"), ("v", "2")])
    );
    assert_eq!(in_use(&mut c, "jobs"), 5);
    assert_eq!(pexpiretime(&mut c, "jobs:permits"), v_deadline);
    // v releases all: no weighted holder is left, and the key goes.
    let released: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "v"]);
    assert_eq!(released, 1);
    let exists: i64 = run(&mut c, &["EXISTS", "jobs:permits"]);
    assert_eq!(exists, 0, "no weighted holder left: no permits key");
    let released: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "w", "COUNT", "1"]);
    assert_eq!(released, 1);
    assert_eq!(
        snapshot_of_all_keys(&mut c),
        golden,
        "back to the old layout, exactly"
    );

    // Fair: the same key, one ticket for the weighted holder.
    let big = fair(
        &mut c,
        &[
            "SEM.ACQUIREFAIR",
            "printers",
            "10",
            "60",
            "ID",
            "big",
            "COUNT",
            "4",
            "WITHTICKET",
        ],
    );
    assert_eq!(big, Some(("big".into(), ticket(4))));
    assert_eq!(
        permits_key(&mut c, "printers"),
        fields(&[("", "3"), ("big", "4")])
    );
    assert_eq!(
        pexpiretime(&mut c, "printers:permits"),
        pexpiretime(&mut c, "printers")
    );
    assert_eq!(score(&mut c, "printers:owner", "big"), first + 3);
    let counter: String = run(&mut c, &["GET", "printers:counter"]);
    assert_eq!(counter, (first + 3).to_string());
    let printers_doc = doc(&mut c, "printers");
    assert_eq!(printers_doc["in_use"], 6);
    assert_eq!(printers_doc["holders"][2]["id"], "big");
    assert_eq!(printers_doc["holders"][2]["ticket"], first + 3);
    assert_eq!(printers_doc["holders"][2]["permits"], 4);
    let released: i64 = run(&mut c, &["SEM.RELEASE", "printers", "big"]);
    assert_eq!(released, 1);
    assert_eq!(
        key_names(&mut c),
        ["jobs", "printers", "printers:counter", "printers:owner"]
    );
}

// ---------------------------------------------------------------------------------------------
// 2. All or nothing under concurrency
// ---------------------------------------------------------------------------------------------

/// Connections hammering one semaphore, each from its own thread.
const CLIENTS: usize = 50;
/// The permits they compete for, asking for 1 to [`MAX_COUNT`] at a time.
const LIMIT: i64 = 8;
const MAX_COUNT: u64 = 5;
/// They hammer at least this long, and then until the critical section was seen full and every
/// COUNT was granted at least once ([`Progress`]); at most [`HAMMER_AT_MOST`].
const HAMMER_FOR: Duration = Duration::from_secs(2);
const HAMMER_AT_MOST: Duration = Duration::from_secs(15);
/// Long enough that no holder expires mid-test: every permit is given back by SEM.RELEASE.
const HAMMER_LEASE: &str = "30";

#[derive(Debug, Default)]
struct Tally {
    refusals: u64,
    releases: u64,
    /// Grants by the permits asked for (index = COUNT).
    grants: [u64; MAX_COUNT as usize + 1],
    /// The highest `INCRBY inside` reply: the permits of the holders inside at once.
    max_inside: i64,
    tickets: Vec<u64>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.refusals += other.refusals;
        self.releases += other.releases;
        for (mine, theirs) in self.grants.iter_mut().zip(other.grants) {
            *mine += theirs;
        }
        self.max_inside = self.max_inside.max(other.max_inside);
        self.tickets.extend(other.tickets);
    }

    fn total_grants(&self) -> u64 {
        self.grants.iter().sum()
    }
}

/// What the clients saw together, so that they go on until they have seen it all.
#[derive(Default)]
struct Progress {
    /// Someone saw all the permits inside at once.
    full: AtomicBool,
    /// Bit n: some client was granted COUNT n.
    counts: AtomicU64,
}

impl Progress {
    fn granted(&self, count: u64) {
        self.counts.fetch_or(1 << count, Ordering::Relaxed);
    }

    fn seen_it_all(&self) -> bool {
        let all = (1..=MAX_COUNT).fold(0, |bits, n| bits | 1 << n);
        self.full.load(Ordering::Relaxed) && self.counts.load(Ordering::Relaxed) == all
    }
}

/// One client: acquire COUNT c (no WAIT), add c to `inside` in the critical section, take it
/// away, release; until time is up and the clients have seen it all.
fn hammer_client(
    server: &Server,
    kind: Kind,
    name: &str,
    seed: u64,
    start: &Barrier,
    progress: &Progress,
) -> Tally {
    let mut conn = server.connection();
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let limit = LIMIT.to_string();
    start.wait();
    let started = Instant::now();
    loop {
        let elapsed = started.elapsed();
        if elapsed >= HAMMER_AT_MOST || (elapsed >= HAMMER_FOR && progress.seen_it_all()) {
            break;
        }
        let count = rng.one_to(MAX_COUNT);
        let count_arg = count.to_string();
        let mut args = vec![
            kind.acquire(),
            name,
            &limit,
            HAMMER_LEASE,
            "COUNT",
            &count_arg,
        ];
        let granted: Option<String> = match kind {
            Kind::Plain => run(&mut conn, &args),
            Kind::Fair => {
                args.push("WITHTICKET");
                run::<Option<(String, u64)>>(&mut conn, &args).map(|(id, ticket)| {
                    tally.tickets.push(ticket);
                    id
                })
            }
        };
        let Some(id) = granted else {
            tally.refusals += 1;
            continue;
        };
        tally.grants[count as usize] += 1;
        progress.granted(count);
        let inside: i64 = run(&mut conn, &["INCRBY", "inside", &count_arg]);
        tally.max_inside = tally.max_inside.max(inside);
        assert!(
            inside <= LIMIT,
            "{inside} permits inside at once, limit {LIMIT}"
        );
        if inside == LIMIT {
            progress.full.store(true, Ordering::Relaxed);
        }
        // The work: long enough for other holders to come in beside this one.
        sleep(Duration::from_millis(1));
        let _: i64 = run(&mut conn, &["DECRBY", "inside", &count_arg]);
        let released: i64 = run(&mut conn, &["SEM.RELEASE", name, &id]);
        assert_eq!(released, 1, "{id} lost its permits before releasing them");
        tally.releases += 1;
    }
    tally
}

fn hammer_weighted(kind: Kind, name: &str) {
    let server = Server::start();
    let start = Barrier::new(CLIENTS);
    let progress = Progress::default();
    let mut tally = Tally::default();
    let fresh = FirstGrant::before(&mut server.connection());
    thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (server, start, progress) = (&server, &start, &progress);
                scope.spawn(move || hammer_client(server, kind, name, i as u64, start, progress))
            })
            .collect();
        for client in clients {
            tally.add(client.join().expect("a client panicked"));
        }
    });
    println!(
        "{kind:?}: grants by COUNT {:?}, {} refusals, max inside {}",
        tally.grants, tally.refusals, tally.max_inside
    );

    let grants = tally.total_grants();
    assert!(tally.refusals > 0, "nobody was ever refused: {tally:?}");
    assert_eq!(grants, tally.releases, "{tally:?}");
    assert!(tally.max_inside <= LIMIT, "limit exceeded: {tally:?}");
    assert_eq!(
        tally.max_inside, LIMIT,
        "the permits were never all in use at once in {HAMMER_AT_MOST:?}: {tally:?}"
    );
    assert!(
        tally.grants[1..].iter().all(|&n| n > 0),
        "some COUNT was never granted: {tally:?}"
    );

    let mut conn = server.connection();
    assert_eq!(in_use(&mut conn, name), 0);
    let inside: i64 = run(&mut conn, &["GET", "inside"]);
    assert_eq!(inside, 0);
    let mut left = vec!["inside".to_string()];
    if kind == Kind::Fair {
        // Refusals take no ticket, and every grant takes the next one, whatever its count,
        // from the clock of the first grant on.
        let lowest = *tally.tickets.iter().min().expect("fair grants");
        let first = fresh.ticket(&mut conn, lowest as i64) as u64;
        let counter: u64 = run(&mut conn, &["GET", &format!("{name}:counter")]);
        assert_eq!(counter, first + grants - 1);
        let unique: HashSet<u64> = tally.tickets.iter().copied().collect();
        assert_eq!(
            unique.len(),
            tally.tickets.len(),
            "a ticket was handed out twice"
        );
        assert_eq!(unique, (first..first + grants).collect::<HashSet<u64>>());
        left.insert(0, format!("{name}:counter"));
    }
    assert_eq!(key_names(&mut conn), left, "only the counter may remain");
}

#[test]
fn fifty_clients_with_random_counts_never_exceed_a_plain_limit() {
    hammer_weighted(Kind::Plain, "plain");
}

#[test]
fn fifty_clients_with_random_counts_never_exceed_a_fair_limit() {
    hammer_weighted(Kind::Fair, "fair");
}

// ---------------------------------------------------------------------------------------------
// 3. Head of line with mixed sizes
// ---------------------------------------------------------------------------------------------

/// Limit 4; holders take 3 permits; A asks for 4 and waits, B for 1 behind it.
fn head_of_line(kind: Kind) {
    let server = Server::start();
    let mut c = server.connection();
    let acquire = kind.acquire();
    let grant = |c: &mut Connection, id: &str, count: &str| {
        let got: String = run(c, &[acquire, "sem", "4", "60", "ID", id, "COUNT", count]);
        assert_eq!(got, id);
    };
    let fresh = FirstGrant::before(&mut c);
    grant(&mut c, "h1", "2");
    let first = match kind {
        Kind::Fair => Some(fresh.holder(&mut c, "sem", "h1")),
        Kind::Plain => None,
    };
    grant(&mut c, "h2", "1");
    let a = send(
        &server,
        &[
            acquire, "sem", "4", "60", "ID", "A", "COUNT", "4", "WAIT", "10",
        ],
    );
    wait_for_waiters(&mut c, "sem", 1);
    let b = send(
        &server,
        &[
            acquire, "sem", "4", "60", "ID", "B", "COUNT", "1", "WAIT", "10",
        ],
    );
    wait_for_waiters(&mut c, "sem", 2);
    // B fits the free permit, but A is first in line and does not fit: nobody is served.
    b.assert_waiting();
    a.assert_waiting();
    assert_eq!(holders(&mut c, "sem"), owned(&[("h1", 2), ("h2", 1)]));
    assert_eq!(in_use(&mut c, "sem"), 3);

    match kind {
        Kind::Plain => {
            // A plain newcomer without WAIT takes the free permit ahead of the line.
            let barged: Option<String> = run(
                &mut c,
                &[acquire, "sem", "4", "60", "ID", "C", "COUNT", "1"],
            );
            assert_eq!(barged.as_deref(), Some("C"));
            assert_eq!(in_use(&mut c, "sem"), 4);
            let refused: Option<String> = run(
                &mut c,
                &[acquire, "sem", "4", "60", "ID", "D", "COUNT", "1"],
            );
            assert_eq!(refused, None, "no permit is free");
            // C leaves: one permit is free again, still not enough for A, and B stays behind A.
            let released: i64 = run(&mut c, &["SEM.RELEASE", "sem", "C"]);
            assert_eq!(released, 1);
        }
        Kind::Fair => {
            // A fair newcomer without WAIT is refused while others wait, and changes nothing.
            let before = snapshot_of_all_keys(&mut c);
            let refused: Option<String> = run(
                &mut c,
                &[acquire, "sem", "4", "60", "ID", "C", "COUNT", "1"],
            );
            assert_eq!(refused, None, "no barging into a fair line");
            assert_eq!(snapshot_of_all_keys(&mut c), before);
        }
    }
    a.assert_waiting();
    b.assert_waiting();
    assert_eq!(waiters(&mut c, "sem"), 2);

    // The holders leave: after the first, A still does not fit and B still waits behind it.
    let released: i64 = run(&mut c, &["SEM.RELEASE", "sem", "h1"]);
    assert_eq!(released, 1);
    assert_eq!(holders(&mut c, "sem"), owned(&[("h2", 1)]));
    a.assert_waiting();
    b.assert_waiting();
    let released: i64 = run(&mut c, &["SEM.RELEASE", "sem", "h2"]);
    assert_eq!(released, 1);
    // A is granted within that release; B now waits for A.
    assert_eq!(holders(&mut c, "sem"), owned(&[("A", 4)]));
    assert_eq!(waiters(&mut c, "sem"), 1);
    assert_eq!(a.granted(), "A");
    b.assert_waiting();
    assert_eq!(permits_key(&mut c, "sem"), fields(&[("", "3"), ("A", "4")]));

    let released: i64 = run(&mut c, &["SEM.RELEASE", "sem", "A"]);
    assert_eq!(released, 1);
    assert_eq!(holders(&mut c, "sem"), owned(&[("B", 1)]));
    assert_eq!(b.granted(), "B");
    let exists: i64 = run(&mut c, &["EXISTS", "sem:permits"]);
    assert_eq!(exists, 0);
    if let Some(first) = first {
        assert_eq!(
            score(&mut c, "sem:owner", "B"),
            first + 3,
            "h1, h2, A, then B"
        );
    }
}

#[test]
fn a_large_request_first_in_a_plain_line_is_not_overtaken_by_waiters() {
    head_of_line(Kind::Plain);
}

#[test]
fn a_large_request_first_in_a_fair_line_is_not_overtaken_at_all() {
    head_of_line(Kind::Fair);
}

// ---------------------------------------------------------------------------------------------
// 4. A partial release serves a waiter
// ---------------------------------------------------------------------------------------------

#[test]
fn a_partial_release_serves_a_waiter_at_once_and_the_holder_keeps_the_rest() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let held: (String, u64) = run(
        &mut c,
        &[
            "SEM.ACQUIREFAIR",
            "pool",
            "4",
            "60",
            "ID",
            "H",
            "COUNT",
            "4",
            "WITHTICKET",
        ],
    );
    assert_eq!(held.0, "H");
    let first = fresh.ticket(&mut c, held.1 as i64);
    let deadline = score(&mut c, "pool", "H");
    let w = send(
        &server,
        &[
            "SEM.ACQUIREFAIR",
            "pool",
            "4",
            "60",
            "ID",
            "W",
            "COUNT",
            "2",
            "WAIT",
            "10",
            "WITHTICKET",
        ],
    );
    wait_for_waiters(&mut c, "pool", 1);
    w.assert_waiting();

    let released: i64 = run(&mut c, &["SEM.RELEASE", "pool", "H", "COUNT", "2"]);
    assert_eq!(released, 1);
    // Within the release itself: W holds its two permits, nobody waits.
    let after = doc(&mut c, "pool");
    assert_eq!(after["waiters"], 0);
    assert_eq!(after["in_use"], 4);
    assert_eq!(holders(&mut c, "pool"), owned(&[("H", 2), ("W", 2)]));
    assert_eq!(w.granted_with_ticket(), ("W".into(), first as u64 + 1));

    // H keeps its ticket and its deadline.
    assert_eq!(after["holders"][0]["ticket"], first);
    assert_eq!(score(&mut c, "pool:owner", "H"), first);
    assert_eq!(score(&mut c, "pool", "H"), deadline);
    assert_eq!(
        permits_key(&mut c, "pool"),
        fields(&[("", "2"), ("H", "2"), ("W", "2")])
    );
    assert_eq!(
        pexpiretime(&mut c, "pool:permits"),
        pexpiretime(&mut c, "pool")
    );
    assert_eq!(
        pexpiretime(&mut c, "pool:owner"),
        pexpiretime(&mut c, "pool")
    );
    let refreshed: i64 = run(&mut c, &["SEM.REFRESH", "pool", "H", "120"]);
    assert_eq!(refreshed, 1);
    assert_eq!(
        holders(&mut c, "pool"),
        owned(&[("H", 2), ("W", 2)]),
        "a refresh keeps the count"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. A weighted holder's expiry, served by the timer
// ---------------------------------------------------------------------------------------------

/// The bound on how late after the holder's deadline its waiters are granted.
const TIMER_SLACK_MS: i64 = 50;
/// The waiters' lease: their grant time is their deadline minus this.
const WAITER_LEASE_MS: i64 = 10_000;

/// Returns the expired holder's ticket, on a fair semaphore.
fn expiry_serves_waiters(
    server: &Server,
    c: &mut Connection,
    kind: Kind,
    name: &str,
) -> Option<i64> {
    let acquire = kind.acquire();
    let fresh = FirstGrant::before(c);
    let held: String = run(c, &[acquire, name, "3", "0.3", "ID", "big", "COUNT", "3"]);
    assert_eq!(held, "big");
    let first = match kind {
        Kind::Fair => Some(fresh.holder(c, name, "big")),
        Kind::Plain => None,
    };
    let deadline = score(c, name, "big");
    let two = send(
        server,
        &[
            acquire, name, "3", "10", "ID", "two", "COUNT", "2", "WAIT", "5",
        ],
    );
    wait_for_waiters(c, name, 1);
    let one = send(
        server,
        &[
            acquire, name, "3", "10", "ID", "one", "COUNT", "1", "WAIT", "5",
        ],
    );
    wait_for_waiters(c, name, 2);
    let now = server_ms(c);
    assert!(
        now < deadline,
        "{name}: the waiters queued only after the holder's deadline (now {now}, deadline \
         {deadline}): the machine is too slow for this test"
    );
    // From here on no command reaches the server until both are granted: only its timer.
    assert_eq!(two.granted(), "two");
    assert_eq!(one.granted(), "one");

    for id in ["two", "one"] {
        let granted_at = score(c, name, id) - WAITER_LEASE_MS;
        println!(
            "{name}: {id} granted {} ms after the holder's deadline",
            granted_at - deadline
        );
        assert!(
            (deadline..=deadline + TIMER_SLACK_MS).contains(&granted_at),
            "{name}: {id} was granted at {granted_at}, {} ms after the holder's deadline \
             {deadline} (at most {TIMER_SLACK_MS} ms)",
            granted_at - deadline
        );
    }
    let mut members: Vec<String> = zset(c, name).into_iter().map(|(id, _)| id).collect();
    members.sort();
    assert_eq!(members, ["one", "two"], "the expired holder is gone");
    assert_eq!(in_use(c, name), 3);
    assert_eq!(permits_key(c, name), fields(&[("", "1"), ("two", "2")]));
    assert_eq!(waiters(c, name), 0);
    first
}

#[test]
fn an_expired_weighted_holder_frees_all_its_permits_for_waiters_via_the_timer() {
    let server = Server::start();
    let mut c = server.connection();
    let plain = expiry_serves_waiters(&server, &mut c, Kind::Plain, "plain");
    assert_eq!(plain, None);
    let first = expiry_serves_waiters(&server, &mut c, Kind::Fair, "fair").expect("a ticket");
    let tickets = zset(&mut c, "fair:owner");
    assert_eq!(
        tickets,
        [
            ("two".to_string(), first + 1),
            ("one".to_string(), first + 2)
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Reader/writer
// ---------------------------------------------------------------------------------------------

#[test]
fn readers_and_a_writer_on_a_fair_semaphore() {
    const DOC: &str = "doc";
    let server = Server::start();
    let mut c = server.connection();
    let reader = |c: &mut Connection, id: &str| -> (String, u64) {
        run(
            c,
            &[
                "SEM.ACQUIREFAIR",
                DOC,
                "10",
                "30",
                "ID",
                id,
                "COUNT",
                "1",
                "WAIT",
                "10",
                "WITHTICKET",
            ],
        )
    };
    let fresh = FirstGrant::before(&mut c);
    let r1 = reader(&mut c, "r1");
    assert_eq!(r1.0, "r1");
    let first = fresh.ticket(&mut c, r1.1 as i64) as u64;
    for (ticket, id) in [(first + 1, "r2"), (first + 2, "r3")] {
        assert_eq!(
            reader(&mut c, id),
            (id.to_string(), ticket),
            "readers share"
        );
    }
    let writer = send(
        &server,
        &[
            "SEM.ACQUIREFAIR",
            DOC,
            "10",
            "30",
            "ID",
            "writer",
            "COUNT",
            "10",
            "WAIT",
            "10",
            "WITHTICKET",
        ],
    );
    wait_for_waiters(&mut c, DOC, 1);
    // Once the writer waits, a new reader that waits queues behind it although 7 are free...
    let r4 = send(
        &server,
        &[
            "SEM.ACQUIREFAIR",
            DOC,
            "10",
            "30",
            "ID",
            "r4",
            "COUNT",
            "1",
            "WAIT",
            "10",
            "WITHTICKET",
        ],
    );
    wait_for_waiters(&mut c, DOC, 2);
    r4.assert_waiting();
    writer.assert_waiting();
    assert_eq!(in_use(&mut c, DOC), 3);
    // ...and one that does not wait is refused, changing nothing.
    let before = snapshot_of_all_keys(&mut c);
    let refused: Option<String> = run(
        &mut c,
        &["SEM.ACQUIREFAIR", DOC, "10", "30", "ID", "r5", "COUNT", "1"],
    );
    assert_eq!(refused, None);
    assert_eq!(snapshot_of_all_keys(&mut c), before);
    // A reader already inside renews at once.
    let renewed: (String, u64) = run(
        &mut c,
        &[
            "SEM.ACQUIREFAIR",
            DOC,
            "10",
            "30",
            "ID",
            "r3",
            "COUNT",
            "1",
            "WITHTICKET",
        ],
    );
    assert_eq!(renewed, ("r3".into(), first + 2));

    // The writer waits for every reader that came before it.
    for id in ["r1", "r2"] {
        let released: i64 = run(&mut c, &["SEM.RELEASE", DOC, id]);
        assert_eq!(released, 1);
        writer.assert_waiting();
        r4.assert_waiting();
        assert_eq!(waiters(&mut c, DOC), 2);
    }
    let released: i64 = run(&mut c, &["SEM.RELEASE", DOC, "r3"]);
    assert_eq!(released, 1);
    assert_eq!(
        holders(&mut c, DOC),
        owned(&[("writer", 10)]),
        "the writer entered at once"
    );
    assert_eq!(writer.granted_with_ticket(), ("writer".into(), first + 3));
    r4.assert_waiting();

    // Readers arriving while the writer is inside queue too, and all enter when it leaves.
    let r6 = send(
        &server,
        &[
            "SEM.ACQUIREFAIR",
            DOC,
            "10",
            "30",
            "ID",
            "r6",
            "COUNT",
            "1",
            "WAIT",
            "10",
            "WITHTICKET",
        ],
    );
    wait_for_waiters(&mut c, DOC, 2);
    r6.assert_waiting();
    let released: i64 = run(&mut c, &["SEM.RELEASE", DOC, "writer"]);
    assert_eq!(released, 1);
    assert_eq!(holders(&mut c, DOC), owned(&[("r4", 1), ("r6", 1)]));
    assert_eq!(waiters(&mut c, DOC), 0);
    assert_eq!(r4.granted_with_ticket(), ("r4".into(), first + 4));
    assert_eq!(r6.granted_with_ticket(), ("r6".into(), first + 5));
    let exists: i64 = run(&mut c, &["EXISTS", "doc:permits"]);
    assert_eq!(exists, 0);
}

// ---------------------------------------------------------------------------------------------
// 7. Replicas and the AOF
// ---------------------------------------------------------------------------------------------

/// A server whose every write reaches the AOF before it replies.
const AOF_ARGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
];

const WORKLOAD_SEMAPHORES: [&str; 4] = ["gpus", "doc", "tq", "idle"];

/// Weighted grants, refusals, renewals, partial releases, refreshes, a waiter served by a
/// release and one by the timer at a weighted holder's expiry, expired weighted holders pruned
/// by later writes, and a weighted semaphore whose keys expire whole. Every holder left has a
/// lease of 60 s or more.
fn weighted_workload(server: &Server, c: &mut Connection) {
    let id = |c: &mut Connection, args: &[&str]| -> Option<String> { run(c, args) };
    let ticket = |c: &mut Connection, args: &[&str]| -> Option<(String, u64)> { run(c, args) };
    let one = |c: &mut Connection, args: &[&str]| {
        let reply: i64 = run(c, args);
        assert_eq!(reply, 1, "{args:?}");
    };

    // Plain: docs/commands.md's GPU example, a refresh, a renewal with its COUNT, partial releases.
    let gpus = ["SEM.ACQUIRE", "gpus", "16"];
    let g = |rest: &[&'static str]| -> Vec<&'static str> { [&gpus[..], rest].concat() };
    assert_eq!(
        id(c, &g(&["60", "ID", "train-1", "COUNT", "4"])).as_deref(),
        Some("train-1")
    );
    assert_eq!(
        id(c, &g(&["60", "ID", "train-2", "COUNT", "12"])).as_deref(),
        Some("train-2")
    );
    assert_eq!(id(c, &g(&["60", "ID", "eval", "COUNT", "1"])), None);
    one(c, &["SEM.RELEASE", "gpus", "train-2", "COUNT", "8"]);
    assert_eq!(
        id(c, &g(&["60", "ID", "eval", "COUNT", "1"])).as_deref(),
        Some("eval")
    );
    one(c, &["SEM.REFRESH", "gpus", "train-1", "120"]);
    assert_eq!(
        id(c, &g(&["90", "ID", "train-2", "COUNT", "4"])).as_deref(),
        Some("train-2")
    );
    one(c, &["SEM.RELEASE", "gpus", "train-1", "COUNT", "3"]);
    assert_eq!(
        id(c, &g(&["0.15", "ID", "spot", "COUNT", "3"])).as_deref(),
        Some("spot")
    );

    // Fair: a writer waits for a reader that gives its permits back in two steps.
    let fresh = FirstGrant::before(c);
    let r1 = ticket(
        c,
        &[
            "SEM.ACQUIREFAIR",
            "doc",
            "10",
            "60",
            "ID",
            "r1",
            "COUNT",
            "2",
            "WITHTICKET",
        ],
    );
    let first = fresh.ticket(c, r1.as_ref().expect("a free permit").1 as i64) as u64;
    assert_eq!(r1, Some(("r1".into(), first)));
    let writer = send(
        server,
        &[
            "SEM.ACQUIREFAIR",
            "doc",
            "10",
            "60",
            "ID",
            "writer",
            "COUNT",
            "10",
            "WAIT",
            "5",
            "WITHTICKET",
        ],
    );
    wait_for_waiters(c, "doc", 1);
    one(c, &["SEM.RELEASE", "doc", "r1", "COUNT", "1"]);
    writer.assert_waiting();
    one(c, &["SEM.RELEASE", "doc", "r1"]);
    assert_eq!(writer.granted_with_ticket(), ("writer".into(), first + 1));
    one(c, &["SEM.RELEASE", "doc", "writer", "COUNT", "7"]);
    let r2 = ticket(
        c,
        &[
            "SEM.ACQUIREFAIR",
            "doc",
            "10",
            "60",
            "ID",
            "r2",
            "COUNT",
            "2",
            "WITHTICKET",
        ],
    );
    assert_eq!(r2, Some(("r2".into(), first + 2)));
    one(c, &["SEM.REFRESH", "doc", "writer", "120"]);
    let r3 = ticket(
        c,
        &[
            "SEM.ACQUIREFAIR",
            "doc",
            "10",
            "0.15",
            "ID",
            "r3",
            "COUNT",
            "4",
            "WITHTICKET",
        ],
    );
    assert_eq!(r3, Some(("r3".into(), first + 3)));

    // Fair: a weighted holder's lease runs out and the timer serves the waiter.
    let fresh = FirstGrant::before(c);
    let h = ticket(
        c,
        &[
            "SEM.ACQUIREFAIR",
            "tq",
            "3",
            "0.2",
            "ID",
            "h",
            "COUNT",
            "3",
            "WITHTICKET",
        ],
    );
    let tq_first = fresh.ticket(c, h.as_ref().expect("a free permit").1 as i64) as u64;
    assert_eq!(h, Some(("h".into(), tq_first)));
    let x = send(
        server,
        &[
            "SEM.ACQUIREFAIR",
            "tq",
            "3",
            "60",
            "ID",
            "x",
            "COUNT",
            "2",
            "WAIT",
            "5",
            "WITHTICKET",
        ],
    );
    assert_eq!(x.granted_with_ticket(), ("x".into(), tq_first + 1));

    // Plain, short leases only: the keys expire whole, the permits key with them. The weighted
    // holder comes last, so its deadline is the latest even if the first one expired already.
    assert_eq!(
        id(c, &["SEM.ACQUIRE", "idle", "5", "0.15", "ID", "j"]).as_deref(),
        Some("j")
    );
    assert_eq!(
        id(
            c,
            &["SEM.ACQUIRE", "idle", "5", "0.15", "ID", "i", "COUNT", "2"]
        )
        .as_deref(),
        Some("i")
    );
    let (permits_expiry, idle_expiry) = expiry_pair(c, "idle:permits", "idle");
    assert_eq!(permits_expiry, idle_expiry);

    wait_until("the short leases ran out", SOON, || {
        let gone: i64 = run(c, &["EXISTS", "idle", "idle:permits"]);
        gone == 0 && in_use(c, "gpus") == 6 && in_use(c, "doc") == 5
    });
    // Later writes prune the expired weighted holders, their fields with them.
    assert_eq!(
        id(c, &g(&["60", "ID", "late", "COUNT", "2"])).as_deref(),
        Some("late")
    );
    let lost: i64 = run(c, &["SEM.RELEASE", "doc", "r3", "COUNT", "4"]);
    assert_eq!(lost, 0, "an expired holder gives back nothing");

    assert_eq!(
        permits_key(c, "gpus"),
        fields(&[("", "4"), ("late", "2"), ("train-2", "4")])
    );
    assert_eq!(
        permits_key(c, "doc"),
        fields(&[("", "3"), ("r2", "2"), ("writer", "3")])
    );
    assert_eq!(permits_key(c, "tq"), fields(&[("", "1"), ("x", "2")]));
    assert_eq!(in_use(c, "gpus"), 8);
    assert_eq!(in_use(c, "doc"), 5);
    assert_eq!(in_use(c, "tq"), 2);
    for name in ["gpus", "doc", "tq"] {
        let permits = format!("{name}:permits");
        assert_eq!(pexpiretime(c, &permits), pexpiretime(c, name), "{permits}");
    }
    assert_eq!(
        key_names(c),
        [
            "doc",
            "doc:counter",
            "doc:owner",
            "doc:permits",
            "gpus",
            "gpus:permits",
            "tq",
            "tq:counter",
            "tq:owner",
            "tq:permits",
        ]
    );
}

/// What SEM.GET reports for each of `names`: the count, and the JSON document without the
/// `ms_left` fields (which depend on when it is asked).
fn sem_get_reports(conn: &mut Connection, names: &[&str]) -> Vec<(i64, serde_json::Value)> {
    names
        .iter()
        .map(|name| {
            let mut report = doc(conn, name);
            for holder in report["holders"].as_array_mut().expect("holders") {
                holder
                    .as_object_mut()
                    .expect("holder")
                    .remove("ms_left")
                    .expect("ms_left");
            }
            (in_use(conn, name), report)
        })
        .collect()
}

#[test]
fn a_replica_holds_exactly_the_primarys_weighted_keys() {
    let primary = Server::start_with(&PRIMARY_ARGS);
    let replica = start_replica_of(&primary);
    let mut on_primary = primary.connection();
    let mut on_replica = replica.connection();

    weighted_workload(&primary, &mut on_primary);
    wait_for_replica(&mut on_primary);

    let primary_keys = snapshot_of_all_keys(&mut on_primary);
    assert!(matches!(
        primary_keys["gpus:permits"].contents,
        Contents::Hash(_)
    ));
    assert_eq!(snapshot_of_all_keys(&mut on_replica), primary_keys);
    assert_eq!(
        sem_get_reports(&mut on_replica, &WORKLOAD_SEMAPHORES),
        sem_get_reports(&mut on_primary, &WORKLOAD_SEMAPHORES)
    );

    // Releasing every holder deletes the permits keys on both; the counters stay.
    for name in ["gpus", "doc", "tq"] {
        for (id, _) in zset(&mut on_primary, name) {
            let released: i64 = run(&mut on_primary, &["SEM.RELEASE", name, &id]);
            assert_eq!(released, 1, "release {id} of {name}");
        }
    }
    wait_for_replica(&mut on_primary);
    let primary_keys = snapshot_of_all_keys(&mut on_primary);
    let names: Vec<&str> = primary_keys.keys().map(String::as_str).collect();
    assert_eq!(names, ["doc:counter", "tq:counter"]);
    assert_eq!(snapshot_of_all_keys(&mut on_replica), primary_keys);
}

#[test]
fn an_aof_reload_restores_exactly_the_same_weighted_keys() {
    let started_at_ms = unix_ms_now();
    let server = Server::start_with(&AOF_ARGS);
    let mut conn = server.connection();
    weighted_workload(&server, &mut conn);
    let before = snapshot_of_all_keys(&mut conn);
    let reports_before = sem_get_reports(&mut conn, &WORKLOAD_SEMAPHORES);
    drop(conn);

    let dir = server.stop();
    let commands: Vec<Command> = aof_commands(&dir);
    let names: BTreeSet<String> = commands.iter().map(|c| c[0].to_uppercase()).collect();
    assert!(
        !names.iter().any(|name| name.starts_with("SEM.")),
        "a SEM.* command reached the AOF: {names:?}"
    );
    for effect in ["ZADD", "ZREM", "SET", "PEXPIREAT", "HSET", "HDEL"] {
        assert!(names.contains(effect), "no {effect} in {names:?}");
    }
    for command in commands
        .iter()
        .filter(|c| c[0].eq_ignore_ascii_case("PEXPIREAT"))
    {
        let at: i64 = command[2].parse().expect("PEXPIREAT time");
        assert!(at >= started_at_ms, "not an absolute time: {command:?}");
    }

    // Compared before any new fair grant: the first one after a reload moves the counter on.
    let restarted = Server::restart_in(&dir, &AOF_ARGS);
    let mut conn = restarted.connection();
    assert_eq!(snapshot_of_all_keys(&mut conn), before);
    assert_eq!(
        sem_get_reports(&mut conn, &WORKLOAD_SEMAPHORES),
        reports_before
    );

    let counter_before: u64 = run(&mut conn, &["GET", "doc:counter"]);
    // The reloaded weights count: doc has 5 of 10 in use.
    let refused: Option<String> = run(
        &mut conn,
        &[
            "SEM.ACQUIREFAIR",
            "doc",
            "10",
            "60",
            "ID",
            "r9",
            "COUNT",
            "6",
        ],
    );
    assert_eq!(refused, None);
    let floor = info_sem(&mut conn)["sem_ticket_floor"];
    let granted: (String, u64) = run(
        &mut conn,
        &[
            "SEM.ACQUIREFAIR",
            "doc",
            "10",
            "60",
            "ID",
            "r9",
            "COUNT",
            "5",
            "WITHTICKET",
        ],
    );
    // The first fair grant after the load goes on from the floor the load took, above every
    // ticket of the server's earlier life.
    assert!(
        floor > counter_before,
        "the load took a floor from the clock"
    );
    assert_eq!(granted, ("r9".into(), floor));
}
