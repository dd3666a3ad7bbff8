//! The hand-off benchmark: one permit (limit 1) passed between clients that
//! each loop acquire → release at once → acquire again, and its floor, a
//! chain of round trips on one connection (sequential INCRs).
//!
//! Every client records, on the load generator's one monotonic clock, when
//! it read each grant and when it sent each release. Merged, the events of a
//! limit-1 semaphore alternate strictly (grant, release, grant, …): the next
//! grant can only be made after the server has seen the release, which was
//! sent after the previous grant was read. A grant's latency is its read time
//! minus the send time of the release just before it; it is a hand-off when
//! it goes to another client than the previous grant.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;

use crate::contenders::Keys;
use crate::sample::percentile;
use crate::scenarios::{server_cpu_us, Server, DRAIN_GRACE};
use crate::stats::Spread;
use crate::BoxError;

/// Lease of every hand-off holder: a holder keeps its permit for one round
/// trip, so no lease runs out during a run unless the load generator stalls
/// for seconds (which the release's reply would then report).
pub const LEASE_SECS: &str = "10";
/// How long a `WAIT` client waits in the server before it gets nil and asks
/// again; with 50 clients the wait is 49 hand-offs, a few milliseconds.
pub const WAIT_SECS: &str = "10";
/// How long the polling client sleeps after a nil, as client libraries wait.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The one value the token list holds.
const TOKEN: &str = "x";
/// Upper bound on the grants (or round trips) one client runs in one
/// measurement, so each loop is bounded in count as well as in time.
const MAX_GRANTS_PER_CLIENT: usize = 10_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandoffContender {
    /// `SEM.ACQUIREFAIR h 1 <lease> WAIT <w>` + `SEM.RELEASE`.
    FairWait,
    /// `SEM.ACQUIRE h 1 <lease> WAIT <w>` + `SEM.RELEASE`.
    Wait,
    /// `SEM.ACQUIRE h 1 <lease>`; on nil, sleep 10 ms and try again.
    Poll,
    /// Redis's own blocking hand-off, the speed anchor: a list holding one
    /// token, taken with `BLPOP` and given back with `RPUSH`. No lease, no
    /// identity: not a peer of the semaphores, the cost of waking a waiter.
    TokenList,
    /// One connection sending `INCR`s one after the other: the limit of a
    /// chain of hand-offs that each need one round trip.
    RoundTrip,
}

impl HandoffContender {
    pub const ALL: [HandoffContender; 5] = [
        HandoffContender::FairWait,
        HandoffContender::Wait,
        HandoffContender::Poll,
        HandoffContender::TokenList,
        HandoffContender::RoundTrip,
    ];

    /// Short name used on the command line, in key names and in the TSV.
    pub fn slug(self) -> &'static str {
        match self {
            HandoffContender::FairWait => "fair-wait",
            HandoffContender::Wait => "wait",
            HandoffContender::Poll => "poll",
            HandoffContender::TokenList => "token-list",
            HandoffContender::RoundTrip => "round-trip",
        }
    }

    /// Human name for the tables.
    pub fn label(self) -> &'static str {
        match self {
            HandoffContender::FairWait => "SEM.ACQUIREFAIR WAIT",
            HandoffContender::Wait => "SEM.ACQUIRE WAIT",
            HandoffContender::Poll => "SEM.ACQUIRE, poll every 10 ms",
            HandoffContender::TokenList => "token list: BLPOP + RPUSH (no lease)",
            HandoffContender::RoundTrip => "floor: sequential INCR, 1 connection",
        }
    }

    /// The acquire every client sends (for the token list: the `BLPOP`).
    fn acquire(self, keys: &Keys) -> redis::Cmd {
        if self == HandoffContender::TokenList {
            let mut cmd = redis::cmd("BLPOP");
            cmd.arg(&keys.holders).arg(WAIT_SECS);
            return cmd;
        }
        let mut cmd = redis::cmd(if self == HandoffContender::FairWait {
            "SEM.ACQUIREFAIR"
        } else {
            "SEM.ACQUIRE"
        });
        cmd.arg(&keys.holders).arg(1).arg(LEASE_SECS);
        if self != HandoffContender::Poll {
            cmd.arg("WAIT").arg(WAIT_SECS);
        }
        cmd
    }
}

impl fmt::Display for HandoffContender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

