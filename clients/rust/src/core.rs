//! What the sync and async APIs share: the errors, the commands (short form, long form and the
//! script's), the hash-tag rules of Redis Cluster, the acquire's steps, how a failed call is
//! retried, and a holder's state. No I/O here: the transports (`sync`, `aio`) send what these
//! routines build and feed the answers back.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, ToRedisArgs, Value};

/// What can go wrong taking or holding a permit.
#[derive(Debug)]
pub enum Error {
    /// No permit was granted: the semaphore was full (for the whole wait, when waiting).
    NotAcquired,
    /// Fewer replicas than asked acknowledged the grant in time; the permit was given back.
    NotDurable { acked: usize, wanted: usize },
    /// [`crate::Permit::release_some`] was asked for none, or for every permit held (use
    /// `release` for all); nothing was sent.
    BadCount { held: u32 },
    /// The permit ran out before it was given back (its lease ended, another client removed
    /// it, or a failover lost the grant): another holder may have held it meanwhile.
    Lost,
    /// An error of the server or of the connection.
    Redis(RedisError),
    /// What this names (`BOUND`, a semaphore set, `SEM.WAITEMPTY`) needs the module, and the
    /// server has none: nothing was sent but the question whether it has the module.
    ModuleRequired(&'static str),
    /// In Redis Cluster: a name without a hash tag, or a set whose names are in different
    /// slots. Nothing was sent.
    BadName(String),
    /// In Redis Cluster: the node serving the semaphore's slot did not answer (the slot was
    /// moving, its owner failing over or unreachable) until the retry budget ran out.
    Unavailable { budget: Duration, last: RedisError },
    /// A setting no server takes (`name`: which one, e.g. `lease`); nothing was sent.
    BadArgument {
        name: &'static str,
        problem: &'static str,
    },
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
            Error::BadName(text) => f.write_str(text),
            Error::BadArgument { name, problem } => write!(f, "{name} {problem}"),
            Error::Unavailable { budget, last } => write!(
                f,
                "the node serving the semaphore's slot gave no answer within the retry budget \
                 ({:.1} s): {last}",
                budget.as_secs_f64()
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(err) | Error::Unavailable { last: err, .. } => Some(err),
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
pub(crate) fn seconds(duration: Duration) -> String {
    let mut ms = (duration.as_nanos() + 500_000) / 1_000_000;
    if ms == 0 && !duration.is_zero() {
        ms = 1;
    }
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// The script that runs the operations where the server has no module: the repository's
/// `clients/scripts/redsem.lua` (`src/redsem.lua` is a symbolic link to it, which `cargo
/// package` packages as the file itself). As it is (`#!lua flags=allow-oom`) it runs when
/// memory is full: every call but a first attempt to acquire.
const SCRIPT: &str = include_str!("redsem.lua");

/// The first line of [`SCRIPT`]; the text for first attempts replaces it by `#!lua`.
const OOM_LINE: &str = "#!lua flags=allow-oom";

/// The script's two texts: `(allow-oom, first attempts)`, whose first attempts the server
/// refuses at `maxmemory` with its own OOM error, as `SEM.ACQUIRE`.
fn texts() -> &'static (String, String) {
    static TEXTS: OnceLock<(String, String)> = OnceLock::new();
    TEXTS.get_or_init(|| {
        let rest = SCRIPT
            .strip_prefix(OOM_LINE)
            .expect("redsem.lua begins with #!lua flags=allow-oom");
        (SCRIPT.to_string(), format!("#!lua{rest}"))
    })
}

/// A text of the script and its SHA1, as `EVALSHA` names it.
fn script(first_attempt: bool) -> (&'static str, &'static str) {
    static SHAS: OnceLock<(String, String)> = OnceLock::new();
    let (oom, acq) = texts();
    let shas = SHAS.get_or_init(|| {
        let sha = |text: &str| redis::Script::new(text).get_hash().to_string();
        (sha(oom), sha(acq))
    });
    match first_attempt {
        true => (acq, &shas.1),
        false => (oom, &shas.0),
    }
}

/// What [`Error::ModuleRequired`] names for a semaphore set.
pub(crate) const SETS: &str = "a semaphore set (SEM.ACQUIREALL)";

/// The keys a semaphore's name stands for, after the name itself, in the long form's order.
const KEY_SUFFIXES: [&str; 4] = [":owner", ":counter", ":permits", ":limit"];

/// How the operations reach a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// The module's commands.
    Module,
    /// The script, over the same keys.
    Scripts,
}

impl Backend {
    /// The question whether a server has the module: `COMMAND INFO SEM.ACQUIRE` answers
    /// `[nil]` without it.
    pub(crate) fn question() -> Cmd {
        let mut cmd = redis::cmd("COMMAND");
        cmd.arg("INFO").arg("SEM.ACQUIRE");
        cmd
    }

    pub(crate) fn from_answer(info: Vec<Value>) -> Backend {
        match info.first() {
            None | Some(Value::Nil) => Backend::Scripts,
            Some(_) => Backend::Module,
        }
    }
}

/// How long "no module" is believed: the module may be loaded at any time, and a client on the
/// script asks again at its next call once the answer is this old.
pub(crate) const RECHECK: Duration = Duration::from_secs(10);

/// A server's answer whether it has the module, and when it was given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Known {
    backend: Backend,
    at: Instant,
}

impl Known {
    pub(crate) fn new(backend: Backend) -> Self {
        Known {
            backend,
            at: Instant::now(),
        }
    }

    /// The backend, unless it is the script and the answer is old enough to ask again (the
    /// module is never unloaded while a semaphore uses it).
    pub(crate) fn current(&self) -> Option<Backend> {
        match self.backend {
            Backend::Scripts if self.at.elapsed() >= RECHECK => None,
            backend => Some(backend),
        }
    }
}

/// One server's answer, shared by a semaphore's clones.
pub(crate) type KnownCell = std::sync::Arc<Mutex<Option<Known>>>;

/// Idle connections to each node (`""` on one server), taken for a call and given back after:
/// waiting acquires and permits reuse them rather than open one each.
pub(crate) struct Pool<C> {
    idle: Mutex<std::collections::HashMap<String, Vec<C>>>,
    /// The nodes a connection is being made to, apart (the sync refresher's).
    connecting: Mutex<std::collections::HashSet<String>>,
}

/// The idle connections a pool keeps per node; more are closed when given back.
const POOL_IDLE: usize = 4;

impl<C> Default for Pool<C> {
    fn default() -> Self {
        Pool {
            idle: Mutex::new(std::collections::HashMap::new()),
            connecting: Mutex::new(std::collections::HashSet::new()),
        }
    }
}

impl<C> fmt::Debug for Pool<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

impl<C> Pool<C> {
    pub(crate) fn take(&self, addr: &str) -> Option<C> {
        lock(&self.idle).get_mut(addr)?.pop()
    }

    /// Whether a connection to `addr` may be made apart now: none is being made.
    pub(crate) fn begin_connect(&self, addr: &str) -> bool {
        lock(&self.connecting).insert(addr.to_string())
    }

    pub(crate) fn end_connect(&self, addr: &str) {
        lock(&self.connecting).remove(addr);
    }

    pub(crate) fn give(&self, addr: &str, conn: C) {
        let mut idle = lock(&self.idle);
        let conns = idle.entry(addr.to_string()).or_default();
        if conns.len() < POOL_IDLE {
            conns.push(conn);
        }
    }
}

/// A server's error as it would have answered it (`E<error>` of the script's line).
pub(crate) fn server_error(text: &str) -> RedisError {
    match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).and_then(Value::extract_error)
    {
        Err(err) => err,
        Ok(_) => RedisError::from((ErrorKind::ResponseError, "", text.to_string())),
    }
}

