//! Each SEM.* command against a real redis-server: replies, the key layout it leaves, leases and
//! expiry, idempotent identifiers, fair tickets, errors, transactions, scripts, ACLs and Cluster.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::{
    cluster_refuses_short_form, error_of, long_form, run, server_ms, server_version, ticket_floor,
    try_run, wait_until, zset, FirstGrant, Server,
};
use redis::{Connection, Value};

/// Everything the semaphore `name` keeps: both sorted sets, the counter, and each set's expiry.
fn state(conn: &mut Connection, name: &str) -> String {
    let owner = format!("{name}:owner");
    let counter = format!("{name}:counter");
    let holders_expiry: i64 = run(conn, &["PEXPIRETIME", name]);
    let owners_expiry: i64 = run(conn, &["PEXPIRETIME", &owner]);
    let counter_value: Option<String> = try_run(conn, &["GET", &counter]).ok().flatten();
    format!(
        "holders={:?}@{holders_expiry} owners={:?}@{owners_expiry} counter={counter_value:?}",
        zset(conn, name),
        zset(conn, &owner),
    )
}

#[test]
fn acquire_grants_server_made_identifiers_up_to_the_limit() {
    let server = Server::start();
    let mut c = server.connection();
    let before = server_ms(&mut c);
    let a: String = run(&mut c, &["SEM.ACQUIRE", "jobs", "2", "10"]);
    let b: String = run(&mut c, &["SEM.ACQUIRE", "jobs", "2", "10"]);
    let after = server_ms(&mut c);
    let refused: Option<String> = run(&mut c, &["SEM.ACQUIRE", "jobs", "2", "10"]);

    for id in [&a, &b] {
        let parsed = uuid_fields(id);
        assert_eq!(parsed, [8, 4, 4, 4, 12], "{id} is a hyphenated UUID");
        assert_eq!(&id[14..15], "4", "{id} is a version 4 UUID");
    }
    assert_ne!(a, b);
    assert_eq!(refused, None);
    let holders = zset(&mut c, "jobs");
    assert_eq!(holders.len(), 2);
    for (id, deadline) in &holders {
        assert!([&a, &b].contains(&id));
        assert!(
            (before + 10_000..=after + 10_000).contains(deadline),
            "deadline {deadline} is the server's now + 10 s"
        );
    }
    let expires_at: i64 = run(&mut c, &["PEXPIRETIME", "jobs"]);
    assert_eq!(expires_at, holders.iter().map(|(_, d)| *d).max().unwrap());
    let exists: i64 = run(&mut c, &["EXISTS", "jobs:owner", "jobs:counter"]);
    assert_eq!(exists, 0, "a plain semaphore has no owner set or counter");
    // Another caller's larger limit counts the same holders.
    let third: Option<String> = run(&mut c, &["SEM.ACQUIRE", "jobs", "3", "10"]);
    assert!(third.is_some());
    let count: i64 = run(&mut c, &["SEM.GET", "jobs"]);
    assert_eq!(count, 3);
}

fn uuid_fields(id: &str) -> Vec<usize> {
    assert!(id.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()));
    id.split('-').map(str::len).collect()
}

#[test]
fn acquire_with_an_id_is_idempotent() {
    let server = Server::start();
    let mut c = server.connection();
    let first: String = run(&mut c, &["SEM.ACQUIRE", "s", "1", "5", "ID", "worker-1"]);
    assert_eq!(first, "worker-1");
    let deadline_before = zset(&mut c, "s")[0].1;
    sleep(Duration::from_millis(20));
    let again: String = run(&mut c, &["SEM.ACQUIRE", "s", "1", "60", "id", "worker-1"]);
    assert_eq!(
        again, "worker-1",
        "a retry succeeds although the limit is 1"
    );
    let holders = zset(&mut c, "s");
    assert_eq!(holders.len(), 1, "no second permit");
    assert!(
        holders[0].1 >= deadline_before + 55_000,
        "deadline moved to now + 60 s"
    );
    let other: Option<String> = run(&mut c, &["SEM.ACQUIRE", "s", "1", "5", "ID", "worker-2"]);
    assert_eq!(other, None);
    // Identifiers are binary safe.
    let binary: String = run(
        &mut c,
        &["SEM.ACQUIRE", "bin", "1", "5", "ID", "a\0b\u{e9}"],
    );
    assert_eq!(binary, "a\0b\u{e9}");
    let released: i64 = run(&mut c, &["SEM.RELEASE", "bin", "a\0b\u{e9}"]);
    assert_eq!(released, 1);
}

