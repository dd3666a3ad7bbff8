//! Regression tests for what a hostile user or an operator can do to a semaphore: late
//! heartbeats, users whose ACLs cover only some keys, full memory, WATCHing clients, tampered
//! keys and odd numbers. Each one failed before it was fixed.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::*;
use redis::{Connection, Value};

/// Every key of the semaphore `name`: type, value, expiry and encoding, for "nothing changed".
fn fingerprint(conn: &mut Connection, name: &str) -> Vec<String> {
    [
        name.to_string(),
        format!("{name}:owner"),
        format!("{name}:counter"),
    ]
    .iter()
    .map(|key| {
        let kind: String = run(conn, &["TYPE", key]);
        let value = match kind.as_str() {
            "zset" => format!(
                "{:?}",
                run::<Vec<String>>(conn, &["ZRANGE", key, "0", "-1", "WITHSCORES"])
            ),
            "string" => run::<String>(conn, &["GET", key]),
            "none" => String::new(),
            other => format!("<{other}>"),
        };
        let expiry: i64 = run(conn, &["PEXPIRETIME", key]);
        let encoding: Option<String> = run(conn, &["OBJECT", "ENCODING", key]);
        format!("{key} {kind} {value} @{expiry} {encoding:?}")
    })
    .collect()
}

/// Runs `step` on `conn` while `watcher` WATCHes the semaphore's keys; whether EXEC aborted.
fn fires_watch(
    watcher: &mut Connection,
    conn: &mut Connection,
    name: &str,
    step: impl FnOnce(&mut Connection),
) -> bool {
    let owner = format!("{name}:owner");
    let counter = format!("{name}:counter");
    let _: () = run(watcher, &["WATCH", name, &owner, &counter]);
    step(conn);
    let _: () = run(watcher, &["MULTI"]);
    let _: () = run(watcher, &["PING"]);
    let exec: Value = run(watcher, &["EXEC"]);
    exec == Value::Nil
}

/// Asserts that every sorted set of the database can be read by the commands that abort
/// redis-server on an empty sorted set, and that no key is empty.
fn assert_no_empty_key(conn: &mut Connection) {
    let keys: Vec<String> = run(conn, &["KEYS", "*"]);
    for key in keys {
        let kind: String = run(conn, &["TYPE", &key]);
        if kind == "zset" {
            let members: i64 = run(conn, &["ZCARD", &key]);
            assert!(members > 0, "{key} is an empty sorted set");
            let _: Option<i64> = run(conn, &["ZRANK", &key, "w1"]);
            let _: Option<String> = run(conn, &["ZRANDMEMBER", &key]);
            let _: Value = run(conn, &["DEBUG", "DIGEST-VALUE", &key]);
        }
    }
    let pong: String = run(conn, &["PING"]);
    assert_eq!(pong, "PONG");
}

fn debug_server() -> Server {
    Server::start_with(&DEBUG_ARGS)
}

#[test]
fn a_late_heartbeat_leaves_no_key_behind() {
    let server = debug_server();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "jobs", "3", "0.1", "ID", "w1"]);
    sleep(Duration::from_millis(200));
    let refreshed: i64 = run(&mut c, &["SEM.REFRESH", "jobs", "w1", "30"]);
    assert_eq!(refreshed, 0);
    let kind: String = run(&mut c, &["TYPE", "jobs"]);
    assert_eq!(kind, "none", "the late heartbeat created the key");
    // ZRANK on the empty sorted set aborted redis-server.
    let rank: Option<i64> = run(&mut c, &["ZRANK", "jobs", "w1"]);
    assert_eq!(rank, None);

    // On a name that never existed, directly, inside MULTI and from Lua.
    let refreshed: i64 = run(&mut c, &["SEM.REFRESH", "nothere", "x", "10"]);
    assert_eq!(refreshed, 0);
    let (refreshed, released): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("SEM.REFRESH")
        .arg("nothere")
        .arg("x")
        .arg(10)
        .cmd("SEM.RELEASE")
        .arg("nothere")
        .arg("x")
        .query(&mut c)
        .expect("EXEC");
    assert_eq!((refreshed, released), (0, 0));
    let script = "return redis.call('SEM.REFRESH', KEYS[1], 'x', 10)";
    let refreshed: i64 = run(&mut c, &["EVAL", script, "1", "nothere"]);
    assert_eq!(refreshed, 0);
    let keys: Vec<String> = run(&mut c, &["KEYS", "*"]);
    assert!(keys.is_empty(), "{keys:?}");
    assert_no_empty_key(&mut c);

    // A refused fair acquire on a full semaphore creates no owner set either.
    let _: String = run(&mut c, &["SEM.ACQUIRE", "p", "1", "10", "ID", "a"]);
    let refused: Option<String> = run(&mut c, &["SEM.ACQUIRE", "p", "1", "10", "ID", "b"]);
    assert_eq!(refused, None);
    let exists: i64 = run(&mut c, &["EXISTS", "p:owner", "p:counter"]);
    assert_eq!(exists, 0);
    assert_no_empty_key(&mut c);
}

