//! The async API (redsem_client::aio, on tokio) against a real redis-server: the same
//! behaviours as the sync suite's main cases, with the module or, with
//! `REDSEM_BACKEND=scripts`, without it (then what needs the module asserts
//! `Error::ModuleRequired`).

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::time::{Duration, Instant};

use common::{run, wait_until, zset, FirstGrant};
use redsem_client::aio::{self, Semaphore, SemaphoreSet, Target};
use redsem_client::Error;
use support::*;

#[tokio::test(flavor = "multi_thread")]
async fn grant_release_and_the_limit() {
    let server = server();
    let mut conn = server.connection();
    let jobs = Semaphore::new(client(&server), "jobs").limit(2);
    let first = jobs.acquire().await.unwrap();
    let second = jobs.acquire().await.unwrap();
    assert_ne!(first.id(), second.id());
    assert_eq!(first.ticket(), None);
    let started = Instant::now();
    assert!(matches!(jobs.acquire().await, Err(Error::NotAcquired)));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(live(&mut conn, "jobs"), 2);

    assert!(first.release().await.unwrap());
    assert_eq!(live(&mut conn, "jobs"), 1);
    assert!(second.release().await.unwrap());
    assert_eq!(live(&mut conn, "jobs"), 0);
    assert_eq!(run::<i64>(&mut conn, &["EXISTS", "jobs"]), 0);
    // One question whether the server has the module for the three acquires.
    assert_eq!(questions(&mut conn), 1);
    assert_eq!(
        calls(&mut conn, "sem.acquire"),
        if scripts() { 0 } else { 3 }
    );
    assert_eq!(calls(&mut conn, "evalsha") > 0, scripts());
}