#[test]
fn fair_grants_take_tickets_in_order_and_refusals_take_none() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let (a, t1): (String, i64) = run(&mut c, &["SEM.ACQUIREFAIR", "f", "2", "10", "WITHTICKET"]);
    let first = fresh.ticket(&mut c, t1);
    let (b, t2): (String, i64) = run(
        &mut c,
        &["SEM.ACQUIREFAIR", "f", "2", "10", "withticket", "ID", "bee"],
    );
    assert_eq!(t2, first + 1);
    assert_eq!(b, "bee");
    let refused: Option<Vec<Value>> =
        run(&mut c, &["SEM.ACQUIREFAIR", "f", "2", "10", "WITHTICKET"]);
    assert_eq!(refused, None);
    let counter: i64 = run(&mut c, &["GET", "f:counter"]);
    assert_eq!(counter, first + 1, "the refused attempt took no ticket");
    assert_eq!(
        zset(&mut c, "f:owner"),
        vec![(a.clone(), first), (b.clone(), first + 1)]
    );
    let holders: Vec<String> = zset(&mut c, "f").into_iter().map(|(id, _)| id).collect();
    assert_eq!(holders.len(), 2);
    let expiry: i64 = run(&mut c, &["PEXPIRETIME", "f"]);
    let owner_expiry: i64 = run(&mut c, &["PEXPIRETIME", "f:owner"]);
    assert_eq!(
        owner_expiry, expiry,
        "the owner set expires with the holders"
    );

    // A retry with the same identifier keeps its ticket.
    let (_, again): (String, i64) = run(
        &mut c,
        &["SEM.ACQUIREFAIR", "f", "2", "10", "ID", "bee", "WITHTICKET"],
    );
    assert_eq!(again, first + 1);
    // Tickets keep growing after every holder is gone: a fencing token never repeats.
    let _: i64 = run(&mut c, &["SEM.RELEASE", "f", &a]);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "f", &b]);
    let exists: i64 = run(&mut c, &["EXISTS", "f", "f:owner"]);
    assert_eq!(exists, 0);
    let id: String = run(&mut c, &["SEM.ACQUIREFAIR", "f", "2", "10", "ID", "late"]);
    assert_eq!(id, "late");
    assert_eq!(
        zset(&mut c, "f:owner"),
        vec![("late".to_string(), first + 2)]
    );
}

#[test]
fn fair_and_plain_do_not_mix_while_holders_are_live() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "m", "5", "0.5"]);
    let before = state(&mut c, "m");
    let err = error_of(&mut c, &["SEM.ACQUIRE", "m", "5", "10"]);
    assert!(err.starts_with("ERR ") && err.contains("fair"), "{err}");
    assert_eq!(
        state(&mut c, "m"),
        before,
        "the refused call changed nothing"
    );

    sleep(Duration::from_millis(550));
    let plain: Option<String> = run(&mut c, &["SEM.ACQUIRE", "m", "5", "10"]);
    assert!(
        plain.is_some(),
        "an expired fair semaphore may be used as a plain one"
    );
    let owners: i64 = run(&mut c, &["EXISTS", "m:owner"]);
    assert_eq!(owners, 0, "the expired fair holder left its owner set too");
    let err = error_of(&mut c, &["SEM.ACQUIREFAIR", "m", "5", "10"]);
    assert!(err.starts_with("ERR ") && err.contains("plain"), "{err}");
}

#[test]
fn leases_expire_on_the_server_clock() {
    let server = Server::start();
    let mut c = server.connection();
    let short: String = run(&mut c, &["SEM.ACQUIRE", "e", "1", "0.5"]);
    let refused: Option<String> = run(&mut c, &["SEM.ACQUIRE", "e", "1", "10"]);
    assert_eq!(refused, None);
    sleep(Duration::from_millis(550));

    let count: i64 = run(&mut c, &["SEM.GET", "e"]);
    assert_eq!(count, 0, "an expired holder counts for nothing");
    // SEM.GET is read-only; the key itself expired at the latest deadline.
    let exists: i64 = run(&mut c, &["EXISTS", "e"]);
    assert_eq!(exists, 0, "the abandoned semaphore left nothing behind");

    let next: Option<String> = run(&mut c, &["SEM.ACQUIRE", "e", "1", "10"]);
    assert!(next.is_some());
    let refreshed: i64 = run(&mut c, &["SEM.REFRESH", "e", &short, "10"]);
    assert_eq!(refreshed, 0, "the expired holder lost its permit");
    let released: i64 = run(&mut c, &["SEM.RELEASE", "e", &short]);
    assert_eq!(released, 0);
}