/// What a command is sent as: `cmd`, and when the server answers `NOSCRIPT`, the same with
/// `EVAL` and the script's source (`eval`), which loads it.
pub(crate) struct Request {
    pub(crate) cmd: Cmd,
    /// The source of the script `cmd` runs by `EVALSHA`.
    eval: Option<&'static str>,
}

impl From<Cmd> for Request {
    fn from(cmd: Cmd) -> Self {
        Request { cmd, eval: None }
    }
}

impl Request {
    /// What to send after `NOSCRIPT`: `EVAL source` and the arguments of `EVALSHA sha`. Made
    /// only then: the source is long, and copying it into every call costs more than the rest
    /// of the package's work.
    pub(crate) fn eval(&self) -> Cmd {
        let Some(text) = self.eval else {
            return self.cmd.clone();
        };
        let mut eval = redis::cmd("EVAL");
        eval.arg(text);
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(arg) = arg {
                eval.arg(arg);
            }
        }
        eval
    }
}

/// One operation on a semaphore, or on the semaphores of a set: the module's `SEM.<op>`, in
/// the short form (standalone) or the long form (Redis Cluster), or the script's `<op>`.
#[derive(Clone)]
pub(crate) struct Op {
    op: &'static str,
    /// One name, or a set's names.
    names: Vec<String>,
    set: bool,
    /// After the name (one semaphore), or every argument (a set: `numsems names...`).
    args: Vec<Vec<u8>>,
    /// Arguments only the module takes (`WAIT`, `BOUND`): left out for the script.
    module_args: Vec<Vec<u8>>,
    /// Arguments only the script takes (`LINE`).
    script_args: Vec<Vec<u8>>,
    /// What [`Error::ModuleRequired`] names when the server has no module.
    needs_module: Option<&'static str>,
    /// A first attempt to acquire: the script's text that memory full refuses.
    first_attempt: bool,
    /// The script's own operation (`TICK`, `LEAVE`): the script even with the module, which
    /// it then calls itself.
    script_only: bool,
}

impl Op {
    pub(crate) fn new(op: &'static str, name: &str) -> Self {
        Op {
            op,
            names: vec![name.to_string()],
            set: false,
            args: Vec::new(),
            module_args: Vec::new(),
            script_args: Vec::new(),
            needs_module: None,
            first_attempt: false,
            script_only: false,
        }
    }

    /// `SEM.<op>` over several semaphores (`ACQUIREALL`, `REFRESHALL`, `RELEASEALL`): the
    /// arguments come whole from [`Op::arg`].
    pub(crate) fn set(op: &'static str, names: &[String]) -> Self {
        Op {
            op,
            names: names.to_vec(),
            set: true,
            args: Vec::new(),
            module_args: Vec::new(),
            script_args: Vec::new(),
            needs_module: Some(SETS),
            first_attempt: false,
            script_only: false,
        }
    }

    /// A holder's call (`REFRESH`, `RELEASE`): `SEM.<op> name id args...`, or for a set
    /// `SEM.<op>ALL numsems names... id args...`.
    pub(crate) fn holder(op: &'static str, names: &[String], set: bool, id: &str) -> Self {
        if set {
            let op = match op {
                "REFRESH" => "REFRESHALL",
                _ => "RELEASEALL",
            };
            Op::set(op, names).arg(names.len()).arg(names).arg(id)
        } else {
            Op::new(op, &names[0]).arg(id)
        }
    }

    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    pub(crate) fn module_arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.module_args);
        self
    }

    pub(crate) fn script_arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.script_args);
        self
    }

    /// Refused without the module, naming `what`.
    pub(crate) fn needs_module(mut self, what: &'static str) -> Self {
        self.needs_module = Some(what);
        self
    }

    /// The first name: the one whose slot the call goes to.
    pub(crate) fn name(&self) -> &str {
        &self.names[0]
    }

    /// The command for `backend`; `long`: name every key (Redis Cluster).
    pub(crate) fn request(&self, backend: Backend, long: bool) -> Result<Request> {
        let (text, sha) = script(self.first_attempt);
        match backend {
            Backend::Module if !self.script_only => Ok(self.module_command(long).into()),
            _ => match self.needs_module {
                Some(what) => Err(Error::ModuleRequired(what)),
                None => Ok(Request {
                    cmd: self.script_command(sha),
                    eval: Some(text),
                }),
            },
        }
    }

    fn module_command(&self, long: bool) -> Cmd {
        let mut cmd = redis::cmd(&format!("SEM.{}", self.op));
        if !self.set {
            cmd.arg(self.name());
            if long {
                for suffix in KEY_SUFFIXES {
                    cmd.arg(format!("{}{suffix}", self.name()));
                }
            }
        }
        cmd.arg(&self.args).arg(&self.module_args);
        if self.set && long {
            for name in &self.names {
                for suffix in KEY_SUFFIXES {
                    cmd.arg(format!("{name}{suffix}"));
                }
            }
        }
        cmd
    }

    /// `EVALSHA sha 6 keys... <op> args...`.
    fn script_command(&self, sha: &str) -> Cmd {
        let name = self.name();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha).arg(6).arg(name);
        for suffix in KEY_SUFFIXES.iter().chain([":wake"].iter()) {
            cmd.arg(format!("{name}{suffix}"));
        }
        cmd.arg(self.op).arg(&self.args).arg(&self.script_args);
        cmd
    }
}

/// The hash tag of `name` as Redis reads it: the bytes between the first `{` and the first `}`
/// after it, when there are any.
fn hash_tag(name: &str) -> Option<&str> {
    let open = name.find('{')?;
    let len = name[open + 1..].find('}')?;
    (len > 0).then(|| &name[open + 1..open + 1 + len])
}

/// The slot of a key (the redis crate's CRC16).
pub(crate) fn slot(key: &str) -> u16 {
    redis::cluster_routing::get_slot(key.as_bytes())
}

/// In Redis Cluster every key of a semaphore must fall in one slot: `name` needs a hash tag.
pub(crate) fn check_name(name: &str) -> Result<u16> {
    if hash_tag(name).is_none() {
        return Err(Error::BadName(format!(
            "in Redis Cluster a semaphore's name needs a hash tag, e.g. \"{{{name}}}\" or \
             \"app:{{{name}}}\": the keys of \"{name}\" ({name}, {name}:owner, {name}:counter, \
             {name}:permits, {name}:limit) would fall in different slots"
        )));
    }
    Ok(slot(name))
}

/// In Redis Cluster the semaphores of a set must share a slot (and each needs a hash tag).
pub(crate) fn check_set(names: &[String]) -> Result<u16> {
    let first = names.first().map(String::as_str).unwrap_or_default();
    for name in names {
        if slot(name) != slot(first) {
            return Err(Error::BadName(format!(
                "in Redis Cluster the semaphores of a set must share a slot: give their names \
                 one hash tag, e.g. \"{{app}}{first}\" and \"{{app}}{name}\" (\"{first}\" is in \
                 slot {}, \"{name}\" in slot {})",
                slot(first),
                slot(name)
            )));
        }
    }
    for name in names {
        check_name(name)?;
    }
    Ok(slot(first))
}

/// The slot of `names` (a semaphore, or a set's), checked before anything is sent, in Redis
/// Cluster; `None` on one server.
pub(crate) fn slot_of(names: &[String], cluster: bool) -> Result<Option<u16>> {
    match (cluster, names) {
        (false, _) => Ok(None),
        (true, [name]) => check_name(name).map(Some),
        (true, names) => check_set(names).map(Some),
    }
}

/// What to do after a call failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// `MOVED`: the slot is served by this node now; send the call there.
    Moved(String),
    /// `ASK`: send `ASKING` and the call to this node, once.
    Ask(String),
    /// The slot is moving, or its owner failing over or unreachable: pause, find the owner
    /// again, send the call again.
    Pause,
    /// An answer: give it to the caller.
    Fail,
}

