//! A local Redis Cluster for tests: primaries and replicas on loopback, the module loaded on
//! every node. Dropping the guard kills every node (each [`Server`] kills its own).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};

use super::{
    cluster_refuses_short_form, error_text, long_form, run, server_version, try_run, Server,
};

/// The number of hash slots of Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long a cluster may take to converge (creation, agreement after a reshard, failover)
/// on a busy two-core machine. The normal path takes a fraction of it.
pub const CONVERGE_WITHIN: Duration = Duration::from_secs(30);

/// One node of the cluster as another node's `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub id: String,
    pub port: u16,
    /// `myself`, `master`, `slave`, `fail?`, `fail`, `handshake`, `noaddr`, ...
    pub flags: BTreeSet<String>,
    /// The primary's id, for a replica.
    pub primary: Option<String>,
    /// Inclusive slot ranges it serves.
    pub slots: Vec<(u16, u16)>,
    /// Open slots, as written: `[<slot>->-<id>]` (migrating) or `[<slot>-<-<id>]` (importing).
    pub open_slots: Vec<String>,
}

impl NodeView {
    pub fn is_primary(&self) -> bool {
        self.flags.contains("master")
    }

    pub fn is_replica(&self) -> bool {
        self.flags.contains("slave")
    }

    pub fn owns(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|&(first, last)| (first..=last).contains(&slot))
    }

    /// Whether the node is healthy in this view: not failing, known by address, handshaken.
    fn is_sound(&self) -> bool {
        !["fail", "fail?", "handshake", "noaddr"]
            .iter()
            .any(|flag| self.flags.contains(*flag))
    }
}

/// Parses `CLUSTER NODES`.
pub fn parse_cluster_nodes(text: &str) -> Vec<NodeView> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert!(fields.len() >= 8, "unexpected CLUSTER NODES line {line:?}");
            // 127.0.0.1:<port>@<cport>[,hostname]
            let port = fields[1]
                .split(['@', ','])
                .next()
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|port| port.parse().ok())
                .unwrap_or(0);
            let mut slots = Vec::new();
            let mut open_slots = Vec::new();
            for field in &fields[8..] {
                if field.starts_with('[') {
                    open_slots.push(field.to_string());
                } else if let Some((first, last)) = field.split_once('-') {
                    slots.push((first.parse().unwrap(), last.parse().unwrap()));
                } else {
                    let slot = field.parse().unwrap();
                    slots.push((slot, slot));
                }
            }
            NodeView {
                id: fields[0].to_string(),
                port,
                flags: fields[2].split(',').map(str::to_string).collect(),
                primary: (fields[3] != "-").then(|| fields[3].to_string()),
                slots,
                open_slots,
            }
        })
        .collect()
}

/// The slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16384. The tests
/// check it against `CLUSTER KEYSLOT`.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// `count` hash-tagged names `{<prefix><n>}` whose slot is `slot`, found by trying n = 0, 1, ...
pub fn names_in_slot(prefix: &str, slot: u16, count: usize) -> Vec<String> {
    (0u64..)
        .map(|n| format!("{{{prefix}{n}}}"))
        .filter(|name| key_slot(name.as_bytes()) == slot)
        .take(count)
        .collect()
}

/// A command built from `args`, for any kind of connection; a SEM.* call in the form the
/// running cluster takes ([`sem_form`]).
pub fn command(args: &[&str]) -> redis::Cmd {
    let args = sem_form(args);
    let mut cmd = redis::cmd(&args[0]);
    for arg in &args[1..] {
        cmd.arg(arg);
    }
    cmd
}

/// Whether the running cluster's servers refuse SEM.* calls in the short form (no command
/// filter declares their keys), so that the tests send the long form, as the packages do.
static LONG_FORM: AtomicBool = AtomicBool::new(false);

pub fn sends_long_form() -> bool {
    LONG_FORM.load(Ordering::SeqCst)
}

/// `args` as sent to the running cluster: a SEM.* call in the short form becomes the long form
/// where the servers refuse the short one.
pub fn sem_form(args: &[&str]) -> Vec<String> {
    let ours = args[0].len() > 4 && args[0][..4].eq_ignore_ascii_case("sem.");
    if ours && sends_long_form() && !is_long_form(args) {
        long_form(args)
    } else {
        args.iter().map(|arg| arg.to_string()).collect()
    }
}