#[test]
fn expired_holders_are_pruned_by_the_next_writer() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "p", "3", "0.5", "ID", "old"]);
    let first = fresh.holder(&mut c, "p", "old");
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "p", "3", "30", "ID", "keeper"]);
    sleep(Duration::from_millis(550));
    assert_eq!(
        zset(&mut c, "p").len(),
        2,
        "nothing removes it before a write"
    );
    let count: i64 = run(&mut c, &["SEM.GET", "p"]);
    assert_eq!(count, 1);

    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "p", "3", "30", "ID", "new"]);
    let holders: Vec<String> = zset(&mut c, "p").into_iter().map(|(id, _)| id).collect();
    assert!(!holders.contains(&"old".to_string()));
    assert_eq!(
        zset(&mut c, "p:owner"),
        vec![
            ("keeper".to_string(), first + 1),
            ("new".to_string(), first + 2)
        ]
    );
}

#[test]
fn refresh_moves_a_live_deadline_only() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let id: String = run(&mut c, &["SEM.ACQUIREFAIR", "r", "1", "1"]);
    let first = fresh.holder(&mut c, "r", &id);
    let before = server_ms(&mut c);
    let refreshed: i64 = run(&mut c, &["SEM.REFRESH", "r", &id, "120.5"]);
    assert_eq!(refreshed, 1);
    let deadline = zset(&mut c, "r")[0].1;
    assert!((before + 120_500..before + 121_500).contains(&deadline));
    let expiry: i64 = run(&mut c, &["PEXPIRETIME", "r"]);
    let owner_expiry: i64 = run(&mut c, &["PEXPIRETIME", "r:owner"]);
    assert_eq!((expiry, owner_expiry), (deadline, deadline));
    assert_eq!(
        zset(&mut c, "r:owner"),
        vec![(id.clone(), first)],
        "ticket kept"
    );

    let unknown: i64 = run(&mut c, &["SEM.REFRESH", "r", "nobody", "10"]);
    assert_eq!(unknown, 0);
    let count: i64 = run(&mut c, &["SEM.GET", "r"]);
    assert_eq!(count, 1, "a failed refresh grants nothing");
}

#[test]
fn release_gives_back_a_live_permit_once() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let a: String = run(&mut c, &["SEM.ACQUIREFAIR", "l", "1", "10"]);
    let first = fresh.holder(&mut c, "l", &a);
    let full: Option<String> = run(&mut c, &["SEM.ACQUIREFAIR", "l", "1", "10"]);
    assert_eq!(full, None);
    let released: i64 = run(&mut c, &["SEM.RELEASE", "l", &a]);
    assert_eq!(released, 1);
    let twice: i64 = run(&mut c, &["SEM.RELEASE", "l", &a]);
    assert_eq!(twice, 0);
    let never: i64 = run(&mut c, &["SEM.RELEASE", "nothing-here", "x"]);
    assert_eq!(never, 0);
    let exists: i64 = run(&mut c, &["EXISTS", "l", "l:owner"]);
    assert_eq!(exists, 0, "the empty sets are deleted");
    let counter: i64 = run(&mut c, &["GET", "l:counter"]);
    assert_eq!(counter, first, "the counter stays so tickets never repeat");
    let b: Option<String> = run(&mut c, &["SEM.ACQUIREFAIR", "l", "1", "10"]);
    assert!(b.is_some(), "the released permit is free again");
}