/// What to do after `err`; `cluster`: whether the call went to a node of Redis Cluster (a
/// standalone server's errors are the caller's at once, as before).
pub(crate) fn next_step(err: &RedisError, cluster: bool) -> Next {
    if !cluster {
        return Next::Fail;
    }
    match err.kind() {
        ErrorKind::Moved => match err.redirect_node() {
            Some((addr, _)) => Next::Moved(addr.to_string()),
            None => Next::Pause,
        },
        ErrorKind::Ask => match err.redirect_node() {
            Some((addr, _)) => Next::Ask(addr.to_string()),
            None => Next::Pause,
        },
        ErrorKind::TryAgain
        | ErrorKind::ClusterDown
        | ErrorKind::MasterDown
        | ErrorKind::BusyLoadingError
        | ErrorKind::ReadOnly
        | ErrorKind::IoError
        | ErrorKind::ClusterConnectionNotFound => Next::Pause,
        _ if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout() =>
        {
            Next::Pause
        }
        // A blocked call whose node turned into a replica (a failover, the old primary back).
        _ if matches!(err.code(), Some("UNBLOCKED" | "LOADING" | "READONLY")) => Next::Pause,
        _ => Next::Fail,
    }
}

/// Whether the connection `err` came from is of no more use.
pub(crate) fn connection_broken(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_timeout()
}

/// The retries of one call: pauses from 50 ms doubling to 1 s, and an error once the budget
/// has passed since the first failure (a wait that went well before it does not count).
pub(crate) struct Retries {
    first_failure: Option<Instant>,
    budget: Duration,
    pause: Duration,
    redirects: u32,
}

impl Retries {
    pub(crate) fn new(budget: Duration) -> Self {
        Retries {
            first_failure: None,
            budget,
            pause: Duration::from_millis(50),
            redirects: 0,
        }
    }

    /// Time spent failing so far.
    fn failing(&mut self) -> Duration {
        self.first_failure
            .get_or_insert_with(Instant::now)
            .elapsed()
    }

    /// The pause before the next try, or [`Error::Unavailable`] once the budget has passed.
    pub(crate) fn pause(&mut self, err: RedisError) -> Result<Duration> {
        let failing = self.failing();
        if failing >= self.budget {
            return Err(Error::Unavailable {
                budget: self.budget,
                last: err,
            });
        }
        // The last pause ends with the budget: one more try then.
        let pause = self.pause.min(self.budget - failing);
        self.pause = (self.pause * 2).min(Duration::from_secs(1));
        Ok(pause)
    }

    /// A redirection: followed at once, unless the nodes keep redirecting (their views of the
    /// slot differ for a moment): then a pause.
    pub(crate) fn redirect(&mut self, err: RedisError) -> Result<Duration> {
        self.redirects += 1;
        if self.redirects.is_multiple_of(8) {
            return self.pause(err);
        }
        if self.failing() > self.budget {
            return Err(Error::Unavailable {
                budget: self.budget,
                last: err,
            });
        }
        Ok(Duration::ZERO)
    }
}

/// The default retry budget of a call in Redis Cluster.
pub(crate) const RETRY_BUDGET: Duration = Duration::from_secs(30);

/// The end of a wait: `None` when it has no limit.
pub(crate) fn deadline(wait: Option<Duration>) -> Option<Instant> {
    let now = Instant::now();
    match wait {
        None => Some(now),
        Some(Duration::MAX) => None,
        Some(wait) => now.checked_add(wait),
    }
}

/// What is left of a wait that ends at `until`.
pub(crate) fn left(until: Option<Instant>) -> Duration {
    match until {
        Some(until) => until.saturating_duration_since(Instant::now()),
        None => Duration::MAX,
    }
}

/// The module's `WAIT <seconds>` for what is left of a wait (`0`: without limit).
fn wait_args(left: Duration) -> Vec<String> {
    match left {
        Duration::MAX => vec!["WAIT".into(), "0".into()],
        left if left.is_zero() => Vec::new(),
        left => vec!["WAIT".into(), seconds(left)],
    }
}

/// A semaphore's acquire, as the sync and async APIs describe it.
#[derive(Debug, Clone)]
pub(crate) struct AcquireSpec {
    pub(crate) name: String,
    pub(crate) limit: u32,
    pub(crate) lease: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) fair: bool,
    pub(crate) count: Option<u32>,
    pub(crate) bound: bool,
}

impl AcquireSpec {
    pub(crate) fn new(name: String) -> Self {
        AcquireSpec {
            name,
            limit: 1,
            lease: Duration::from_secs(30),
            wait: None,
            fair: false,
            count: None,
            bound: false,
        }
    }

    /// Refuses what is no lease before anything is sent.
    pub(crate) fn check(&self) -> Result<()> {
        check_lease(self.lease)
    }

    /// The acquire with what is left of the wait: the module waits in the server; the script
    /// answers at once, and `line` keeps the caller's place in its line.
    fn op(&self, id: &str, left: Duration, line: bool, first_attempt: bool) -> Op {
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
        op = op.module_arg(wait_args(left));
        if line {
            op = op.script_arg("LINE");
        }
        if self.bound {
            op = op.module_arg("BOUND").needs_module("BOUND");
        }
        op.first_attempt = first_attempt;
        op
    }
}

/// A lease the server could not take, refused before anything is sent (`Duration` has no NaN
/// nor negative values; `Duration::MAX` stands for "no end" elsewhere in the API).
pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    let problem = match lease {
        lease if lease.is_zero() => "must be more than zero",
        Duration::MAX => "must be finite (Duration::MAX is no lease)",
        _ => return Ok(()),
    };
    Err(Error::BadArgument {
        name: "lease",
        problem,
    })
}

/// The longest `BLPOP` of a waiter of the script: it tries again at least this often, which
/// keeps its place in line (held 6 s from each attempt).
const NUDGE: Duration = Duration::from_millis(2500);

/// A `TICK` goes this long after the earliest holder's deadline, so that the server's clock
/// has passed it too.
const TICK_LATE: Duration = Duration::from_millis(2);

/// When to send the next `TICK` after one answered `retry_ms` (0: no holder is live).
pub(crate) fn next_tick(retry_ms: i64) -> Option<Duration> {
    (retry_ms > 0).then(|| Duration::from_millis(retry_ms as u64) + TICK_LATE)
}

/// What a transport does next for an acquire.
pub(crate) enum Action {
    /// Send this (an attempt, or `LEAVE`) to the semaphore's node, then [`Wait::answered`].
    Send(Op),
    /// `BLPOP` the waiter's own list on a connection of the pool, then [`Wait::popped`].
    /// With `tick`: while the `BLPOP` is pending, send [`Wait::tick_op`] on another connection
    /// that long from now (a lease ends then, and the server's 10 Hz clock would see it late),
    /// and again after [`next_tick`] of its answer.
    Block { blpop: Cmd, tick: Option<Duration> },
    /// Granted from a re-attempt: a message may still be on the waiter's list (a grant it met
    /// on its way), which a later acquire with the same identifier must not read. Send this
    /// `DEL`, then [`Wait::cleared`].
    Clear(Cmd),
    /// Granted: the ticket of a fair grant.
    Granted(Option<u64>),
}

/// What the last [`Action::Send`] was.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sent {
    Attempt,
    Leave,
}

/// An acquire, waiting or not, as the steps of the module's `WAIT` or the script's line
/// (clients/scripts/redsem.lua): attempts, the waiter's list, `TICK` and `LEAVE`.
pub(crate) struct Wait<'a> {
    spec: &'a AcquireSpec,
    id: &'a str,
    until: Option<Instant>,
    attempts: u32,
    sent: Sent,
    /// When the last attempt was sent: the lease of its grant started later.
    pub(crate) attempted: Instant,
    /// The last attempt asked for a place in the script's line (`LINE`).
    line_sent: bool,
    /// In the script's line: a `LINE` attempt was refused, and no grant or `LEAVE` came since.
    in_line: bool,
    /// An attempt was sent and its answer not seen yet.
    unanswered: bool,
    /// The module is loaded (`ahead == -1`, `M`): the transport switches to it.
    module: bool,
    ticket: Option<u64>,
}

