//! Redis Cluster: which node serves a slot, and what each node has (the module or not).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    Client, ConnectionAddr, ConnectionInfo, RedisConnectionInfo, RedisError, RedisResult, Value,
};

use crate::core::{lock, next_step, Backend, Known, KnownCell, Next, Pool, Retries, RETRY_BUDGET};

/// How long a connection to a node may take to open (a node that does not answer is then
/// treated as down: the call pauses and finds the slot's owner again).
pub(crate) const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// A Redis Cluster for semaphores: the redis crate's cluster client (or one of its cluster
/// connections) finds the node serving a slot (`CLUSTER SLOTS`, asked of any node through its
/// cluster connection), and each call goes to that primary on a connection to that node
/// (`WAIT`, `BOUND` and `WAIT numreplicas` need one connection to one node). Clones share what
/// they learnt: the slots' owners, and which nodes have the module (asked once per node).
///
/// Every semaphore's name needs a hash tag (`"{jobs}"`, `"app:{jobs}"`), and the names of a
/// set must share a slot: else the call fails with [`crate::Error::BadName`] before anything is
/// sent.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) inner: Arc<Inner>,
}

/// What asks the cluster which node serves a slot.
pub(crate) enum Directory {
    /// The cluster client: its connections are made when needed, and made again after a
    /// failure (sync and async).
    Client {
        client: ClusterClient,
        sync: Mutex<Option<ClusterConnection>>,
        #[cfg(feature = "tokio")]
        asynchronous: Mutex<Option<redis::cluster_async::ClusterConnection>>,
    },
    /// A sync cluster connection (the sync API only).
    Sync(Mutex<ClusterConnection>),
    /// An async cluster connection (the async API only).
    #[cfg(feature = "tokio")]
    Async(redis::cluster_async::ClusterConnection),
}

pub(crate) struct Inner {
    pub(crate) directory: Directory,
    /// The database, user, password and protocol of the connections to the nodes.
    settings: Mutex<RedisConnectionInfo>,
    budget: Mutex<Duration>,
    /// Each slot range's primary, from the last `CLUSTER SLOTS`.
    slots: Mutex<Vec<(u16, u16, String)>>,
    /// The owners that `MOVED` named since.
    moved: Mutex<HashMap<u16, String>>,
    backends: Mutex<HashMap<String, Known>>,
    /// The connections to each node that the sync calls take and give back.
    pub(crate) pool: Arc<Pool<redis::Connection>>,
    /// The connections to each node that sync waiting acquires block (taken, given back):
    /// apart from the calls', which a release that ends a wait needs.
    pub(crate) waits: Arc<Pool<redis::Connection>>,
    /// The connection that calls of several permits share on each node (async).
    #[cfg(feature = "tokio")]
    pub(crate) shared: Mutex<HashMap<String, redis::aio::MultiplexedConnection>>,
    /// The connections to each node that async waiting acquires block (taken, given back).
    #[cfg(feature = "tokio")]
    pub(crate) blocking: Arc<Pool<redis::aio::MultiplexedConnection>>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("slots", &*lock(&self.inner.slots))
            .field("budget", &self.inner.budget())
            .finish()
    }
}

impl Cluster {
    /// The cluster that `client` reaches, for the sync and the async API. The connections to
    /// its nodes have no user or password unless [`Cluster::node_settings`] gives them.
    pub fn new(client: ClusterClient) -> Self {
        Cluster::build(Directory::Client {
            client,
            sync: Mutex::new(None),
            #[cfg(feature = "tokio")]
            asynchronous: Mutex::new(None),
        })
    }

    /// The cluster that a sync cluster connection reaches, for the sync API (the async one
    /// refuses it; [`Cluster::new`] serves both).
    pub fn from_connection(conn: ClusterConnection) -> Self {
        Cluster::build(Directory::Sync(Mutex::new(conn)))
    }

    /// The cluster that an async cluster connection reaches, for the async API (the sync one
    /// refuses it; [`Cluster::new`] serves both).
    #[cfg(feature = "tokio")]
    pub fn from_async_connection(conn: redis::cluster_async::ClusterConnection) -> Self {
        Cluster::build(Directory::Async(conn))
    }

    /// The database (0), user, password and protocol of the connections to the nodes, as in
    /// the URLs the cluster client was made with (TLS is not supported there).
    pub fn node_settings(self, settings: RedisConnectionInfo) -> Self {
        *lock(&self.inner.settings) = settings;
        self
    }

    /// How long a call keeps trying, from its first failure, while its slot moves or its node
    /// fails over (default 30 seconds): then it fails with [`crate::Error::Unavailable`].
    pub fn retry_for(self, budget: Duration) -> Self {
        *lock(&self.inner.budget) = budget;
        self
    }

