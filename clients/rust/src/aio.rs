//! The async API on tokio (the `tokio` feature): the same semaphores, permits, sets and
//! functions as the sync API, with `async` calls and one tokio task per client refreshing
//! every permit of the client.
//!
//! ```no_run
//! use std::time::Duration;
//! use redsem_client::aio::Semaphore;
//!
//! # async fn example() -> Result<(), redsem_client::Error> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let permit = Semaphore::new(client, "jobs")
//!     .limit(3)
//!     .wait(Some(Duration::from_secs(10)))
//!     .acquire()
//!     .await?;
//! assert!(permit.release().await?, "the lease ran out during the work");
//! # Ok(())
//! # }
//! ```
//!
//! Connections: the calls that do not block (an acquire that does not wait, refresh, release,
//! the limit, `in_use`, a waiter's `TICK`) share one multiplexed connection per server (the one
//! given with [`Target::with_connection`] or [`Target::with_manager`], else one made on the
//! first call for every target of the client on the runtime; in Redis Cluster one per node).
//! A waiting acquire blocks a connection: it takes
//! one from the target's small pool (per node in Redis Cluster) and gives it back once granted
//! or refused (dropped midway, it closes it instead, and leaves the script's line from a task).
//! A `BOUND` or durable acquire and [`wait_empty`] each get a connection of their own, a new
//! multiplexed connection (`Client::get_multiplexed_async_connection`) that nothing else uses;
//! a bound permit keeps it until its release.
//!
//! A [`Permit`] dropped without [`Permit::release`] stops its refresh at once and, inside a
//! tokio runtime, gives the permit back from a task spawned on it (outside one, the lease
//! runs out).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Client, Cmd, FromRedisValue, RedisResult, Value};
use tokio::task::JoinHandle;

use crate::cluster::{
    cluster_slots, no_owner, wrong_api, Cluster, Directory, Inner, Route, CONNECT_WITHIN,
};
use crate::core::{
    connection_broken, deadline, identifier, left, lock, mark_stalled, next_step, next_tick,
    slot_of, stalled, timed_out, unblocked, wait_empty_op, AcquireSpec, Action, Backend, Due,
    Error, Holder, KnownCell, Next, Op, Pool, Request, Result, Retries, Schedule, SetSpec, Step,
    Tail, Wait,
};

/// A connection that several callers share: the redis crate's multiplexed connection, or its
/// `ConnectionManager` (which connects again by itself).
#[derive(Clone)]
enum Conn {
    Multiplexed(MultiplexedConnection),
    Manager(ConnectionManager),
}

impl Conn {
    async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Multiplexed(conn) => cmd.query_async(conn).await,
            Conn::Manager(conn) => cmd.query_async(conn).await,
        }
    }
}

/// One server: its client (for the connections of their own) and what every semaphore of the
/// client shares.
#[derive(Clone)]
pub struct Standalone {
    client: Client,
    hub: Arc<Hub>,
}

/// What the semaphores and permits of one client share: the connection shared, the pool of
/// the connections that waiting acquires block, and the one task that refreshes every permit.
struct Hub {
    shared: Mutex<Option<Conn>>,
    blocking: Pool<MultiplexedConnection>,
    refresher: Arc<Refresher>,
}

impl Hub {
    fn new(shared: Option<Conn>) -> Self {
        Hub {
            shared: Mutex::new(shared),
            blocking: Pool::default(),
            refresher: Arc::default(),
        }
    }
}

/// The one hub of a client's server address and settings on the current tokio runtime, for as
/// long as a semaphore or permit of it lives, however many targets were made of clones of the
/// client. Per runtime: a multiplexed connection lives on the runtime that made it, and ends
/// with it.
fn hub_of(client: &Client) -> Arc<Hub> {
    static HUBS: OnceLock<Mutex<HashMap<String, Weak<Hub>>>> = OnceLock::new();
    let runtime = tokio::runtime::Handle::try_current().map(|runtime| runtime.id());
    let key = format!("{:?} {:?}", runtime.ok(), client.get_connection_info());
    let mut hubs = lock(HUBS.get_or_init(Mutex::default));
    if let Some(hub) = hubs.get(&key).and_then(Weak::upgrade) {
        return hub;
    }
    hubs.retain(|_, hub| hub.strong_count() > 0);
    let hub = Arc::new(Hub::new(None));
    hubs.insert(key, Arc::downgrade(&hub));
    hub
}

/// The refresher of `target`'s permits: its client's, or its [`Cluster`]'s.
fn refresher_of(target: &Target) -> Arc<Refresher> {
    static CLUSTERS: OnceLock<Mutex<HashMap<usize, Weak<Refresher>>>> = OnceLock::new();
    let cluster = match target {
        Target::Standalone(standalone) => return Arc::clone(&standalone.hub.refresher),
        Target::Cluster(cluster) => Arc::as_ptr(&cluster.inner) as usize,
    };
    let mut refreshers = lock(CLUSTERS.get_or_init(Mutex::default));
    if let Some(refresher) = refreshers.get(&cluster).and_then(Weak::upgrade) {
        return refresher;
    }
    refreshers.retain(|_, refresher| refresher.strong_count() > 0);
    let refresher = Arc::<Refresher>::default();
    refreshers.insert(cluster, Arc::downgrade(&refresher));
    refresher
}

