//! The scale set: what thousands of waiting clients and thousands of leases
//! ending at once cost the server.
//!
//! - crowd: fair hand-offs/s (as in the handoff set) with many other
//!   clients each waiting on a full semaphore of its own, against none;
//! - reads: one `EXISTS` naming waited keys, with few and with many waiters;
//! - storm: many leases ending in the same moment, some with a waiter each,
//!   while a separate connection pings;
//! - memory: `used_memory` per waiting client, over the same clients idle.
//!
//! Waiting clients are bare RESP sockets (see `resp`); every semaphore they
//! wait on is pre-filled with one holder of a long lease, so no wait ends
//! unless the benchmark ends it (`CLIENT UNBLOCK`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;

use crate::contenders::Keys;
use crate::fmt::group_thousands;
use crate::handoff::{self, HandoffContender, HandoffMeasurement};
use crate::resp::{self, Ping, RawConn, Reply};
use crate::sample::percentile;
use crate::scenarios::{server_cpu_us, Server};
use crate::BoxError;

/// Lease of the holders that keep the waited semaphores full: longer than
/// any part of the set.
const FULL_LEASE: &str = "600";
/// `WAIT` of the crowd, read and memory waiters, as the issue states it;
/// every part ends its waits well before.
const WAIT: &str = "60";
/// Lease of a storm waiter once granted, so the grant's recorded deadline
/// stays readable after the storm.
const STORM_WAITER_LEASE_MS: u64 = 60_000;
/// Commands per pipeline when filling or deleting thousands of keys.
const BATCH: usize = 1_000;
/// Shortest stretch of `EXISTS` calls whose server CPU is counted: the
/// kernel accounts CPU time in ticks of a few ms.
const READ_WINDOW: Duration = Duration::from_millis(200);
/// Wait before each memory reading (see `used_memory`).
pub const MEMORY_SETTLE: Duration = Duration::from_millis(3_000);
const MEMORY_SETTLE_MAX: Duration = Duration::from_secs(10);
const MEMORY_STEADY: i64 = 256 * 1024;
/// How long the server may take to report every armed client as blocked.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// How big each part is.
#[derive(Clone, Copy, Debug)]
pub struct ScaleSizes {
    /// Other clients waiting during the crowd's hand-offs.
    pub others: usize,
    /// Keys one `EXISTS` names, and waiters in the smaller read state.
    pub read_keys: usize,
    /// Waiters in the larger read state.
    pub read_waiters: usize,
    /// Round trips timed per kind of `EXISTS`, state and repetition.
    pub read_samples: usize,
    /// Storm: semaphores, each filled to `storm_limit` holders.
    pub storm_semaphores: usize,
    pub storm_limit: usize,
    /// Storm: semaphores (the first ones) with one waiter each.
    pub storm_waiters: usize,
    /// Storm: the holders' common lease, long enough to arm the waiters.
    pub storm_lease_ms: u64,
    pub memory_waiters: usize,
}

impl ScaleSizes {
    pub const FULL: ScaleSizes = ScaleSizes {
        others: 5_000,
        read_keys: 1_000,
        read_waiters: 4_000,
        read_samples: 21,
        storm_semaphores: 2_000,
        storm_limit: 10,
        storm_waiters: 2_000,
        storm_lease_ms: 3_000,
        memory_waiters: 10_000,
    };

    pub const SMOKE: ScaleSizes = ScaleSizes {
        others: 200,
        read_keys: 100,
        read_waiters: 400,
        read_samples: 5,
        storm_semaphores: 200,
        storm_limit: 10,
        storm_waiters: 200,
        storm_lease_ms: 1_500,
        memory_waiters: 1_000,
    };

    /// The most bare connections open at once.
    pub fn most_connections(&self) -> usize {
        self.others
            .max(self.read_waiters)
            .max(self.storm_waiters)
            .max(self.memory_waiters)
    }
}

/// The crowd part: one fair hand-off measurement per repetition and state.
pub struct CrowdRep {
    /// Other clients waiting meanwhile (0 or `others`).
    pub waiting: usize,
    pub m: HandoffMeasurement,
}