    fn build(directory: Directory) -> Self {
        Cluster {
            inner: Arc::new(Inner {
                directory,
                settings: Mutex::new(RedisConnectionInfo::default()),
                budget: Mutex::new(RETRY_BUDGET),
                slots: Mutex::new(Vec::new()),
                moved: Mutex::new(HashMap::new()),
                backends: Mutex::new(HashMap::new()),
                pool: Arc::default(),
                waits: Arc::default(),
                #[cfg(feature = "tokio")]
                shared: Mutex::new(HashMap::new()),
                #[cfg(feature = "tokio")]
                blocking: Arc::default(),
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
            redis: lock(&self.settings).clone(),
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
        #[cfg(feature = "tokio")]
        if let Directory::Async(_) = self.directory {
            return Err(wrong_api("an async", "the async API"));
        }
        if let Some(addr) = self.known_owner(slot) {
            return Ok(addr);
        }
        let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let answer = match &self.directory {
            Directory::Client { client, sync, .. } => {
                let mut directory = lock(sync);
                if directory.is_none() {
                    *directory = Some(client.get_connection()?);
                }
                let conn = directory.as_mut().expect("connected above");
                conn.route_command(&cluster_slots(), random)
            }
            Directory::Sync(conn) => lock(conn).route_command(&cluster_slots(), random),
            #[cfg(feature = "tokio")]
            Directory::Async(_) => unreachable!("refused above"),
        };
        self.learn_slots(answer)?;
        self.known_owner(slot).ok_or_else(|| no_owner(slot))
    }

    pub(crate) fn budget(&self) -> Duration {
        *lock(&self.budget)
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
        if let Directory::Client {
            sync,
            #[cfg(feature = "tokio")]
            asynchronous,
            ..
        } = &self.directory
        {
            *lock(sync) = None;
            #[cfg(feature = "tokio")]
            {
                *lock(asynchronous) = None;
            }
        }
    }

    pub(crate) fn backend(&self, addr: &str) -> Option<Backend> {
        lock(&self.backends).get(addr)?.current()
    }

    pub(crate) fn set_backend(&self, addr: &str, backend: Backend) {
        lock(&self.backends).insert(addr.to_string(), Known::new(backend));
    }
}

/// A Cluster made of the other API's cluster connection.
#[cfg(feature = "tokio")]
pub(crate) fn wrong_api(made_of: &str, serves: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "this Cluster was made of a cluster connection of the other API",
        format!("{made_of} cluster connection serves {serves} only: make the Cluster of a ClusterClient"),
    ))
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

/// Where a link's calls go (one server, or the node serving a slot of a cluster), what it
/// knows of the backends there, and what it does after a failed try: the part of the sync and
/// async transports that is the same.
#[derive(Clone)]
pub(crate) enum Route {
    /// One server: whether it has the module (shared by a semaphore's clones), asked again
    /// while it had none.
    Standalone(KnownCell),
    /// The primary serving the slot; each node's backend is kept by the cluster.
    Slot(Arc<Inner>, u16),
}

/// How to try again after a failure.
pub(crate) struct Retry {
    /// The pause before the next try.
    pub(crate) pause: Duration,
    /// `ASK`: the next try goes to this node, after `ASKING`.
    pub(crate) ask: Option<String>,
    /// The owner is to be found again, and connected to again.
    pub(crate) reconnect: bool,
}

impl Route {
    pub(crate) fn budget(&self) -> Duration {
        match self {
            Route::Standalone(_) => Duration::ZERO,
            Route::Slot(cluster, _) => cluster.budget(),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Route::Slot(..))
    }

    /// The backend of the node at `addr`, if it is known.
    pub(crate) fn backend(&self, addr: &str) -> Option<Backend> {
        match self {
            Route::Standalone(known) => lock(known).as_ref()?.current(),
            Route::Slot(cluster, _) => cluster.backend(addr),
        }
    }

    /// The script found the module loaded on the node at `addr`: use it from now on.
    pub(crate) fn use_module(&self, addr: &str) {
        match self {
            Route::Standalone(known) => *lock(known) = Some(Known::new(Backend::Module)),
            Route::Slot(cluster, _) => cluster.set_backend(addr, Backend::Module),
        }
    }

    /// The node at `addr` answered whether it has the module.
    pub(crate) fn learn_backend(&self, addr: &str, info: Vec<Value>) -> Backend {
        let backend = Backend::from_answer(info);
        match self {
            Route::Standalone(known) => {
                *lock(known) = Some(Known::new(backend));
                backend
            }
            Route::Slot(cluster, _) => {
                cluster.set_backend(addr, backend);
                backend
            }
        }
    }

    /// Forgets the slots' owners (a failure met, that a caller will not retry now): the next
    /// call asks the cluster again.
    pub(crate) fn forget_layout(&self) {
        if let Route::Slot(cluster, _) = self {
            cluster.forget();
        }
    }

    /// After a try failed with `err`: how to try again, or the error for the caller (on one
    /// server at once; in Redis Cluster once `retries` give up).
    pub(crate) fn recover(
        &self,
        err: RedisError,
        retries: &mut Retries,
    ) -> crate::core::Result<Retry> {
        let Route::Slot(cluster, slot) = self else {
            return Err(err.into());
        };
        Ok(match next_step(&err, true) {
            Next::Moved(addr) => {
                cluster.moved(*slot, &addr);
                Retry {
                    pause: retries.redirect(err)?,
                    ask: None,
                    reconnect: false,
                }
            }
            Next::Ask(addr) => Retry {
                pause: retries.redirect(err)?,
                ask: Some(addr),
                reconnect: false,
            },
            Next::Pause => {
                let pause = retries.pause(err)?;
                cluster.forget();
                Retry {
                    pause,
                    ask: None,
                    reconnect: true,
                }
            }
            Next::Fail => return Err(err.into()),
        })
    }
}