impl<'a> Wait<'a> {
    pub(crate) fn new(spec: &'a AcquireSpec, id: &'a str) -> Self {
        Wait {
            spec,
            id,
            until: deadline(spec.wait),
            attempts: 0,
            sent: Sent::Attempt,
            attempted: Instant::now(),
            line_sent: false,
            in_line: false,
            unanswered: false,
            module: false,
            ticket: None,
        }
    }

    /// The first action: the first attempt.
    pub(crate) fn start(&mut self) -> Action {
        self.attempt()
    }

    fn attempt(&mut self) -> Action {
        let left = left(self.until);
        self.line_sent = !left.is_zero();
        let op = self
            .spec
            .op(self.id, left, self.line_sent, self.attempts == 0);
        self.attempts += 1;
        self.unanswered = true;
        self.sent = Sent::Attempt;
        self.attempted = Instant::now();
        Action::Send(op)
    }

    /// The last [`Action::Send`] as sent (again, after a failure in Redis Cluster: an
    /// `UNBLOCKED` wait, a failover): an attempt waits what is left of the wait, not what was
    /// left when it was first sent.
    pub(crate) fn as_sent(&self, op: &Op) -> Op {
        match self.sent {
            Sent::Attempt => {
                self.spec
                    .op(self.id, left(self.until), self.line_sent, op.first_attempt)
            }
            Sent::Leave => op.clone(),
        }
    }

    /// What the last [`Action::Send`] got, passed on: a failure the server answered (an error
    /// reply) tells that nothing was granted; one of the connection leaves it unknown.
    pub(crate) fn sent(&mut self, answer: Result<(Value, Backend)>) -> Result<(Value, Backend)> {
        match &answer {
            Err(Error::Redis(err)) if connection_broken(err) => {}
            Err(Error::Unavailable { .. }) => {}
            _ => self.unanswered = false,
        }
        answer
    }

    /// Whether the module turned out loaded since the last call (asked once).
    pub(crate) fn take_module(&mut self) -> bool {
        std::mem::take(&mut self.module)
    }

    /// `LEAVE` for a waiter that gives up (an error, a cancelled wait) while it may be in
    /// line, and whether the last attempt's answer is unknown (then it may hold a permit:
    /// released too, as any grant `LEAVE` answers).
    pub(crate) fn abandon(&mut self) -> Option<(Op, bool)> {
        let unknown = std::mem::take(&mut self.unanswered) && self.line_sent;
        (std::mem::take(&mut self.in_line) || unknown).then(|| (self.leave_op(), unknown))
    }

    fn leave_op(&self) -> Op {
        let mut op = Op::new("LEAVE", &self.spec.name).arg(self.id);
        op.script_only = true;
        op
    }

    /// The script's `TICK` on this semaphore.
    pub(crate) fn tick_op(&self) -> Op {
        let mut op = Op::new("TICK", &self.spec.name);
        op.script_only = true;
        op
    }

    /// The release of a permit granted to a waiter that gave up (`LEAVE` answered its grant).
    pub(crate) fn release_op(&self) -> Op {
        let mut op = Op::new("RELEASE", &self.spec.name).arg(self.id);
        op.script_only = true;
        op
    }

    fn granted(&mut self, ticket: Option<u64>) -> Action {
        self.in_line = false;
        Action::Granted(ticket)
    }

    /// The answer to the last [`Action::Send`], by `backend`.
    pub(crate) fn answered(&mut self, backend: Backend, reply: Value) -> Result<Action> {
        self.unanswered = false;
        if self.sent == Sent::Leave {
            self.in_line = false;
            let message: Option<String> = redis::from_redis_value(&reply)?;
            return match message {
                Some(message) if message.starts_with(['G', 'E']) => self.message(&message),
                _ => Err(Error::NotAcquired),
            };
        }
        let (granted, retry_ms, ahead) = match backend {
            Backend::Module => (reply, 0, -1),
            // [the module's reply, retry_ms, ahead]; ahead -1: the module is loaded, and the
            // reply is its own.
            Backend::Scripts => {
                let mut reply = Vec::<Value>::from_redis_value(&reply)?.into_iter();
                let granted = reply.next().unwrap_or(Value::Nil);
                let mut number = || -> Result<i64> {
                    Ok(reply.next().map_or(Ok(0), |n| i64::from_redis_value(&n))?)
                };
                let retry_ms = number()?;
                (granted, retry_ms, number()?)
            }
        };
        if backend == Backend::Scripts && ahead < 0 {
            self.module = true;
            self.in_line = false;
        }
        if granted != Value::Nil {
            let ticket = ticket(self.spec.fair, granted)?;
            if self.in_line {
                self.ticket = ticket;
                self.in_line = false;
                return Ok(Action::Clear(self.list_del()));
            }
            return Ok(self.granted(ticket));
        }
        let left = left(self.until);
        if ahead < 0 {
            // The module waited (or answered at once, out of time): nil is the end; else the
            // script found the module loaded, and the next attempt waits with it.
            return match backend == Backend::Module || left.is_zero() {
                true => Err(Error::NotAcquired),
                false => Ok(self.attempt()),
            };
        }
        self.in_line |= self.line_sent;
        if left.is_zero() {
            if !self.in_line {
                return Err(Error::NotAcquired);
            }
            // Out of time in line: leave it, and take a grant made meanwhile.
            self.sent = Sent::Leave;
            return Ok(Action::Send(self.leave_op()));
        }
        Ok(self.block(left, retry_ms, ahead == 0))
    }

    /// `BLPOP` on the waiter's list for at most [`NUDGE`] of the `left` of its wait; when
    /// `first` in line with a lease ending within that (`retry_ms`), `TICK` just after its end.
    fn block(&self, left: Duration, retry_ms: i64, first: bool) -> Action {
        let block = left.min(NUDGE);
        let retry = Duration::from_millis(retry_ms.max(0) as u64);
        let tick = (first && !retry.is_zero() && retry < block).then(|| retry + TICK_LATE);
        let mut blpop = redis::cmd("BLPOP");
        blpop.arg(self.list()).arg(seconds(block));
        Action::Block { blpop, tick }
    }

    /// The waiter's own list: `<name>:wake:<id>`.
    fn list(&self) -> String {
        format!("{}:wake:{}", self.spec.name, self.id)
    }

    fn list_del(&self) -> Cmd {
        let mut del = redis::cmd("DEL");
        del.arg(self.list());
        del
    }

    /// After [`Action::Clear`].
    pub(crate) fn cleared(&mut self) -> Action {
        let ticket = self.ticket;
        self.granted(ticket)
    }

    /// What `BLPOP` took from the waiter's list (nil: its time ran out).
    pub(crate) fn popped(&mut self, popped: Option<(String, String)>) -> Result<Action> {
        match popped {
            Some((_, message)) => self.message(&message),
            None => Ok(self.attempt()),
        }
    }