#[test]
fn every_key_is_checked_against_the_callers_acl() {
    let server = Server::start();
    let mut admin = server.connection();
    // Another application's keys that happen to follow the layout, the counter above the floor.
    let counter = ticket_floor(&mut admin) + 41;
    let _: i64 = run(&mut admin, &["ZADD", "x:owner", "1", "theirs"]);
    let _: String = run(&mut admin, &["SET", "x:counter", &counter.to_string()]);
    let _: () = run(&mut admin, &["ACL", "LOG", "RESET"]);
    for (user, rules) in [
        ("exact", &["~x", "+@all"][..]),
        ("prefix", &["~x*", "+@all"]),
        ("reader", &["%R~x*", "+@all"]),
    ] {
        let mut setuser = vec!["ACL", "SETUSER", user, "on", ">pw"];
        setuser.extend(rules);
        let _: String = run(&mut admin, &setuser);
    }
    let login = |user: &str| {
        let mut conn = server.connection();
        let _: String = run(&mut conn, &["AUTH", user, "pw"]);
        conn
    };
    let calls: [&[&str]; 6] = [
        &["SEM.ACQUIRE", "x", "1", "1"],
        &["SEM.ACQUIREFAIR", "x", "5", "2"],
        &["SEM.REFRESH", "x", "theirs", "10"],
        &["SEM.RELEASE", "x", "theirs"],
        &["SEM.GET", "x"],
        &["SEM.GET", "x", "JSON"],
    ];

    // `~x` covers x but not x:owner or x:counter: every call is refused and changes nothing.
    let mut exact = login("exact");
    let before = fingerprint(&mut admin, "x");
    for call in calls {
        let err = error_of(&mut exact, call);
        assert!(err.starts_with("NOPERM"), "{call:?}: {err}");
    }
    assert_eq!(fingerprint(&mut admin, "x"), before);
    // ACL LOG folds repeated refusals of one user and key into one entry with a count.
    let log: Vec<Vec<Value>> = run(&mut admin, &["ACL", "LOG"]);
    let logged: i64 = log
        .iter()
        .map(|entry| match entry.as_slice() {
            [Value::BulkString(field), Value::Int(count), ..] if field == b"count" => *count,
            other => panic!("unexpected ACL LOG entry {other:?}"),
        })
        .sum();
    assert_eq!(
        logged,
        calls.len() as i64,
        "every refused call is logged: {log:?}"
    );
    let text = format!("{log:?}");
    assert!(text.contains("x:owner"), "{text}");

    // `%R~x*` may read every key, so SEM.GET works, and nothing else.
    let mut reader = login("reader");
    for call in &calls[..4] {
        let err = error_of(&mut reader, call);
        assert!(err.starts_with("NOPERM"), "{call:?}: {err}");
    }
    let count: i64 = run(&mut reader, &["SEM.GET", "x"]);
    assert_eq!(count, 0);
    let json: String = run(&mut reader, &["SEM.GET", "x", "JSON"]);
    assert!(json.contains(&format!("\"counter\":{counter}")), "{json}");
    assert_eq!(fingerprint(&mut admin, "x"), before);

    // `~x*` covers them all.
    let mut prefix = login("prefix");
    let err = error_of(&mut prefix, &["SEM.ACQUIRE", "y", "1", "1"]);
    assert!(err.starts_with("NOPERM"), "y is not covered by ~x*: {err}");
    let _: i64 = run(&mut admin, &["DEL", "x:owner"]);
    let (_, ticket): (String, i64) = run(
        &mut prefix,
        &["SEM.ACQUIREFAIR", "x", "5", "2", "WITHTICKET"],
    );
    assert_eq!(ticket, counter + 1);
    let count: i64 = run(&mut prefix, &["SEM.GET", "x"]);
    assert_eq!(count, 1);
}

