//! Permits of a redsem semaphore (the Redis module `sem`) for the `redis` crate (sync API).
//!
//! ```no_run
//! use std::time::Duration;
//! use redsem_client::Semaphore;
//!
//! # fn main() -> Result<(), redsem_client::Error> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let permit = Semaphore::new(client, "jobs")
//!     .limit(3)
//!     .lease(Duration::from_secs(30))
//!     .wait(Some(Duration::from_secs(10)))
//!     .acquire()?;
//! // at most 3 holders here; check permit.is_lost() in long work to stop early
//! assert!(permit.release()?, "the lease ran out during the work");
//! # Ok(())
//! # }
//! ```
//!
//! A [`Permit`] holds a connection of its own from the acquire to the release (`WAIT` blocks the
//! connection it is sent on, `BOUND` ties the permit to it, and `WAIT numreplicas` covers its
//! writes), refreshes the lease from a background thread every lease/3, and gives the permit
//! back when dropped. The identifier is made here (a UUID v4) unless [`Semaphore::id`] gives
//! one, so an acquire retried after a lost reply renews the same holder.
//!
//! A [`PermitSet`] ([`SemaphoreSet::acquire`]) holds permits of several semaphores taken all
//! or none in one step, refreshed, lost and given back together; [`wait_empty`] waits until a
//! semaphore has no holder; [`stored_limit`], [`set_limit`] and [`clear_limit`] read, store and
//! remove an operator's limit (`SEM.LIMIT`), used by every acquire instead of its own, and
//! [`in_use`] tells how many permits are held.
//!
//! # Without the module
//!
//! Where the server has no module (a managed service), the crate runs the same operations as a
//! Lua script (`clients/scripts/redsem.lua` of the repository, shipped in the crate) over the
//! very same keys, so the module can be loaded later without changing code or keys. A
//! [`Semaphore`] (and its clones) asks the server once, on its first acquire, whether it has the
//! module (`COMMAND INFO SEM.ACQUIRE`), and keeps the answer; the functions that take a
//! [`Client`] ask on the connection they open. Without the module, a permit waits for a grant
//! by `BLPOP` on `<name>:wake` (a release, a lease end found by another call, or a raised limit
//! pushes a token there) and tries again at least every second and at the earliest holder's
//! deadline; waiters are served first come first served, but a newcomer may take a freed permit
//! ahead of them. What a script cannot do fails with [`Error::ModuleRequired`] before anything
//! is sent: [`Semaphore::bound`], [`SemaphoreSet`], [`wait_empty`].

use std::fmt;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::{Client, Cmd, Connection, ErrorKind, FromRedisValue, RedisError, ToRedisArgs, Value};

/// What can go wrong taking or holding a permit.
#[derive(Debug)]
pub enum Error {
    /// No permit was granted: the semaphore was full (for the whole wait, when waiting).
    NotAcquired,
    /// Fewer replicas than asked acknowledged the grant in time; the permit was given back.
    NotDurable { acked: usize, wanted: usize },
    /// [`Permit::release_some`] was asked for none, or for every permit held (use
    /// [`Permit::release`] for all); nothing was sent.
    BadCount { held: u32 },
    /// The permit ran out before it was given back (its lease ended, or another client removed
    /// it): another holder may have held it meanwhile.
    Lost,
    /// An error of the server or of the connection.
    Redis(RedisError),
    /// What this names (`BOUND`, a semaphore set, `SEM.WAITEMPTY`) needs the module, and the
    /// server has none: nothing was sent but the question whether it has the module.
    ModuleRequired(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotAcquired => write!(f, "no permit was granted"),
            Error::NotDurable { acked, wanted } => write!(
                f,
                "{acked} of {wanted} replicas acknowledged the grant in time; it was given back"
            ),
            Error::BadCount { held } => write!(
                f,
                "release_some takes from 1 to {} of the {held} permits held; release() gives back all",
                held.saturating_sub(1)
            ),
            Error::Lost => write!(
                f,
                "the permit was lost: its lease ran out before the release"
            ),
            Error::Redis(err) => err.fmt(f),
            Error::ModuleRequired(what) => {
                write!(f, "{what} needs the redsem module loaded in the server")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(err) => Some(err),
            _ => None,
        }
    }
}