    /// A message of the script's line: `G[ticket]` granted, `E<error>` its grant failed,
    /// `H<ms>` first in line with a lease ending in `ms` (`TICK` then; `H` alone: try again
    /// now, which tells when), `M` the module is loaded.
    fn message(&mut self, message: &str) -> Result<Action> {
        let kind = message.chars().next().unwrap_or(' ');
        match (kind, &message[kind.len_utf8().min(message.len())..]) {
            ('G', ticket) => {
                let ticket = match ticket {
                    "" => None,
                    ticket => Some(ticket.parse().map_err(|_| {
                        RedisError::from((
                            ErrorKind::TypeError,
                            "a grant's ticket is no number",
                            ticket.to_string(),
                        ))
                    })?),
                };
                Ok(self.granted(ticket.filter(|_| self.spec.fair)))
            }
            ('E', error) => {
                self.in_line = false;
                Err(server_error(error).into())
            }
            ('M', _) => {
                self.module = true;
                self.in_line = false;
                Ok(self.attempt())
            }
            // Block again without an attempt while the last one keeps the place (held 6 s from
            // it: the next attempt comes within NUDGE of this block).
            ('H', ms) if self.attempted.elapsed() < NUDGE && !left(self.until).is_zero() => {
                match ms.parse::<i64>() {
                    Ok(ms) if ms > 0 => Ok(self.block(left(self.until), ms, true)),
                    _ => Ok(self.attempt()),
                }
            }
            _ => Ok(self.attempt()),
        }
    }
}

/// The ticket of a grant (`None` when not fair), from the module's reply.
fn ticket(fair: bool, granted: Value) -> Result<Option<u64>> {
    if !fair {
        return Ok(None);
    }
    let (_, ticket): (Value, u64) = redis::from_redis_value(&granted)?;
    Ok(Some(ticket))
}

/// A set's acquire, as the sync and async APIs describe it.
#[derive(Debug, Clone)]
pub(crate) struct SetSpec {
    pub(crate) semaphores: Vec<(String, u32, u32)>,
    pub(crate) lease: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) fair: bool,
    pub(crate) bound: bool,
}

impl SetSpec {
    pub(crate) fn new() -> Self {
        SetSpec {
            semaphores: Vec::new(),
            lease: Duration::from_secs(30),
            wait: None,
            fair: false,
            bound: false,
        }
    }

    /// As [`AcquireSpec::check`].
    pub(crate) fn check(&self) -> Result<()> {
        check_lease(self.lease)
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.semaphores.iter().map(|s| s.0.clone()).collect()
    }

    pub(crate) fn op(&self, id: &str, left: Duration) -> Op {
        let mut op = Op::set("ACQUIREALL", &self.names()).arg(self.semaphores.len());
        for (name, limit, count) in &self.semaphores {
            op = op.arg(name).arg(limit).arg(count);
        }
        op = op.arg(seconds(self.lease)).arg("ID").arg(id);
        if self.fair {
            op = op.arg("FAIR").arg("WITHTICKET");
        }
        op = op.module_arg(wait_args(left));
        if self.bound {
            op = op.module_arg("BOUND");
        }
        op
    }

    /// The tickets of a granted set (`None` when not fair); [`Error::NotAcquired`] for nil.
    pub(crate) fn outcome(&self, reply: Value) -> Result<Option<Vec<u64>>> {
        if reply == Value::Nil {
            return Err(Error::NotAcquired);
        }
        if !self.fair {
            return Ok(None);
        }
        let (_, tickets): (Value, Vec<u64>) = redis::from_redis_value(&reply)?;
        Ok(Some(tickets))
    }
}

/// `SEM.WAITEMPTY name timeout`: zero looks once (the server reads 0 as "no limit").
pub(crate) fn wait_empty_op(name: &str, timeout: Duration) -> Op {
    let timeout = match timeout {
        Duration::MAX => "0".to_string(),
        timeout if timeout.is_zero() => "0.001".to_string(),
        timeout => seconds(timeout),
    };
    Op::new("WAITEMPTY", name)
        .arg(timeout)
        .needs_module("SEM.WAITEMPTY")
}

/// `WAIT replicas timeout` after a durable grant.
fn durable_wait(replicas: usize, timeout: Duration) -> Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas).arg(timeout.as_millis() as u64);
    cmd
}

/// What to do after a durable grant's `WAIT numreplicas` answered.
#[derive(Debug, PartialEq, Eq)]
enum Durable {
    /// Enough replicas acknowledged the grant.
    Done,
    /// The connection that wrote the grant is gone (its primary failed over): after this
    /// pause, refresh the holder on the slot's owner and send `WAIT` again. A `WAIT` on another
    /// connection covers none of the grant's writes (that connection wrote nothing, and it
    /// answers at once); the refresh is a write of the new one that carries the holder, so the
    /// next `WAIT` covers it. A holder the refresh does not find was lost in the failover.
    Recheck(Duration),
}

/// `WAIT` refused by a node that became a replica between the grant and the `WAIT` (a
/// failover): none of its replicas will acknowledge the grant, as after a cut `WAIT`.
fn demoted(err: &RedisError) -> bool {
    err.to_string()
        .contains("WAIT cannot be used with replica instances")
}

/// The step after `answer`, the reply of `WAIT numreplicas` sent once, on the connection that
/// wrote the grant (or that refreshed it); `cluster`: the call went to a node of Redis Cluster.
fn durable_answer(
    answer: Result<usize>,
    wanted: usize,
    cluster: bool,
    retries: &mut Retries,
) -> Result<Durable> {
    match answer {
        Ok(acked) if acked >= wanted => Ok(Durable::Done),
        Ok(acked) => Err(Error::NotDurable { acked, wanted }),
        Err(Error::Redis(err)) if demoted(&err) && cluster => {
            Ok(Durable::Recheck(retries.pause(err)?))
        }
        Err(Error::Redis(err)) if demoted(&err) => Err(Error::NotDurable { acked: 0, wanted }),
        Err(Error::Redis(err)) if next_step(&err, cluster) != Next::Fail => {
            Ok(Durable::Recheck(retries.pause(err)?))
        }
        Err(err) => Err(err),
    }
}

/// What a transport does next after a grant, until the permit is the caller's.
pub(crate) enum Step {
    /// Send this `WAIT numreplicas` once, on the connection that wrote the grant (or its last
    /// refresh), never on another; then [`Tail::waited`].
    WaitReplicas(Cmd),
    /// After this pause, refresh the permit; then [`Tail::refreshed`].
    Refresh(Duration),
    /// Give the permit back, and fail with this error.
    GiveBack(Error),
    /// The permit is the caller's: refresh it from now on (unless told not to).
    Done,
}

/// Why the tail refreshes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refreshing {
    /// After a durable `WAIT` cut by a failover: the next `WAIT` covers the refresh's write.
    Durable,
    /// The grant came after a wait: the lease's start is unknown until a refresh confirms it.
    Lease,
}

/// The end of an acquire, the same for the sync and async APIs: the durable `WAIT` (core's
/// [`Durable`]), the check that a grant which took more than a third of its lease is still
/// held, and giving the permit back when either fails.
pub(crate) struct Tail {
    sent: Instant,
    lease: Duration,
    durable: Option<(usize, Duration)>,
    cluster: bool,
    retries: Retries,
    refreshing: Refreshing,
}

impl Tail {
    /// After a grant whose attempt was sent at `sent`; `cluster`: it came from a node of Redis
    /// Cluster, whose retry budget is `budget`.
    pub(crate) fn new(
        sent: Instant,
        lease: Duration,
        durable: Option<(usize, Duration)>,
        cluster: bool,
        budget: Duration,
    ) -> Self {
        Tail {
            sent,
            lease,
            durable,
            cluster,
            retries: Retries::new(budget),
            refreshing: Refreshing::Lease,
        }
    }

    pub(crate) fn start(&mut self) -> Step {
        match self.durable {
            Some((wanted, timeout)) => Step::WaitReplicas(durable_wait(wanted, timeout)),
            None => self.check_lease(),
        }
    }

    /// A wait for the grant leaves the lease's start unknown: confirm it when a third of the
    /// lease has passed since the attempt was sent.
    fn check_lease(&mut self) -> Step {
        if self.sent.elapsed() > self.lease / 3 {
            self.refreshing = Refreshing::Lease;
            return Step::Refresh(Duration::ZERO);
        }
        Step::Done
    }