impl FromStr for HandoffContender {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HandoffContender::ALL
            .into_iter()
            .find(|c| c.slug() == s)
            .ok_or_else(|| {
                let names: Vec<_> = HandoffContender::ALL.iter().map(|c| c.slug()).collect();
                format!(
                    "unknown hand-off contender {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// The outcome of one hand-off contender, one repetition.
#[derive(Clone, Debug)]
pub struct HandoffMeasurement {
    pub contender: HandoffContender,
    pub rep: usize,
    pub clients: usize,
    /// Grants read (for the floor: round trips).
    pub grants: u64,
    /// Grants to another client than the previous grant's (for the floor:
    /// round trips).
    pub handoffs: u64,
    /// Nil replies: waits that timed out, polls that found the permit taken.
    pub refusals: u64,
    pub elapsed: Duration,
    /// Hand-off latency percentiles (for the floor: round-trip latency).
    pub p50_us: f64,
    pub p99_us: f64,
    /// Server main-thread CPU (user + sys) spent during the measurement.
    pub server_cpu_us: f64,
    /// The load generator's own CPU (user + sys) during the measurement.
    pub client_cpu_us: f64,
    /// Fewest and most grants one client got; `None` for the floor.
    pub grants_min_max: Option<(u64, u64)>,
}

impl HandoffMeasurement {
    pub fn handoffs_per_sec(&self) -> f64 {
        self.handoffs as f64 / self.elapsed.as_secs_f64()
    }

    pub fn grants_per_sec(&self) -> f64 {
        self.grants as f64 / self.elapsed.as_secs_f64()
    }

    pub fn refusals_per_sec(&self) -> f64 {
        self.refusals as f64 / self.elapsed.as_secs_f64()
    }

    pub fn cpu_us_per_handoff(&self) -> f64 {
        self.server_cpu_us / self.handoffs.max(1) as f64
    }

    pub fn server_busy(&self) -> f64 {
        self.server_cpu_us / (self.elapsed.as_secs_f64() * 1e6)
    }

    /// Share of the wall time the load generator was on the CPU: a chain of
    /// hand-offs with both this and the server's well below 1 is bound by
    /// latency (wake-ups and the loopback), not by either side's work.
    pub fn client_busy(&self) -> f64 {
        self.client_cpu_us / (self.elapsed.as_secs_f64() * 1e6)
    }

    /// Grants per client if every client got as many.
    pub fn fair_share(&self) -> f64 {
        self.grants as f64 / self.clients as f64
    }

    /// The most grants one client got, over the fair share.
    pub fn max_over_fair(&self) -> Option<f64> {
        let (_, max) = self.grants_min_max?;
        Some(max as f64 / self.fair_share())
    }

    /// The fair share over the fewest grants one client got (infinite when
    /// a client got none).
    pub fn fair_over_min(&self) -> Option<f64> {
        let (min, _) = self.grants_min_max?;
        Some(self.fair_share() / min as f64)
    }
}

/// Runs one hand-off contender on keys of its own, deleting them before and
/// after, and checks afterwards that nobody holds the permit any more.
pub async fn measure(
    server: &mut Server,
    contender: HandoffContender,
    rep: usize,
    clients: usize,
    duration: Duration,
    keys: Keys,
) -> Result<HandoffMeasurement, BoxError> {
    if server.workers.len() < clients {
        return Err(format!(
            "{clients} hand-off clients but only {} connections",
            server.workers.len()
        )
        .into());
    }
    keys.delete(&mut server.control).await?;
    if contender == HandoffContender::TokenList {
        redis::cmd("RPUSH")
            .arg(&keys.holders)
            .arg(TOKEN)
            .query_async::<()>(&mut server.control)
            .await?;
    }
    let keys = Arc::new(keys);
    let cpu_before = server_cpu_us(&mut server.control).await?;
    let client_cpu_before = own_cpu_us();
    let started = Instant::now();
    let deadline = started + duration;
    let limit = duration + DRAIN_GRACE;
    let late = || format!("{contender} did not finish within {DRAIN_GRACE:?} of its deadline");

    let (clients, grants, handoffs, refusals, mut latencies_ns, grants_min_max) = if contender
        == HandoffContender::RoundTrip
    {
        let conn = server.workers[0].clone();
        let latencies = tokio::time::timeout(limit, round_trips(conn, Arc::clone(&keys), deadline))
            .await
            .map_err(|_| late())??;
        let n = latencies.len() as u64;
        (1, n, n, 0, latencies, None)
    } else {
        let mut tasks = JoinSet::new();
        for (index, conn) in server.workers.iter().take(clients).enumerate() {
            let task = client(contender, conn.clone(), Arc::clone(&keys), deadline);
            tasks.spawn(async move { task.await.map(|log| (index, log)) });
        }
        let results = tokio::time::timeout(limit, tasks.join_all())
            .await
            .map_err(|_| late())?;
        let mut logs = vec![ClientLog::default(); clients];
        for result in results {
            let (index, log) = result?;
            logs[index] = log;
        }
        let refusals = logs.iter().map(|l| l.refusals).sum();
        let events: Vec<&[(Instant, Event)]> = logs.iter().map(|l| &l.events[..]).collect();
        let chain = follow_the_permit(&events).map_err(|e| format!("{contender}, limit 1: {e}"))?;
        let grants = chain.grants_per_client.iter().sum();
        let min = chain.grants_per_client.iter().copied().min().unwrap_or(0);
        let max = chain.grants_per_client.iter().copied().max().unwrap_or(0);
        let handoffs = chain.handoff_latencies_ns.len() as u64;
        (
            clients,
            grants,
            handoffs,
            refusals,
            chain.handoff_latencies_ns,
            Some((min, max)),
        )
    };
    let elapsed = started.elapsed();
    let client_cpu_us = own_cpu_us() - client_cpu_before;
    let cpu_after = server_cpu_us(&mut server.control).await?;
    check_nothing_held(contender, &mut server.control, &keys).await?;
    keys.delete(&mut server.control).await?;

    latencies_ns.sort_unstable();
    Ok(HandoffMeasurement {
        contender,
        rep,
        clients,
        grants,
        handoffs,
        refusals,
        elapsed,
        p50_us: percentile(&latencies_ns, 0.50) / 1e3,
        p99_us: percentile(&latencies_ns, 0.99) / 1e3,
        server_cpu_us: cpu_after - cpu_before,
        client_cpu_us,
        grants_min_max,
    })
}

/// After a run every permit must be back: the semaphore has no holder, the
/// token list its one token.
async fn check_nothing_held(
    contender: HandoffContender,
    conn: &mut MultiplexedConnection,
    keys: &Keys,
) -> Result<(), BoxError> {
    let (command, expected) = match contender {
        HandoffContender::RoundTrip => return Ok(()),
        HandoffContender::TokenList => ("LLEN", 1),
        _ => ("SEM.GET", 0),
    };
    let found: u64 = redis::cmd(command)
        .arg(&keys.holders)
        .query_async(conn)
        .await?;
    if found != expected {
        return Err(
            format!("{contender}: {command} says {found} after the run, not {expected}").into(),
        );
    }
    Ok(())
}

/// CPU time (user + sys) of this process so far, in µs.
fn own_cpu_us() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// The client read a grant.
    Grant,
    /// The client is about to send the release of the permit it read.
    ReleaseSent,
}

#[derive(Clone, Debug, Default)]
struct ClientLog {
    /// In the client's own order: each grant, then its release.
    events: Vec<(Instant, Event)>,
    refusals: u64,
}

/// One client: acquire, release as soon as granted, acquire again, until the
/// deadline. A client waiting in the server at the deadline still gets its
/// grant (the others release theirs and leave), so the run drains in one
/// more hand-off per waiter.
async fn client(
    contender: HandoffContender,
    mut conn: MultiplexedConnection,
    keys: Arc<Keys>,
    deadline: Instant,
) -> Result<ClientLog, BoxError> {
    let acquire = contender.acquire(&keys);
    let mut log = ClientLog {
        events: Vec::with_capacity(4 * 1024),
        refusals: 0,
    };
    let mut grants = 0;
    while grants < MAX_GRANTS_PER_CLIENT && Instant::now() < deadline {
        let Some(id) = take(contender, &acquire, &mut conn).await? else {
            log.refusals += 1;
            if contender == HandoffContender::Poll && Instant::now() < deadline {
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            continue;
        };
        log.events.push((Instant::now(), Event::Grant));
        grants += 1;
        log.events.push((Instant::now(), Event::ReleaseSent));
        give_back(contender, &mut conn, &keys, &id).await?;
    }
    Ok(log)
}

/// Sends the acquire; the holder's identifier (the token for the list), or
/// `None` when the wait or the poll came back empty.
async fn take(
    contender: HandoffContender,
    acquire: &redis::Cmd,
    conn: &mut MultiplexedConnection,
) -> Result<Option<String>, BoxError> {
    if contender == HandoffContender::TokenList {
        let popped: Option<(String, String)> = acquire.query_async(conn).await?;
        return Ok(popped.map(|(_, token)| token));
    }
    Ok(acquire.query_async(conn).await?)
}

/// Releases the permit, failing if the server no longer knew of it (or, for
/// the list, if a second token appeared).
async fn give_back(
    contender: HandoffContender,
    conn: &mut MultiplexedConnection,
    keys: &Keys,
    id: &str,
) -> Result<(), BoxError> {
    if contender == HandoffContender::TokenList {
        let length: i64 = redis::cmd("RPUSH")
            .arg(&keys.holders)
            .arg(id)
            .query_async(conn)
            .await?;
        if length != 1 {
            return Err(
                format!("{contender}: {length} tokens in the list after a give-back").into(),
            );
        }
        return Ok(());
    }
    let released: i64 = redis::cmd("SEM.RELEASE")
        .arg(&keys.holders)
        .arg(id)
        .query_async(conn)
        .await?;
    if released != 1 {
        return Err(format!(
            "{contender}: SEM.RELEASE found no permit for a holder it had granted \
             (did a {LEASE_SECS} s lease run out?)"
        )
        .into());
    }
    Ok(())
}

/// The floor: sequential INCRs on one connection, each timed from send to
/// reply.
async fn round_trips(
    mut conn: MultiplexedConnection,
    keys: Arc<Keys>,
    deadline: Instant,
) -> Result<Vec<u64>, BoxError> {
    let mut latencies_ns = Vec::with_capacity(64 * 1024);
    while latencies_ns.len() < MAX_GRANTS_PER_CLIENT && Instant::now() < deadline {
        let sent = Instant::now();
        let _: i64 = redis::cmd("INCR")
            .arg(&keys.counter)
            .query_async(&mut conn)
            .await?;
        latencies_ns.push(sent.elapsed().as_nanos() as u64);
    }
    Ok(latencies_ns)
}

/// What the merged event logs of all clients say about the permit.
#[derive(Debug, PartialEq)]
struct Chain {
    grants_per_client: Vec<u64>,
    /// One per hand-off, in grant order: read time of the grant minus the
    /// send time of the release before it.
    handoff_latencies_ns: Vec<u64>,
}

/// Merges the clients' logs on the one clock and follows the permit from
/// client to client; fails if two clients held it at once.
fn follow_the_permit(logs: &[&[(Instant, Event)]]) -> Result<Chain, String> {
    let mut events: Vec<(Instant, usize, Event)> = logs
        .iter()
        .enumerate()
        .flat_map(|(c, log)| log.iter().map(move |&(t, e)| (t, c, e)))
        .collect();
    // Stable: a client's grant and its release, if they share a timestamp,
    // stay in the client's own order.
    events.sort_by_key(|&(t, _, _)| t);
    let mut chain = Chain {
        grants_per_client: vec![0; logs.len()],
        handoff_latencies_ns: Vec::new(),
    };
    let mut holder = None;
    let mut previous = None;
    let mut last_release = None;
    for (t, c, event) in events {
        match event {
            Event::Grant => {
                if let Some(h) = holder {
                    return Err(format!(
                        "client {c} read a grant before client {h} sent its release: \
                         two holders at once"
                    ));
                }
                holder = Some(c);
                chain.grants_per_client[c] += 1;
                if let (Some(p), Some(released)) = (previous, last_release) {
                    if p != c {
                        let latency: Duration = t - released;
                        chain.handoff_latencies_ns.push(latency.as_nanos() as u64);
                    }
                }
                previous = Some(c);
            }
            Event::ReleaseSent => {
                if holder != Some(c) {
                    return Err(format!("client {c} released a permit it did not hold"));
                }
                holder = None;
                last_release = Some(t);
            }
        }
    }
    Ok(chain)
}

/// All repetitions of one hand-off contender, folded together.
#[derive(Clone, Debug)]
pub struct HandoffSummary {
    pub contender: HandoffContender,
    pub handoffs_per_sec: Spread,
    pub grants_per_sec: Spread,
    pub refusals_per_sec: Spread,
    pub p50_us: Spread,
    pub p99_us: Spread,
    pub cpu_us_per_handoff: Spread,
    pub server_busy: Spread,
    pub client_busy: Spread,
    /// The worst repetition's (most uneven); `None` for the floor.
    pub max_over_fair: Option<f64>,
    pub fair_over_min: Option<f64>,
}

/// One summary per contender, in the order of `contenders`.
pub fn summarize(
    measurements: &[HandoffMeasurement],
    contenders: &[HandoffContender],
) -> Vec<HandoffSummary> {
    let mut summaries = Vec::new();
    for &contender in contenders {
        let reps: Vec<&HandoffMeasurement> = measurements
            .iter()
            .filter(|m| m.contender == contender)
            .collect();
        if reps.is_empty() {
            continue;
        }
        let spread = |f: fn(&HandoffMeasurement) -> f64| {
            Spread::of(reps.iter().map(|m| f(m))).expect("at least one repetition")
        };
        let worst = |f: fn(&HandoffMeasurement) -> Option<f64>| {
            reps.iter().filter_map(|m| f(m)).reduce(f64::max)
        };
        summaries.push(HandoffSummary {
            contender,
            handoffs_per_sec: spread(HandoffMeasurement::handoffs_per_sec),
            grants_per_sec: spread(HandoffMeasurement::grants_per_sec),
            refusals_per_sec: spread(HandoffMeasurement::refusals_per_sec),
            p50_us: spread(|m| m.p50_us),
            p99_us: spread(|m| m.p99_us),
            cpu_us_per_handoff: spread(HandoffMeasurement::cpu_us_per_handoff),
            server_busy: spread(HandoffMeasurement::server_busy),
            client_busy: spread(HandoffMeasurement::client_busy),
            max_over_fair: worst(HandoffMeasurement::max_over_fair),
            fair_over_min: worst(HandoffMeasurement::fair_over_min),
        });
    }
    summaries
}

/// The summary of `contender`, if it was run.
pub fn find(summaries: &[HandoffSummary], contender: HandoffContender) -> Option<&HandoffSummary> {
    summaries.iter().find(|s| s.contender == contender)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, us: u64) -> Instant {
        base + Duration::from_micros(us)
    }

    #[test]
    fn slugs_parse_back() {
        for contender in HandoffContender::ALL {
            assert_eq!(contender.slug().parse::<HandoffContender>(), Ok(contender));
        }
        assert!("nope".parse::<HandoffContender>().is_err());
    }

    #[test]
    fn hand_offs_are_grants_to_another_client_timed_from_the_release() {
        let t = Instant::now();
        // Client 0 takes the permit twice in a row, then client 1 gets it
        // 30 µs after client 0's second release, then client 0 again.
        let c0 = [
            (at(t, 0), Event::Grant),
            (at(t, 1), Event::ReleaseSent),
            (at(t, 10), Event::Grant),
            (at(t, 11), Event::ReleaseSent),
            (at(t, 100), Event::Grant),
            (at(t, 101), Event::ReleaseSent),
        ];
        let c1 = [(at(t, 41), Event::Grant), (at(t, 42), Event::ReleaseSent)];
        let chain = follow_the_permit(&[&c0, &c1]).unwrap();
        assert_eq!(chain.grants_per_client, vec![3, 1]);
        assert_eq!(chain.handoff_latencies_ns, vec![30_000, 58_000]);
    }

    #[test]
    fn two_holders_at_once_are_an_error() {
        let t = Instant::now();
        let c0 = [(at(t, 0), Event::Grant), (at(t, 20), Event::ReleaseSent)];
        let c1 = [(at(t, 10), Event::Grant), (at(t, 30), Event::ReleaseSent)];
        assert!(follow_the_permit(&[&c0, &c1]).is_err());
    }

    #[test]
    fn a_grant_and_its_release_may_share_a_timestamp() {
        let t = Instant::now();
        let c0 = [(at(t, 0), Event::Grant), (at(t, 0), Event::ReleaseSent)];
        let c1 = [(at(t, 5), Event::Grant), (at(t, 5), Event::ReleaseSent)];
        let chain = follow_the_permit(&[&c0, &c1]).unwrap();
        assert_eq!(chain.handoff_latencies_ns, vec![5_000]);
    }
}