/// The refreshes of a client's permits, sent by one task (started on the runtime of the
/// permit that needs it, again if that runtime has ended; it ends with the refresher), each on
/// the shared connection.
#[derive(Default)]
struct Refresher {
    plan: Mutex<Option<Schedule<Weak<Shared>>>>,
    wake: Arc<tokio::sync::Notify>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Refresher {
    /// Refreshes `shared` every lease/3 from now on: its key in the schedule.
    fn add(self: &Arc<Self>, shared: &Arc<Shared>) -> u64 {
        let (key, earliest) = lock(&self.plan)
            .get_or_insert_with(Schedule::new)
            .add(Arc::downgrade(shared), shared.holder.lease / 3);
        let mut task = lock(&self.task);
        if task.as_ref().is_none_or(JoinHandle::is_finished) {
            let refresher = Arc::downgrade(self);
            *task = Some(tokio::spawn(refreshing(refresher, Arc::clone(&self.wake))));
        } else if earliest {
            self.wake.notify_one();
        }
        key
    }

    fn remove(&self, key: u64) {
        if let Some(plan) = lock(&self.plan).as_mut() {
            plan.remove(key);
        }
    }

    fn next_due(&self) -> Due<Weak<Shared>> {
        lock(&self.plan)
            .get_or_insert_with(Schedule::new)
            .next_due(Instant::now())
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        self.wake.notify_one(); // its task ends
    }
}

/// The refresh task of a client.
async fn refreshing(refresher: Weak<Refresher>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let Some(me) = refresher.upgrade() else {
            return;
        };
        match me.next_due() {
            Due::Now(key, shared) => {
                let next = match shared.upgrade() {
                    Some(shared) => shared.refresh_due().await,
                    None => None,
                };
                if let Some(plan) = lock(&me.plan).as_mut() {
                    plan.refreshed(key, next);
                }
            }
            Due::At(at) => {
                drop(me);
                let _ = tokio::time::timeout_at(at.into(), wake.notified()).await;
            }
            Due::Idle => {
                drop(me);
                wake.notified().await;
            }
        }
    }
}

impl fmt::Debug for Standalone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Standalone")
            .field("client", &self.client)
            .finish()
    }
}

/// Where the semaphores are: one server, or a Redis Cluster ([`Cluster`]; the long form, each
/// call on the primary serving the name's slot).
#[derive(Debug, Clone)]
pub enum Target {
    Standalone(Standalone),
    Cluster(Cluster),
}

impl Target {
    /// One server, the calls that do not block on `conn` (a multiplexed connection of
    /// `client`); `client` makes the connections of their own.
    pub fn with_connection(client: Client, conn: MultiplexedConnection) -> Self {
        Target::standalone(client, Some(Conn::Multiplexed(conn)))
    }

    /// One server, the calls that do not block on `manager` (a `ConnectionManager` of
    /// `client`, which connects again by itself); `client` makes the connections of their own.
    pub fn with_manager(client: Client, manager: ConnectionManager) -> Self {
        Target::standalone(client, Some(Conn::Manager(manager)))
    }

    fn standalone(client: Client, shared: Option<Conn>) -> Self {
        let hub = match shared {
            None => hub_of(&client),
            shared => Arc::new(Hub::new(shared)),
        };
        Target::Standalone(Standalone { client, hub })
    }

    fn slot(&self, names: &[String]) -> Result<Option<u16>> {
        slot_of(names, matches!(self, Target::Cluster(_)))
    }
}

impl From<Client> for Target {
    /// One server; the shared connection is made on the first call, one for every target made
    /// of the client (or of another client of the same address and settings) on the current
    /// tokio runtime.
    fn from(client: Client) -> Self {
        Target::standalone(client, None)
    }
}

impl From<&Client> for Target {
    fn from(client: &Client) -> Self {
        Target::from(client.clone())
    }
}

impl From<&Target> for Target {
    fn from(target: &Target) -> Self {
        target.clone()
    }
}

impl From<Cluster> for Target {
    fn from(cluster: Cluster) -> Self {
        Target::Cluster(cluster)
    }
}

impl From<&Cluster> for Target {
    fn from(cluster: &Cluster) -> Self {
        Target::Cluster(cluster.clone())
    }
}

impl From<redis::cluster::ClusterClient> for Target {
    fn from(client: redis::cluster::ClusterClient) -> Self {
        Target::Cluster(Cluster::new(client))
    }
}