#[test]
fn get_json_describes_holders_in_grant_order() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "j", "5", "30", "ID", "first"]);
    let first = fresh.holder(&mut c, "j", "first");
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "j", "5", "10", "ID", "second"]);
    let doc: String = run(&mut c, &["SEM.GET", "j", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&doc).expect("valid JSON");
    assert_eq!(doc["name"], "j");
    assert_eq!(doc["fair"], true);
    assert_eq!(doc["counter"], first + 1);
    let holders = doc["holders"].as_array().expect("holders array");
    let ids: Vec<&str> = holders.iter().map(|h| h["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["first", "second"], "by ticket, not by deadline");
    assert_eq!(holders[0]["ticket"], first);
    assert_eq!(holders[1]["ticket"], first + 1);
    let left = holders[0]["ms_left"].as_i64().unwrap();
    assert!((29_000..=30_000).contains(&left), "{left}");
    assert_eq!(holders[0]["permits"], 1);
    assert_eq!(holders[0].as_object().unwrap().len(), 4);
    assert_eq!(doc["in_use"], 2);
    assert_eq!(doc["waiters"], 0);

    let _: String = run(&mut c, &["SEM.ACQUIRE", "plain", "5", "20", "ID", "x"]);
    let doc: String = run(&mut c, &["SEM.GET", "plain", "JSON"]);
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["fair"], false);
    assert_eq!(doc["counter"], serde_json::Value::Null);
    assert_eq!(doc["holders"][0]["ticket"], serde_json::Value::Null);

    let doc: String = run(&mut c, &["SEM.GET", "never-used", "JSON"]);
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["holders"], serde_json::json!([]));
    let count: i64 = run(&mut c, &["SEM.GET", "never-used"]);
    assert_eq!(count, 0);
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "b", "2", "30", "ID", "held"]);
    let _: String = run(&mut c, &["SET", "str", "x"]);
    let _: i64 = run(&mut c, &["LPUSH", "lst:owner", "x"]);
    let _: i64 = run(&mut c, &["LPUSH", "cnt:counter", "x"]);
    let _: String = run(&mut c, &["SET", "txt:counter", "abc"]);
    let before = state(&mut c, "b");

    let cases: &[(&[&str], &str)] = &[
        (
            &["SEM.ACQUIRE", "b", "2"],
            "ERR wrong number of arguments for 'sem.acquire'",
        ),
        (
            &["SEM.ACQUIREFAIR", "b"],
            "ERR wrong number of arguments for 'sem.acquirefair'",
        ),
        (
            &["SEM.REFRESH", "b", "held"],
            "ERR wrong number of arguments for 'sem.refresh'",
        ),
        (
            &["SEM.REFRESH", "b", "held", "1", "2"],
            "ERR wrong number of arguments",
        ),
        (
            &["SEM.RELEASE", "b"],
            "ERR wrong number of arguments for 'sem.release'",
        ),
        (&["SEM.GET"], "ERR wrong number of arguments for 'sem.get'"),
        (&["SEM.GET", "b", "JSON", "x"], "ERR syntax error"),
        (&["SEM.GET", "b", "JSON", "JSON"], "ERR syntax error"),
        (
            &["SEM.RELEASE", "b", "held", "COUNT", "1", "COUNT", "1"],
            "ERR syntax error",
        ),
        (
            &["SEM.RELEASE", "b", "held", "COUNT", "1", "x"],
            "ERR syntax error",
        ),
        (
            &["SEM.ACQUIRE", "b", "two", "30"],
            "ERR limit must be an integer",
        ),
        (&["SEM.ACQUIRE", "b", "0", "30"], "ERR limit"),
        (&["SEM.ACQUIRE", "b", "-1", "30"], "ERR limit"),
        (&["SEM.ACQUIRE", "b", "4294967296", "30"], "ERR limit"),
        (&["SEM.ACQUIRE", "b", "2.5", "30"], "ERR limit"),
        (&["SEM.ACQUIRE", "b", "2", "soon"], "ERR lease must be"),
        (&["SEM.ACQUIRE", "b", "2", "0"], "ERR lease"),
        (&["SEM.ACQUIRE", "b", "2", "-5"], "ERR lease"),
        (&["SEM.ACQUIRE", "b", "2", "0.0001"], "ERR lease"),
        (&["SEM.ACQUIRE", "b", "2", "31536000.001"], "ERR lease"),
        (&["SEM.ACQUIRE", "b", "2", "1e3"], "ERR lease"),
        (&["SEM.REFRESH", "b", "held", "nan"], "ERR lease"),
        (
            &["SEM.ACQUIRE", "", "2", "30"],
            "ERR semaphore name must not be empty",
        ),
        (
            &["SEM.RELEASE", "", "held"],
            "ERR semaphore name must not be empty",
        ),
        (&["SEM.GET", ""], "ERR semaphore name must not be empty"),
        (
            &["SEM.ACQUIRE", "b", "2", "30", "ID", ""],
            "ERR identifier must not be empty",
        ),
        (
            &["SEM.REFRESH", "b", "", "30"],
            "ERR identifier must not be empty",
        ),
        (
            &["SEM.RELEASE", "b", ""],
            "ERR identifier must not be empty",
        ),
        (
            &["SEM.ACQUIRE", "b", "2", "30", "NOWAIT"],
            "ERR syntax error",
        ),
        (&["SEM.ACQUIRE", "b", "2", "30", "ID"], "ERR syntax error"),
        (
            &["SEM.ACQUIRE", "b", "2", "30", "ID", "x", "ID", "y"],
            "ERR syntax error",
        ),
        (
            &["SEM.ACQUIRE", "b", "2", "30", "WITHTICKET"],
            "ERR syntax error",
        ),
        (
            &[
                "SEM.ACQUIREFAIR",
                "b",
                "2",
                "30",
                "WITHTICKET",
                "WITHTICKET",
            ],
            "ERR syntax error",
        ),
        (&["SEM.GET", "b", "XML"], "ERR syntax error"),
        (&["SEM.ACQUIRE", "str", "2", "30"], "WRONGTYPE"),
        (&["SEM.RELEASE", "str", "x"], "WRONGTYPE"),
        (&["SEM.GET", "str"], "WRONGTYPE"),
        (&["SEM.ACQUIRE", "lst", "2", "30"], "WRONGTYPE"),
        (&["SEM.ACQUIREFAIR", "cnt", "2", "30"], "WRONGTYPE"),
        (&["SEM.GET", "cnt", "JSON"], "WRONGTYPE"),
        (
            &["SEM.ACQUIREFAIR", "txt", "2", "30"],
            "ERR the semaphore's counter key",
        ),
        (
            &["SEM.ACQUIRE", "b", "2", "30"],
            "ERR the semaphore has live fair holders",
        ),
    ];
    for (args, want) in cases {
        let err = error_of(&mut c, args);
        assert!(
            err.starts_with(want),
            "{args:?}: got {err:?}, want {want:?}"
        );
        assert_eq!(state(&mut c, "b"), before, "{args:?} changed the semaphore");
    }
    let txt: String = run(&mut c, &["GET", "txt:counter"]);
    assert_eq!(txt, "abc");
    let exists: i64 = run(&mut c, &["EXISTS", "txt", "txt:owner", "lst"]);
    assert_eq!(exists, 0, "no key was created by a refused call");

    // Every error is counted under a real error code.
    let info: String = run(&mut c, &["INFO", "errorstats"]);
    for line in info.lines().filter(|l| l.starts_with("errorstat_")) {
        assert!(
            line.starts_with("errorstat_ERR:") || line.starts_with("errorstat_WRONGTYPE:"),
            "{line}"
        );
    }
}

