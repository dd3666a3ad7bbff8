//! Waiting, as the module waits: first come first served, a lease's end and a release seen at
//! once, memory full, the module loaded under running clients, connections reused, a waiter
//! that dies. With the module, or with `REDSEM_BACKEND=scripts` the script's line (its waiting
//! loop: LINE, the waiter's own list, TICK, LEAVE); the tests named `without_the_module_...`
//! start a server without the module either way.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{run, wait_until};
use redsem_client::{aio, Error, Semaphore};
use support::*;

/// The waiters in `name`'s line: the module's, or the script's (`<name>:line`).
fn in_line(conn: &mut redis::Connection, name: &str) -> u64 {
    match scripts() {
        false => common::waiters_in_line(conn, name),
        true => run(conn, &["ZCARD", &format!("{name}:line")]),
    }
}

fn until_in_line(conn: &mut redis::Connection, name: &str, n: u64) {
    wait_until(
        &format!("{n} in line for {name}"),
        Duration::from_secs(10),
        || in_line(conn, name) == n,
    );
}

/// `CONFIG SET name value` until dropped (the value before is set again, even on a panic).
struct Config<'a> {
    conn: &'a mut redis::Connection,
    before: Vec<(String, String)>,
}

impl<'a> Config<'a> {
    fn set(conn: &'a mut redis::Connection, pairs: &[(&str, &str)]) -> Self {
        let mut before = Vec::new();
        for (name, value) in pairs {
            let got: Vec<String> = run(conn, &["CONFIG", "GET", name]);
            before.push((name.to_string(), got[1].clone()));
            let _: () = run(conn, &["CONFIG", "SET", name, value]);
        }
        Config { conn, before }
    }
}

impl Drop for Config<'_> {
    fn drop(&mut self) {
        for (name, value) in self.before.iter().rev() {
            let _: () = run(self.conn, &["CONFIG", "SET", name, value]);
        }
    }
}

/// Six waiters arriving 30 ms apart are granted in the order they came, fair or plain.
#[test]
fn first_come_first_served() {
    let server = server();
    let mut conn = server.connection();
    for fair in [true, false] {
        let name = format!("fcfs-{fair}");
        let sem = Semaphore::new(client(&server), name.clone())
            .fair(fair)
            .wait(Some(Duration::from_secs(20)));
        let holder = sem.clone().wait(None).acquire().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for n in 0..6 {
            let (sem, order) = (sem.clone(), order.clone());
            waiters.push(thread::spawn(move || {
                let permit = sem.acquire().unwrap();
                order.lock().unwrap().push(n);
                assert!(permit.release().unwrap());
            }));
            until_in_line(&mut conn, &name, n + 1);
            thread::sleep(Duration::from_millis(30));
        }
        assert!(holder.release().unwrap());
        for waiter in waiters {
            waiter.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4, 5], "fair: {fair}");
        assert_eq!(live(&mut conn, &name), 0);
    }
}

/// At `hz 1` the server's own timeouts fire up to a second late: a lease's end is still seen
/// at once (the client sends TICK then), and a release serves the waiter at once.
#[test]
fn a_lease_end_and_a_release_serve_a_waiter_at_once_at_hz_1() {
    let server = server();
    let mut conn = server.connection();
    let mut admin = server.connection();
    let _hz = Config::set(&mut admin, &[("hz", "1")]);
    let sem = Semaphore::new(client(&server), "jobs");
    let lease = Duration::from_millis(300);
    let holder = sem
        .clone()
        .lease(lease)
        .auto_refresh(false)
        .acquire()
        .unwrap();
    let lease_end = Instant::now() + lease; // the server's deadline is at most this
    let permit = sem
        .clone()
        .wait(Some(Duration::from_secs(5)))
        .acquire()
        .unwrap();
    let late = Instant::now().saturating_duration_since(lease_end);
    assert!(
        late < Duration::from_millis(150),
        "{late:?} after the lease"
    );
    assert!(!holder.release().unwrap());

    let waiting = {
        let sem = sem.clone().wait(Some(Duration::from_secs(5)));
        thread::spawn(move || (sem.acquire(), Instant::now()))
    };
    until_in_line(&mut conn, "jobs", 1);
    assert!(permit.release().unwrap());
    let released = Instant::now();
    let (served, at) = waiting.join().unwrap();
    let late = at.saturating_duration_since(released);
    assert!(
        late < Duration::from_millis(50),
        "{late:?} after the release"
    );
    assert!(served.unwrap().release().unwrap());
}

