//! The host set: what loading redsem costs the server's OTHER commands,
//! counted in instructions with callgrind, which on a shared, noisy machine
//! repeats where wall-clock time does not.
//!
//! For each server binary: one server under `valgrind --tool=callgrind`,
//! `--save '' --appendonly no`, first without the module, then after
//! `MODULE LOAD`: one process, so the random hash seeds that decide which
//! names share a bucket (of the command table, of the keyspace) are the
//! same on both sides, where separate processes differ by up to a point and
//! a half. Each time `redis-benchmark` sends the same load of commands on
//! keys that belong to no semaphore, between `callgrind_control -z` (zero
//! the counts) and `-d` (dump them); the dump's total over the requests
//! sent is the server's instructions per request. Without the module one
//! client is blocked in `BLPOP` during the loads; with it the server goes
//! through the module states one after the other (each needs the previous:
//! on Redis 7 and Valkey the module keeps following keyspace events once a
//! client waited).
//!
//! While clients wait, their semaphores' data is in the database: each
//! waited semaphore's holder set, a sorted set with a TTL at the lease's
//! end. A database with volatile keys makes the server dearer for every
//! command (each key lookup also looks in the expires dict once it is not
//! empty), a cost of holding the user's data, not of the module. So each
//! state is compared with a count of the server without the module holding
//! the same data: the empty database for the states nobody waits in, and for
//! a state with N waiters N holder sets of the same names, written the
//! client-side recipe's way (`ZADD <name> <deadline_ms> <member>`,
//! `PEXPIREAT <name> <deadline_ms>`, the deadline a lease from now), the
//! `BLPOP` client still blocked.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::callgrind::{server_version, Callgrind};
use crate::contenders::Keys;
use crate::resp::RawConn;
use crate::scale;
use crate::BoxError;

/// The commands of the load, as `redis-benchmark -t` takes them.
pub const TESTS: &str = "get,set,incr,lpush,hset,zadd";
pub const TEST_COUNT: u64 = 6;
/// Connections of `redis-benchmark -c`.
pub const CLIENTS: u32 = 10;
/// Requests per command of the load (`-n`), full run and smoke run.
pub const FULL_REQUESTS: u64 = 20_000;
pub const SMOKE_REQUESTS: u64 = 2_000;
/// Loads per count of a full run.
pub const FULL_REPS: u32 = 3;
/// Clients waiting in the last state.
pub const MANY_WAITERS: usize = 1_000;
/// Lease of the holders that keep the waited semaphores full, and `WAIT` of
/// their waiters: both outlast the slowest server under valgrind.
const LEASE: &str = "3600";
pub const LEASE_MS: u64 = 3_600_000;
const WAIT: &str = "3600";
/// The bounded wait of the "after one wait" state, in seconds.
const SHORT_WAIT: &str = "0.05";
/// The list the `BLPOP` client waits on.
const LIST: &str = "redsem-bench:host:list";
const PROBE: &str = "redsem-bench:host:probe";
/// How long the module may take to reach a state.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The module's state during one load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostState {
    /// Loaded, nobody ever waited; one `BLPOP` client waits, as without it.
    Loaded,
    /// One wait ran out of time (the module followed events for it while it
    /// waited), its semaphore released and deleted; nobody waits on a
    /// semaphore; one `BLPOP` client waits, as without the module.
    AfterWait,
    /// One client waits on a semaphore (instead of the `BLPOP` client).
    OneWaiting,
    /// [`MANY_WAITERS`] clients wait, each on a semaphore of its own.
    ManyWaiting,
}

impl HostState {
    pub const FULL: [HostState; 4] = [
        HostState::Loaded,
        HostState::AfterWait,
        HostState::OneWaiting,
        HostState::ManyWaiting,
    ];
    pub const SMOKE: [HostState; 2] = [HostState::Loaded, HostState::OneWaiting];

