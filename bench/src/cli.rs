//! Command-line flags and the settings a run derives from them.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{value_parser, Parser};

use crate::contenders::Contender;
use crate::handoff::HandoffContender;
use crate::host::{self, HostPlan, HostState};
use crate::instr::{self, InstrPlan, ModuleConfig};
use crate::scale::ScaleSizes;
use crate::scenarios::UNCONTENDED_LIMIT;

/// Compares redsem's semaphore commands with the client-side recipes and a
/// one-round-trip floor, against one redis-server on 127.0.0.1 (and the floor
/// again against a second one without the module), and measures how fast a
/// permit passes from one client to the next.
#[derive(Parser, Debug)]
// Later occurrences of a flag override earlier ones, so scripts/bench can put
// its defaults first and still let the caller's own flags win.
#[command(name = "redsem-bench", args_override_self = true)]
pub struct Args {
    /// Port of the redis-server on 127.0.0.1 that has redsem loaded.
    #[arg(long)]
    port: u16,

    /// Port of a second redis-server on 127.0.0.1, started with the same
    /// flags but WITHOUT the module, for the floor-plain contender (what the
    /// module's command filter costs other commands).
    #[arg(long)]
    plain_port: Option<u16>,

    /// Scenario sets to run, comma-separated: pairs (every contender in
    /// every scenario), handoff (limit 1, clients passing one permit), scale
    /// (thousands of waiting clients, a storm of lease ends; needs a server
    /// with --maxclients 20000), host (what the module costs other commands,
    /// in instructions under callgrind; needs --host-server and --module),
    /// instr (instructions per call of each command, under callgrind; needs
    /// --instr-server and --module) [default: all; host only when
    /// --host-server is given, instr only when --instr-server is].
    #[arg(long, value_delimiter = ',')]
    sets: Option<Vec<Set>>,

    /// Seconds of load per measurement.
    #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
    duration: f64,

    /// Repetitions of every contender in every scenario (and of every
    /// hand-off contender), interleaved.
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

    /// Contenders to run in the pairs set, comma-separated: redsem-fair,
    /// redsem, redsem-count4, redsem-set2, recipe-multi, recipe-lua, nonfair-lua, floor,
    /// floor-plain [default: all; floor-plain only with --plain-port].
    #[arg(long, value_delimiter = ',')]
    contenders: Option<Vec<Contender>>,

    /// Clients passing the permit around in the handoff set.
    #[arg(long, default_value_t = 50, value_parser = value_parser!(u32).range(2..=1000))]
    handoff_clients: u32,

    /// Contenders to run in the handoff set, comma-separated: fair-wait,
    /// wait, poll, token-list, round-trip.
    #[arg(long, value_delimiter = ',', default_values_t = HandoffContender::ALL)]
    handoff_contenders: Vec<HandoffContender>,

    /// A redis-server (or valkey-server) binary for the host set, which
    /// starts it itself under callgrind, with and without the module;
    /// repeat the flag for several.
    #[arg(long)]
    host_server: Vec<PathBuf>,

    /// The module the host set loads (libredsem.so).
    #[arg(long)]
    module: Option<PathBuf>,

    /// Requests per command of the host set's load (redis-benchmark -n).
    #[arg(long, default_value_t = host::FULL_REQUESTS, value_parser = value_parser!(u64).range(100..=10_000_000))]
    host_requests: u64,

    /// Module states the host set measures, comma-separated, in this order:
    /// loaded, after-wait, one-waiting, many-waiting [default: all; with
    /// --smoke: loaded, one-waiting]. With a module other than redsem (a
    /// floor), only loaded.
    #[arg(long, value_delimiter = ',')]
    host_states: Option<Vec<HostState>>,

    /// CPU to pin the host set's servers to (with taskset).
    #[arg(long)]
    host_cpu: Option<usize>,

    /// Loads per count of the host set, the median taken (the event loop's turns per request
    /// move one load's count by about half a point) [default: 3; with --smoke: 1].
    #[arg(long, value_parser = value_parser!(u32).range(1..=15))]
    host_reps: Option<u32>,

    /// The redis-server binary the instr set starts under callgrind with the
    /// module (Debian's Redis 7.0 in scripts/bench).
    #[arg(long)]
    instr_server: Option<PathBuf>,