/// The read part: one state (waiters in all) of one repetition.
pub struct ReadRep {
    pub waiters: usize,
    pub rep: usize,
    /// Round trips of `EXISTS` over waited keys, µs, sorted.
    pub waited_rtt_us: Vec<f64>,
    /// Round trips of `EXISTS` over as many keys nobody waits on, µs, sorted.
    pub idle_rtt_us: Vec<f64>,
    /// `EXISTS`'s own time per call (`INFO commandstats`), µs: what the
    /// command itself took, not what the module did around it.
    pub waited_command_us: f64,
    pub idle_command_us: f64,
    /// The server main thread's CPU per call, µs: everything it did.
    pub waited_cpu_us: f64,
    pub idle_cpu_us: f64,
}

/// What `time_exists` measures.
struct ExistsTimes {
    /// Round trips, µs, sorted.
    rtt_us: Vec<f64>,
    command_us: f64,
    cpu_us: f64,
}

pub struct Storm {
    pub holders: usize,
    pub waiters: usize,
    pub granted: usize,
    /// Latest minus earliest holder deadline: how far apart one `MULTI`
    /// could put them.
    pub deadline_spread_ms: f64,
    /// Last waiter's grant reply, read by the load generator, minus the
    /// latest holder deadline.
    pub last_grant_after_deadline_ms: f64,
    /// The largest of (reply read − its semaphore's earliest deadline).
    pub worst_wait_past_own_deadline_ms: f64,
    /// Reply read minus the granted lease's recorded start (deadline −
    /// lease), largest and smallest over the waiters.
    pub start_to_reply_max_ms: f64,
    pub start_to_reply_min_ms: f64,
    /// Pings sent from just before the first deadline to the last reply.
    pub pings: usize,
    pub ping_p50_ms: f64,
    pub ping_p99_ms: f64,
    pub ping_max_ms: f64,
}

pub struct Memory {
    pub waiters: usize,
    /// `used_memory` after opening the connections, minus before.
    pub idle_delta: i64,
    /// `used_memory` with every connection in `BLPOP`, minus idle.
    pub list_waiting_delta: i64,
    /// `used_memory` idle again after the `BLPOP`s, minus before opening.
    pub idle_again_delta: i64,
    /// `used_memory` with every connection waiting on its semaphore, minus
    /// idle again.
    pub waiting_delta: i64,
}

impl Memory {
    pub fn bytes_per_waiter(&self) -> f64 {
        self.waiting_delta as f64 / self.waiters as f64
    }

    pub fn bytes_per_list_waiter(&self) -> f64 {
        self.list_waiting_delta as f64 / self.waiters as f64
    }
}

pub struct ScaleResults {
    pub sizes: ScaleSizes,
    pub crowd: Vec<CrowdRep>,
    pub reads: Vec<ReadRep>,
    pub storm: Storm,
    pub memory: Memory,
}

/// Runs the four parts one after the other on the server with the module.
pub async fn run(
    server: &mut Server,
    port: u16,
    sizes: ScaleSizes,
    reps: usize,
    handoff_clients: usize,
    duration: Duration,
) -> Result<ScaleResults, BoxError> {
    check_connection_limits(&mut server.control, sizes.most_connections() + 64).await?;
    // Memory first, on a server that no earlier part has left freeing.
    let memory = memory(&mut server.control, port, sizes.memory_waiters).await?;
    let crowd = crowd(server, port, sizes, reps, handoff_clients, duration).await?;
    let reads = reads(&mut server.control, port, sizes, reps).await?;
    let storm = storm(&mut server.control, port, sizes).await?;
    Ok(ScaleResults {
        sizes,
        crowd,
        reads,
        storm,
        memory,
    })
}