impl From<RedisError> for Error {
    fn from(err: RedisError) -> Self {
        Error::Redis(err)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Seconds as the module reads them: digits and up to 3 decimals (milliseconds, rounded; a
/// positive time never rounds down to zero).
fn seconds(duration: Duration) -> String {
    let mut ms = (duration.as_nanos() + 500_000) / 1_000_000;
    if ms == 0 && !duration.is_zero() {
        ms = 1;
    }
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// The script that runs the operations where the server has no module: the repository's
/// `clients/scripts/redsem.lua` (`src/redsem.lua` is a symbolic link to it, which `cargo
/// package` packages as the file itself).
const SCRIPT: &str = include_str!("redsem.lua");

/// The SHA1 of [`SCRIPT`], as `EVALSHA` names it.
fn script_sha() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(SCRIPT).get_hash().to_string())
}

/// What [`Error::ModuleRequired`] names for a semaphore set.
const SETS: &str = "a semaphore set (SEM.ACQUIREALL)";

/// How the operations reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// The module's commands.
    Module,
    /// The script, over the same keys.
    Scripts,
}

impl Backend {
    /// Asks the server whether it has the module: `COMMAND INFO SEM.ACQUIRE` answers `[nil]`
    /// without it.
    fn detect(conn: &mut Connection) -> Result<Backend> {
        let info: Vec<Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg("SEM.ACQUIRE")
            .query(conn)?;
        Ok(match info.first() {
            None | Some(Value::Nil) => Backend::Scripts,
            Some(_) => Backend::Module,
        })
    }

    /// The backend kept in `cache`, asked on `conn` the first time.
    fn cached(cache: &OnceLock<Backend>, conn: &mut Connection) -> Result<Backend> {
        if let Some(backend) = cache.get() {
            return Ok(*backend);
        }
        let backend = Backend::detect(conn)?;
        Ok(*cache.get_or_init(|| backend))
    }
}

/// One operation on the semaphore `name`: the module's `SEM.<op> name args...`, or the script's
/// `<op> args...` over the semaphore's six keys.
struct Op<'a> {
    op: &'static str,
    name: &'a str,
    args: Vec<Vec<u8>>,
}

impl<'a> Op<'a> {
    fn new(op: &'static str, name: &'a str) -> Self {
        Op {
            op,
            name,
            args: Vec::new(),
        }
    }

    fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// `SEM.<op> name args...`.
    fn module_command(&self) -> Cmd {
        let mut cmd = redis::cmd(&format!("SEM.{}", self.op));
        cmd.arg(self.name);
        for arg in &self.args {
            cmd.arg(arg);
        }
        cmd
    }

    /// `EVALSHA sha 6 keys... <op> args...`, or with `EVAL` the script's source.
    fn script_command(&self, eval: &str, script: &str) -> Cmd {
        let mut cmd = redis::cmd(eval);
        cmd.arg(script).arg(6).arg(self.name);
        for suffix in [":owner", ":counter", ":permits", ":limit", ":wake"] {
            cmd.arg(format!("{}{suffix}", self.name));
        }
        cmd.arg(self.op);
        for arg in &self.args {
            cmd.arg(arg);
        }
        cmd
    }

    /// Sends the operation: by the module's command, or by `EVALSHA`, and then once by `EVAL`
    /// (which loads the script) when the server answers `NOSCRIPT`.
    fn query<T: FromRedisValue>(
        &self,
        conn: &mut Connection,
        backend: Backend,
    ) -> redis::RedisResult<T> {
        match backend {
            Backend::Module => self.module_command().query(conn),
            Backend::Scripts => match self.script_command("EVALSHA", script_sha()).query(conn) {
                Err(err) if err.kind() == ErrorKind::NoScriptError => {
                    self.script_command("EVAL", SCRIPT).query(conn)
                }
                result => result,
            },
        }
    }

    /// Sends the operation on a connection of its own, after asking whether the server has
    /// the module.
    fn query_once<T: FromRedisValue>(&self, client: &Client) -> Result<T> {
        let mut conn = client.get_connection()?;
        let backend = Backend::detect(&mut conn)?;
        Ok(self.query(&mut conn, backend)?)
    }
}

