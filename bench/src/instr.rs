//! The instr set: what one call costs the server, in instructions counted by callgrind, beside
//! the client-side scripts the commands replace and Redis's own commands.
//!
//! Debian's redis-server runs under `valgrind --tool=callgrind` with the module loaded (once
//! per module configuration); one connection sends one command at a time and reads its reply
//! (no pipelining). Each contender runs a warm-up, then its measured operations between
//! `callgrind_control -z` and `-d`; the figure is the span's instructions outside `serverCron`
//! (the server's housekeeping, whose share grows with wall time, not with requests) over the
//! operations. A hand-off passes one permit (limit 1) between two connections: the waiter's
//! `... WAIT 5` is sent, and once the server has had time to block it, the holder releases;
//! the module's own count of waits proves afterwards that every hand-off was one.

use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use uuid::Uuid;

use crate::callgrind::{server_version, Callgrind, Dump};
use crate::fmt::group_thousands;
use crate::resp::{RawConn, Reply};
use crate::BoxError;

const FAIR_ACQUIRE_LUA: &str = include_str!("../lua/fair_acquire.lua");
const FAIR_RELEASE_LUA: &str = include_str!("../lua/fair_release.lua");
const NONFAIR_ACQUIRE_LUA: &str = include_str!("../lua/nonfair_acquire.lua");

/// Measured pairs and calls per contender, full run and smoke run.
pub const FULL_PAIRS: u64 = 1_000;
pub const SMOKE_PAIRS: u64 = 20;
/// Measured hand-offs per contender (each waits for the server to block the waiter).
pub const FULL_HANDOFFS: u64 = 250;
pub const SMOKE_HANDOFFS: u64 = 5;
/// Default time the holder leaves the server to block the waiter before it releases.
pub const SETTLE_MS: u64 = 20;
/// The limit of the pairs: never reached, so every acquire is granted.
const LIMIT: &str = "1000000";
const LEASE_SECS: &str = "60";
const LEASE_MS: &str = "60000";

/// A module configuration the set loads the module with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum ModuleConfig {
    /// `command-filter 0`: no command filter; the commands add their derived keys themselves.
    /// The default once keys are declared by the commands rather than by the filter.
    NoFilter,
    /// No module arguments: the command filter names the derived keys.
    Filter,
}

impl ModuleConfig {
    pub const ALL: [ModuleConfig; 2] = [ModuleConfig::NoFilter, ModuleConfig::Filter];

    pub fn args(self) -> Vec<String> {
        match self {
            ModuleConfig::NoFilter => vec!["command-filter".into(), "0".into()],
            ModuleConfig::Filter => Vec::new(),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            ModuleConfig::NoFilter => "`command-filter 0` (no filter)",
            ModuleConfig::Filter => "command filter (no module arguments)",
        }
    }
}

impl fmt::Display for ModuleConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModuleConfig::NoFilter => "no-filter",
            ModuleConfig::Filter => "filter",
        })
    }
}

/// What one operation of a contender is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Pair,
    Handoff,
    Call,
}

