//! The Markdown report (machine, command, tables, ratios against the issues'
//! targets) and the raw TSV rows.

use std::fmt::Write;

use redis::aio::MultiplexedConnection;

use crate::cli::Settings;
use crate::contenders::Contender;
use crate::handoff::{self, HandoffContender, HandoffMeasurement, HandoffSummary};
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

/// One row per hand-off measurement, every figure unrounded.
pub fn handoff_tsv(measurements: &[HandoffMeasurement]) -> String {
    let mut out = String::from(
        "contender\trep\tclients\tgrants\thandoffs\trefusals\telapsed_s\thandoffs_per_s\t\
         p50_us\tp99_us\tserver_cpu_us\tcpu_us_per_handoff\tclient_cpu_us\tgrants_min\tgrants_max\t\
         fair_share\n",
    );
    for m in measurements {
        let (min, max) = m
            .grants_min_max
            .map_or((String::new(), String::new()), |(min, max)| {
                (min.to_string(), max.to_string())
            });
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{:.6}\t{:.1}\t{:.1}\t{:.1}\t{:.0}\t{:.2}\t{:.0}\t{min}\t{max}\t{:.1}",
            m.contender,
            m.rep + 1,
            m.clients,
            m.grants,
            m.handoffs,
            m.refusals,
            m.elapsed.as_secs_f64(),
            m.handoffs_per_sec(),
            m.p50_us,
            m.p99_us,
            m.server_cpu_us,
            m.cpu_us_per_handoff(),
            m.client_cpu_us,
            m.fair_share(),
        );
    }
    out
}

pub fn markdown(
    env: &Environment,
    plain_env: Option<&Environment>,
    settings: &Settings,
    measurements: &[Measurement],
    summaries: &[Summary],
    handoffs: &[HandoffSummary],
) -> String {
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
    if !summaries.is_empty() {
        pairs_table(&mut out, settings, measurements, summaries);
        filter_table(&mut out, plain_env, measurements, summaries);
    }
    if !handoffs.is_empty() {
        handoff_section(&mut out, settings, handoffs);
    }
    out
}

fn pairs_table(
    out: &mut String,
    settings: &Settings,
    measurements: &[Measurement],
    summaries: &[Summary],
) {
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
    let base = reference_scenario(settings);
    ratio_table(
        out,
        &format!("Ratios of medians from this run, at {base} unless the row says otherwise:"),
        &ratios(settings, measurements, summaries),
    );
}