    pub fn label(self) -> &'static str {
        match self {
            HostState::Loaded => "loaded, never waited",
            HostState::AfterWait => "after one wait that timed out, nobody waiting",
            HostState::OneWaiting => "while 1 client waits on another semaphore",
            HostState::ManyWaiting => "while 1,000 clients wait on 1,000 other semaphores",
        }
    }

    pub fn slug(self) -> &'static str {
        match self {
            HostState::Loaded => "loaded",
            HostState::AfterWait => "after-wait",
            HostState::OneWaiting => "one-waiting",
            HostState::ManyWaiting => "many-waiting",
        }
    }

    /// The highest ratio, with / without the module, this state may reach.
    pub fn target(self) -> f64 {
        match self {
            HostState::Loaded | HostState::AfterWait => 1.015,
            HostState::OneWaiting | HostState::ManyWaiting => 1.02,
        }
    }

    /// Holder sets (one per waited semaphore) in the database of this
    /// state's baseline, the server without the module: as many as the
    /// state has waiters.
    pub fn holder_sets(self) -> usize {
        self.waiters()
    }

    /// Clients waiting on semaphores during the load.
    fn waiters(self) -> usize {
        match self {
            HostState::Loaded | HostState::AfterWait => 0,
            HostState::OneWaiting => 1,
            HostState::ManyWaiting => MANY_WAITERS,
        }
    }
}

impl fmt::Display for HostState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

impl FromStr for HostState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostState::FULL
            .into_iter()
            .find(|state| state.slug() == s)
            .ok_or_else(|| {
                format!(
                    "unknown host state {s:?}; expected loaded, after-wait, one-waiting or \
                     many-waiting"
                )
            })
    }
}

/// What the host set runs.
#[derive(Clone, Debug)]
pub struct HostPlan {
    pub servers: Vec<PathBuf>,
    pub module: PathBuf,
    /// Requests per command of the load.
    pub requests: u64,
    pub states: Vec<HostState>,
    /// The CPU the servers are pinned to (`taskset`), if any.
    pub cpu: Option<usize>,
    /// Loads per count; the count is the median load's.
    pub reps: u32,
}

/// One load: the server's instructions from zeroing to dump.
#[derive(Clone, Copy, Debug)]
pub struct Count {
    pub instructions: u64,
    /// Of those, the ones inside `serverCron` (with what it calls), when the
    /// binary names its functions: the server's housekeeping, ten times a
    /// second, whose share grows with the load's wall time rather than with
    /// its requests (about a million instructions a second on Redis 7.0,
    /// eight on Redis 8.2, a twentieth on Valkey, plus a visit to each
    /// connected client once a second).
    pub cron_instructions: Option<u64>,
    pub requests: u64,
    pub load: Duration,
}

impl Count {
    pub fn per_request(&self) -> f64 {
        self.instructions as f64 / self.requests.max(1) as f64
    }

    /// Instructions per request outside `serverCron`: the figure that
    /// repeats whatever else slows the machine down during the load.
    pub fn per_request_without_cron(&self) -> Option<f64> {
        self.cron_instructions
            .map(|cron| (self.instructions - cron) as f64 / self.requests.max(1) as f64)
    }
}

/// One server binary's figures.
#[derive(Debug)]
pub struct ServerCounts {
    pub path: PathBuf,
    /// "Redis 7.0.15", "Valkey 9.1.2".
    pub version: String,
    /// The counts without the module, by the holder sets in its database
    /// (0: the empty database), fewest first.
    pub baselines: Vec<(usize, Count)>,
    pub with: Vec<(HostState, Count)>,
}

impl ServerCounts {
    /// The count without the module that `state` is compared with: the
    /// server holding the same semaphores' data.
    pub fn baseline(&self, state: HostState) -> &Count {
        self.baselines
            .iter()
            .find(|(sets, _)| *sets == state.holder_sets())
            .map(|(_, count)| count)
            .expect("a baseline for every state measured")
    }
}

#[derive(Debug)]
pub struct HostResults {
    pub plan: HostPlan,
    pub servers: Vec<ServerCounts>,
    pub elapsed: Duration,
}