    /// The answer of [`Step::WaitReplicas`].
    pub(crate) fn waited(&mut self, answer: Result<usize>) -> Step {
        let Some((wanted, _)) = self.durable else {
            return self.check_lease();
        };
        match durable_answer(answer, wanted, self.cluster, &mut self.retries) {
            Ok(Durable::Done) => self.check_lease(),
            Ok(Durable::Recheck(pause)) => {
                self.refreshing = Refreshing::Durable;
                Step::Refresh(pause)
            }
            Err(err) => Step::GiveBack(err),
        }
    }

    /// The answer of [`Step::Refresh`]: whether the permit is still held.
    pub(crate) fn refreshed(&mut self, answer: Result<bool>) -> Step {
        match (answer, self.refreshing, self.durable) {
            (Err(err), _, _) => Step::GiveBack(err),
            (Ok(true), Refreshing::Durable, Some((wanted, timeout))) => {
                Step::WaitReplicas(durable_wait(wanted, timeout))
            }
            (Ok(false), Refreshing::Durable, Some((wanted, _))) => {
                Step::GiveBack(Error::NotDurable { acked: 0, wanted })
            }
            (Ok(true), _, _) => Step::Done,
            (Ok(false), _, _) => Step::GiveBack(Error::Lost),
        }
    }
}

/// How soon the refresher tries a refresh again after it failed.
const REFRESH_AGAIN: Duration = Duration::from_millis(500);

/// A holder's state, shared by the permit and its refresh.
pub(crate) struct State {
    /// The server's deadline is at least this: the last acquire or refresh confirmed was sent
    /// then, and its lease started when the server ran it, later.
    confirmed_until: Instant,
    lost: bool,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a permit (or set) knows of itself, whatever its transport.
pub(crate) struct Holder {
    pub(crate) names: Vec<String>,
    pub(crate) set: bool,
    pub(crate) id: String,
    pub(crate) lease: Duration,
    state: Mutex<State>,
}

impl Holder {
    pub(crate) fn new(names: Vec<String>, set: bool, id: String, lease: Duration) -> Self {
        Holder {
            names,
            set,
            id,
            lease,
            state: Mutex::new(State {
                confirmed_until: Instant::now() + lease,
                lost: false,
            }),
        }
    }

    /// The grant's attempt was sent at `sent`.
    pub(crate) fn granted_at(&self, sent: Instant) {
        lock(&self.state).confirmed_until = sent + self.lease;
    }

    /// How many semaphores a refresh or release answers when every permit is still held.
    pub(crate) fn wanted(&self) -> i64 {
        self.names.len() as i64
    }

    pub(crate) fn refresh_op(&self) -> Op {
        Op::holder("REFRESH", &self.names, self.set, &self.id).arg(seconds(self.lease))
    }

    pub(crate) fn release_op(&self) -> Op {
        Op::holder("RELEASE", &self.names, self.set, &self.id)
    }

    /// A refresh sent at `sent` answered `held`: confirmed, or lost (a lease ran out, another
    /// client removed it, or the node that took over the slot never had the grant).
    pub(crate) fn refreshed(&self, sent: Instant, held: i64) -> bool {
        let mut state = lock(&self.state);
        if held == self.wanted() {
            state.confirmed_until = sent + self.lease;
        } else {
            state.lost = true;
        }
        held == self.wanted()
    }

    /// When the refresher sends the next refresh after `answer` (to one sent at `sent`): a
    /// third of the lease on; sooner after a failure (in Redis Cluster the slot's owner may be
    /// failing over: the refresher does not wait for it, and tries again until the lease is
    /// up); never once lost.
    pub(crate) fn next_refresh(&self, sent: Instant, answer: Result<i64>) -> Option<Duration> {
        let every = self.lease / 3;
        match answer {
            Ok(held) => self.refreshed(sent, held).then_some(every),
            Err(_) if self.is_lost() => None,
            Err(_) => Some(every.min(REFRESH_AGAIN)),
        }
    }

    /// How long the refresher waits for a refresh's answer: a third of the lease, from 1 to
    /// 5 seconds.
    pub(crate) fn refresh_within(&self) -> Duration {
        (self.lease / 3).clamp(Duration::from_secs(1), Duration::from_secs(5))
    }

    pub(crate) fn mark_lost(&self) {
        lock(&self.state).lost = true;
    }

    pub(crate) fn is_lost(&self) -> bool {
        let mut state = lock(&self.state);
        if Instant::now() >= state.confirmed_until {
            state.lost = true;
        }
        state.lost
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::Lost);
        }
        Ok(())
    }

    /// `RELEASE COUNT k` of a permit holding `held`: refused before anything is sent unless
    /// 0 < k < held.
    pub(crate) fn release_some_op(&self, held: u32, count: u32) -> Result<Op> {
        if count == 0 || count >= held {
            return Err(Error::BadCount { held });
        }
        Ok(self.release_op().arg("COUNT").arg(count))
    }
}

/// The refreshes of a client's permits, earliest first: what its one refresh thread (sync) or
/// task (async) sends, so that a held permit costs an entry here and neither a thread nor a
/// connection. Each entry is refreshed when [`Holder::next_refresh`] says until removed
/// (released, dropped) or lost.
pub(crate) struct Schedule<T> {
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    entries: HashMap<u64, T>,
    next: u64,
}

/// What a refresher does next.
pub(crate) enum Due<T> {
    /// Refresh this entry now, then [`Schedule::refreshed`].
    Now(u64, T),
    /// Nothing is due before this.
    At(Instant),
    /// Nothing is scheduled.
    Idle,
}

impl<T: Clone> Schedule<T> {
    pub(crate) fn new() -> Self {
        Schedule {
            due: BinaryHeap::new(),
            entries: HashMap::new(),
            next: 0,
        }
    }

    /// Schedules `item` `after` from now: its key, and whether it is now the earliest (the
    /// refresher, asleep until a later one, must wake).
    pub(crate) fn add(&mut self, item: T, after: Duration) -> (u64, bool) {
        let key = self.next;
        self.next += 1;
        let at = Instant::now() + after;
        let earliest = self
            .due
            .peek()
            .is_none_or(|Reverse((first, _))| at < *first);
        self.due.push(Reverse((at, key)));
        self.entries.insert(key, item);
        (key, earliest)
    }

    /// Unschedules `key` (its permit was given back). The heap drops the stale entry when
    /// it comes up, or at once when stale entries outnumber live ones (acquire and release
    /// pairs would pile them up).
    pub(crate) fn remove(&mut self, key: u64) {
        self.entries.remove(&key);
        if self.due.len() > 64 && self.due.len() > 2 * self.entries.len() {
            let entries = &self.entries;
            self.due
                .retain(|Reverse((_, key))| entries.contains_key(key));
        }
    }

    /// The next refresh to send at `now`, or when the next one is due.
    pub(crate) fn next_due(&mut self, now: Instant) -> Due<T> {
        while let Some(Reverse((at, key))) = self.due.peek().copied() {
            let Some(item) = self.entries.get(&key) else {
                self.due.pop();
                continue;
            };
            if at > now {
                return Due::At(at);
            }
            self.due.pop();
            return Due::Now(key, item.clone());
        }
        Due::Idle
    }

    /// The refresh of `key` ended: the next one `next` from now (core's
    /// [`Holder::next_refresh`]), unless it was removed meanwhile; `None`: no more.
    pub(crate) fn refreshed(&mut self, key: u64, next: Option<Duration>) {
        match next {
            Some(after) if self.entries.contains_key(&key) => {
                self.due.push(Reverse((Instant::now() + after, key)));
            }
            Some(_) => {}
            None => {
                self.entries.remove(&key);
            }
        }
    }
}

