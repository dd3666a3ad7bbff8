//! What is measured (scenarios) and how one measurement runs: pre-fill,
//! drive the connections until the deadline, read the server's CPU time.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;

use crate::contenders::{Contender, Keys, Scripts};
use crate::fmt::group_thousands;
use crate::BoxError;

/// Limit at which most attempts fail under 50 connections.
pub const CONTENDED_LIMIT: u64 = 10;
/// Limit no run comes near, so every attempt succeeds.
pub const UNCONTENDED_LIMIT: u64 = 1_000_000;

/// Upper bound on the pairs one connection runs in one measurement, so the
/// loop is bounded in count as well as in time.
const MAX_PAIRS_PER_CONNECTION: usize = 10_000_000;
/// How long in-flight pairs may take to finish after the deadline before the
/// measurement is abandoned (the fair recipe at N = 100,000 needs seconds).
pub const DRAIN_GRACE: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scenario {
    pub connections: usize,
    pub limit: u64,
    /// Live holders put in place before the measurement starts.
    pub holders: u64,
}

impl Scenario {
    /// The contended run, then the holder counts under concurrency, then the
    /// same holder counts from a single client for its latency.
    pub fn plan(connections: usize, holder_counts: &[u64]) -> Vec<Scenario> {
        let mut plan = vec![Scenario {
            connections,
            limit: CONTENDED_LIMIT,
            holders: 0,
        }];
        for conns in [connections, 1] {
            plan.extend(holder_counts.iter().map(|&holders| Scenario {
                connections: conns,
                limit: UNCONTENDED_LIMIT,
                holders,
            }));
        }
        plan
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let conns = match self.connections {
            1 => "1 client".to_string(),
            n => format!("{n} conns"),
        };
        write!(f, "{conns}, limit {}", group_thousands(self.limit))?;
        if self.holders > 0 {
            write!(f, ", N={}", group_thousands(self.holders))?;
        }
        Ok(())
    }
}

/// The outcome of one contender in one scenario, one repetition.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub scenario: Scenario,
    pub contender: Contender,
    pub rep: usize,
    pub pairs: u64,
    pub acquired: u64,
    pub elapsed: Duration,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Server main-thread CPU (user + sys) spent during the measurement.
    pub server_cpu_us: f64,
    pub bytes_per_holder: Option<f64>,
}

impl Measurement {
    pub fn pairs_per_sec(&self) -> f64 {
        self.pairs as f64 / self.elapsed.as_secs_f64()
    }

    pub fn cpu_us_per_pair(&self) -> f64 {
        self.server_cpu_us / self.pairs.max(1) as f64
    }

    /// Share of the wall time the server's main thread was on the CPU: near
    /// 1 the server is the bottleneck, well below it the load generator is.
    pub fn server_busy(&self) -> f64 {
        self.server_cpu_us / (self.elapsed.as_secs_f64() * 1e6)
    }

    pub fn acquired_share(&self) -> f64 {
        self.acquired as f64 / self.pairs.max(1) as f64
    }
}

/// Open connections to one server, reused by every measurement so that
/// connecting never falls inside a measured window.
pub struct Server {
    pub control: MultiplexedConnection,
    pub workers: Vec<MultiplexedConnection>,
}

impl Server {
    async fn connect(port: u16, connections: usize) -> Result<Self, BoxError> {
        let client = redis::Client::open(("127.0.0.1", port))?;
        let control = client.get_multiplexed_async_connection().await?;
        let mut workers = Vec::with_capacity(connections);
        for _ in 0..connections {
            // A socket per worker, as separate clients would have: the
            // requests of different workers never queue behind each other
            // on one connection.
            workers.push(client.get_multiplexed_async_connection().await?);
        }
        Ok(Server { control, workers })
    }
}

/// The server under test, with the module, and optionally a second one
/// without it for the "floor, no module" contender.
pub struct Bench {
    module: Server,
    plain: Option<Server>,
    scripts: Arc<Scripts>,
    duration: Duration,
}

impl Bench {
    pub async fn connect(
        port: u16,
        plain_port: Option<u16>,
        connections: usize,
        duration: Duration,
    ) -> Result<Self, BoxError> {
        let mut module = Server::connect(port, connections).await?;
        let scripts = Arc::new(Scripts::load(&mut module.control).await?);
        let plain = match plain_port {
            Some(port) => Some(Server::connect(port, connections).await?),
            None => None,
        };
        Ok(Bench {
            module,
            plain,
            scripts,
            duration,
        })
    }