/// A semaphore's settings; [`Semaphore::acquire`] takes a permit. Defaults: limit 1, lease 30
/// seconds, no waiting, not fair, one permit, not bound, a new UUID v4 identifier per acquire,
/// no replicas awaited, refreshed automatically.
#[derive(Debug, Clone)]
pub struct Semaphore {
    client: Client,
    name: String,
    limit: u32,
    lease: Duration,
    wait: Option<Duration>,
    fair: bool,
    count: Option<u32>,
    bound: bool,
    id: Option<String>,
    durable: Option<(usize, Duration)>,
    auto_refresh: bool,
    /// Whether the server has the module, asked on the first acquire; shared by the clones.
    backend: Arc<OnceLock<Backend>>,
}

impl Semaphore {
    pub fn new(client: Client, name: impl Into<String>) -> Self {
        Semaphore {
            client,
            name: name.into(),
            limit: 1,
            lease: Duration::from_secs(30),
            wait: None,
            fair: false,
            count: None,
            bound: false,
            id: None,
            durable: None,
            auto_refresh: true,
            backend: Arc::default(),
        }
    }

    /// The number of permits (1 to 4294967295).
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// How long a permit lives unless refreshed (millisecond precision); refreshed every
    /// lease/3 while held.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long to wait inside the server for a permit: `None` or zero do not wait,
    /// `Some(Duration::MAX)` waits without limit.
    pub fn wait(mut self, wait: Option<Duration>) -> Self {
        self.wait = wait;
        self
    }

    /// `SEM.ACQUIREFAIR`: first come, first served, and [`Permit::ticket`] is a fencing token.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Takes `count` permits at once (all or none).
    pub fn count(mut self, count: u32) -> Self {
        self.count = Some(count);
        self
    }

    /// `BOUND`: the permit is given back as soon as its connection closes (the process dies).
    /// It needs the module: without it the acquire fails with [`Error::ModuleRequired`].
    pub fn bound(mut self, bound: bool) -> Self {
        self.bound = bound;
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

    /// The acquire without `WAIT` and `BOUND`, as the module and the script take it.
    fn acquire_op(&self, id: &str) -> Op<'_> {
        let mut op = Op::new(
            if self.fair { "ACQUIREFAIR" } else { "ACQUIRE" },
            &self.name,
        )
        .arg(self.limit)
        .arg(seconds(self.lease))
        .arg("ID")
        .arg(id);
        if let Some(count) = self.count {
            op = op.arg("COUNT").arg(count);
        }
        if self.fair {
            op = op.arg("WITHTICKET");
        }
        op
    }

    fn acquire_command(&self, id: &str) -> Cmd {
        let mut cmd = self.acquire_op(id).module_command();
        match self.wait {
            Some(Duration::MAX) => {
                cmd.arg("WAIT").arg("0");
            }
            Some(wait) if !wait.is_zero() => {
                cmd.arg("WAIT").arg(seconds(wait));
            }
            _ => {}
        }
        if self.bound {
            cmd.arg("BOUND");
        }
        cmd
    }

    /// The ticket of a grant (`None` when not fair), from the reply the module gives;
    /// [`Error::NotAcquired`] for nil.
    fn granted(&self, reply: Value) -> Result<Option<u64>> {
        if reply == Value::Nil {
            return Err(Error::NotAcquired);
        }
        if !self.fair {
            return Ok(None);
        }
        let (_, ticket): (Value, u64) = redis::from_redis_value(&reply)?;
        Ok(Some(ticket))
    }

