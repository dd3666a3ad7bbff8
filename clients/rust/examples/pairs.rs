//! What the package costs over a raw client: acquire + release pairs through redsem-client
//! against a raw client sending the same commands (`SEM.ACQUIRE` / `SEM.RELEASE`, or the
//! script's `EVALSHA`), side by side in one run: each round runs its pairs in chunks of 50,
//! the package's and the raw client's in turn (which goes first alternates by round), sync and
//! async, with the module and without it. It starts its own two
//! servers, one with the module and one without:
//!
//! ```text
//! REDSEM_MODULE=$PWD/target/release/libredsem.so \
//!     cargo run --release -p redsem-client --example pairs [-- rounds pairs_per_round]
//! ```
//!
//! `REDIS_SERVER` names the server binary (default `redis-server`). It prints, per backend and
//! API, the ratio package ÷ raw: over the whole run, and the median and range of the rounds'.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::{Client, Cmd};

const LIMIT: u32 = 5;
const LEASE: Duration = Duration::from_secs(30);
const SCRIPT: &str = include_str!("../src/redsem.lua");

struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(module: Option<&str>) -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let mut command = Command::new(binary);
    command
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null());
    if let Some(module) = module {
        command.args(["--loadmodule", module]);
    }
    let child = command.spawn().expect("cannot start redis-server");
    let url = format!("redis://127.0.0.1:{port}/");
    let client = Client::open(url.as_str()).unwrap();
    let started = Instant::now();
    while client
        .get_connection()
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_err()
    {
        assert!(started.elapsed() < Duration::from_secs(10), "no server");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server { child, url }
}

/// The commands the package sends for a pair, as a raw client would build them.
struct Raw {
    scripts: bool,
    first_sha: String,
    sha: String,
}

impl Raw {
    fn new(scripts: bool, conn: &mut redis::Connection) -> Raw {
        let rest = SCRIPT.strip_prefix("#!lua flags=allow-oom").unwrap();
        let first = format!("#!lua{rest}");
        let load = |text: &str, conn: &mut redis::Connection| -> String {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(text)
                .query(conn)
                .unwrap()
        };
        let (first_sha, sha) = match scripts {
            true => (load(&first, conn), load(SCRIPT, conn)),
            false => (String::new(), String::new()),
        };
        Raw {
            scripts,
            first_sha,
            sha,
        }
    }

    fn command(&self, op: &str, name: &str, first: bool, args: &[&str]) -> Cmd {
        if !self.scripts {
            let mut cmd = redis::cmd(&format!("SEM.{op}"));
            cmd.arg(name).arg(args);
            return cmd;
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(if first { &self.first_sha } else { &self.sha })
            .arg(6)
            .arg(name);
        for suffix in [":owner", ":counter", ":permits", ":limit", ":wake"] {
            cmd.arg(format!("{name}{suffix}"));
        }
        cmd.arg(op).arg(args);
        cmd
    }

    fn acquire(&self, name: &str, id: &str) -> Cmd {
        let limit = LIMIT.to_string();
        let lease = format!("{}.000", LEASE.as_secs());
        self.command("ACQUIRE", name, true, &[&limit, &lease, "ID", id])
    }

    fn release(&self, name: &str, id: &str) -> Cmd {
        self.command("RELEASE", name, false, &[id])
    }
}

/// This thread's CPU time so far (`/proc/thread-self/schedstat`, in nanoseconds): what the
/// client itself spends, apart from the server and the machine's other load. Every pair runs
/// on this thread (the async ones on a current-thread runtime).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = stat.split_whitespace().next().and_then(|n| n.parse().ok());
    Duration::from_nanos(ns.unwrap_or(0))
}

/// A run's wall time and CPU time.
#[derive(Clone, Copy, Default)]
struct Took {
    wall: Duration,
    cpu: Duration,
}

impl Took {
    fn add(&mut self, started: Instant, cpu_before: Duration) {
        self.wall += started.elapsed();
        self.cpu += cpu() - cpu_before;
    }
}

/// Pairs go in chunks of this many, the package's and the raw client's in turn, so that both
/// meet the same load of a busy machine.
const CHUNK: usize = 50;

/// Per round, the package's time and the raw client's.
struct Rounds(Vec<(Took, Took)>);