/// The floor against the server with the module beside the same floor
/// against the server without it, scenario by scenario.
fn filter_table(
    out: &mut String,
    plain_env: Option<&Environment>,
    measurements: &[Measurement],
    summaries: &[Summary],
) {
    let rows: Vec<(&Summary, &Summary)> = summaries
        .iter()
        .filter(|s| s.contender == Contender::Floor)
        .filter_map(|with| {
            stats::find(summaries, with.scenario, Contender::FloorPlain)
                .map(|without| (with, without))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let pinned = plain_env.map_or(String::new(), |e| {
        format!(", pinned to CPU {}", e.server_cpus)
    });
    let _ = writeln!(
        out,
        "\nWhat the module's command filter costs other commands: `{}` against the server with \
         the module, `{}` against a second redis-server started with the same flags without it{pinned}, \
         interleaved in the same run (only one of them is loaded at a time). Ratios module / no \
         module of the medians, and the lowest and highest ratio of the repetitions run back to \
         back; 1 means the filter costs nothing measurable.\n\n\
         | Scenario | pairs/s, module / no module | per repetition | server CPU/pair, module / no module | per repetition |\n\
         | --- | ---: | ---: | ---: | ---: |",
        Contender::Floor.label(),
        Contender::FloorPlain.label(),
    );
    for (with, without) in rows {
        let paired = |f: fn(&Measurement) -> f64| {
            let floors = (Contender::Floor, Contender::FloorPlain);
            paired_ratio(measurements, floors, |s| s == with.scenario, f)
                .map_or("–".into(), |(s, _)| format!("{:.3}–{:.3}", s.min, s.max))
        };
        let _ = writeln!(
            out,
            "| {} | {:.3} | {} | {:.3} | {} |",
            with.scenario,
            with.pairs_per_sec.median / without.pairs_per_sec.median,
            paired(Measurement::pairs_per_sec),
            with.cpu_us_per_pair.median / without.cpu_us_per_pair.median,
            paired(Measurement::cpu_us_per_pair),
        );
    }
}

fn handoff_section(out: &mut String, settings: &Settings, summaries: &[HandoffSummary]) {
    let _ = writeln!(
        out,
        "\nHand-off: limit 1, {} clients, each looping acquire → release as soon as granted → \
         acquire again (lease {} s; `WAIT {}`; the polling client sleeps {} ms after each nil), \
         and the floor: one connection sending `INCR`s one after the other, the limit of a chain \
         of hand-offs that each need one round trip. {} × {:.2} s per contender, interleaved; \
         median (min–max) over the repetitions. A hand-off is a grant to another client than \
         the previous grant's; its latency runs from the previous holder's release being sent \
         to the next holder reading its grant, both on the load generator's monotonic clock \
         (for the floor: one `INCR`'s round trip). Server CPU per hand-off counts everything the \
         server did, polls and waits included; server and load generator busy are the shares of \
         the wall time each was on its CPU (both well below 100%: the chain is bound by latency). Grants per client: the most one client got over \
         the fair share (grants / clients), and the fair share over the fewest, from the most \
         uneven repetition.\n\n\
         | Contender | hand-offs/s | grants/s | p50 µs | p99 µs | server CPU µs/hand-off | server busy | load generator busy | most / fair share | fair share / fewest | nil replies/s |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        settings.handoff_clients,
        handoff::LEASE_SECS,
        handoff::WAIT_SECS,
        handoff::POLL_INTERVAL.as_millis(),
        settings.reps,
        settings.duration.as_secs_f64(),
    );
    let rate = |v: f64| group_thousands(v.round() as u64);
    for s in summaries {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.contender.label(),
            with_range(s.handoffs_per_sec, rate),
            rate(s.grants_per_sec.median),
            short(s.p50_us.median),
            short(s.p99_us.median),
            with_range(s.cpu_us_per_handoff, short),
            percent(s.server_busy.median),
            percent(s.client_busy.median),
            s.max_over_fair
                .map_or("–".into(), |v| finite_or_infinity(v, 2)),
            s.fair_over_min
                .map_or("–".into(), |v| finite_or_infinity(v, 2)),
            rate(s.refusals_per_sec.median),
        );
    }
    ratio_table(
        out,
        &format!(
            "Hand-off targets for {}, ratios of medians from this run:",
            HandoffContender::FairWait.label()
        ),
        &handoff_ratios(summaries),
    );
}

/// The hand-off targets: fair `WAIT` against 1 ms, the polling client, the
/// round-trip floor and the fair share.
fn handoff_ratios(summaries: &[HandoffSummary]) -> Vec<Ratio> {
    let mut out = Vec::new();
    let Some(fair) = handoff::find(summaries, HandoffContender::FairWait) else {
        return out;
    };
    out.push(Ratio {
        what: "p50 hand-off latency / 1 ms".into(),
        value: fair.p50_us.median / 1000.0,
        target: Target::Below(1.0),
    });
    if let Some(poll) = handoff::find(summaries, HandoffContender::Poll) {
        out.push(Ratio {
            what: format!("hand-offs/s / {}'s", poll.contender.label()),
            value: fair.handoffs_per_sec.median / poll.handoffs_per_sec.median,
            target: Target::AtLeast(10.0),
        });
        out.push(Ratio {
            what: format!("server CPU per hand-off / {}'s", poll.contender.label()),
            value: fair.cpu_us_per_handoff.median / poll.cpu_us_per_handoff.median,
            target: Target::Below(1.0),
        });
    }
    if let Some(floor) = handoff::find(summaries, HandoffContender::RoundTrip) {
        out.push(Ratio {
            what: format!("hand-offs/s / {}, round trips/s", floor.contender.label()),
            value: fair.handoffs_per_sec.median / floor.handoffs_per_sec.median,
            target: Target::AtLeast(0.7),
        });
    }
    if let (Some(most), Some(fewest)) = (fair.max_over_fair, fair.fair_over_min) {
        out.push(Ratio {
            what: "most grants of one client / fair share (most uneven repetition)".into(),
            value: most,
            target: Target::AtMost(2.0),
        });
        out.push(Ratio {
            what: "fair share / fewest grants of one client (most uneven repetition)".into(),
            value: fewest,
            target: Target::AtMost(2.0),
        });
    }
    out
}

fn ratio_table(out: &mut String, intro: &str, ratios: &[Ratio]) {
    if ratios.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n{intro}\n\n| Ratio | Value | Target | |\n| --- | ---: | ---: | --- |"
    );
    for r in ratios {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            r.what,
            finite_or_infinity(r.value, 3),
            r.target,
            if r.target.met_by(r.value) {
                "met"
            } else {
                "**missed**"
            },
        );
    }
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
    Below(f64),
}

