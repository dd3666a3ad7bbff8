//! The Markdown report (machine, command, tables, ratios against the issues'
//! targets) and the raw TSV rows.

use std::fmt::Write;

use redis::aio::MultiplexedConnection;

use crate::cli::Settings;
use crate::contenders::Contender;
use crate::fmt::group_thousands;
use crate::handoff::{self, HandoffContender, HandoffMeasurement, HandoffSummary};
use crate::host::{self, HostResults};
use crate::scale::{self, ScaleResults};
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
         fair_share\thandoffs_per_s_vs_token_list\tcpu_per_handoff_vs_token_list\tp50_vs_token_list\n",
    );
    for m in measurements {
        // Against the token list's run of the same repetition, when there is one.
        let anchor = measurements
            .iter()
            .find(|o| o.contender == HandoffContender::TokenList && o.rep == m.rep);
        let vs = |f: fn(&HandoffMeasurement) -> f64| {
            anchor.map_or(String::new(), |a| format!("{:.4}", f(m) / f(a)))
        };
        let (min, max) = m
            .grants_min_max
            .map_or((String::new(), String::new()), |(min, max)| {
                (min.to_string(), max.to_string())
            });
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{:.6}\t{:.1}\t{:.1}\t{:.1}\t{:.0}\t{:.2}\t{:.0}\t{min}\t{max}\t{:.1}\t{}\t{}\t{}",
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
            vs(HandoffMeasurement::handoffs_per_sec),
            vs(HandoffMeasurement::cpu_us_per_handoff),
            vs(|m| m.p50_us),
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
    scale: Option<&ScaleResults>,
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
    if let Some(results) = scale {
        scale_section(&mut out, settings, results);
    }
    out
}

/// The host set's section of the report: instructions per request of other
/// commands, with the module in each state over without it, beside the
/// targets.
pub fn host_section(r: &HostResults) -> String {
    let mut out = String::new();
    let plan = &r.plan;
    let _ = writeln!(
        out,
        "\nHost: what the module costs the server's other commands, in instructions (callgrind \
         counts them exactly, whatever else the machine runs). Each server runs under \
         `valgrind --tool=callgrind --dump-instr=no` with `--save '' --appendonly no`, first \
         without the module, then, in the same process, after `MODULE LOAD {}` (so both sides \
         share the random hash seeds that decide which names share a bucket, of the command \
         table and of the keyspace, which separate processes do not: they differ by up to a \
         point and a half); `redis-benchmark -t {} -n {} -c {}` sends {} requests on keys of no \
         semaphore, between `callgrind_control -z` and `-d`, {} time(s) per count, the median \
         taken (one load moves with how many requests each turn of the event loop finds); \
         instructions per request are the server's instructions in that span (every thread) \
         over the requests. Without the module one client waits in `BLPOP` on an empty list \
         during the load; with it, the same `BLPOP` client in the first two states, then the \
         clients waiting on semaphores (each full, with a holder of a long lease) instead. The \
         states follow each other on one server with the module. Each is compared with the \
         server without the module holding the same data (the baseline column): while clients \
         wait, each waited semaphore's holder set is in the database, a sorted set whose key \
         expires at the lease's end, and a database with volatile keys makes every command \
         dearer (each key lookup also looks in the expires dict), the server's cost of holding \
         the data rather than the module's. So the states nobody waits in are compared with the \
         empty database, the state with 1 waiter with the same server after it wrote 1 holder \
         set, the one with {} waiters after {} (same names as the waited semaphores, each \
         `ZADD <name> <deadline_ms> <member>` and `PEXPIREAT <name> <deadline_ms>`, the \
         deadline a lease of {} s from then, as the client-side recipe writes them; the `BLPOP` \
         client still blocked). The ratio held against the target leaves out `serverCron` \
         (with what it calls: the server's housekeeping, ten times a second; for every second \
         the load lasts under valgrind it adds under 1 instruction per request on Valkey, about \
         10 on Redis 7.0 and 70 on Redis 8.2, more with many clients connected), which grows \
         with the load's wall time, not with its requests: counting it, as the last columns do, \
         a busy machine moves the ratio by several percent between runs. {} server(s) in {:.0} \
         s.\n\n\
         | Server | Module state | baseline (no module) | instructions/request outside \
         serverCron, baseline | with module | ratio | target | | all instructions/request, \
         baseline | with module | ratio | load s, baseline / module |\n\
         | --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
        plan.module.display(),
        host::TESTS,
        group_thousands(plan.requests),
        host::CLIENTS,
        group_thousands(plan.requests * host::TEST_COUNT),
        plan.reps,
        group_thousands(host::MANY_WAITERS as u64),
        group_thousands(host::MANY_WAITERS as u64),
        host::LEASE_MS / 1_000,
        r.servers.len(),
        r.elapsed.as_secs_f64(),
    );
    let per_request = |c: &host::Count| group_thousands(c.per_request().round() as u64);
    for server in &r.servers {
        for (i, (state, count)) in server.with.iter().enumerate() {
            let without = server.baseline(*state);
            let total = count.per_request() / without.per_request();
            // The binary may not name serverCron: then every instruction.
            let (lean_without, lean_with, ratio) = match (
                without.per_request_without_cron(),
                count.per_request_without_cron(),
            ) {
                (Some(a), Some(b)) => (a, b, b / a),
                _ => (without.per_request(), count.per_request(), total),
            };
            let target = Target::AtMost(state.target());
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {ratio:.3} | {target} | {} | {} | {} | {total:.3} | \
                 {:.0} / {:.0} |",
                if i == 0 { server.version.as_str() } else { "" },
                state.label(),
                baseline_label(state.holder_sets()),
                group_thousands(lean_without.round() as u64),
                group_thousands(lean_with.round() as u64),
                if target.met_by(ratio) {
                    "met"
                } else {
                    "**missed**"
                },
                per_request(without),
                per_request(count),
                without.load.as_secs_f64(),
                count.load.as_secs_f64(),
            );
        }
    }
    out
}