impl Rounds {
    fn report(&self, what: &str, pairs: usize) {
        let package: Duration = self.0.iter().map(|r| r.0.wall).sum();
        let raw: Duration = self.0.iter().map(|r| r.1.wall).sum();
        let package_cpu: Duration = self.0.iter().map(|r| r.0.cpu).sum();
        let raw_cpu: Duration = self.0.iter().map(|r| r.1.cpu).sum();
        let mut ratios: Vec<f64> = self
            .0
            .iter()
            .map(|(p, r)| p.wall.as_secs_f64() / r.wall.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        let per_pair = |total: Duration| total.as_secs_f64() * 1e6 / (pairs * self.0.len()) as f64;
        println!(
            "{what:<16} package {:>6.1} µs/pair  raw {:>6.1} µs/pair  ratio {:.2} \
             (rounds: median {:.2}, {:.2}–{:.2}); client CPU {:.1} vs {:.1} µs/pair",
            per_pair(package),
            per_pair(raw),
            package.as_secs_f64() / raw.as_secs_f64(),
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
            per_pair(package_cpu),
            per_pair(raw_cpu),
        );
    }
}

fn sync_pairs(url: &str, scripts: bool, rounds: usize, pairs: usize) -> Rounds {
    let client = Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    let raw = Raw::new(scripts, &mut conn);
    let semaphore = redsem_client::Semaphore::new(client.clone(), "bench").limit(LIMIT);
    let mut out = Vec::new();
    for round in 0..=rounds {
        let mut times = [Took::default(); 2];
        for chunk in 0..(pairs / CHUNK).max(1) * 2 {
            let package_now = (chunk + round) % 2 == 0;
            let (started, cpu_before) = (Instant::now(), cpu());
            for _ in 0..CHUNK {
                if package_now {
                    let permit = semaphore.acquire().unwrap();
                    assert!(permit.release().unwrap());
                } else {
                    let id = uuid::Uuid::new_v4().to_string();
                    let granted: redis::Value = raw.acquire("raw", &id).query(&mut conn).unwrap();
                    assert!(granted != redis::Value::Nil);
                    let released: redis::Value = raw.release("raw", &id).query(&mut conn).unwrap();
                    assert!(released != redis::Value::Nil);
                }
            }
            times[usize::from(!package_now)].add(started, cpu_before);
        }
        if round > 0 {
            out.push((times[0], times[1])); // round 0 warms up
        }
    }
    Rounds(out)
}

async fn aio_pairs(url: &str, scripts: bool, rounds: usize, pairs: usize) -> Rounds {
    let client = Client::open(url).unwrap();
    let raw = Raw::new(scripts, &mut client.get_connection().unwrap());
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let semaphore = redsem_client::aio::Semaphore::new(client.clone(), "bench").limit(LIMIT);
    let mut out = Vec::new();
    for round in 0..=rounds {
        let mut times = [Took::default(); 2];
        for chunk in 0..(pairs / CHUNK).max(1) * 2 {
            let package_now = (chunk + round) % 2 == 0;
            let (started, cpu_before) = (Instant::now(), cpu());
            for _ in 0..CHUNK {
                if package_now {
                    let permit = semaphore.acquire().await.unwrap();
                    assert!(permit.release().await.unwrap());
                } else {
                    let id = uuid::Uuid::new_v4().to_string();
                    let granted: redis::Value = raw
                        .acquire("raw", &id)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    assert!(granted != redis::Value::Nil);
                    let released: redis::Value = raw
                        .release("raw", &id)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    assert!(released != redis::Value::Nil);
                }
            }
            times[usize::from(!package_now)].add(started, cpu_before);
        }
        if round > 0 {
            out.push((times[0], times[1])); // round 0 warms up
        }
    }
    Rounds(out)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(10, |a| a.parse().expect("rounds"));
    let pairs: usize = args
        .next()
        .map_or(2000, |a| a.parse().expect("pairs per round"));
    let module = std::env::var("REDSEM_MODULE").expect("REDSEM_MODULE: the module's path");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("{rounds} rounds of {pairs} acquire + release pairs each, package ÷ raw client");
    for (backend, server) in [("module", start(Some(&module))), ("scripts", start(None))] {
        let scripts = backend == "scripts";
        sync_pairs(&server.url, scripts, rounds, pairs).report(&format!("{backend} sync"), pairs);
        runtime
            .block_on(aio_pairs(&server.url, scripts, rounds, pairs))
            .report(&format!("{backend} aio"), pairs);
    }
}