#[test]
fn commands_work_inside_multi_exec() {
    let server = Server::start();
    let mut c = server.connection();
    let replies: (Option<String>, Option<String>, Option<String>, i64) = redis::pipe()
        .atomic()
        .cmd("SEM.ACQUIRE")
        .arg("t")
        .arg(2)
        .arg(10)
        .arg("ID")
        .arg("a")
        .cmd("SEM.ACQUIRE")
        .arg("t")
        .arg(2)
        .arg(10)
        .arg("ID")
        .arg("b")
        .cmd("SEM.ACQUIRE")
        .arg("t")
        .arg(2)
        .arg(10)
        .arg("ID")
        .arg("c")
        .cmd("SEM.GET")
        .arg("t")
        .query(&mut c)
        .expect("EXEC");
    assert_eq!(replies, (Some("a".into()), Some("b".into()), None, 2));
    // A failing command inside EXEC fails alone; the others still apply.
    let _: String = run(&mut c, &["MULTI"]);
    let _: String = run(&mut c, &["SEM.RELEASE", "t", "a"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "t", "0", "10"]);
    // The client library reports the failed element as the error of the whole EXEC.
    let err = error_of(&mut c, &["EXEC"]);
    assert!(err.starts_with("ERR limit must be"), "{err}");
    let count: i64 = run(&mut c, &["SEM.GET", "t"]);
    assert_eq!(count, 1);
}