/// Raises this process's open-file limit as far as allowed and checks the
/// server's `maxclients`: both must admit every waiting client at once.
async fn check_connection_limits(
    control: &mut MultiplexedConnection,
    needed: usize,
) -> Result<(), BoxError> {
    let files = raise_open_files();
    if files < needed as u64 {
        return Err(format!(
            "the scale set opens {needed} connections but this process may open {files} \
             files (ulimit -n)"
        )
        .into());
    }
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxclients")
        .query_async(control)
        .await?;
    let maxclients: usize = config.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    if maxclients < needed {
        return Err(format!(
            "the scale set opens {needed} connections but the server's maxclients is \
             {maxclients} (start it with --maxclients 20000, as scripts/bench does)"
        )
        .into());
    }
    Ok(())
}

/// Sets the soft RLIMIT_NOFILE to the hard one; returns the soft limit now.
fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// Part a: the fair hand-off with `others` clients waiting elsewhere, and
/// with none, alternating. The waiting connections stay open; their waits
/// are armed before each crowded repetition and ended after it.
async fn crowd(
    server: &mut Server,
    port: u16,
    sizes: ScaleSizes,
    reps: usize,
    clients: usize,
    duration: Duration,
) -> Result<Vec<CrowdRep>, BoxError> {
    let names = names("other", sizes.others);
    fill_full(&mut server.control, &names).await?;
    let mut conns = open_many(port, sizes.others).await?;
    let mut out = Vec::with_capacity(2 * reps);
    for rep in 0..reps {
        for waiting in [0, sizes.others] {
            if waiting > 0 {
                arm(&mut server.control, &mut conns, &names).await?;
            }
            let keys = Keys::new(format!("redsem-bench:scale:handoff:{rep}:{waiting}"));
            let contender = HandoffContender::FairWait;
            let m = handoff::measure(server, contender, rep, clients, duration, keys).await?;
            if waiting > 0 {
                unblock(&mut server.control, &mut conns).await?;
            }
            eprintln!(
                "[scale: crowd] rep {} · {} others waiting: {} hand-offs/s, p50 {:.0} µs",
                rep + 1,
                group_thousands(waiting as u64),
                group_thousands(m.handoffs_per_sec().round() as u64),
                m.p50_us,
            );
            out.push(CrowdRep { waiting, m });
        }
    }
    drop(conns);
    delete_semaphores(&mut server.control, &names).await?;
    Ok(out)
}

/// Part b: `EXISTS` of `read_keys` waited names with that many waiters in
/// all, then with `read_waiters`, and of as many names nobody waits on.
async fn reads(
    control: &mut MultiplexedConnection,
    port: u16,
    sizes: ScaleSizes,
    reps: usize,
) -> Result<Vec<ReadRep>, BoxError> {
    let all = names("read", sizes.read_waiters + sizes.read_keys);
    let (waited, unwaited) = all.split_at(sizes.read_waiters);
    let waited_read = &waited[..sizes.read_keys];
    fill_full(control, &all).await?;
    let mut conns = open_many(port, sizes.read_waiters).await?;
    let mut out = Vec::new();
    for rep in 0..reps {
        for waiters in [sizes.read_keys, sizes.read_waiters] {
            arm(control, &mut conns[..waiters], &waited[..waiters]).await?;
            let waited = time_exists(control, waited_read, sizes.read_samples).await?;
            let idle = time_exists(control, unwaited, sizes.read_samples).await?;
            unblock(control, &mut conns[..waiters]).await?;
            eprintln!(
                "[scale: reads] rep {} · {} waiters: EXISTS of {} waited keys {:.0} µs \
                 (mean {:.0} µs, server CPU {:.0} µs), of {} keys nobody waits on {:.0} µs",
                rep + 1,
                group_thousands(waiters as u64),
                group_thousands(sizes.read_keys as u64),
                median(&waited.rtt_us),
                mean(&waited.rtt_us),
                waited.cpu_us,
                group_thousands(sizes.read_keys as u64),
                median(&idle.rtt_us),
            );
            out.push(ReadRep {
                waiters,
                rep,
                waited_command_us: waited.command_us,
                idle_command_us: idle.command_us,
                waited_cpu_us: waited.cpu_us,
                idle_cpu_us: idle.cpu_us,
                waited_rtt_us: waited.rtt_us,
                idle_rtt_us: idle.rtt_us,
            });
        }
    }
    drop(conns);
    delete_semaphores(control, &all).await?;
    Ok(out)
}

