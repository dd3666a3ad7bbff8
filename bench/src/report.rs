//! The Markdown report (machine, command, table, ratios against the issue's
//! targets) and the raw TSV rows.

use std::fmt::Write;

use redis::aio::MultiplexedConnection;

use crate::cli::Settings;
use crate::contenders::Contender;
use crate::scenarios::{Measurement, Scenario, UNCONTENDED_LIMIT};
use crate::stats::{self, Spread, Summary};
use crate::BoxError;

/// Where and how the numbers were taken, for the report's header.
pub struct Environment {
    cpu_model: String,
    cores: usize,
    redis_version: String,
    server_cpus: String,
    client_cpus: String,
}

impl Environment {
    pub async fn probe(conn: &mut MultiplexedConnection) -> Result<Environment, BoxError> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        // The server runs on this machine (loopback only), so its affinity
        // can be read straight from /proc.
        let server_cpus = field("process_id")
            .map(|pid| allowed_cpus(&format!("/proc/{pid}/status")))
            .unwrap_or_else(|| "?".into());
        Ok(Environment {
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
                .unwrap_or_else(|| "unknown CPU".into()),
            // /proc/cpuinfo rather than the affinity mask, which pinning narrows.
            cores: cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count(),
            redis_version: field("redis_version").unwrap_or_else(|| "?".into()),
            server_cpus,
            client_cpus: allowed_cpus("/proc/self/status"),
        })
    }
}

fn allowed_cpus(status_path: &str) -> String {
    std::fs::read_to_string(status_path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

/// One row per measurement, every figure unrounded.
pub fn tsv(measurements: &[Measurement]) -> String {
    let mut out = String::from(
        "scenario\tconnections\tlimit\tholders\tcontender\trep\tpairs\tacquired\telapsed_s\t\
         pairs_per_s\tp50_us\tp99_us\tserver_cpu_us\tcpu_us_per_pair\tbytes_per_holder\n",
    );
    for m in measurements {
        let s = m.scenario;
        let bytes = m
            .bytes_per_holder
            .map_or(String::new(), |b| format!("{b:.1}"));
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{s}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.6}\t{:.1}\t{:.1}\t{:.1}\t{:.0}\t{:.2}\t{bytes}",
            s.connections,
            s.limit,
            s.holders,
            m.contender,
            m.rep + 1,
            m.pairs,
            m.acquired,
            m.elapsed.as_secs_f64(),
            m.pairs_per_sec(),
            m.p50_us,
            m.p99_us,
            m.server_cpu_us,
            m.cpu_us_per_pair(),
        );
    }
    out
}

pub fn markdown(env: &Environment, settings: &Settings, summaries: &[Summary]) -> String {
    let mut out = String::new();
    let pinning = if env.server_cpus == env.client_cpus {
        format!("server and load generator share CPUs {}", env.server_cpus)
    } else {
        format!(
            "server pinned to CPU {}, load generator to CPU {}",
            env.server_cpus, env.client_cpus
        )
    };
    let _ = writeln!(
        out,
        "Machine: {}, {} cores; redis {}; {pinning}.\n\n\
         Command: `{}`; {} × {:.2} s per contender and scenario, interleaved; \
         median (min–max) over the repetitions. A pair is one acquire attempt plus its \
         release if it succeeded; latency is per pair; server CPU is the main thread's \
         user + sys, and server busy the share of the wall time it \
         took (near 100% the server is the bottleneck, well below it the load generator).\n",
        env.cpu_model,
        env.cores,
        env.redis_version,
        settings.invoked_as,
        settings.reps,
        settings.duration.as_secs_f64(),
    );
    out.push_str(
        "| Scenario | Contender | pairs/s | p50 µs | p99 µs | server CPU µs/pair | server busy | acquired | bytes/holder |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut previous = None;
    for s in summaries {
        // The scenario is named once, on the first row of its group.
        let scenario = if previous == Some(s.scenario) {
            String::new()
        } else {
            s.scenario.to_string()
        };
        previous = Some(s.scenario);
        let _ = writeln!(
            out,
            "| {scenario} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.contender.label(),
            with_range(s.pairs_per_sec, |v| group_thousands(v.round() as u64)),
            short(s.p50_us.median),
            short(s.p99_us.median),
            with_range(s.cpu_us_per_pair, short),
            percent(s.server_busy.median),
            percent(s.acquired_share.median),
            s.bytes_per_holder
                .map_or("–".into(), |b| format!("{:.0}", b.median)),
        );
    }
    let ratios = ratios(settings, summaries);
    if !ratios.is_empty() {
        let base = reference_scenario(settings);
        let _ = writeln!(
            out,
            "\nRatios of medians from this run, at {base} unless the row says otherwise:\n\n\
             | Ratio | Value | Target | |\n| --- | ---: | ---: | --- |"
        );
        for r in ratios {
            let _ = writeln!(
                out,
                "| {} | {:.3} | {} | {} |",
                r.what,
                r.value,
                r.target,
                if r.target.met_by(r.value) {
                    "met"
                } else {
                    "**missed**"
                },
            );
        }
    }
    out
}

/// The scenario the targets are stated for: full concurrency,
/// limit 1,000,000, the fewest pre-filled holders (N = 10 by default).
fn reference_scenario(settings: &Settings) -> Scenario {
    Scenario {
        connections: settings.connections,
        limit: UNCONTENDED_LIMIT,
        holders: settings.holders[0],
    }
}

#[derive(Clone, Copy)]
enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    fn met_by(self, value: f64) -> bool {
        match self {
            Target::AtLeast(t) => value >= t,
            Target::AtMost(t) => value <= t,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::AtLeast(t) => write!(f, "≥ {t}"),
            Target::AtMost(t) => write!(f, "≤ {t}"),
        }
    }
}