/// The nodes of Redis Cluster that let a refresher's call go unanswered (stopped, or cut off),
/// and until when refreshers leave them alone: a call to such a node fails at once, so that it
/// holds up no other node's refreshes; one goes through when that time is up. Per process:
/// a node's address names it in every client.
fn stalled_nodes() -> &'static Mutex<HashMap<String, Instant>> {
    static STALLED: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    STALLED.get_or_init(Mutex::default)
}

/// Whether refreshers leave the node at `addr` alone now (never on one server, `""`).
pub(crate) fn stalled(addr: &str) -> bool {
    if addr.is_empty() {
        return false;
    }
    let mut stalled = lock(stalled_nodes());
    match stalled.get(addr) {
        Some(until) if Instant::now() < *until => true,
        Some(_) => {
            stalled.remove(addr);
            false
        }
        None => false,
    }
}

/// The node at `addr` let a call wait `within` unanswered: left alone twice that long.
pub(crate) fn mark_stalled(addr: &str, within: Duration) {
    if !addr.is_empty() {
        lock(stalled_nodes()).insert(addr.to_string(), Instant::now() + 2 * within);
    }
}

/// The error of a call not answered in time.
pub(crate) fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
}

/// A wait the server ended without an answer (`UNBLOCKED`: what a primary turning replica
/// answers its blocked clients, or `CLIENT UNBLOCK ... ERROR`): nothing was granted, and the
/// wait is sent again for what is left of it.
pub(crate) fn unblocked(err: &RedisError) -> bool {
    err.code() == Some("UNBLOCKED")
}