/// The primary serving `slot`, asking the cluster (through the redis crate's async cluster
/// connection) when it is not known.
async fn owner(cluster: &Inner, slot: u16) -> RedisResult<String> {
    if let Directory::Sync(_) = cluster.directory {
        return Err(wrong_api("a sync", "the sync API"));
    }
    if let Some(addr) = cluster.known_owner(slot) {
        return Ok(addr);
    }
    let mut directory = match &cluster.directory {
        Directory::Client {
            client,
            asynchronous,
            ..
        } => {
            let known = lock(asynchronous).clone();
            match known {
                Some(directory) => directory,
                None => {
                    let directory = client.get_async_connection().await?;
                    *lock(asynchronous) = Some(directory.clone());
                    directory
                }
            }
        }
        Directory::Async(conn) => conn.clone(),
        Directory::Sync(_) => unreachable!("refused above"),
    };
    let answer = directory
        .route_command(
            &cluster_slots(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await;
    cluster.learn_slots(answer)?;
    cluster.known_owner(slot).ok_or_else(|| no_owner(slot))
}

/// Which connection a link's calls take.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The connection shared by the calls that do not block.
    Shared,
    /// One of the pool of connections that waits block, taken for a call and given back.
    Pooled,
    /// One of its own, kept from call to call (`BOUND`, `WAIT numreplicas`).
    Own,
}

/// A connection to the node serving a slot (on one server: to the server), as its [`Kind`]
/// says, moved to the slot's new owner after a move or a failover.
struct Link {
    target: Target,
    route: Route,
    kind: Kind,
    /// The node's address (empty on one server) and the connection in use.
    conn: Option<(String, Conn)>,
    /// The connection in use came from the pool: it may have been closed while idle.
    reused: bool,
    /// A failed call is the caller's at once, without retries.
    once: bool,
    /// The refresher's calls: one that fails in a way that would pause (a failover, a slot
    /// moving) is the caller's at once, and one not answered within this fails, so that no
    /// node holds up every other permit's refresh.
    hasty: Option<Duration>,
    /// The node of the last call.
    addr: String,
}

impl Link {
    fn new(target: Target, slot: Option<u16>, known: KnownCell) -> Self {
        let route = match (&target, slot) {
            (Target::Cluster(cluster), Some(slot)) => Route::Slot(cluster.inner.clone(), slot),
            _ => Route::Standalone(known),
        };
        Link {
            target,
            route,
            kind: Kind::Shared,
            conn: None,
            reused: false,
            once: false,
            hasty: None,
            addr: String::new(),
        }
    }

    fn kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    /// Another link to the same node.
    fn sibling(&self, kind: Kind) -> Link {
        Link {
            target: self.target.clone(),
            route: self.route.clone(),
            kind,
            conn: None,
            reused: false,
            once: false,
            hasty: None,
            addr: String::new(),
        }
    }

    fn is_cluster(&self) -> bool {
        self.route.is_cluster()
    }

    fn blocking(&self) -> &Pool<MultiplexedConnection> {
        match &self.target {
            Target::Standalone(standalone) => &standalone.hub.blocking,
            Target::Cluster(cluster) => &cluster.inner.blocking,
        }
    }

    /// As the sync API's `Link::send`: to the slot's owner, following `MOVED` and `ASK`,
    /// retrying after failures with the same call until the retry budget has passed. A pooled
    /// connection goes back to the pool after the call (not when the call is dropped midway:
    /// then it closes).
    async fn send(
        &mut self,
        build: &mut (dyn FnMut(Backend) -> Result<Request> + Send),
    ) -> Result<(Value, Backend)> {
        let answer = self.send_on(build).await;
        if self.kind == Kind::Pooled {
            if let Some((addr, Conn::Multiplexed(conn))) = self.conn.take() {
                self.blocking().give(&addr, conn);
            }
        }
        answer
    }

    async fn send_on(
        &mut self,
        build: &mut (dyn FnMut(Backend) -> Result<Request> + Send),
    ) -> Result<(Value, Backend)> {
        let mut retries = Retries::new(self.route.budget());
        let mut ask = None;
        let mut replaced = false;
        loop {
            let asked: Option<String> = ask.take();
            let err = match self.attempt(build, asked.as_deref()).await {
                Ok(answer) => return Ok(answer),
                Err(Error::Redis(err)) => err,
                Err(other) => return Err(other),
            };
            let broken = connection_broken(&err);
            if broken {
                self.forget_connection();
            }
            if asked.is_some() {
                self.conn = None;
            }
            // (A connection that timed out did not close: it is the node.)
            if broken && self.reused && !replaced && !err.is_timeout() {
                replaced = true;
                continue;
            }
            if self.once {
                return Err(err.into());
            }
            if let Some(within) = self.hasty.filter(|_| next_step(&err, true) == Next::Pause) {
                // A node that does not answer in time may be stopped: the refresher leaves it
                // alone a while, and does not ask the cluster for the layout (it might meet
                // the node too). One that refuses is gone: ask again.
                match err.is_timeout() {
                    true => mark_stalled(&self.addr, within),
                    false => self.route.forget_layout(),
                }
                return Err(err.into());
            }
            let retry = self.route.recover(err, &mut retries)?;
            if retry.reconnect {
                self.forget_connection();
            }
            ask = retry.ask;
            tokio::time::sleep(retry.pause).await;
        }
    }

    /// Drops the connection in use, and the shared one too when it is broken.
    fn forget_connection(&mut self) {
        if let Some((addr, _)) = self.conn.take() {
            if self.kind == Kind::Shared {
                match &self.target {
                    Target::Cluster(cluster) => {
                        lock(&cluster.inner.shared).remove(&addr);
                    }
                    Target::Standalone(standalone) => {
                        let mut shared = lock(&standalone.hub.shared);
                        if matches!(*shared, Some(Conn::Multiplexed(_))) {
                            *shared = None;
                        }
                    }
                }
            }
        }
    }

    /// A connection to `addr`: one of its own, one of the pool, or the shared one.
    async fn connect(&mut self, addr: &str, kind: Kind) -> RedisResult<Conn> {
        self.reused = false;
        if kind == Kind::Pooled {
            if let Some(conn) = self.blocking().take(addr) {
                self.reused = true;
                return Ok(Conn::Multiplexed(conn));
            }
        }
        let own = kind != Kind::Shared;
        let client = match &self.target {
            Target::Standalone(standalone) => {
                if !own {
                    if let Some(conn) = lock(&standalone.hub.shared).clone() {
                        return Ok(conn);
                    }
                }
                standalone.client.clone()
            }
            Target::Cluster(cluster) => {
                if !own {
                    if let Some(conn) = lock(&cluster.inner.shared).get(addr).cloned() {
                        return Ok(Conn::Multiplexed(conn));
                    }
                }
                cluster.inner.node(addr)?
            }
        };
        let config = match &self.target {
            Target::Cluster(_) => {
                redis::AsyncConnectionConfig::new().set_connection_timeout(CONNECT_WITHIN)
            }
            Target::Standalone(_) => redis::AsyncConnectionConfig::new(),
        };
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        if !own {
            match &self.target {
                Target::Standalone(standalone) => {
                    let mut shared = lock(&standalone.hub.shared);
                    if let Some(shared) = shared.clone() {
                        return Ok(shared);
                    }
                    *shared = Some(Conn::Multiplexed(conn.clone()));
                }
                Target::Cluster(cluster) => {
                    lock(&cluster.inner.shared).insert(addr.to_string(), conn.clone());
                }
            }
        }
        Ok(Conn::Multiplexed(conn))
    }

    /// One try: on the slot's owner, or after `ASK` (`ASKING` first, on a connection of its
    /// own, so that nothing comes between the two) on the node it named.
    async fn attempt(
        &mut self,
        build: &mut (dyn FnMut(Backend) -> Result<Request> + Send),
        ask: Option<&str>,
    ) -> Result<(Value, Backend)> {
        let addr = match (&self.route, ask) {
            (_, Some(addr)) => addr.to_string(),
            (Route::Slot(cluster, slot), None) => owner(cluster, *slot).await?,
            (Route::Standalone(_), None) => String::new(),
        };
        if self.conn.as_ref().is_some_and(|(at, _)| *at != addr) || ask.is_some() {
            self.conn = None;
        }
        if self.conn.is_none() {
            let kind = match (self.kind, ask) {
                (Kind::Shared, Some(_)) => Kind::Own,
                (kind, _) => kind,
            };
            let conn = self.connect(&addr, kind).await?;
            self.conn = Some((addr.clone(), conn));
        }
        self.addr.clone_from(&addr);
        if self.hasty.is_some() && stalled(&addr) {
            return Err(timed_out().into());
        }
        let mut conn = self.conn.as_ref().expect("connected above").1.clone();
        let backend = match self.route.backend(&addr) {
            Some(backend) => backend,
            None => {
                let info = conn.query(&Backend::question()).await?;
                self.route
                    .learn_backend(&addr, redis::from_owned_redis_value(info)?)
            }
        };
        let request = build(backend)?;
        let asking = redis::cmd("ASKING");
        if ask.is_some() {
            conn.query(&asking).await?;
        }
        let answer = match conn.query(&request.cmd).await {
            Err(err) if err.kind() == redis::ErrorKind::NoScriptError => {
                let eval = request.eval();
                if ask.is_some() {
                    conn.query(&asking).await?;
                }
                conn.query(&eval).await
            }
            answer => answer,
        };
        Ok((answer?, backend))
    }

    async fn op<T: FromRedisValue>(&mut self, op: &Op) -> Result<T> {
        let long = self.is_cluster();
        let (value, _) = self.send(&mut |backend| op.request(backend, long)).await?;
        Ok(T::from_redis_value(&value)?)
    }

    async fn plain<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T> {
        let (value, _) = self.send(&mut |_| Ok(cmd.clone().into())).await?;
        Ok(T::from_redis_value(&value)?)
    }

    /// As the sync API's `Link::acquire`: an acquire's steps until granted or refused.
    async fn acquire(&mut self, waiting: &mut Waiting<'_>) -> Result<Option<u64>> {
        let long = self.is_cluster();
        let wait = &mut waiting.wait;
        let mut action = wait.start();
        loop {
            let next = match action {
                Action::Send(op) => {
                    let answer = self
                        .send(&mut |backend| wait.as_sent(&op).request(backend, long))
                        .await;
                    if matches!(&answer, Err(Error::Redis(err)) if unblocked(err)) {
                        // The server ended the wait (a failover): wait again, for what is left.
                        action = Action::Send(op);
                        continue;
                    }
                    let (reply, backend) = wait.sent(answer)?;
                    wait.answered(backend, reply)
                }
                Action::Block { blpop, tick } => {
                    // A wait the server ended (UNBLOCKED), or in Redis Cluster a move or a
                    // failover met while blocked: the next attempt, with its retries, finds
                    // the slot's owner (same id, time left).
                    self.once = long;
                    let popped = self.block(&blpop, tick, &wait.tick_op()).await;
                    self.once = false;
                    match popped {
                        Err(Error::Redis(err))
                            if unblocked(&err) || (long && next_step(&err, true) != Next::Fail) =>
                        {
                            wait.popped(None)
                        }
                        popped => wait.popped(popped?),
                    }
                }
                Action::Clear(del) => {
                    let _ = self.plain::<Value>(&del).await;
                    Ok(wait.cleared())
                }
                Action::Granted(ticket) => return Ok(ticket),
            };
            if wait.take_module() {
                self.route.use_module(&self.addr);
            }
            action = next?;
        }
    }

    /// As the sync API's `Link::wait_replicas`.
    async fn wait_replicas(&mut self, wait: &Cmd) -> Result<usize> {
        self.once = true;
        self.reused = false;
        let answer = self.plain::<usize>(wait).await;
        self.once = false;
        answer
    }

    /// `BLPOP` on a connection of the pool; with `tick`, `TICK` on the shared connection at
    /// the earliest holder's deadline while it blocks (the server's own timeout would see that
    /// deadline up to 100 ms late).
    async fn block(
        &mut self,
        blpop: &Cmd,
        tick: Option<Duration>,
        tick_op: &Op,
    ) -> Result<Option<(String, String)>> {
        let Some(first) = tick else {
            return self.plain(blpop).await;
        };
        let mut ticker = self.sibling(Kind::Shared);
        ticker.once = true; // a TICK that fails is skipped: the BLPOP ends in time anyway
        let mut popping = std::pin::pin!(self.plain::<Option<(String, String)>>(blpop));
        let mut at = Instant::now() + first;
        loop {
            match tokio::time::timeout_at(at.into(), popping.as_mut()).await {
                Ok(popped) => return popped,
                Err(_) => match ticker.op::<i64>(tick_op).await.ok().and_then(next_tick) {
                    Some(next) => at = Instant::now() + next,
                    None => return popping.await,
                },
            }
        }
    }
}

/// A waiting acquire's steps. Dropped while in the script's line (the acquire failed, or its
/// future was dropped), it leaves the line from a task, and gives back a grant made meanwhile.
struct Waiting<'a> {
    wait: Wait<'a>,
    /// Where `LEAVE` goes: the shared connection to the semaphore's node.
    leaver: Link,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some((leave, unknown)) = self.wait.abandon() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut link = self.leaver.sibling(Kind::Shared);
        let release = self.wait.release_op();
        runtime.spawn(async move {
            let left = link.op::<Option<String>>(&leave).await;
            if unknown || matches!(left, Ok(Some(message)) if message.starts_with('G')) {
                let _ = link.op::<i64>(&release).await;
            }
        });
    }
}