/// At least `samples` round trips of one `EXISTS` naming `keys`, and for
/// at least `READ_WINDOW`, with the command's own time and the server's CPU
/// per call over them.
async fn time_exists(
    control: &mut MultiplexedConnection,
    keys: &[String],
    samples: usize,
) -> Result<ExistsTimes, BoxError> {
    let mut exists = redis::cmd("EXISTS");
    exists.arg(keys);
    let before = exists_stats(control).await?;
    let cpu_before = server_cpu_us(control).await?;
    let mut rtts = Vec::with_capacity(samples);
    let started = Instant::now();
    while rtts.len() < samples || (started.elapsed() < READ_WINDOW && rtts.len() < 100_000) {
        let sent = Instant::now();
        let found: usize = exists.query_async(control).await?;
        rtts.push(sent.elapsed().as_secs_f64() * 1e6);
        if found != keys.len() {
            return Err(format!("EXISTS found {found} of {} semaphores", keys.len()).into());
        }
    }
    let cpu_after = server_cpu_us(control).await?;
    let after = exists_stats(control).await?;
    rtts.sort_by(f64::total_cmp);
    let calls = (after.0 - before.0).max(1.0);
    Ok(ExistsTimes {
        rtt_us: rtts,
        command_us: (after.1 - before.1) / calls,
        cpu_us: (cpu_after - cpu_before) / calls,
    })
}

/// `EXISTS`'s calls and µs so far, from `INFO commandstats`.
async fn exists_stats(control: &mut MultiplexedConnection) -> Result<(f64, f64), BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(control)
        .await?;
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_exists:"))
        .unwrap_or("");
    let field = |name: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((field("calls"), field("usec")))
}

/// Part c: `storm_semaphores` × `storm_limit` holders whose leases end
/// together (one `MULTI` fills them all), the first `storm_waiters`
/// semaphores with one waiter each, and a pinger running throughout.
async fn storm(
    control: &mut MultiplexedConnection,
    port: u16,
    sizes: ScaleSizes,
) -> Result<Storm, BoxError> {
    let names = names("storm", sizes.storm_semaphores);
    delete_semaphores(control, &names).await?;
    let mut conns = open_many(port, sizes.storm_waiters).await?;
    fill_at_once(control, &names, sizes.storm_limit, sizes.storm_lease_ms).await?;
    let deadlines = earliest_and_latest_deadlines(control, &names).await?;
    let (first_deadline, last_deadline) = deadlines
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &(e, l)| {
            (lo.min(e), hi.max(l))
        });

    let limit = sizes.storm_limit.to_string();
    let lease = format!("{:.3}", STORM_WAITER_LEASE_MS as f64 / 1e3);
    let wait = format!("{}", sizes.storm_lease_ms / 1000 + 30);
    let base = blocked_clients(control).await?;
    for (i, conn) in conns.iter_mut().enumerate() {
        let id = format!("w{i}");
        let args = [
            "SEM.ACQUIRE",
            &names[i],
            &limit,
            &lease,
            "ID",
            &id,
            "WAIT",
            &wait,
        ];
        conn.send(&args).await?;
    }
    wait_blocked(control, base + sizes.storm_waiters as u64).await?;
    if resp::unix_ms() > first_deadline - 100.0 {
        return Err("storm: arming the waiters took longer than the holders' lease".into());
    }

    let stop = Arc::new(AtomicBool::new(false));
    let pinger = resp::spawn_pinger(port, Arc::clone(&stop));
    let replies =
        read_all_timed(conns, Duration::from_secs(sizes.storm_lease_ms / 1000 + 40)).await;
    // A little past the last reply, so a stall right after it is seen too.
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, Ordering::Relaxed);
    let pings = pinger.join().map_err(|_| "pinger panicked")??;
    let replies = replies?;

    let granted: Vec<(usize, f64)> = replies
        .iter()
        .filter(|(_, reply, _)| matches!(reply, Reply::Text(_)))
        .map(|&(i, _, at)| (i, at))
        .collect();
    let last_reply = granted.iter().map(|&(_, at)| at).fold(f64::MIN, f64::max);
    let worst_wait = granted
        .iter()
        .map(|&(i, at)| at - deadlines[i].0)
        .fold(f64::MIN, f64::max);
    let (start_to_reply_min_ms, start_to_reply_max_ms) =
        start_to_reply(control, &names, &granted).await?;
    let window = storm_pings(&pings, first_deadline, last_reply);
    delete_semaphores(control, &names).await?;
    Ok(Storm {
        holders: sizes.storm_semaphores * sizes.storm_limit,
        waiters: sizes.storm_waiters,
        granted: granted.len(),
        deadline_spread_ms: last_deadline - first_deadline,
        last_grant_after_deadline_ms: last_reply - last_deadline,
        worst_wait_past_own_deadline_ms: worst_wait,
        start_to_reply_max_ms,
        start_to_reply_min_ms,
        pings: window.len(),
        ping_p50_ms: percentile(&window, 0.50) / 1e6,
        ping_p99_ms: percentile(&window, 0.99) / 1e6,
        ping_max_ms: window.last().copied().unwrap_or(0) as f64 / 1e6,
    })
}

