//! redsem-client in Redis Cluster, sync and async, through the redis crate's cluster client,
//! on local clusters that the repository's scripts/test-cluster starts. It runs when
//! REDSEM_CLUSTER names the cluster (and skips itself otherwise):
//!   module   the module on every node
//!   filter0  the module loaded with `command-filter 0` (the server takes the long form only,
//!            as Redis 8.4 and later do)
//!   scripts  no module on any node: the crate runs the script
//! with REDIS_SERVER (the server binary), REDSEM_MODULE (the module, absolute) and
//! REDSEM_TEST_CLUSTER (scripts/test-cluster, absolute; by default found from this crate).
//!
//! Five clusters: three primaries for the calls, the errors, the load over three slots and a
//! reshard under load; three primaries with a replica each for a primary killed under a waiter
//! and a holder; three primaries for waiters unblocked (`UNBLOCKED`); three primaries with two
//! replicas each for a durable acquire whose primary dies during its `WAIT`; three primaries,
//! one stopped, for the refreshes of the others.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redsem_client::{aio, Cluster, Error, Semaphore, SemaphoreSet};

/// Which cluster to test, or `None`: skip.
fn mode() -> Option<String> {
    match std::env::var("REDSEM_CLUSTER").as_deref() {
        Ok("") | Err(_) => None,
        Ok(mode @ ("module" | "filter0" | "scripts")) => Some(mode.to_string()),
        Ok(other) => panic!("REDSEM_CLUSTER is module, filter0 or scripts, not {other:?}"),
    }
}

fn scripts() -> bool {
    mode().as_deref() == Some("scripts")
}

fn test_cluster() -> PathBuf {
    std::env::var_os("REDSEM_TEST_CLUSTER").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../scripts/test-cluster"
            ))
        },
        PathBuf::from,
    )
}

fn module() -> String {
    std::env::var("REDSEM_MODULE").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/debug/libredsem.so"
        )
        .to_string()
    })
}

/// scripts/test-cluster with `args`; what it printed.
fn driver(args: &[&str]) -> String {
    let out = Command::new(test_cluster())
        .args(args)
        .output()
        .expect("cannot run scripts/test-cluster");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "test-cluster {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[derive(Debug, Clone)]
struct Node {
    port: u16,
    pid: u32,
    alive: bool,
    primary: bool,
    slots: Vec<(u16, u16)>,
}

/// A cluster that scripts/test-cluster started; dropping it stops every node.
struct Nodes {
    dir: PathBuf,
}

impl Nodes {
    fn start(replicas: usize) -> Nodes {
        let dir = std::env::temp_dir().join(format!(
            "redsem-rust-cluster-{}-{replicas}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos()
        ));
        let dir_text = dir.to_string_lossy().to_string();
        let replicas = replicas.to_string();
        let module = module();
        let mut args = vec!["start", &dir_text, "--replicas", &replicas];
        match mode().as_deref() {
            Some("module") => args.extend(["--module", &module]),
            Some("filter0") => args.extend([
                "--module",
                &module,
                "--module-arg",
                "command-filter",
                "--module-arg",
                "0",
            ]),
            _ => args.push("--modules-later"),
        }
        driver(&args);
        Nodes { dir }
    }

    fn dir(&self) -> String {
        self.dir.to_string_lossy().to_string()
    }

    fn nodes(&self) -> Vec<Node> {
        let text = driver(&["nodes", &self.dir()]);
        let json: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|node| Node {
                port: node["port"].as_u64().unwrap() as u16,
                pid: node["pid"].as_u64().unwrap() as u32,
                alive: node["alive"].as_bool().unwrap(),
                primary: node["primary"].as_bool().unwrap(),
                slots: node["slots"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| (r[0].as_u64().unwrap() as u16, r[1].as_u64().unwrap() as u16))
                    .collect(),
            })
            .collect()
    }

    fn primaries(&self) -> Vec<Node> {
        self.nodes()
            .into_iter()
            .filter(|n| n.alive && n.primary && !n.slots.is_empty())
            .collect()
    }

    fn owner(&self, slot: u16) -> u16 {
        self.primaries()
            .iter()
            .find(|n| n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .expect("no primary serves the slot")
            .port
    }

    fn client(&self) -> ClusterClient {
        let addresses: Vec<String> = self
            .nodes()
            .iter()
            .filter(|n| n.alive)
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect();
        ClusterClient::builder(addresses)
            .connection_timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    }

    fn cluster(&self) -> Cluster {
        Cluster::new(self.client())
    }

    fn conn(&self, port: u16) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap()
    }

    fn move_slot(&self, slot: u16, to: u16, pause_ms: u64) {
        let (slot, to, pause) = (slot.to_string(), to.to_string(), pause_ms.to_string());
        driver(&["move", &self.dir(), &slot, &to, "--pause-ms", &pause]);
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let _ = Command::new(test_cluster())
            .args(["stop", &self.dir()])
            .output();
    }
}

fn slot(key: &str) -> u16 {
    redis::cluster_routing::get_slot(key.as_bytes())
}