/// A semaphore's settings; [`Semaphore::acquire`] takes a permit. The same settings and
/// defaults as the sync [`crate::Semaphore`].
#[derive(Debug, Clone)]
pub struct Semaphore {
    target: Target,
    spec: AcquireSpec,
    id: Option<String>,
    durable: Option<(usize, Duration)>,
    auto_refresh: bool,
    known: KnownCell,
}

impl Semaphore {
    /// A semaphore on one server (a `Client`, or [`Target::with_connection`] /
    /// [`Target::with_manager`]) or in Redis Cluster ([`Cluster`]): there `name` needs a hash
    /// tag.
    pub fn new(target: impl Into<Target>, name: impl Into<String>) -> Self {
        Semaphore {
            target: target.into(),
            spec: AcquireSpec::new(name.into()),
            id: None,
            durable: None,
            auto_refresh: true,
            known: KnownCell::default(),
        }
    }

    /// As [`crate::Semaphore::limit`].
    pub fn limit(mut self, limit: u32) -> Self {
        self.spec.limit = limit;
        self
    }

    /// As [`crate::Semaphore::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.spec.lease = lease;
        self
    }

    /// As [`crate::Semaphore::wait`]: a waiting acquire blocks a connection of the pool.
    pub fn wait(mut self, wait: Option<Duration>) -> Self {
        self.spec.wait = wait;
        self
    }

    /// As [`crate::Semaphore::fair`].
    pub fn fair(mut self, fair: bool) -> Self {
        self.spec.fair = fair;
        self
    }

    /// As [`crate::Semaphore::count`].
    pub fn count(mut self, count: u32) -> Self {
        self.spec.count = Some(count);
        self
    }

    /// As [`crate::Semaphore::bound`]: the permit keeps a connection of its own.
    pub fn bound(mut self, bound: bool) -> Self {
        self.spec.bound = bound;
        self
    }

    /// As [`crate::Semaphore::id`].
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// As [`crate::Semaphore::durable`].
    pub fn durable(mut self, replicas: usize, timeout: Duration) -> Self {
        self.durable = Some((replicas, timeout));
        self
    }

    /// As [`crate::Semaphore::auto_refresh`].
    pub fn auto_refresh(mut self, auto_refresh: bool) -> Self {
        self.auto_refresh = auto_refresh;
        self
    }

    /// Takes a permit: [`Error::NotAcquired`] when none was granted.
    pub async fn acquire(&self) -> Result<Permit> {
        self.spec.check()?;
        let slot = self.target.slot(std::slice::from_ref(&self.spec.name))?;
        let id = identifier(&self.id);
        let waits = !left(deadline(self.spec.wait)).is_zero();
        let kind = match (self.spec.bound || self.durable.is_some(), waits) {
            (true, _) => Kind::Own,
            (false, true) => Kind::Pooled,
            (false, false) => Kind::Shared,
        };
        let mut link = Link::new(self.target.clone(), slot, self.known.clone()).kind(kind);
        let mut waiting = Waiting {
            wait: Wait::new(&self.spec, &id),
            leaver: link.sibling(Kind::Shared),
        };
        let ticket = link.acquire(&mut waiting).await?;
        let sent = waiting.wait.attempted;
        drop(waiting);
        let budget = link.route.budget();
        let holder = Holder::new(vec![self.spec.name.clone()], false, id, self.spec.lease);
        holder.granted_at(sent);
        // From here on, a drop (an error, or the caller's timeout while replicas are awaited)
        // gives the permit back.
        let mut permit = Permit {
            holding: Holding::new(holder, link, refresher_of(&self.target)),
            ticket,
            count: self.spec.count.unwrap_or(1),
        };
        // Then the permit's calls go on the shared connection.
        let shared =
            (!self.spec.bound).then(|| Link::new(self.target.clone(), slot, self.known.clone()));
        let tail = Tail::new(sent, self.spec.lease, self.durable, slot.is_some(), budget);
        permit
            .holding
            .finish(tail, self.auto_refresh, shared)
            .await?;
        Ok(permit)
    }
}

