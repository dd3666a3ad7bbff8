//! The sync API: the calls of a client's semaphores take a connection of its pool for the
//! call only, and one thread per client refreshes all its permits.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Client, Cmd, Connection, FromRedisValue, RedisResult, Value};

use crate::cluster::{Cluster, Route, CONNECT_WITHIN};
use crate::core::{
    connection_broken, deadline, identifier, left, lock, mark_stalled, next_step, next_tick,
    slot_of, stalled, timed_out, unblocked, wait_empty_op, AcquireSpec, Action, Backend, Due,
    Error, Holder, KnownCell, Next, Op, Pool, Request, Result, Retries, Schedule, SetSpec, Step,
    Tail, Wait,
};

/// Where the semaphores are: one server (a [`Client`]; the short form) or a Redis Cluster
/// ([`Cluster`]; the long form, each call on the primary serving the name's slot).
#[derive(Debug, Clone)]
pub enum Target {
    Standalone(Client),
    Cluster(Cluster),
}

impl From<Client> for Target {
    fn from(client: Client) -> Self {
        Target::Standalone(client)
    }
}

impl From<&Client> for Target {
    fn from(client: &Client) -> Self {
        Target::Standalone(client.clone())
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

impl Target {
    /// The slot of `names` (a semaphore, or a set's), checked before anything is sent:
    /// `None` on one server.
    pub(crate) fn slot(&self, names: &[String]) -> Result<Option<u16>> {
        slot_of(names, matches!(self, Target::Cluster(_)))
    }
}

/// What the semaphores and permits of one client share (of one [`Cluster`] in Redis Cluster,
/// whose pools are its own, per node): the connections their calls take for the call and give
/// back, apart from them those their waits block, and the one thread that refreshes every
/// permit.
pub(crate) struct Hub {
    calls: Arc<Pool<Connection>>,
    waits: Arc<Pool<Connection>>,
    refresher: Refresher,
}

impl fmt::Debug for Hub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

/// The hub of `target`'s client: one per server address and settings (per [`Cluster`] in Redis
/// Cluster), for as long as a semaphore or permit of it lives, however many `Semaphore`s were
/// made of clones of the client.
fn hub_of(target: &Target) -> Arc<Hub> {
    static HUBS: OnceLock<Mutex<HashMap<String, Weak<Hub>>>> = OnceLock::new();
    let key = match target {
        Target::Standalone(client) => format!("{:?}", client.get_connection_info()),
        Target::Cluster(cluster) => format!("cluster {:p}", Arc::as_ptr(&cluster.inner)),
    };
    let mut hubs = lock(HUBS.get_or_init(Mutex::default));
    if let Some(hub) = hubs.get(&key).and_then(Weak::upgrade) {
        return hub;
    }
    hubs.retain(|_, hub| hub.strong_count() > 0);
    let hub = Arc::new(Hub {
        calls: Arc::default(),
        waits: Arc::default(),
        refresher: Refresher::default(),
    });
    hubs.insert(key, Arc::downgrade(&hub));
    hub
}

/// The refreshes of a client's permits, sent by one thread (started with the first permit,
/// ended with the hub): each on a connection of the pool, taken for the call.
#[derive(Default)]
struct Refresher {
    state: Arc<Refreshes>,
}

struct Refreshes {
    plan: Mutex<Plan>,
    wake: Condvar,
}

impl Default for Refreshes {
    fn default() -> Self {
        Refreshes {
            plan: Mutex::new(Plan {
                schedule: Schedule::new(),
                running: false,
                stop: false,
            }),
            wake: Condvar::new(),
        }
    }
}

struct Plan {
    schedule: Schedule<Weak<Shared>>,
    running: bool,
    stop: bool,
}

impl Refresher {
    /// Refreshes `shared` every lease/3 from now on: its key in the schedule.
    fn add(&self, shared: &Arc<Shared>) -> u64 {
        let mut plan = lock(&self.state.plan);
        let (key, earliest) = plan
            .schedule
            .add(Arc::downgrade(shared), shared.holder.lease / 3);
        if !plan.running {
            let state = Arc::clone(&self.state);
            thread::Builder::new()
                .name("redsem-refresh".into())
                .spawn(move || state.run())
                .expect("cannot start the refresh thread");
            plan.running = true;
        } else if earliest {
            self.state.wake.notify_one();
        }
        key
    }

    fn remove(&self, key: u64) {
        lock(&self.state.plan).schedule.remove(key);
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        lock(&self.state.plan).stop = true;
        self.state.wake.notify_one();
    }
}

impl Refreshes {
    fn run(&self) {
        let mut plan = lock(&self.plan);
        while !plan.stop {
            plan = match plan.schedule.next_due(Instant::now()) {
                Due::Now(key, shared) => {
                    drop(plan);
                    let next = shared.upgrade().and_then(|shared| shared.refresh_due());
                    let mut plan = lock(&self.plan);
                    plan.schedule.refreshed(key, next);
                    plan
                }
                Due::At(at) => {
                    let sleep = at.saturating_duration_since(Instant::now());
                    self.wake
                        .wait_timeout(plan, sleep)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
                Due::Idle => self
                    .wake
                    .wait(plan)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
        }
    }
}

/// The connections to the node serving a slot (on one server: to the server): each call takes
/// one of the pool and gives it back, or with `own` keeps one from call to call (`BOUND` ties a
/// permit to it, `WAIT numreplicas` covers its writes). Moved to the slot's new owner after a
/// move or a failover.
pub(crate) struct Link {
    target: Target,
    route: Route,
    pool: Arc<Pool<Connection>>,
    own: bool,
    /// The node's address (empty on one server) and the connection in use.
    conn: Option<(String, Connection)>,
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
    /// A link whose calls take connections of the client's pool, or with `waiting` of the
    /// pool that waits block.
    pub(crate) fn new(
        target: Target,
        slot: Option<u16>,
        known: KnownCell,
        hub: &Hub,
        waiting: bool,
    ) -> Self {
        let (route, pool) = match (&target, slot) {
            (Target::Cluster(cluster), Some(slot)) => (
                Route::Slot(cluster.inner.clone(), slot),
                match waiting {
                    true => cluster.inner.waits.clone(),
                    false => cluster.inner.pool.clone(),
                },
            ),
            _ => (
                Route::Standalone(known),
                match waiting {
                    true => hub.waits.clone(),
                    false => hub.calls.clone(),
                },
            ),
        };
        Link {
            target,
            route,
            pool,
            own: false,
            conn: None,
            reused: false,
            once: false,
            hasty: None,
            addr: String::new(),
        }
    }

    /// Keeps its connection from call to call.
    pub(crate) fn own(mut self, own: bool) -> Self {
        self.own = own;
        self
    }

    /// Another link to the same node, on the same pool.
    fn sibling(&self) -> Link {
        Link {
            target: self.target.clone(),
            route: self.route.clone(),
            pool: self.pool.clone(),
            own: false,
            conn: None,
            reused: false,
            once: false,
            hasty: None,
            addr: String::new(),
        }
    }

    /// Sends what `build` makes for the node's backend, to the node serving the slot: in Redis
    /// Cluster it follows `MOVED` and `ASK`, and after a failure (the slot moving, its owner
    /// failing over or unreachable) pauses and tries again, the same call, until the retry
    /// budget has passed. On one server an error is the caller's at once (but for a pooled
    /// connection found closed, replaced once).
    pub(crate) fn send(
        &mut self,
        build: &mut dyn FnMut(Backend) -> Result<Request>,
    ) -> Result<(Value, Backend)> {
        let answer = self.send_on(build);
        if !self.own {
            if let Some((addr, conn)) = self.conn.take() {
                self.pool.give(&addr, conn);
            }
        }
        answer
    }

    fn send_on(
        &mut self,
        build: &mut dyn FnMut(Backend) -> Result<Request>,
    ) -> Result<(Value, Backend)> {
        let mut retries = Retries::new(self.route.budget());
        let mut ask = None;
        let mut replaced = false;
        loop {
            let asked: Option<String> = ask.take();
            let err = match self.attempt(build, asked.as_deref()) {
                Ok(answer) => return Ok(answer),
                Err(Error::Redis(err)) => err,
                Err(other) => return Err(other),
            };
            let broken = connection_broken(&err);
            if broken || asked.is_some() {
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
                self.conn = None;
            }
            ask = retry.ask;
            thread::sleep(retry.pause);
        }
    }

    /// The refresher's new connection to `addr`, made on a thread of its own and waited for at
    /// most `within`: a node that accepts connections but does not answer (stopped) would hold
    /// the handshake up without end. One such attempt per node at a time; one that ends late
    /// leaves its connection in the pool.
    fn connect_within(
        &self,
        client: Client,
        addr: &str,
        within: Duration,
    ) -> RedisResult<Connection> {
        if !self.pool.begin_connect(addr) {
            return Err(timed_out());
        }
        let (done, connected) = mpsc::channel();
        let (pool, at) = (Arc::clone(&self.pool), addr.to_string());
        thread::spawn(move || {
            let conn = client.get_connection_with_timeout(CONNECT_WITHIN);
            pool.end_connect(&at);
            if let Err(mpsc::SendError(Ok(conn))) = done.send(conn) {
                pool.give(&at, conn);
            }
        });
        connected
            .recv_timeout(within)
            .unwrap_or_else(|_| Err(timed_out()))
    }

    /// One try: on the slot's owner, or after `ASK` (`ASKING` first) on the node it named.
    fn attempt(
        &mut self,
        build: &mut dyn FnMut(Backend) -> Result<Request>,
        ask: Option<&str>,
    ) -> Result<(Value, Backend)> {
        let addr = match (&self.route, ask) {
            (_, Some(addr)) => addr.to_string(),
            (Route::Slot(cluster, slot), None) => cluster.owner(*slot)?,
            (Route::Standalone(_), None) => String::new(),
        };
        if self.conn.as_ref().is_some_and(|(at, _)| *at != addr) {
            self.conn = None;
        }
        if self.conn.is_none() {
            self.reused = false;
            let conn = match self.pool.take(&addr) {
                Some(conn) => {
                    self.reused = true;
                    conn
                }
                None => {
                    let (client, within) = match &self.target {
                        Target::Standalone(client) => (client.clone(), None),
                        Target::Cluster(cluster) => {
                            (cluster.inner.node(&addr)?, Some(CONNECT_WITHIN))
                        }
                    };
                    match self.hasty {
                        None => match within {
                            None => client.get_connection()?,
                            Some(within) => client.get_connection_with_timeout(within)?,
                        },
                        Some(hasty) => self.connect_within(client, &addr, hasty)?,
                    }
                }
            };
            self.conn = Some((addr.clone(), conn));
        }
        self.addr.clone_from(&addr);
        if self.hasty.is_some() && stalled(&addr) {
            return Err(timed_out().into());
        }
        let conn = &mut self.conn.as_mut().expect("connected above").1;
        let backend = match self.route.backend(&addr) {
            Some(backend) => backend,
            None => self
                .route
                .learn_backend(&addr, Backend::question().query(conn)?),
        };
        let request = build(backend)?;
        if ask.is_some() {
            redis::cmd("ASKING").query::<()>(conn)?;
        }
        if self.hasty.is_some() {
            conn.set_read_timeout(self.hasty)?;
            conn.set_write_timeout(self.hasty)?;
        }
        let answer = match request.cmd.query(conn) {
            Err(err) if err.kind() == redis::ErrorKind::NoScriptError => {
                let eval = request.eval();
                if ask.is_some() {
                    redis::cmd("ASKING").query::<()>(conn)?;
                }
                eval.query(conn)
            }
            answer => answer,
        };
        if self.hasty.is_some() {
            // The connection goes back to the pool as it came.
            let _ = conn.set_read_timeout(None);
            let _ = conn.set_write_timeout(None);
        }
        Ok((answer?, backend))
    }

    /// `op` in the form the node takes.
    pub(crate) fn op<T: FromRedisValue>(&mut self, op: &Op) -> Result<T> {
        let long = self.is_cluster();
        let (value, _) = self.send(&mut |backend| op.request(backend, long))?;
        Ok(T::from_redis_value(&value)?)
    }

    /// A command that is no semaphore operation (`BLPOP`, `WAIT`), on the same node.
    pub(crate) fn plain<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T> {
        let (value, _) = self.send(&mut |_| Ok(cmd.clone().into()))?;
        Ok(T::from_redis_value(&value)?)
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.route.is_cluster()
    }

    /// An acquire's steps (core's [`Wait`]) until granted or refused.
    fn acquire(&mut self, wait: &mut Wait) -> Result<Option<u64>> {
        let long = self.is_cluster();
        let mut action = wait.start();
        loop {
            let next = match action {
                Action::Send(op) => {
                    let answer = self.send(&mut |backend| wait.as_sent(&op).request(backend, long));
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
                    let popped = self.block(&blpop, tick, &wait.tick_op());
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
                    let _ = self.plain::<Value>(&del);
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

    /// `BLPOP` on a connection of the pool; with `tick`, a timer thread sends `TICK` on
    /// another one at the earliest holder's deadline while it blocks (the server's own timeout
    /// would see that deadline up to 100 ms late).
    fn block(
        &mut self,
        blpop: &Cmd,
        tick: Option<Duration>,
        tick_op: &Op,
    ) -> Result<Option<(String, String)>> {
        let Some(first) = tick else {
            return self.plain(blpop);
        };
        let mut ticker = self.sibling();
        ticker.once = true; // a TICK that fails is skipped: the BLPOP ends in time anyway
        let (done, stopped) = mpsc::channel::<()>();
        thread::scope(|scope| {
            scope.spawn(move || {
                let mut after = first;
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(after) {
                    match ticker.op::<i64>(tick_op).ok().and_then(next_tick) {
                        Some(next) => after = next,
                        None => return,
                    }
                }
            });
            let popped = self.plain(blpop);
            drop(done);
            popped
        })
    }

    /// `WAIT numreplicas` (core's [`Step::WaitReplicas`]), sent once on the connection in use:
    /// never on another, as a pooled connection found closed would be.
    fn wait_replicas(&mut self, wait: &Cmd) -> Result<usize> {
        self.once = true;
        self.reused = false;
        let answer = self.plain::<usize>(wait);
        self.once = false;
        answer
    }

    /// A waiter that gives up while in line leaves it, and gives back a grant made meanwhile.
    fn abandon(&mut self, wait: &mut Wait) {
        if let Some((leave, unknown)) = wait.abandon() {
            let left = self.op::<Option<String>>(&leave);
            if unknown || matches!(left, Ok(Some(message)) if message.starts_with('G')) {
                let _ = self.op::<i64>(&wait.release_op());
            }
        }
    }
}

/// A semaphore's settings; [`Semaphore::acquire`] takes a permit. Defaults: limit 1, lease 30
/// seconds, no waiting, not fair, one permit, not bound, a new UUID v4 identifier per acquire,
/// no replicas awaited, refreshed automatically.
#[derive(Debug, Clone)]
pub struct Semaphore {
    target: Target,
    spec: AcquireSpec,
    id: Option<String>,
    durable: Option<(usize, Duration)>,
    auto_refresh: bool,
    /// Whether the server has the module, asked on the first acquire and again while it had
    /// none; shared by the clones (in Redis Cluster the [`Cluster`] keeps it per node).
    known: KnownCell,
    /// What every semaphore of the client shares: the pools, the refresh thread.
    hub: Arc<Hub>,
}

impl Semaphore {
    /// A semaphore on one server ([`Client`]) or in Redis Cluster ([`Cluster`], or a
    /// `ClusterClient`): there `name` needs a hash tag.
    pub fn new(target: impl Into<Target>, name: impl Into<String>) -> Self {
        let target = target.into();
        Semaphore {
            hub: hub_of(&target),
            target,
            spec: AcquireSpec::new(name.into()),
            id: None,
            durable: None,
            auto_refresh: true,
            known: KnownCell::default(),
        }
    }

    /// The number of permits (1 to 4294967295).
    pub fn limit(mut self, limit: u32) -> Self {
        self.spec.limit = limit;
        self
    }

    /// How long a permit lives unless refreshed (millisecond precision); refreshed every
    /// lease/3 while held. Zero and `Duration::MAX` are refused ([`Error::BadArgument`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.spec.lease = lease;
        self
    }

    /// How long to wait for a permit (inside the server with the module, in the script's line
    /// without it): `None` or zero do not wait,
    /// `Some(Duration::MAX)` waits without limit.
    pub fn wait(mut self, wait: Option<Duration>) -> Self {
        self.spec.wait = wait;
        self
    }

    /// `SEM.ACQUIREFAIR`: first come, first served, and [`Permit::ticket`] is a fencing token.
    pub fn fair(mut self, fair: bool) -> Self {
        self.spec.fair = fair;
        self
    }

    /// Takes `count` permits at once (all or none).
    pub fn count(mut self, count: u32) -> Self {
        self.spec.count = Some(count);
        self
    }

    /// `BOUND`: the permit is given back as soon as its connection closes (the process dies).
    /// It needs the module: without it the acquire fails with [`Error::ModuleRequired`].
    pub fn bound(mut self, bound: bool) -> Self {
        self.spec.bound = bound;
        self
    }

    /// The holder's identifier (default: a new UUID v4 per acquire). An identifier names one
    /// permit: a second acquire with it, while the first permit is held, renews that permit
    /// rather than taking another (which is what makes a retried acquire safe). So a
    /// `Semaphore` with an identifier, and its clones, must not hold two permits at once.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// After the grant, `WAIT replicas timeout`: unless that many replicas acknowledge it, the
    /// permit is given back and the acquire fails with [`Error::NotDurable`].
    pub fn durable(mut self, replicas: usize, timeout: Duration) -> Self {
        self.durable = Some((replicas, timeout));
        self
    }

    /// `false`: no background refresh; call [`Permit::refresh`] yourself.
    pub fn auto_refresh(mut self, auto_refresh: bool) -> Self {
        self.auto_refresh = auto_refresh;
        self
    }

    /// Takes a permit: [`Error::NotAcquired`] when none was granted.
    pub fn acquire(&self) -> Result<Permit> {
        self.spec.check()?;
        let slot = self.target.slot(std::slice::from_ref(&self.spec.name))?;
        let id = identifier(&self.id);
        let own = self.spec.bound || self.durable.is_some();
        let waits = !left(deadline(self.spec.wait)).is_zero();
        let mut link = Link::new(
            self.target.clone(),
            slot,
            self.known.clone(),
            &self.hub,
            waits,
        )
        .own(own);
        let mut wait = Wait::new(&self.spec, &id);
        let ticket = match link.acquire(&mut wait) {
            Ok(ticket) => ticket,
            Err(err) => {
                link.abandon(&mut wait);
                return Err(err);
            }
        };
        let sent = wait.attempted;
        let budget = link.route.budget();
        let holder = Holder::new(vec![self.spec.name.clone()], false, id, self.spec.lease);
        holder.granted_at(sent);
        if waits && !own {
            // Granted: the permit's calls take connections of the calls' pool.
            link = Link::new(
                self.target.clone(),
                slot,
                self.known.clone(),
                &self.hub,
                false,
            );
        }
        // From here on, an early return drops the permit, which gives it back.
        let mut permit = Permit {
            holding: Holding::new(holder, link, &self.hub),
            ticket,
            count: self.spec.count.unwrap_or(1),
        };
        let tail = Tail::new(sent, self.spec.lease, self.durable, slot.is_some(), budget);
        permit.holding.finish(tail, self.auto_refresh)?;
        Ok(permit)
    }
}

/// Permits of several semaphores for one identifier, taken all or none in one step
/// (`SEM.ACQUIREALL`); [`SemaphoreSet::acquire`] takes them. Defaults as for [`Semaphore`]:
/// lease 30 seconds, no waiting, not fair, not bound, a new UUID v4 identifier per acquire,
/// refreshed automatically. A set needs the module: without it [`SemaphoreSet::acquire`] fails
/// with [`Error::ModuleRequired`]. In Redis Cluster the names must share a slot (one hash tag).
#[derive(Debug, Clone)]
pub struct SemaphoreSet {
    target: Target,
    spec: SetSpec,
    id: Option<String>,
    auto_refresh: bool,
    /// Whether the server has the module, as for [`Semaphore`].
    known: KnownCell,
    hub: Arc<Hub>,
}

impl SemaphoreSet {
    pub fn new(target: impl Into<Target>) -> Self {
        let target = target.into();
        SemaphoreSet {
            hub: hub_of(&target),
            target,
            spec: SetSpec::new(),
            id: None,
            auto_refresh: true,
            known: KnownCell::default(),
        }
    }

    /// Adds `count` of the `limit` permits of `name` to the set (1 to 64 distinct names; in
    /// Redis Cluster they must share a slot).
    pub fn semaphore(mut self, name: impl Into<String>, limit: u32, count: u32) -> Self {
        self.spec.semaphores.push((name.into(), limit, count));
        self
    }

    /// As [`Semaphore::lease`], the same for every semaphore of the set.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.spec.lease = lease;
        self
    }

    /// How long to wait inside the server until the whole set can be granted at once: `None`
    /// or zero do not wait, `Some(Duration::MAX)` waits without limit.
    pub fn wait(mut self, wait: Option<Duration>) -> Self {
        self.spec.wait = wait;
        self
    }

    /// `FAIR`: every semaphore is a fair one, and [`PermitSet::tickets`] has a fencing token
    /// per semaphore.
    pub fn fair(mut self, fair: bool) -> Self {
        self.spec.fair = fair;
        self
    }

    /// `BOUND`: every permit of the set is given back as soon as its connection closes.
    pub fn bound(mut self, bound: bool) -> Self {
        self.spec.bound = bound;
        self
    }

    /// As [`Semaphore::id`].
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// `false`: no background refresh; call [`PermitSet::refresh`] yourself.
    pub fn auto_refresh(mut self, auto_refresh: bool) -> Self {
        self.auto_refresh = auto_refresh;
        self
    }

    /// Takes every permit of the set: [`Error::NotAcquired`] when any one of them is full
    /// (then none is held); [`Error::ModuleRequired`] when the server has no module.
    pub fn acquire(&self) -> Result<PermitSet> {
        self.spec.check()?;
        let names = self.spec.names();
        let slot = self.target.slot(&names)?;
        let id = identifier(&self.id);
        let until = deadline(self.spec.wait);
        let waits = !left(until).is_zero();
        let mut link = Link::new(
            self.target.clone(),
            slot,
            self.known.clone(),
            &self.hub,
            waits,
        )
        .own(self.spec.bound);
        let sent = Instant::now();
        let reply: Value = link.op(&self.spec.op(&id, left(until)))?;
        let tickets = self.spec.outcome(reply)?;
        let holder = Holder::new(names, true, id, self.spec.lease);
        holder.granted_at(sent);
        if waits && !self.spec.bound {
            link = Link::new(
                self.target.clone(),
                slot,
                self.known.clone(),
                &self.hub,
                false,
            );
        }
        // From here on, an early return drops the set, which gives it back.
        let mut permits = PermitSet {
            holding: Holding::new(holder, link, &self.hub),
            counts: self.spec.semaphores.iter().map(|s| s.2).collect(),
            tickets,
        };
        let tail = Tail::new(sent, self.spec.lease, None, slot.is_some(), Duration::ZERO);
        permits.holding.finish(tail, self.auto_refresh)?;
        Ok(permits)
    }
}

/// `op` on a connection of the client's pool (with `waits`, of the pool that waits block)
/// to the node serving `name`, after asking whether the node has the module.
fn once<T: FromRedisValue>(target: Target, op: &Op, waits: bool) -> Result<T> {
    let slot = target.slot(&[op.name().to_string()])?;
    let hub = hub_of(&target);
    Link::new(target, slot, KnownCell::default(), &hub, waits).op(op)
}

/// Waits until the semaphore `name` has no live holder (`SEM.WAITEMPTY`), on a connection
/// apart from the calls' (it blocks the connection): `Ok(true)` once it has none (at once if it
/// has none now), `Ok(false)` when `timeout` passes first. `Duration::MAX` waits without
/// limit; zero looks once. It takes nothing. It needs the module: without it, [`Error::ModuleRequired`].
pub fn wait_empty(target: impl Into<Target>, name: &str, timeout: Duration) -> Result<bool> {
    let emptied: i64 = once(target.into(), &wait_empty_op(name, timeout), true)?;
    Ok(emptied == 1)
}

/// The operator's limit stored for the semaphore `name` (`SEM.LIMIT name`), or `None` when
/// there is none. While one is stored, every acquire of `name` uses it instead of its own.
pub fn stored_limit(target: impl Into<Target>, name: &str) -> Result<Option<u64>> {
    once(target.into(), &Op::new("LIMIT", name), false)
}

/// Stores an operator's limit for the semaphore `name` (`SEM.LIMIT name n`): every acquire of
/// `name` uses it instead of its own until [`clear_limit`]. 0 pauses the semaphore; a lower
/// limit takes no permit from its holders, and a higher one serves the waiters at once.
pub fn set_limit(target: impl Into<Target>, name: &str, limit: u32) -> Result<()> {
    once(target.into(), &Op::new("LIMIT", name).arg(limit), false)
}

/// Removes the operator's limit of the semaphore `name` (`SEM.LIMIT name CLEAR`): acquires use
/// their own limits again. `Ok(true)` if one was stored.
pub fn clear_limit(target: impl Into<Target>, name: &str) -> Result<bool> {
    let removed: i64 = once(target.into(), &Op::new("LIMIT", name).arg("CLEAR"), false)?;
    Ok(removed == 1)
}

/// The permits of the semaphore `name` in use (`SEM.GET name`): its live holders, and a
/// holder of several permits ([`Semaphore::count`]) counts for each.
pub fn in_use(target: impl Into<Target>, name: &str) -> Result<u64> {
    once(target.into(), &Op::new("GET", name), false)
}

/// What the permit (or set) and the client's refresh thread share.
struct Shared {
    holder: Holder,
    link: Mutex<Link>,
    /// A release was answered: a failed one leaves the permit to the next (or to the drop).
    released: AtomicBool,
}

impl Shared {
    fn refresh(&self) -> Result<bool> {
        let sent = Instant::now();
        let held: i64 = lock(&self.link).op(&self.holder.refresh_op())?;
        Ok(self.holder.refreshed(sent, held))
    }

    /// The refresh thread's: when to refresh again (core's [`Holder::next_refresh`]), without
    /// waiting out a failover (the other permits' refreshes come first); nothing after the
    /// release.
    fn refresh_due(&self) -> Option<Duration> {
        let mut link = lock(&self.link);
        if self.released.load(Ordering::SeqCst) {
            return None;
        }
        let sent = Instant::now();
        link.hasty = Some(self.holder.refresh_within());
        let answer = link.op::<i64>(&self.holder.refresh_op());
        link.hasty = None;
        self.holder.next_refresh(sent, answer)
    }
}

/// The refresh and the release that a permit and a set share.
struct Holding {
    shared: Arc<Shared>,
    hub: Arc<Hub>,
    /// Its key in the client's refresh schedule, while refreshed.
    scheduled: Mutex<Option<u64>>,
}

impl Holding {
    fn new(holder: Holder, link: Link, hub: &Arc<Hub>) -> Self {
        Holding {
            shared: Arc::new(Shared {
                holder,
                link: Mutex::new(link),
                released: AtomicBool::new(false),
            }),
            hub: Arc::clone(hub),
            scheduled: Mutex::new(None),
        }
    }

    fn holder(&self) -> &Holder {
        &self.shared.holder
    }

    fn with_link<T>(&self, send: impl FnOnce(&mut Link) -> Result<T>) -> Result<T> {
        send(&mut lock(&self.shared.link))
    }

    /// The release: an error (a connection's) leaves the permit held, to be given back by
    /// another call or the drop; once answered, a later call sends nothing and answers false.
    fn give_back(&self) -> Result<bool> {
        if self.shared.released.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let lost_before = self.holder().is_lost();
        if let Some(key) = lock(&self.scheduled).take() {
            self.hub.refresher.remove(key);
        }
        // Under the link's lock: a refresh under way ends first, and none is sent after.
        let mut link = lock(&self.shared.link);
        if self.shared.released.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let released: i64 = link.op(&self.holder().release_op())?;
        self.shared.released.store(true, Ordering::SeqCst);
        Ok(released == self.holder().wanted() && !lost_before)
    }

    /// Drives core's [`Tail`] after the grant: the durable `WAIT`, the lease's check, the
    /// permit given back when either fails; then its refresh starts.
    fn finish(&mut self, mut tail: Tail, auto_refresh: bool) -> Result<()> {
        let mut step = tail.start();
        loop {
            step = match step {
                Step::WaitReplicas(wait) => {
                    let answer = self.with_link(|link| link.wait_replicas(&wait));
                    tail.waited(answer)
                }
                Step::Refresh(pause) => {
                    thread::sleep(pause);
                    tail.refreshed(self.shared.refresh())
                }
                Step::GiveBack(err) => {
                    let _ = self.give_back(); // else the drop tries again
                    return Err(err);
                }
                Step::Done => break,
            };
        }
        if auto_refresh {
            *lock(&self.scheduled) = Some(self.hub.refresher.add(&self.shared));
        }
        Ok(())
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let _ = self.give_back();
    }
}

/// A granted permit. The client's refresh thread refreshes its lease every lease/3 (unless
/// [`Semaphore::auto_refresh`] is off) and gives the permit back when dropped; call
/// [`Permit::release`] to learn whether it was held throughout.
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

    /// True once the permit may have run out: a refresh answered 0, or no refresh was
    /// confirmed within a lease (the server is unreachable). It stays true.
    pub fn is_lost(&self) -> bool {
        self.holding.holder().is_lost()
    }

    /// `Err(Error::Lost)` once the permit is lost: call it in long work to stop early.
    pub fn check(&self) -> Result<()> {
        self.holding.holder().check()
    }

    /// Moves the deadline to now + lease; `Ok(false)` (and lost) if the permit had run out.
    pub fn refresh(&self) -> Result<bool> {
        self.holding.shared.refresh()
    }

    /// Gives back `count` of the permits held and keeps the rest (its deadline and ticket);
    /// `Ok(false)` (and lost) if the permit had run out.
    pub fn release_some(&mut self, count: u32) -> Result<bool> {
        let op = self.holding.holder().release_some_op(self.count, count)?;
        let released: i64 = self.holding.with_link(|link| link.op(&op))?;
        if released == 1 {
            self.count -= count;
        } else {
            self.holding.holder().mark_lost();
        }
        Ok(released == 1)
    }

    /// Gives the permit back: `Ok(true)` if it was held throughout, `Ok(false)` if it was lost
    /// (the work it guarded may have overlapped another holder's). An error (the connection's)
    /// leaves the permit held: call `release` again (else its drop tries once more). Once a
    /// release was answered, another sends nothing and answers `Ok(false)`.
    pub fn release(&self) -> Result<bool> {
        self.holding.give_back()
    }
}

/// Permits of several semaphores taken at once ([`SemaphoreSet::acquire`]). They are refreshed
/// together (`SEM.REFRESHALL`) by the client's refresh thread every lease/3, the set is lost as
/// soon as any one of them is, and they are given back together (`SEM.RELEASEALL`) by
/// [`PermitSet::release`] or when the set is dropped.
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

    /// True once a permit of the set may have run out: a refresh answered fewer than all the
    /// semaphores, or no refresh was confirmed within a lease. It stays true.
    pub fn is_lost(&self) -> bool {
        self.holding.holder().is_lost()
    }

    /// `Err(Error::Lost)` once a permit of the set is lost: call it in long work to stop early.
    pub fn check(&self) -> Result<()> {
        self.holding.holder().check()
    }

    /// Moves every deadline to now + lease; `Ok(false)` (and lost) if a permit had run out.
    pub fn refresh(&self) -> Result<bool> {
        self.holding.shared.refresh()
    }

    /// Gives every permit back: `Ok(true)` if all were held throughout, `Ok(false)` if one was
    /// lost. An error leaves them held, as [`Permit::release`].
    pub fn release(&self) -> Result<bool> {
        self.holding.give_back()
    }
}