/// Whether the server puts module commands in ACL categories (Redis 7.2+, Valkey).
fn has_module_acl_categories(conn: &mut Connection) -> bool {
    let info: Vec<Value> = run(conn, &["COMMAND", "INFO", "sem.get"]);
    format!("{info:?}").contains("@read")
}

#[test]
fn acl_categories_or_the_documented_command_rules_restrict_the_writers() {
    let server = Server::start();
    let mut admin = server.connection();
    let categories = has_module_acl_categories(&mut admin);
    let (no_writes, read_only): (&[&str], &[&str]) = if categories {
        (&["~*", "+@all", "-@write"], &["~*", "+@read"])
    } else {
        // Redis 7.0 has no ACL categories for module commands: docs/cluster-and-acl.md's rules instead.
        (
            &[
                "~*",
                "+@all",
                "-sem.acquire",
                "-sem.acquirefair",
                "-sem.refresh",
                "-sem.release",
            ],
            &["~*", "+@read", "+sem.get"],
        )
    };
    for (user, rules) in [("nowrite", no_writes), ("readonly", read_only)] {
        let mut setuser = vec!["ACL", "SETUSER", user, "on", ">pw"];
        setuser.extend(rules);
        let _: String = run(&mut admin, &setuser);
        let mut conn = server.connection();
        let _: String = run(&mut conn, &["AUTH", user, "pw"]);
        for writer in [
            &["SEM.ACQUIRE", "jobs", "1", "10"][..],
            &["SEM.ACQUIREFAIR", "jobs", "1", "10"],
            &["SEM.REFRESH", "jobs", "a", "10"],
            &["SEM.RELEASE", "jobs", "a"],
        ] {
            let err = error_of(&mut conn, writer);
            assert!(err.starts_with("NOPERM"), "{user} {writer:?}: {err}");
        }
        let count: i64 = run(&mut conn, &["SEM.GET", "jobs"]);
        assert_eq!(count, 0, "{user} may read");
    }
}