/// Permits of several semaphores taken all or none in one step; the same settings and
/// defaults as the sync [`crate::SemaphoreSet`].
#[derive(Debug, Clone)]
pub struct SemaphoreSet {
    target: Target,
    spec: SetSpec,
    id: Option<String>,
    auto_refresh: bool,
    known: KnownCell,
}

impl SemaphoreSet {
    pub fn new(target: impl Into<Target>) -> Self {
        SemaphoreSet {
            target: target.into(),
            spec: SetSpec::new(),
            id: None,
            auto_refresh: true,
            known: KnownCell::default(),
        }
    }

    /// As [`crate::SemaphoreSet::semaphore`].
    pub fn semaphore(mut self, name: impl Into<String>, limit: u32, count: u32) -> Self {
        self.spec.semaphores.push((name.into(), limit, count));
        self
    }

    /// As [`crate::SemaphoreSet::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.spec.lease = lease;
        self
    }

    /// As [`crate::SemaphoreSet::wait`].
    pub fn wait(mut self, wait: Option<Duration>) -> Self {
        self.spec.wait = wait;
        self
    }

    /// As [`crate::SemaphoreSet::fair`].
    pub fn fair(mut self, fair: bool) -> Self {
        self.spec.fair = fair;
        self
    }

    /// As [`crate::SemaphoreSet::bound`].
    pub fn bound(mut self, bound: bool) -> Self {
        self.spec.bound = bound;
        self
    }

    /// As [`crate::SemaphoreSet::id`].
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// As [`crate::SemaphoreSet::auto_refresh`].
    pub fn auto_refresh(mut self, auto_refresh: bool) -> Self {
        self.auto_refresh = auto_refresh;
        self
    }

    /// As [`crate::SemaphoreSet::acquire`].
    pub async fn acquire(&self) -> Result<PermitSet> {
        self.spec.check()?;
        let names = self.spec.names();
        let slot = self.target.slot(&names)?;
        let id = identifier(&self.id);
        let until = deadline(self.spec.wait);
        let kind = match (self.spec.bound, !left(until).is_zero()) {
            (true, _) => Kind::Own,
            (false, true) => Kind::Pooled,
            (false, false) => Kind::Shared,
        };
        let mut link = Link::new(self.target.clone(), slot, self.known.clone()).kind(kind);
        let sent = Instant::now();
        let reply: Value = link.op(&self.spec.op(&id, left(until))).await?;
        let tickets = self.spec.outcome(reply)?;
        let holder = Holder::new(names, true, id, self.spec.lease);
        holder.granted_at(sent);
        let shared =
            (!self.spec.bound).then(|| Link::new(self.target.clone(), slot, self.known.clone()));
        let mut permits = PermitSet {
            holding: Holding::new(holder, link, refresher_of(&self.target)),
            counts: self.spec.semaphores.iter().map(|s| s.2).collect(),
            tickets,
        };
        let tail = Tail::new(sent, self.spec.lease, None, slot.is_some(), Duration::ZERO);
        permits
            .holding
            .finish(tail, self.auto_refresh, shared)
            .await?;
        Ok(permits)
    }
}