    /// The control connection of the server with the module.
    pub fn control(&mut self) -> &mut MultiplexedConnection {
        &mut self.module.control
    }

    /// The control connection of the server without the module, if any.
    pub fn plain_control(&mut self) -> Option<&mut MultiplexedConnection> {
        self.plain.as_mut().map(|p| &mut p.control)
    }

    /// The server with the module, for the hand-off measurements.
    pub fn module(&mut self) -> &mut Server {
        &mut self.module
    }

    /// Runs one contender in one scenario on keys of its own, deleting them
    /// before and after so no run sees another's state.
    pub async fn measure(
        &mut self,
        scenario: Scenario,
        contender: Contender,
        rep: usize,
        keys: Keys,
    ) -> Result<Measurement, BoxError> {
        // CPU time is read from the server the contender runs against.
        let server = if contender.on_plain_server() {
            self.plain
                .as_mut()
                .ok_or_else(|| format!("{contender} needs --plain-port"))?
        } else {
            &mut self.module
        };
        keys.delete(&mut server.control).await?;
        contender
            .prefill(&mut server.control, &keys, scenario.holders, scenario.limit)
            .await?;
        let bytes_per_holder = contender
            .bytes_per_holder(&mut server.control, &keys, scenario.holders)
            .await?;

        let keys = Arc::new(keys);
        let cpu_before = server_cpu_us(&mut server.control).await?;
        let started = Instant::now();
        let deadline = started + self.duration;
        let mut tasks = JoinSet::new();
        for conn in server.workers.iter().take(scenario.connections) {
            tasks.spawn(drive(
                contender,
                conn.clone(),
                Arc::clone(&keys),
                Arc::clone(&self.scripts),
                scenario.limit,
                deadline,
            ));
        }
        let tallies = tokio::time::timeout(self.duration + DRAIN_GRACE, tasks.join_all())
            .await
            .map_err(|_| {
                format!("{contender} did not finish within {DRAIN_GRACE:?} of its deadline")
            })?;
        let elapsed = started.elapsed();
        let cpu_after = server_cpu_us(&mut server.control).await?;
        keys.delete(&mut server.control).await?;

        let mut latencies_ns = Vec::new();
        let mut acquired = 0;
        for tally in tallies {
            let tally = tally?;
            acquired += tally.acquired;
            latencies_ns.extend(tally.latencies_ns);
        }
        latencies_ns.sort_unstable();
        Ok(Measurement {
            scenario,
            contender,
            rep,
            pairs: latencies_ns.len() as u64,
            acquired,
            elapsed,
            p50_us: crate::sample::percentile(&latencies_ns, 0.50) / 1e3,
            p99_us: crate::sample::percentile(&latencies_ns, 0.99) / 1e3,
            server_cpu_us: cpu_after - cpu_before,
            bytes_per_holder,
        })
    }
}

struct Tally {
    acquired: u64,
    latencies_ns: Vec<u64>,
}

/// One connection running pairs back to back until the deadline.
async fn drive(
    contender: Contender,
    mut conn: MultiplexedConnection,
    keys: Arc<Keys>,
    scripts: Arc<Scripts>,
    limit: u64,
    deadline: Instant,
) -> Result<Tally, BoxError> {
    let mut tally = Tally {
        acquired: 0,
        latencies_ns: Vec::with_capacity(64 * 1024),
    };
    while tally.latencies_ns.len() < MAX_PAIRS_PER_CONNECTION && Instant::now() < deadline {
        let started = Instant::now();
        let acquired = contender.pair(&mut conn, &keys, &scripts, limit).await?;
        tally.latencies_ns.push(started.elapsed().as_nanos() as u64);
        tally.acquired += u64::from(acquired);
    }
    Ok(tally)
}

/// CPU time of the server's main thread in µs. Redis before 6.2 reports only
/// whole-process figures, which is the closest substitute there.
pub async fn server_cpu_us(conn: &mut MultiplexedConnection) -> Result<f64, BoxError> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let seconds = match (
        field("used_cpu_user_main_thread"),
        field("used_cpu_sys_main_thread"),
    ) {
        (Some(user), Some(sys)) => user + sys,
        _ => match (field("used_cpu_user"), field("used_cpu_sys")) {
            (Some(user), Some(sys)) => user + sys,
            _ => return Err("INFO cpu reports no CPU time".into()),
        },
    };
    Ok(seconds * 1e6)
}
