//! `INFO sem`'s distributions: how long waiting acquires waited (`sem_wait_time`) and how long
//! holders held until they released (`sem_hold_time`), as `INFO latencystats` shows Redis's
//! own: they move by exactly what a test does, leases that end unreleased count elsewhere, and
//! `CONFIG RESETSTAT` empties them.

mod common;

use std::collections::BTreeMap;
use std::thread::sleep;
use std::time::Duration;

use common::*;

/// `sem_<which>_time` as its parts: p50, p99, p99.9 (ms) and count.
fn distribution(conn: &mut redis::Connection, which: &str) -> BTreeMap<String, f64> {
    let info: String = run(conn, &["INFO", "sem"]);
    let field = format!("sem_{which}_time:");
    let line = info
        .lines()
        .find_map(|line| line.strip_prefix(&field))
        .unwrap_or_else(|| panic!("no {field} in {info}"));
    line.split(',')
        .map(|part| {
            let (name, value) = part.split_once('=').expect("name=value");
            (name.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

#[test]
fn hold_and_wait_times_move_by_what_happened() {
    let server = Server::start();
    let mut c = server.connection();
    assert_eq!(distribution(&mut c, "hold")["count"], 0.0);

    // Held 200 ms, then released: one hold of about 200 ms.
    let _: String = run(&mut c, &["SEM.ACQUIRE", "h", "1", "30", "ID", "a"]);
    sleep(Duration::from_millis(200));
    let _: i64 = run(&mut c, &["SEM.RELEASE", "h", "a"]);
    let hold = distribution(&mut c, "hold");
    assert_eq!(hold["count"], 1.0);
    assert!((200.0..400.0).contains(&hold["p50"]), "{hold:?}");

    // A lease that ends unreleased is no hold time; the expiry counts it (another holder keeps
    // the key, which Redis would otherwise expire with the last lease).
    let _: String = run(&mut c, &["SEM.ACQUIRE", "e", "2", "30", "ID", "keep"]);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "e", "2", "0.05", "ID", "gone"]);
    sleep(Duration::from_millis(100));
    let _: String = run(&mut c, &["SEM.ACQUIRE", "e", "2", "30", "ID", "next"]);
    assert_eq!(distribution(&mut c, "hold")["count"], 1.0);
    assert_eq!(info_sem(&mut c)["sem_expired"], 1);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "h", "1", "30", "ID", "b"]);

    // A waiter served after about 150 ms: one wait of about 150 ms; b's release is a hold.
    let waiter = Pending::send(
        &server,
        &["SEM.ACQUIRE", "h", "1", "30", "ID", "w", "WAIT", "10"],
    );
    wait_until("the waiter queues", Duration::from_secs(10), || {
        info_sem(&mut c)["sem_waiters"] == 1
    });
    sleep(Duration::from_millis(150));
    let _: i64 = run(&mut c, &["SEM.RELEASE", "h", "b"]);
    assert!(waiter.reply().is_ok());
    let wait = distribution(&mut c, "wait");
    assert_eq!(wait["count"], 1.0);
    assert!((150.0..400.0).contains(&wait["p50"]), "{wait:?}");
    assert_eq!(distribution(&mut c, "hold")["count"], 2.0);

    // A BOUND permit given back as its connection closes is released too.
    let mut bound = server.connection();
    let id: i64 = run(&mut bound, &["CLIENT", "ID"]);
    let _: String = run(&mut bound, &["SEM.ACQUIRE", "k", "1", "30", "BOUND"]);
    let _: i64 = run(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    wait_until("the permit comes back", Duration::from_secs(10), || {
        distribution(&mut c, "hold")["count"] == 3.0
    });

    let _: String = run(&mut c, &["CONFIG", "RESETSTAT"]);
    for which in ["wait", "hold"] {
        let emptied = distribution(&mut c, which);
        assert_eq!(emptied["count"], 0.0, "{which}: {emptied:?}");
        assert_eq!(emptied["p99.9"], 0.0, "{which}: {emptied:?}");
    }
}

/// Sets count one wait per waiting set and one hold per semaphore released.
#[test]
fn sets_count_their_waits_and_holds() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIRE", "x", "1", "30", "ID", "h"]);
    let set = Pending::send(
        &server,
        &[
            "SEM.ACQUIREALL",
            "2",
            "x",
            "1",
            "1",
            "y",
            "1",
            "1",
            "30",
            "ID",
            "s",
            "WAIT",
            "10",
        ],
    );
    wait_until("the set queues", Duration::from_secs(10), || {
        info_sem(&mut c)["sem_waiters"] == 1
    });
    let _: i64 = run(&mut c, &["SEM.RELEASE", "x", "h"]);
    assert!(set.reply().is_ok());
    let released: i64 = run(&mut c, &["SEM.RELEASEALL", "2", "x", "y", "s"]);
    assert_eq!(released, 2);
    assert_eq!(distribution(&mut c, "wait")["count"], 1.0);
    assert_eq!(distribution(&mut c, "hold")["count"], 3.0);
}