async fn once<T: FromRedisValue>(target: Target, op: &Op, own: bool) -> Result<T> {
    let slot = target.slot(&[op.name().to_string()])?;
    let kind = if own { Kind::Own } else { Kind::Shared };
    Link::new(target, slot, KnownCell::default())
        .kind(kind)
        .op(op)
        .await
}

/// As [`crate::wait_empty`], on a connection of its own.
pub async fn wait_empty(target: impl Into<Target>, name: &str, timeout: Duration) -> Result<bool> {
    let emptied: i64 = once(target.into(), &wait_empty_op(name, timeout), true).await?;
    Ok(emptied == 1)
}

/// As [`crate::stored_limit`].
pub async fn stored_limit(target: impl Into<Target>, name: &str) -> Result<Option<u64>> {
    once(target.into(), &Op::new("LIMIT", name), false).await
}

/// As [`crate::set_limit`].
pub async fn set_limit(target: impl Into<Target>, name: &str, limit: u32) -> Result<()> {
    once(target.into(), &Op::new("LIMIT", name).arg(limit), false).await
}

/// As [`crate::clear_limit`].
pub async fn clear_limit(target: impl Into<Target>, name: &str) -> Result<bool> {
    let removed: i64 = once(target.into(), &Op::new("LIMIT", name).arg("CLEAR"), false).await?;
    Ok(removed == 1)
}

