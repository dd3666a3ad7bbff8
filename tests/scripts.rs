//! SEM.* from EVAL, EVALSHA, FCALL and MULTI/EXEC on every server `scripts/test` runs: the calls
//! work as sent directly, every derived key stays checked against the caller's ACL (by the
//! module, which inserts them on a standalone server), and the server stays up.

mod common;

use common::*;

/// Every form of call a script or transaction makes, with the key `k` (limit 2).
const ACQUIRE: &str = "return redis.call('SEM.ACQUIRE', KEYS[1], '2', '60', 'ID', ARGV[1])";
const FAIR: &str =
    "return redis.call('SEM.ACQUIREFAIR', KEYS[1], '2', '60', 'ID', ARGV[1], 'WITHTICKET')";
const SET: &str =
    "return redis.call('SEM.ACQUIREALL', '2', KEYS[1], '2', '1', KEYS[2], '2', '1', '60', 'ID', ARGV[1])";
const GET: &str = "return redis.call('SEM.GET', KEYS[1])";
const RELEASE: &str = "return redis.call('SEM.RELEASE', KEYS[1], ARGV[1])";

const LIBRARY: &str = "#!lua name=semlib
redis.register_function('sem_take', function(keys, args)
  return redis.call('SEM.ACQUIRE', keys[1], '2', '60', 'ID', args[1])
end)
redis.register_function{function_name='sem_count', flags={'no-writes'},
  callback=function(keys, args) return redis.call('SEM.GET', keys[1]) end}";

fn alive(conn: &mut redis::Connection) {
    let pong: String = run(conn, &["PING"]);
    assert_eq!(pong, "PONG");
}

#[test]
fn scripts_functions_and_transactions_call_every_form() {
    let server = Server::start();
    let mut conn = server.connection();

    let id: String = run(&mut conn, &["EVAL", ACQUIRE, "1", "{s}k", "a"]);
    assert_eq!(id, "a");
    let sha: String = run(&mut conn, &["SCRIPT", "LOAD", ACQUIRE]);
    let id: String = run(&mut conn, &["EVALSHA", &sha, "1", "{s}k", "b"]);
    assert_eq!(id, "b");
    let count: i64 = run(&mut conn, &["EVAL", GET, "1", "{s}k"]);
    assert_eq!(count, 2);
    // Full: a script cannot wait, so it answers nil at once.
    let full: Option<String> = run(&mut conn, &["EVAL", ACQUIRE, "1", "{s}k", "c"]);
    assert_eq!(full, None);
    let released: i64 = run(&mut conn, &["EVAL", RELEASE, "1", "{s}k", "a"]);
    assert_eq!(released, 1);

    let (id, ticket): (String, i64) = run(&mut conn, &["EVAL", FAIR, "1", "{s}f", "t1"]);
    assert_eq!(id, "t1");
    let (_, next): (String, i64) = run(&mut conn, &["EVAL", FAIR, "1", "{s}f", "t2"]);
    assert!(next > ticket, "tickets grow: {ticket} then {next}");
    let counter: i64 = run(&mut conn, &["GET", "{s}f:counter"]);
    assert_eq!(counter, next);

    let names: Vec<String> = run(&mut conn, &["EVAL", SET, "2", "{s}x", "{s}y", "both"]);
    assert_eq!(names, ["both"]);
    assert_eq!(zset(&mut conn, "{s}y").len(), 1);

    let _: String = run(&mut conn, &["FUNCTION", "LOAD", "REPLACE", LIBRARY]);
    let id: String = run(&mut conn, &["FCALL", "sem_take", "1", "{s}g", "fn1"]);
    assert_eq!(id, "fn1");
    let count: i64 = run(&mut conn, &["FCALL_RO", "sem_count", "1", "{s}g"]);
    assert_eq!(count, 1);

    let (a, b, n): (String, String, i64) = redis::pipe()
        .atomic()
        .cmd("SEM.ACQUIRE")
        .arg("{s}m")
        .arg("2")
        .arg("60")
        .arg("ID")
        .arg("m1")
        .cmd("SEM.ACQUIREFAIR")
        .arg("{s}n")
        .arg("1")
        .arg("60")
        .arg("ID")
        .arg("m2")
        .cmd("SEM.GET")
        .arg("{s}m")
        .query(&mut conn)
        .expect("MULTI/EXEC");
    assert_eq!((a.as_str(), b.as_str(), n), ("m1", "m2", 1));

    // Wrong calls from a script are refused with an error, and change nothing.
    let err = error_of(
        &mut conn,
        &[
            "EVAL",
            "return redis.call('SEM.ACQUIRE', KEYS[1], '2')",
            "1",
            "{s}z",
        ],
    );
    assert!(err.starts_with("ERR"), "{err}");
    let exists: i64 = run(&mut conn, &["EXISTS", "{s}z", "{s}z:owner", "{s}z:counter"]);
    assert_eq!(exists, 0);
    alive(&mut conn);
    assert!(!server.log().contains("crashed"), "the server crashed");
}