impl Unit {
    fn label(self) -> &'static str {
        match self {
            Unit::Pair => "pair",
            Unit::Handoff => "hand-off",
            Unit::Call => "call",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Contender {
    /// `INCR k` + `DECR k`.
    Floor,
    /// `SEM.ACQUIRE s 1000000 60 ID i` + `SEM.RELEASE s i`.
    Plain,
    /// The non-fair script by `EVALSHA` + `ZREM`.
    NonfairLua,
    /// `SEM.ACQUIREFAIR s 1000000 60 ID i` + `SEM.RELEASE s i`.
    Fair,
    /// The fair recipe as one script + its release script.
    FairLua,
    /// `SEM.ACQUIRE s 1 60 WAIT 5` served by the holder's `SEM.RELEASE`.
    HandoffPlain,
    /// `SEM.ACQUIREFAIR s 1 60 WAIT 5` served by the holder's `SEM.RELEASE`.
    HandoffFair,
    /// `BLPOP tok 5` served by the holder's `RPUSH tok x`.
    Blpop,
    /// `SEM.ACQUIRE ... COUNT 4` + `SEM.RELEASE`.
    Count,
    /// `SEM.ACQUIREALL 2 ...` + `SEM.RELEASEALL 2 ...`.
    Set,
    /// `SEM.REFRESH` of a live holder, its lease 3600 s and 3601 s in turn so that every call
    /// moves the deadline (one in the same millisecond as the last would write nothing, and
    /// the count would follow the machine's speed).
    Refresh,
    /// `SEM.REFRESHALL 2` of a live holder, the lease in turn as for `Refresh`.
    Refreshall,
    /// `SEM.GET` of a semaphore with one holder.
    Get,
    /// `SEM.WAITEMPTY` of an empty semaphore (answered at once).
    Waitempty,
    /// `SEM.LIMIT s 5` + `SEM.LIMIT s CLEAR`.
    Limit,
}

impl Contender {
    pub const ALL: [Contender; 15] = [
        Contender::Floor,
        Contender::Plain,
        Contender::NonfairLua,
        Contender::Fair,
        Contender::FairLua,
        Contender::HandoffPlain,
        Contender::HandoffFair,
        Contender::Blpop,
        Contender::Count,
        Contender::Set,
        Contender::Refresh,
        Contender::Refreshall,
        Contender::Get,
        Contender::Waitempty,
        Contender::Limit,
    ];
    /// The smoke run's: one of each kind of driver.
    pub const SMOKE: [Contender; 4] = [
        Contender::Floor,
        Contender::Plain,
        Contender::HandoffPlain,
        Contender::Blpop,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Contender::Floor => "floor: `INCR k` + `DECR k`",
            Contender::Plain => "plain: `SEM.ACQUIRE s 1000000 60 ID i` + `SEM.RELEASE s i`",
            Contender::NonfairLua => "non-fair Lua script by `EVALSHA` + `ZREM`",
            Contender::Fair => "fair: `SEM.ACQUIREFAIR s 1000000 60 ID i` + `SEM.RELEASE s i`",
            Contender::FairLua => "the fair recipe as one Lua script + its Lua release",
            Contender::HandoffPlain => "hand-off, `SEM.ACQUIRE s 1 60 WAIT 5` / `SEM.RELEASE`",
            Contender::HandoffFair => "hand-off, `SEM.ACQUIREFAIR s 1 60 WAIT 5` / `SEM.RELEASE`",
            Contender::Blpop => "Redis's own: `BLPOP tok 5` / `RPUSH tok x`",
            Contender::Count => "`SEM.ACQUIRE ... COUNT 4` + `SEM.RELEASE`",
            Contender::Set => "`SEM.ACQUIREALL 2 ...` + `SEM.RELEASEALL 2 ...`",
            Contender::Refresh => "`SEM.REFRESH s i 3600` / `3601` in turn (live holder)",
            Contender::Refreshall => "`SEM.REFRESHALL 2 a b i 3600` / `3601` in turn (live holder)",
            Contender::Get => "`SEM.GET s` (one holder)",
            Contender::Waitempty => "`SEM.WAITEMPTY e 1` (empty: answered at once)",
            Contender::Limit => "`SEM.LIMIT s 5` + `SEM.LIMIT s CLEAR`",
        }
    }

    pub fn unit(self) -> Unit {
        match self {
            Contender::HandoffPlain | Contender::HandoffFair | Contender::Blpop => Unit::Handoff,
            Contender::Refresh | Contender::Refreshall | Contender::Get | Contender::Waitempty => {
                Unit::Call
            }
            _ => Unit::Pair,
        }
    }

    /// What the contender is held against, and the highest ratio it may reach.
    pub fn target(self) -> Option<(Contender, f64)> {
        match self {
            Contender::Plain => Some((Contender::NonfairLua, 0.5)),
            Contender::Fair => Some((Contender::FairLua, 0.4)),
            Contender::HandoffPlain => Some((Contender::Blpop, 1.6)),
            Contender::HandoffFair => Some((Contender::Blpop, 2.0)),
            _ => None,
        }
    }

    /// The ratio shown without a target.
    fn compared(self) -> Option<Contender> {
        self.target().map(|(c, _)| c).or(match self {
            Contender::Floor => None,
            Contender::NonfairLua | Contender::FairLua | Contender::Blpop => None,
            _ => Some(Contender::Floor),
        })
    }

    fn waits(self) -> bool {
        matches!(self, Contender::HandoffPlain | Contender::HandoffFair)
    }
}

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = clap::ValueEnum::to_possible_value(self).expect("no skipped variants");
        f.write_str(value.get_name())
    }
}