/// As [`crate::in_use`].
pub async fn in_use(target: impl Into<Target>, name: &str) -> Result<u64> {
    once(target.into(), &Op::new("GET", name), false).await
}

/// What the permit (or set) and the client's refresh task share.
struct Shared {
    holder: Holder,
    link: tokio::sync::Mutex<Link>,
    /// A release was answered: a failed one leaves the permit to the next (or to the drop).
    released: AtomicBool,
}

impl Shared {
    async fn refresh(&self) -> Result<bool> {
        let sent = Instant::now();
        let held: i64 = self.link.lock().await.op(&self.holder.refresh_op()).await?;
        Ok(self.holder.refreshed(sent, held))
    }

    /// As the sync API's: when to refresh again; nothing after the release.
    async fn refresh_due(&self) -> Option<Duration> {
        let mut link = self.link.lock().await;
        if self.released.load(Ordering::SeqCst) {
            return None;
        }
        let sent = Instant::now();
        let within = self.holder.refresh_within();
        link.hasty = Some(within);
        let op = self.holder.refresh_op();
        let refresh = link.op::<i64>(&op);
        let answer = match tokio::time::timeout(within, refresh).await {
            Ok(answer) => answer,
            Err(_) => {
                mark_stalled(&link.addr, within);
                Err(timed_out().into())
            }
        };
        link.hasty = None;
        self.holder.next_refresh(sent, answer)
    }

    async fn release(&self) -> Result<i64> {
        self.link.lock().await.op(&self.holder.release_op()).await
    }
}

/// The refresh and the release that a permit and a set share.
struct Holding {
    shared: Arc<Shared>,
    refresher: Arc<Refresher>,
    /// Its key in the client's refresh schedule, while refreshed.
    scheduled: Mutex<Option<u64>>,
}

impl Holding {
    fn new(holder: Holder, link: Link, refresher: Arc<Refresher>) -> Self {
        Holding {
            shared: Arc::new(Shared {
                holder,
                link: tokio::sync::Mutex::new(link),
                released: AtomicBool::new(false),
            }),
            refresher,
            scheduled: Mutex::new(None),
        }
    }

    fn holder(&self) -> &Holder {
        &self.shared.holder
    }

    fn unschedule(&self) {
        if let Some(key) = lock(&self.scheduled).take() {
            self.refresher.remove(key);
        }
    }

    /// As the sync API's: an error leaves the permit held, for another call or the drop.
    async fn give_back(&self) -> Result<bool> {
        if self.shared.released.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let lost_before = self.holder().is_lost();
        self.unschedule();
        // Under the link's lock: a refresh under way ends first, and none is sent after.
        let mut link = self.shared.link.lock().await;
        if self.shared.released.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let released: i64 = link.op(&self.holder().release_op()).await?;
        self.shared.released.store(true, Ordering::SeqCst);
        Ok(released == self.holder().wanted() && !lost_before)
    }

