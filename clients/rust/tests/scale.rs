//! The packages at application scale, sync and async, against a real server (with the module,
//! or without it when `REDSEM_BACKEND=scripts`), each with one client and its default
//! settings: 10,000 permits of 10,000 names held at once cost a handful of connections and
//! threads (or tasks) and at most 4 KB each, while the application's own calls answer; a
//! refresh round keeps every permit; 200 waiters of one name are all served in order.
//!
//! The tests run one at a time (they count the process's threads and allocations).

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::{run, wait_until, Server};
use support::*;

/// Counts the bytes allocated and not yet freed, to state a held permit's memory.
struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = System.realloc(ptr, layout, new_size);
        if !moved.is_null() {
            LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

const HELD: usize = 10_000;
const WAITERS: usize = 200;

/// A handful: the test's own connection, the pool's, the refresh's, a spare.
const HANDFUL: u64 = 6;

fn info_clients(conn: &mut redis::Connection, field: &str) -> u64 {
    let info: String = run(conn, &["INFO", "clients"]);
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {field} in INFO clients"))
        .trim()
        .parse()
        .expect("a count")
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// The application's own calls on the same client answer while the permits are held.
fn app_calls_answer(client: &redis::Client) {
    let mut app = client.get_connection().unwrap();
    let started = Instant::now();
    for i in 0..100 {
        let _: () = redis::cmd("SET").arg("app").arg(i).query(&mut app).unwrap();
        let got: i64 = redis::cmd("GET").arg("app").query(&mut app).unwrap();
        assert_eq!(got, i);
    }
    assert!(started.elapsed() < Duration::from_secs(2), "the app waited");
}

fn report(what: &str, per_permit: i64, conns: u64, threads: usize) {
    eprintln!("{what}: {per_permit} bytes per held permit, {conns} connections, {threads} threads");
}

#[test]
fn sync_holds_ten_thousand_permits_on_a_handful_of_connections_and_threads() {
    let _serial = one_at_a_time();
    let server = server();
    let mut conn = server.connection();
    let client = client(&server);
    let take = |name: String| {
        redsem_client::Semaphore::new(client.clone(), name)
            .limit(5)
            .lease(Duration::from_secs(30))
            .acquire()
    };
    // The client's pool and refresh thread exist from the first permit on.
    drop(take("warm-up".into()).unwrap());
    let threads_before = threads();
    let bytes_before = LIVE_BYTES.load(Ordering::SeqCst);
    let mut permits = Vec::new();
    for i in 0..HELD {
        permits.push(take(format!("n{i}")).unwrap());
    }
    let per_permit = (LIVE_BYTES.load(Ordering::SeqCst) - bytes_before) / HELD as i64;
    let conns = info_clients(&mut conn, "connected_clients");
    report("sync", per_permit, conns, threads());
    assert!(conns <= HANDFUL, "{conns} connections");
    assert!(threads() <= threads_before + 1, "{} threads", threads());
    assert!(per_permit <= 4096, "{per_permit} bytes per permit");
    app_calls_answer(&client);
    assert_eq!(live(&mut conn, "n0"), 1);
    assert_eq!(live(&mut conn, &format!("n{}", HELD - 1)), 1);
    for permit in permits {
        assert!(permit.release().unwrap());
    }
    assert_eq!(live(&mut conn, "n0"), 0);
    assert!(info_clients(&mut conn, "connected_clients") <= HANDFUL);
}

#[test]
fn aio_holds_ten_thousand_permits_on_a_handful_of_connections_and_tasks() {
    let _serial = one_at_a_time();
    let server = server();
    let mut conn = server.connection();
    let client = client(&server);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let take = |name: String| {
            redsem_client::aio::Semaphore::new(client.clone(), name)
                .limit(5)
                .lease(Duration::from_secs(30))
        };
        take("warm-up".into())
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let threads_before = threads();
        let bytes_before = LIVE_BYTES.load(Ordering::SeqCst);
        let mut permits = Vec::new();
        for i in 0..HELD {
            permits.push(take(format!("n{i}")).acquire().await.unwrap());
        }
        let per_permit = (LIVE_BYTES.load(Ordering::SeqCst) - bytes_before) / HELD as i64;
        let conns = info_clients(&mut conn, "connected_clients");
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        report("aio", per_permit, conns, threads());
        eprintln!("aio: {tasks} tasks");
        assert!(conns <= HANDFUL, "{conns} connections");
        assert!(threads() <= threads_before, "{} threads", threads());
        // The refresh task and the shared connection's.
        assert!(tasks <= 3, "{tasks} tasks");
        assert!(per_permit <= 4096, "{per_permit} bytes per permit");
        app_calls_answer(&client);
        let mut app = client.get_multiplexed_async_connection().await.unwrap();
        for i in 0..100 {
            let _: () = redis::cmd("SET")
                .arg("app")
                .arg(i)
                .query_async(&mut app)
                .await
                .unwrap();
        }
        assert_eq!(live(&mut conn, &format!("n{}", HELD - 1)), 1);
        for permit in permits {
            assert!(permit.release().await.unwrap());
        }
        assert_eq!(live(&mut conn, "n0"), 0);
    });
}