/// "empty", "1 holder set", "1,000 holder sets": what the database of a
/// state's baseline holds.
pub fn baseline_label(holder_sets: usize) -> String {
    match holder_sets {
        0 => "empty".into(),
        1 => "1 holder set".into(),
        n => format!("{} holder sets", group_thousands(n as u64)),
    }
}

fn host_ratio_without_cron(without: &host::Count, with: &host::Count) -> Option<f64> {
    Some(with.per_request_without_cron()? / without.per_request_without_cron()?)
}

/// One row per server and module state, every figure unrounded.
pub fn host_tsv(r: &HostResults) -> String {
    let mut out = String::from(
        "server\tpath\tstate\tbaseline\trequests\tinstructions_no_module\tinstructions_module\t\
         per_request_no_module\tper_request_module\tratio\ttarget\tmet\t\
         cron_instructions_no_module\tcron_instructions_module\tratio_without_cron\t\
         load_s_no_module\tload_s_module\n",
    );
    let optional = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    for server in &r.servers {
        for (state, count) in &server.with {
            let without = server.baseline(*state);
            let ratio = count.per_request() / without.per_request();
            let _ = writeln!(
                out,
                "{}\t{}\t{state}\t{}\t{}\t{}\t{}\t{:.1}\t{:.1}\t{ratio:.4}\t{}\t{}\t{}\t{}\t{}\t{:.2}\t{:.2}",
                server.version,
                server.path.display(),
                baseline_label(state.holder_sets()),
                count.requests,
                without.instructions,
                count.instructions,
                without.per_request(),
                count.per_request(),
                state.target(),
                // Judged as the report does: without serverCron when named.
                host_ratio_without_cron(without, count).unwrap_or(ratio) <= state.target(),
                optional(without.cron_instructions),
                optional(count.cron_instructions),
                host_ratio_without_cron(without, count)
                    .map_or(String::new(), |r| format!("{r:.4}")),
                without.load.as_secs_f64(),
                count.load.as_secs_f64(),
            );
        }
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
         uneven repetition. The token list (`BLPOP` to take the one token, `RPUSH` to give it \
         back, no lease) is Redis's own blocking hand-off, the speed anchor: the three \
         \"÷ token list\" columns are each contender's median over the token list's median \
         from this run.\n\n\
         | Contender | hand-offs/s | grants/s | p50 µs | p99 µs | server CPU µs/hand-off | server busy | load generator busy | most / fair share | fair share / fewest | nil replies/s | hand-offs/s ÷ token list | CPU/hand-off ÷ token list | p50 ÷ token list |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        settings.handoff_clients,
        handoff::LEASE_SECS,
        handoff::WAIT_SECS,
        handoff::POLL_INTERVAL.as_millis(),
        settings.reps,
        settings.duration.as_secs_f64(),
    );
    let rate = |v: f64| group_thousands(v.round() as u64);
    let anchor = handoff::find(summaries, HandoffContender::TokenList);
    let vs = |s: &HandoffSummary, f: fn(&HandoffSummary) -> Spread| {
        anchor.map_or("–".into(), |a| {
            format!("{:.3}", f(s).median / f(a).median)
        })
    };
    for s in summaries {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
            vs(s, |s| s.handoffs_per_sec),
            vs(s, |s| s.cpu_us_per_handoff),
            vs(s, |s| s.p50_us),
        );
    }
    ratio_table(
        out,
        &format!(
            "Targets against {}, ratios of medians from this run:",
            HandoffContender::TokenList.label()
        ),
        &token_list_ratios(summaries),
    );
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

