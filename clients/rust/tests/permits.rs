//! redsem-client against a real redis-server with the module loaded (the repository's test
//! harness, tests/common).

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::sync::Once;
use std::thread;
use std::time::{Duration, Instant};

use common::{first_ticket, run, wait_until, zset, Server};
use redsem_client::{
    clear_limit, set_limit, stored_limit, wait_empty, Error, Semaphore, SemaphoreSet,
};

/// A server with the module; the harness finds the workspace's debug build through
/// REDSEM_MODULE (its own default is relative to the root crate).
fn server_with(extra: &[&str]) -> Server {
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
    Server::start_with(extra)
}

fn server() -> Server {
    server_with(&["--save", "", "--appendonly", "no"])
}

fn client(server: &Server) -> redis::Client {
    redis::Client::open(format!("redis://127.0.0.1:{}/", server.port)).unwrap()
}

fn live(conn: &mut redis::Connection, name: &str) -> i64 {
    run(conn, &["SEM.GET", name])
}

#[test]
fn grant_release_and_the_limit() {
    let server = server();
    let mut conn = server.connection();
    let jobs = Semaphore::new(client(&server), "jobs").limit(2);
    let first = jobs.acquire().unwrap();
    let second = jobs.acquire().unwrap();
    assert_ne!(first.id(), second.id());
    assert_eq!(first.ticket(), None);
    let started = Instant::now();
    assert!(matches!(jobs.acquire(), Err(Error::NotAcquired)));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(live(&mut conn, "jobs"), 2);

    assert!(first.release().unwrap());
    assert_eq!(live(&mut conn, "jobs"), 1);
    drop(second); // Drop gives it back too
    assert_eq!(live(&mut conn, "jobs"), 0);
    assert_eq!(run::<i64>(&mut conn, &["EXISTS", "jobs"]), 0);
}

/// The Rust example of clients/README.md, but for the server's address.
fn readme_example(url: &str) -> Result<(), Error> {
    // README example begins
    let client = redis::Client::open(url)?;
    let permit = Semaphore::new(client, "jobs")
        .limit(3)
        .lease(Duration::from_secs(30))
        .wait(Some(Duration::from_secs(10)))
        .acquire()?;
    // at most 3 holders here; check permit.is_lost() in long work to stop early
    assert!(permit.release()?, "the lease ran out during the work");
    // README example ends
    Ok(())
}

/// The Rust example of clients/README.md for sets and wait_empty, but for the server's address.
fn readme_set_example(url: &str) -> Result<(bool, Option<Vec<u64>>), Error> {
    // README set example begins
    let client = redis::Client::open(url)?;
    // One GPU and 2 of 5 licences, both or neither; wait up to 10 s for the pair.
    let permits = SemaphoreSet::new(client.clone())
        .semaphore("gpu", 1, 1)
        .semaphore("licence", 5, 2)
        .wait(Some(Duration::from_secs(10)))
        .fair(true)
        .acquire()?;
    // Fair: a fencing ticket per semaphore, in the order named, to hand on to storage.
    let tickets = permits.tickets().map(<[u64]>::to_vec);
    assert!(permits.release()?, "a permit of the set was lost");
    // A deploy waits until no job holds "deploys" any more (at most 60 s).
    let drained = redsem_client::wait_empty(&client, "deploys", Duration::from_secs(60))?;
    // README set example ends
    Ok((drained, tickets))
}

/// The Rust example of clients/README.md for an operator's limit, but for the server's address.
fn readme_limit_example(url: &str) -> Result<(), Error> {
    // README limit example begins
    let client = redis::Client::open(url)?;
    let reports = Semaphore::new(client.clone(), "reports").limit(10);
    // Pause "reports": while 0 is stored, every acquire is refused, whatever limit it passes.
    redsem_client::set_limit(&client, "reports", 0)?;
    assert!(matches!(reports.acquire(), Err(Error::NotAcquired)));
    assert_eq!(redsem_client::stored_limit(&client, "reports")?, Some(0));
    // At most 2 holders at once, whatever the callers pass, until it is cleared.
    redsem_client::set_limit(&client, "reports", 2)?;
    let permit = reports.acquire()?;
    assert!(permit.release()?);
    assert!(redsem_client::clear_limit(&client, "reports")?);
    assert_eq!(redsem_client::stored_limit(&client, "reports")?, None);
    // README limit example ends
    Ok(())
}

/// The lines of this file between `// README <what> begins` and its end, unindented once, as
/// clients/README.md shows them.
fn example_text(what: &str) -> String {
    let this_file = include_str!("permits.rs");
    let begin = this_file
        .find(&format!("// README {what} begins\n"))
        .unwrap();
    let end = this_file
        .find(&format!("    // README {what} ends"))
        .unwrap();
    let example: String = this_file[begin..end]
        .lines()
        .skip(1)
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
        .collect();
    example.replace("open(url)", "open(\"redis://127.0.0.1:6379/\")")
}