/// Whether a SEM.* call names its derived keys already.
fn is_long_form(args: &[&str]) -> bool {
    let last_name = match args[0].to_ascii_uppercase().as_str() {
        "SEM.ACQUIREALL" | "SEM.RELEASEALL" | "SEM.REFRESHALL" => {
            return args.len() >= 6 && args[args.len() - 1].ends_with(":limit");
        }
        _ => args.get(1),
    };
    last_name.is_some_and(|name| args.get(2) == Some(&format!("{name}:owner").as_str()))
}

/// Whether `err` is one a cluster client should retry after a pause: the slot is moving or
/// its owner is changing or unreachable, so the command did not run.
pub fn is_transient(err: &redis::RedisError) -> bool {
    use redis::ErrorKind::*;
    matches!(
        err.kind(),
        TryAgain
            | Ask
            | Moved
            | ClusterDown
            | MasterDown
            | BusyLoadingError
            | IoError
            | ClusterConnectionNotFound
    )
}

struct Node {
    /// `None` once killed.
    server: Option<Server>,
    port: u16,
    id: String,
}

/// A running cluster. Node indices are stable for its lifetime, killed nodes included.
pub struct Cluster {
    nodes: Vec<Node>,
    /// The directories of killed nodes, removed on drop unless the test failed.
    killed_dirs: Vec<PathBuf>,
}

impl Cluster {
    /// `primaries` primaries with `replicas` replicas each, made with `redis-cli --cluster
    /// create`, once every node agrees on the layout and every replica is in sync. `extra` goes
    /// to every `redis-server`, after the cluster options (so it may override them).
    pub fn start(primaries: usize, replicas: usize, extra: &[&str]) -> Cluster {
        Cluster::start_configured(primaries, replicas, &[], extra)
    }