/// What the instr set runs.
#[derive(Clone, Debug)]
pub struct InstrPlan {
    pub server: PathBuf,
    pub module: PathBuf,
    pub configs: Vec<ModuleConfig>,
    pub contenders: Vec<Contender>,
    pub pairs: u64,
    pub handoffs: u64,
    pub settle: Duration,
    pub cpu: Option<usize>,
    /// Where the servers' files and callgrind's dumps stay (for `callgrind_annotate`).
    pub dir: PathBuf,
}

/// One contender's count.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub contender: Contender,
    pub dump: Dump,
    pub ops: u64,
    /// The dump's file number, for `callgrind_annotate`.
    pub dump_number: u32,
}

impl Row {
    pub fn per_op(&self) -> f64 {
        self.dump.without_cron() as f64 / self.ops as f64
    }
}

#[derive(Debug)]
pub struct ConfigResults {
    pub config: ModuleConfig,
    pub version: String,
    pub rows: Vec<Row>,
    pub dir: PathBuf,
}

impl ConfigResults {
    fn row(&self, contender: Contender) -> Option<&Row> {
        self.rows.iter().find(|r| r.contender == contender)
    }

    /// The contender's count over what it is compared with, when both ran.
    fn ratio(&self, contender: Contender) -> Option<(Contender, f64)> {
        let other = contender.compared()?;
        Some((
            other,
            self.row(contender)?.per_op() / self.row(other)?.per_op(),
        ))
    }
}

#[derive(Debug)]
pub struct InstrResults {
    pub plan: InstrPlan,
    pub configs: Vec<ConfigResults>,
    pub elapsed: Duration,
}

pub async fn run(plan: InstrPlan) -> Result<InstrResults, BoxError> {
    let started = Instant::now();
    let mut configs = Vec::with_capacity(plan.configs.len());
    for &config in &plan.configs {
        let result = measure_config(&plan, config).await;
        configs.push(result.map_err(|e| format!("instr set, {config}: {e}"))?);
    }
    Ok(InstrResults {
        plan,
        configs,
        elapsed: started.elapsed(),
    })
}