/// The targets against the token list: fair `WAIT` at 0.8 × its hand-offs/s
/// for under 1.4 × its server CPU per hand-off, plain `WAIT` at 0.85 ×, and
/// both within 1.3 × its p50.
fn token_list_ratios(summaries: &[HandoffSummary]) -> Vec<Ratio> {
    let mut out = Vec::new();
    let Some(list) = handoff::find(summaries, HandoffContender::TokenList) else {
        return out;
    };
    let targets = [
        (HandoffContender::FairWait, 0.8, Some(1.4)),
        (HandoffContender::Wait, 0.85, None),
    ];
    for (contender, rate_target, cpu_target) in targets {
        let Some(s) = handoff::find(summaries, contender) else {
            continue;
        };
        let name = contender.label();
        out.push(Ratio {
            what: format!("{name}: hand-offs/s ÷ token list's"),
            value: s.handoffs_per_sec.median / list.handoffs_per_sec.median,
            target: Target::AtLeast(rate_target),
        });
        if let Some(cpu_target) = cpu_target {
            out.push(Ratio {
                what: format!("{name}: server CPU per hand-off ÷ token list's"),
                value: s.cpu_us_per_handoff.median / list.cpu_us_per_handoff.median,
                target: Target::Below(cpu_target),
            });
        }
        out.push(Ratio {
            what: format!("{name}: p50 hand-off latency ÷ token list's"),
            value: s.p50_us.median / list.p50_us.median,
            target: Target::AtMost(1.3),
        });
    }
    out
}

fn scale_section(out: &mut String, settings: &Settings, r: &ScaleResults) {
    crowd_table(out, settings, r);
    reads_table(out, r);
    storm_table(out, r);
    memory_table(out, r);
}

/// Part a: fair hand-offs with thousands of other clients waiting.
fn crowd_table(out: &mut String, settings: &Settings, r: &ScaleResults) {
    let others = group_thousands(r.sizes.others as u64);
    let _ = writeln!(
        out,
        "\nScale, crowd: `{}` hand-offs as in the hand-off set ({} clients, limit 1) while \
         {others} other clients each wait in `SEM.ACQUIRE <own name> 1 60 WAIT 60` on a \
         semaphore of its own that one holder keeps full, against none; {} × {:.2} s per \
         state, alternating (none, {others}, none, …; the waiting connections stay open and \
         are unblocked between repetitions). Median (min–max) over the repetitions.\n\n\
         | Others waiting | hand-offs/s | p50 µs | p99 µs | server CPU µs/hand-off |\n\
         | ---: | ---: | ---: | ---: | ---: |",
        HandoffContender::FairWait.label(),
        settings.handoff_clients,
        settings.reps,
        settings.duration.as_secs_f64(),
    );
    let spread = |waiting: usize, f: fn(&HandoffMeasurement) -> f64| {
        Spread::of(
            r.crowd
                .iter()
                .filter(|c| c.waiting == waiting)
                .map(|c| f(&c.m)),
        )
    };
    for waiting in [0, r.sizes.others] {
        let (Some(rate), Some(p50), Some(p99), Some(cpu)) = (
            spread(waiting, HandoffMeasurement::handoffs_per_sec),
            spread(waiting, |m| m.p50_us),
            spread(waiting, |m| m.p99_us),
            spread(waiting, HandoffMeasurement::cpu_us_per_handoff),
        ) else {
            continue;
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            group_thousands(waiting as u64),
            with_range(rate, |v| group_thousands(v.round() as u64)),
            short(p50.median),
            short(p99.median),
            with_range(cpu, short),
        );
    }
    let rate = |waiting| spread(waiting, HandoffMeasurement::handoffs_per_sec);
    let mut ratios = Vec::new();
    if let (Some(crowded), Some(alone)) = (rate(r.sizes.others), rate(0)) {
        ratios.push(Ratio {
            what: format!("hand-offs/s with {others} others waiting ÷ with none"),
            value: crowded.median / alone.median,
            target: Target::AtLeast(0.9),
        });
    }
    // Each crowded repetition over the quiet one run just before it: on a
    // shared machine, steadier than the ratio of the medians.
    let paired = r.crowd.iter().filter(|c| c.waiting > 0).filter_map(|c| {
        r.crowd
            .iter()
            .find(|q| q.waiting == 0 && q.m.rep == c.m.rep)
            .map(|q| c.m.handoffs_per_sec() / q.m.handoffs_per_sec())
    });
    if let Some(paired) = Spread::of(paired) {
        ratios.push(Ratio {
            what: format!(
                "the same, median of the repetitions' own ratios (min {:.3}, max {:.3})",
                paired.min, paired.max
            ),
            value: paired.median,
            target: Target::AtLeast(0.9),
        });
    }
    ratio_table(out, "Target, ratios from this run:", &ratios);
}