#[test]
fn release_and_refresh_work_when_memory_is_full() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "jobs", "5", "60", "ID", "w1"]);
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "jobs", "5", "60", "ID", "w2"]);
    let used: i64 = {
        let info: String = run(&mut c, &["INFO", "memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory")
    };
    let _: String = run(
        &mut c,
        &["CONFIG", "SET", "maxmemory", &(used - 1024).to_string()],
    );
    let _: String = run(&mut c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let err = error_of(&mut c, &["SEM.ACQUIREFAIR", "jobs", "5", "60", "ID", "w3"]);
    assert!(err.starts_with("OOM"), "an acquire grows memory: {err}");
    let refreshed: i64 = run(&mut c, &["SEM.REFRESH", "jobs", "w1", "120"]);
    assert_eq!(refreshed, 1, "keeping a lease must work at maxmemory");
    let released: i64 = run(&mut c, &["SEM.RELEASE", "jobs", "w2"]);
    assert_eq!(released, 1, "giving a permit back must work at maxmemory");
    let count: i64 = run(&mut c, &["SEM.GET", "jobs"]);
    assert_eq!(count, 1);
    // Sets as singles: an acquire is refused, a refresh and a release always work.
    let err = error_of(
        &mut c,
        &[
            "SEM.ACQUIREALL",
            "1",
            "jobs",
            "5",
            "1",
            "60",
            "ID",
            "w3",
            "FAIR",
        ],
    );
    assert!(err.starts_with("OOM"), "a set acquire grows memory: {err}");
    let refreshed: i64 = run(&mut c, &["SEM.REFRESHALL", "1", "jobs", "w1", "120"]);
    assert_eq!(
        refreshed, 1,
        "keeping a set's leases must work at maxmemory"
    );
    let released: i64 = run(&mut c, &["SEM.RELEASEALL", "1", "jobs", "w1"]);
    assert_eq!(released, 1, "giving a set back must work at maxmemory");
    let empty: i64 = run(&mut c, &["SEM.WAITEMPTY", "jobs", "1"]);
    assert_eq!(empty, 1, "a wait for empty takes nothing");
}

#[test]
fn watch_fires_only_when_a_call_changed_something() {
    let server = Server::start();
    let mut c = server.connection();
    let mut watcher = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "w", "1", "60", "ID", "holder"]);
    let _: String = run(&mut c, &["SET", "t", "x"]);
    let _: String = run(&mut c, &["SET", "bad:counter", "abc"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "p", "1", "60", "ID", "holder"]);

    let no_change: [(&str, &[&str]); 7] = [
        ("w", &["SEM.ACQUIREFAIR", "w", "1", "60", "ID", "other"]),
        ("w", &["SEM.ACQUIRE", "w", "1", "60"]),
        ("w", &["SEM.RELEASE", "w", "nobody"]),
        ("w", &["SEM.REFRESH", "w", "nobody", "10"]),
        ("t", &["SEM.ACQUIRE", "t", "1", "60"]),
        ("bad", &["SEM.ACQUIREFAIR", "bad", "1", "60"]),
        ("p", &["SEM.ACQUIRE", "p", "1", "60", "ID", "other"]),
    ];
    for (name, call) in no_change {
        let fired = fires_watch(&mut watcher, &mut c, name, |conn| {
            let _ = try_run::<Value>(conn, call);
        });
        assert!(!fired, "{call:?} changed nothing but fired WATCH");
    }
    for (name, call) in [
        ("w", &["SEM.REFRESH", "w", "holder", "90"][..]),
        ("w", &["SEM.RELEASE", "w", "holder"]),
        ("w", &["SEM.ACQUIREFAIR", "w", "1", "60", "ID", "next"]),
    ] {
        let fired = fires_watch(&mut watcher, &mut c, name, |conn| {
            let _: Value = run(conn, call);
        });
        assert!(
            fired,
            "{call:?} changed the semaphore but did not fire WATCH"
        );
    }
}

#[test]
fn reads_and_errors_keep_the_counters_encoding() {
    let server = Server::start();
    let mut c = server.connection();
    for (value, encoding, error) in [
        (
            "abc",
            "embstr",
            "ERR the semaphore's counter key does not hold an integer",
        ),
        (
            "-5",
            "int",
            "ERR the semaphore's counter key does not hold an integer",
        ),
        (
            "9007199254740993",
            "int",
            "ERR the semaphore's counter key does not hold an integer",
        ),
        (
            "9007199254740992",
            "int",
            "ERR the semaphore's counter reached 2^53",
        ),
        (
            "18446744073709551616",
            "embstr",
            "ERR the semaphore's counter key does not hold an integer",
        ),
    ] {
        let _: () = run(&mut c, &["DEL", "n", "n:owner"]);
        let _: String = run(&mut c, &["SET", "n:counter", value]);
        let before = fingerprint(&mut c, "n");
        let memory: i64 = run(&mut c, &["MEMORY", "USAGE", "n:counter"]);
        assert!(
            before[2].ends_with(&format!("Some(\"{encoding}\")")),
            "{before:?}"
        );
        let err = error_of(&mut c, &["SEM.ACQUIREFAIR", "n", "1", "10"]);
        assert!(err.starts_with(error), "{value}: {err}");
        if value == "9007199254740992" {
            // A valid counter with no ticket left: SEM.GET shows it.
            let _: String = run(&mut c, &["SEM.GET", "n", "JSON"]);
        } else {
            let err = error_of(&mut c, &["SEM.GET", "n", "JSON"]);
            assert!(err.starts_with(error), "{value}: {err}");
        }
        assert_eq!(fingerprint(&mut c, "n"), before, "{value}");
        let after: i64 = run(&mut c, &["MEMORY", "USAGE", "n:counter"]);
        assert_eq!(after, memory, "{value}");
    }
    // A valid counter read by SEM.GET JSON, or by a full acquire, keeps its encoding too.
    let _: String = run(&mut c, &["SET", "v:counter", "12"]);
    let before = fingerprint(&mut c, "v");
    let json: String = run(&mut c, &["SEM.GET", "v", "JSON"]);
    assert!(json.contains("\"counter\":12"), "{json}");
    assert_eq!(fingerprint(&mut c, "v"), before);
}