impl Target {
    fn met_by(self, value: f64) -> bool {
        match self {
            Target::AtLeast(t) => value >= t,
            Target::AtMost(t) => value <= t,
            Target::Below(t) => value < t,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::AtLeast(t) => write!(f, "≥ {t}"),
            Target::AtMost(t) => write!(f, "≤ {t}"),
            Target::Below(t) => write!(f, "< {t}"),
        }
    }
}

struct Ratio {
    what: String,
    value: f64,
    target: Target,
}

/// The targets, each from whichever contenders this run included.
fn ratios(settings: &Settings, measurements: &[Measurement], summaries: &[Summary]) -> Vec<Ratio> {
    let base = reference_scenario(settings);
    let get = |scenario, contender| stats::find(summaries, scenario, contender);
    let mut out = Vec::new();
    if let Some(fair) = get(base, Contender::RedsemFair) {
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
    }
    let most = settings.holders[settings.holders.len() - 1];
    if most != base.holders {
        let crowded = Scenario {
            holders: most,
            ..base
        };
        for contender in [
            Contender::RedsemFair,
            Contender::Redsem,
            Contender::RedsemCount4,
        ] {
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
    // Paired: each repetition of the weighted contender ran right after the
    // same repetition of SEM.ACQUIRE, so on a shared machine the median of
    // their ratios drifts less than the ratio of the two medians (shown too).
    if let (Some(weighted), Some(single), Some((paired, n))) = (
        get(base, Contender::RedsemCount4),
        get(base, Contender::Redsem),
        paired_ratio(
            measurements,
            (Contender::RedsemCount4, Contender::Redsem),
            |s| s == base,
            Measurement::pairs_per_sec,
        ),
    ) {
        out.push(Ratio {
            what: format!(
                "{} / {} (COUNT 1), pairs/s (median over {n} pairs of repetitions run back \
                 to back; ratio of medians {:.3})",
                weighted.contender.label(),
                single.contender.label(),
                weighted.pairs_per_sec.median / single.pairs_per_sec.median,
            ),
            value: paired.median,
            target: Target::AtLeast(0.85),
        });
    }
    // "Not slower within noise": 5 % either way, about the spread of the
    // floor's own repetitions on a shared machine. The floor ignores the
    // limit and N, so every scenario at full concurrency runs the same
    // workload: the median over all their back-to-back pairs of repetitions
    // is a steadier figure than one scenario's.
    let floors = (Contender::Floor, Contender::FloorPlain);
    let full = |s: Scenario| s.connections == base.connections;
    if let (Some((rate, n)), Some((cpu, _))) = (
        paired_ratio(measurements, floors, full, Measurement::pairs_per_sec),
        paired_ratio(measurements, floors, full, Measurement::cpu_us_per_pair),
    ) {
        let what = |figure: &str| {
            format!(
                "{} / {}, {figure} (median over {n} pairs of repetitions run back to back, \
                 from every {}-connection scenario)",
                Contender::Floor.label(),
                Contender::FloorPlain.label(),
                base.connections,
            )
        };
        out.push(Ratio {
            what: what("pairs/s"),
            value: rate.median,
            target: Target::AtLeast(0.95),
        });
        out.push(Ratio {
            what: what("server CPU per pair"),
            value: cpu.median,
            target: Target::AtMost(1.05),
        });
    }
    out
}

/// The median of `f(a) / f(b)` over the repetitions of contenders `a` and
/// `b` run back to back (same scenario, same repetition) in the scenarios
/// `which` selects, and how many such pairs there were.
fn paired_ratio(
    measurements: &[Measurement],
    (a, b): (Contender, Contender),
    which: impl Fn(Scenario) -> bool,
    f: fn(&Measurement) -> f64,
) -> Option<(Spread, usize)> {
    let ratios: Vec<f64> = measurements
        .iter()
        .filter(|m| m.contender == a && which(m.scenario))
        .filter_map(|m| {
            measurements
                .iter()
                .find(|o| o.contender == b && o.scenario == m.scenario && o.rep == m.rep)
                .map(|o| f(m) / f(o))
        })
        .collect();
    let n = ratios.len();
    Spread::of(ratios).map(|s| (s, n))
}

/// A figure with `decimals` decimals, or ∞ (a ratio over a zero).
fn finite_or_infinity(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}")
    } else {
        "∞".into()
    }
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
