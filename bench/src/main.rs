//! Load generator for `scripts/bench`: runs redsem's semaphore commands, the
//! client-side recipes and a one-round-trip floor side by side against one
//! redis-server on 127.0.0.1, and writes a Markdown report, raw TSV rows and
//! a PNG chart.

mod chart;
mod cli;
mod contenders;
mod report;
mod scenarios;
mod stats;

use std::process::ExitCode;

use clap::Parser;
use redis::aio::MultiplexedConnection;

use crate::cli::{Args, Settings};
use crate::contenders::{Contender, Keys};
use crate::scenarios::{Bench, Scenario};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

// A single thread is enough to saturate one server core over loopback, and
// keeps the load generator on the one core it is pinned to.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Settings::from_args(Args::parse())).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redsem-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> Result<(), BoxError> {
    // Before any load: a missing font should not cost a whole run.
    chart::load_font(&settings.font)?;
    std::fs::create_dir_all(&settings.out_dir)?;

    let client = redis::Client::open(("127.0.0.1", settings.port))?;
    let mut bench = Bench::connect(&client, settings.connections, settings.duration).await?;
    check_module(bench.control(), &settings.contenders).await?;
    let env = report::Environment::probe(bench.control()).await?;

    let plan = Scenario::plan(settings.connections, &settings.holders);
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
                    report::group_thousands(m.pairs_per_sec().round() as u64),
                    m.cpu_us_per_pair(),
                );
                measurements.push(m);
            }
        }
    }

    let summaries = stats::summarize(&measurements, &plan, &settings.contenders);
    let markdown = report::markdown(&env, &settings, &summaries);
    let tsv_path = settings.out_dir.join("results.tsv");
    let md_path = settings.out_dir.join("results.md");
    let chart_path = settings.out_dir.join("pairs_vs_holders.png");
    std::fs::write(&tsv_path, report::tsv(&measurements))?;
    std::fs::write(&md_path, &markdown)?;
    chart::pairs_vs_holders(
        &chart_path,
        &summaries,
        settings.connections,
        &settings.contenders,
    )?;
    print!("{markdown}");
    eprintln!(
        "wrote {}, {} and {}",
        md_path.display(),
        tsv_path.display(),
        chart_path.display()
    );
    Ok(())
}

/// Fails early, with a plain message, when redsem's commands are needed but
/// the server does not have the module loaded.
async fn check_module(
    conn: &mut MultiplexedConnection,
    contenders: &[Contender],
) -> Result<(), BoxError> {
    if !contenders.iter().any(|c| c.needs_module()) {
        return Ok(());
    }
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
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the server lacks {} (is redsem loaded?); --contenders can leave the module's out",
            missing.join(", ")
        )
        .into())
    }
}