#[test]
fn the_readme_examples() {
    let server = server();
    let url = format!("redis://127.0.0.1:{}/", server.port);
    let mut conn = server.connection();
    readme_example(&url).unwrap();
    let (drained, tickets) = readme_set_example(&url).unwrap();
    assert!(drained);
    // gpu and licence are fresh names: each one's first ticket is the server's floor.
    let first = first_ticket(&mut conn) as u64;
    assert_eq!(tickets, Some(vec![first, first]));
    readme_limit_example(&url).unwrap();
    for name in ["jobs", "gpu", "licence", "deploys", "reports"] {
        assert_eq!(live(&mut conn, name), 0, "{name}");
    }

    // The README shows exactly this code.
    for what in ["example", "set example", "limit example"] {
        let example = example_text(what);
        assert!(
            include_str!("../../README.md").contains(&example),
            "clients/README.md lacks:\n{example}"
        );
    }
}

#[test]
fn a_wait_times_out_or_is_served_when_a_holder_leaves() {
    let server = server();
    let mut conn = server.connection();
    let jobs = Semaphore::new(client(&server), "jobs").limit(1);
    let holder = jobs.acquire().unwrap();

    let started = Instant::now();
    let waiting = jobs.clone().wait(Some(Duration::from_millis(300)));
    assert!(matches!(waiting.acquire(), Err(Error::NotAcquired)));
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5));

    let leaving = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        holder.release().unwrap()
    });
    let permit = jobs.clone().wait(Some(Duration::MAX)).acquire().unwrap();
    assert!(leaving.join().unwrap());
    assert_eq!(zset(&mut conn, "jobs")[0].0, permit.id());
}

#[test]
fn refresh_keeps_a_short_lease_alive() {
    let server = server();
    let mut conn = server.connection();
    let permit = Semaphore::new(client(&server), "jobs")
        .lease(Duration::from_millis(600))
        .acquire()
        .unwrap();
    thread::sleep(Duration::from_secs(2)); // more than three leases
    assert!(!permit.is_lost());
    assert_eq!(zset(&mut conn, "jobs")[0].0, permit.id());
    assert!(permit.release().unwrap());
}

#[test]
fn a_permit_removed_by_another_client_is_lost() {
    let server = server();
    let mut conn = server.connection();
    let permit = Semaphore::new(client(&server), "jobs")
        .lease(Duration::from_millis(600))
        .acquire()
        .unwrap();
    let _: i64 = run(&mut conn, &["DEL", "jobs"]);
    wait_until(
        "the refresher reports the loss",
        Duration::from_secs(5),
        || permit.is_lost(),
    );
    assert!(matches!(permit.check(), Err(Error::Lost)));
    assert!(!permit.release().unwrap());
}

#[test]
fn a_lease_that_runs_out_during_the_work_is_reported_at_release() {
    let server = server();
    let mut conn = server.connection();
    let permit = Semaphore::new(client(&server), "jobs")
        .lease(Duration::from_millis(200))
        .auto_refresh(false)
        .acquire()
        .unwrap();
    thread::sleep(Duration::from_millis(500));
    assert!(!permit.release().unwrap());
    assert_eq!(live(&mut conn, "jobs"), 0);
}

#[test]
fn fair_permits_carry_growing_tickets() {
    let server = server();
    let mut conn = server.connection();
    let printers = Semaphore::new(client(&server), "printers")
        .limit(2)
        .fair(true);
    let floor = first_ticket(&mut conn);
    let first = printers.acquire().unwrap();
    let second = printers.acquire().unwrap();
    assert_eq!(
        (first.ticket(), second.ticket()),
        (Some(floor as u64), Some(floor as u64 + 1))
    );
    assert_eq!(
        zset(&mut conn, "printers:owner"),
        [
            (first.id().to_string(), floor),
            (second.id().to_string(), floor + 1)
        ]
    );
    match Semaphore::new(client(&server), "printers")
        .limit(2)
        .acquire()
    {
        Err(Error::Redis(err)) => assert!(err.to_string().contains("fair holders"), "{err}"),
        other => panic!("a plain acquire among fair holders: {other:?}"),
    }
    drop((first, second));
    assert_eq!(printers.acquire().unwrap().ticket(), Some(floor as u64 + 2));
}