/// `{<prefix><n>}` names, one in each of the slots of three different primaries.
fn names_on_each_primary(nodes: &Nodes, prefix: &str) -> Vec<String> {
    let primaries = nodes.primaries();
    let owner = |slot: u16| {
        primaries
            .iter()
            .position(|n| n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .unwrap()
    };
    let mut names = Vec::new();
    let mut owners = Vec::new();
    for n in 0.. {
        let name = format!("{{{prefix}{n}}}");
        if !owners.contains(&owner(slot(&name))) {
            owners.push(owner(slot(&name)));
            names.push(name);
        }
        if names.len() == 3 {
            return names;
        }
    }
    unreachable!()
}

impl Nodes {
    /// The calls each primary served so far (`INFO commandstats`), but for those of the test
    /// itself and of connecting (`INFO`, `CLIENT SETINFO`, `CLUSTER NODES`).
    fn commands_served(&self) -> Vec<u64> {
        self.primaries()
            .iter()
            .map(|n| {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut self.conn(n.port))
                    .unwrap();
                info.lines()
                    .filter_map(|l| l.strip_prefix("cmdstat_"))
                    .filter(|l| {
                        !["info:", "client|setinfo:", "cluster|nodes:", "ping:"]
                            .iter()
                            .any(|ours| l.starts_with(ours))
                    })
                    .map(|l| {
                        let calls = l.split("calls=").nth(1).unwrap();
                        calls.split(',').next().unwrap().parse::<u64>().unwrap()
                    })
                    .sum()
            })
            .collect()
    }

    /// The redirections and refusals the primaries answered so far (`INFO errorstats`):
    /// MOVED, ASK and TRYAGAIN.
    fn redirections(&self) -> u64 {
        self.primaries()
            .iter()
            .map(|n| {
                let info: String = redis::cmd("INFO")
                    .arg("errorstats")
                    .query(&mut self.conn(n.port))
                    .unwrap();
                info.lines()
                    .filter(|l| {
                        ["errorstat_MOVED:", "errorstat_ASK:", "errorstat_TRYAGAIN:"]
                            .iter()
                            .any(|kind| l.starts_with(kind))
                    })
                    .map(|l| {
                        let count = l.split("count=").nth(1).unwrap();
                        count.trim().parse::<u64>().unwrap()
                    })
                    .sum::<u64>()
            })
            .sum()
    }

    fn keys(&self) -> usize {
        self.primaries()
            .iter()
            .map(|n| {
                redis::cmd("DBSIZE")
                    .query::<usize>(&mut self.conn(n.port))
                    .unwrap()
            })
            .sum()
    }
}

const NO_TAG: &str = "in Redis Cluster a semaphore's name needs a hash tag, e.g. \"{jobs}\" or \
     \"app:{jobs}\": the keys of \"jobs\" (jobs, jobs:owner, jobs:counter, jobs:permits, \
     jobs:limit) would fall in different slots";
const CROSS_SLOT: &str = "in Redis Cluster the semaphores of a set must share a slot: give their \
     names one hash tag, e.g. \"{app}a\" and \"{app}b\" (\"a\" is in slot 15495, \"b\" in slot 3300)";

fn assert_bad_name<T: std::fmt::Debug>(result: Result<T, Error>, text: &str) {
    match result {
        Err(Error::BadName(got)) => assert_eq!(got, text),
        other => panic!("expected BadName, got {other:?}"),
    }
}

/// Bad names, sync and async: the error, and nothing sent to any node (each node served only
/// the `INFO` that counts).
fn bad_names_send_nothing(nodes: &Nodes, cluster: &Cluster, rt: &tokio::runtime::Runtime) {
    let before = nodes.commands_served();
    assert_bad_name(Semaphore::new(cluster, "jobs").acquire(), NO_TAG);
    assert_bad_name(redsem_client::in_use(cluster, "jobs"), NO_TAG);
    assert_bad_name(redsem_client::set_limit(cluster, "jobs", 3), NO_TAG);
    assert_bad_name(
        redsem_client::wait_empty(cluster, "jobs", Duration::ZERO),
        NO_TAG,
    );
    let set = SemaphoreSet::new(cluster)
        .semaphore("a", 1, 1)
        .semaphore("b", 1, 1);
    assert_bad_name(set.acquire(), CROSS_SLOT);
    rt.block_on(async {
        assert_bad_name(aio::Semaphore::new(cluster, "jobs").acquire().await, NO_TAG);
        assert_bad_name(aio::stored_limit(cluster, "jobs").await, NO_TAG);
        let set = aio::SemaphoreSet::new(cluster)
            .semaphore("a", 1, 1)
            .semaphore("b", 1, 1);
        assert_bad_name(set.acquire().await, CROSS_SLOT);
    });
    let after = nodes.commands_served();
    let sent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(sent.iter().all(|&n| n == 0), "commands sent: {sent:?}");
    assert_eq!(nodes.keys(), 0);
}

/// The calls of one permit, sync: the limit, the release, fair tickets, a waiter served after
/// a release, and the keys on the node that serves the name.
fn calls_sync(nodes: &Nodes, cluster: &Cluster, name: &str) {
    let jobs = Semaphore::new(cluster, name).limit(2);
    let first = jobs.acquire().unwrap();
    let second = jobs.acquire().unwrap();
    assert!(matches!(jobs.acquire(), Err(Error::NotAcquired)));
    assert_eq!(redsem_client::in_use(cluster, name).unwrap(), 2);
    let mut owner = nodes.conn(nodes.owner(slot(name)));
    assert_eq!(
        redis::cmd("EXISTS")
            .arg(name)
            .query::<i64>(&mut owner)
            .unwrap(),
        1
    );
    assert!(first.release().unwrap());
    drop(second);
    assert_eq!(redsem_client::in_use(cluster, name).unwrap(), 0);

    let fair = Semaphore::new(cluster, name).limit(1).fair(true);
    let mut last = 0;
    for _ in 0..3 {
        let permit = fair.acquire().unwrap();
        let ticket = permit.ticket().unwrap();
        assert!(ticket > last, "{ticket} after {last}");
        last = ticket;
        assert!(permit.release().unwrap());
    }

    // Several permits at once, some given back.
    let mut two = jobs.clone().count(2).acquire().unwrap();
    assert!(two.release_some(1).unwrap());
    assert_eq!(redsem_client::in_use(cluster, name).unwrap(), 1);
    assert!(two.release().unwrap());

    // A bound permit: given back by the node when its connection to the node closes.
    let bound = jobs.clone().bound(true).auto_refresh(false);
    if scripts() {
        assert!(matches!(
            bound.acquire(),
            Err(Error::ModuleRequired("BOUND"))
        ));
    } else {
        let permit = bound.acquire().unwrap();
        assert_eq!(redsem_client::in_use(cluster, name).unwrap(), 1);
        let _: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
            .query(&mut owner)
            .unwrap();
        assert_eq!(redsem_client::in_use(cluster, name).unwrap(), 0);
        assert!(!permit.refresh().unwrap());
        assert!(!permit.release().unwrap());
    }

    // A refresh that finds no holder on the node reports the permit lost.
    let permit = jobs.clone().auto_refresh(false).acquire().unwrap();
    let _: i64 = redis::cmd("DEL").arg(name).query(&mut owner).unwrap();
    assert!(!permit.refresh().unwrap());
    assert!(permit.is_lost());
    assert!(!permit.release().unwrap());

    let holder = fair.acquire().unwrap();
    let waiting = fair.clone().wait(Some(Duration::from_secs(10)));
    let waiter = thread::spawn(move || waiting.acquire());
    thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished());
    assert!(holder.release().unwrap());
    let served = waiter.join().unwrap().unwrap();
    assert!(served.ticket().unwrap() > last);
    assert!(served.release().unwrap());
}