    /// Without the module: the script's acquire, and while it is refused and the wait is not
    /// over, `BLPOP <name>:wake` for at most the time left, the time until the earliest
    /// holder's deadline and a second, then again. Answers when the granting attempt was sent,
    /// and the ticket.
    fn acquire_by_script(&self, conn: &mut Connection, id: &str) -> Result<(Instant, Option<u64>)> {
        let op = self.acquire_op(id);
        let started = Instant::now();
        // None: no limit.
        let until = match self.wait {
            None => Some(started),
            Some(Duration::MAX) => None,
            Some(wait) => started.checked_add(wait),
        };
        let wake = format!("{}:wake", self.name);
        loop {
            let sent = Instant::now();
            // [the module's reply, retry_ms]: when refused, the milliseconds until the earliest
            // live holder's deadline, or 0.
            let reply: Vec<Value> = op.query(conn, Backend::Scripts)?;
            let mut reply = reply.into_iter();
            let granted = reply.next().unwrap_or(Value::Nil);
            if granted != Value::Nil {
                return Ok((sent, self.granted(granted)?));
            }
            let retry_ms: i64 = match reply.next() {
                Some(retry) => redis::from_redis_value(&retry)?,
                None => 0,
            };
            let left = match until {
                Some(until) => until.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return Err(Error::NotAcquired);
            }
            let mut block = left.min(Duration::from_secs(1));
            if retry_ms > 0 {
                block = block.min(Duration::from_millis(retry_ms as u64));
            }
            redis::cmd("BLPOP")
                .arg(&wake)
                .arg(seconds(block))
                .query::<Value>(conn)?;
        }
    }

    /// Takes a permit: [`Error::NotAcquired`] when none was granted.
    pub fn acquire(&self) -> Result<Permit> {
        let id = self
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let mut conn = self.client.get_connection()?;
        let backend = Backend::cached(&self.backend, &mut conn)?;
        let (sent, ticket) = match backend {
            Backend::Module => {
                let sent = Instant::now();
                let reply: Value = self.acquire_command(&id).query(&mut conn)?;
                (sent, self.granted(reply)?)
            }
            Backend::Scripts if self.bound => return Err(Error::ModuleRequired("BOUND")),
            Backend::Scripts => self.acquire_by_script(&mut conn, &id)?,
        };
        // From here on, an early return drops the permit, which gives it back.
        let mut permit = Permit {
            holding: Holding::new(Shared {
                client: self.client.clone(),
                names: vec![self.name.clone()],
                set: false,
                id,
                lease: self.lease,
                backend,
                conn: Mutex::new(Some(conn)),
                state: Mutex::new(State {
                    confirmed_until: sent + self.lease,
                    lost: false,
                }),
            }),
            ticket,
            count: self.count.unwrap_or(1),
        };
        if let Some((wanted, timeout)) = self.durable {
            let acked: usize = permit.holding.shared.query(
                redis::cmd("WAIT")
                    .arg(wanted)
                    .arg(timeout.as_millis() as u64),
            )?;
            if acked < wanted {
                return Err(Error::NotDurable { acked, wanted });
            }
        }
        // A wait for the grant leaves the lease's start unknown: confirm it now.
        if sent.elapsed() > self.lease / 3 && !permit.refresh()? {
            return Err(Error::Lost);
        }
        if self.auto_refresh {
            permit.holding.start_refreshing();
        }
        Ok(permit)
    }
}

/// Permits of several semaphores for one identifier, taken all or none in one step
/// (`SEM.ACQUIREALL`); [`SemaphoreSet::acquire`] takes them. Defaults as for [`Semaphore`]:
/// lease 30 seconds, no waiting, not fair, not bound, a new UUID v4 identifier per acquire,
/// refreshed automatically. A set needs the module: without it [`SemaphoreSet::acquire`] fails
/// with [`Error::ModuleRequired`].
#[derive(Debug, Clone)]
pub struct SemaphoreSet {
    client: Client,
    semaphores: Vec<(String, u32, u32)>,
    lease: Duration,
    wait: Option<Duration>,
    fair: bool,
    bound: bool,
    id: Option<String>,
    auto_refresh: bool,
    /// Whether the server has the module, asked on the first acquire; shared by the clones.
    backend: Arc<OnceLock<Backend>>,
}

impl SemaphoreSet {
    pub fn new(client: Client) -> Self {
        SemaphoreSet {
            client,
            semaphores: Vec::new(),
            lease: Duration::from_secs(30),
            wait: None,
            fair: false,
            bound: false,
            id: None,
            auto_refresh: true,
            backend: Arc::default(),
        }
    }

    /// Adds `count` of the `limit` permits of `name` to the set (1 to 64 distinct names; in
    /// Redis Cluster they must share a slot).
    pub fn semaphore(mut self, name: impl Into<String>, limit: u32, count: u32) -> Self {
        self.semaphores.push((name.into(), limit, count));
        self
    }