/// Every key of the server and its contents (`DUMP`).
fn contents(conn: &mut redis::Connection) -> Vec<(String, Vec<u8>)> {
    let mut keys: Vec<String> = run(conn, &["KEYS", "*"]);
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let dump: Vec<u8> = run(conn, &["DUMP", &key]);
            (key, dump)
        })
        .collect()
}

/// Memory full: a refresh and a release work, a new acquire (waiting or not) is refused with
/// the server's OOM error and changes nothing.
#[test]
fn memory_full_refuses_newcomers_but_not_holders() {
    let server = server();
    let mut conn = server.connection();
    let mut admin = server.connection();
    let sem = Semaphore::new(client(&server), "jobs").limit(3).fair(true);
    let holder = sem.acquire().unwrap();
    let other = sem.clone().acquire().unwrap();
    let full = Config::set(
        &mut admin,
        &[("maxmemory-policy", "noeviction"), ("maxmemory", "1")],
    );
    let before = contents(&mut conn);
    for wait in [None, Some(Duration::from_millis(300))] {
        match sem.clone().wait(wait).acquire() {
            Err(Error::Redis(err)) => {
                assert_eq!(err.code(), Some("OOM"), "{err}");
                assert!(
                    err.to_string()
                        .contains("command not allowed when used memory > 'maxmemory'"),
                    "{err}"
                );
            }
            other => panic!("an acquire with memory full: {other:?}"),
        }
    }
    assert_eq!(contents(&mut conn), before);
    assert!(holder.refresh().unwrap());
    assert!(holder.release().unwrap());
    assert!(other.release().unwrap());
    drop(full);
    assert_eq!(live(&mut conn, "jobs"), 0);
}

/// 50 waits that each block reuse the same few connections.
#[test]
fn waits_reuse_connections() {
    let server = server();
    let mut conn = server.connection();
    let sem = Semaphore::new(client(&server), "jobs");
    let before = connections(&mut conn);
    for _ in 0..50 {
        let holder = sem.acquire().unwrap();
        let leaving = thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            holder.release().unwrap()
        });
        let started = Instant::now();
        let permit = sem
            .clone()
            .wait(Some(Duration::from_secs(5)))
            .acquire()
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(5), "no wait");
        assert!(leaving.join().unwrap());
        assert!(permit.release().unwrap());
    }
    let made = connections(&mut conn) - before;
    assert!(made <= 4, "{made} connections for 50 waits");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let before = connections(&mut conn);
    rt.block_on(async {
        let target = aio::Target::from(client(&server));
        let sem = aio::Semaphore::new(&target, "jobs");
        for _ in 0..50 {
            let holder = sem.acquire().await.unwrap();
            let leaving = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                holder.release().await.unwrap()
            });
            let started = Instant::now();
            let permit = sem
                .clone()
                .wait(Some(Duration::from_secs(5)))
                .acquire()
                .await
                .unwrap();
            assert!(started.elapsed() >= Duration::from_millis(5), "no wait");
            assert!(leaving.await.unwrap());
            assert!(permit.release().await.unwrap());
        }
    });
    // The shared connection and the pool's.
    let made = connections(&mut conn) - before;
    assert!(made <= 1 + 4, "{made} connections for 50 async waits");
}

