//! A randomized, seeded, model-based test against a real redis-server: long random sequences of
//! SEM.* calls (every option: ID, WITHTICKET, COUNT, WAIT (blocking for real when sent on its
//! own), BOUND; valid and invalid arguments; inside MULTI/EXEC and Lua scripts; the calls on a
//! set of semaphores, SEM.ACQUIREALL (surveyed first, all or nothing), SEM.RELEASEALL and
//! SEM.REFRESHALL; SEM.WAITEMPTY, blocking too; SEM.LIMIT storing, reading and clearing the
//! operator's limit that acquires then use) interleaved
//! with what other clients and operators do to the same keys (deletions, renames, values of
//! other types, foreign sorted-set entries with odd scores, foreign permits, expiries, garbage
//! counters, limit keys set, deleted, expiring or holding garbage, FLUSHDB, active expiry switched off and on, time passing, the client's connection
//! closing with BOUND permits). The model (tests/model/) follows the rules of src/semaphore.rs,
//! src/commands.rs, src/args.rs and src/store.rs. After EVERY step:
//!
//! 1. the replies and the keys read back match the model (tests/model/sem.rs, written from the
//!    documented rules), at some instant of the window the server clock was read in;
//! 2. an error changed nothing: no key, value, expiry or encoding (every key the step left
//!    alone keeps its encoding), and WATCH did not fire;
//! 3. no key is empty, and ZRANK, ZRANDMEMBER and DEBUG DIGEST-VALUE answer on every key;
//! 4. while only the module wrote a name's sets, they expire at their latest deadline;
//! 5. WATCH on every key fires exactly when the step changed one (or a key's expiry passed);
//! 6. the server answers, and its log shows no crash;
//! 7. the module remembers as many BOUND permits as the model (INFO sem, sem_bound_holders).
//!
//! Now and then a step is a background episode instead (tests/model/background.rs): clients on
//! their own connections wait in SEM.ACQUIRE/ACQUIREFAIR ... WAIT on one name (or in
//! SEM.ACQUIREALL ... WAIT on it and a second one, or in SEM.WAITEMPTY) while the run goes
//! on with that name's keys (other clients' reads and writes, releases, refreshes, time
//! passing), their replies read later; or a timer storm, many leases ending in the same
//! millisecond with waiters behind them. The module grants these waiters at instants no step
//! chooses, so an episode is checked by its own invariants (the limit, arrival order, a grant
//! when permits come free, answers in time, reads serving no line), and the model then takes
//! the keys as read at its end.
//!
//! At the end a replica and an AOF reload must hold exactly the primary's keys, then more steps
//! run on the reloaded server, whose fair tickets go on from the fencing floor its load took.
//!
//! `cargo test --test model` runs a short profile with a seed from the clock. Environment:
//! `REDSEM_MODEL_SEED` (repeat a run's choices), `REDSEM_MODEL_STEPS` (default 5000),
//! `REDSEM_MODEL_RELOAD_STEPS` (steps after the reload; default a tenth, at most 2000),
//! `REDSEM_MODEL_TRACE` (a file that receives every step and its replies),
//! `REDSEM_MODEL_BACKGROUND` (background episodes per thousand steps; default 7; a storm comes
//! once per thousand). scripts/stress runs a long profile.

mod common;

#[path = "model/background.rs"]
mod background;
#[path = "model/keyspace.rs"]
mod keyspace;
#[path = "model/ops.rs"]
mod ops;
#[path = "model/predict.rs"]
mod predict;
#[path = "model/rng.rs"]
mod rng;
#[path = "model/sem.rs"]
mod sem;
#[path = "model/steps.rs"]
mod steps;
#[path = "model/wire.rs"]
mod wire;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{info_sem, server_kind, start_replica_of, Server};
use keyspace::{compare, parse_dump, show, show_keys, time_ms, Bytes, Dump, Value, DUMP_SCRIPT};
use predict::{Observed, Verdict};
use rng::Rng;
use sem::{counter_key, deadline_ms, owner_key, permits_key, Fencing, World};
use steps::{universe, Seen, Step, NAMES};
use wire::{cmd, pipeline, reply_of, Reply};

/// A primary with an AOF written before each reply (so a kill loses nothing), DEBUG enabled,
/// and a disk-based full sync (which starts at once; a diskless one waits 5 s).
const PRIMARY_ARGS: [&str; 10] = [
    "--save",
    "",
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--enable-debug-command",
    "yes",
    "--repl-diskless-sync",
    "no",
];