    /// As the sync API's: drives core's [`Tail`] after the grant, then moves the permit's
    /// calls to `shared` (unless bound) and starts its refresh.
    async fn finish(
        &mut self,
        mut tail: Tail,
        auto_refresh: bool,
        shared: Option<Link>,
    ) -> Result<()> {
        let mut step = tail.start();
        loop {
            step = match step {
                Step::WaitReplicas(wait) => {
                    let answer = self.shared.link.lock().await.wait_replicas(&wait).await;
                    tail.waited(answer)
                }
                Step::Refresh(pause) => {
                    tokio::time::sleep(pause).await;
                    tail.refreshed(self.shared.refresh().await)
                }
                Step::GiveBack(err) => {
                    let _ = self.give_back().await; // else the drop tries again
                    return Err(err);
                }
                Step::Done => break,
            };
        }
        if let Some(shared) = shared {
            *self.shared.link.lock().await = shared;
        }
        if auto_refresh {
            *lock(&self.scheduled) = Some(self.refresher.add(&self.shared));
        }
        Ok(())
    }
}

impl Drop for Holding {
    /// No async drop: the refresh stops, and inside a runtime a task gives the permit back.
    fn drop(&mut self) {
        self.unschedule();
        if !self.shared.released.load(Ordering::SeqCst) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                // On the shared connection: the permit's own may still be blocked in a call
                // that was dropped (`WAIT numreplicas`), which would hold the release back.
                let link = self
                    .shared
                    .link
                    .try_lock()
                    .ok()
                    .map(|l| l.sibling(Kind::Shared));
                let shared = Arc::clone(&self.shared);
                runtime.spawn(async move {
                    match link {
                        Some(mut link) => {
                            let _ = link.op::<i64>(&shared.holder.release_op()).await;
                        }
                        None => {
                            let _ = shared.release().await;
                        }
                    }
                });
            }
        }
    }
}

/// A granted permit: refreshed by the client's tokio task every lease/3 (unless
/// [`Semaphore::auto_refresh`] is off); see the module's text for what a drop does.
pub struct Permit {
    holding: Holding,
    ticket: Option<u64>,
    count: u32,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("name", &self.name())
            .field("id", &self.id())
            .field("ticket", &self.ticket)
            .field("count", &self.count)
            .finish()
    }
}

impl Permit {
    /// The holder's identifier.
    pub fn id(&self) -> &str {
        &self.holding.holder().id
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.holding.holder().names[0]
    }

    /// The fencing ticket of a fair permit (tickets of a name only ever grow), else `None`.
    pub fn ticket(&self) -> Option<u64> {
        self.ticket
    }

    /// The number of permits held.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// As [`crate::Permit::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.holding.holder().is_lost()
    }

    /// As [`crate::Permit::check`].
    pub fn check(&self) -> Result<()> {
        self.holding.holder().check()
    }

    /// As [`crate::Permit::refresh`].
    pub async fn refresh(&self) -> Result<bool> {
        self.holding.shared.refresh().await
    }

    /// As [`crate::Permit::release_some`].
    pub async fn release_some(&mut self, count: u32) -> Result<bool> {
        let op = self.holding.holder().release_some_op(self.count, count)?;
        let released: i64 = self.holding.shared.link.lock().await.op(&op).await?;
        if released == 1 {
            self.count -= count;
        } else {
            self.holding.holder().mark_lost();
        }
        Ok(released == 1)
    }

    /// As [`crate::Permit::release`]: an error leaves the permit held, to release again.
    pub async fn release(&self) -> Result<bool> {
        self.holding.give_back().await
    }
}

/// Permits of several semaphores taken at once ([`SemaphoreSet::acquire`]), refreshed, lost
/// and given back together.
pub struct PermitSet {
    holding: Holding,
    counts: Vec<u32>,
    tickets: Option<Vec<u64>>,
}

impl fmt::Debug for PermitSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitSet")
            .field("names", &self.names())
            .field("id", &self.id())
            .field("tickets", &self.tickets)
            .field("counts", &self.counts)
            .finish()
    }
}

impl PermitSet {
    /// The holder's identifier, the same in every semaphore of the set.
    pub fn id(&self) -> &str {
        &self.holding.holder().id
    }

    /// The semaphores' names, in the order given.
    pub fn names(&self) -> &[String] {
        &self.holding.holder().names
    }

    /// The permits held of each semaphore, in the same order.
    pub fn counts(&self) -> &[u32] {
        &self.counts
    }

    /// With [`SemaphoreSet::fair`]: one fencing ticket per semaphore, in the same order.
    pub fn tickets(&self) -> Option<&[u64]> {
        self.tickets.as_deref()
    }

    /// As [`crate::PermitSet::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.holding.holder().is_lost()
    }

    /// As [`crate::PermitSet::check`].
    pub fn check(&self) -> Result<()> {
        self.holding.holder().check()
    }

    /// As [`crate::PermitSet::refresh`].
    pub async fn refresh(&self) -> Result<bool> {
        self.holding.shared.refresh().await
    }

    /// As [`crate::PermitSet::release`].
    pub async fn release(&self) -> Result<bool> {
        self.holding.give_back().await
    }
}