pub async fn run(plan: HostPlan) -> Result<HostResults, BoxError> {
    let started = Instant::now();
    let work = std::env::temp_dir().join(format!("redsem-bench-host-{}", std::process::id()));
    let mut servers = Vec::with_capacity(plan.servers.len());
    for (index, path) in plan.servers.iter().enumerate() {
        let result = measure_server(&plan, path, &work.join(index.to_string())).await;
        let counts = result.map_err(|e| format!("host set, {}: {e}", path.display()))?;
        servers.push(counts);
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(HostResults {
        plan,
        servers,
        elapsed: started.elapsed(),
    })
}

async fn measure_server(
    plan: &HostPlan,
    path: &Path,
    work: &Path,
) -> Result<ServerCounts, BoxError> {
    let tag = path.display();
    let mut plain = Callgrind::start(path, None, &work.join("plain"), plan.cpu)?;
    let mut control = plain.connect().await?;
    let version = server_version(&mut control).await?;
    let blpop = block_on_list(&mut control, plain.port).await?;
    // The empty database first, then as many holder sets as each state
    // with waiters has, adding to those already there.
    let mut holder_sets: Vec<usize> = plan.states.iter().map(|s| s.holder_sets()).collect();
    holder_sets.push(0);
    holder_sets.sort_unstable();
    holder_sets.dedup();
    let mut baselines: Vec<(usize, Count)> = Vec::with_capacity(holder_sets.len());
    for sets in holder_sets {
        let have = baselines.last().map_or(0, |(have, _)| *have);
        write_holder_sets(&mut control, have, sets).await?;
        let count = count(&mut plain, plan).await?;
        eprintln!(
            "[host] {version} ({tag}), no module, {sets} holder set(s): {:.0} \
             instructions/request",
            count.per_request()
        );
        baselines.push((sets, count));
    }
    // The same server process goes on with the module: its random hash seeds, which decide
    // which names share a bucket of the command table and the keyspace, stay those of the
    // counts above (separate processes differ by up to a point and a half).
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut control)
        .await?;
    // HOST_MODULE_ARGS: arguments after the module's path, such as `command-filter 0`.
    let module_args: Vec<String> = std::env::var("HOST_MODULE_ARGS")
        .map(|args| args.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    redis::cmd("MODULE")
        .arg("LOAD")
        .arg(plan.module.as_os_str().as_encoded_bytes())
        .arg(&module_args)
        .query_async::<()>(&mut control)
        .await
        .map_err(|e| format!("MODULE LOAD {}: {e}", plan.module.display()))?;
    let mut server = plain;
    let mut blpop = Some(blpop);
    let mut waiters = Vec::new();
    let mut with = Vec::with_capacity(plan.states.len());
    for &state in &plan.states {
        match state {
            HostState::Loaded => {}
            HostState::AfterWait => one_wait_that_times_out(&mut control).await?,
            HostState::OneWaiting | HostState::ManyWaiting => {
                // The semaphore waiters are the blocked clients from now on.
                if let Some(conn) = blpop.take() {
                    drop(conn);
                    wait_until_blocked_is(&mut control, 0).await?;
                }
                add_waiters(&mut control, server.port, &mut waiters, state.waiters()).await?;
            }
        }
        let count = count(&mut server, plan).await?;
        let without = &baselines
            .iter()
            .find(|(sets, _)| *sets == state.holder_sets())
            .expect("a baseline for every state")
            .1;
        eprintln!(
            "[host] {version}, {}: {:.0} instructions/request, {:.3} × no module with {} \
             holder set(s) ({:.3} without serverCron)",
            state.label(),
            count.per_request(),
            count.per_request() / without.per_request(),
            state.holder_sets(),
            count.per_request_without_cron().unwrap_or(f64::NAN)
                / without.per_request_without_cron().unwrap_or(f64::NAN),
        );
        with.push((state, count));
    }
    drop(waiters);
    drop(blpop);
    Ok(ServerCounts {
        path: path.to_path_buf(),
        version,
        baselines,
        with,
    })
}

/// Runs the load `plan.reps` times, each between zeroing and dumping the counts, and returns
/// the median one (by instructions per request outside `serverCron`): one load's count moves
/// with how many requests each turn of the event loop finds, which its timing decides.
async fn count(server: &mut Callgrind, plan: &HostPlan) -> Result<Count, BoxError> {
    let mut counts = Vec::with_capacity(plan.reps as usize);
    for _ in 0..plan.reps {
        counts.push(count_once(server, plan.requests).await?);
    }
    let key = |c: &Count| {
        c.per_request_without_cron()
            .unwrap_or_else(|| c.per_request())
    };
    counts.sort_by(|a, b| key(a).total_cmp(&key(b)));
    if counts.len() > 1 {
        let each: Vec<String> = counts.iter().map(|c| format!("{:.0}", key(c))).collect();
        eprintln!(
            "[host]   {} loads, instructions/request outside serverCron: {}",
            counts.len(),
            each.join(", ")
        );
    }
    Ok(counts[counts.len() / 2])
}

/// Runs the load once between zeroing and dumping the counts, and reads the instructions of
/// that span.
async fn count_once(server: &mut Callgrind, requests: u64) -> Result<Count, BoxError> {
    server.zero()?;
    let mut benchmark = Command::new("redis-benchmark");
    benchmark
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args(["-t", TESTS, "-n", &requests.to_string()])
        .args(["-c", &CLIENTS.to_string(), "-q"])
        .stdin(Stdio::null());
    let started = Instant::now();
    let output = tokio::task::spawn_blocking(move || benchmark.output())
        .await?
        .map_err(|e| format!("cannot run redis-benchmark (is redis-tools installed?): {e}"))?;
    let load = started.elapsed();
    let text = String::from_utf8_lossy(&output.stdout);
    let finished = text.matches("requests per second").count() as u64;
    if !output.status.success() || finished != TEST_COUNT {
        return Err(format!(
            "redis-benchmark failed ({}, {finished} of {TEST_COUNT} tests finished): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    let dump = server.dump().await?;
    Ok(Count {
        instructions: dump.instructions,
        cron_instructions: dump.cron_instructions,
        requests: requests * TEST_COUNT,
        load,
    })
}

/// A connection blocked in `BLPOP` on an empty list until dropped.
async fn block_on_list(
    control: &mut MultiplexedConnection,
    port: u16,
) -> Result<RawConn, BoxError> {
    redis::cmd("DEL")
        .arg(LIST)
        .query_async::<()>(control)
        .await?;
    let mut conn = RawConn::open(port).await?;
    conn.send(&["BLPOP", LIST, "0"]).await?;
    wait_until_blocked_is(control, 1).await?;
    Ok(conn)
}

/// A wait that runs out of time on a full semaphore; then the holder
/// releases and the keys go, so nothing of it stays but what the module
/// keeps of having had a waiter.
async fn one_wait_that_times_out(control: &mut MultiplexedConnection) -> Result<(), BoxError> {
    let keys = Keys::new(PROBE.into());
    keys.delete(control).await?;
    let holder: Option<String> = redis::cmd("SEM.ACQUIRE")
        .arg(PROBE)
        .arg(1)
        .arg(60)
        .query_async(control)
        .await?;
    let holder = holder.ok_or("SEM.ACQUIRE refused the probe's first holder")?;
    let waited: Option<String> = redis::cmd("SEM.ACQUIRE")
        .arg(PROBE)
        .arg(1)
        .arg(60)
        .arg("WAIT")
        .arg(SHORT_WAIT)
        .query_async(control)
        .await?;
    if waited.is_some() {
        return Err("a wait on a full semaphore got a permit".into());
    }
    let released: i64 = redis::cmd("SEM.RELEASE")
        .arg(PROBE)
        .arg(&holder)
        .query_async(control)
        .await?;
    if released != 1 {
        return Err("SEM.RELEASE of the probe's holder replied 0".into());
    }
    keys.delete(control).await?;
    let timed_out = sem_info(control, "sem_waits_timed_out").await?;
    let waiting = sem_info(control, "sem_waiters").await?;
    if timed_out != 1 || waiting != 0 {
        return Err(format!(
            "after the probe's wait INFO sem reports {timed_out} timed out, {waiting} waiting"
        )
        .into());
    }
    // The module ends what it followed for the wait, and stops its timer, right after the
    // timer run that ended it: nothing may be left running when the load starts.
    let started = Instant::now();
    while sem_info(control, "sem_armed_timers").await? != 0 {
        if started.elapsed() > START_TIMEOUT {
            return Err("the module's timer still runs long after the probe's wait".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The name of the `i`th waited semaphore, with the module and in the
/// baseline without it.
fn wait_name(i: usize) -> String {
    format!("redsem-bench:host:wait:{i}")
}

/// Brings the holder sets in the database of the server without the module
/// from `have` to `n`, for the semaphores of the first `n` waiters' names
/// (the loads' own keys, which never expire, stay beside them), each written
/// as the client-side recipe writes a holder: a sorted set of one member
/// scored with its deadline, a lease from now, and the key expiring then.
async fn write_holder_sets(
    control: &mut MultiplexedConnection,
    have: usize,
    n: usize,
) -> Result<(), BoxError> {
    if n <= have {
        return Ok(());
    }
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(control).await?;
    let deadline = (secs * 1_000 + micros / 1_000 + LEASE_MS).to_string();
    let mut pipe = redis::pipe();
    for i in have..n {
        let name = wait_name(i);
        pipe.cmd("ZADD")
            .arg(&name)
            .arg(&deadline)
            .arg(format!("holder-{i}"))
            .ignore();
        pipe.cmd("PEXPIREAT").arg(&name).arg(&deadline).ignore();
    }
    pipe.query_async::<()>(control).await?;
    let info: String = redis::cmd("INFO")
        .arg("keyspace")
        .query_async(control)
        .await?;
    let expected = format!("expires={n},");
    if !info
        .lines()
        .any(|l| l.starts_with("db0:") && l.contains(&expected))
    {
        return Err(format!("after writing {n} holder sets INFO keyspace reports {info:?}").into());
    }
    Ok(())
}

/// Brings the clients waiting on semaphores to `n`, each on a full
/// semaphore of its own.
async fn add_waiters(
    control: &mut MultiplexedConnection,
    port: u16,
    waiters: &mut Vec<RawConn>,
    n: usize,
) -> Result<(), BoxError> {
    let names: Vec<String> = (waiters.len()..n).map(wait_name).collect();
    let mut pipe = redis::pipe();
    for name in &names {
        let keys = Keys::new(name.clone());
        pipe.cmd("DEL")
            .arg(&keys.holders)
            .arg(&keys.owner)
            .arg(&keys.counter)
            .arg(&keys.permits)
            .ignore();
        pipe.cmd("SEM.ACQUIRE").arg(name).arg(1).arg(LEASE);
    }
    let holders: Vec<Option<String>> = pipe.query_async(control).await?;
    if holders.iter().any(Option::is_none) {
        return Err("SEM.ACQUIRE refused a holder while filling".into());
    }
    let mut conns = scale::open_many(port, names.len()).await?;
    for (conn, name) in conns.iter_mut().zip(&names) {
        conn.send(&["SEM.ACQUIRE", name, "1", LEASE, "WAIT", WAIT])
            .await?;
    }
    waiters.append(&mut conns);
    wait_until_blocked_is(control, n as u64).await?;
    let waiting = sem_info(control, "sem_waiters").await?;
    if waiting != n as u64 {
        return Err(format!("INFO sem reports {waiting} waiters, not {n}").into());
    }
    Ok(())
}

/// Polls until the server counts exactly `n` blocked clients.
async fn wait_until_blocked_is(
    control: &mut MultiplexedConnection,
    n: u64,
) -> Result<(), BoxError> {
    let started = Instant::now();
    loop {
        let blocked = scale::blocked_clients(control).await?;
        if blocked == n {
            return Ok(());
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(format!("{blocked} clients blocked, not {n}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One integer field of `INFO sem`.
async fn sem_info(control: &mut MultiplexedConnection, field: &str) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO").arg("sem").query_async(control).await?;
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("INFO sem reports no {field}").into())
}