    /// As [`Cluster::start`], with `module_args` after the module's path on every node.
    pub fn start_configured(
        primaries: usize,
        replicas: usize,
        module_args: &[&str],
        extra: &[&str],
    ) -> Cluster {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
            "--save",
            "",
            "--appendonly",
            "no",
            // A replica's first sync starts at once rather than after the 5 s default delay.
            "--repl-diskless-sync-delay",
            "0",
        ];
        args.extend_from_slice(extra);
        // Each node has its own directory (named after its port), so one config file name
        // serves them all.
        let nodes: Vec<Node> = (0..primaries * (1 + replicas))
            .map(|_| {
                let server = Server::start_configured("", module_args, &args);
                let port = server.port;
                let id = run(&mut server.connection(), &["CLUSTER", "MYID"]);
                Node {
                    server: Some(server),
                    port,
                    id,
                }
            })
            .collect();
        let cluster = Cluster {
            nodes,
            killed_dirs: Vec::new(),
        };
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let replicas_arg = replicas.to_string();
        let mut create = vec!["--cluster", "create"];
        create.extend(addresses.iter().map(String::as_str));
        create.extend(["--cluster-replicas", &replicas_arg, "--cluster-yes"]);
        let (created, output) = redis_cli_run(&create);
        assert!(created, "redis-cli --cluster create failed:\n{output}");
        cluster.wait_until_healthy();
        cluster.learn_the_form(module_args);
        let layout = cluster.layout();
        assert_eq!(
            layout.iter().filter(|node| node.is_primary()).count(),
            primaries,
            "{layout:#?}"
        );
        cluster
    }

    /// Asks a primary whether it serves a SEM.* call in the short form, which it must refuse,
    /// naming the long form, exactly where no command filter declares the keys; the tests then
    /// send the form it takes.
    fn learn_the_form(&self, module_args: &[&str]) {
        let node = self.owner_of_key("{probe}");
        let mut conn = self.connection(node);
        let (valkey, major, minor) = server_version(&mut conn);
        let short: redis::RedisResult<i64> = redis::cmd("SEM.GET").arg("{probe}").query(&mut conn);
        let refused = match short {
            Ok(count) => {
                assert_eq!(count, 0);
                false
            }
            Err(err) => {
                let text = error_text(&err);
                assert!(text.contains("takes the long form"), "{text}");
                true
            }
        };
        assert_eq!(
            refused,
            cluster_refuses_short_form(valkey, major, minor, module_args),
            "short-form calls on {} {major}.{minor}",
            if valkey { "Valkey" } else { "Redis" }
        );
        // The refusal counted as a failed call: tests count those.
        let _: String = run(&mut conn, &["CONFIG", "RESETSTAT"]);
        LONG_FORM.store(refused, Ordering::SeqCst);
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn port(&self, node: usize) -> u16 {
        self.nodes[node].port
    }

    pub fn id(&self, node: usize) -> &str {
        &self.nodes[node].id
    }

    /// The index of the node with `id`.
    pub fn index_of(&self, id: &str) -> usize {
        self.nodes
            .iter()
            .position(|node| node.id == id)
            .unwrap_or_else(|| panic!("no node has id {id}"))
    }

    pub fn is_alive(&self, node: usize) -> bool {
        self.nodes[node].server.is_some()
    }

    /// The nodes not killed.
    pub fn alive(&self) -> Vec<usize> {
        (0..self.len()).filter(|&i| self.is_alive(i)).collect()
    }

    /// A plain connection to one node.
    pub fn connection(&self, node: usize) -> redis::Connection {
        self.nodes[node]
            .server
            .as_ref()
            .expect("the node was killed")
            .connection()
    }

    /// A plain connection to a replica, in READONLY mode so that it answers reads of the keys
    /// of its primary's slots instead of redirecting them.
    pub fn replica_connection(&self, node: usize) -> redis::Connection {
        let mut conn = self.connection(node);
        let ok: String = run(&mut conn, &["READONLY"]);
        assert_eq!(ok, "OK");
        conn
    }

    /// A cluster client knowing every node, retrying quickly: TRYAGAIN and CLUSTERDOWN after a
    /// few milliseconds rather than the crate's default of more than a second.
    pub fn client(&self) -> ClusterClient {
        let addresses: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("redis://127.0.0.1:{}/", node.port))
            .collect();
        ClusterClient::builder(addresses)
            .retries(30)
            .min_retry_wait(2)
            .max_retry_wait(50)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(10))
            .build()
            .expect("cannot build the cluster client")
    }

    /// A connection of [`Cluster::client`].
    pub fn cluster_connection(&self) -> ClusterConnection {
        self.client()
            .get_connection()
            .expect("cannot connect to the cluster")
    }

    /// `CLUSTER NODES` as seen by `node`.
    pub fn view_of(&self, node: usize) -> Vec<NodeView> {
        let text: String = run(&mut self.connection(node), &["CLUSTER", "NODES"]);
        parse_cluster_nodes(&text)
    }

    /// The layout as the first live node sees it.
    pub fn layout(&self) -> Vec<NodeView> {
        self.view_of(self.alive()[0])
    }

    /// The primaries serving slots, by node index.
    pub fn primaries(&self) -> Vec<usize> {
        let mut primaries: Vec<usize> = self
            .layout()
            .iter()
            .filter(|view| view.is_primary() && !view.slots.is_empty())
            .map(|view| self.index_of(&view.id))
            .collect();
        primaries.sort_unstable();
        primaries
    }

    /// The replicas of `primary`, by node index.
    pub fn replicas_of(&self, primary: usize) -> Vec<usize> {
        let id = self.id(primary).to_string();
        self.layout()
            .iter()
            .filter(|view| view.primary.as_deref() == Some(id.as_str()))
            .map(|view| self.index_of(&view.id))
            .collect()
    }

    /// The node serving `slot`, as the first live node sees it.
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let layout = self.layout();
        let owner = layout
            .iter()
            .find(|view| view.is_primary() && view.owns(slot))
            .unwrap_or_else(|| panic!("no node serves slot {slot}: {layout:#?}"));
        self.index_of(&owner.id)
    }

    /// The node serving each slot, indexed by slot, as the first live node sees it.
    pub fn slot_owners(&self) -> Vec<usize> {
        let layout = self.layout();
        (0..SLOTS)
            .map(|slot| {
                let owner = layout
                    .iter()
                    .find(|view| view.is_primary() && view.owns(slot))
                    .unwrap_or_else(|| panic!("no node serves slot {slot}: {layout:#?}"));
                self.index_of(&owner.id)
            })
            .collect()
    }

    /// The slot of `key`, by `CLUSTER KEYSLOT`; asserts that [`key_slot`] agrees.
    pub fn slot_of(&self, key: &str) -> u16 {
        let slot: u16 = run(
            &mut self.connection(self.alive()[0]),
            &["CLUSTER", "KEYSLOT", key],
        );
        assert_eq!(slot, key_slot(key.as_bytes()), "CRC16 of {key}");
        slot
    }

    /// The node serving the slot of `key`.
    pub fn owner_of_key(&self, key: &str) -> usize {
        self.owner_of_slot(self.slot_of(key))
    }

    /// Every key a node holds, sorted.
    pub fn keys_on(&self, node: usize) -> Vec<String> {
        let mut keys: Vec<String> = run(&mut self.connection(node), &["KEYS", "*"]);
        keys.sort();
        keys
    }

    /// Kills one node with SIGKILL at once: no shutdown, no save, no goodbye to the others.
    pub fn kill(&mut self, node: usize) {
        let server = self.nodes[node].server.take().expect("killed twice");
        self.killed_dirs.push(server.stop());
    }

    /// Waits until every live node sees the cluster as healthy and all of them agree: state
    /// ok, every slot served, no node failing, no open slot, the same primaries with the same
    /// slots and the same replicas everywhere, and every replica's link to its primary up.
    pub fn wait_until_healthy(&self) {
        let deadline = Instant::now() + CONVERGE_WITHIN;
        loop {
            let problem = self.health_problem();
            let Some(problem) = problem else {
                return;
            };
            assert!(
                Instant::now() < deadline,
                "the cluster did not converge: {problem}\n{}",
                self.logs()
            );
            sleep(Duration::from_millis(50));
        }
    }

    /// What keeps the cluster from being healthy, if anything.
    fn health_problem(&self) -> Option<String> {
        let mut agreed: Option<(usize, BTreeMap<String, String>)> = None;
        for node in self.alive() {
            let mut conn = self.connection(node);
            let info: String = match try_run(&mut conn, &["CLUSTER", "INFO"]) {
                Ok(info) => info,
                Err(err) => return Some(format!("node {node}: CLUSTER INFO: {err}")),
            };
            for wanted in [
                "cluster_state:ok".to_string(),
                format!("cluster_slots_ok:{SLOTS}"),
                format!("cluster_known_nodes:{}", self.len()),
            ] {
                if !info.lines().any(|line| line.trim() == wanted) {
                    return Some(format!("node {node} lacks {wanted}:\n{info}"));
                }
            }
            let views = self.view_of(node);
            if let Some(bad) = views
                .iter()
                .find(|view| !view.is_sound() || !view.open_slots.is_empty())
            {
                return Some(format!("node {node} sees {bad:?}"));
            }
            // The layout: each primary with its slots, each replica with its primary.
            let signature: BTreeMap<String, String> = views
                .iter()
                .map(|view| {
                    let role = if view.is_primary() {
                        format!("primary {:?}", view.slots)
                    } else {
                        format!("replica of {:?}", view.primary)
                    };
                    (view.id.clone(), role)
                })
                .collect();
            match &agreed {
                None => agreed = Some((node, signature)),
                Some((first, layout)) if *layout != signature => {
                    return Some(format!(
                        "nodes {first} and {node} disagree:\n{layout:#?}\n{signature:#?}"
                    ));
                }
                Some(_) => {}
            }
            if views
                .iter()
                .any(|view| view.id == self.id(node) && view.is_replica())
            {
                let replication: String = run(&mut conn, &["INFO", "replication"]);
                if !replication.contains("master_link_status:up") {
                    return Some(format!("replica {node} is not in sync:\n{replication}"));
                }
            }
        }
        None
    }

    /// The end of every live node's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some(server) = &node.server {
                let log = server.log();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                all.push_str(&format!("--- node {i} (port {}) ---\n{tail}\n", node.port));
            }
        }
        all
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Every live Server kills its node when dropped with `nodes`.
        if !std::thread::panicking() {
            for dir in &self.killed_dirs {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// `redis-cli`: `REDIS_CLI`, or the one on the PATH.
pub fn redis_cli() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// Runs `redis-cli` with `args`; its exit status and everything it printed.
pub fn redis_cli_run(args: &[&str]) -> (bool, String) {
    let output = Command::new(redis_cli())
        .args(args)
        .output()
        .expect("cannot run redis-cli");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}