const ROUND: usize = 1_000;
/// Refreshed every 500 ms.
const SHORT_LEASE: Duration = Duration::from_millis(1500);

/// The refreshes sent so far: the module's, or the script's runs.
fn refreshes(conn: &mut redis::Connection) -> u64 {
    match scripts() {
        false => calls(conn, "sem.refresh"),
        true => script_runs(conn),
    }
}

/// Every permit is still held once more than a lease has passed: the refresh rounds (one
/// thread or task for all) came in time.
fn assert_all_held(conn: &mut redis::Connection, refreshed_before: u64) {
    let refreshed = refreshes(conn) - refreshed_before;
    assert!(refreshed >= 2 * ROUND as u64, "{refreshed} refreshes");
    for i in 0..ROUND {
        assert_eq!(live(conn, &format!("r{i}")), 1, "r{i} was lost");
    }
}

#[test]
fn sync_refresh_rounds_keep_every_permit() {
    let _serial = one_at_a_time();
    let server = server();
    let mut conn = server.connection();
    let client = client(&server);
    let mut permits = Vec::new();
    for i in 0..ROUND {
        let permit = redsem_client::Semaphore::new(client.clone(), format!("r{i}"))
            .limit(5)
            .lease(SHORT_LEASE)
            .acquire()
            .unwrap();
        permits.push(permit);
    }
    let before = refreshes(&mut conn);
    thread::sleep(SHORT_LEASE + Duration::from_millis(700));
    assert!(permits.iter().all(|permit| !permit.is_lost()));
    assert_all_held(&mut conn, before);
    for permit in permits {
        assert!(permit.release().unwrap());
    }
}

#[test]
fn aio_refresh_rounds_keep_every_permit() {
    let _serial = one_at_a_time();
    let server = server();
    let mut conn = server.connection();
    let client = client(&server);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut permits = Vec::new();
        for i in 0..ROUND {
            let permit = redsem_client::aio::Semaphore::new(client.clone(), format!("r{i}"))
                .limit(5)
                .lease(SHORT_LEASE)
                .acquire()
                .await
                .unwrap();
            permits.push(permit);
        }
        let before = refreshes(&mut conn);
        tokio::time::sleep(SHORT_LEASE + Duration::from_millis(700)).await;
        assert!(permits.iter().all(|permit| !permit.is_lost()));
        assert_all_held(&mut conn, before);
        for permit in permits {
            assert!(permit.release().await.unwrap());
        }
    });
}

/// Waits until `n` clients are blocked (the module's waiters, or the script's in `BLPOP`).
fn until_blocked(conn: &mut redis::Connection, n: u64) {
    wait_until(&format!("{n} blocked"), Duration::from_secs(10), || {
        info_clients(conn, "blocked_clients") >= n
    });
}