#[test]
fn commands_work_from_lua_scripts() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let script = r"
        local a = redis.call('SEM.ACQUIREFAIR', KEYS[1], 1, 10, 'WITHTICKET')
        local b = redis.call('SEM.ACQUIREFAIR', KEYS[1], 1, 10)
        local n = redis.call('SEM.GET', KEYS[1])
        local r = redis.call('SEM.RELEASE', KEYS[1], a[1])
        return {a[2], b, n, r, redis.call('SEM.GET', KEYS[1])}
    ";
    let reply: (i64, Option<String>, i64, i64, i64) = run(&mut c, &["EVAL", script, "1", "lua"]);
    let (ticket, second, held, released, left) = reply;
    fresh.ticket(&mut c, ticket);
    assert_eq!((second, held, released, left), (None, 1, 1, 0));
    let err = error_of(
        &mut c,
        &[
            "EVAL",
            "return redis.call('SEM.ACQUIRE', KEYS[1], 0, 1)",
            "1",
            "lua",
        ],
    );
    assert!(err.contains("ERR limit must be"), "{err}");
}

#[test]
fn key_positions_serve_getkeys_and_acl_patterns() {
    let server = Server::start();
    let mut c = server.connection();
    let keys: Vec<String> = run(
        &mut c,
        &["COMMAND", "GETKEYS", "SEM.ACQUIREFAIR", "app:sem", "1", "1"],
    );
    assert_eq!(keys, ["app:sem"]);
    let keys: Vec<String> = run(
        &mut c,
        &["COMMAND", "GETKEYS", "SEM.GET", "app:sem", "JSON"],
    );
    assert_eq!(keys, ["app:sem"]);
    for (command, flag) in [
        ("sem.acquire", "write"),
        ("sem.acquirefair", "denyoom"),
        ("sem.refresh", "write"),
        ("sem.release", "write"),
        ("sem.get", "readonly"),
    ] {
        let info: Vec<Value> = run(&mut c, &["COMMAND", "INFO", command]);
        let text = format!("{info:?}");
        assert!(text.contains(flag), "{command}: {text}");
    }

    let _: String = run(
        &mut c,
        &["ACL", "SETUSER", "app", "on", ">pw", "~app:*", "+@all"],
    );
    let mut app = server.connection();
    let _: String = run(&mut app, &["AUTH", "app", "pw"]);
    let granted: Option<String> = run(&mut app, &["SEM.ACQUIREFAIR", "app:sem", "1", "10"]);
    assert!(
        granted.is_some(),
        "~app:* covers app:sem and its derived keys"
    );
    let err = error_of(&mut app, &["SEM.ACQUIRE", "other", "1", "10"]);
    assert!(err.starts_with("NOPERM"), "{err}");
}

#[test]
fn cluster_mode_requires_a_hash_tag() {
    let server = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]);
    let mut c = server.connection();
    let _: String = run(&mut c, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
    wait_until(
        "the one-node cluster is ok",
        Duration::from_secs(10),
        || {
            let info: String = run(&mut c, &["CLUSTER", "INFO"]);
            info.contains("cluster_state:ok")
        },
    );
    // The form this server takes in Cluster: the short one where a command filter declares the
    // keys, else the long one (the short is refused, naming it).
    let (valkey, major, minor) = server_version(&mut c);
    let long = cluster_refuses_short_form(valkey, major, minor, &[]);
    let form = |args: &[&str]| -> Vec<String> {
        match long {
            true => long_form(args),
            false => args.iter().map(|arg| arg.to_string()).collect(),
        }
    };
    if long {
        let err = error_of(&mut c, &["SEM.ACQUIREFAIR", "{jobs}", "1", "10"]);
        assert!(err.contains("takes the long form"), "{err}");
    }
    // Redis itself refuses a name whose derived keys fall in other slots.
    let args = form(&["SEM.ACQUIREFAIR", "jobs", "1", "10"]);
    let err = error_of(&mut c, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(err.starts_with("CROSSSLOT"), "{err}");
    let args = form(&["SEM.ACQUIREFAIR", "{jobs}", "1", "10"]);
    let id: Option<String> = run(&mut c, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(id.is_some());
    let slots: Vec<i64> = ["{jobs}", "{jobs}:owner", "{jobs}:counter"]
        .iter()
        .map(|key| run(&mut c, &["CLUSTER", "KEYSLOT", key]))
        .collect();
    assert!(slots.iter().all(|&s| s == slots[0]), "{slots:?}");
    let exists: i64 = run(
        &mut c,
        &["EXISTS", "{jobs}", "{jobs}:owner", "{jobs}:counter"],
    );
    assert_eq!(exists, 3);
}

#[test]
fn changes_fire_the_keyspace_events_of_the_equivalent_commands() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEA"]);
    let mut listener = server.connection();
    let mut pubsub = listener.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:ks*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();

    let id: String = run(&mut c, &["SEM.ACQUIREFAIR", "ks", "1", "10"]);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "ks", &id]);
    let mut events = Vec::new();
    while events.len() < 11 {
        let message = pubsub.get_message().expect("a keyspace event");
        let key = message
            .get_channel_name()
            .trim_start_matches("__keyspace@0__:");
        let event: String = message.get_payload().unwrap();
        events.push(format!("{key} {event}"));
    }
    assert_eq!(
        events,
        [
            "ks zadd",
            "ks:counter set",
            "ks:owner zadd",
            "ks sem.acquire",
            "ks expire",
            "ks:owner expire",
            "ks zrem",
            "ks del",
            "ks:owner zrem",
            "ks:owner del",
            "ks sem.release",
        ]
    );

    // The module class alone (`d`): what auditors and dashboards follow.
    let _: String = run(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Kd"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "ks", "1", "0.1", "ID", "short"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "ks", "2", "10", "ID", "long"]);
    sleep(Duration::from_millis(150));
    let _: i64 = run(&mut c, &["SEM.REFRESH", "ks", "short", "10"]);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "ks", "long"]);
    let mut events = Vec::new();
    while events.len() < 5 {
        let message = pubsub.get_message().expect("a module keyspace event");
        let event: String = message.get_payload().unwrap();
        events.push(event);
    }
    assert_eq!(
        events,
        [
            "sem.acquire",
            "sem.acquire",
            "sem.expire",
            "sem.lost",
            "sem.release"
        ]
    );
}