/// The same, async.
async fn calls_async(cluster: &Cluster, name: &str, owner: &mut redis::Connection) {
    let jobs = aio::Semaphore::new(cluster, name).limit(2);
    let first = jobs.acquire().await.unwrap();
    let second = jobs.acquire().await.unwrap();
    assert!(matches!(jobs.acquire().await, Err(Error::NotAcquired)));
    assert_eq!(aio::in_use(cluster, name).await.unwrap(), 2);
    assert!(first.release().await.unwrap());
    assert!(second.release().await.unwrap());
    assert_eq!(aio::in_use(cluster, name).await.unwrap(), 0);

    let fair = aio::Semaphore::new(cluster, name).limit(1).fair(true);
    let mut last = 0;
    for _ in 0..3 {
        let permit = fair.acquire().await.unwrap();
        let ticket = permit.ticket().unwrap();
        assert!(ticket > last, "{ticket} after {last}");
        last = ticket;
        assert!(permit.release().await.unwrap());
    }
    let mut two = jobs.clone().count(2).acquire().await.unwrap();
    assert!(two.release_some(1).await.unwrap());
    assert_eq!(aio::in_use(cluster, name).await.unwrap(), 1);
    assert!(two.release().await.unwrap());

    let bound = jobs.clone().bound(true).auto_refresh(false);
    if scripts() {
        assert!(matches!(
            bound.acquire().await,
            Err(Error::ModuleRequired("BOUND"))
        ));
    } else {
        let permit = bound.acquire().await.unwrap();
        assert_eq!(aio::in_use(cluster, name).await.unwrap(), 1);
        let _: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
            .query(owner)
            .unwrap();
        assert_eq!(aio::in_use(cluster, name).await.unwrap(), 0);
        assert!(!permit.refresh().await.unwrap());
        assert!(!permit.release().await.unwrap());
    }

    let permit = jobs.clone().auto_refresh(false).acquire().await.unwrap();
    let _: i64 = redis::cmd("DEL").arg(name).query(owner).unwrap();
    assert!(!permit.refresh().await.unwrap());
    assert!(permit.is_lost());
    assert!(!permit.release().await.unwrap());

    let holder = fair.acquire().await.unwrap();
    let waiting = fair.clone().wait(Some(Duration::from_secs(10)));
    let waiter = tokio::spawn(async move { waiting.acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    assert!(holder.release().await.unwrap());
    let served = waiter.await.unwrap().unwrap();
    assert!(served.ticket().unwrap() > last);
    assert!(served.release().await.unwrap());
}

/// A Cluster made of a sync cluster connection serves the sync API, one made of an async
/// connection the async API; each refuses the other API clearly.
fn clusters_made_of_connections(nodes: &Nodes, rt: &tokio::runtime::Runtime) {
    let sync = Cluster::from_connection(nodes.client().get_connection().unwrap());
    let permit = Semaphore::new(&sync, "{made}").acquire().unwrap();
    assert_eq!(redsem_client::in_use(&sync, "{made}").unwrap(), 1);
    assert!(permit.release().unwrap());
    rt.block_on(async {
        match aio::in_use(&sync, "{made}").await {
            Err(Error::Redis(err)) => assert!(err.to_string().contains("sync API only")),
            other => panic!("{other:?}"),
        }
        let conn = nodes.client().get_async_connection().await.unwrap();
        let asynchronous = Cluster::from_async_connection(conn);
        let permit = aio::Semaphore::new(&asynchronous, "{made}")
            .acquire()
            .await
            .unwrap();
        assert_eq!(aio::in_use(&asynchronous, "{made}").await.unwrap(), 1);
        assert!(permit.release().await.unwrap());
        match redsem_client::in_use(&asynchronous, "{made}") {
            Err(Error::Redis(err)) => assert!(err.to_string().contains("async API only")),
            other => panic!("{other:?}"),
        }
    });
}

/// Sets, wait_empty and the stored limit, sync and async (sets and wait_empty need the module).
fn sets_and_limits(cluster: &Cluster, rt: &tokio::runtime::Runtime) {
    let set = SemaphoreSet::new(cluster)
        .semaphore("{app}a", 1, 1)
        .semaphore("{app}b", 2, 1)
        .fair(true);
    if scripts() {
        assert!(matches!(set.acquire(), Err(Error::ModuleRequired(_))));
        assert!(matches!(
            redsem_client::wait_empty(cluster, "{app}a", Duration::ZERO),
            Err(Error::ModuleRequired(_))
        ));
        rt.block_on(async {
            let set = aio::SemaphoreSet::new(cluster).semaphore("{app}a", 1, 1);
            assert!(matches!(set.acquire().await, Err(Error::ModuleRequired(_))));
        });
    } else {
        let permits = set.acquire().unwrap();
        assert_eq!(permits.tickets().unwrap().len(), 2);
        assert!(matches!(set.acquire(), Err(Error::NotAcquired)));
        assert!(!redsem_client::wait_empty(cluster, "{app}a", Duration::from_millis(100)).unwrap());
        assert!(permits.refresh().unwrap());
        assert!(permits.release().unwrap());
        assert!(redsem_client::wait_empty(cluster, "{app}a", Duration::ZERO).unwrap());
        rt.block_on(async {
            let set = aio::SemaphoreSet::new(cluster)
                .semaphore("{app}a", 1, 1)
                .semaphore("{app}b", 2, 1);
            let permits = set.acquire().await.unwrap();
            let cluster2 = cluster.clone();
            let emptied = tokio::spawn(async move {
                aio::wait_empty(&cluster2, "{app}a", Duration::from_secs(10)).await
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(permits.release().await.unwrap());
            assert!(emptied.await.unwrap().unwrap());
        });
    }
    redsem_client::set_limit(cluster, "{lim}", 0).unwrap();
    assert_eq!(
        redsem_client::stored_limit(cluster, "{lim}").unwrap(),
        Some(0)
    );
    assert!(matches!(
        Semaphore::new(cluster, "{lim}").limit(5).acquire(),
        Err(Error::NotAcquired)
    ));
    rt.block_on(async {
        aio::set_limit(cluster, "{lim}", 1).await.unwrap();
        assert_eq!(aio::stored_limit(cluster, "{lim}").await.unwrap(), Some(1));
        let permit = aio::Semaphore::new(cluster, "{lim}")
            .limit(5)
            .acquire()
            .await
            .unwrap();
        assert!(matches!(
            aio::Semaphore::new(cluster, "{lim}")
                .limit(5)
                .acquire()
                .await,
            Err(Error::NotAcquired)
        ));
        assert!(permit.release().await.unwrap());
        assert!(aio::clear_limit(cluster, "{lim}").await.unwrap());
    });
    assert_eq!(redsem_client::stored_limit(cluster, "{lim}").unwrap(), None);
}

/// The waiters of `name` in line on its node: the module's, or the script's (`<name>:line`).
fn in_line(conn: &mut redis::Connection, name: &str) -> u64 {
    if scripts() {
        return redis::cmd("ZCARD")
            .arg(format!("{name}:line"))
            .query(conn)
            .unwrap();
    }
    let mut get = redis::cmd("SEM.GET");
    get.arg(name);
    for suffix in [":owner", ":counter", ":permits", ":limit"] {
        get.arg(format!("{name}{suffix}"));
    }
    let json: String = get.arg("JSON").query(conn).unwrap();
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    json["waiters"].as_u64().unwrap()
}

/// On the slot's primary, the line as the module keeps it: fair waiters arriving 30 ms apart
/// are granted in that order, and a lease's end is handed on within 150 ms (sync and async).
fn the_line_on_the_slots_primary(nodes: &Nodes, cluster: &Cluster, rt: &tokio::runtime::Runtime) {
    let name = "{line}";
    let mut owner = nodes.conn(nodes.owner(slot(name)));
    let sem = Semaphore::new(cluster, name)
        .fair(true)
        .wait(Some(Duration::from_secs(20)));
    let holder = sem.clone().wait(None).acquire().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for n in 0..4 {
        let (sem, order) = (sem.clone(), order.clone());
        waiters.push(thread::spawn(move || {
            let permit = sem.acquire().unwrap();
            order.lock().unwrap().push(n);
            assert!(permit.release().unwrap());
        }));
        let started = Instant::now();
        while in_line(&mut owner, name) != n + 1 {
            assert!(started.elapsed() < Duration::from_secs(10), "not in line");
            thread::sleep(Duration::from_millis(5));
        }
        thread::sleep(Duration::from_millis(30));
    }
    assert!(holder.release().unwrap());
    for waiter in waiters {
        waiter.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);

    let lease = Duration::from_millis(300);
    let holder = sem
        .clone()
        .wait(None)
        .lease(lease)
        .auto_refresh(false)
        .acquire()
        .unwrap();
    let lease_end = Instant::now() + lease;
    let permit = sem.acquire().unwrap();
    let late = Instant::now().saturating_duration_since(lease_end);
    assert!(
        late < Duration::from_millis(150),
        "{late:?} after the lease"
    );
    assert!(!holder.release().unwrap());
    assert!(permit.release().unwrap());
    rt.block_on(async {
        let sem = aio::Semaphore::new(cluster, name).fair(true);
        let holder = sem
            .clone()
            .lease(lease)
            .auto_refresh(false)
            .acquire()
            .await
            .unwrap();
        let lease_end = Instant::now() + lease;
        let permit = sem
            .wait(Some(Duration::from_secs(5)))
            .acquire()
            .await
            .unwrap();
        let late = Instant::now().saturating_duration_since(lease_end);
        assert!(
            late < Duration::from_millis(150),
            "async: {late:?} after the lease"
        );
        assert!(!holder.release().await.unwrap());
        assert!(permit.release().await.unwrap());
    });
}

/// What a load saw: the most holders of each name at once, each name's tickets in the order
/// granted, and the calls that failed.
#[derive(Default)]
struct Seen {
    holding: HashMap<String, usize>,
    most: HashMap<String, usize>,
    tickets: HashMap<String, Vec<u64>>,
    errors: Vec<String>,
    lost: usize,
    grants: usize,
}

impl Seen {
    fn granted(&mut self, name: &str, ticket: Option<u64>) {
        let holding = self.holding.entry(name.to_string()).or_default();
        *holding += 1;
        let most = self.most.entry(name.to_string()).or_default();
        *most = (*most).max(*holding);
        if let Some(ticket) = ticket {
            self.tickets
                .entry(name.to_string())
                .or_default()
                .push(ticket);
        }
        self.grants += 1;
    }

    fn leaving(&mut self, name: &str) {
        *self.holding.get_mut(name).unwrap() -= 1;
    }

    /// No name over its limit, tickets strictly growing (limit 1: grants in order), no
    /// failed call, no permit lost.
    fn check(&self, limit: usize) {
        assert!(self.errors.is_empty(), "calls failed: {:?}", self.errors);
        for (name, most) in &self.most {
            assert!(*most <= limit, "{name}: {most} holders at once");
        }
        for (name, tickets) in &self.tickets {
            assert!(
                tickets.windows(2).all(|w| w[0] < w[1]),
                "{name}: tickets {tickets:?}"
            );
        }
        assert_eq!(self.lost, 0, "permits lost");
        assert!(self.grants > 0);
    }
}

/// `workers` sync threads and as many async tasks per name take and give back permits of
/// `names` (waiting; fair when `limit` is 1, so that the tickets follow the grants) until
/// `stop`.
fn load(
    cluster: &Cluster,
    names: &[String],
    limit: u32,
    workers: usize,
    stop: &Arc<AtomicBool>,
    seen: &Arc<Mutex<Seen>>,
    rt: &tokio::runtime::Runtime,
) -> (
    Vec<thread::JoinHandle<()>>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let mut threads = Vec::new();
    let mut tasks = Vec::new();
    for name in names {
        for _ in 0..workers {
            let sem = Semaphore::new(cluster, name.clone())
                .limit(limit)
                .fair(limit == 1)
                .lease(Duration::from_secs(10))
                .wait(Some(Duration::from_secs(20)));
            let (stop_, seen_, name_) = (stop.clone(), seen.clone(), name.clone());
            threads.push(thread::spawn(move || {
                let (stop, seen, name) = (stop_, seen_, name_);
                while !stop.load(Ordering::SeqCst) {
                    match sem.acquire() {
                        Ok(permit) => {
                            seen.lock().unwrap().granted(&name, permit.ticket());
                            thread::sleep(Duration::from_millis(5));
                            seen.lock().unwrap().leaving(&name);
                            match permit.release() {
                                Ok(true) => {}
                                Ok(false) => seen.lock().unwrap().lost += 1,
                                Err(err) => seen.lock().unwrap().errors.push(err.to_string()),
                            }
                        }
                        Err(err) => seen.lock().unwrap().errors.push(err.to_string()),
                    }
                }
            }));
            let sem = aio::Semaphore::new(cluster, name.clone())
                .limit(limit)
                .fair(limit == 1)
                .lease(Duration::from_secs(10))
                .wait(Some(Duration::from_secs(20)));
            let (stop, seen, name) = (stop.clone(), seen.clone(), name.clone());
            tasks.push(rt.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    match sem.acquire().await {
                        Ok(permit) => {
                            seen.lock().unwrap().granted(&name, permit.ticket());
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            seen.lock().unwrap().leaving(&name);
                            match permit.release().await {
                                Ok(true) => {}
                                Ok(false) => seen.lock().unwrap().lost += 1,
                                Err(err) => seen.lock().unwrap().errors.push(err.to_string()),
                            }
                        }
                        Err(err) => seen.lock().unwrap().errors.push(err.to_string()),
                    }
                }
            }));
        }
    }
    (threads, tasks)
}

fn finish(
    stop: &AtomicBool,
    rt: &tokio::runtime::Runtime,
    (threads, tasks): (
        Vec<thread::JoinHandle<()>>,
        Vec<tokio::task::JoinHandle<()>>,
    ),
) {
    stop.store(true, Ordering::SeqCst);
    for thread in threads {
        thread.join().unwrap();
    }
    rt.block_on(async {
        for task in tasks {
            task.await.unwrap();
        }
    });
}

/// The cluster example of clients/rust/README.md, but for the cluster's addresses.
fn readme_cluster_example(urls: Vec<String>) -> Result<(), Error> {
    // README cluster example begins
    let nodes = redis::cluster::ClusterClient::new(urls)?;
    let cluster = redsem_client::Cluster::new(nodes);
    // In Redis Cluster a name needs a hash tag: "{jobs}" keeps all of its keys in one slot.
    let permit = Semaphore::new(&cluster, "{jobs}")
        .limit(3)
        .wait(Some(Duration::from_secs(10)))
        .acquire()?;
    assert!(permit.release()?, "the lease ran out during the work");
    // The same cluster serves the async API: redsem_client::aio::Semaphore::new(&cluster, "{jobs}").
    // README cluster example ends
    Ok(())
}

fn the_readme_cluster_example(nodes: &Nodes) {
    let urls = nodes
        .primaries()
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}/", n.port))
        .collect();
    readme_cluster_example(urls).unwrap();
    let this_file = include_str!("cluster.rs");
    let begin = this_file
        .find("// README cluster example begins\n")
        .unwrap();
    let end = this_file
        .find("    // README cluster example ends")
        .unwrap();
    let example: String = this_file[begin..end]
        .lines()
        .skip(1)
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
        .collect();
    let example = example.replace(
        "new(urls)",
        "new(vec![\"redis://127.0.0.1:7000/\", \"redis://127.0.0.1:7001/\"])",
    );
    assert!(
        include_str!("../README.md").contains(&example),
        "clients/rust/README.md lacks:\n{example}"
    );
}