/// Keys expiring sooner than this are waited out before the replica and the reload are
/// compared, so that no expiry races the comparison.
const QUIET_MS: i64 = 60_000;

/// Steps kept for the failure report.
const HISTORY: usize = 40;

/// What a failing step leaves in the log that tells a crash.
const CRASH_SIGNS: [&str; 6] = [
    "ASSERTION FAILED",
    "crashed by signal",
    "Guru Meditation",
    "REDIS BUG REPORT",
    "panicked",
    "internal error in redsem",
];

struct Profile {
    seed: u64,
    steps: u64,
    reload_steps: u64,
    background: u64,
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

fn profile() -> Profile {
    let seed = env_number("REDSEM_MODEL_SEED").unwrap_or_else(|| {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
        now.as_nanos() as u64 % 1_000_000_000_000
    });
    let steps = env_number("REDSEM_MODEL_STEPS").unwrap_or(5000);
    let reload_steps = env_number("REDSEM_MODEL_RELOAD_STEPS").unwrap_or((steps / 10).min(2000));
    Profile {
        seed,
        steps,
        reload_steps,
        background: env_number("REDSEM_MODEL_BACKGROUND").unwrap_or(7).min(999),
    }
}

/// Counts for the summary: what the run exercised.
#[derive(Default)]
struct Stats {
    steps: BTreeMap<&'static str, u64>,
    outcomes: BTreeMap<String, u64>,
    watch_fired: u64,
    watch_ambiguous: u64,
    inconclusive: u64,
    several_explanations: u64,
    widest_window_ms: i64,
    window_total_ms: i64,
    settle_checks: u64,
    fencing_jumps: u64,
    /// Where the time goes: the main client's pipelines, the watcher's, the model.
    server_time: Duration,
    watch_time: Duration,
    model_time: Duration,
    /// What the background episodes and storms checked.
    background: BTreeMap<&'static str, u64>,
    background_time: Duration,
}

struct Run {
    seed: u64,
    rng: Rng,
    /// The client whose steps are checked, and its CLIENT ID.
    main: redis::Connection,
    main_id: i64,
    /// The server's URL, for reconnecting.
    server: String,
    /// The client that WATCHes every key across each step.
    watcher: redis::Connection,
    dump_sha: String,
    universe: Vec<Bytes>,
    /// The keys as last read back (and checked), with the fencing state.
    world: World,
    encodings: BTreeMap<Bytes, String>,
    /// TIME just after the previous step, before its keys were read back.
    last_t1: i64,
    step_no: u64,
    history: VecDeque<String>,
    trace: Option<BufWriter<File>>,
    stats: Stats,
    /// Names whose sets only the module wrote since they last did not exist.
    clean: BTreeSet<Bytes>,
    log_hint: String,
    /// Idle connections for background waiters, with their CLIENT IDs.
    pool: Vec<(redis::Connection, i64)>,
    /// Numbers the background waiters' identifiers.
    background_serial: u64,
    /// Background episodes per thousand steps.
    background_rate: u64,
}

fn connect(server: &Server) -> redis::Connection {
    let conn = server.connection();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    conn
}

fn dump_command(sha: &str, universe: &[Bytes]) -> Vec<Bytes> {
    let mut args = cmd(&["EVALSHA_RO", sha]);
    args.push(universe.len().to_string().into_bytes());
    args.extend(universe.iter().cloned());
    args
}

/// Reads every key of `universe` on any server (a replica too), with the script's text.
fn dump_with_script(conn: &mut redis::Connection, universe: &[Bytes]) -> Dump {
    let mut args = cmd(&["EVAL_RO", DUMP_SCRIPT]);
    args.push(universe.len().to_string().into_bytes());
    args.extend(universe.iter().cloned());
    let replies = pipeline(conn, &[args]).expect("the dump script");
    let mut dump = parse_dump(universe, &replies[0]).unwrap_or_else(|e| panic!("dump: {e}"));
    fix_big_expiries(conn, &mut dump);
    assert!(dump.problems.is_empty(), "{:?}", dump.problems);
    dump
}

/// Reads the expiries the dump script could not (see [`Dump::big_expiries`]).
fn fix_big_expiries(conn: &mut redis::Connection, dump: &mut Dump) {
    for key in dump.big_expiries.clone() {
        let reply = pipeline(conn, &[[b"PEXPIRETIME".to_vec(), key.clone()].to_vec()])
            .expect("PEXPIRETIME");
        dump.set_big_expiry(&key, &reply[0])
            .unwrap_or_else(|e| panic!("dump: {e}"));
    }
}

fn check_log(server: &Server, which: &str) {
    let log = server.log();
    for sign in CRASH_SIGNS {
        assert!(
            !log.contains(sign),
            "the {which}'s log shows {sign:?}:\n{log}"
        );
    }
}

fn replies_text(replies: &[Reply]) -> String {
    replies
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

impl Run {
    fn new(server: &Server, seed: u64) -> Run {
        let trace = std::env::var_os("REDSEM_MODEL_TRACE")
            .map(|path| BufWriter::new(File::create(path).expect("the trace file")));
        let mut run = Run {
            seed,
            rng: Rng::new(seed),
            main: connect(server),
            main_id: 0,
            server: String::new(),
            watcher: connect(server),
            dump_sha: String::new(),
            universe: universe(),
            world: World::default(),
            encodings: BTreeMap::new(),
            last_t1: 0,
            step_no: 0,
            history: VecDeque::new(),
            trace,
            stats: Stats::default(),
            clean: NAMES.iter().map(|n| n.as_bytes().to_vec()).collect(),
            log_hint: String::new(),
            pool: Vec::new(),
            background_serial: 0,
            background_rate: 7,
        };
        run.attach(server);
        run
    }

    /// Points the run at `server` (a fresh one, or the primary reloaded from its AOF).
    fn attach(&mut self, server: &Server) {
        self.main = connect(server);
        self.main_id = redis::cmd("CLIENT")
            .arg("ID")
            .query(&mut self.main)
            .expect("CLIENT ID");
        self.server = format!("redis://127.0.0.1:{}/", server.port);
        self.watcher = connect(server);
        self.pool.clear();
        self.log_hint = format!(
            "the server's files (redis.log, appendonlydir) are in {}",
            server.dir.display()
        );
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(DUMP_SCRIPT)
            .query(&mut self.main)
            .expect("SCRIPT LOAD");
        self.dump_sha = sha;
        let dump = self.read_back();
        // The floor this start of the server took (when the module loaded, or loading ended).
        let fencing = Fencing {
            floor: info_sem(&mut self.main)["sem_ticket_floor"],
            lifted: 0,
        };
        // A fresh server (or one just restarted) knows of no BOUND permit.
        self.world = World {
            keys: dump.keys,
            fencing,
            bindings: BTreeMap::new(),
        };
        self.encodings = dump.encodings;
        self.last_t1 = dump.time_ms;
        let mut watch = cmd(&["WATCH"]);
        watch.extend(self.universe.iter().cloned());
        pipeline(&mut self.watcher, &[watch]).expect("WATCH");
    }

    fn read_back(&mut self) -> Dump {
        let replies = pipeline(
            &mut self.main,
            &[dump_command(&self.dump_sha, &self.universe)],
        )
        .expect("the dump script");
        let mut dump =
            parse_dump(&self.universe, &replies[0]).unwrap_or_else(|e| panic!("dump: {e}"));
        fix_big_expiries(&mut self.main, &mut dump);
        assert!(dump.problems.is_empty(), "{:?}", dump.problems);
        dump
    }

    fn fail(&mut self, step: &Step, what: &str, detail: &str) -> ! {
        self.fail_described(&step.describe(), what, detail)
    }

    fn fail_described(&mut self, step: &str, what: &str, detail: &str) -> ! {
        if let Some(trace) = &mut self.trace {
            let _ = trace.flush();
        }
        let mut report = String::new();
        report += &format!(
            "\n======== MODEL CHECK FAILED: REDSEM_MODEL_SEED={} at step {} ========\n",
            self.seed, self.step_no
        );
        report += &format!("{what}\n\nthe step:\n    {step}\n");
        report += &format!("\n{detail}\n");
        report += &format!(
            "\nthe keys before the step (read back after step {}):\n{}",
            self.step_no.saturating_sub(1),
            show_keys(&self.world.keys)
        );
        let bindings: Vec<String> = self
            .world
            .bindings
            .iter()
            .map(|((name, id), client)| format!("{}/{} ({client:?})", show(name), show(id)))
            .collect();
        report += &format!("the model's BOUND permits: {}\n", bindings.join(", "));
        report += "\nthe steps before (newest last):\n";
        for line in &self.history {
            report += &format!("  {line}\n");
        }
        // The module's own view (INFO sem, where the module has it), for the diagnosis.
        if let Ok(info) = redis::cmd("INFO")
            .arg("sem")
            .query::<String>(&mut self.main)
        {
            report += &format!("\nINFO sem:\n{}\n", info.trim());
        }
        report += &format!("\n{}\n", self.log_hint);
        report += &format!(
            "rerun: REDSEM_MODEL_SEED={} cargo test -p redsem --test model -- --nocapture\n",
            self.seed
        );
        panic!("{report}");
    }

    fn steps(&mut self, count: u64) {
        for _ in 0..count {
            self.step();
        }
    }

    /// The commands that read the keys back after a step: TIME, the dump script, PEXPIRETIME
    /// of each key (for expiries the script cannot read exactly), DEBUG DIGEST-VALUE.
    fn read_back_commands(&self) -> Vec<Vec<Bytes>> {
        let mut commands = vec![cmd(&["TIME"])];
        commands.push(dump_command(&self.dump_sha, &self.universe));
        for key in &self.universe {
            commands.push([b"PEXPIRETIME".to_vec(), key.clone()].to_vec());
        }
        let mut digest = cmd(&["DEBUG", "DIGEST-VALUE"]);
        digest.extend(self.universe.iter().cloned());
        commands.push(digest);
        // The module's own count of BOUND permits (where INFO has it).
        commands.push(cmd(&["INFO", "sem"]));
        commands
    }

    /// Parses the replies of [`Run::read_back_commands`]: TIME before the read, and the keys.
    fn parse_read_back(
        &self,
        replies: &[redis::Value],
    ) -> Result<(i64, Dump, Option<usize>), String> {
        let t1 = time_ms(&replies[0])?;
        let mut dump = parse_dump(&self.universe, &replies[1])?;
        let expiries = &replies[2..2 + self.universe.len()];
        for key in dump.big_expiries.clone() {
            let at = self.universe.iter().position(|k| *k == key).expect("a key");
            dump.set_big_expiry(&key, &expiries[at])?;
        }
        match &replies[2 + self.universe.len()] {
            redis::Value::Array(digests) if digests.len() == self.universe.len() => {}
            other => dump.problems.push(format!(
                "DEBUG DIGEST-VALUE did not answer for every key: {other:?}"
            )),
        }
        let bound = match &replies[3 + self.universe.len()] {
            redis::Value::BulkString(info) => String::from_utf8_lossy(info)
                .lines()
                .find_map(|line| line.strip_prefix("sem_bound_holders:"))
                .and_then(|n| n.trim().parse().ok()),
            _ => None,
        };
        Ok((t1, dump, bound))
    }

    /// Closes the main client's connection as a client would lose it: its successor kills it
    /// (CLIENT KILL frees it at once, so the module learns of it before the kill returns).
    fn reconnect(&mut self, step: &Step) -> (i64, Vec<Reply>) {
        let server = self.server.clone();
        let mut successor = redis::Client::open(server.as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .unwrap_or_else(|e| self.fail(step, "cannot connect", &format!("{e}")));
        successor
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        let new_id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query(&mut successor)
            .expect("CLIENT ID");
        let kill = vec![
            cmd(&["TIME"]),
            cmd(&["CLIENT", "KILL", "ID", &self.main_id.to_string()]),
        ];
        let replies = pipeline(&mut successor, &kill)
            .unwrap_or_else(|e| self.fail(step, "the server stopped answering", &format!("{e}")));
        self.main = successor;
        self.main_id = new_id;
        let t0 = time_ms(&replies[0]).expect("TIME");
        // The give-backs run on the module's timer, a millisecond or so later.
        sleep(Duration::from_millis(5));
        (t0, vec![reply_of(&replies[1])])
    }

    fn step(&mut self) {
        self.step_no += 1;
        // Now and then, waiters in the background (checked by invariants, see background.rs).
        match self.rng.below(1000) as u64 {
            n if n < self.background_rate => {
                *self.stats.steps.entry("background").or_default() += 1;
                let started = Instant::now();
                self.background_episode();
                self.stats.background_time += started.elapsed();
                return;
            }
            999 => {
                *self.stats.steps.entry("storm").or_default() += 1;
                let started = Instant::now();
                self.timer_storm();
                self.stats.background_time += started.elapsed();
                return;
            }
            _ => {}
        }
        let seen = Seen {
            keys: &self.world.keys,
            now_ms: self.last_t1,
        };
        let step = steps::step(&mut self.rng, &seen);
        *self.stats.steps.entry(step.kind()).or_default() += 1;
        if let Step::Sleep(ms) = step {
            sleep(Duration::from_millis(ms));
        }

        // The step, then (in the same pipeline but for a reconnection) the keys read back.
        let read_back = self.read_back_commands();
        let started = Instant::now();
        let (t0, step_replies, mut tail) = if let Step::Reconnect = step {
            let (t0, replies) = self.reconnect(&step);
            let tail = pipeline(&mut self.main, &read_back).unwrap_or_else(|e| {
                self.fail(&step, "the server stopped answering", &format!("{e}"))
            });
            (t0, replies, tail)
        } else {
            let sent = step.commands();
            let mut commands = vec![cmd(&["TIME"])];
            commands.extend(sent.iter().cloned());
            commands.extend(read_back.iter().cloned());
            let mut replies = pipeline(&mut self.main, &commands).unwrap_or_else(|e| {
                self.fail(&step, "the server stopped answering", &format!("{e}"))
            });
            let tail = replies.split_off(1 + sent.len());
            let t0 = time_ms(&replies[0]).expect("TIME");
            let step_replies: Vec<Reply> = replies[1..].iter().map(reply_of).collect();
            (t0, step_replies, tail)
        };
        let replies_line = format!("replies: {}", replies_text(&step_replies));
        self.stats.server_time += started.elapsed();
        let started = Instant::now();

        // 1. The replies and the keys, against the model. A reconnection's give-backs run on
        // the module's timer: read again (a little later) until they are done.
        let mut attempts = 0;
        let (t1, dump, mut matches, bound) = loop {
            let (t1, dump, bound) = match self.parse_read_back(&tail) {
                Ok(read) => read,
                Err(e) => self.fail(&step, "reading the keys back failed", &e),
            };
            if !dump.problems.is_empty() {
                let problems = dump.problems.join("\n");
                self.fail(
                    &step,
                    "a key is broken (invariant 3)",
                    &format!(
                        "{replies_line}\n{problems}\nkeys:\n{}",
                        show_keys(&dump.keys)
                    ),
                );
            }
            let observed = Observed {
                t0,
                t1,
                replies: &step_replies,
                dump: &dump,
            };
            match predict::check(&self.world, &step, &observed) {
                Verdict::Matches(matches) => break (t1, dump, matches, bound),
                Verdict::Inconclusive => {
                    self.stats.inconclusive += 1;
                    break (t1, dump, Vec::new(), bound);
                }
                Verdict::Mismatch(_) if matches!(step, Step::Reconnect) && attempts < 50 => {
                    attempts += 1;
                    sleep(Duration::from_millis(10));
                    tail = pipeline(&mut self.main, &read_back).unwrap_or_else(|e| {
                        self.fail(&step, "the server stopped answering", &format!("{e}"))
                    });
                }
                Verdict::Mismatch(why) => self.fail(
                    &step,
                    "the server's replies or keys differ from the model (invariant 1)",
                    &format!(
                        "{replies_line}\nwindow: {t0}..{t1} (keys read back by {})\n{why}\nthe keys read back:\n{}",
                        dump.time_ms,
                        show_keys(&dump.keys)
                    ),
                ),
            }
        };
        // The module remembers exactly the BOUND permits the model does. Bindings are not in the
        // keys read back, so explanations that differ only in them (a holder set whose expiry
        // passed at the instant the module read it, or just before) are told apart here.
        if let (Some(bound), false) = (bound, matches.is_empty()) {
            if !matches.iter().any(|m| m.post.bindings.len() == bound) {
                let model: Vec<String> = matches
                    .iter()
                    .map(|m| {
                        let held: Vec<String> = m
                            .post
                            .bindings
                            .iter()
                            .map(|((name, id), client)| {
                                format!("{}/{} ({client:?})", show(name), show(id))
                            })
                            .collect();
                        format!("[{}]", held.join(", "))
                    })
                    .collect();
                self.fail(
                    &step,
                    "the module holds another number of BOUND permits than the model",
                    &format!(
                        "{replies_line}\nINFO sem: sem_bound_holders:{bound}; the model after \
                         the step, per explanation: {}",
                        model.join(" or ")
                    ),
                );
            }
            matches.retain(|m| m.post.bindings.len() == bound);
        }

        self.stats.model_time += started.elapsed();
        let line = format!(
            "#{} [{t0}..{t1}] {} -> {}",
            self.step_no,
            step.describe(),
            replies_text(&step_replies)
        );
        if let Some(trace) = &mut self.trace {
            let _ = writeln!(trace, "{line}");
        }

        let mut watch = cmd(&["WATCH"]);
        watch.extend(self.universe.iter().cloned());
        let exec = [
            cmd(&["MULTI"]),
            cmd(&["PING"]),
            cmd(&["EXEC"]),
            cmd(&["TIME"]),
            watch,
        ];
        let started = Instant::now();
        let exec = match pipeline(&mut self.watcher, &exec) {
            Ok(replies) => replies,
            Err(err) => self.fail(&step, "the server stopped answering", &format!("{err}")),
        };
        self.stats.watch_time += started.elapsed();
        let aborted = match &exec[2] {
            redis::Value::Nil => true,
            redis::Value::Array(_) => false,
            other => self.fail(&step, "the watcher's EXEC failed", &format!("{other:?}")),
        };
        let t_exec = time_ms(&exec[3]).expect("TIME");
        let window = t1 - t0;
        self.stats.widest_window_ms = self.stats.widest_window_ms.max(window);
        self.stats.window_total_ms += window;
        if matches.len() > 1 {
            self.stats.several_explanations += 1;
        }
        if let Some(first) = matches.first() {
            for label in &first.labels {
                *self.stats.outcomes.entry(label.clone()).or_default() += 1;
            }
            if first.post.fencing.lifted > self.world.fencing.lifted {
                self.stats.fencing_jumps += 1;
            }
        }

        // 5. WATCH fires exactly when a key changed. Expiries passing between WATCH and EXEC
        // fire it too, so keys expiring inside that window only allow "changed => fired".
        if aborted {
            self.stats.watch_fired += 1;
        }
        let (lo, hi) = (self.last_t1 - 1, t_exec + 1);
        let expiring = |keys: &keyspace::Keyspace| {
            keys.values()
                .filter_map(|e| e.expire)
                .any(|at| at >= lo && at <= hi)
        };
        let ambiguous = expiring(&self.world.keys)
            || expiring(&dump.keys)
            || matches.iter().any(|m| expiring(&m.post.keys));
        if ambiguous {
            self.stats.watch_ambiguous += 1;
        }
        let changed: BTreeSet<bool> = matches.iter().map(|m| !m.touched.is_empty()).collect();
        if changed == BTreeSet::from([true]) && !aborted {
            self.fail(
                &step,
                "the step changed a key but WATCH did not fire (invariant 5)",
                &format!("{replies_line}\nkeys after:\n{}", show_keys(&dump.keys)),
            );
        }
        if changed == BTreeSet::from([false]) && aborted && !ambiguous && step.module_only() {
            self.fail(
                &step,
                "WATCH fired but the step changed nothing (invariant 2/5)",
                &format!("{replies_line}\nkeys after:\n{}", show_keys(&dump.keys)),
            );
        }

        // 2. Keys the module's steps left alone keep their encoding.
        if step.module_only() {
            if let Some(first) = matches.first() {
                for (key, encoding) in &dump.encodings {
                    let unchanged = !first.touched.contains(key);
                    if let (true, Some(before)) = (unchanged, self.encodings.get(key)) {
                        if before != encoding {
                            self.fail(
                                &step,
                                "a key the step did not change changed its encoding (invariant 2)",
                                &format!(
                                    "{replies_line}\n{}: OBJECT ENCODING was {before}, is {encoding}",
                                    show(key)
                                ),
                            );
                        }
                    }
                }
            }
        }

        // 4. While only the module wrote a name's sets, they expire at the latest deadline.
        self.check_module_only_expiry(&step, &dump, &replies_line);

        // The keys read back are the model from here on (the check above accepted them).
        if let Some(first) = matches.into_iter().next() {
            self.world.fencing = first.post.fencing;
            self.world.bindings = first.post.bindings;
        }
        self.world.keys = dump.keys;
        self.encodings = dump.encodings;
        self.last_t1 = t1;
        self.history.push_back(line);
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
    }

    fn check_module_only_expiry(&mut self, step: &Step, dump: &Dump, replies_line: &str) {
        for args in step.ops() {
            if args[0].eq_ignore_ascii_case(b"FLUSHDB") {
                self.clean = NAMES.iter().map(|n| n.as_bytes().to_vec()).collect();
            }
            for name in NAMES.iter().map(|n| n.as_bytes()) {
                let (owner, permits) = (owner_key(name), permits_key(name));
                if args[1..]
                    .iter()
                    .any(|a| a == name || *a == owner || *a == permits)
                {
                    self.clean.remove(name);
                }
            }
        }
        for name in NAMES.iter().map(|n| n.as_bytes().to_vec()) {
            let holders = dump.keys.get(&name);
            let owners = dump.keys.get(&owner_key(&name));
            let permits = dump.keys.get(&permits_key(&name));
            if holders.is_none() && owners.is_none() && permits.is_none() {
                self.clean.insert(name);
                continue;
            }
            if !self.clean.contains(&name) {
                continue;
            }
            self.stats.settle_checks += 1;
            let problem = match (holders, owners) {
                (None, _) => {
                    Some("the owner set or the permits exist without the holder set".to_string())
                }
                (Some(h), _) if permits.is_some_and(|p| p.expire != h.expire) => Some(format!(
                    "{}:permits expires at {:?}, {} at {:?}",
                    show(&name),
                    permits.and_then(|p| p.expire),
                    show(&name),
                    h.expire
                )),
                (Some(h), owners) => {
                    let latest = match &h.value {
                        Value::ZSet(z) => z.highest_score().map(deadline_ms),
                        _ => None,
                    };
                    if h.expire != latest {
                        Some(format!(
                            "{} expires at {:?}, its latest deadline is {latest:?}",
                            show(&name),
                            h.expire
                        ))
                    } else if owners.is_some_and(|o| o.expire != h.expire) {
                        Some(format!(
                            "{}:owner expires at {:?}, {} at {:?}",
                            show(&name),
                            owners.and_then(|o| o.expire),
                            show(&name),
                            h.expire
                        ))
                    } else {
                        None
                    }
                }
            };
            if let Some(problem) = problem {
                self.fail(
                    step,
                    "a set only the module wrote does not expire at its latest deadline (invariant 4)",
                    &format!("{replies_line}\n{problem}\nkeys after:\n{}", show_keys(&dump.keys)),
                );
            }
        }
    }

    /// Lets every key that expires within [`QUIET_MS`] expire (and be deleted, so a replica
    /// and the AOF see the deletion), then returns the keys.
    fn quiesce(&mut self) -> Dump {
        let _: () = redis::cmd("DEBUG")
            .arg("SET-ACTIVE-EXPIRE")
            .arg(1)
            .query(&mut self.main)
            .expect("DEBUG SET-ACTIVE-EXPIRE");
        for _ in 0..100 {
            let dump = self.read_back();
            let soon = dump
                .keys
                .values()
                .filter_map(|e| e.expire)
                .filter(|&at| at < dump.time_ms + QUIET_MS)
                .max();
            match soon {
                None => return dump,
                Some(at) => sleep(Duration::from_millis((at - dump.time_ms + 2).max(1) as u64)),
            }
        }
        panic!("keys kept expiring soon");
    }

    fn summary(&self, elapsed: Duration) -> String {
        let total: u64 = self.stats.steps.values().sum();
        let mut out = format!(
            "model run: seed {}, {total} steps in {:.1} s ({:.0} steps/s)\n",
            self.seed,
            elapsed.as_secs_f64(),
            total as f64 / elapsed.as_secs_f64()
        );
        out += "steps:";
        for (kind, count) in &self.stats.steps {
            out += &format!(" {kind}={count}");
        }
        out += &format!(
            "\nbackground ({:.1} s):",
            self.stats.background_time.as_secs_f64()
        );
        for (what, count) in &self.stats.background {
            out += &format!(" [{what}]={count}");
        }
        out += "\nSEM.* outcomes:";
        for (label, count) in &self.stats.outcomes {
            out += &format!(" [{label}]={count}");
        }
        out += &format!(
            "\nWATCH fired {} times ({} steps with an expiry inside the watch); {} steps with \
             several explanations, {} inconclusive; clock window widest {} ms, mean {:.2} ms; \
             {} expiry checks of module-only sets; {} fencing jumps\n\
             time: {:.1} s in the main client's pipelines, {:.1} s in the watcher's, {:.1} s \
             in the model\n",
            self.stats.watch_fired,
            self.stats.watch_ambiguous,
            self.stats.several_explanations,
            self.stats.inconclusive,
            self.stats.widest_window_ms,
            self.stats.window_total_ms as f64 / total.max(1) as f64,
            self.stats.settle_checks,
            self.stats.fencing_jumps,
            self.stats.server_time.as_secs_f64(),
            self.stats.watch_time.as_secs_f64(),
            self.stats.model_time.as_secs_f64(),
        );
        out
    }
}

/// SEM.GET name JSON on a server, holders' ms_left left out (the clocks read differ).
fn descriptions(conn: &mut redis::Connection) -> Vec<String> {
    let commands: Vec<Vec<Bytes>> = NAMES.iter().map(|n| cmd(&["SEM.GET", n, "JSON"])).collect();
    pipeline(conn, &commands)
        .expect("SEM.GET")
        .iter()
        .map(|v| match reply_of(v) {
            Reply::Bulk(text) => {
                let mut doc: serde_json::Value = serde_json::from_slice(&text).expect("JSON");
                if let Some(holders) = doc["holders"].as_array_mut() {
                    for holder in holders {
                        holder.as_object_mut().expect("a holder").remove("ms_left");
                    }
                }
                doc.to_string()
            }
            other => other.to_string(),
        })
        .collect()
}

#[test]
fn random_steps_match_the_model_and_keep_every_invariant() {
    let profile = profile();
    println!(
        "REDSEM_MODEL_SEED={} REDSEM_MODEL_STEPS={} REDSEM_MODEL_RELOAD_STEPS={}",
        profile.seed, profile.steps, profile.reload_steps
    );
    let started = Instant::now();
    let primary = Server::start_with(&PRIMARY_ARGS);
    let (valkey, _) = server_kind(&mut primary.connection());
    // A standalone server: no command filter on any server.
    sem::UNFILTERED.store(true, std::sync::atomic::Ordering::Relaxed);
    sem::SCRIPT_ARITY_NAMES_REDIS.store(!valkey, std::sync::atomic::Ordering::Relaxed);
    let replica = start_replica_of(&primary);
    let mut run = Run::new(&primary, profile.seed);
    run.background_rate = profile.background;
    run.steps(profile.steps);
    check_log(&primary, "primary");

    // The replica holds exactly the primary's keys.
    let settled = run.quiesce();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut run.main)
        .expect("WAIT");
    assert_eq!(acked, 1, "the replica did not acknowledge");
    let mut on_replica = connect(&replica);
    let replica_dump = dump_with_script(&mut on_replica, &run.universe);
    if let Err(diff) = compare(
        &settled.keys,
        &replica_dump.keys,
        settled.time_ms,
        settled.time_ms,
    ) {
        panic!(
            "REDSEM_MODEL_SEED={}: the replica differs from the primary: {diff}\nprimary:\n{}replica:\n{}",
            profile.seed,
            show_keys(&settled.keys),
            show_keys(&replica_dump.keys)
        );
    }
    assert_eq!(
        descriptions(&mut on_replica),
        descriptions(&mut run.main),
        "REDSEM_MODEL_SEED={}: SEM.GET JSON on the replica and the primary",
        profile.seed
    );
    check_log(&replica, "replica");

    // An AOF reload holds exactly the same keys, before any new grant.
    let dir = primary.stop();
    let reloaded = Server::restart_in(&dir, &PRIMARY_ARGS);
    let mut conn = connect(&reloaded);
    let reloaded_dump = dump_with_script(&mut conn, &run.universe);
    if let Err(diff) = compare(
        &settled.keys,
        &reloaded_dump.keys,
        settled.time_ms,
        settled.time_ms,
    ) {
        panic!(
            "REDSEM_MODEL_SEED={}: the AOF reload differs from the primary: {diff}\nbefore:\n{}after:\n{}",
            profile.seed,
            show_keys(&settled.keys),
            show_keys(&reloaded_dump.keys)
        );
    }

    // More steps on the reloaded server: its load took a floor, which each name's first fair
    // grant reaches.
    run.attach(&reloaded);
    run.steps(profile.reload_steps);
    check_log(&reloaded, "reloaded primary");
    let summary = run.summary(started.elapsed());
    println!("{summary}");
    let counters: Vec<String> = NAMES
        .iter()
        .map(|n| {
            let key = counter_key(n.as_bytes());
            format!(
                "{n}:counter={:?}",
                run.world.keys.get(&key).map(|e| e.to_string())
            )
        })
        .collect();
    println!("counters at the end: {}", counters.join(" "));
}
