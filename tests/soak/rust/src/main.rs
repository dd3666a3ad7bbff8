//! The soak's Rust worker: SOAK_THREADS threads, each with its own `redsem_client::Cluster`
//! over the redis crate's `ClusterClient`, take permits of the soak's names through the sync
//! API and log every call as one JSON line (the protocol of tests/soak/README.md; the
//! environment as for worker.py).

use std::env;
use std::fs::OpenOptions;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::cluster::ClusterClient;
use redsem_client::{Cluster, Error, Semaphore};

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A small seeded generator (xorshift64*), so that a seed repeats a run's choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn pick<T: Copy>(&mut self, list: &[T]) -> T {
        list[(self.next() * list.len() as f64) as usize % list.len()]
    }
}

struct Record {
    fields: Vec<(String, String)>,
}

impl Record {
    fn new(base: &[(String, String)], op: &str) -> Self {
        let mut fields = base.to_vec();
        fields.push(("op".into(), quote(op)));
        Record { fields }
    }
    fn set(&mut self, key: &str, json: String) {
        self.fields.push((key.into(), json));
    }
    fn out(&self) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == "out")
            .map(|(_, v)| v.as_str())
    }
    /// Runs `f`, filling the times and outcome.
    fn call<T>(&mut self, f: impl FnOnce() -> Result<T, Error>) -> Option<T> {
        self.set("t0", now_us().to_string());
        let result = f();
        self.set("t1", now_us().to_string());
        match result {
            Ok(value) => Some(value),
            Err(Error::NotAcquired) => {
                self.set("out", quote("not-acquired"));
                None
            }
            Err(err @ Error::NotDurable { .. }) => {
                self.set("out", quote("not-durable"));
                self.set("err", quote(&err.to_string()));
                None
            }
            Err(Error::Lost) => {
                self.set("out", quote("lost"));
                None
            }
            Err(err) => {
                self.set("out", quote("error"));
                self.set("err", quote(&format!("{err:?}: {err}")));
                None
            }
        }
    }
    fn line(&self) -> String {
        let body: Vec<String> = self
            .fields
            .iter()
            .map(|(k, v)| format!("{}:{v}", quote(k)))
            .collect();
        format!("{{{}}}\n", body.join(","))
    }
}

fn main() {
    let var = |k: &str| env::var(k).unwrap_or_default();
    let out = Arc::new(Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(var("SOAK_OUT"))
            .expect("SOAK_OUT"),
    ));
    let names: Vec<(String, u32, bool)> = var("SOAK_NAMES")
        .split(',')
        .map(|n| {
            let parts: Vec<&str> = n.split('=').collect();
            (
                parts[0].to_string(),
                parts[1].parse().unwrap(),
                parts[2] == "fair",
            )
        })
        .collect();
    let seconds: f64 = var("SOAK_SECONDS").parse().unwrap();
    let threads: usize = var("SOAK_THREADS").parse().unwrap_or(2);
    let seed: u64 = var("SOAK_SEED").parse().unwrap_or(1);
    let retry_for: f64 = var("SOAK_RETRY_FOR").parse().unwrap_or(10.0);
    let durable_allowed = var("SOAK_DURABLE") == "1";
    let nodes: Vec<String> = var("SOAK_NODES")
        .split(',')
        .map(|n| format!("redis://{n}/"))
        .collect();
    let worker = var("SOAK_WORKER");
    let end = Instant::now() + Duration::from_secs_f64(seconds);

    let mut handles = Vec::new();
    for index in 0..threads {
        let (names, nodes, worker, out) =
            (names.clone(), nodes.clone(), worker.clone(), out.clone());
        handles.push(thread::spawn(move || {
            let mut rng = Rng((seed * 1000 + index as u64) | 1);
            let me = format!("{worker}.{index}");
            let client = ClusterClient::new(nodes).expect("cluster client");
            let cluster = Cluster::new(client).retry_for(Duration::from_secs_f64(retry_for));
            let log = |r: &Record| out.lock().unwrap().write_all(r.line().as_bytes()).unwrap();
            let mut seq = 0;
            while Instant::now() < end {
                seq += 1;
                let (name, limit, fair) =
                    names[(rng.next() * names.len() as f64) as usize % names.len()].clone();
                let lease = rng.pick(&[2.0, 3.0]);
                let wait = rng.pick(&[0.0, 0.0, 1.0, 3.0]);
                let durable = durable_allowed && rng.next() < 0.2;
                let base = vec![
                    ("w".to_string(), quote(&me)),
                    ("p".to_string(), quote(&format!("{me}#{seq}"))),
                    ("name".to_string(), quote(&name)),
                    ("limit".to_string(), limit.to_string()),
                    ("lease".to_string(), ((lease * 1000.0) as u64).to_string()),
                    (
                        "retry_for".to_string(),
                        ((retry_for * 1000.0) as u64).to_string(),
                    ),
                ];
                let lease_d = Duration::from_secs_f64(lease);
                let mut sem = Semaphore::new(cluster.clone(), name.clone())
                    .limit(limit)
                    .lease(lease_d)
                    .fair(fair)
                    .wait((wait > 0.0).then(|| Duration::from_secs_f64(wait)))
                    .auto_refresh(false);
                if durable {
                    sem = sem.durable(1, Duration::from_millis(500));
                }
                let mut rec = Record::new(&base, "acquire");
                rec.set("fair", fair.to_string());
                rec.set("wait", ((wait * 1000.0) as u64).to_string());
                rec.set("durable", durable.to_string());
                let started = Instant::now();
                let permit = rec.call(|| sem.acquire());
                let took = started.elapsed();
                if let Some(permit) = &permit {
                    rec.set("out", quote("ok"));
                    if let Some(ticket) = permit.ticket() {
                        rec.set("ticket", ticket.to_string());
                    }
                    rec.set("id", quote(permit.id()));
                }
                log(&rec);
                let Some(permit) = permit else {
                    thread::sleep(Duration::from_secs_f64(rng.next() * 0.2));
                    continue;
                };
                let refresh = || {
                    let mut r = Record::new(&base, "refresh");
                    if let Some(held) = r.call(|| permit.refresh()) {
                        r.set("out", quote(if held { "ok" } else { "lost" }));
                    }
                    log(&r);
                    r.out() == Some("\"ok\"")
                };
                let check = || {
                    let mut r = Record::new(&base, "check");
                    if r.call(|| permit.check()).is_some() {
                        r.set("out", quote("ok"));
                    }
                    log(&r);
                    r.out() == Some("\"ok\"")
                };
                // A wait for the grant leaves the lease's start unknown: confirm it, as the
                // package does.
                let mut held = true;
                if took > lease_d / 3 {
                    held = refresh();
                }
                if rng.next() < 0.15 {
                    // Overstay: the release should report the loss.
                    thread::sleep(lease_d + Duration::from_millis(300));
                } else {
                    let hold_end = Instant::now() + lease_d.mul_f64(rng.next() * 1.6);
                    while held && Instant::now() < hold_end {
                        let left = hold_end.saturating_duration_since(Instant::now());
                        thread::sleep(left.min(lease_d / 3));
                        if Instant::now() < hold_end {
                            held = check() && refresh();
                        }
                    }
                }
                let mut r = Record::new(&base, "release");
                if let Some(released) = r.call(|| permit.release()) {
                    r.set("out", quote(if released { "ok" } else { "lost" }));
                }
                log(&r);
                thread::sleep(Duration::from_secs_f64(rng.next() * 0.1));
            }
        }));
    }
    for handle in handles {
        handle.join().expect("a worker thread panicked");
    }
}