#[test]
fn fairness_follows_the_live_holders_and_leftovers_go() {
    let server = debug_server();
    let mut c = server.connection();
    for (tamper, args) in [
        ("DEL", &["DEL", "j"][..]),
        ("RENAME", &["RENAME", "j", "elsewhere"]),
        ("MOVE", &["MOVE", "j", "1"]),
    ] {
        let _: () = run(&mut c, &["FLUSHALL"]);
        let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "j", "5", "30", "ID", "a"]);
        let _: Value = run(&mut c, args);
        let doc: String = run(&mut c, &["SEM.GET", "j", "JSON"]);
        let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(doc["fair"], false, "{tamper}: no live holder, so not fair");
        let id: Option<String> = run(&mut c, &["SEM.ACQUIRE", "j", "5", "30"]);
        assert!(id.is_some(), "{tamper}");
        let owners: i64 = run(&mut c, &["EXISTS", "j:owner"]);
        assert_eq!(owners, 0, "{tamper}: the leftover owner set was removed");
        let again: Option<String> = run(&mut c, &["SEM.ACQUIRE", "j", "5", "30"]);
        assert!(again.is_some(), "{tamper}: still a plain semaphore");
        assert_no_empty_key(&mut c);
    }

    // A foreign owner entry beside live fair holders: removed by the next write.
    let _: () = run(&mut c, &["FLUSHALL"]);
    let fresh = FirstGrant::before(&mut c);
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "f", "5", "30", "ID", "a"]);
    let first = fresh.holder(&mut c, "f", "a");
    let _: i64 = run(&mut c, &["ZADD", "f:owner", "99", "ghost"]);
    let released: i64 = run(&mut c, &["SEM.RELEASE", "f", "nobody"]);
    assert_eq!(released, 0);
    assert_eq!(zset(&mut c, "f:owner"), vec![("a".to_string(), first)]);
}

#[test]
fn a_ticket_reply_is_always_a_valid_ticket() {
    let server = Server::start();
    let mut c = server.connection();
    for score in ["+inf", "1e300", "-5", "9223372036854775808", "2.5", "0"] {
        let _: () = run(&mut c, &["FLUSHALL"]);
        let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "t", "5", "30", "ID", "a"]);
        let _: i64 = run(&mut c, &["ZADD", "t:owner", score, "a"]);
        let before = fingerprint(&mut c, "t");
        let err = error_of(
            &mut c,
            &["SEM.ACQUIREFAIR", "t", "5", "30", "ID", "a", "WITHTICKET"],
        );
        assert!(
            err.starts_with("ERR the holder has no valid ticket"),
            "{score}: {err}"
        );
        let err = error_of(&mut c, &["SEM.GET", "t", "JSON"]);
        assert!(
            err.starts_with("ERR the holder has no valid ticket"),
            "{score}: {err}"
        );
        assert_eq!(fingerprint(&mut c, "t"), before, "{score}");
    }
}