#[test]
fn count_takes_several_permits_and_gives_some_back() {
    let server = server();
    let mut conn = server.connection();
    let gpus = Semaphore::new(client(&server), "gpus").limit(4);
    let mut big = gpus.clone().count(3).acquire().unwrap();
    assert_eq!(live(&mut conn, "gpus"), 3);
    assert!(matches!(
        gpus.clone().count(2).acquire(),
        Err(Error::NotAcquired)
    ));
    for all_or_none in [3, 0] {
        assert!(matches!(
            big.release_some(all_or_none),
            Err(Error::BadCount { held: 3 })
        ));
    }
    assert_eq!((big.count(), live(&mut conn, "gpus")), (3, 3));
    assert!(big.release_some(2).unwrap());
    assert_eq!((big.count(), live(&mut conn, "gpus")), (1, 1));
    assert!(big.release().unwrap());
    assert_eq!(live(&mut conn, "gpus"), 0);
}

#[test]
fn a_given_identifier_is_used() {
    let server = server();
    let mut conn = server.connection();
    let permit = Semaphore::new(client(&server), "jobs")
        .id("worker-7")
        .acquire()
        .unwrap();
    assert_eq!(permit.id(), "worker-7");
    assert_eq!(zset(&mut conn, "jobs")[0].0, "worker-7");
}

#[test]
fn a_bound_permit_is_given_back_when_its_connection_closes() {
    let server = server();
    let mut conn = server.connection();
    let permit = Semaphore::new(client(&server), "jobs")
        .lease(Duration::from_secs(3))
        .bound(true)
        .acquire()
        .unwrap();
    assert_eq!(live(&mut conn, "jobs"), 1);
    // As if the holder's process died: its connection closes, and the server gives the permit
    // back at once, long before the lease ends.
    let _: i64 = run(
        &mut conn,
        &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
    );
    wait_until(
        "the server gives the permit back",
        Duration::from_secs(2),
        || live(&mut conn, "jobs") == 0,
    );
    // The refresher (every second) reconnects and learns it.
    wait_until(
        "the permit is reported lost",
        Duration::from_secs(5),
        || permit.is_lost(),
    );
    assert!(!permit.release().unwrap());
}

#[test]
fn durable_waits_for_replicas_and_gives_back_a_grant_they_missed() {
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
        .unwrap();
    assert_eq!(zset(&mut replica_conn, "jobs")[0].0, permit.id()); // WAIT answered
    drop(permit);

    let started = Instant::now();
    let refused = jobs.durable(2, Duration::from_millis(200)).acquire();
    assert!(matches!(
        refused,
        Err(Error::NotDurable {
            acked: 1,
            wanted: 2
        })
    ));
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(live(&mut conn, "jobs"), 0);
}

fn pair(server: &Server) -> SemaphoreSet {
    SemaphoreSet::new(client(server))
        .semaphore("gpu", 2, 1)
        .semaphore("licence", 5, 3)
}

#[test]
fn a_set_is_granted_whole_and_given_back_whole() {
    let server = server();
    let mut conn = server.connection();
    let permits = pair(&server).acquire().unwrap();
    assert_eq!(permits.names(), ["gpu", "licence"]);
    assert_eq!(permits.counts(), [1, 3]);
    assert_eq!(permits.tickets(), None);
    assert!(!permits.is_lost());
    assert_eq!((live(&mut conn, "gpu"), live(&mut conn, "licence")), (1, 3));
    assert_eq!(zset(&mut conn, "gpu")[0].0, permits.id());
    assert!(permits.release().unwrap());
    assert_eq!((live(&mut conn, "gpu"), live(&mut conn, "licence")), (0, 0));

    drop(pair(&server).acquire().unwrap()); // Drop gives the set back too
    assert_eq!((live(&mut conn, "gpu"), live(&mut conn, "licence")), (0, 0));
}

#[test]
fn one_full_semaphore_refuses_the_set_and_nothing_is_held() {
    let server = server();
    let mut conn = server.connection();
    let holder = Semaphore::new(client(&server), "licence")
        .limit(5)
        .count(3)
        .acquire()
        .unwrap();
    let started = Instant::now();
    assert!(matches!(pair(&server).acquire(), Err(Error::NotAcquired)));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(run::<i64>(&mut conn, &["EXISTS", "gpu"]), 0);
    assert_eq!(live(&mut conn, "licence"), 3);
    drop(holder);
}

#[test]
fn a_fair_set_carries_one_ticket_per_semaphore() {
    let server = server();
    let mut conn = server.connection();
    let floor = first_ticket(&mut conn);
    let single = Semaphore::new(client(&server), "licence")
        .limit(5)
        .fair(true)
        .acquire()
        .unwrap();
    assert_eq!(single.ticket(), Some(floor as u64));
    let permits = pair(&server).fair(true).acquire().unwrap();
    assert_eq!(
        permits.tickets(),
        Some(&[floor as u64, floor as u64 + 1][..])
    );
    assert!(zset(&mut conn, "licence:owner").contains(&(permits.id().to_string(), floor + 1)));
}