/// Part b: the cost of one `EXISTS` over waited keys, few and many waiters.
fn reads_table(out: &mut String, r: &ScaleResults) {
    let keys = group_thousands(r.sizes.read_keys as u64);
    let _ = writeln!(
        out,
        "\nScale, reads: one `EXISTS` naming {keys} semaphores that each have a client waiting \
         (every waiter on a full semaphore of its own), with {keys} and with {} waiters in \
         all; and one `EXISTS` naming {keys} full semaphores nobody waits on, for reference. \
         Round trip from the load generator, one call after the other, at least {} calls and \
         0.2 s per repetition: the median, and the mean (work the server defers to right \
         after a reply delays the next call instead, so the median can fall on either side \
         of such an alternation; the mean counts it either way); then median (min–max) over \
         {} repetitions, states alternating. Also the server main thread's CPU per call \
         (everything the server did, inside the command or around it) and the command's own \
         time per call from `INFO commandstats` (which leaves out work done around it).\n\n\
         | Waiters in all | EXISTS of waited keys, round trip µs, median | mean | server CPU µs/call | EXISTS's own µs/call | EXISTS of keys nobody waits on, round trip µs, median | mean | server CPU µs/call | EXISTS's own µs/call |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        group_thousands(r.sizes.read_waiters as u64),
        r.sizes.read_samples,
        r.reads.len() / 2,
    );
    let figures = |waiters: usize| -> Vec<Spread> {
        let reps: Vec<&scale::ReadRep> = r.reads.iter().filter(|x| x.waiters == waiters).collect();
        let columns: [fn(&scale::ReadRep) -> f64; 8] = [
            |x| scale::median(&x.waited_rtt_us),
            |x| scale::mean(&x.waited_rtt_us),
            |x| x.waited_cpu_us,
            |x| x.waited_command_us,
            |x| scale::median(&x.idle_rtt_us),
            |x| scale::mean(&x.idle_rtt_us),
            |x| x.idle_cpu_us,
            |x| x.idle_command_us,
        ];
        columns
            .iter()
            .filter_map(|f| Spread::of(reps.iter().map(|x| f(x))))
            .collect()
    };
    let (few, many) = (figures(r.sizes.read_keys), figures(r.sizes.read_waiters));
    for (waiters, f) in [(r.sizes.read_keys, &few), (r.sizes.read_waiters, &many)] {
        if f.len() == 8 {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                group_thousands(waiters as u64),
                with_range(f[0], short),
                with_range(f[1], short),
                short(f[2].median),
                short(f[3].median),
                with_range(f[4], short),
                with_range(f[5], short),
                short(f[6].median),
                short(f[7].median),
            );
        }
    }
    if few.len() < 8 || many.len() < 8 {
        return;
    }
    let names = format!(
        "{} waiters ÷ {keys}",
        group_thousands(r.sizes.read_waiters as u64)
    );
    let ratios = [
        Ratio {
            what: format!("EXISTS of {keys} waited keys, median round trip, {names}"),
            value: many[0].median / few[0].median,
            target: Target::AtMost(1.5),
        },
        Ratio {
            what: format!("the same, mean round trip, {names}"),
            value: many[1].median / few[1].median,
            target: Target::AtMost(1.5),
        },
        Ratio {
            what: format!("the same, server CPU per call, {names}"),
            value: many[2].median / few[2].median,
            target: Target::AtMost(1.5),
        },
    ];
    ratio_table(out, "Target, ratios of medians from this run:", &ratios);
}

