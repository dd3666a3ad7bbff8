//! A server binary run under `valgrind --tool=callgrind`, and the instructions it executes
//! between two points of a load: the machinery of the host and instr sets. Instruction counts
//! repeat where wall-clock time does not on a shared machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::BoxError;

/// A server under valgrind starts in seconds; a slow machine gets more.
const START_TIMEOUT: Duration = Duration::from_secs(120);
const DUMP_TIMEOUT: Duration = Duration::from_secs(60);

/// The instructions of one span between [`Callgrind::zero`] and [`Callgrind::dump`].
#[derive(Clone, Copy, Debug)]
pub struct Dump {
    pub instructions: u64,
    /// Of those, the ones inside `serverCron` (with what it calls), when the binary names its
    /// functions: housekeeping whose share grows with wall time, not with requests.
    pub cron_instructions: Option<u64>,
}

impl Dump {
    /// Instructions outside `serverCron` (all of them when the binary does not name it).
    pub fn without_cron(&self) -> u64 {
        self.instructions - self.cron_instructions.unwrap_or(0)
    }
}

/// A server binary running under callgrind on a free loopback port; killed
/// (with valgrind) when dropped.
pub struct Callgrind {
    child: Child,
    pub port: u16,
    out_file: PathBuf,
    dumps: u32,
    dir: PathBuf,
}

impl Callgrind {
    /// Starts `server` with `--save '' --appendonly no`, and with `module` (its path and the
    /// arguments after it) when given; its files and the dumps go to `dir`.
    pub fn start(
        server: &Path,
        module: Option<(&Path, &[String])>,
        dir: &Path,
        cpu: Option<usize>,
    ) -> Result<Self, BoxError> {
        std::fs::create_dir_all(dir)?;
        let port = free_port()?;
        let out_file = dir.join("callgrind.out");
        // taskset execs valgrind, which runs the server in the same process:
        // the child's pid is the server's, as callgrind_control wants it.
        let mut command = match cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpu.to_string()).arg("valgrind");
                c
            }
            None => Command::new("valgrind"),
        };
        command
            .arg("--tool=callgrind")
            .arg("--dump-instr=no")
            .arg(format!("--callgrind-out-file={}", out_file.display()))
            .arg(format!("--log-file={}", dir.join("valgrind.log").display()))
            .arg(server)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            // The host set loads the module into a running server (MODULE LOAD).
            .args(["--enable-module-command", "yes"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("server.log"));
        if let Some((module, args)) = module {
            command.arg("--loadmodule").arg(module).args(args);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run valgrind (is it installed?): {e}"))?;
        Ok(Callgrind {
            child,
            port,
            out_file,
            dumps: 0,
            dir: dir.to_path_buf(),
        })
    }

    /// Waits until the server answers, and returns a connection to it.
    pub async fn connect(&mut self) -> Result<MultiplexedConnection, BoxError> {
        let started = Instant::now();
        let client = redis::Client::open(("127.0.0.1", self.port))?;
        loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
                {
                    return Ok(conn);
                }
            }
            if let Some(status) = self.child.try_wait()? {
                return Err(format!(
                    "the server exited ({status}) before it answered; see the tail of its log:\n{}",
                    self.log_tail()
                )
                .into());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!("the server did not answer within {START_TIMEOUT:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tail(&self) -> String {
        let mut tail = String::new();
        for name in ["server.log", "valgrind.log"] {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for line in &lines[lines.len().saturating_sub(10)..] {
                tail.push_str(line);
                tail.push('\n');
            }
        }
        tail
    }

    /// Zeroes the counts: the span to count starts.
    pub fn zero(&self) -> Result<(), BoxError> {
        self.control("-z")
    }

    /// Dumps the counts since [`Callgrind::zero`] and reads them back.
    pub async fn dump(&mut self) -> Result<Dump, BoxError> {
        self.control("-d")?;
        self.dumps += 1;
        let dump = self.dump_path(self.dumps);
        Ok(Dump {
            instructions: read_totals(&dump).await?,
            cron_instructions: cron_instructions(&dump)?,
        })
    }

    /// Dumps taken so far: the last one's number.
    pub fn dumps(&self) -> u32 {
        self.dumps
    }

    /// The file of the `n`th dump, for `callgrind_annotate`.
    pub fn dump_path(&self, n: u32) -> PathBuf {
        PathBuf::from(format!("{}.{n}", self.out_file.display()))
    }

    fn control(&self, flag: &str) -> Result<(), BoxError> {
        let output = Command::new("callgrind_control")
            .arg(flag)
            .arg(self.child.id().to_string())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run callgrind_control: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "callgrind_control {flag} failed: {}{}",
                String::from_utf8_lossy(&output.stdout).trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )
            .into());
        }
        Ok(())
    }
}

impl Drop for Callgrind {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for callgrind to finish writing a dump and returns its total.
async fn read_totals(dump: &Path) -> Result<u64, BoxError> {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(dump).unwrap_or_default();
        if let Some(total) = text.lines().find_map(|l| l.strip_prefix("totals:")) {
            return Ok(total.trim().parse()?);
        }
        if started.elapsed() > DUMP_TIMEOUT {
            return Err(format!("no totals in {} after {DUMP_TIMEOUT:?}", dump.display()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The instructions inside `serverCron` and what it calls, from the dump's
/// inclusive costs (`callgrind_annotate`, which ships with valgrind); `None`
/// when the binary does not name the function.
fn cron_instructions(dump: &Path) -> Result<Option<u64>, BoxError> {
    let output = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(dump)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run callgrind_annotate: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "callgrind_annotate failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    // "13,022,695 ( 1.97%)  ???:serverCron [/usr/bin/redis-server]"
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text.lines().find_map(|line| {
        let (cost, rest) = line.trim_start().split_once(' ')?;
        rest.split_whitespace()
            .any(|word| word.rsplit(':').next() == Some("serverCron"))
            .then(|| cost.replace(',', "").parse().ok())
            .flatten()
    }))
}

/// A port nobody listens on now; the server binds it a moment later.
fn free_port() -> Result<u16, BoxError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// "Redis 7.0.15" or "Valkey 9.1.2", from `INFO server`.
pub async fn server_version(control: &mut MultiplexedConnection) -> Result<String, BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(control)
        .await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    Ok(match (field("valkey_version"), field("redis_version")) {
        (Some(v), _) => format!("Valkey {v}"),
        (None, Some(v)) => format!("Redis {v}"),
        (None, None) => "unknown server".into(),
    })
}