#[test]
fn a_waiting_set_is_granted_when_a_member_is_freed() {
    let server = server();
    let mut conn = server.connection();
    let holder = Semaphore::new(client(&server), "licence")
        .limit(5)
        .count(3)
        .acquire()
        .unwrap();
    let short = pair(&server).wait(Some(Duration::from_millis(200)));
    assert!(matches!(short.acquire(), Err(Error::NotAcquired)));
    let leaving = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        holder.release().unwrap()
    });
    let started = Instant::now();
    let permits = pair(&server)
        .wait(Some(Duration::from_secs(10)))
        .acquire()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(leaving.join().unwrap());
    assert_eq!(zset(&mut conn, "gpu")[0].0, permits.id());
    assert_eq!(zset(&mut conn, "licence")[0].0, permits.id());
    assert!(permits.release().unwrap());
    assert_eq!((live(&mut conn, "gpu"), live(&mut conn, "licence")), (0, 0));
}

#[test]
fn refresh_keeps_a_set_alive_and_a_removed_member_loses_it() {
    let server = server();
    let mut conn = server.connection();
    let short = pair(&server).lease(Duration::from_millis(600));
    let permits = short.acquire().unwrap();
    thread::sleep(Duration::from_secs(2)); // more than three leases
    assert!(!permits.is_lost());
    assert_eq!(zset(&mut conn, "licence")[0].0, permits.id());
    assert!(permits.release().unwrap());

    let permits = short.acquire().unwrap();
    let _: i64 = run(&mut conn, &["DEL", "licence"]);
    wait_until(
        "the refresher reports the loss",
        Duration::from_secs(5),
        || permits.is_lost(),
    );
    assert!(matches!(permits.check(), Err(Error::Lost)));
    assert!(!permits.release().unwrap());
    assert_eq!((live(&mut conn, "gpu"), live(&mut conn, "licence")), (0, 0));
}

#[test]
fn wait_empty_is_true_once_the_holders_leave_and_false_at_the_timeout() {
    let server = server();
    let client = client(&server);
    assert!(wait_empty(&client, "jobs", Duration::from_secs(10)).unwrap()); // at once
    let holder = Semaphore::new(client.clone(), "jobs")
        .limit(3)
        .acquire()
        .unwrap();
    let started = Instant::now();
    assert!(!wait_empty(&client, "jobs", Duration::from_millis(300)).unwrap());
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(!wait_empty(&client, "jobs", Duration::ZERO).unwrap()); // looks once
    let leaving = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        holder.release().unwrap()
    });
    assert!(wait_empty(&client, "jobs", Duration::MAX).unwrap());
    assert!(started.elapsed() >= Duration::from_millis(550));
    assert!(leaving.join().unwrap());
}

#[test]
fn an_operators_limit_is_stored_used_by_every_acquire_and_cleared() {
    let server = server();
    let mut conn = server.connection();
    let client = client(&server);
    assert_eq!(stored_limit(&client, "jobs").unwrap(), None);
    assert!(!clear_limit(&client, "jobs").unwrap());
    set_limit(&client, "jobs", 0).unwrap(); // pauses
    assert_eq!(stored_limit(&client, "jobs").unwrap(), Some(0));
    let jobs = Semaphore::new(client.clone(), "jobs").limit(10);
    assert!(matches!(jobs.acquire(), Err(Error::NotAcquired)));
    let set = SemaphoreSet::new(client.clone()).semaphore("jobs", 10, 1);
    assert!(matches!(set.acquire(), Err(Error::NotAcquired)));
    assert_eq!(live(&mut conn, "jobs"), 0);

    set_limit(&client, "jobs", 2).unwrap();
    assert_eq!(stored_limit(&client, "jobs").unwrap(), Some(2));
    let first = jobs.acquire().unwrap();
    let second = jobs.acquire().unwrap();
    assert!(matches!(jobs.acquire(), Err(Error::NotAcquired))); // 2, not 10
                                                                // Raised, a waiter is served at once.
    let waiting = {
        let jobs = jobs.clone().wait(Some(Duration::from_secs(10)));
        thread::spawn(move || jobs.acquire())
    };
    wait_until("the waiter is in line", Duration::from_secs(5), || {
        run::<String>(&mut conn, &["SEM.GET", "jobs", "JSON"]).contains("\"waiters\":1")
    });
    set_limit(&client, "jobs", u32::MAX).unwrap();
    let third = waiting.join().unwrap().unwrap();
    assert_eq!(stored_limit(&client, "jobs").unwrap(), Some(4294967295));

    assert!(clear_limit(&client, "jobs").unwrap());
    assert_eq!(stored_limit(&client, "jobs").unwrap(), None);
    assert!(!clear_limit(&client, "jobs").unwrap());
    for permit in [first, second, third] {
        assert!(permit.release().unwrap());
    }
    assert_eq!(run::<i64>(&mut conn, &["EXISTS", "jobs:limit"]), 0);
}