#[test]
fn numbers_follow_one_rule_each() {
    let server = Server::start();
    let mut c = server.connection();
    for (limit, lease) in [
        ("007", "30"),
        ("00000000001", "30"),
        ("1", "000000000.001"),
        ("1", "0000000000.001"),
        ("0004294967295", "031536000.000"),
    ] {
        let _: () = run(&mut c, &["DEL", "n"]);
        let id: Option<String> = run(&mut c, &["SEM.ACQUIRE", "n", limit, lease]);
        assert!(id.is_some(), "limit {limit} lease {lease}");
    }
    for limit in [
        "0",
        "4294967296",
        "99999999999999999999",
        "-1",
        "+1",
        " 1",
        "",
    ] {
        let err = error_of(&mut c, &["SEM.ACQUIRE", "n", limit, "30"]);
        assert!(err.starts_with("ERR limit must be"), "{limit:?}: {err}");
    }
    for lease in [
        "0",
        "0.000",
        "0.0001",
        "31536000.001",
        "99999999999999999999",
        "1e3",
        ".5",
    ] {
        let err = error_of(&mut c, &["SEM.ACQUIRE", "n", "1", lease]);
        assert!(err.starts_with("ERR lease must be"), "{lease:?}: {err}");
    }
}

#[test]
fn command_info_declares_keys_arity_and_flags() {
    let server = Server::start();
    let mut c = server.connection();
    for (command, arity, flags) in [
        ("sem.acquire", -4, "RW"),
        ("sem.acquirefair", -4, "RW"),
        ("sem.refresh", -4, "RW"),
        ("sem.release", -3, "RW"),
        ("sem.get", -2, "RO"),
        ("sem.waitempty", -3, "RO"),
        ("sem.limit", -2, "RW"),
        ("sem.acquireall", -6, "RW"),
        ("sem.releaseall", -4, "RW"),
        ("sem.refreshall", -5, "RW"),
    ] {
        let info: Vec<Vec<Value>> = run(&mut c, &["COMMAND", "INFO", command]);
        let info = &info[0];
        assert_eq!(info[1], Value::Int(arity), "{command}");
        let text = format!("{info:?}");
        assert!(text.contains("movablekeys"), "{command}: {text}");
        assert!(
            text.contains(&format!("bulk-string(\"{flags}\")")) || text.contains(flags),
            "{command}: {text}"
        );
    }
    let get: Vec<Vec<Value>> = run(&mut c, &["COMMAND", "INFO", "sem.get"]);
    let text = format!("{get:?}");
    assert!(
        !text.contains("\"RW\"") && !text.contains("write"),
        "{text}"
    );
    assert!(text.contains("readonly"), "{text}");
    let release: Vec<Vec<Value>> = run(&mut c, &["COMMAND", "INFO", "sem.release"]);
    assert!(
        !format!("{release:?}").contains("denyoom"),
        "release is not deny-oom"
    );
    // Clients route by what COMMAND GETKEYS says of what they send: the name alone.
    let keys: Vec<String> = run(
        &mut c,
        &[
            "COMMAND",
            "GETKEYS",
            "SEM.ACQUIREFAIR",
            "jobs",
            "2",
            "30",
            "ID",
            "jobs:owner",
        ],
    );
    assert_eq!(keys, ["jobs"]);
}

#[test]
fn module_unload_waits_until_no_connection_holds_bound_permits() {
    let server = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--enable-module-command",
        "yes",
    ]);
    let mut admin = server.connection();
    let mut bound = server.connection();
    let _: String = run(&mut bound, &["SEM.ACQUIRE", "b", "1", "30", "BOUND"]);
    let err = error_of(&mut admin, &["MODULE", "UNLOAD", "sem"]);
    assert!(err.starts_with("ERR Error unloading module"), "{err}");
    let count: i64 = run(&mut admin, &["SEM.GET", "b"]);
    assert_eq!(count, 1, "the module is still there");
    drop(bound);
    wait_until(
        "the BOUND permit came back",
        Duration::from_secs(10),
        || run::<i64>(&mut admin, &["SEM.GET", "b"]) == 0,
    );
    let ok: String = run(&mut admin, &["MODULE", "UNLOAD", "sem"]);
    assert_eq!(ok, "OK");
    let ok: String = run(
        &mut admin,
        &["MODULE", "LOAD", module_path().to_str().unwrap()],
    );
    assert_eq!(ok, "OK");
    let id: Option<String> = run(&mut admin, &["SEM.ACQUIRE", "b", "1", "30"]);
    assert!(id.is_some(), "works again after a reload");
}