async fn measure_config(plan: &InstrPlan, config: ModuleConfig) -> Result<ConfigResults, BoxError> {
    // Absolute: the server runs in it, and its log path is given from here.
    let dir = std::path::absolute(plan.dir.join(config.to_string()))?;
    let _ = std::fs::remove_dir_all(&dir);
    let args = config.args();
    let mut server = Callgrind::start(&plan.server, Some((&plan.module, &args)), &dir, plan.cpu)?;
    let mut control = server.connect().await?;
    let version = server_version(&mut control).await?;
    let mut a = RawConn::open(server.port).await?;
    let mut b = RawConn::open(server.port).await?;
    let scripts = Scripts {
        fair_acquire: load_script(&mut a, FAIR_ACQUIRE_LUA).await?,
        fair_release: load_script(&mut a, FAIR_RELEASE_LUA).await?,
        nonfair_acquire: load_script(&mut a, NONFAIR_ACQUIRE_LUA).await?,
    };
    let mut rows = Vec::with_capacity(plan.contenders.len());
    for &contender in &plan.contenders {
        let ops = match contender.unit() {
            Unit::Handoff => plan.handoffs,
            _ => plan.pairs,
        };
        let mut driver = Driver {
            a: &mut a,
            b: &mut b,
            scripts: &scripts,
            contender,
            settle: plan.settle,
            holder: None,
            ops: 0,
        };
        driver.setup().await?;
        driver.run((ops / 5).max(5)).await?;
        let waits_before = sem_info(&mut control, "sem_waits_started").await?;
        server.zero()?;
        driver.run(ops).await?;
        let dump = server.dump().await?;
        driver.teardown().await?;
        if contender.waits() {
            let waits = sem_info(&mut control, "sem_waits_started").await? - waits_before;
            if waits != ops {
                return Err(format!(
                    "{contender}: {waits} of {ops} acquires waited; the server needs more \
                     than --instr-settle-ms to block a waiter"
                )
                .into());
            }
        }
        let row = Row {
            contender,
            dump,
            ops,
            dump_number: server.dumps(),
        };
        eprintln!(
            "[instr] {version}, {config}, {contender}: {} instructions/{}",
            group_thousands(row.per_op().round() as u64),
            contender.unit().label()
        );
        rows.push(row);
    }
    Ok(ConfigResults {
        config,
        version,
        rows,
        dir,
    })
}

struct Scripts {
    fair_acquire: String,
    fair_release: String,
    nonfair_acquire: String,
}

async fn load_script(conn: &mut RawConn, source: &str) -> Result<String, BoxError> {
    match call(conn, &["SCRIPT", "LOAD", source]).await? {
        Reply::Text(sha) => Ok(sha),
        other => Err(format!("SCRIPT LOAD replied {other:?}").into()),
    }
}

/// One command, one reply; an error reply is an error.
async fn call(conn: &mut RawConn, args: &[&str]) -> Result<Reply, BoxError> {
    conn.send(args).await?;
    match conn.read().await? {
        Reply::Error(e) => Err(format!("{}: {e}", args.join(" ")).into()),
        reply => Ok(reply),
    }
}

/// One command whose reply must be `want`.
async fn expect(conn: &mut RawConn, args: &[&str], want: Reply) -> Result<(), BoxError> {
    let got = call(conn, args).await?;
    if got == want {
        Ok(())
    } else {
        Err(format!("{} replied {got:?}, not {want:?}", args.join(" ")).into())
    }
}

/// One command that must reply a bulk string (an identifier).
async fn text(conn: &mut RawConn, args: &[&str]) -> Result<String, BoxError> {
    match call(conn, args).await? {
        Reply::Text(text) => Ok(text),
        other => Err(format!("{} replied {other:?}", args.join(" ")).into()),
    }
}

fn acquire_command(contender: Contender) -> &'static str {
    match contender {
        Contender::Fair | Contender::HandoffFair => "SEM.ACQUIREFAIR",
        _ => "SEM.ACQUIRE",
    }
}

fn new_id() -> String {
    Uuid::new_v4().to_string()
}

fn now_ms() -> String {
    (crate::resp::unix_ms() as u64).to_string()
}

/// Runs one contender's operations on two connections.
struct Driver<'a> {
    a: &'a mut RawConn,
    b: &'a mut RawConn,
    scripts: &'a Scripts,
    contender: Contender,
    settle: Duration,
    /// A hand-off's holder: whether `a` holds, and its identifier.
    holder: Option<(bool, String)>,
    /// Operations so far (the refreshes alternate their lease by it).
    ops: u64,
}

