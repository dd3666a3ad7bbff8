//! redsem-client against a real redis-server with the module loaded (the repository's test
//! harness, tests/common), or without it when `REDSEM_BACKEND=scripts`: then every test runs
//! against the script, and those of what needs the module assert `Error::ModuleRequired`. The
//! tests named `without_the_module_...` start a server without the module either way.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::thread;
use std::time::{Duration, Instant};

use common::{run, server_ms, wait_until, zset, FirstGrant, Server};
use redsem_client::{
    clear_limit, in_use, set_limit, stored_limit, wait_empty, Error, Semaphore, SemaphoreSet,
};
use support::*;

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

    // One question whether the server has the module for the three acquires; with the module,
    // its commands and nothing else; without it, the script and no SEM.* command.
    assert_eq!(questions(&mut conn), 1);
    assert_eq!(
        calls(&mut conn, "sem.acquire"),
        if scripts() { 0 } else { 3 }
    );
    assert_eq!(calls(&mut conn, "evalsha") > 0, scripts());
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
    example_text_of(include_str!("permits.rs"), what)
}

/// The lines of a suite's file between `// README <what> begins` and its end, unindented once,
/// with the server's address as the READMEs show it.
fn example_text_of(this_file: &str, what: &str) -> String {
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
    example
        .replace("open(url)", "open(\"redis://127.0.0.1:6379/\")")
        .replace(
            "new(urls)",
            "new(vec![\"redis://127.0.0.1:7000/\", \"redis://127.0.0.1:7001/\"])",
        )
}

/// Every Rust block of clients/rust/README.md is the code of an example a suite runs: this
/// one's (`the_readme_examples`), the async suite's and the cluster suite's (run with
/// `REDSEM_CLUSTER`), each of which asserts the release's answer.
#[test]
fn every_rust_block_of_the_crates_readme_is_run_by_a_suite() {
    let readme = include_str!("../README.md");
    let run = [
        example_text("example"),
        example_text_of(include_str!("aio.rs"), "async example"),
        example_text_of(include_str!("cluster.rs"), "cluster example"),
    ];
    let mut blocks = 0;
    for block in readme.split("```rust\n").skip(1) {
        let block = &block[..block.find("```").expect("an open block")];
        // The imports the suites have at their top.
        let uses = block
            .lines()
            .take_while(|line| line.starts_with("use ") || line.is_empty())
            .map(|line| line.len() + 1)
            .sum::<usize>();
        let block = &block[uses..];
        assert!(
            run.iter().any(|example| example == block),
            "clients/rust/README.md shows code no suite runs:\n{block}"
        );
        blocks += 1;
    }
    assert_eq!(blocks, run.len(), "an example no longer in the README");
    for example in &run {
        assert!(example.contains(".release()?") || example.contains(".release().await?"));
        assert!(
            !example.contains("let _ = "),
            "an answer dropped:\n{example}"
        );
    }
}