/// What a waiters' run shows: the order served, and the slowest release.
struct Served {
    order: Mutex<Vec<usize>>,
    slowest_release: Mutex<Duration>,
}

impl Served {
    fn new() -> Arc<Served> {
        Arc::new(Served {
            order: Mutex::new(Vec::new()),
            slowest_release: Mutex::new(Duration::ZERO),
        })
    }

    fn released_in(&self, took: Duration) {
        let mut slowest = self.slowest_release.lock().unwrap();
        *slowest = (*slowest).max(took);
    }

    /// All served in the order they came, each release answered within milliseconds.
    fn check(&self, conn: &mut redis::Connection) {
        let order = self.order.lock().unwrap().clone();
        assert_eq!(order, (0..WAITERS).collect::<Vec<_>>());
        let slowest = *self.slowest_release.lock().unwrap();
        eprintln!("the slowest release of {WAITERS} waiters took {slowest:?}");
        // Milliseconds; the bound leaves room for a busy machine's pauses.
        assert!(
            slowest < Duration::from_secs(1),
            "a release took {slowest:?}"
        );
        assert_eq!(live(conn, "line"), 0);
        // Waiting took a connection per waiter only while it waited.
        let conns = info_clients(conn, "connected_clients");
        assert!(conns <= 2 * HANDFUL, "{conns} connections after the waits");
    }
}

fn line_server() -> (Server, redis::Connection, redis::Client) {
    let server = server();
    let conn = server.connection();
    let client = client(&server);
    (server, conn, client)
}

/// While the waiters wait: one connection each and no more, and the application answers.
fn while_waiting(conn: &mut redis::Connection, client: &redis::Client) {
    let conns = info_clients(conn, "connected_clients");
    assert!(
        conns <= WAITERS as u64 + HANDFUL,
        "{conns} connections for {WAITERS} waiters"
    );
    app_calls_answer(client);
}

#[test]
fn sync_two_hundred_waiters_are_served_in_order() {
    let _serial = one_at_a_time();
    let (_server, mut conn, client) = line_server();
    let holder = redsem_client::Semaphore::new(client.clone(), "line")
        .acquire()
        .unwrap();
    let served = Served::new();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let semaphore = redsem_client::Semaphore::new(client.clone(), "line")
            .wait(Some(Duration::from_secs(10)));
        let served = Arc::clone(&served);
        waiters.push(thread::spawn(move || {
            let permit = semaphore.acquire().unwrap();
            served.order.lock().unwrap().push(i);
            thread::sleep(Duration::from_millis(20));
            let started = Instant::now();
            assert!(permit.release().unwrap());
            served.released_in(started.elapsed());
        }));
        until_blocked(&mut conn, i as u64 + 1);
    }
    while_waiting(&mut conn, &client);
    assert!(holder.release().unwrap());
    for waiter in waiters {
        waiter.join().unwrap();
    }
    served.check(&mut conn);
}

#[test]
fn aio_two_hundred_waiters_are_served_in_order() {
    let _serial = one_at_a_time();
    let (_server, mut conn, client) = line_server();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let holder = redsem_client::aio::Semaphore::new(client.clone(), "line")
            .acquire()
            .await
            .unwrap();
        let served = Served::new();
        let mut waiters = Vec::new();
        for i in 0..WAITERS {
            let semaphore = redsem_client::aio::Semaphore::new(client.clone(), "line")
                .wait(Some(Duration::from_secs(10)));
            let served = Arc::clone(&served);
            waiters.push(tokio::spawn(async move {
                let permit = semaphore.acquire().await.unwrap();
                served.order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(20)).await;
                let started = Instant::now();
                assert!(permit.release().await.unwrap());
                served.released_in(started.elapsed());
            }));
            until_blocked(&mut conn, i as u64 + 1);
        }
        while_waiting(&mut conn, &client);
        assert!(holder.release().await.unwrap());
        for waiter in waiters {
            waiter.await.unwrap();
        }
        served.check(&mut conn);
    });
}
