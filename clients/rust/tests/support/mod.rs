//! What the sync and async suites share: the servers (with the module, or without it when
//! `REDSEM_BACKEND=scripts`), and what they look at in them.

#![allow(dead_code)] // each suite uses its own part

use std::sync::Once;
use std::time::Duration;

use crate::common::{run, wait_until, Server};
use redsem_client::Error;

/// The script the crate runs without the module.
pub const SCRIPT: &str = include_str!("../../../scripts/redsem.lua");

/// `REDSEM_BACKEND=scripts`: the servers have no module, and the crate runs the script.
pub fn scripts() -> bool {
    match std::env::var("REDSEM_BACKEND").as_deref() {
        Ok("scripts") => true,
        Ok("module") | Ok("") | Err(_) => false,
        Ok(other) => panic!("REDSEM_BACKEND is scripts or module, not {other:?}"),
    }
}

/// The harness finds the workspace's debug build through REDSEM_MODULE (its own default is
/// relative to the root crate).
pub fn find_the_module() {
    static MODULE: Once = Once::new();
    MODULE.call_once(|| {
        if std::env::var_os("REDSEM_MODULE").is_none() {
            let module = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/debug/libredsem.so"
            );
            std::env::set_var("REDSEM_MODULE", module);
        }
    });
}

/// A server with the module and `extra` arguments, or with `REDSEM_BACKEND=scripts` one
/// without it, given the `--name value` pairs of `extra` by `CONFIG SET`.
pub fn server_with(extra: &[&str]) -> Server {
    find_the_module();
    if !scripts() {
        return Server::start_with(extra);
    }
    let server = Server::start_without_module();
    let mut conn = server.connection();
    for pair in extra.chunks(2) {
        let name = pair[0].strip_prefix("--").expect("--name value");
        let _: () = run(&mut conn, &["CONFIG", "SET", name, pair[1]]);
    }
    server
}

pub fn server() -> Server {
    server_with(&["--save", "", "--appendonly", "no"])
}

pub fn client(server: &Server) -> redis::Client {
    redis::Client::open(format!("redis://127.0.0.1:{}/", server.port)).unwrap()
}

/// The script's `op` on the semaphore `name`, sent with EVAL.
pub fn script<T: redis::FromRedisValue>(
    conn: &mut redis::Connection,
    name: &str,
    op: &[&str],
) -> T {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SCRIPT).arg(6).arg(name);
    for suffix in [":owner", ":counter", ":permits", ":limit", ":wake"] {
        cmd.arg(format!("{name}{suffix}"));
    }
    cmd.arg(op)
        .query(conn)
        .unwrap_or_else(|err| panic!("the script's {op:?} failed: {err}"))
}

/// The permits of `name` in use: `SEM.GET`, or the script's `GET`.
pub fn live(conn: &mut redis::Connection, name: &str) -> i64 {
    match scripts() {
        false => run(conn, &["SEM.GET", name]),
        true => script(conn, name, &["GET"]),
    }
}

/// The calls of a command so far (`INFO commandstats`; `command|info` for a subcommand).
pub fn calls(conn: &mut redis::Connection, command: &str) -> u64 {
    let stats: String = run(conn, &["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |rest| {
            rest.split(',').next().unwrap().parse().expect("calls")
        })
}

/// The script's runs so far: EVALSHA and EVAL, the crate's and the tests' own (`live`).
pub fn script_runs(conn: &mut redis::Connection) -> u64 {
    calls(conn, "evalsha") + calls(conn, "eval")
}