#[test]
fn calls_errors_load_and_a_reshard_under_load() {
    if mode().is_none() {
        eprintln!("REDSEM_CLUSTER is not set: the cluster tests skip themselves");
        return;
    }
    let started = Instant::now();
    let nodes = Nodes::start(0);
    let cluster = nodes.cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();

    bad_names_send_nothing(&nodes, &cluster, &rt);
    the_readme_cluster_example(&nodes);
    calls_sync(&nodes, &cluster, "{calls}");
    let mut owner = nodes.conn(nodes.owner(slot("{calls-async}")));
    rt.block_on(calls_async(&cluster, "{calls-async}", &mut owner));
    sets_and_limits(&cluster, &rt);
    the_line_on_the_slots_primary(&nodes, &cluster, &rt);
    clusters_made_of_connections(&nodes, &rt);

    // Limits under concurrent acquirers over names in three slots (three primaries).
    let names = names_on_each_primary(&nodes, "load");
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let workers = load(&cluster, &names, 2, 3, &stop, &seen, &rt);
    thread::sleep(Duration::from_secs(2));
    finish(&stop, &rt, workers);
    let seen = seen.lock().unwrap();
    seen.check(2);
    // Each name had its two holders at once, never three.
    assert!(
        names.iter().all(|name| seen.most[name] == 2),
        "{:?}",
        seen.most
    );
    drop(seen);

    // A reshard under load: the slot of `{moving}` moves to another primary key by key and
    // back while acquirers, waiters and releases go on.
    let name = "{moving}".to_string();
    let moving = slot(&name);
    let from = nodes.owner(moving);
    let to = nodes
        .primaries()
        .iter()
        .find(|n| n.port != from)
        .unwrap()
        .port;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let workers = load(
        &cluster,
        std::slice::from_ref(&name),
        1,
        3,
        &stop,
        &seen,
        &rt,
    );
    let redirections = nodes.redirections();
    thread::sleep(Duration::from_millis(300));
    for port in [to, from] {
        let before = seen.lock().unwrap().grants;
        nodes.move_slot(moving, port, 50);
        assert_eq!(nodes.owner(moving), port);
        thread::sleep(Duration::from_millis(300));
        assert!(
            seen.lock().unwrap().grants > before,
            "no grant across the move"
        );
    }
    finish(&stop, &rt, workers);
    let seen = seen.lock().unwrap();
    seen.check(1);
    // The calls met the move: the nodes answered MOVED, ASK or TRYAGAIN.
    let redirections = nodes.redirections() - redirections;
    assert!(redirections > 0);
    eprintln!(
        "reshard under load: {redirections} redirections, {} grants, {} tickets; all in {:.1} s",
        seen.grants,
        seen.tickets.values().map(Vec::len).sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(redsem_client::in_use(&cluster, &name).unwrap(), 0);
}

#[test]
fn a_primary_killed_under_a_waiter_and_a_holder() {
    if mode().is_none() {
        return;
    }
    let nodes = Nodes::start(1);
    let cluster = nodes.cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Two names on one primary: one for the sync API, one for the async one.
    let sync_name = "{fail}".to_string();
    let victim = nodes.owner(slot(&sync_name));
    let async_name = (0..)
        .map(|n| format!("{{fail{n}}}"))
        .find(|name| nodes.owner(slot(name)) == victim)
        .unwrap();

    // The holders' grants reach the replica (durable) before the kill.
    let sem = Semaphore::new(&cluster, sync_name.clone())
        .lease(Duration::from_secs(15))
        .auto_refresh(false);
    let holder = sem
        .clone()
        .durable(1, Duration::from_secs(5))
        .acquire()
        .unwrap();
    let waiting = sem.clone().wait(Some(Duration::from_secs(40)));
    let waiter = thread::spawn(move || waiting.acquire());
    let asem = aio::Semaphore::new(&cluster, async_name.clone())
        .lease(Duration::from_secs(15))
        .auto_refresh(false);
    let aholder = rt
        .block_on(asem.clone().durable(1, Duration::from_secs(5)).acquire())
        .unwrap();
    let awaiting = asem.clone().wait(Some(Duration::from_secs(40)));
    let awaiter = rt.spawn(async move { awaiting.acquire().await });
    thread::sleep(Duration::from_millis(500));

    let dir = nodes.dir();
    driver(&["kill", &dir, &victim.to_string()]);
    driver(&["wait", &dir]);
    let new_owner = nodes.owner(slot(&sync_name));
    assert_ne!(new_owner, victim);

    // The holders: a refresh on the new primary either succeeds or reports the permit lost;
    // while they hold, the waiters have nothing.
    let held = holder.refresh().unwrap();
    let aheld = rt.block_on(aholder.refresh()).unwrap();
    assert_eq!(held, !holder.is_lost());
    assert_eq!(aheld, !aholder.is_lost());
    // Durable grants: the replica that took over has them.
    assert!(held && aheld);
    if held {
        assert!(!waiter.is_finished(), "a second permit of {sync_name}");
    }
    if aheld {
        assert!(!awaiter.is_finished(), "a second permit of {async_name}");
    }
    // The waiters wait again, on the new primary.
    let mut conn = nodes.conn(new_owner);
    let started = Instant::now();
    while waiting_on(&mut conn, &[&sync_name, &async_name]) < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the waiters are not in line"
        );
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(holder.release().unwrap(), held);
    assert_eq!(rt.block_on(aholder.release()).unwrap(), aheld);

    // The waiters: each gets its permit (they wait again on the new primary), never two.
    let served = waiter.join().unwrap().unwrap();
    let aserved = rt.block_on(awaiter).unwrap().unwrap();
    assert_eq!(redsem_client::in_use(&cluster, &sync_name).unwrap(), 1);
    assert_eq!(rt.block_on(aio::in_use(&cluster, &async_name)).unwrap(), 1);
    assert!(served.release().unwrap());
    assert!(rt.block_on(aserved.release()).unwrap());

    // The new primary has no replica: killed, its slots have no owner, and a call gives up
    // with Error::Unavailable once its retry budget has passed.
    driver(&["kill", &dir, &new_owner.to_string()]);
    let short = Cluster::new(nodes.client()).retry_for(Duration::from_millis(1500));
    let started = Instant::now();
    match Semaphore::new(&short, sync_name.clone()).acquire() {
        Err(err @ Error::Unavailable { .. }) => assert!(
            err.to_string()
                .starts_with("the node serving the semaphore's slot gave no answer within the retry budget (1.5 s)"),
            "{err}"
        ),
        other => panic!("an acquire without an owner: {other:?}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1000) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    match rt.block_on(aio::Semaphore::new(&short, async_name.clone()).acquire()) {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("an async acquire without an owner: {other:?}"),
    }
}

/// The clients waiting on this node for a permit of `names`: in the module's line, or blocked
/// in `BLPOP` (the script's waiters).
fn waiting_on(conn: &mut redis::Connection, names: &[&str]) -> usize {
    if scripts() {
        let clients: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
        return clients
            .lines()
            .filter(|client| client.contains(" flags=b ") && client.contains(" cmd=blpop "))
            .count();
    }
    names
        .iter()
        .filter(|name| {
            let mut get = redis::cmd("SEM.GET");
            get.arg(name);
            for suffix in [":owner", ":counter", ":permits", ":limit"] {
                get.arg(format!("{name}{suffix}"));
            }
            let json: String = get.arg("JSON").query(conn).unwrap();
            json.contains("\"waiters\":1")
        })
        .count()
}

/// Ends the wait of the one client blocked on this node (`CLIENT UNBLOCK <id> ERROR`: the
/// `UNBLOCKED` error that a failover gives blocked clients), once it blocks.
fn unblock_the_waiter(conn: &mut redis::Connection) {
    let started = Instant::now();
    loop {
        let clients: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
        let blocked = clients
            .lines()
            .find(|client| client.contains(" flags=b "))
            .and_then(|client| client.strip_prefix("id="))
            .and_then(|rest| rest.split(' ').next())
            .map(|id| id.to_string());
        if let Some(id) = blocked {
            let unblocked: i64 = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(&id)
                .arg("ERROR")
                .query(conn)
                .unwrap();
            assert_eq!(unblocked, 1);
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "nobody blocks");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A waiter whose blocked call ends with `UNBLOCKED` (`CLIENT UNBLOCK <id> ERROR`) waits again
/// on the slot's owner, sync and async: served when a permit frees up, and refused when what
/// was left of its wait has passed, not a whole wait later.
#[test]
fn an_unblocked_waiter_waits_again_within_its_wait() {
    if mode().is_none() {
        return;
    }
    let nodes = Nodes::start(0);
    let cluster = nodes.cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let name = "{unblocked}".to_string();
    let mut conn = nodes.conn(nodes.owner(slot(&name)));
    let sem = Semaphore::new(&cluster, name.clone()).auto_refresh(false);
    let asem = aio::Semaphore::new(&cluster, name.clone()).auto_refresh(false);

    // Unblocked twice, then served.
    let holder = sem.acquire().unwrap();
    let waiting = sem.clone().wait(Some(Duration::from_secs(20)));
    let waiter = thread::spawn(move || waiting.acquire());
    unblock_the_waiter(&mut conn);
    unblock_the_waiter(&mut conn);
    assert!(!waiter.is_finished());
    assert!(holder.release().unwrap());
    let served = waiter.join().unwrap().unwrap();
    assert_eq!(redsem_client::in_use(&cluster, &name).unwrap(), 1);
    assert!(served.release().unwrap());

    let holder = sem.acquire().unwrap();
    let awaiting = asem.clone().wait(Some(Duration::from_secs(20)));
    let awaiter = rt.spawn(async move { awaiting.acquire().await });
    unblock_the_waiter(&mut conn);
    unblock_the_waiter(&mut conn);
    assert!(!awaiter.is_finished());
    assert!(holder.release().unwrap());
    let served = rt.block_on(awaiter).unwrap().unwrap();
    assert!(rt.block_on(served.release()).unwrap());

    // Unblocked after 1 s of a 2.5 s wait: refused at 2.5 s.
    let holder = sem.acquire().unwrap();
    let started = Instant::now();
    let waiting = sem.clone().wait(Some(Duration::from_millis(2500)));
    let waiter = thread::spawn(move || waiting.acquire());
    thread::sleep(Duration::from_secs(1));
    unblock_the_waiter(&mut conn);
    assert!(matches!(waiter.join().unwrap(), Err(Error::NotAcquired)));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2400) && waited < Duration::from_millis(3200),
        "{waited:?}"
    );
    let started = Instant::now();
    let awaiting = asem.clone().wait(Some(Duration::from_millis(2500)));
    let awaiter = rt.spawn(async move { awaiting.acquire().await });
    thread::sleep(Duration::from_secs(1));
    unblock_the_waiter(&mut conn);
    assert!(matches!(
        rt.block_on(awaiter).unwrap(),
        Err(Error::NotAcquired)
    ));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2400) && waited < Duration::from_millis(3200),
        "{waited:?}"
    );
    assert!(holder.release().unwrap());
    assert_eq!(redsem_client::in_use(&cluster, &name).unwrap(), 0);
}