/// `MODULE UNLOAD` works as soon as the last wait ends (no timer stays armed), and a new
/// `MODULE LOAD` starts clean: default settings, counters at 0, and where the server has module
/// ACL categories, every command back in `semaphore` (a rule `-@semaphore` keeps applying).
#[test]
fn a_reload_starts_clean_and_keeps_the_acl_category() {
    let server = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--enable-module-command",
        "yes",
    ]);
    let mut admin = server.connection();
    let categories = |c: &mut Connection| -> Vec<String> {
        let all: Vec<String> = run(c, &["ACL", "CAT"]);
        if !all.iter().any(|cat| cat == "semaphore") {
            return Vec::new();
        }
        let mut commands: Vec<String> = run(c, &["ACL", "CAT", "semaphore"]);
        commands.sort();
        commands
    };
    let before = categories(&mut admin);
    let _: () = run(&mut admin, &["CONFIG", "SET", "sem.max-waiters", "42"]);
    let _: String = run(&mut admin, &["SEM.ACQUIRE", "r", "1", "30", "ID", "h"]);
    let mut waiter = server.connection();
    let waiting = std::thread::spawn(move || {
        run::<String>(
            &mut waiter,
            &["SEM.ACQUIRE", "r", "1", "30", "ID", "w", "WAIT", "100"],
        )
    });
    wait_until("the client waits", Duration::from_secs(10), || {
        let info: String = run(&mut admin, &["INFO", "sem"]);
        info.contains("sem_waiters:1")
    });
    let _: i64 = run(&mut admin, &["SEM.RELEASE", "r", "h"]);
    assert_eq!(waiting.join().unwrap(), "w");
    let _: i64 = run(&mut admin, &["SEM.RELEASE", "r", "w"]);

    let ok: String = run(&mut admin, &["MODULE", "UNLOAD", "sem"]);
    assert_eq!(ok, "OK", "unloaded as soon as nobody waits");
    let ok: String = run(
        &mut admin,
        &["MODULE", "LOAD", module_path().to_str().unwrap()],
    );
    assert_eq!(ok, "OK");
    let max: Vec<String> = run(&mut admin, &["CONFIG", "GET", "sem.max-waiters"]);
    assert_eq!(max, ["sem.max-waiters", "25000"]);
    let info: String = run(&mut admin, &["INFO", "sem"]);
    assert!(info.contains("sem_acquired:0"), "{info}");
    assert!(info.contains("sem_waits_started:0"), "{info}");

    assert_eq!(categories(&mut admin), before);
    if !before.is_empty() {
        let spec: serde_json::Value =
            serde_json::from_str(include_str!("../commands.json")).expect("commands.json");
        let commands = spec.as_object().map_or(0, serde_json::Map::len);
        assert_eq!(before.len(), commands, "{before:?}");
        let _: () = run(
            &mut admin,
            &[
                "ACL",
                "SETUSER",
                "nosem",
                "on",
                "nopass",
                "~*",
                "+@all",
                "-@semaphore",
            ],
        );
        let mut nosem = server.connection();
        let _: () = run(&mut nosem, &["AUTH", "nosem", "x"]);
        let err = error_of(&mut nosem, &["SEM.GET", "r"]);
        assert!(err.starts_with("NOPERM"), "{err}");
    }
}