/// Round trips (ns, sorted) of the pings sent from 20 ms before the first
/// deadline to the last grant's reply: the storm, and a ping already waiting
/// when it began.
fn storm_pings(pings: &[Ping], first_deadline: f64, last_reply: f64) -> Vec<u64> {
    let mut window: Vec<u64> = pings
        .iter()
        .filter(|p| p.sent_unix_ms >= first_deadline - 20.0 && p.sent_unix_ms <= last_reply)
        .map(|p| p.rtt.as_nanos() as u64)
        .collect();
    window.sort_unstable();
    window
}

/// Fills every semaphore to `limit` holders of `lease_ms` inside one
/// `MULTI`, so that their deadlines lie as close together as the server's
/// clock allows (Redis 7.0 gives modules the live clock, not a cached one).
async fn fill_at_once(
    control: &mut MultiplexedConnection,
    names: &[String],
    limit: usize,
    lease_ms: u64,
) -> Result<(), BoxError> {
    let lease = format!("{:.3}", lease_ms as f64 / 1e3);
    let mut pipe = redis::pipe();
    pipe.atomic();
    for name in names {
        for _ in 0..limit {
            pipe.cmd("SEM.ACQUIRE").arg(name).arg(limit).arg(&lease);
        }
    }
    let ids: Vec<Option<String>> = pipe.query_async(control).await?;
    if ids.len() != names.len() * limit || ids.iter().any(Option::is_none) {
        return Err("storm: SEM.ACQUIRE refused a holder while filling".into());
    }
    Ok(())
}

/// Each semaphore's earliest and latest holder deadline (Unix ms).
async fn earliest_and_latest_deadlines(
    control: &mut MultiplexedConnection,
    names: &[String],
) -> Result<Vec<(f64, f64)>, BoxError> {
    let mut out = Vec::with_capacity(names.len());
    for chunk in names.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for name in chunk {
            pipe.cmd("ZRANGE")
                .arg(name)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
        }
        let holders: Vec<Vec<(String, f64)>> = pipe.query_async(control).await?;
        for scores in holders {
            let (lo, hi) = scores
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &(_, d)| {
                    (lo.min(d), hi.max(d))
                });
            if scores.is_empty() {
                return Err("storm: a semaphore has no holders after filling".into());
            }
            out.push((lo, hi));
        }
    }
    Ok(out)
}

/// Reads every connection's one reply at once, each stamped (Unix ms) when
/// this process read it; in the order of `conns`.
async fn read_all_timed(
    conns: Vec<RawConn>,
    limit: Duration,
) -> Result<Vec<(usize, Reply, f64)>, BoxError> {
    let mut tasks = JoinSet::new();
    for (i, mut conn) in conns.into_iter().enumerate() {
        tasks.spawn(async move {
            let reply = conn.read().await?;
            Ok::<_, BoxError>((i, reply, resp::unix_ms()))
        });
    }
    let results = tokio::time::timeout(limit, tasks.join_all())
        .await
        .map_err(|_| "storm: a waiter got no reply in time")?;
    let mut out = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    out.sort_by_key(|&(i, _, _)| i);
    Ok(out)
}