/// The errors of a kind the server answered so far (`INFO errorstats`).
pub fn errors(conn: &mut redis::Connection, code: &str) -> u64 {
    let stats: String = run(conn, &["INFO", "errorstats"]);
    let prefix = format!("errorstat_{code}:count=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |count| count.trim().parse().expect("count"))
}

/// The questions whether the server has the module (`COMMAND INFO SEM.ACQUIRE`) the crate
/// asked: the script asks it too at each run (but a run refused with NOSCRIPT).
pub fn questions(conn: &mut redis::Connection) -> u64 {
    let runs = script_runs(conn) - errors(conn, "NOSCRIPT");
    calls(conn, "command|info") - runs
}

pub const SET_NEEDS: &str = "a semaphore set (SEM.ACQUIREALL)";

/// `result` is `Error::ModuleRequired(what)`, and nothing but the question whether the server
/// has the module was sent: no script ran, no key of `names` exists.
pub fn assert_module_required<T: std::fmt::Debug>(
    conn: &mut redis::Connection,
    runs_before: u64,
    result: Result<T, Error>,
    what: &str,
    names: &[&str],
) {
    match result {
        Err(err @ Error::ModuleRequired(_)) => assert_eq!(
            err.to_string(),
            format!("{what} needs the redsem module loaded in the server")
        ),
        other => panic!("{what} without the module: {other:?}"),
    }
    assert_eq!(script_runs(conn), runs_before, "{what}: a script ran");
    for name in names {
        assert_eq!(run::<i64>(conn, &["EXISTS", name]), 0, "{name}");
    }
}

/// Waits until a client waits for a permit of `name`: in the module's line, or blocked in
/// `BLPOP` (the script's waiters).
pub fn until_waiting(conn: &mut redis::Connection, name: &str, by_script: bool) {
    wait_until(
        "the waiter is in line",
        Duration::from_secs(5),
        || match by_script {
            false => run::<String>(conn, &["SEM.GET", name, "JSON"]).contains("\"waiters\":1"),
            true => run::<String>(conn, &["CLIENT", "LIST"])
                .lines()
                .any(|client| client.contains(" flags=b ") && client.contains(" cmd=blpop ")),
        },
    );
}

/// A server without the module, whatever `REDSEM_BACKEND` says.
pub fn server_without_module() -> Server {
    find_the_module();
    Server::start_without_module()
}

/// The script's `GET`, whatever `REDSEM_BACKEND` says.
pub fn live_by_script(conn: &mut redis::Connection, name: &str) -> i64 {
    script(conn, name, &["GET"])
}

/// Closes the connection whose last command was `WAIT` (a durable permit's own), from the
/// server's side.
pub fn kill_the_waits_connection(conn: &mut redis::Connection) {
    let clients: String = run(conn, &["CLIENT", "LIST"]);
    let id = clients
        .lines()
        .find(|client| client.contains(" cmd=wait "))
        .and_then(|client| client.strip_prefix("id="))
        .and_then(|rest| rest.split(' ').next())
        .expect("no connection sent WAIT")
        .to_string();
    let _: () = run(conn, &["CLIENT", "KILL", "ID", &id]);
}

/// The id of a client blocked (a waiter of the module's line, or of the script's in `BLPOP`).
pub fn blocked_client(conn: &mut redis::Connection) -> Option<String> {
    let clients: String = run(conn, &["CLIENT", "LIST"]);
    clients
        .lines()
        .find(|client| client.contains(" flags=b "))
        .and_then(|client| client.strip_prefix("id="))
        .and_then(|rest| rest.split(' ').next())
        .map(str::to_string)
}

/// Ends the wait of a blocked client with an error, as a primary turning replica does
/// (`UNBLOCKED`): whether one was blocked.
pub fn unblock_with_error(conn: &mut redis::Connection) -> bool {
    match blocked_client(conn) {
        Some(id) => run::<i64>(conn, &["CLIENT", "UNBLOCK", &id, "ERROR"]) == 1,
        None => false,
    }
}

/// Waits until a client is blocked, and ends its wait with `UNBLOCKED`.
pub fn cut_a_wait(conn: &mut redis::Connection) {
    wait_until("a client blocks", Duration::from_secs(5), || {
        unblock_with_error(conn)
    });
}