#[test]
fn the_readme_examples() {
    let server = server();
    let url = format!("redis://127.0.0.1:{}/", server.port);
    let mut conn = server.connection();
    readme_example(&url).unwrap();
    if scripts() {
        let runs = script_runs(&mut conn);
        let result = readme_set_example(&url);
        assert_module_required(&mut conn, runs, result, SET_NEEDS, &["gpu", "licence"]);
    } else {
        let fresh = FirstGrant::before(&mut conn);
        let (drained, tickets) = readme_set_example(&url).unwrap();
        assert!(drained);
        // gpu and licence are fresh names: each one's first ticket is the clock of the grant.
        let tickets = tickets.expect("fair tickets");
        assert_eq!(tickets.len(), 2);
        for ticket in tickets {
            fresh.ticket(&mut conn, ticket as i64);
        }
    }
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
    // With the module a fresh name's first ticket is the clock of its grant in microseconds,
    // the next ones follow it; the script's tickets are max(counter + 1, the server's clock in
    // microseconds).
    let fresh = (!scripts()).then(|| FirstGrant::before(&mut conn));
    let since = server_ms(&mut conn) * 1000;
    let first = printers.acquire().unwrap();
    let second = printers.acquire().unwrap();
    let (one, two) = (
        first.ticket().unwrap() as i64,
        second.ticket().unwrap() as i64,
    );
    match &fresh {
        None => {
            // The clock in microseconds: up to 999 past the millisecond read after.
            assert!(
                (since..=server_ms(&mut conn) * 1000 + 999).contains(&one),
                "{one}"
            );
            // One more than the first when both came in the same microsecond.
            let latest = (server_ms(&mut conn) * 1000 + 999).max(one + 1);
            assert!(two > one && two <= latest, "{one} then {two}");
        }
        Some(fresh) => {
            fresh.ticket(&mut conn, one);
            assert_eq!(two, one + 1);
        }
    }
    assert_eq!(
        zset(&mut conn, "printers:owner"),
        [
            (first.id().to_string(), one),
            (second.id().to_string(), two)
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
    let third = printers.acquire().unwrap().ticket().unwrap() as i64;
    match scripts() {
        false => assert_eq!(third, one + 2),
        true => assert!(third > two, "{third}"),
    }
}

/// A name whose keys went between two fair grants (a `DEL` of the name, its owner set and its
/// counter, or `FLUSHDB`), the two most often within one millisecond, still gives the second a
/// ticket above the first, in every round: the script starts again from the server's clock in
/// microseconds, the module above every ticket the node handed out.
#[test]
fn a_fair_ticket_after_its_keys_went_is_above_the_one_before() {
    let server = server();
    let mut conn = server.connection();
    let fence = Semaphore::new(client(&server), "fence")
        .fair(true)
        .auto_refresh(false);
    let mut repeats = Vec::new();
    for round in 0..200 {
        let first = fence.acquire().unwrap();
        if round % 2 == 1 {
            let _: () = run(&mut conn, &["FLUSHDB"]);
        } else {
            let _: i64 = run(&mut conn, &["DEL", "fence", "fence:owner", "fence:counter"]);
        }
        let second = fence.acquire().unwrap();
        let (one, two) = (first.ticket().unwrap(), second.ticket().unwrap());
        if two <= one {
            repeats.push((round, one, two));
        }
        assert!(!first.release().unwrap(), "its keys went: lost");
        assert!(second.release().unwrap());
    }
    assert!(
        repeats.is_empty(),
        "{} of 200 rounds (round, first, second): {:?}",
        repeats.len(),
        &repeats[..repeats.len().min(5)]
    );
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
    if scripts() {
        let bound = Semaphore::new(client(&server), "jobs").bound(true);
        assert_module_required(&mut conn, 0, bound.acquire(), "BOUND", &["jobs"]);
        return;
    }
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
    if scripts() {
        let result = pair(&server).acquire();
        assert_module_required(&mut conn, 0, result, SET_NEEDS, &["gpu", "licence"]);
        return;
    }
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
    if scripts() {
        let runs = script_runs(&mut conn);
        let result = pair(&server).acquire();
        assert_module_required(&mut conn, runs, result, SET_NEEDS, &["gpu"]);
    } else {
        assert!(matches!(pair(&server).acquire(), Err(Error::NotAcquired)));
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(run::<i64>(&mut conn, &["EXISTS", "gpu"]), 0);
    assert_eq!(live(&mut conn, "licence"), 3);
    drop(holder);
}

#[test]
fn a_fair_set_carries_one_ticket_per_semaphore() {
    let server = server();
    let mut conn = server.connection();
    if scripts() {
        let result = pair(&server).acquire();
        assert_module_required(&mut conn, 0, result, SET_NEEDS, &["gpu", "licence"]);
        return;
    }
    let fresh = FirstGrant::before(&mut conn);
    let single = Semaphore::new(client(&server), "licence")
        .limit(5)
        .fair(true)
        .acquire()
        .unwrap();
    let licence = fresh.ticket(&mut conn, single.ticket().expect("a ticket") as i64);
    // gpu has no counter yet: its first ticket is the clock of the set's grant.
    let fresh = FirstGrant::before(&mut conn);
    let permits = pair(&server).fair(true).acquire().unwrap();
    let tickets = permits.tickets().expect("fair tickets");
    let gpu = fresh.ticket(&mut conn, tickets[0] as i64);
    // licence goes on from its counter, and above gpu's, granted before it in the same step.
    let next = (licence + 1).max(gpu + 1);
    assert_eq!(tickets, [gpu as u64, next as u64]);
    assert!(zset(&mut conn, "licence:owner").contains(&(permits.id().to_string(), next)));
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
    if scripts() {
        let runs = script_runs(&mut conn);
        let result = pair(&server).wait(Some(Duration::from_secs(10))).acquire();
        assert_module_required(&mut conn, runs, result, SET_NEEDS, &["gpu"]);
        assert!(holder.release().unwrap());
        return;
    }
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
    if scripts() {
        let result = pair(&server).acquire();
        assert_module_required(&mut conn, 0, result, SET_NEEDS, &["gpu", "licence"]);
        return;
    }
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
    if scripts() {
        let mut conn = server.connection();
        let result = wait_empty(&client, "jobs", Duration::from_secs(10));
        assert_module_required(&mut conn, 0, result, "SEM.WAITEMPTY", &["jobs"]);
        return;
    }
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
    if scripts() {
        let runs = script_runs(&mut conn);
        assert_module_required(&mut conn, runs, set.acquire(), SET_NEEDS, &["jobs"]);
    } else {
        assert!(matches!(set.acquire(), Err(Error::NotAcquired)));
    }
    assert_eq!(live(&mut conn, "jobs"), 0);

    set_limit(&client, "jobs", 2).unwrap();
    assert_eq!(stored_limit(&client, "jobs").unwrap(), Some(2));
    let first = jobs.acquire().unwrap();
    let second = jobs.acquire().unwrap();
    assert!(matches!(jobs.acquire(), Err(Error::NotAcquired))); // 2, not 10
    assert_eq!(in_use(&client, "jobs").unwrap(), 2);
    // Raised, a waiter is served at once.
    let waiting = {
        let jobs = jobs.clone().wait(Some(Duration::from_secs(10)));
        thread::spawn(move || (jobs.acquire(), Instant::now()))
    };
    until_waiting(&mut conn, "jobs", scripts());
    let raised = Instant::now();
    set_limit(&client, "jobs", u32::MAX).unwrap();
    let (third, served) = waiting.join().unwrap();
    let third = third.unwrap();
    assert!(served - raised < Duration::from_millis(500));
    assert_eq!(stored_limit(&client, "jobs").unwrap(), Some(4294967295));

    assert!(clear_limit(&client, "jobs").unwrap());
    assert_eq!(stored_limit(&client, "jobs").unwrap(), None);
    assert!(!clear_limit(&client, "jobs").unwrap());
    for permit in [first, second, third] {
        assert!(permit.release().unwrap());
    }
    assert_eq!(run::<i64>(&mut conn, &["EXISTS", "jobs:limit"]), 0);
}

#[test]
fn without_the_module_what_needs_it_fails_before_anything_is_sent() {
    let server = server_without_module();
    let mut conn = server.connection();
    let client = client(&server);
    let bound = Semaphore::new(client.clone(), "jobs").bound(true);
    assert_module_required(&mut conn, 0, bound.acquire(), "BOUND", &["jobs"]);
    let set = SemaphoreSet::new(client.clone()).semaphore("jobs", 1, 1);
    assert_module_required(&mut conn, 0, set.acquire(), SET_NEEDS, &["jobs"]);
    let result = wait_empty(&client, "jobs", Duration::ZERO);
    assert_module_required(&mut conn, 0, result, "SEM.WAITEMPTY", &["jobs"]);

    // The rest goes through the script, each of its two texts loaded once (EVAL after the
    // first NOSCRIPT: the acquires' and the others'), and the semaphore's Semaphore asks
    // whether the server has the module once.
    let jobs = Semaphore::new(client.clone(), "jobs").limit(2);
    let asked = questions(&mut conn);
    let mut permits = Vec::new();
    for _ in 0..2 {
        permits.push(jobs.acquire().unwrap());
    }
    assert!(matches!(jobs.clone().acquire(), Err(Error::NotAcquired)));
    assert_eq!(questions(&mut conn), asked + 1);
    assert_eq!(in_use(&client, "jobs").unwrap(), 2);
    for permit in permits {
        assert!(permit.refresh().unwrap());
        assert!(permit.release().unwrap());
    }
    assert_eq!(calls(&mut conn, "eval"), 2);
    assert!(calls(&mut conn, "evalsha") >= 8);
    let stats: String = run(&mut conn, &["INFO", "commandstats"]);
    assert!(!stats.contains("cmdstat_sem."), "{stats}");
    assert_eq!(run::<i64>(&mut conn, &["EXISTS", "jobs"]), 0);
}

#[test]
fn without_the_module_a_release_serves_a_waiter_at_once() {
    let server = server_without_module();
    let mut conn = server.connection();
    let client = client(&server);
    // Plain, fair, and weighted: (fair, limit, count).
    for (fair, limit, count) in [(false, 1, 1), (true, 1, 1), (false, 3, 2)] {
        let jobs = Semaphore::new(client.clone(), "jobs")
            .limit(limit)
            .fair(fair)
            .count(count);
        let holder = jobs.acquire().unwrap();
        let waiting = {
            let jobs = jobs.clone().wait(Some(Duration::from_secs(10)));
            thread::spawn(move || (jobs.acquire(), Instant::now()))
        };
        // The waiter was refused and blocks for up to a second (its holder's lease is 30 s)...
        until_waiting(&mut conn, "jobs", true);
        // ...and the release wakes it long before that.
        let released = Instant::now();
        assert!(holder.release().unwrap());
        let (permit, served) = waiting.join().unwrap();
        let permit = permit.unwrap();
        let late = served - released;
        assert!(
            late < Duration::from_millis(300),
            "{fair} {count}: {late:?}"
        );
        assert_eq!(zset(&mut conn, "jobs")[0].0, permit.id());
        assert_eq!(permit.ticket().is_some(), fair);
        assert!(permit.release().unwrap());
        assert_eq!(live_by_script(&mut conn, "jobs"), 0);
    }
}

#[test]
fn without_the_module_a_lease_that_runs_out_serves_a_waiter_by_the_recheck() {
    let server = server_without_module();
    let client = client(&server);
    let jobs = Semaphore::new(client, "jobs");
    let lease = Duration::from_millis(1200);
    let holder = jobs
        .clone()
        .lease(lease)
        .auto_refresh(false)
        .acquire()
        .unwrap();
    let taken = Instant::now();
    // Nobody releases: the waiter looks again after a second, learns that the holder's lease
    // ends 200 ms later, and looks again then.
    let permit = jobs
        .clone()
        .wait(Some(Duration::from_secs(5)))
        .acquire()
        .unwrap();
    let waited = taken.elapsed();
    assert!(
        waited >= lease - Duration::from_millis(50) && waited < lease + Duration::from_millis(400),
        "{waited:?}"
    );
    assert!(!holder.release().unwrap());
    assert!(permit.release().unwrap());
}

#[test]
fn without_the_module_then_with_it_the_same_code_goes_on() {
    let server = server_without_module();
    let mut conn = server.connection();
    let client = client(&server);
    // The application's code, the same before and after the module is loaded.
    let take = |client: &redis::Client| {
        Semaphore::new(client.clone(), "printers")
            .limit(3)
            .fair(true)
            .lease(Duration::from_secs(10))
            .wait(Some(Duration::from_millis(100)))
            .acquire()
    };
    let held = take(&client).unwrap(); // by the script, held while the module loads
    set_limit(&client, "printers", 2).unwrap();
    let before = take(&client).unwrap();
    let before_ticket = before.ticket();
    assert!(before_ticket > held.ticket());
    assert!(matches!(take(&client), Err(Error::NotAcquired)));
    assert!(before.release().unwrap());
    let scripted = script_runs(&mut conn);
    assert!(scripted > 0);

    let module = common::module_path();
    let _: () = run(&mut conn, &["MODULE", "LOAD", module.to_str().unwrap()]);
    let after = take(&client).unwrap(); // by the module now
    assert_eq!(calls(&mut conn, "sem.acquirefair"), 1);
    assert!(after.ticket() > before_ticket);
    // The module takes over the script's holder, ticket, counter and limit.
    let json = common::sem_json(&mut conn, "printers");
    let holders: Vec<(String, u64)> = json["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["id"].as_str().unwrap().to_string(),
                h["ticket"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        holders,
        [
            (held.id().to_string(), held.ticket().unwrap()),
            (after.id().to_string(), after.ticket().unwrap())
        ]
    );
    assert_eq!(json["stored_limit"], 2);
    assert!(matches!(take(&client), Err(Error::NotAcquired)));
    assert_eq!(stored_limit(&client, "printers").unwrap(), Some(2));
    assert_eq!(in_use(&client, "printers").unwrap(), 2);
    // The permit the script granted is still refreshed and given back by it.
    assert!(held.refresh().unwrap());
    assert!(held.release().unwrap());
    assert!(script_runs(&mut conn) > scripted);
    assert_eq!(run::<i64>(&mut conn, &["SEM.GET", "printers"]), 1);
    let last = take(&client).unwrap();
    assert!(last.ticket() > after.ticket());
    assert!(after.release().unwrap() && last.release().unwrap());
    assert!(clear_limit(&client, "printers").unwrap());
    for key in [
        "printers",
        "printers:owner",
        "printers:permits",
        "printers:limit",
    ] {
        assert_eq!(run::<i64>(&mut conn, &["EXISTS", key]), 0, "{key}");
    }
}

/// A release that fails (its connection was cut) leaves the permit held, and a second call
/// gives it back; once answered, another call sends nothing.
#[test]
fn a_release_that_fails_can_be_called_again() {
    let server = server();
    let mut conn = server.connection();
    // durable(0, ..): the permit keeps a connection of its own, which the server then closes.
    let permit = Semaphore::new(client(&server), "jobs")
        .durable(0, Duration::from_millis(100))
        .auto_refresh(false)
        .acquire()
        .unwrap();
    kill_the_waits_connection(&mut conn);
    assert!(matches!(permit.release(), Err(Error::Redis(_))));
    assert_eq!(live(&mut conn, "jobs"), 1);
    assert!(permit.release().unwrap());
    assert_eq!(live(&mut conn, "jobs"), 0);
    let runs = calls(&mut conn, "sem.release") + script_runs(&mut conn);
    assert!(!permit.release().unwrap());
    drop(permit);
    assert_eq!(
        calls(&mut conn, "sem.release") + script_runs(&mut conn),
        runs
    );
}

/// A durable acquire whose `WAIT numreplicas` connection is closed while it blocks (its
/// replica is stopped: the grant has not reached it) fails, and gives the grant back: the
/// `WAIT` is not sent again on another connection, which wrote nothing and which the stopped
/// replica's last acknowledgement would answer at once. The connection is one of the pool's
/// (an acquire before gave it back), which a call that finds it closed otherwise replaces.
#[test]
fn a_durable_wait_whose_connection_closes_is_not_sent_on_another() {
    let primary = server_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--repl-diskless-sync-delay",
        "0",
    ]);
    let replica = common::start_replica_of(&primary);
    let mut conn = primary.connection();
    let jobs = Semaphore::new(client(&primary), "jobs").auto_refresh(false);
    assert!(jobs.acquire().unwrap().release().unwrap()); // a connection for the pool
    let info: String = run(&mut replica.connection(), &["INFO", "server"]);
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_string();
    let signal = |signal: &str| {
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(status.success());
    };
    signal("-STOP");
    let durable = jobs.clone().durable(1, Duration::from_secs(10));
    let acquiring = thread::spawn(move || durable.acquire());
    wait_until("the durable acquire waits", Duration::from_secs(5), || {
        run::<String>(&mut conn, &["CLIENT", "LIST"]).contains(" cmd=wait ")
    });
    kill_the_waits_connection(&mut conn);
    let acquired = acquiring.join().unwrap();
    signal("-CONT");
    match acquired {
        Err(Error::Redis(err)) => assert!(err.is_connection_dropped() || err.is_io_error()),
        other => panic!("a durable acquire whose WAIT was cut: {other:?}"),
    }
    assert_eq!(live(&mut conn, "jobs"), 0);
}

/// A wait the server ends with an error (`UNBLOCKED`: what a primary turning replica answers
/// its blocked clients, here `CLIENT UNBLOCK ... ERROR`) on one server waits again for what is
/// left of it, as often as it is ended, and ends when its wait does.
#[test]
fn a_wait_the_server_ends_waits_again_for_what_is_left() {
    let server = server();
    let mut conn = server.connection();
    let cut = Semaphore::new(client(&server), "cut");
    let holder = cut.acquire().unwrap();
    let waiter = cut.clone().wait(Some(Duration::from_secs(10)));
    let started = Instant::now();
    let waiting = thread::spawn(move || waiter.acquire());
    cut_a_wait(&mut conn);
    wait_until("the waiter blocks again", Duration::from_secs(5), || {
        blocked_client(&mut conn).is_some()
    });
    thread::sleep(Duration::from_millis(300));
    assert!(
        !waiting.is_finished(),
        "the acquire ended while the semaphore was full"
    );
    assert!(holder.release().unwrap());
    let permit = waiting.join().unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(live(&mut conn, "cut"), 1);
    assert!(permit.release().unwrap());

    let holder = cut.acquire().unwrap();
    let waiter = cut.clone().wait(Some(Duration::from_millis(1500)));
    let started = Instant::now();
    let waiting = thread::spawn(move || waiter.acquire());
    let mut cuts = 0;
    while !waiting.is_finished() {
        cuts += unblock_with_error(&mut conn) as u32;
        thread::sleep(Duration::from_millis(50));
    }
    assert!(matches!(waiting.join().unwrap(), Err(Error::NotAcquired)));
    assert!(cuts >= 2, "{cuts} cuts");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1400), "{waited:?}");
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    assert!(holder.release().unwrap());
    assert_eq!(live(&mut conn, "cut"), 0);
}