/// A new identifier unless one was given.
pub(crate) fn identifier(given: &Option<String>) -> String {
    given
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_have_at_most_three_decimals() {
        assert_eq!(seconds(Duration::from_secs(30)), "30.000");
        assert_eq!(seconds(Duration::from_millis(250)), "0.250");
        assert_eq!(seconds(Duration::from_micros(1_499)), "0.001");
        assert_eq!(seconds(Duration::from_micros(1_500)), "0.002");
        assert_eq!(seconds(Duration::from_nanos(1)), "0.001");
    }

    #[test]
    fn hash_tags_as_redis_reads_them() {
        assert_eq!(hash_tag("{jobs}"), Some("jobs"));
        assert_eq!(hash_tag("app:{jobs}:x"), Some("jobs"));
        assert_eq!(hash_tag("{}jobs"), None);
        assert_eq!(hash_tag("jobs}{"), None);
        assert_eq!(hash_tag("jobs"), None);
        assert_eq!(hash_tag("{a}{b}"), Some("a"));
    }

    #[test]
    fn the_shared_error_texts() {
        assert_eq!(
            check_name("jobs").unwrap_err().to_string(),
            "in Redis Cluster a semaphore's name needs a hash tag, e.g. \"{jobs}\" or \
             \"app:{jobs}\": the keys of \"jobs\" (jobs, jobs:owner, jobs:counter, \
             jobs:permits, jobs:limit) would fall in different slots"
        );
        assert_eq!(
            check_set(&["a".into(), "b".into()])
                .unwrap_err()
                .to_string(),
            "in Redis Cluster the semaphores of a set must share a slot: give their names one \
             hash tag, e.g. \"{app}a\" and \"{app}b\" (\"a\" is in slot 15495, \"b\" in slot 3300)"
        );
        assert_eq!(
            check_set(&["{app}a".into(), "{app}b".into()]).unwrap(),
            slot("app")
        );
    }

    #[test]
    fn retries_pause_from_50_ms_doubling_to_1_s_until_the_budget_has_passed() {
        let err = || RedisError::from((ErrorKind::TryAgain, "TRYAGAIN"));
        let mut retries = Retries::new(Duration::from_secs(3));
        let pauses: Vec<u64> = (0..7)
            .map(|_| retries.pause(err()).unwrap().as_millis() as u64)
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000]);
        let mut retries = Retries::new(Duration::ZERO);
        assert!(matches!(
            retries.pause(err()),
            Err(Error::Unavailable { .. })
        ));
        let mut retries = Retries::new(Duration::from_millis(30));
        let last = retries.pause(err()).unwrap(); // what is left of the budget, not 50 ms
        assert!(last <= Duration::from_millis(30) && last > Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(40));
        assert!(matches!(
            retries.pause(err()),
            Err(Error::Unavailable { .. })
        ));
    }

    #[test]
    fn what_a_failure_leads_to() {
        let err = |kind, text: &str| RedisError::from((kind, "", text.to_string()));
        let moved = RedisError::from((ErrorKind::Moved, "", "3999 127.0.0.1:7001".to_string()));
        assert_eq!(
            next_step(&moved, true),
            Next::Moved("127.0.0.1:7001".into())
        );
        let ask = RedisError::from((ErrorKind::Ask, "", "3999 127.0.0.1:7002".to_string()));
        assert_eq!(next_step(&ask, true), Next::Ask("127.0.0.1:7002".into()));
        for kind in [
            ErrorKind::TryAgain,
            ErrorKind::ClusterDown,
            ErrorKind::MasterDown,
        ] {
            assert_eq!(next_step(&err(kind, "x"), true), Next::Pause);
            assert_eq!(next_step(&err(kind, "x"), false), Next::Fail);
        }
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(next_step(&refused, true), Next::Pause);
        assert_eq!(
            next_step(&err(ErrorKind::ResponseError, "syntax"), true),
            Next::Fail
        );
    }

    fn refused(retry_ms: i64, ahead: i64) -> Value {
        Value::Array(vec![Value::Nil, Value::Int(retry_ms), Value::Int(ahead)])
    }

    fn script_args(action: &Action) -> Vec<String> {
        let Action::Send(op) = action else {
            panic!("not a send");
        };
        let cmd = op.request(Backend::Scripts, false).unwrap().cmd;
        cmd.args_iter()
            .skip(9) // EVALSHA sha 6 and the six keys
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                redis::Arg::Cursor => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn the_waiting_loop_of_the_script() {
        let mut spec = AcquireSpec::new("{j}".into());
        spec.fair = true;
        spec.wait = Some(Duration::from_secs(60));
        let mut wait = Wait::new(&spec, "w1");
        let first = wait.start();
        let Action::Send(op) = &first else { panic!() };
        assert!(op.first_attempt);
        assert_eq!(
            script_args(&first),
            [
                "ACQUIREFAIR",
                "1",
                "30.000",
                "ID",
                "w1",
                "WITHTICKET",
                "LINE"
            ]
        );
        // First in line, a lease ends in 300 ms: BLPOP its own list, TICK then.
        let Action::Block { blpop, tick } =
            wait.answered(Backend::Scripts, refused(300, 0)).unwrap()
        else {
            panic!("no block");
        };
        assert_eq!(tick, Some(Duration::from_millis(302)));
        let args: Vec<String> = blpop
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                redis::Arg::Cursor => unreachable!(),
            })
            .collect();
        assert_eq!(args, ["BLPOP", "{j}:wake:w1", "2.500"]);
        // H<ms>: block again, with a TICK just after that lease's end, while the last attempt
        // keeps the place; H alone: try again at once, with the text that memory full allows.
        let Action::Block { blpop, tick } = wait.popped(Some(("k".into(), "H120".into()))).unwrap()
        else {
            panic!("no block");
        };
        assert_eq!(tick, Some(Duration::from_millis(122)));
        assert_eq!(blpop.args_iter().count(), 3);
        let again = wait.popped(Some(("k".into(), "H".into()))).unwrap();
        let Action::Send(op) = &again else { panic!() };
        assert!(!op.first_attempt);
        wait.attempted -= NUDGE;
        let again = wait.popped(Some(("k".into(), "H120".into()))).unwrap();
        assert!(
            matches!(again, Action::Send(_)),
            "the place is renewed first"
        );
        // Not first, or the lease ends after the BLPOP would: no TICK.
        let Action::Block { tick, .. } = wait.answered(Backend::Scripts, refused(300, 1)).unwrap()
        else {
            panic!("no block");
        };
        assert_eq!(tick, None);
        // A fair grant and its ticket; E is the server's error.
        assert!(matches!(
            wait.popped(Some(("k".into(), "G17".into()))).unwrap(),
            Action::Granted(Some(17))
        ));
        let mut wait = Wait::new(&spec, "w2");
        wait.start();
        wait.answered(Backend::Scripts, refused(0, 2)).unwrap();
        match wait.popped(Some(("k".into(), "EWRONGTYPE no".into()))) {
            Err(Error::Redis(err)) => assert_eq!(err.code(), Some("WRONGTYPE")),
            other => panic!("{:?}", other.map(|_| ())),
        }
        // M: the module is loaded; the next attempt waits with it.
        let mut wait = Wait::new(&spec, "w3");
        wait.start();
        wait.answered(Backend::Scripts, refused(0, 0)).unwrap();
        assert!(matches!(
            wait.popped(Some(("k".into(), "M".into()))).unwrap(),
            Action::Send(_)
        ));
        assert!(wait.take_module() && !wait.take_module());
        // Out of time in line: LEAVE, and a grant it answers is the caller's.
        let mut spec = AcquireSpec::new("{j}".into());
        spec.wait = Some(Duration::from_millis(1));
        let mut wait = Wait::new(&spec, "w4");
        wait.start();
        std::thread::sleep(Duration::from_millis(5));
        let leave = wait.answered(Backend::Scripts, refused(0, 0)).unwrap();
        assert_eq!(script_args(&leave), ["LEAVE", "w4"]);
        assert!(matches!(
            wait.answered(Backend::Scripts, Value::BulkString(b"G".to_vec())),
            Ok(Action::Granted(None))
        ));
        // Not waiting: no LINE, and a refusal is the end.
        let spec = AcquireSpec::new("{j}".into());
        let mut wait = Wait::new(&spec, "w5");
        let first = wait.start();
        assert_eq!(script_args(&first), ["ACQUIRE", "1", "30.000", "ID", "w5"]);
        assert!(matches!(
            wait.answered(Backend::Scripts, refused(0, 0)),
            Err(Error::NotAcquired)
        ));
        assert!(wait.abandon().is_none());
    }

    #[test]
    fn no_module_is_believed_for_10_s_the_module_for_good() {
        let long_ago = Instant::now() - RECHECK;
        let old = |backend| Known {
            backend,
            at: long_ago,
        };
        assert_eq!(old(Backend::Scripts).current(), None);
        assert_eq!(old(Backend::Module).current(), Some(Backend::Module));
        assert_eq!(
            Known::new(Backend::Scripts).current(),
            Some(Backend::Scripts)
        );
    }

    #[test]
    fn the_two_texts_of_the_script() {
        let (oom, _) = script(false);
        let (acq, _) = script(true);
        assert!(oom.starts_with("#!lua flags=allow-oom\n"));
        assert!(acq.starts_with("#!lua\n"));
        assert_eq!(&oom[OOM_LINE.len()..], &acq["#!lua".len()..]);
        assert_ne!(script(false).1, script(true).1);
    }

    #[test]
    fn the_long_form_names_every_key() {
        let op = Op::new("GET", "{j}");
        let cmd = op.request(Backend::Module, true).unwrap().cmd;
        let args: Vec<String> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                redis::Arg::Cursor => unreachable!(),
            })
            .collect();
        assert_eq!(
            args,
            [
                "SEM.GET",
                "{j}",
                "{j}:owner",
                "{j}:counter",
                "{j}:permits",
                "{j}:limit"
            ]
        );
        let set = Op::holder("RELEASE", &["{a}x".into(), "{a}y".into()], true, "id");
        let cmd = set.request(Backend::Module, true).unwrap().cmd;
        let args: Vec<String> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                redis::Arg::Cursor => unreachable!(),
            })
            .collect();
        assert_eq!(args[..5], ["SEM.RELEASEALL", "2", "{a}x", "{a}y", "id"]);
        assert_eq!(
            args[5..9],
            ["{a}x:owner", "{a}x:counter", "{a}x:permits", "{a}x:limit"]
        );
        assert_eq!(args.len(), 13);
    }

    fn lease() -> Duration {
        Duration::from_secs(30)
    }

    #[test]
    fn a_prompt_grant_is_the_callers_at_once_and_a_late_one_is_confirmed_first() {
        let mut tail = Tail::new(Instant::now(), lease(), None, false, Duration::ZERO);
        assert!(matches!(tail.start(), Step::Done));

        let late = Instant::now() - lease() / 2;
        let mut tail = Tail::new(late, lease(), None, false, Duration::ZERO);
        assert!(matches!(tail.start(), Step::Refresh(pause) if pause.is_zero()));
        assert!(matches!(tail.refreshed(Ok(true)), Step::Done));
        let mut tail = Tail::new(late, lease(), None, false, Duration::ZERO);
        tail.start();
        assert!(matches!(
            tail.refreshed(Ok(false)),
            Step::GiveBack(Error::Lost)
        ));
    }

    #[test]
    fn a_durable_grant_waits_for_its_replicas_and_is_given_back_without_them() {
        let durable = Some((1, Duration::from_secs(1)));
        let mut tail = Tail::new(Instant::now(), lease(), durable, false, Duration::ZERO);
        assert!(matches!(tail.start(), Step::WaitReplicas(_)));
        assert!(matches!(tail.waited(Ok(1)), Step::Done));
        let mut tail = Tail::new(Instant::now(), lease(), durable, false, Duration::ZERO);
        tail.start();
        assert!(matches!(
            tail.waited(Ok(0)),
            Step::GiveBack(Error::NotDurable {
                acked: 0,
                wanted: 1
            })
        ));

        // In Redis Cluster a WAIT cut by a failover: refresh on the new primary, then WAIT
        // again; a holder the refresh does not find was lost in the failover.
        let cut = || {
            Err(Error::Redis(RedisError::from(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            ))))
        };
        let mut tail = Tail::new(Instant::now(), lease(), durable, true, lease());
        tail.start();
        assert!(matches!(tail.waited(cut()), Step::Refresh(_)));
        assert!(matches!(tail.refreshed(Ok(true)), Step::WaitReplicas(_)));
        assert!(matches!(tail.waited(cut()), Step::Refresh(_)));
        assert!(matches!(
            tail.refreshed(Ok(false)),
            Step::GiveBack(Error::NotDurable {
                acked: 0,
                wanted: 1
            })
        ));
        // On one server the cut is the caller's error.
        let mut tail = Tail::new(Instant::now(), lease(), durable, false, Duration::ZERO);
        tail.start();
        assert!(matches!(
            tail.waited(cut()),
            Step::GiveBack(Error::Redis(_))
        ));

        // The grant's node became a replica before the WAIT, which it refuses: in Redis
        // Cluster, as after a cut; on one server, not durable.
        let demoted = || {
            let reply = b"-ERR WAIT cannot be used with replica instances.\r\n";
            match redis::parse_redis_value(reply) {
                Ok(redis::Value::ServerError(err)) => Err(Error::Redis(err.into())),
                other => panic!("an error reply: {other:?}"),
            }
        };
        let mut tail = Tail::new(Instant::now(), lease(), durable, true, lease());
        tail.start();
        assert!(matches!(tail.waited(demoted()), Step::Refresh(_)));
        assert!(matches!(tail.refreshed(Ok(true)), Step::WaitReplicas(_)));
        assert!(matches!(tail.waited(Ok(1)), Step::Done));
        let mut tail = Tail::new(Instant::now(), lease(), durable, false, Duration::ZERO);
        tail.start();
        assert!(matches!(
            tail.waited(demoted()),
            Step::GiveBack(Error::NotDurable {
                acked: 0,
                wanted: 1
            })
        ));
    }
}