/// Part c: leases ending together, their waiters served, pings meanwhile.
fn storm_table(out: &mut String, r: &ScaleResults) {
    let s = &r.storm;
    let sizes = &r.sizes;
    let _ = writeln!(
        out,
        "\nScale, lease-end storm: {} semaphores of limit {}, filled with {} holders each \
         ({} holders) of a {:.1} s lease inside one `MULTI`, so their deadlines lie within \
         {:.0} ms of each other (the module reads the live clock, so one `MULTI` cannot put \
         them in the very same millisecond); {} of the semaphores have one client waiting \
         in `SEM.ACQUIRE … WAIT`. A separate connection (an OS thread of the load generator) \
         sends `PING` about every millisecond; the storm's pings are those sent from 20 ms \
         before the first deadline to the last waiter's grant reply. Reply times are when \
         the load generator read them, as Unix ms; the common deadline is the latest holder \
         deadline. Granted: {} of {} waiters.\n\n\
         | Measure | Value | Target | |\n| --- | ---: | ---: | --- |",
        group_thousands(sizes.storm_semaphores as u64),
        sizes.storm_limit,
        sizes.storm_limit,
        group_thousands(s.holders as u64),
        sizes.storm_lease_ms as f64 / 1e3,
        s.deadline_spread_ms,
        group_thousands(s.waiters as u64),
        group_thousands(s.granted as u64),
        group_thousands(s.waiters as u64),
    );
    let rows = [
        (
            format!("PING p99 during the storm, ms ({} pings)", s.pings),
            s.ping_p99_ms,
            Some(Target::Below(25.0)),
        ),
        ("PING p50 during the storm, ms".into(), s.ping_p50_ms, None),
        ("PING max during the storm, ms".into(), s.ping_max_ms, None),
        (
            "common deadline → last waiter's grant reply, ms".into(),
            s.last_grant_after_deadline_ms,
            Some(Target::AtMost(1000.0)),
        ),
        (
            "largest (reply read − its semaphore's first deadline), ms".into(),
            s.worst_wait_past_own_deadline_ms,
            None,
        ),
        (
            "largest (reply read − recorded lease start), ms".into(),
            s.start_to_reply_max_ms,
            None,
        ),
        (
            "smallest (reply read − recorded lease start), ms".into(),
            s.start_to_reply_min_ms,
            None,
        ),
        (
            "holder deadlines, latest − earliest, ms".into(),
            s.deadline_spread_ms,
            None,
        ),
    ];
    for (what, value, target) in rows {
        let (target, verdict) = target.map_or(("–".into(), ""), |t| {
            (
                t.to_string(),
                if t.met_by(value) { "met" } else { "**missed**" },
            )
        });
        let _ = writeln!(
            out,
            "| {what} | {} | {target} | {verdict} |",
            finite_or_infinity(value, 1)
        );
    }
}

/// Part d: memory per waiting client.
fn memory_table(out: &mut String, r: &ScaleResults) {
    let m = &r.memory;
    let n = group_thousands(m.waiters as u64);
    let _ = writeln!(
        out,
        "\nScale, memory: `INFO memory` used_memory with {n} connections open and idle (Δ over \
         before they opened), then with each waiting in Redis's own `BLPOP` on an empty list \
         (the reference; Δ over idle), then idle again (Δ over before they opened), then with \
         each waiting on a full semaphore of its own (Δ over idle again; the semaphores were \
         filled before the first reading). Per waiter: that last Δ / {n}. Each reading is \
         taken {:.1} s or more after its state was reached, once two readings half a second \
         apart agree within 256 KiB (the server trims the buffers of clients idle for 2 s), so \
         the figures are those of clients that stay idle or waiting; this part runs first.\n\n\
         | Waiters | idle, Δ bytes | BLPOP waiting, Δ bytes | BLPOP: bytes per waiter | idle again, Δ bytes | SEM.ACQUIRE WAIT waiting, Δ bytes | SEM.ACQUIRE WAIT: bytes per waiter |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n\
         | {n} | {} | {} | {:.0} | {} | {} | {:.0} |",
        scale::MEMORY_SETTLE.as_secs_f64(),
        signed_thousands(m.idle_delta),
        signed_thousands(m.list_waiting_delta),
        m.bytes_per_list_waiter(),
        signed_thousands(m.idle_again_delta),
        signed_thousands(m.waiting_delta),
        m.bytes_per_waiter(),
    );
}