/// `total_connections_received`.
fn connections(conn: &mut redis::Connection) -> u64 {
    let stats: String = run(conn, &["INFO", "stats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A waiter that dies in line (its attempts stop, it never leaves) holds its place 6 s after
/// its last attempt: the waiter behind it is served at its next attempt after that.
#[test]
fn without_the_module_a_dead_waiter_leaves_the_line() {
    let server = server_without_module();
    let mut conn = server.connection();
    let sem = Semaphore::new(client(&server), "jobs").limit(2);
    let holder = sem.acquire().unwrap();
    // Two permits it never comes back for: it does not fit while the holder holds one.
    let reply: Vec<redis::Value> = script(
        &mut conn,
        "jobs",
        &["ACQUIRE", "2", "30", "ID", "dead", "COUNT", "2", "LINE"],
    );
    let died = Instant::now();
    assert_eq!(reply[0], redis::Value::Nil);
    let permit = sem
        .clone()
        .wait(Some(Duration::from_secs(20)))
        .acquire()
        .unwrap();
    let waited = died.elapsed();
    assert!(
        waited >= Duration::from_millis(5500) && waited < Duration::from_millis(9000),
        "{waited:?}"
    );
    assert_eq!(live_by_script(&mut conn, "jobs"), 2);
    assert!(permit.release().unwrap());
    assert!(holder.release().unwrap());
}

/// The module loaded under running clients: one made before (on the script) and one made
/// after (on the module) share a semaphore; a release through the script serves the module's
/// waiter at once, the script's waiter is told and goes on with the module, and the client
/// made before is on the module within 10 s.
#[test]
fn without_the_module_then_loaded_under_running_clients() {
    if std::env::var_os("REDSEM_MODULE").is_none() {
        eprintln!("REDSEM_MODULE is not set: skipped");
        return;
    }
    let server = server_without_module();
    let mut conn = server.connection();
    let a = Semaphore::new(client(&server), "jobs").lease(Duration::from_secs(30));
    let holder = a.acquire().unwrap();
    let a_waiting = {
        let a = a.clone().wait(Some(Duration::from_secs(20)));
        thread::spawn(move || (a.acquire(), Instant::now()))
    };
    until_in_line_by_script(&mut conn, "jobs");
    let module = common::module_path();
    let _: () = run(&mut conn, &["MODULE", "LOAD", module.to_str().unwrap()]);
    let loaded = Instant::now();

    // (a) B, made after the load, waits with the module; A's release through the script
    // (A still believes the server has no module) serves it at once.
    let b = Semaphore::new(client(&server), "jobs").wait(Some(Duration::from_secs(20)));
    let b_waiting = thread::spawn(move || (b.acquire(), Instant::now()));
    common::until_in_line(&mut conn, "jobs", 1);
    let runs = script_runs(&mut conn);
    assert!(holder.release().unwrap());
    let released = Instant::now();
    assert!(script_runs(&mut conn) > runs, "released by the script");
    let (b_permit, served) = b_waiting.join().unwrap();
    let b_permit = b_permit.unwrap();
    let late = served.saturating_duration_since(released);
    assert!(late < Duration::from_millis(300), "{late:?}");

    // (b) A's script waiter was told: it waits with the module now, and is served next.
    common::until_in_line(&mut conn, "jobs", 1);
    let acquires = calls(&mut conn, "sem.acquire");
    assert!(b_permit.release().unwrap());
    let (a_permit, _) = a_waiting.join().unwrap();
    let a_permit = a_permit.unwrap();
    assert!(a_permit.release().unwrap());
    // A is on the module: its BOUND acquire (module only) works, as SEM.ACQUIRE.
    let bound = a.clone().bound(true).acquire().unwrap();
    assert!(calls(&mut conn, "sem.acquire") > acquires);
    assert!(bound.release().unwrap());
    assert!(loaded.elapsed() < Duration::from_secs(10));
    assert_eq!(run::<i64>(&mut conn, &["SEM.GET", "jobs"]), 0);
}

fn until_in_line_by_script(conn: &mut redis::Connection, name: &str) {
    wait_until("the script's waiter", Duration::from_secs(5), || {
        run::<i64>(conn, &["ZCARD", &format!("{name}:line")]) == 1
    });
}

/// The async API waits the same way: first come first served, a lease's end seen at once.
#[tokio::test(flavor = "multi_thread")]
async fn async_first_come_first_served_and_a_lease_end() {
    let server = server();
    let mut conn = server.connection();
    let target = aio::Target::from(client(&server));
    let sem = aio::Semaphore::new(&target, "jobs")
        .fair(true)
        .wait(Some(Duration::from_secs(20)));
    let holder = sem.clone().wait(None).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for n in 0..6 {
        let (sem, order) = (sem.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire().await.unwrap();
            order.lock().unwrap().push(n);
            assert!(permit.release().await.unwrap());
        }));
        until_in_line(&mut conn, "jobs", n + 1);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(holder.release().await.unwrap());
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4, 5]);

    let mut admin = server.connection();
    let _hz = Config::set(&mut admin, &[("hz", "1")]);
    let lease = Duration::from_millis(300);
    let holder = sem
        .clone()
        .wait(None)
        .lease(lease)
        .auto_refresh(false)
        .acquire()
        .await
        .unwrap();
    let lease_end = Instant::now() + lease;
    let permit = sem.acquire().await.unwrap();
    let late = Instant::now().saturating_duration_since(lease_end);
    assert!(
        late < Duration::from_millis(150),
        "{late:?} after the lease"
    );
    assert!(!holder.release().await.unwrap());
    assert!(permit.release().await.unwrap());
}