    /// As [`Semaphore::lease`], the same for every semaphore of the set.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long to wait inside the server until the whole set can be granted at once: `None`
    /// or zero do not wait, `Some(Duration::MAX)` waits without limit.
    pub fn wait(mut self, wait: Option<Duration>) -> Self {
        self.wait = wait;
        self
    }

    /// `FAIR`: every semaphore is a fair one, and [`PermitSet::tickets`] has a fencing token
    /// per semaphore.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// `BOUND`: every permit of the set is given back as soon as its connection closes.
    pub fn bound(mut self, bound: bool) -> Self {
        self.bound = bound;
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

    fn acquire_command(&self, id: &str) -> Cmd {
        let mut cmd = redis::cmd("SEM.ACQUIREALL");
        cmd.arg(self.semaphores.len());
        for (name, limit, count) in &self.semaphores {
            cmd.arg(name).arg(limit).arg(count);
        }
        cmd.arg(seconds(self.lease)).arg("ID").arg(id);
        if self.fair {
            cmd.arg("FAIR").arg("WITHTICKET");
        }
        match self.wait {
            Some(Duration::MAX) => {
                cmd.arg("WAIT").arg("0");
            }
            Some(wait) if !wait.is_zero() => {
                cmd.arg("WAIT").arg(seconds(wait));
            }
            _ => {}
        }
        if self.bound {
            cmd.arg("BOUND");
        }
        cmd
    }

    /// Takes every permit of the set: [`Error::NotAcquired`] when any one of them is full
    /// (then none is held); [`Error::ModuleRequired`] when the server has no module.
    pub fn acquire(&self) -> Result<PermitSet> {
        let id = self
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let mut conn = self.client.get_connection()?;
        let backend = Backend::cached(&self.backend, &mut conn)?;
        if backend == Backend::Scripts {
            return Err(Error::ModuleRequired(SETS));
        }
        let sent = Instant::now();
        let tickets = if self.fair {
            let granted: Option<(Value, Vec<u64>)> = self.acquire_command(&id).query(&mut conn)?;
            Some(granted.ok_or(Error::NotAcquired)?.1)
        } else {
            let granted: Option<Value> = self.acquire_command(&id).query(&mut conn)?;
            granted.ok_or(Error::NotAcquired)?;
            None
        };
        // From here on, an early return drops the set, which gives it back.
        let mut permits = PermitSet {
            holding: Holding::new(Shared {
                client: self.client.clone(),
                names: self.semaphores.iter().map(|s| s.0.clone()).collect(),
                set: true,
                id,
                lease: self.lease,
                backend,
                conn: Mutex::new(Some(conn)),
                state: Mutex::new(State {
                    confirmed_until: sent + self.lease,
                    lost: false,
                }),
            }),
            counts: self.semaphores.iter().map(|s| s.2).collect(),
            tickets,
        };
        // A wait for the grant leaves the lease's start unknown: confirm it now.
        if sent.elapsed() > self.lease / 3 && !permits.refresh()? {
            return Err(Error::Lost);
        }
        if self.auto_refresh {
            permits.holding.start_refreshing();
        }
        Ok(permits)
    }
}

/// Waits until the semaphore `name` has no live holder (`SEM.WAITEMPTY`), on a connection of
/// its own (it blocks the connection): `Ok(true)` once it has none (at once if it has none
/// now), `Ok(false)` when `timeout` passes first. `Duration::MAX` waits without limit; zero
/// looks once. It takes nothing. It needs the module: without it, [`Error::ModuleRequired`].
pub fn wait_empty(client: &Client, name: &str, timeout: Duration) -> Result<bool> {
    let timeout = match timeout {
        Duration::MAX => "0".to_string(),
        // The server reads 0 as "no limit": zero looks for at most a millisecond instead.
        timeout if timeout.is_zero() => "0.001".to_string(),
        timeout => seconds(timeout),
    };
    let mut conn = client.get_connection()?;
    if Backend::detect(&mut conn)? == Backend::Scripts {
        return Err(Error::ModuleRequired("SEM.WAITEMPTY"));
    }
    let emptied: i64 = redis::cmd("SEM.WAITEMPTY")
        .arg(name)
        .arg(timeout)
        .query(&mut conn)?;
    Ok(emptied == 1)
}

/// The operator's limit stored for the semaphore `name` (`SEM.LIMIT name`), or `None` when
/// there is none. While one is stored, every acquire of `name` uses it instead of its own.
pub fn stored_limit(client: &Client, name: &str) -> Result<Option<u64>> {
    Op::new("LIMIT", name).query_once(client)
}

/// Stores an operator's limit for the semaphore `name` (`SEM.LIMIT name n`): every acquire of
/// `name` uses it instead of its own until [`clear_limit`]. 0 pauses the semaphore; a lower
/// limit takes no permit from its holders, and a higher one serves the waiters at once.
pub fn set_limit(client: &Client, name: &str, limit: u32) -> Result<()> {
    Op::new("LIMIT", name).arg(limit).query_once(client)
}

/// Removes the operator's limit of the semaphore `name` (`SEM.LIMIT name CLEAR`): acquires use
/// their own limits again. `Ok(true)` if one was stored.
pub fn clear_limit(client: &Client, name: &str) -> Result<bool> {
    let removed: i64 = Op::new("LIMIT", name).arg("CLEAR").query_once(client)?;
    Ok(removed == 1)
}

/// The permits of the semaphore `name` in use (`SEM.GET name`): its live holders, and a
/// holder of several permits ([`Semaphore::count`]) counts for each.
pub fn in_use(client: &Client, name: &str) -> Result<u64> {
    Op::new("GET", name).query_once(client)
}

struct State {
    /// The server's deadline is at least this: the last acquire or refresh confirmed was sent
    /// then, and its lease started when the server ran it, later.
    confirmed_until: Instant,
    lost: bool,
}

/// What the permit (or set) and its refresh thread share.
struct Shared {
    client: Client,
    /// The semaphore of a permit, or those of a set.
    names: Vec<String>,
    /// A set: refreshed and given back with the commands for several semaphores.
    set: bool,
    id: String,
    lease: Duration,
    /// A permit taken by the script is refreshed and given back by it (a set always has the
    /// module).
    backend: Backend,
    /// `None` after a connection error: the next call connects again.
    conn: Mutex<Option<Connection>>,
    state: Mutex<State>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    /// Runs `send` on the holder's connection, connecting first after a connection error.
    fn with_connection<T>(
        &self,
        send: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut conn = lock(&self.conn);
        if conn.is_none() {
            *conn = Some(self.client.get_connection()?);
        }
        let result = send(conn.as_mut().expect("connected above"));
        if let Err(err) = &result {
            if err.is_io_error() || err.is_connection_dropped() || err.is_timeout() {
                *conn = None;
            }
        }
        Ok(result?)
    }

    fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        self.with_connection(|conn| cmd.query(conn))
    }

    /// `SEM.<op> name id args...` (by the script without the module), or for a set
    /// `SEM.<op>ALL numsems names... id args...`.
    fn call(&self, op: &'static str, args: &[String]) -> Result<i64> {
        if self.set {
            let mut cmd = redis::cmd(&format!("SEM.{op}ALL"));
            cmd.arg(self.names.len())
                .arg(&self.names)
                .arg(&self.id)
                .arg(args);
            self.query(&cmd)
        } else {
            let op = Op::new(op, &self.names[0]).arg(&self.id).arg(args);
            self.with_connection(|conn| op.query(conn, self.backend))
        }
    }

    /// How many semaphores a refresh or release answers when every permit is still held.
    fn wanted(&self) -> i64 {
        self.names.len() as i64
    }

    fn refresh(&self) -> Result<bool> {
        let sent = Instant::now();
        let held = self.call("REFRESH", &[seconds(self.lease)])?;
        let mut state = lock(&self.state);
        // Fewer than all: a lease ran out (the server removes it), or another client removed it.
        if held == self.wanted() {
            state.confirmed_until = sent + self.lease;
        } else {
            state.lost = true;
        }
        Ok(held == self.wanted())
    }

    fn is_lost(&self) -> bool {
        let mut state = lock(&self.state);
        if Instant::now() >= state.confirmed_until {
            state.lost = true;
        }
        state.lost
    }
}

/// The refresh thread and the release that a permit and a set share.
struct Holding {
    shared: Arc<Shared>,
    /// Dropping it stops the refresh thread.
    stop: Option<mpsc::Sender<()>>,
    refresher: Option<JoinHandle<()>>,
    released: bool,
}