    /// Module configurations the instr set loads, comma-separated: no-filter
    /// (`command-filter 0`), filter (no module arguments) [default: both;
    /// with --smoke: no-filter].
    #[arg(long, value_delimiter = ',')]
    instr_configs: Option<Vec<ModuleConfig>>,

    /// Contenders of the instr set, comma-separated [default: all; with
    /// --smoke: floor, plain, handoff-plain, blpop].
    #[arg(long, value_delimiter = ',')]
    instr_contenders: Option<Vec<instr::Contender>>,

    /// Measured pairs (or calls) per instr contender.
    #[arg(long, default_value_t = instr::FULL_PAIRS, value_parser = value_parser!(u64).range(1..=1_000_000))]
    instr_pairs: u64,

    /// Measured hand-offs per instr hand-off contender.
    #[arg(long, default_value_t = instr::FULL_HANDOFFS, value_parser = value_parser!(u64).range(1..=100_000))]
    instr_handoffs: u64,

    /// Milliseconds the instr set's holder leaves the server to block the
    /// waiter before it gives back.
    #[arg(long, default_value_t = instr::SETTLE_MS, value_parser = value_parser!(u64).range(1..=10_000))]
    instr_settle_ms: u64,

    /// Directory for results.md, results.tsv, handoff.tsv and the chart.
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

    /// One short pass of every contender (of both sets) with tiny N, to prove
    /// that all of them run; overrides --duration, --reps and --holders, and
    /// writes under <out-dir>/smoke so it never replaces the figures of a
    /// full run.
    #[arg(long)]
    smoke: bool,
}

/// A set of scenarios that a run includes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Set {
    /// Acquire/release pairs: every contender in every scenario.
    Pairs,
    /// One permit (limit 1) passed between clients.
    Handoff,
    /// Thousands of waiters and leases ending at once.
    Scale,
    /// What the module costs the server's other commands, in instructions.
    Host,
    /// What each command costs, in instructions per call.
    Instr,
}

impl Set {
    pub const ALL: [Set; 5] = [Set::Pairs, Set::Handoff, Set::Scale, Set::Host, Set::Instr];

    fn slug(self) -> &'static str {
        match self {
            Set::Pairs => "pairs",
            Set::Handoff => "handoff",
            Set::Scale => "scale",
            Set::Host => "host",
            Set::Instr => "instr",
        }
    }
}

impl fmt::Display for Set {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

impl FromStr for Set {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Set::ALL
            .into_iter()
            .find(|set| set.slug() == s)
            .ok_or_else(|| {
                format!("unknown set {s:?}; expected pairs, handoff, scale, host or instr")
            })
    }
}

#[derive(Debug)]
pub struct Settings {
    pub port: u16,
    pub plain_port: Option<u16>,
    pub duration: Duration,
    pub reps: usize,
    pub connections: usize,
    /// Ascending, without repeats.
    pub holders: Vec<u64>,
    /// Empty when the pairs set is not run.
    pub contenders: Vec<Contender>,
    pub handoff_clients: usize,
    /// Empty when the handoff set is not run.
    pub handoff_contenders: Vec<HandoffContender>,
    /// `None` when the scale set is not run.
    pub scale: Option<ScaleSizes>,
    /// `None` when the host set is not run.
    pub host: Option<HostPlan>,
    /// `None` when the instr set is not run.
    pub instr: Option<InstrPlan>,
    pub out_dir: PathBuf,
    pub font: PathBuf,
    pub invoked_as: String,
}