/// For each granted waiter: its reply's read time minus the start of its
/// lease as the server recorded it (deadline − lease); the smallest and
/// largest.
async fn start_to_reply(
    control: &mut MultiplexedConnection,
    names: &[String],
    granted: &[(usize, f64)],
) -> Result<(f64, f64), BoxError> {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for chunk in granted.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for &(i, _) in chunk {
            pipe.cmd("ZSCORE").arg(&names[i]).arg(format!("w{i}"));
        }
        let deadlines: Vec<Option<f64>> = pipe.query_async(control).await?;
        for (&(_, at), deadline) in chunk.iter().zip(deadlines) {
            let deadline = deadline.ok_or("storm: a granted waiter has no recorded deadline")?;
            let gap = at - (deadline - STORM_WAITER_LEASE_MS as f64);
            lo = lo.min(gap);
            hi = hi.max(gap);
        }
    }
    Ok((lo, hi))
}

/// Part d: `used_memory` with `waiters` connections open and idle, then
/// with each waiting in Redis's own `BLPOP` on an empty list (the
/// reference), then idle again and with each waiting on a full semaphore of
/// its own. `BLPOP` goes first: it leaves next to nothing behind, while a
/// module's blocked clients may be freed later than they are unblocked.
async fn memory(
    control: &mut MultiplexedConnection,
    port: u16,
    waiters: usize,
) -> Result<Memory, BoxError> {
    let names = names("memory", waiters);
    let lists = self::names("memory-list", waiters);
    fill_full(control, &names).await?;
    let before = used_memory(control).await?;
    let mut conns = open_many(port, waiters).await?;
    let idle = used_memory(control).await?;
    arm_with(control, &mut conns, &lists, |name| {
        ["BLPOP", name, WAIT].map(String::from).to_vec()
    })
    .await?;
    let list_waiting = used_memory(control).await?;
    unblock(control, &mut conns).await?;
    let idle_again = used_memory(control).await?;
    arm(control, &mut conns, &names).await?;
    let waiting = used_memory(control).await?;
    unblock(control, &mut conns).await?;
    drop(conns);
    delete_semaphores(control, &names).await?;
    let out = Memory {
        waiters,
        idle_delta: idle - before,
        list_waiting_delta: list_waiting - idle,
        idle_again_delta: idle_again - before,
        waiting_delta: waiting - idle_again,
    };
    eprintln!(
        "[scale: memory] {} waiters: {:.0} bytes each over an idle connection \
         (BLPOP: {:.0})",
        group_thousands(waiters as u64),
        out.bytes_per_waiter(),
        out.bytes_per_list_waiter(),
    );
    Ok(out)
}

/// `used_memory` once the state just reached has settled: the server's
/// cron trims the buffers of clients idle for 2 s, visiting each client
/// once a second, and frees what earlier parts left behind over a few
/// seconds; so wait, then read until two readings half a second apart
/// agree within `MEMORY_STEADY` bytes (for at most `MEMORY_SETTLE_MAX`).
async fn used_memory(control: &mut MultiplexedConnection) -> Result<i64, BoxError> {
    tokio::time::sleep(MEMORY_SETTLE).await;
    let started = Instant::now();
    let mut last = read_used_memory(control).await?;
    while started.elapsed() < MEMORY_SETTLE_MAX {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = read_used_memory(control).await?;
        if (now - last).abs() < MEMORY_STEADY {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

async fn read_used_memory(control: &mut MultiplexedConnection) -> Result<i64, BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(control)
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO memory reports no used_memory".into())
}

/// Semaphore names of one part: `redsem-bench:scale:<part>:<i>`.
fn names(part: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("redsem-bench:scale:{part}:{i}"))
        .collect()
}

/// Gives every semaphore (limit 1) one holder of a long lease, after
/// deleting whatever an earlier, aborted run left.
async fn fill_full(control: &mut MultiplexedConnection, names: &[String]) -> Result<(), BoxError> {
    delete_semaphores(control, names).await?;
    for chunk in names.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for name in chunk {
            pipe.cmd("SEM.ACQUIRE").arg(name).arg(1).arg(FULL_LEASE);
        }
        let ids: Vec<Option<String>> = pipe.query_async(control).await?;
        if ids.iter().any(Option::is_none) {
            return Err("SEM.ACQUIRE refused a holder while filling".into());
        }
    }
    Ok(())
}