/// `kill -<signal> <pid>`.
fn signal(signal: &str, pid: u32) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// The replicas of the primary at `port`.
fn replicas_of(nodes: &Nodes, port: u16) -> Vec<Node> {
    nodes
        .nodes()
        .into_iter()
        .filter(|node| node.alive && !node.primary)
        .filter(|node| {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut nodes.conn(node.port))
                .unwrap();
            info.contains(&format!("master_port:{port}\r\n"))
        })
        .collect()
}

/// A durable acquire whose primary dies while its `WAIT numreplicas` blocks (its two replicas
/// are stopped and cut off: the grant reaches neither) is not called durable by a `WAIT` on a new
/// connection to the new primary, which its other replica, following it, answers at once: it
/// fails with `NotDurable`, and nothing is held. Sync and async.
#[test]
fn a_durable_wait_cut_by_a_failover_is_not_answered_by_another_connection() {
    if mode().is_none() {
        return;
    }
    let nodes = Nodes::start(2);
    let cluster = nodes.cluster();
    let sync_name = "{durable}".to_string();
    let sync_owner = nodes.owner(slot(&sync_name));
    let async_name = (0..)
        .map(|n| format!("{{durable{n}}}"))
        .find(|name| nodes.owner(slot(name)) != sync_owner)
        .unwrap();
    let async_owner = nodes.owner(slot(&async_name));
    let third_name = (0..)
        .map(|n| format!("{{durable-{n}}}"))
        .find(|name| ![sync_owner, async_owner].contains(&nodes.owner(slot(name))))
        .unwrap();
    // The third: the replicas are stopped but not cut off, so the grant waits in their sockets
    // and reaches them when they wake up: the new primary has the holder, whose refresh the
    // next WAIT covers, and the permit is durable.
    for (name, asynchronous, cut_off) in [
        (sync_name, false, true),
        (async_name, true, true),
        (third_name, false, false),
    ] {
        let victim = nodes.owner(slot(&name));
        let replicas = replicas_of(&nodes, victim);
        assert_eq!(replicas.len(), 2);
        // Stopped; cut off, their links are closed by the primary too: the grant then stays in
        // its backlog (a stopped replica would still find it in its socket when it wakes up).
        for replica in &replicas {
            signal("STOP", replica.pid);
        }
        if cut_off {
            let killed: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("replica")
                .query(&mut nodes.conn(victim))
                .unwrap();
            assert_eq!(killed, 2);
        }
        let acquiring = {
            let (cluster, name) = (cluster.clone(), name.clone());
            thread::spawn(move || {
                let lease = Duration::from_secs(30);
                let durable = Duration::from_secs(20);
                match asynchronous {
                    false => Semaphore::new(&cluster, name)
                        .lease(lease)
                        .auto_refresh(false)
                        .durable(1, durable)
                        .acquire()
                        .and_then(|permit| permit.refresh()),
                    true => tokio::runtime::Runtime::new().unwrap().block_on(async {
                        aio::Semaphore::new(&cluster, name)
                            .lease(lease)
                            .auto_refresh(false)
                            .durable(1, durable)
                            .acquire()
                            .await?
                            .refresh()
                            .await
                    }),
                }
            })
        };
        // Granted on the primary, whose WAIT now blocks.
        let started = Instant::now();
        while redsem_client::in_use(&cluster, &name).unwrap() == 0 {
            assert!(started.elapsed() < Duration::from_secs(10), "no grant");
            thread::sleep(Duration::from_millis(20));
        }
        thread::sleep(Duration::from_millis(300));
        assert!(!acquiring.is_finished());
        driver(&["kill", &nodes.dir(), &victim.to_string()]);
        for replica in &replicas {
            signal("CONT", replica.pid);
        }
        driver(&["wait", &nodes.dir()]);
        match (cut_off, acquiring.join().unwrap()) {
            (
                true,
                Err(Error::NotDurable {
                    acked: 0,
                    wanted: 1,
                }),
            ) => {}
            (false, Ok(true)) => {} // held on the new primary
            (_, other) => panic!("a durable acquire, cut off {cut_off}: {other:?}"),
        }
        let new_owner = nodes.owner(slot(&name));
        assert_ne!(new_owner, victim);
        assert_eq!(redsem_client::in_use(&cluster, &name).unwrap(), 0);
    }
}