const SEM: &str = "redsem-instr:s";
const OWNER: &str = "redsem-instr:s:owner";
const COUNTER: &str = "redsem-instr:s:counter";
const SECOND: &str = "redsem-instr:s2";
const EMPTY: &str = "redsem-instr:empty";
const TOKEN: &str = "redsem-instr:tok";
const FLOOR: &str = "redsem-instr:k";
const HELD: &str = "redsem-instr-holder";

impl Driver<'_> {
    /// Puts the contender's keys in place: a holder to refresh or count, or the first holder
    /// of a hand-off.
    async fn setup(&mut self) -> Result<(), BoxError> {
        let conn = &mut *self.a;
        let mut keys = vec!["DEL", SEM, SECOND, EMPTY, TOKEN, FLOOR];
        let derived: Vec<String> = [SEM, SECOND]
            .iter()
            .flat_map(|name| {
                [":owner", ":counter", ":permits", ":limit"].map(|s| format!("{name}{s}"))
            })
            .collect();
        keys.extend(derived.iter().map(String::as_str));
        call(conn, &keys).await?;
        match self.contender {
            Contender::Refresh | Contender::Get => {
                text(conn, &["SEM.ACQUIRE", SEM, LIMIT, "3600", "ID", HELD]).await?;
            }
            Contender::Refreshall => {
                let args = [
                    "SEM.ACQUIREALL",
                    "2",
                    SEM,
                    LIMIT,
                    "1",
                    SECOND,
                    LIMIT,
                    "1",
                    "3600",
                    "ID",
                    HELD,
                ];
                text(conn, &args).await?;
            }
            Contender::HandoffPlain | Contender::HandoffFair => {
                let acquire = acquire_command(self.contender);
                let id = text(conn, &[acquire, SEM, "1", LEASE_SECS]).await?;
                self.holder = Some((true, id));
            }
            Contender::Blpop => {
                expect(conn, &["RPUSH", TOKEN, "x"], Reply::Int(1)).await?;
                let popped = call(conn, &["BLPOP", TOKEN, "5"]).await?;
                if !matches!(popped, Reply::Array(_)) {
                    return Err(format!("BLPOP replied {popped:?}").into());
                }
                self.holder = Some((true, String::new()));
            }
            _ => {}
        }
        Ok(())
    }

    async fn teardown(&mut self) -> Result<(), BoxError> {
        self.holder = None;
        call(self.a, &["DEL", SEM, OWNER, COUNTER, SECOND, TOKEN]).await?;
        Ok(())
    }

    fn acquire(&self) -> &'static str {
        acquire_command(self.contender)
    }

    async fn run(&mut self, ops: u64) -> Result<(), BoxError> {
        for _ in 0..ops {
            self.op().await?;
        }
        Ok(())
    }

    async fn op(&mut self) -> Result<(), BoxError> {
        self.ops += 1;
        let lease = if self.ops.is_multiple_of(2) {
            "3600"
        } else {
            "3601"
        };
        let conn = &mut *self.a;
        let scripts = self.scripts;
        match self.contender {
            Contender::Floor => {
                expect(conn, &["INCR", FLOOR], Reply::Int(1)).await?;
                expect(conn, &["DECR", FLOOR], Reply::Int(0)).await?;
            }
            Contender::Plain | Contender::Fair => {
                let id = new_id();
                let acquire = acquire_command(self.contender);
                expect(
                    conn,
                    &[acquire, SEM, LIMIT, LEASE_SECS, "ID", &id],
                    Reply::Text(id.clone()),
                )
                .await?;
                expect(conn, &["SEM.RELEASE", SEM, &id], Reply::Int(1)).await?;
            }
            Contender::NonfairLua => {
                let id = new_id();
                let (sha, now) = (&scripts.nonfair_acquire, now_ms());
                let args = ["EVALSHA", sha, "1", SEM, LIMIT, &id, LEASE_MS, &now];
                expect(conn, &args, Reply::Int(1)).await?;
                expect(conn, &["ZREM", SEM, &id], Reply::Int(1)).await?;
            }
            Contender::FairLua => {
                let id = new_id();
                let (sha, now) = (&scripts.fair_acquire, now_ms());
                let args = [
                    "EVALSHA", sha, "3", SEM, OWNER, COUNTER, LIMIT, LEASE_MS, &now, &id,
                ];
                expect(conn, &args, Reply::Int(1)).await?;
                let sha = &scripts.fair_release;
                let args = ["EVALSHA", sha, "2", SEM, OWNER, &id];
                expect(conn, &args, Reply::Int(1)).await?;
            }
            Contender::Count => {
                let id = new_id();
                let args = [
                    "SEM.ACQUIRE",
                    SEM,
                    LIMIT,
                    LEASE_SECS,
                    "ID",
                    &id,
                    "COUNT",
                    "4",
                ];
                expect(conn, &args, Reply::Text(id.clone())).await?;
                expect(conn, &["SEM.RELEASE", SEM, &id], Reply::Int(1)).await?;
            }
            Contender::Set => {
                let id = new_id();
                let args = [
                    "SEM.ACQUIREALL",
                    "2",
                    SEM,
                    LIMIT,
                    "1",
                    SECOND,
                    LIMIT,
                    "1",
                    LEASE_SECS,
                    "ID",
                    &id,
                ];
                expect(conn, &args, Reply::Text(id.clone())).await?;
                let args = ["SEM.RELEASEALL", "2", SEM, SECOND, &id];
                expect(conn, &args, Reply::Int(2)).await?;
            }
            Contender::Refresh => {
                let args = ["SEM.REFRESH", SEM, HELD, lease];
                expect(conn, &args, Reply::Int(1)).await?;
            }
            Contender::Refreshall => {
                let args = ["SEM.REFRESHALL", "2", SEM, SECOND, HELD, lease];
                expect(conn, &args, Reply::Int(2)).await?;
            }
            Contender::Get => expect(conn, &["SEM.GET", SEM], Reply::Int(1)).await?,
            Contender::Waitempty => {
                expect(conn, &["SEM.WAITEMPTY", EMPTY, "1"], Reply::Int(1)).await?
            }
            Contender::Limit => {
                expect(conn, &["SEM.LIMIT", SEM, "5"], Reply::Text("OK".into())).await?;
                expect(conn, &["SEM.LIMIT", SEM, "CLEAR"], Reply::Int(1)).await?;
            }
            Contender::HandoffPlain | Contender::HandoffFair | Contender::Blpop => {
                self.handoff().await?
            }
        }
        Ok(())
    }

    /// The waiter asks, the server blocks it, the holder gives back, the waiter holds.
    async fn handoff(&mut self) -> Result<(), BoxError> {
        let (a_holds, id) = self.holder.take().ok_or("a hand-off without a holder")?;
        let acquire = self.acquire();
        let (holder, waiter) = if a_holds {
            (&mut *self.a, &mut *self.b)
        } else {
            (&mut *self.b, &mut *self.a)
        };
        let blpop = self.contender == Contender::Blpop;
        if blpop {
            waiter.send(&["BLPOP", TOKEN, "5"]).await?;
        } else {
            waiter
                .send(&[acquire, SEM, "1", LEASE_SECS, "WAIT", "5"])
                .await?;
        }
        tokio::time::sleep(self.settle).await;
        let next = if blpop {
            expect(holder, &["RPUSH", TOKEN, "x"], Reply::Int(1)).await?;
            match waiter.read().await? {
                Reply::Array(_) => String::new(),
                other => return Err(format!("BLPOP replied {other:?}").into()),
            }
        } else {
            expect(holder, &["SEM.RELEASE", SEM, &id], Reply::Int(1)).await?;
            match waiter.read().await? {
                Reply::Text(id) => id,
                other => return Err(format!("{acquire} ... WAIT replied {other:?}").into()),
            }
        };
        self.holder = Some((!a_holds, next));
        Ok(())
    }
}