/// A waiting acquire dropped while in the script's line leaves it: the next waiter is not
/// held up behind it.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_module_a_dropped_wait_leaves_the_line() {
    let server = server_without_module();
    let mut conn = server.connection();
    let target = aio::Target::from(client(&server));
    let sem = aio::Semaphore::new(&target, "jobs").limit(2);
    let holder = sem.acquire().await.unwrap();
    let two = sem.clone().count(2).wait(Some(Duration::from_secs(20)));
    let dropped = tokio::spawn(async move { two.acquire().await });
    until_in_line_by_script(&mut conn, "jobs");
    dropped.abort();
    let _ = dropped.await;
    wait_until("the dropped waiter left", Duration::from_secs(2), || {
        run::<i64>(&mut conn, &["ZCARD", "jobs:line"]) == 0
    });
    let started = Instant::now();
    let permit = sem
        .clone()
        .wait(Some(Duration::from_secs(5)))
        .acquire()
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(permit.release().await.unwrap());
    assert!(holder.release().await.unwrap());
}

/// A lease no server takes is refused by name before anything is sent.
#[test]
fn a_zero_or_infinite_lease_is_refused_before_anything_is_sent() {
    let server = server();
    let mut conn = server.connection();
    let before = calls(&mut conn, "command|info");
    for lease in [Duration::ZERO, Duration::MAX] {
        match Semaphore::new(client(&server), "jobs")
            .lease(lease)
            .acquire()
        {
            Err(err @ Error::BadArgument { name: "lease", .. }) => {
                assert!(err.to_string().starts_with("lease must be "), "{err}")
            }
            other => panic!("lease {lease:?}: {other:?}"),
        }
    }
    let set = redsem_client::SemaphoreSet::new(client(&server))
        .semaphore("jobs", 1, 1)
        .lease(Duration::ZERO);
    assert!(matches!(
        set.acquire(),
        Err(Error::BadArgument { name: "lease", .. })
    ));
    assert_eq!(calls(&mut conn, "command|info"), before);
    assert_eq!(run::<i64>(&mut conn, &["DBSIZE"]), 0);
}

/// A client that found no module asks again once that answer is 10 s old: its permit's
/// release, the first call after that, is the module's own command.
#[test]
fn without_the_module_a_client_asks_again_after_10_s() {
    if std::env::var_os("REDSEM_MODULE").is_none() {
        eprintln!("REDSEM_MODULE is not set: skipped");
        return;
    }
    let server = server_without_module();
    let mut conn = server.connection();
    let permit = Semaphore::new(client(&server), "jobs")
        .lease(Duration::from_secs(60))
        .auto_refresh(false)
        .acquire()
        .unwrap();
    let asked = Instant::now();
    let module = common::module_path();
    let _: () = run(&mut conn, &["MODULE", "LOAD", module.to_str().unwrap()]);
    assert!(permit.refresh().unwrap()); // within 10 s: by the script (which calls the module)
    let runs = script_runs(&mut conn);
    let asked_before = questions(&mut conn);
    thread::sleep(Duration::from_secs(10).saturating_sub(asked.elapsed()));
    assert!(permit.release().unwrap());
    assert_eq!(script_runs(&mut conn), runs);
    assert_eq!(calls(&mut conn, "sem.release"), 1);
    assert_eq!(questions(&mut conn), asked_before + 1);
}