/// The scale set's figures, one per row: part, state, repetition, metric.
pub fn scale_tsv(r: &ScaleResults) -> String {
    let mut out = String::from("part\tstate\trep\tmetric\tvalue\n");
    let mut rows = |part: &str, state: String, rep: usize, figures: &[(&str, f64)]| {
        for (metric, value) in figures {
            let _ = writeln!(out, "{part}\t{state}\t{rep}\t{metric}\t{value:.3}");
        }
    };
    for c in &r.crowd {
        let figures = [
            ("handoffs_per_s", c.m.handoffs_per_sec()),
            ("p50_us", c.m.p50_us),
            ("p99_us", c.m.p99_us),
            ("cpu_us_per_handoff", c.m.cpu_us_per_handoff()),
        ];
        rows(
            "crowd",
            format!("{} others waiting", c.waiting),
            c.m.rep + 1,
            &figures,
        );
    }
    for x in &r.reads {
        let figures = [
            (
                "exists_waited_rtt_us_median",
                scale::median(&x.waited_rtt_us),
            ),
            ("exists_waited_rtt_us_mean", scale::mean(&x.waited_rtt_us)),
            ("exists_waited_calls", x.waited_rtt_us.len() as f64),
            ("exists_waited_cpu_us", x.waited_cpu_us),
            ("exists_waited_command_us", x.waited_command_us),
            (
                "exists_unwaited_rtt_us_median",
                scale::median(&x.idle_rtt_us),
            ),
            ("exists_unwaited_rtt_us_mean", scale::mean(&x.idle_rtt_us)),
            ("exists_unwaited_cpu_us", x.idle_cpu_us),
            ("exists_unwaited_command_us", x.idle_command_us),
        ];
        rows(
            "reads",
            format!("{} waiters", x.waiters),
            x.rep + 1,
            &figures,
        );
    }
    let s = &r.storm;
    let figures = [
        ("granted", s.granted as f64),
        ("deadline_spread_ms", s.deadline_spread_ms),
        (
            "last_grant_after_deadline_ms",
            s.last_grant_after_deadline_ms,
        ),
        (
            "worst_wait_past_own_deadline_ms",
            s.worst_wait_past_own_deadline_ms,
        ),
        ("start_to_reply_max_ms", s.start_to_reply_max_ms),
        ("start_to_reply_min_ms", s.start_to_reply_min_ms),
        ("pings", s.pings as f64),
        ("ping_p50_ms", s.ping_p50_ms),
        ("ping_p99_ms", s.ping_p99_ms),
        ("ping_max_ms", s.ping_max_ms),
    ];
    rows(
        "storm",
        format!("{} holders, {} waiters", s.holders, s.waiters),
        1,
        &figures,
    );
    let m = &r.memory;
    let figures = [
        ("idle_delta_bytes", m.idle_delta as f64),
        ("blpop_waiting_delta_bytes", m.list_waiting_delta as f64),
        ("blpop_bytes_per_waiter", m.bytes_per_list_waiter()),
        ("idle_again_delta_bytes", m.idle_again_delta as f64),
        ("waiting_delta_bytes", m.waiting_delta as f64),
        ("bytes_per_waiter", m.bytes_per_waiter()),
    ];
    rows("memory", format!("{} waiters", m.waiters), 1, &figures);
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
            Contender::RedsemSet2,
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
    // Paired as COUNT 4 is: a set of two against one semaphore's pair.
    if let (Some(set), Some(single), Some((paired, n))) = (
        get(base, Contender::RedsemSet2),
        get(base, Contender::Redsem),
        paired_ratio(
            measurements,
            (Contender::RedsemSet2, Contender::Redsem),
            |s| s == base,
            Measurement::pairs_per_sec,
        ),
    ) {
        out.push(Ratio {
            what: format!(
                "{} + SEM.RELEASEALL / {} + SEM.RELEASE, pairs/s (median over {n} pairs of \
                 repetitions run back to back; ratio of medians {:.3})",
                set.contender.label(),
                single.contender.label(),
                set.pairs_per_sec.median / single.pairs_per_sec.median,
            ),
            value: paired.median,
            target: Target::AtLeast(0.6),
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

/// -1000 → "−1,000".
fn signed_thousands(n: i64) -> String {
    let sign = if n < 0 { "−" } else { "" };
    format!("{sign}{}", group_thousands(n.unsigned_abs()))
}