/// One integer field of `INFO sem`.
async fn sem_info(control: &mut MultiplexedConnection, field: &str) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO").arg("sem").query_async(control).await?;
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("INFO sem reports no {field}").into())
}

/// The set's section of the report: one table, a column pair per module configuration.
pub fn section(r: &InstrResults) -> String {
    let mut out = String::new();
    let plan = &r.plan;
    let version = r.configs.first().map_or("", |c| c.version.as_str());
    let _ = writeln!(
        out,
        "\nInstructions per call: {version} (`{}`) under `valgrind --tool=callgrind \
         --dump-instr=no`, `--save '' --appendonly no`, `--loadmodule {}` with the \
         configuration of each column; one connection, one command at a time (no pipelining); \
         {} pairs or calls, or {} hand-offs (limit 1, two connections: the waiter's command is \
         sent, {} ms later the holder gives back), per contender after a warm-up of a fifth as \
         many, between `callgrind_control -z` and `-d`; instructions outside `serverCron` over \
         the operations. Ratio: over the contender it is held against (the script it replaces, \
         BLPOP's hand-off), else over the floor. {} configuration(s) in {:.0} s.\n",
        plan.server.display(),
        plan.module.display(),
        group_thousands(plan.pairs),
        group_thousands(plan.handoffs),
        plan.settle.as_millis(),
        r.configs.len(),
        r.elapsed.as_secs_f64(),
    );
    let mut header = String::from("| contender | per |");
    let mut rule = String::from("| --- | --- |");
    for config in &r.configs {
        let _ = write!(header, " {} | ratio | target |", config.config.label());
        rule.push_str(" ---: | ---: | --- |");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    for &contender in &plan.contenders {
        let _ = write!(
            out,
            "| {} | {} |",
            contender.label(),
            contender.unit().label()
        );
        for config in &r.configs {
            let count = config.row(contender).map_or("–".into(), |row| {
                group_thousands(row.per_op().round() as u64)
            });
            let ratio = config
                .ratio(contender)
                .map_or(String::new(), |(other, ratio)| {
                    format!("{ratio:.2} × {other}")
                });
            let target = match (contender.target(), config.ratio(contender)) {
                (Some((_, at_most)), Some((_, ratio))) => format!(
                    "≤ {at_most:.1}: {}",
                    if ratio <= at_most {
                        "met"
                    } else {
                        "**missed**"
                    }
                ),
                _ => String::new(),
            };
            let _ = write!(out, " {count} | {ratio} | {target} |");
        }
        out.push('\n');
    }
    out
}

/// One row per configuration and contender, every figure unrounded.
pub fn tsv(r: &InstrResults) -> String {
    let mut out = String::from(
        "server\tconfig\tcontender\tunit\tops\tinstructions\tcron_instructions\tper_op\t\
         compared_with\tratio\ttarget\tmet\tdump\n",
    );
    for config in &r.configs {
        for row in &config.rows {
            let ratio = config.ratio(row.contender);
            let target = row.contender.target();
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.1}\t{}\t{}\t{}\t{}\t{}",
                config.version,
                config.config,
                row.contender,
                row.contender.unit().label(),
                row.ops,
                row.dump.instructions,
                row.dump.cron_instructions.unwrap_or(0),
                row.per_op(),
                ratio.map_or(String::new(), |(c, _)| c.to_string()),
                ratio.map_or(String::new(), |(_, r)| format!("{r:.4}")),
                target.map_or(String::new(), |(_, t)| t.to_string()),
                match (target, ratio) {
                    (Some((_, t)), Some((_, r))) => (r <= t).to_string(),
                    _ => String::new(),
                },
                config
                    .dir
                    .join(format!("callgrind.out.{}", row.dump_number))
                    .display(),
            );
        }
    }
    out
}