/// Deletes each semaphore with the keys derived from its name.
async fn delete_semaphores(
    control: &mut MultiplexedConnection,
    names: &[String],
) -> Result<(), BoxError> {
    for chunk in names.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for name in chunk {
            let keys = Keys::new(name.clone());
            pipe.cmd("DEL")
                .arg(&keys.holders)
                .arg(&keys.owner)
                .arg(&keys.counter)
                .arg(&keys.permits)
                .ignore();
        }
        pipe.query_async::<()>(control).await?;
    }
    Ok(())
}

/// Opens `n` bare connections, one after the other (the server accepts
/// them as fast as they come; no burst overflows its backlog).
pub async fn open_many(port: u16, n: usize) -> Result<Vec<RawConn>, BoxError> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(RawConn::open(port).await?);
    }
    Ok(conns)
}

/// Sends each connection's `SEM.ACQUIRE <its name> 1 60 WAIT 60` and waits
/// until the server counts all of them as blocked.
async fn arm(
    control: &mut MultiplexedConnection,
    conns: &mut [RawConn],
    names: &[String],
) -> Result<(), BoxError> {
    arm_with(control, conns, names, |name| {
        ["SEM.ACQUIRE", name, "1", WAIT, "WAIT", WAIT]
            .map(String::from)
            .to_vec()
    })
    .await
}

/// Sends each connection the blocking command `command` makes of its name,
/// and waits until the server counts all of them as blocked.
async fn arm_with(
    control: &mut MultiplexedConnection,
    conns: &mut [RawConn],
    names: &[String],
    command: fn(&str) -> Vec<String>,
) -> Result<(), BoxError> {
    let base = blocked_clients(control).await?;
    for (conn, name) in conns.iter_mut().zip(names) {
        let args = command(name);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        conn.send(&args).await?;
    }
    wait_blocked(control, base + conns.len() as u64).await
}

/// Ends every connection's wait with `CLIENT UNBLOCK` and reads the nil it
/// then gets; a grant instead would mean a full semaphore let someone in.
async fn unblock(
    control: &mut MultiplexedConnection,
    conns: &mut [RawConn],
) -> Result<(), BoxError> {
    for chunk in conns.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for conn in chunk {
            pipe.cmd("CLIENT").arg("UNBLOCK").arg(conn.id);
        }
        let done: Vec<i64> = pipe.query_async(control).await?;
        if done.iter().any(|&d| d != 1) {
            return Err("CLIENT UNBLOCK found a waiter no longer blocked".into());
        }
    }
    let read_all = async {
        for conn in conns.iter_mut() {
            match conn.read().await? {
                Reply::Nil => {}
                other => return Err(format!("an unblocked waiter got {other:?}, not nil").into()),
            }
        }
        Ok::<_, BoxError>(())
    };
    tokio::time::timeout(BLOCK_TIMEOUT, read_all)
        .await
        .map_err(|_| "unblocked waiters got no reply in time")?
}

pub async fn blocked_clients(control: &mut MultiplexedConnection) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(control)
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO clients reports no blocked_clients".into())
}

/// Polls until the server counts at least `target` blocked clients.
async fn wait_blocked(control: &mut MultiplexedConnection, target: u64) -> Result<(), BoxError> {
    let started = Instant::now();
    loop {
        let blocked = blocked_clients(control).await?;
        if blocked >= target {
            return Ok(());
        }
        if started.elapsed() > BLOCK_TIMEOUT {
            return Err(format!(
                "only {blocked} of {target} clients blocked after {BLOCK_TIMEOUT:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Mean of values.
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Median of sorted values.
pub fn median(sorted: &[f64]) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}