impl Settings {
    pub fn from_args(args: Args) -> Result<Settings, String> {
        let invoked_as = args
            .invoked_as
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
        let (duration, reps, mut holders, out_dir) = if args.smoke {
            // Five scenarios of 0.25 s: about one second per contender of
            // the pairs set, a quarter of a second per hand-off contender.
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
        // Without a second server the no-module floor has nothing to run
        // against: left out of the default list, refused when asked for.
        let mut contenders = match args.contenders {
            Some(listed) => {
                if args.plain_port.is_none() && listed.contains(&Contender::FloorPlain) {
                    return Err(format!(
                        "--contenders {}: needs --plain-port, the port of a redis-server \
                         without the module",
                        Contender::FloorPlain
                    ));
                }
                listed
            }
            None => Contender::ALL
                .into_iter()
                .filter(|&c| args.plain_port.is_some() || !c.on_plain_server())
                .collect(),
        };
        let mut handoff_contenders = args.handoff_contenders;
        // The host set needs servers to start; by default it runs when
        // scripts/bench names them, and asked for by name it insists.
        let host_asked = args.sets.as_ref().is_some_and(|s| s.contains(&Set::Host));
        let instr_asked = args.sets.as_ref().is_some_and(|s| s.contains(&Set::Instr));
        let sets = args.sets.unwrap_or_else(|| Set::ALL.to_vec());
        let host = if !sets.contains(&Set::Host) || (args.host_server.is_empty() && !host_asked) {
            None
        } else {
            let module = match (&args.module, args.host_server.is_empty()) {
                (Some(module), false) => module.clone(),
                _ => {
                    return Err(
                        "--sets host: needs --host-server (one or more server binaries) \
                                and --module (libredsem.so); scripts/bench passes both"
                            .into(),
                    )
                }
            };
            Some(HostPlan {
                servers: args.host_server.clone(),
                module,
                requests: if args.smoke {
                    host::SMOKE_REQUESTS
                } else {
                    args.host_requests
                },
                states: match args.host_states {
                    Some(mut states) => {
                        // Each state builds on the ones before it.
                        states.sort_by_key(|&s| s as usize);
                        states.dedup();
                        states
                    }
                    None if args.smoke => HostState::SMOKE.to_vec(),
                    None => HostState::FULL.to_vec(),
                },
                cpu: args.host_cpu,
                reps: args
                    .host_reps
                    .unwrap_or(if args.smoke { 1 } else { host::FULL_REPS }),
            })
        };
        let instr = match (&args.instr_server, &args.module) {
            _ if !sets.contains(&Set::Instr) => None,
            (None, _) if !instr_asked => None,
            (Some(server), Some(module)) => {
                let mut configs = args.instr_configs.clone().unwrap_or_else(|| {
                    if args.smoke {
                        vec![ModuleConfig::NoFilter]
                    } else {
                        ModuleConfig::ALL.to_vec()
                    }
                });
                configs.sort();
                configs.dedup();
                let mut contenders = args.instr_contenders.clone().unwrap_or_else(|| {
                    if args.smoke {
                        instr::Contender::SMOKE.to_vec()
                    } else {
                        instr::Contender::ALL.to_vec()
                    }
                });
                contenders.sort();
                contenders.dedup();
                let (pairs, handoffs) = if args.smoke {
                    (instr::SMOKE_PAIRS, instr::SMOKE_HANDOFFS)
                } else {
                    (args.instr_pairs, args.instr_handoffs)
                };
                Some(InstrPlan {
                    server: server.clone(),
                    module: module.clone(),
                    configs,
                    contenders,
                    pairs,
                    handoffs,
                    settle: Duration::from_millis(args.instr_settle_ms),
                    cpu: args.host_cpu,
                    dir: out_dir.join("instr"),
                })
            }
            _ => {
                return Err(
                    "--sets instr: needs --instr-server (a redis-server binary) and \
                            --module (libredsem.so); scripts/bench passes both"
                        .into(),
                )
            }
        };
        if !sets.contains(&Set::Pairs) {
            contenders.clear();
        }
        if !sets.contains(&Set::Handoff) {
            handoff_contenders.clear();
        }
        // Always in the canonical order, so tables and charts line up
        // between runs whatever order the flag listed them in.
        contenders.sort_by_key(|&c| c as usize);
        contenders.dedup();
        handoff_contenders.sort_by_key(|&c| c as usize);
        handoff_contenders.dedup();
        let scale = sets.contains(&Set::Scale).then_some(if args.smoke {
            ScaleSizes::SMOKE
        } else {
            ScaleSizes::FULL
        });
        if contenders.is_empty()
            && handoff_contenders.is_empty()
            && scale.is_none()
            && host.is_none()
            && instr.is_none()
        {
            return Err("nothing to run: no contender in any set".into());
        }
        Ok(Settings {
            port: args.port,
            plain_port: args.plain_port,
            duration: Duration::from_secs_f64(duration),
            reps,
            connections: args.connections as usize,
            holders,
            contenders,
            handoff_clients: args.handoff_clients as usize,
            handoff_contenders,
            scale,
            host,
            instr,
            out_dir,
            font: args.font,
            invoked_as,
        })
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