struct Ratio {
    what: String,
    value: f64,
    target: Target,
}

/// The targets, each from whichever contenders this run included.
fn ratios(settings: &Settings, summaries: &[Summary]) -> Vec<Ratio> {
    let base = reference_scenario(settings);
    let get = |scenario, contender| stats::find(summaries, scenario, contender);
    let mut out = Vec::new();
    let Some(fair) = get(base, Contender::RedsemFair) else {
        return out;
    };
    let rate_targets = [
        (Contender::Floor, 0.9),
        (Contender::RecipeMulti, 2.0),
        (Contender::RecipeLua, 2.0),
        (Contender::NonFairLua, 1.2),
    ];
    for (other, target) in rate_targets {
        if let Some(o) = get(base, other) {
            out.push(Ratio {
                what: format!("{} / {}, pairs/s", fair.contender.label(), other.label()),
                value: fair.pairs_per_sec.median / o.pairs_per_sec.median,
                target: Target::AtLeast(target),
            });
        }
    }
    if let Some(floor) = get(base, Contender::Floor) {
        out.push(Ratio {
            what: format!(
                "{} / {}, server CPU per pair",
                fair.contender.label(),
                Contender::Floor.label()
            ),
            value: fair.cpu_us_per_pair.median / floor.cpu_us_per_pair.median,
            target: Target::AtMost(1.3),
        });
    }
    let most = settings.holders[settings.holders.len() - 1];
    if most != base.holders {
        let crowded = Scenario {
            holders: most,
            ..base
        };
        for contender in [Contender::RedsemFair, Contender::Redsem] {
            if let (Some(low), Some(high)) = (get(base, contender), get(crowded, contender)) {
                out.push(Ratio {
                    what: format!(
                        "{} at N={} / at N={}, pairs/s",
                        contender.label(),
                        group_thousands(most),
                        group_thousands(base.holders)
                    ),
                    value: high.pairs_per_sec.median / low.pairs_per_sec.median,
                    target: Target::AtLeast(0.8),
                });
            }
        }
    }
    out
}

fn with_range(s: Spread, fmt: impl Fn(f64) -> String) -> String {
    format!("{} ({}–{})", fmt(s.median), fmt(s.min), fmt(s.max))
}

/// Tenths of a µs only where they are not lost in the noise.
fn short(us: f64) -> String {
    if us < 100.0 {
        format!("{us:.1}")
    } else {
        group_thousands(us.round() as u64)
    }
}

/// Whole percents; CPU accounting can overshoot the wall clock a little,
/// which is still just "100%".
fn percent(share: f64) -> String {
    format!("{:.0}%", (share * 100.0).min(100.0))
}

/// 1000000 → "1,000,000".
pub fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits_by_thousands() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1_000), "1,000");
        assert_eq!(group_thousands(1_000_000), "1,000,000");
    }
}