/// A user whose keys do not cover the derived keys is refused in every form, and nothing
/// changes; with them covered, every form works.
#[test]
fn the_acl_covers_the_derived_keys_in_scripts_functions_and_transactions() {
    let server = Server::start();
    let mut admin = server.connection();
    let _: String = run(
        &mut admin,
        &[
            "ACL", "SETUSER", "narrow", "on", "nopass", "~k", "~f", "+@all",
        ],
    );
    let _: String = run(
        &mut admin,
        &[
            "ACL", "SETUSER", "wide", "on", "nopass", "~k*", "~f*", "+@all",
        ],
    );
    let _: String = run(&mut admin, &["FUNCTION", "LOAD", "REPLACE", LIBRARY]);
    let login = |user: &str| {
        let mut conn = server.connection();
        let _: String = run(&mut conn, &["AUTH", user, "x"]);
        conn
    };
    let mut narrow = login("narrow");
    let calls: [&[&str]; 5] = [
        &["SEM.ACQUIRE", "k", "2", "60"],
        &["EVAL", ACQUIRE, "1", "k", "a"],
        &["EVAL", FAIR, "1", "f", "a"],
        &["FCALL", "sem_take", "1", "k", "a"],
        &["EVAL", GET, "1", "k"],
    ];
    for call in calls {
        // Redis 7.0 and 8.2 word a script's refusal as an ERR of their own.
        let err = error_of(&mut narrow, call);
        assert!(
            err.starts_with("NOPERM")
                || err.contains("can't access at least one of the keys")
                || err.contains("No permissions to access a key"),
            "{call:?}: {err}"
        );
    }
    let multi: redis::RedisResult<Vec<redis::Value>> = redis::pipe()
        .atomic()
        .cmd("SEM.ACQUIRE")
        .arg("k")
        .arg("2")
        .arg("60")
        .query(&mut narrow);
    let err = error_text(&multi.expect_err("MULTI/EXEC refused"));
    assert!(err.contains("NOPERM") || err.contains("EXECABORT"), "{err}");
    let keys: Vec<String> = run(&mut admin, &["KEYS", "*"]);
    assert!(keys.is_empty(), "a refused call left {keys:?}");

    let mut wide = login("wide");
    for call in calls {
        let _: redis::Value = run(&mut wide, call);
    }
    let count: i64 = run(&mut wide, &["SEM.GET", "k"]);
    assert_eq!(
        count, 2,
        "the direct acquire and the script's and function's"
    );
    alive(&mut admin);
}

/// A standalone server gets no command filter, so other commands pay nothing for the module:
/// calls run as sent (`SLOWLOG` shows the short form), the module inserts the derived keys
/// itself and refuses a user whose keys do not cover them (`NOPERM`, recorded in `ACL LOG`),
/// the same in the default configuration and with `command-filter 0`. A script's short call
/// works on every server (checked against the script caller's user); so does the long form.
#[test]
fn standalone_servers_check_the_derived_keys_without_a_filter() {
    for module_args in [&[][..], &["command-filter", "0"]] {
        let server = Server::start_configured("", module_args, &[]);
        let mut admin = server.connection();
        let _: String = run(
            &mut admin,
            &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
        );
        let id: String = run(&mut admin, &["SEM.ACQUIRE", "k", "2", "60", "ID", "a"]);
        assert_eq!(id, "a");
        let log: Vec<redis::Value> = run(&mut admin, &["SLOWLOG", "GET", "1"]);
        let logged = format!("{log:?}");
        assert!(
            logged.contains("sem.acquire") || logged.contains("SEM.ACQUIRE"),
            "{logged}"
        );
        assert!(
            !logged.contains("k:owner"),
            "the call ran as sent: {logged}"
        );
        let _: String = run(
            &mut admin,
            &["CONFIG", "SET", "slowlog-log-slower-than", "10000"],
        );
        let json = sem_json(&mut admin, "k");
        assert_eq!(json["holders"].as_array().map(Vec::len), Some(1), "{json}");

        let _: String = run(
            &mut admin,
            &["ACL", "SETUSER", "narrow", "on", "nopass", "~k", "+@all"],
        );
        let mut narrow = server.connection();
        let _: String = run(&mut narrow, &["AUTH", "narrow", "x"]);
        let err = error_of(&mut narrow, &["SEM.ACQUIRE", "k", "2", "60", "ID", "b"]);
        assert!(err.starts_with("NOPERM"), "{err}");
        let err = error_of(&mut narrow, &["EVAL", ACQUIRE, "1", "k", "b"]);
        assert!(
            err.contains("NOPERM") || err.contains("no permissions"),
            "{err}"
        );
        let log: Vec<redis::Value> = run(&mut admin, &["ACL", "LOG", "1"]);
        assert!(
            format!("{log:?}").contains("k:owner"),
            "ACL LOG names the refused key: {log:?}"
        );
        assert_eq!(
            zset(&mut admin, "k").len(),
            1,
            "the refused calls changed nothing"
        );

        let id: String = run(&mut admin, &["EVAL", ACQUIRE, "1", "k", "s"]);
        assert_eq!(id, "s");
        let long = "return redis.call('SEM.ACQUIRE', KEYS[1], KEYS[2], KEYS[3], KEYS[4], \
                    KEYS[5], '3', '60', 'ID', 'l')";
        let id: String = run(
            &mut admin,
            &[
                "EVAL",
                long,
                "5",
                "k",
                "k:owner",
                "k:counter",
                "k:permits",
                "k:limit",
            ],
        );
        assert_eq!(id, "l");
        assert_eq!(zset(&mut admin, "k").len(), 3);
        alive(&mut admin);
    }
}