/// The async example of clients/rust/README.md, but for the server's address.
async fn readme_async_example(url: &str) -> Result<(), Error> {
    // README async example begins
    let client = redis::Client::open(url)?;
    // The calls that do not block share this connection; a waiting acquire blocks one of a
    // small pool, a bound acquire one of its own.
    let target = redsem_client::aio::Target::with_manager(
        client.clone(),
        client.get_connection_manager().await?,
    );
    let jobs = redsem_client::aio::Semaphore::new(&target, "jobs")
        .limit(3)
        .wait(Some(Duration::from_secs(10)));
    let permit = jobs.acquire().await?;
    // at most 3 holders here; the client's tokio task refreshes the lease every lease/3
    assert!(permit.release().await?, "the lease ran out during the work");
    // README async example ends
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_async_example() {
    let server = server();
    let mut conn = server.connection();
    readme_async_example(&format!("redis://127.0.0.1:{}/", server.port))
        .await
        .unwrap();
    assert_eq!(live(&mut conn, "jobs"), 0);
    let this_file = include_str!("aio.rs");
    let begin = this_file.find("// README async example begins\n").unwrap();
    let end = this_file.find("    // README async example ends").unwrap();
    let example: String = this_file[begin..end]
        .lines()
        .skip(1)
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
        .collect();
    let example = example.replace("open(url)", "open(\"redis://127.0.0.1:6379/\")");
    assert!(
        include_str!("../README.md").contains(&example),
        "clients/rust/README.md lacks:\n{example}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wait_times_out_or_is_served_when_a_holder_leaves() {
    let server = server();
    let mut conn = server.connection();
    let jobs = Semaphore::new(client(&server), "jobs").limit(1);
    let holder = jobs.acquire().await.unwrap();

    let started = Instant::now();
    let waiting = jobs.clone().wait(Some(Duration::from_millis(300)));
    assert!(matches!(waiting.acquire().await, Err(Error::NotAcquired)));
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5));

    let leaving = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.release().await.unwrap()
    });
    let permit = jobs
        .clone()
        .wait(Some(Duration::MAX))
        .acquire()
        .await
        .unwrap();
    assert!(leaving.await.unwrap());
    assert_eq!(zset(&mut conn, "jobs")[0].0, permit.id());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_blocks_a_connection_of_its_own_not_the_shared_one() {
    let server = server();
    let mut conn = server.connection();
    let client = client(&server);
    let shared = client.get_multiplexed_async_connection().await.unwrap();
    let target = Target::with_connection(client.clone(), shared);
    let jobs = Semaphore::new(&target, "jobs");
    let holder = jobs.acquire().await.unwrap();
    let waiting = jobs.clone().wait(Some(Duration::from_secs(10)));
    let waiter = tokio::spawn(async move { waiting.acquire().await });
    until_waiting(&mut conn, "jobs", scripts());
    // The shared connection answers at once while the waiter blocks.
    let started = Instant::now();
    assert_eq!(aio::in_use(&target, "jobs").await.unwrap(), 1);
    assert!(holder.refresh().await.unwrap());
    assert!(started.elapsed() < Duration::from_millis(500));
    // Two connections: the shared one and the waiter's (and this test's own).
    let clients: String = run(&mut conn, &["CLIENT", "LIST"]);
    assert_eq!(clients.lines().count(), 3, "{clients}");
    assert!(holder.release().await.unwrap());
    let permit = waiter.await.unwrap().unwrap();
    assert!(permit.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn refresh_keeps_a_short_lease_alive_and_a_removed_permit_is_lost() {
    let server = server();
    let mut conn = server.connection();
    let jobs = Semaphore::new(client(&server), "jobs").lease(Duration::from_millis(600));
    let permit = jobs.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await; // more than three leases
    assert!(!permit.is_lost());
    assert_eq!(zset(&mut conn, "jobs")[0].0, permit.id());
    assert!(permit.release().await.unwrap());

    let permit = jobs.acquire().await.unwrap();
    let _: i64 = run(&mut conn, &["DEL", "jobs"]);
    let started = Instant::now();
    while !permit.is_lost() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not reported lost"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(permit.check(), Err(Error::Lost)));
    assert!(!permit.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_that_runs_out_during_the_work_is_reported_at_release() {
    let server = server();
    let mut conn = server.connection();
    let permit = Semaphore::new(client(&server), "jobs")
        .lease(Duration::from_millis(200))
        .auto_refresh(false)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!permit.release().await.unwrap());
    assert_eq!(live(&mut conn, "jobs"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_permit_dropped_unreleased_is_given_back_by_a_task() {
    let server = server();
    let mut conn = server.connection();
    let permit = Semaphore::new(client(&server), "jobs")
        .acquire()
        .await
        .unwrap();
    assert_eq!(live(&mut conn, "jobs"), 1);
    drop(permit);
    let started = Instant::now();
    while live(&mut conn, "jobs") != 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fair_permits_carry_growing_tickets_count_and_identifier() {
    let server = server();
    let mut conn = server.connection();
    let printers = Semaphore::new(client(&server), "printers")
        .limit(2)
        .fair(true);
    // With the module a fresh name's first ticket is the clock of its grant in microseconds,
    // the next one up by one (the script's: each above the last).
    let fresh = (!scripts()).then(|| FirstGrant::before(&mut conn));
    let first = printers.acquire().await.unwrap();
    let second = printers.acquire().await.unwrap();
    let (one, two) = (first.ticket().unwrap(), second.ticket().unwrap());
    if let Some(fresh) = fresh {
        fresh.ticket(&mut conn, one as i64);
        assert_eq!(two, one + 1);
    }
    assert!(two > one);
    assert!(first.release().await.unwrap() && second.release().await.unwrap());
    let third = printers.acquire().await.unwrap();
    assert!(third.ticket().unwrap() > two);
    assert!(third.release().await.unwrap());

    let gpus = Semaphore::new(client(&server), "gpus").limit(4);
    let mut big = gpus.clone().count(3).acquire().await.unwrap();
    assert_eq!(live(&mut conn, "gpus"), 3);
    assert!(matches!(
        gpus.clone().count(2).acquire().await,
        Err(Error::NotAcquired)
    ));
    assert!(matches!(
        big.release_some(3).await,
        Err(Error::BadCount { held: 3 })
    ));
    assert!(big.release_some(2).await.unwrap());
    assert_eq!((big.count(), live(&mut conn, "gpus")), (1, 1));
    assert!(big.release().await.unwrap());

    let named = Semaphore::new(client(&server), "jobs")
        .id("worker-7")
        .acquire()
        .await
        .unwrap();
    assert_eq!(named.id(), "worker-7");
    assert_eq!(zset(&mut conn, "jobs")[0].0, "worker-7");
    assert!(named.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bound_permit_is_given_back_when_its_connection_closes() {
    let server = server();
    let mut conn = server.connection();
    let bound = Semaphore::new(client(&server), "jobs")
        .lease(Duration::from_secs(3))
        .bound(true);
    if scripts() {
        assert_module_required(&mut conn, 0, bound.acquire().await, "BOUND", &["jobs"]);
        return;
    }
    let permit = bound.acquire().await.unwrap();
    assert_eq!(live(&mut conn, "jobs"), 1);
    let _: i64 = run(
        &mut conn,
        &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
    );
    wait_until(
        "the server gives the permit back",
        Duration::from_secs(2),
        || live(&mut conn, "jobs") == 0,
    );
    let started = Instant::now();
    while !permit.is_lost() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not reported lost"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!permit.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn durable_waits_for_replicas_and_gives_back_a_grant_they_missed() {
    let primary = server_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--repl-diskless-sync-delay",
        "0",
    ]);
    let replica = common::start_replica_of(&primary);
    let mut replica_conn = replica.connection();
    let mut conn = primary.connection();
    let jobs = Semaphore::new(client(&primary), "jobs");
    let permit = jobs
        .clone()
        .durable(1, Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert_eq!(zset(&mut replica_conn, "jobs")[0].0, permit.id());
    assert!(permit.release().await.unwrap());

    let refused = jobs.durable(2, Duration::from_millis(200)).acquire().await;
    assert!(matches!(
        refused,
        Err(Error::NotDurable {
            acked: 1,
            wanted: 2
        })
    ));
    assert_eq!(live(&mut conn, "jobs"), 0);
}

fn pair(target: &Target) -> SemaphoreSet {
    SemaphoreSet::new(target)
        .semaphore("gpu", 2, 1)
        .semaphore("licence", 5, 3)
}

#[tokio::test(flavor = "multi_thread")]
async fn sets_are_granted_whole_waited_for_and_given_back_whole() {
    let server = server();
    let mut conn = server.connection();
    let target = Target::from(client(&server));
    if scripts() {
        let result = pair(&target).acquire().await;
        assert_module_required(&mut conn, 0, result, SET_NEEDS, &["gpu", "licence"]);
        return;
    }
    let fresh = FirstGrant::before(&mut conn);
    let permits = pair(&target).fair(true).acquire().await.unwrap();
    assert_eq!(permits.names(), ["gpu", "licence"]);
    assert_eq!(permits.counts(), [1, 3]);
    // Two fresh names granted in one step: the clock of that step (or the node's floor), then
    // the next one up, in the order named.
    let tickets = permits.tickets().expect("fair tickets").to_vec();
    assert_eq!(tickets.len(), 2);
    assert_eq!(tickets[1], tickets[0] + 1);
    fresh.ticket(&mut conn, tickets[0] as i64);
    assert_eq!((live(&mut conn, "gpu"), live(&mut conn, "licence")), (1, 3));
    assert!(permits.refresh().await.unwrap());
    assert!(permits.release().await.unwrap());
    assert_eq!((live(&mut conn, "gpu"), live(&mut conn, "licence")), (0, 0));

    // A waiting set is granted when a member is freed.
    let holder = Semaphore::new(&target, "licence")
        .limit(5)
        .count(3)
        .acquire()
        .await
        .unwrap();
    let short = pair(&target).wait(Some(Duration::from_millis(200)));
    assert!(matches!(short.acquire().await, Err(Error::NotAcquired)));
    let leaving = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.release().await.unwrap()
    });
    let permits = pair(&target)
        .wait(Some(Duration::from_secs(10)))
        .acquire()
        .await
        .unwrap();
    assert!(leaving.await.unwrap());
    assert_eq!(zset(&mut conn, "gpu")[0].0, permits.id());
    assert!(permits.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_empty_is_true_once_the_holders_leave_and_false_at_the_timeout() {
    let server = server();
    let target = Target::from(client(&server));
    if scripts() {
        let mut conn = server.connection();
        let result = aio::wait_empty(&target, "jobs", Duration::from_secs(10)).await;
        assert_module_required(&mut conn, 0, result, "SEM.WAITEMPTY", &["jobs"]);
        return;
    }
    assert!(aio::wait_empty(&target, "jobs", Duration::from_secs(10))
        .await
        .unwrap());
    let holder = Semaphore::new(&target, "jobs")
        .limit(3)
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    assert!(
        !aio::wait_empty(&target, "jobs", Duration::from_millis(300))
            .await
            .unwrap()
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(!aio::wait_empty(&target, "jobs", Duration::ZERO)
        .await
        .unwrap());
    let leaving = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.release().await.unwrap()
    });
    assert!(aio::wait_empty(&target, "jobs", Duration::MAX)
        .await
        .unwrap());
    assert!(leaving.await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operators_limit_is_stored_used_by_every_acquire_and_cleared() {
    let server = server();
    let mut conn = server.connection();
    let target = Target::from(client(&server));
    assert_eq!(aio::stored_limit(&target, "jobs").await.unwrap(), None);
    aio::set_limit(&target, "jobs", 0).await.unwrap();
    assert_eq!(aio::stored_limit(&target, "jobs").await.unwrap(), Some(0));
    let jobs = Semaphore::new(&target, "jobs").limit(10);
    assert!(matches!(jobs.acquire().await, Err(Error::NotAcquired)));

    aio::set_limit(&target, "jobs", 1).await.unwrap();
    let first = jobs.acquire().await.unwrap();
    assert!(matches!(jobs.acquire().await, Err(Error::NotAcquired)));
    assert_eq!(aio::in_use(&target, "jobs").await.unwrap(), 1);
    // Raised, a waiter is served at once.
    let waiting = jobs.clone().wait(Some(Duration::from_secs(10)));
    let waiter = tokio::spawn(async move { (waiting.acquire().await, Instant::now()) });
    until_waiting(&mut conn, "jobs", scripts());
    let raised = Instant::now();
    aio::set_limit(&target, "jobs", 2).await.unwrap();
    let (second, served) = waiter.await.unwrap();
    assert!(served - raised < Duration::from_millis(500));
    assert!(aio::clear_limit(&target, "jobs").await.unwrap());
    assert_eq!(aio::stored_limit(&target, "jobs").await.unwrap(), None);
    assert!(first.release().await.unwrap());
    assert!(second.unwrap().release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_module_what_needs_it_fails_before_anything_is_sent() {
    let server = server_without_module();
    let mut conn = server.connection();
    let target = Target::from(client(&server));
    let bound = Semaphore::new(&target, "jobs").bound(true);
    assert_module_required(&mut conn, 0, bound.acquire().await, "BOUND", &["jobs"]);
    let set = SemaphoreSet::new(&target).semaphore("jobs", 1, 1);
    assert_module_required(&mut conn, 0, set.acquire().await, SET_NEEDS, &["jobs"]);
    let result = aio::wait_empty(&target, "jobs", Duration::ZERO).await;
    assert_module_required(&mut conn, 0, result, "SEM.WAITEMPTY", &["jobs"]);

    // The rest goes through the script; a waiter is served at once by a release.
    let jobs = Semaphore::new(&target, "jobs").fair(true);
    let holder = jobs.acquire().await.unwrap();
    let held = holder.ticket().unwrap();
    let waiting = jobs.clone().wait(Some(Duration::from_secs(10)));
    let waiter = tokio::spawn(async move { (waiting.acquire().await, Instant::now()) });
    until_waiting(&mut conn, "jobs", true);
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let (permit, served) = waiter.await.unwrap();
    let permit = permit.unwrap();
    assert!(served - released < Duration::from_millis(300));
    assert!(permit.ticket().unwrap() > held);
    assert!(permit.release().await.unwrap());
    assert_eq!(live_by_script(&mut conn, "jobs"), 0);
    let stats: String = run(&mut conn, &["INFO", "commandstats"]);
    assert!(!stats.contains("cmdstat_sem."), "{stats}");
}

/// The clients blocked in the server (`INFO clients`): waiters of the module, and `BLPOP`s of
/// the script's waiters.
fn blocked_clients(conn: &mut redis::Connection) -> u64 {
    let info: String = run(conn, &["INFO", "clients"]);
    info.lines()
        .find_map(|line| line.strip_prefix("blocked_clients:"))
        .expect("blocked_clients")
        .trim()
        .parse()
        .expect("a count")
}

/// Nobody waits for `name`: in the module's line, or in the script's.
fn nobody_in_line(conn: &mut redis::Connection, name: &str) -> bool {
    match scripts() {
        false => run::<String>(conn, &["SEM.GET", name, "JSON"]).contains("\"waiters\":0"),
        true => run::<i64>(conn, &["ZCARD", &format!("{name}:line")]) == 0,
    }
}

/// A waiting acquire cut by a timeout of the caller's ends its wait in the server at once (the
/// module's blocked acquire, the script's `BLPOP`), and a release then serves nobody.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_wait_ends_in_the_server_at_once() {
    let server = server();
    let mut conn = server.connection();
    let target = Target::from(client(&server));
    let sem = Semaphore::new(&target, "jobs");
    let holder = sem.acquire().await.unwrap();
    let waiting = sem.clone().wait(Some(Duration::from_secs(20)));
    let cut = tokio::time::timeout(Duration::from_millis(300), waiting.acquire()).await;
    assert!(cut.is_err(), "the caller's timeout did not fire");
    wait_until(
        "the wait ended in the server",
        Duration::from_secs(1),
        || blocked_clients(&mut conn) == 0,
    );
    assert!(nobody_in_line(&mut conn, "jobs"));
    assert!(holder.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(live(&mut conn, "jobs"), 0);
    // The pool's connections still serve waits.
    let permit = sem
        .clone()
        .wait(Some(Duration::from_secs(5)))
        .acquire()
        .await
        .unwrap();
    assert!(permit.release().await.unwrap());
}

/// A grant that reaches a wait in the very moment it is dropped is given back: the server is
/// kept busy (a script that spins) from before the caller's timeout fires until right after it
/// ran the holder's release, pipelined behind the script; so the grant goes out before the
/// server reads anything the drop sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_grant_in_the_moment_of_the_drop_is_given_back() {
    let server = server();
    let mut conn = server.connection();
    let target = Target::from(client(&server));
    let sem = Semaphore::new(&target, "jobs").lease(Duration::from_secs(30));
    let holder = sem.acquire().await.unwrap();
    let holder_id = holder.id().to_string();
    let waiting = sem.clone().wait(Some(Duration::from_secs(20)));
    let cut = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_millis(800), waiting.acquire()).await
    });
    wait_until("the waiter blocks", Duration::from_secs(5), || {
        blocked_clients(&mut conn) == 1
    });
    // A second of the server's time: its CPU clock where scripts have one (Valkey and Redis
    // 7.2 and later hold TIME still within a script), else TIME (Redis 7.0).
    let mut spin = redis::cmd("EVAL");
    spin.arg(
        "local os_ = rawget(_G, 'os') \
         local function now() \
           if os_ then return os_.clock() * 1000 end \
           local t = redis.call('TIME') return t[1] * 1000 + t[2] / 1000 \
         end \
         local s = now() repeat until now() > s + 1000 return 0",
    )
    .arg(0);
    let mut release = redis::cmd("EVAL");
    match scripts() {
        false => release = redis::cmd("SEM.RELEASE"),
        true => {
            release.arg(SCRIPT).arg(6).arg("jobs");
            for suffix in [":owner", ":counter", ":permits", ":limit", ":wake"] {
                release.arg(format!("jobs{suffix}"));
            }
            release.arg("RELEASE");
        }
    }
    if !scripts() {
        release.arg("jobs");
    }
    release.arg(&holder_id);
    let busy = std::thread::spawn(move || {
        let (_, released): (i64, i64) = redis::pipe()
            .add_command(spin)
            .add_command(release)
            .query(&mut conn)
            .unwrap();
        (released, conn)
    });
    assert!(
        cut.await.unwrap().is_err(),
        "the caller's timeout did not fire"
    );
    let (released, mut conn) = busy.join().unwrap();
    assert_eq!(released, 1);
    wait_until("the grant is given back", Duration::from_secs(3), || {
        live(&mut conn, "jobs") == 0
    });
    assert!(nobody_in_line(&mut conn, "jobs"));
    drop(holder);
}

/// A durable acquire cut by a timeout of the caller's while the replicas are awaited (here there
/// is none: `WAIT` would block for its whole timeout) gives its grant back.
#[tokio::test(flavor = "multi_thread")]
async fn a_durable_acquire_dropped_while_replicas_are_awaited_gives_its_grant_back() {
    let server = server();
    let mut conn = server.connection();
    let sem = Semaphore::new(client(&server), "jobs")
        .lease(Duration::from_secs(30))
        .durable(1, Duration::from_secs(5));
    // Time enough to be granted and reach the WAIT on a busy machine, well before its end.
    let cut = tokio::time::timeout(Duration::from_millis(1500), sem.acquire()).await;
    assert!(cut.is_err(), "the caller's timeout did not fire");
    wait_until("the grant is given back", Duration::from_secs(2), || {
        live(&mut conn, "jobs") == 0
    });
    // The acquire had reached its WAIT; some servers (Valkey) count a blocked command when it
    // ends, here at its 5 s timeout.
    wait_until("a WAIT was sent", Duration::from_secs(7), || {
        calls(&mut conn, "wait") >= 1
    });
}

/// As the sync suite's: a release that fails (here the shared connection was closed) leaves the
/// permit held, and a second call gives it back.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_that_fails_can_be_called_again() {
    let server = server();
    let mut conn = server.connection();
    let permit = Semaphore::new(client(&server), "jobs")
        .auto_refresh(false)
        .acquire()
        .await
        .unwrap();
    let _: i64 = run(
        &mut conn,
        &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
    );
    assert!(matches!(permit.release().await, Err(Error::Redis(_))));
    assert_eq!(live(&mut conn, "jobs"), 1);
    assert!(permit.release().await.unwrap());
    assert_eq!(live(&mut conn, "jobs"), 0);
    assert!(!permit.release().await.unwrap());
}

/// As the sync suite's: a wait the server ends (`UNBLOCKED`) waits again for what is left.
#[tokio::test(flavor = "multi_thread")]
async fn a_wait_the_server_ends_waits_again_for_what_is_left() {
    let server = server();
    let mut conn = server.connection();
    let cut = Semaphore::new(client(&server), "cut");
    let holder = cut.acquire().await.unwrap();
    let waiter = cut.clone().wait(Some(Duration::from_secs(10)));
    let started = Instant::now();
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    cut_a_wait(&mut conn);
    wait_until("the waiter blocks again", Duration::from_secs(5), || {
        blocked_client(&mut conn).is_some()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the acquire ended while the semaphore was full"
    );
    assert!(holder.release().await.unwrap());
    let permit = waiting.await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(live(&mut conn, "cut"), 1);
    assert!(permit.release().await.unwrap());

    let holder = cut.acquire().await.unwrap();
    let waiter = cut.clone().wait(Some(Duration::from_millis(1500)));
    let started = Instant::now();
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    let mut cuts = 0;
    while !waiting.is_finished() {
        cuts += unblock_with_error(&mut conn) as u32;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(waiting.await.unwrap(), Err(Error::NotAcquired)));
    assert!(cuts >= 2, "{cuts} cuts");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1400), "{waited:?}");
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    assert!(holder.release().await.unwrap());
    assert_eq!(live(&mut conn, "cut"), 0);
}

/// Targets made of one client share a connection and a refresher per tokio runtime: after a
/// runtime ends, semaphores made of the client on another one work there (their connection
/// and refresh task live on it), while one of the first runtime's is still alive.
#[test]
fn a_client_serves_a_second_runtime_after_the_first_ended() {
    let server = server();
    let mut conn = server.connection();
    let client = client(&server);
    let first = tokio::runtime::Runtime::new().unwrap();
    let kept = first.block_on(async {
        let kept = Semaphore::new(client.clone(), "jobs");
        assert!(kept.acquire().await.unwrap().release().await.unwrap());
        kept
    });
    drop(first);
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let permit = Semaphore::new(client.clone(), "jobs")
            .lease(Duration::from_millis(1500))
            .acquire()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2200)).await;
        assert!(!permit.is_lost());
        assert_eq!(live(&mut conn, "jobs"), 1);
        assert!(permit.release().await.unwrap());
    });
    drop(kept);
}
