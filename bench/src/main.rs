//! Load generator for `scripts/bench`: runs redsem's semaphore commands, the
//! client-side recipes and a one-round-trip floor side by side against one
//! redis-server on 127.0.0.1 (and the floor again against a second server
//! without the module), times how fast one permit passes between waiting
//! clients, counts in instructions (callgrind) what loading the module costs
//! other commands on servers it starts itself, and writes a Markdown report,
//! raw TSV rows and a PNG chart.

mod callgrind;
mod chart;
mod cli;
mod contenders;
mod fmt;
mod handoff;
mod host;
mod instr;
mod report;
mod resp;
mod sample;
mod scale;
mod scenarios;
mod stats;

use std::process::ExitCode;

use clap::Parser;
use redis::aio::MultiplexedConnection;

use crate::cli::{Args, Settings};
use crate::contenders::Keys;
use crate::scenarios::{Bench, Scenario};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

// A single thread is enough to saturate one server core over loopback, and
// keeps the load generator on the one core it is pinned to.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let settings = match Settings::from_args(Args::parse()) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("redsem-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match run(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redsem-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> Result<(), BoxError> {
    let pairs = !settings.contenders.is_empty();
    let handoffs = !settings.handoff_contenders.is_empty();
    let scale = settings.scale.is_some();
    // Before any load: a missing font should not cost a whole run.
    if pairs {
        chart::load_font(&settings.font)?;
    }
    std::fs::create_dir_all(&settings.out_dir)?;

    let workers = if handoffs || scale {
        settings.connections.max(settings.handoff_clients)
    } else {
        settings.connections
    };
    let mut bench = Bench::connect(
        settings.port,
        settings.plain_port,
        workers,
        settings.duration,
    )
    .await?;
    let needs_module = handoffs || scale || settings.contenders.iter().any(|c| c.needs_module());
    if needs_module {
        check_module(bench.control(), settings.port, true).await?;
    }
    if let (Some(plain), Some(port)) = (bench.plain_control(), settings.plain_port) {
        check_module(plain, port, false).await?;
    }
    let env = report::Environment::probe(bench.control()).await?;
    let plain_env = match bench.plain_control() {
        Some(plain) => Some(report::Environment::probe(plain).await?),
        None => None,
    };

    let plan = if pairs {
        Scenario::plan(settings.connections, &settings.holders)
    } else {
        Vec::new()
    };
    let total = plan.len() * settings.reps * settings.contenders.len();
    let mut measurements = Vec::with_capacity(total);
    for (index, &scenario) in plan.iter().enumerate() {
        // Interleaved: every contender once per repetition, so a drift in
        // the machine's speed spreads over all of them alike.
        for rep in 0..settings.reps {
            for &contender in &settings.contenders {
                let keys = Keys::new(format!("redsem-bench:{index}:{rep}:{contender}"));
                let m = bench.measure(scenario, contender, rep, keys).await?;
                eprintln!(
                    "[{}/{total}] {scenario} · rep {} · {contender}: {} pairs/s, {:.1} µs CPU/pair",
                    measurements.len() + 1,
                    rep + 1,
                    fmt::group_thousands(m.pairs_per_sec().round() as u64),
                    m.cpu_us_per_pair(),
                );
                measurements.push(m);
            }
        }
    }

    // The hand-off set after the pairs, its contenders interleaved the same
    // way, on the server with the module.
    let handoff_total = settings.reps * settings.handoff_contenders.len();
    let mut handoff_measurements = Vec::with_capacity(handoff_total);
    for rep in 0..settings.reps {
        for &contender in &settings.handoff_contenders {
            let keys = Keys::new(format!("redsem-bench:handoff:{rep}:{contender}"));
            let m = handoff::measure(
                bench.module(),
                contender,
                rep,
                settings.handoff_clients,
                settings.duration,
                keys,
            )
            .await?;
            eprintln!(
                "[hand-off {}/{handoff_total}] rep {} · {contender}: {} hand-offs/s, p50 {:.0} µs, \
                 {:.1} µs CPU/hand-off",
                handoff_measurements.len() + 1,
                rep + 1,
                fmt::group_thousands(m.handoffs_per_sec().round() as u64),
                m.p50_us,
                m.cpu_us_per_handoff(),
            );
            handoff_measurements.push(m);
        }
    }

    // The scale set last: its thousands of connections come and go after
    // every other measurement.
    let scale_results = match settings.scale {
        Some(sizes) => Some(
            scale::run(
                bench.module(),
                settings.port,
                sizes,
                settings.reps,
                settings.handoff_clients,
                settings.duration,
            )
            .await?,
        ),
        None => None,
    };

    // The host set starts servers of its own, under callgrind.
    let host_results = match settings.host.clone() {
        Some(plan) => Some(host::run(plan).await?),
        None => None,
    };

    // The instr set too, one configuration after the other.
    let instr_results = match settings.instr.clone() {
        Some(plan) => Some(instr::run(plan).await?),
        None => None,
    };

    let summaries = stats::summarize(&measurements, &plan, &settings.contenders);
    let handoff_summaries = handoff::summarize(&handoff_measurements, &settings.handoff_contenders);
    let mut markdown = report::markdown(
        &env,
        plain_env.as_ref(),
        &settings,
        &measurements,
        &summaries,
        &handoff_summaries,
        scale_results.as_ref(),
    );
    if let Some(results) = &host_results {
        markdown.push_str(&report::host_section(results));
    }
    if let Some(results) = &instr_results {
        markdown.push_str(&instr::section(results));
    }
    let md_path = settings.out_dir.join("results.md");
    std::fs::write(&md_path, &markdown)?;
    let mut written = vec![md_path];
    if pairs {
        let tsv_path = settings.out_dir.join("results.tsv");
        let chart_path = settings.out_dir.join("pairs_vs_holders.png");
        std::fs::write(&tsv_path, report::tsv(&measurements))?;
        chart::pairs_vs_holders(
            &chart_path,
            &summaries,
            settings.connections,
            &settings.contenders,
        )?;
        written.extend([tsv_path, chart_path]);
    }
    if handoffs {
        let tsv_path = settings.out_dir.join("handoff.tsv");
        std::fs::write(&tsv_path, report::handoff_tsv(&handoff_measurements))?;
        written.push(tsv_path);
    }
    if let Some(results) = &scale_results {
        let tsv_path = settings.out_dir.join("scale.tsv");
        std::fs::write(&tsv_path, report::scale_tsv(results))?;
        written.push(tsv_path);
    }
    if let Some(results) = &host_results {
        let tsv_path = settings.out_dir.join("host.tsv");
        std::fs::write(&tsv_path, report::host_tsv(results))?;
        written.push(tsv_path);
    }
    if let Some(results) = &instr_results {
        let tsv_path = settings.out_dir.join("instr.tsv");
        std::fs::write(&tsv_path, instr::tsv(results))?;
        written.push(tsv_path);
    }
    print!("{markdown}");
    let written: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    eprintln!("wrote {}", written.join(", "));
    Ok(())
}

/// Fails early, with a plain message, when the server lacks redsem's
/// commands though they are needed, or (for the server meant to run without
/// the module) has them.
async fn check_module(
    conn: &mut MultiplexedConnection,
    port: u16,
    wanted: bool,
) -> Result<(), BoxError> {
    let commands = ["SEM.ACQUIRE", "SEM.ACQUIREFAIR", "SEM.RELEASE"];
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(&commands)
        .query_async(conn)
        .await?;
    let missing: Vec<&str> = commands
        .iter()
        .zip(&info)
        .filter(|(_, v)| matches!(v, redis::Value::Nil))
        .map(|(name, _)| *name)
        .collect();
    match (wanted, missing.len()) {
        (true, 0) => Ok(()),
        (true, _) => Err(format!(
            "the server on port {port} lacks {} (is redsem loaded?); --contenders and \
             --sets can leave the module's contenders out",
            missing.join(", ")
        )
        .into()),
        (false, n) if n == commands.len() => Ok(()),
        (false, _) => Err(format!(
            "the server on port {port} (--plain-port) has redsem's commands; it must run \
             without the module"
        )
        .into()),
    }
}