/// A foreign `HSET <name>:permits <id> 0` once made a release underflow; from the timer that
/// gives BOUND permits back, the panic aborted redis-server.
#[test]
fn foreign_permits_values_are_errors_never_a_crash() {
    let server = debug_server();
    let mut c = server.connection();
    let mut bound = server.connection();
    let _: String = run(
        &mut bound,
        &["SEM.ACQUIRE", "s", "5", "100", "ID", "x", "BOUND"],
    );
    let _: i64 = run(&mut c, &["HSET", "s:permits", "x", "0"]);
    drop(bound);
    std::thread::sleep(Duration::from_millis(200));
    let pong: String = run(&mut c, &["PING"]);
    assert_eq!(pong, "PONG", "the server survived");

    // Through a command: an error that changes nothing, not a pruning first and an error after.
    let _: () = run(&mut c, &["FLUSHALL"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "s", "5", "0.05", "ID", "old"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "s", "5", "100", "ID", "x"]);
    let _: i64 = run(&mut c, &["HSET", "s:permits", "x", "0"]);
    std::thread::sleep(Duration::from_millis(100));
    let before = fingerprint(&mut c, "s");
    let err = error_of(&mut c, &["SEM.RELEASE", "s", "x"]);
    assert!(err.starts_with("ERR the semaphore's permits key"), "{err}");
    assert_eq!(fingerprint(&mut c, "s"), before);
    assert_no_empty_key(&mut c);
}

/// A foreign total of extra permits past what any limit allows once made SEM.GET answer a
/// negative count: every reply counts permits that could be held, or is an error.
#[test]
fn a_foreign_permits_total_past_any_limit_is_an_error() {
    let server = debug_server();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "t", "5", "100", "ID", "a"]);
    for total in [
        "4294967296",
        "9223372036854775808",
        "18446744073709551615",
        "99999999999999999999",
    ] {
        let _: i64 = run(&mut c, &["HSET", "t:permits", "", total]);
        let before = fingerprint(&mut c, "t");
        for command in [
            &["SEM.GET", "t"][..],
            &["SEM.GET", "t", "JSON"],
            &["SEM.ACQUIRE", "t", "5", "100"],
        ] {
            let err = error_of(&mut c, command);
            assert!(
                err.starts_with("ERR the semaphore's permits key"),
                "{total}: {err}"
            );
        }
        assert_eq!(fingerprint(&mut c, "t"), before);
    }
    let _: i64 = run(&mut c, &["HSET", "t:permits", "", "4294967295"]);
    let in_use: i64 = run(&mut c, &["SEM.GET", "t"]);
    assert_eq!(in_use, 4_294_967_296);
    assert_no_empty_key(&mut c);
}

fn bound_holders(conn: &mut Connection) -> i64 {
    let info: String = run(conn, &["INFO", "sem"]);
    info.lines()
        .find_map(|line| line.strip_prefix("sem_bound_holders:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("sem_bound_holders")
}

#[test]
fn bindings_follow_the_permits_they_bind() {
    let server = debug_server();
    let mut c = server.connection();
    // Re-acquiring an identifier whose permit just expired binds the new permit.
    let _: String = run(
        &mut c,
        &["SEM.ACQUIRE", "s", "5", "100", "ID", "other", "BOUND"],
    );
    let _: String = run(
        &mut c,
        &["SEM.ACQUIRE", "s", "5", "0.05", "ID", "x", "BOUND"],
    );
    let _: () = run(&mut c, &["DEBUG", "SLEEP", "0.1"]);
    let _: String = run(
        &mut c,
        &["SEM.ACQUIRE", "s", "5", "100", "ID", "x", "BOUND"],
    );
    assert_eq!(bound_holders(&mut c), 2);

    // When another client deletes the holders, their bindings end at the next write; a later
    // holder of the same identifier, acquired without BOUND, is not given back on disconnect.
    let mut other = server.connection();
    let _: i64 = run(&mut other, &["DEL", "s"]);
    let _: String = run(&mut other, &["SEM.ACQUIRE", "s", "5", "100", "ID", "x"]);
    assert_eq!(bound_holders(&mut other), 0);
    drop(c);
    std::thread::sleep(Duration::from_millis(200));
    let count: i64 = run(&mut other, &["SEM.GET", "s"]);
    assert_eq!(
        count, 1,
        "x, acquired without BOUND, survived the other connection"
    );

    // BOUND from a script is refused: the script's connection never closes.
    let err = error_of(
        &mut other,
        &[
            "EVAL",
            "return redis.call('SEM.ACQUIRE', KEYS[1], 5, 10, 'BOUND')",
            "1",
            "s",
        ],
    );
    assert!(err.contains("BOUND cannot be used from a script"), "{err}");
}