#[test]
fn the_counter_stays_an_ordinary_integer_key() {
    let server = Server::start();
    let mut c = server.connection();
    let fresh = FirstGrant::before(&mut c);
    let id: String = run(&mut c, &["SEM.ACQUIREFAIR", "k", "5", "10"]);
    let first = fresh.holder(&mut c, "k", &id);
    let incremented: i64 = run(&mut c, &["INCRBY", "k:counter", "10"]);
    assert_eq!(
        incremented,
        first + 10,
        "INCR works on the module's counter"
    );
    let _: i64 = run(&mut c, &["PEXPIRE", "k:counter", "100000"]);
    let (_, ticket): (String, i64) =
        run(&mut c, &["SEM.ACQUIREFAIR", "k", "5", "10", "WITHTICKET"]);
    assert_eq!(
        ticket,
        first + 11,
        "tickets continue from whatever the counter holds above the floor"
    );
    let ttl: i64 = run(&mut c, &["PTTL", "k:counter"]);
    assert!(
        ttl > 90_000,
        "a TTL set on the counter is kept, as SET KEEPTTL does: {ttl}"
    );
    let value: String = run(&mut c, &["GET", "k:counter"]);
    assert_eq!(value, (first + 11).to_string());
    let (_, ticket): (String, i64) =
        run(&mut c, &["SEM.ACQUIREFAIR", "k", "5", "10", "WITHTICKET"]);
    assert_eq!(ticket, first + 12);
    // A counter lowered below the floor goes on from the floor (not from the clock: the
    // counter is there), a longer number written whole.
    let floor = ticket_floor(&mut c);
    let _: String = run(&mut c, &["SET", "k:counter", "999"]);
    let (_, ticket): (String, i64) =
        run(&mut c, &["SEM.ACQUIREFAIR", "k", "5", "10", "WITHTICKET"]);
    assert_eq!(ticket, floor);
    let value: String = run(&mut c, &["GET", "k:counter"]);
    assert_eq!(value, floor.to_string());
}

#[test]
fn names_longer_than_the_stack_buffer_work() {
    let server = Server::start();
    let mut c = server.connection();
    let name = "n".repeat(300);
    let fresh = FirstGrant::before(&mut c);
    let (_, ticket): (String, i64) =
        run(&mut c, &["SEM.ACQUIREFAIR", &name, "1", "10", "WITHTICKET"]);
    fresh.ticket(&mut c, ticket);
    let owner = format!("{name}:owner");
    let counter = format!("{name}:counter");
    let exists: i64 = run(&mut c, &["EXISTS", &name, &owner, &counter]);
    assert_eq!(exists, 3);
}
