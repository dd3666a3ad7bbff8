//! Command-line flags and the settings a run derives from them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{value_parser, Parser};

use crate::contenders::Contender;
use crate::scenarios::UNCONTENDED_LIMIT;

/// Compares redsem's semaphore commands with the client-side recipes and a
/// one-round-trip floor, against one redis-server on 127.0.0.1.
#[derive(Parser, Debug)]
// Later occurrences of a flag override earlier ones, so scripts/bench can put
// its defaults first and still let the caller's own flags win.
#[command(name = "redsem-bench", args_override_self = true)]
pub struct Args {
    /// Port of the redis-server on 127.0.0.1 that has redsem loaded.
    #[arg(long)]
    port: u16,

    /// Seconds of load per measurement.
    #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
    duration: f64,

    /// Repetitions of every contender in every scenario, interleaved.
    #[arg(long, default_value_t = 5, value_parser = value_parser!(u32).range(1..=50))]
    reps: u32,

    /// Concurrent connections in the multi-client scenarios.
    #[arg(long, default_value_t = 50, value_parser = value_parser!(u32).range(1..=1000))]
    connections: u32,

    /// Live holders to pre-fill, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = [10, 1_000, 100_000],
        value_parser = value_parser!(u64).range(1..UNCONTENDED_LIMIT),
    )]
    holders: Vec<u64>,

    /// Contenders to run, comma-separated: redsem-fair, redsem, recipe-multi,
    /// recipe-lua, nonfair-lua, floor.
    #[arg(long, value_delimiter = ',', default_values_t = Contender::ALL)]
    contenders: Vec<Contender>,

    /// Directory for results.md, results.tsv and the chart.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,

    /// TrueType font for the chart's text.
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,

    /// Command line to record in results.md (scripts/bench passes its own).
    #[arg(long)]
    invoked_as: Option<String>,

    /// One short pass of every contender with tiny N, to prove that all of
    /// them run; overrides --duration, --reps and --holders, and writes under
    /// <out-dir>/smoke so it never replaces the figures of a full run.
    #[arg(long)]
    smoke: bool,
}

#[derive(Debug)]
pub struct Settings {
    pub port: u16,
    pub duration: Duration,
    pub reps: usize,
    pub connections: usize,
    /// Ascending, without repeats.
    pub holders: Vec<u64>,
    pub contenders: Vec<Contender>,
    pub out_dir: PathBuf,
    pub font: PathBuf,
    pub invoked_as: String,
}

impl Settings {
    pub fn from_args(args: Args) -> Settings {
        let invoked_as = args
            .invoked_as
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
        let (duration, reps, mut holders, out_dir) = if args.smoke {
            // Five scenarios of 0.25 s: about one second per contender.
            (0.25, 1, vec![10, 100], args.out_dir.join("smoke"))
        } else {
            (
                args.duration,
                args.reps as usize,
                args.holders,
                args.out_dir,
            )
        };
        holders.sort_unstable();
        holders.dedup();
        // Always in the canonical order, so tables and charts line up
        // between runs whatever order the flag listed them in.
        let mut contenders = args.contenders;
        contenders.sort_by_key(|&c| c as usize);
        contenders.dedup();
        Settings {
            port: args.port,
            duration: Duration::from_secs_f64(duration),
            reps,
            connections: args.connections as usize,
            holders,
            contenders,
            out_dir,
            font: args.font,
            invoked_as,
        }
    }
}

/// Seconds as a decimal, bounded so that every loop stays bounded in time.
fn parse_seconds(s: &str) -> Result<f64, String> {
    let secs: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.05..=600.0).contains(&secs) {
        Ok(secs)
    } else {
        Err("must be between 0.05 and 600 seconds".into())
    }
}