/// One thread (sync) or task (async) refreshes every permit of a `Cluster`: a primary that stops
/// answering (`SIGSTOP`) holds up none of the refreshes of the permits on the other primaries,
/// whose short leases stay held, while the permits on the stopped one are reported lost.
#[test]
fn a_stopped_primary_holds_up_no_other_nodes_refreshes() {
    if mode().is_none() {
        return;
    }
    let nodes = Nodes::start(0);
    // The other primaries go on serving their slots while the stopped one is failed.
    for node in nodes.primaries() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query(&mut nodes.conn(node.port))
            .unwrap();
    }
    let cluster = nodes.cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let names = names_on_each_primary(&nodes, "stopped");
    let lease = Duration::from_secs(3);
    let permits: Vec<_> = names
        .iter()
        .map(|name| {
            Semaphore::new(&cluster, name.clone())
                .lease(lease)
                .acquire()
                .unwrap()
        })
        .collect();
    let apermits: Vec<_> = names
        .iter()
        .map(|name| {
            rt.block_on(
                aio::Semaphore::new(&cluster, name.clone())
                    .limit(2)
                    .lease(lease)
                    .acquire(),
            )
            .unwrap()
        })
        .collect();
    let stopped = nodes
        .primaries()
        .into_iter()
        .find(|n| n.port == nodes.owner(slot(&names[0])))
        .unwrap();
    signal("STOP", stopped.pid);
    thread::sleep(lease + Duration::from_secs(1));
    let lost: Vec<bool> = permits.iter().map(|p| p.is_lost()).collect();
    let alost: Vec<bool> = apermits.iter().map(|p| p.is_lost()).collect();
    signal("CONT", stopped.pid);
    assert_eq!(lost, [true, false, false], "sync");
    assert_eq!(alost, [true, false, false], "async");
    for name in &names[1..] {
        assert_eq!(redsem_client::in_use(&cluster, name).unwrap(), 2, "{name}");
    }
    for (permit, apermit) in permits.into_iter().zip(apermits).skip(1) {
        assert!(permit.release().unwrap());
        assert!(rt.block_on(apermit.release()).unwrap());
    }
}