impl Holding {
    fn new(shared: Shared) -> Self {
        Holding {
            shared: Arc::new(shared),
            stop: None,
            refresher: None,
            released: false,
        }
    }

    fn give_back(&mut self) -> Result<bool> {
        self.released = true;
        let lost_before = self.shared.is_lost();
        self.stop.take(); // the refresh thread ends at its next wake-up...
        if let Some(refresher) = self.refresher.take() {
            let _ = refresher.join(); // ...which is now, after a refresh under way
        }
        let shared = &self.shared;
        let released = shared.call("RELEASE", &[])?;
        Ok(released == shared.wanted() && !lost_before)
    }

    fn start_refreshing(&mut self) {
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = Arc::clone(&self.shared);
        let interval = shared.lease / 3;
        let refresher = thread::Builder::new()
            .name(format!("redsem-refresh-{}", shared.id))
            .spawn(move || loop {
                match stopped.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return, // stopped
                }
                match shared.refresh() {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(_) if shared.is_lost() => return,
                    Err(_) => {} // unreachable server: retry until the lease is up
                }
            })
            .expect("cannot start the refresh thread");
        self.stop = Some(stop);
        self.refresher = Some(refresher);
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.give_back();
        }
    }
}

/// A granted permit. It refreshes its lease from a background thread every lease/3 (unless
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
        &self.holding.shared.id
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.holding.shared.names[0]
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
        self.holding.shared.is_lost()
    }

    /// `Err(Error::Lost)` once the permit is lost: call it in long work to stop early.
    pub fn check(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::Lost);
        }
        Ok(())
    }

    /// Moves the deadline to now + lease; `Ok(false)` (and lost) if the permit had run out.
    pub fn refresh(&self) -> Result<bool> {
        self.holding.shared.refresh()
    }

    /// Gives back `count` of the permits held and keeps the rest (its deadline and ticket);
    /// `Ok(false)` (and lost) if the permit had run out.
    pub fn release_some(&mut self, count: u32) -> Result<bool> {
        if count == 0 || count >= self.count {
            return Err(Error::BadCount { held: self.count });
        }
        let shared = &self.holding.shared;
        let released = shared.call("RELEASE", &["COUNT".to_string(), count.to_string()])?;
        if released == 1 {
            self.count -= count;
        } else {
            lock(&shared.state).lost = true;
        }
        Ok(released == 1)
    }

    /// Gives the permit back: `Ok(true)` if it was held throughout, `Ok(false)` if it was lost
    /// (the work it guarded may have overlapped another holder's).
    pub fn release(mut self) -> Result<bool> {
        self.holding.give_back()
    }
}

/// Permits of several semaphores taken at once ([`SemaphoreSet::acquire`]). They are refreshed
/// together (`SEM.REFRESHALL`) from a background thread every lease/3, the set is lost as soon
/// as any one of them is, and they are given back together (`SEM.RELEASEALL`) by
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
        &self.holding.shared.id
    }

    /// The semaphores' names, in the order given.
    pub fn names(&self) -> &[String] {
        &self.holding.shared.names
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
        self.holding.shared.is_lost()
    }

    /// `Err(Error::Lost)` once a permit of the set is lost: call it in long work to stop early.
    pub fn check(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::Lost);
        }
        Ok(())
    }

    /// Moves every deadline to now + lease; `Ok(false)` (and lost) if a permit had run out.
    pub fn refresh(&self) -> Result<bool> {
        self.holding.shared.refresh()
    }

    /// Gives every permit back: `Ok(true)` if all were held throughout, `Ok(false)` if one was
    /// lost.
    pub fn release(mut self) -> Result<bool> {
        self.holding.give_back()
    }
}

#[cfg(test)]
mod tests {
    use super::seconds;
    use std::time::Duration;

    #[test]
    fn seconds_have_at_most_three_decimals() {
        assert_eq!(seconds(Duration::from_secs(30)), "30.000");
        assert_eq!(seconds(Duration::from_millis(250)), "0.250");
        assert_eq!(seconds(Duration::from_micros(1_499)), "0.001");
        assert_eq!(seconds(Duration::from_micros(1_500)), "0.002");
        assert_eq!(seconds(Duration::from_nanos(1)), "0.001");
    }
}
