//! Redis Cluster: which node serves a slot, and what each node has (the module or not).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Client, ConnectionAddr, ConnectionInfo, RedisConnectionInfo, RedisResult, Value};

use crate::core::{lock, Backend, RETRY_BUDGET};

/// A Redis Cluster for semaphores: the redis crate's [`ClusterClient`] finds the node serving a
/// slot (`CLUSTER SLOTS`, asked of any node through its cluster connection), and each call goes
/// to that primary on a connection of its own (`WAIT`, `BOUND` and `WAIT numreplicas` need one
/// connection to one node). Clones share what they learnt: the slots' owners, and which nodes
/// have the module (asked once per node).
///
/// Every semaphore's name needs a hash tag (`"{jobs}"`, `"app:{jobs}"`), and the names of a
/// set must share a slot: else the call fails with [`crate::Error::BadName`] before anything is
/// sent.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    client: ClusterClient,
    /// The database, user, password and protocol of the connections to the nodes.
    settings: RedisConnectionInfo,
    pub(crate) budget: Duration,
    directory: Mutex<Option<ClusterConnection>>,
    #[cfg(feature = "tokio")]
    pub(crate) async_directory: Mutex<Option<redis::cluster_async::ClusterConnection>>,
    /// Each slot range's primary, from the last `CLUSTER SLOTS`.
    slots: Mutex<Vec<(u16, u16, String)>>,
    /// The owners that `MOVED` named since.
    moved: Mutex<HashMap<u16, String>>,
    backends: Mutex<HashMap<String, Backend>>,
    /// The connection that calls of several permits share on each node (async).
    #[cfg(feature = "tokio")]
    pub(crate) shared: Mutex<HashMap<String, redis::aio::MultiplexedConnection>>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("slots", &*lock(&self.inner.slots))
            .field("budget", &self.inner.budget)
            .finish()
    }
}

impl Cluster {
    /// The cluster that `client` reaches; the connections to its nodes have no user or
    /// password ([`Cluster::node_settings`] gives them).
    pub fn new(client: ClusterClient) -> Self {
        Cluster::build(client, RedisConnectionInfo::default(), RETRY_BUDGET)
    }

    /// The database (0), user, password and protocol of the connections to the nodes, as in
    /// the URLs the cluster client was made with.
    pub fn node_settings(self, settings: RedisConnectionInfo) -> Self {
        Cluster::build(self.inner.client.clone(), settings, self.inner.budget)
    }

    /// How long a call keeps trying while its slot moves or its node fails over (default 30
    /// seconds): then it fails with [`crate::Error::Unavailable`].
    pub fn retry_budget(self, budget: Duration) -> Self {
        Cluster::build(
            self.inner.client.clone(),
            self.inner.settings.clone(),
            budget,
        )
    }

    fn build(client: ClusterClient, settings: RedisConnectionInfo, budget: Duration) -> Self {
        Cluster {
            inner: Arc::new(Inner {
                client,
                settings,
                budget,
                directory: Mutex::new(None),
                #[cfg(feature = "tokio")]
                async_directory: Mutex::new(None),
                slots: Mutex::new(Vec::new()),
                moved: Mutex::new(HashMap::new()),
                backends: Mutex::new(HashMap::new()),
                #[cfg(feature = "tokio")]
                shared: Mutex::new(HashMap::new()),
            }),
        }
    }
}

impl Inner {
    /// A client for the node at `addr` (`host:port`).
    pub(crate) fn node(&self, addr: &str) -> RedisResult<Client> {
        let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "6379"));
        let port = port.parse().map_err(|_| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a node's address has no port",
                addr.to_string(),
            ))
        })?;
        Client::open(ConnectionInfo {
            addr: ConnectionAddr::Tcp(host.trim_matches(['[', ']']).to_string(), port),
            redis: self.settings.clone(),
        })
    }

    /// The primary serving `slot` as known so far, if it is known.
    pub(crate) fn known_owner(&self, slot: u16) -> Option<String> {
        if let Some(addr) = lock(&self.moved).get(&slot) {
            return Some(addr.clone());
        }
        lock(&self.slots)
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, addr)| addr.clone())
    }

    /// The primary serving `slot`, asking the cluster when it is not known.
    pub(crate) fn owner(&self, slot: u16) -> RedisResult<String> {
        if let Some(addr) = self.known_owner(slot) {
            return Ok(addr);
        }
        let mut directory = lock(&self.directory);
        if directory.is_none() {
            *directory = Some(self.client.get_connection()?);
        }
        let conn = directory.as_mut().expect("connected above");
        let answer = conn.route_command(
            &cluster_slots(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        );
        self.learn_slots(answer)?;
        self.known_owner(slot).ok_or_else(|| no_owner(slot))
    }

    /// Keeps the layout `CLUSTER SLOTS` answered.
    pub(crate) fn learn_slots(&self, answer: RedisResult<Value>) -> RedisResult<()> {
        let ranges: Vec<Value> = redis::from_redis_value(&answer?)?;
        let mut slots = Vec::new();
        for range in ranges {
            let range: Vec<Value> = redis::from_redis_value(&range)?;
            if range.len() < 3 {
                continue;
            }
            let first: u16 = redis::from_redis_value(&range[0])?;
            let last: u16 = redis::from_redis_value(&range[1])?;
            let primary: Vec<Value> = redis::from_redis_value(&range[2])?;
            let host: String = redis::from_redis_value(&primary[0])?;
            let port: u16 = redis::from_redis_value(&primary[1])?;
            let host = if host.is_empty() || host == "?" {
                "127.0.0.1".to_string()
            } else {
                host
            };
            slots.push((first, last, format!("{host}:{port}")));
        }
        *lock(&self.slots) = slots;
        lock(&self.moved).clear();
        Ok(())
    }

    /// `MOVED`: `addr` serves `slot` now.
    pub(crate) fn moved(&self, slot: u16, addr: &str) {
        lock(&self.moved).insert(slot, addr.to_string());
    }

    /// A failure: the layout is asked again before the next try, and the directory's
    /// connection too is made again (its node may be the one that failed).
    pub(crate) fn forget(&self) {
        lock(&self.slots).clear();
        lock(&self.moved).clear();
        *lock(&self.directory) = None;
        #[cfg(feature = "tokio")]
        {
            *lock(&self.async_directory) = None;
        }
    }

    pub(crate) fn backend(&self, addr: &str) -> Option<Backend> {
        lock(&self.backends).get(addr).copied()
    }

    pub(crate) fn set_backend(&self, addr: &str, backend: Backend) {
        lock(&self.backends).insert(addr.to_string(), backend);
    }

    #[cfg(feature = "tokio")]
    pub(crate) fn client(&self) -> &ClusterClient {
        &self.client
    }
}

/// No node serves `slot` (the cluster is failing over): a failure to retry after a pause.
pub(crate) fn no_owner(slot: u16) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::ClusterDown,
        "no node serves the slot",
        slot.to_string(),
    ))
}

pub(crate) fn cluster_slots() -> redis::Cmd {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    cmd
}
