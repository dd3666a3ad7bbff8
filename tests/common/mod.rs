//! A real redis-server with the module loaded, on a free loopback port, in a scratch directory.
//! Dropping the guard kills and reaps the server even when the test panics.

#![allow(dead_code)] // each test binary uses its own part of the harness

pub mod cluster;
pub mod state;
pub mod stream;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How a server is started beyond its port and directory.
#[derive(Default)]
struct Launch {
    /// A redis.conf, given first on the command line.
    config_file: Option<PathBuf>,
    /// Arguments to the module, after its path.
    module_args: Vec<String>,
    /// Start without the module.
    no_module: bool,
}

pub struct Server {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

/// The primary side of a replication setup: no persistence, and a disk-based full sync, which
/// starts at once (a diskless one waits `repl-diskless-sync-delay`, 5 s by default).
pub const PRIMARY_ARGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "no",
    "--repl-diskless-sync",
    "no",
];

/// No persistence, and `DEBUG` allowed (`DEBUG RELOAD`, `DEBUG SLEEP`).
pub const DEBUG_ARGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "no",
    "--enable-debug-command",
    "yes",
];

/// The module the tests load: `REDSEM_MODULE`, or the debug build `scripts/test` makes first.
pub fn module_path() -> PathBuf {
    let path = std::env::var_os("REDSEM_MODULE").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/libredsem.so"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} is missing: build the module first (cargo build), or run scripts/test",
        path.display()
    );
    path
}

/// A loopback port nobody listens on, and never handed to another server of this test binary:
/// the kernel may give a port just released to the next `bind(0)`, so two tests starting
/// servers at once could otherwise get the same one.
fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("no free loopback port")
            .port();
        if given.insert(port) {
            return port;
        }
    }
}

fn scratch_dir(port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("redsem-test-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create a scratch directory");
    dir
}

impl Server {
    /// A server with the module loaded and no persistence.
    pub fn start() -> Server {
        Server::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// A server with the module loaded and extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Server {
        let port = free_port();
        Server::start_in(scratch_dir(port), port, &Launch::default(), extra)
    }

    /// A server that reads `config` as its redis.conf (in its directory, so CONFIG REWRITE can
    /// write it), loads the module with `module_args`, then takes `extra` arguments.
    pub fn start_configured(config: &str, module_args: &[&str], extra: &[&str]) -> Server {
        let port = free_port();
        let dir = scratch_dir(port);
        let config_file = dir.join("redis.conf");
        std::fs::write(&config_file, config).expect("cannot write redis.conf");
        let launch = Launch {
            config_file: Some(config_file),
            module_args: module_args.iter().map(|a| a.to_string()).collect(),
            no_module: false,
        };
        Server::start_in(dir, port, &launch, extra)
    }

    /// A server without the module (`--enable-module-command yes`: a test may `MODULE LOAD` it
    /// later, as [`module_path`] gives it), no persistence: what the client packages' scripts
    /// run on.
    pub fn start_without_module() -> Server {
        let port = free_port();
        let launch = Launch {
            no_module: true,
            ..Launch::default()
        };
        let extra = [
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-module-command",
            "yes",
        ];
        Server::start_in(scratch_dir(port), port, &launch, &extra)
    }

    /// Starts again in the same directory (to reload an AOF or RDB), on a new port.
    pub fn restart_in(dir: &Path, extra: &[&str]) -> Server {
        Server::start_in(dir.to_path_buf(), free_port(), &Launch::default(), extra)
    }

    fn start_in(dir: PathBuf, port: u16, launch: &Launch, extra: &[&str]) -> Server {
        let redis_server = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let log = std::fs::File::create(dir.join("redis.log")).expect("cannot create the log");
        let child = Command::new(redis_server)
            .args(&launch.config_file)
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--dir"])
            .arg(&dir)
            .args(match launch.no_module {
                true => vec![],
                false => vec![OsString::from("--loadmodule"), module_path().into()],
            })
            .args(&launch.module_args)
            .args(extra)
            .stdout(Stdio::from(log.try_clone().expect("log handle")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("cannot start redis-server: is it installed? (scripts/test installs it)");
        let mut server = Server { child, port, dir };
        server.wait_until_ready();
        server
    }

    fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("redis-server exited with {status}:\n{}", self.log());
            }
            if let Ok(mut conn) = self.try_connection() {
                // LOADING replies are errors: wait until the dataset is in memory.
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer on port {}:\n{}",
                self.port,
                self.log()
            );
            sleep(Duration::from_millis(50));
        }
    }

    fn try_connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?
            .get_connection_with_timeout(Duration::from_secs(5))
    }

    pub fn connection(&self) -> redis::Connection {
        self.try_connection()
            .expect("cannot connect to redis-server")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Stops the server, keeping its directory for a restart.
    pub fn stop(mut self) -> PathBuf {
        self.kill();
        std::mem::take(&mut self.dir)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if !self.dir.as_os_str().is_empty() && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Runs one command built from `args`.
pub fn run<T: redis::FromRedisValue>(conn: &mut redis::Connection, args: &[&str]) -> T {
    try_run(conn, args).unwrap_or_else(|err| panic!("{args:?} failed: {err}"))
}

pub fn try_run<T: redis::FromRedisValue>(
    conn: &mut redis::Connection,
    args: &[&str],
) -> redis::RedisResult<T> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(conn)
}

/// The error reply of a command that must fail: its full text, code first.
pub fn error_of(conn: &mut redis::Connection, args: &[&str]) -> String {
    match try_run::<redis::Value>(conn, args) {
        Ok(value) => panic!("{args:?} succeeded with {value:?}"),
        Err(err) => error_text(&err),
    }
}

/// `CODE message`, as the server sent it.
pub fn error_text(err: &redis::RedisError) -> String {
    match (err.code(), err.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => err.to_string(),
    }
}

/// `<name>`'s members and scores, lowest score first.
pub fn zset(conn: &mut redis::Connection, key: &str) -> Vec<(String, i64)> {
    run(conn, &["ZRANGE", key, "0", "-1", "WITHSCORES"])
}

/// Polls `condition` every 10 ms until it holds; fails after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        sleep(Duration::from_millis(10));
    }
}

/// The server's clock (TIME), in Unix ms. Reading it touches no key, so it cannot trigger an
/// expiry.
pub fn server_ms(conn: &mut redis::Connection) -> i64 {
    let (seconds, micros): (i64, i64) = run(conn, &["TIME"]);
    seconds * 1000 + micros / 1000
}

pub fn unix_ms_now() -> i64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    since_epoch.as_millis() as i64
}

/// A primary whose every write reaches the AOF before it replies, with a disk-based full sync
/// (which starts at once) for a replica.
pub const AOF_PRIMARY_ARGS: [&str; 8] = [
    "--save",
    "",
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--repl-diskless-sync",
    "no",
];

/// `SEM.GET name JSON`, parsed.
pub fn sem_json(conn: &mut redis::Connection, name: &str) -> serde_json::Value {
    let text: String = run(conn, &["SEM.GET", name, "JSON"]);
    serde_json::from_str(&text).expect("SEM.GET JSON")
}

/// How many clients wait in `name`'s line for permits.
pub fn waiters_in_line(conn: &mut redis::Connection, name: &str) -> u64 {
    sem_json(conn, name)["waiters"]
        .as_u64()
        .expect("waiters is a number")
}

/// Waits until `n` clients wait in `name`'s line.
pub fn until_in_line(conn: &mut redis::Connection, name: &str, n: u64) {
    wait_until(
        &format!("{n} wait for {name}"),
        Duration::from_secs(10),
        || waiters_in_line(conn, name) == n,
    );
}

/// `INFO sem`'s counters and gauges, field by field (the distributions, which are not one
/// number, left out).
pub fn info_sem(conn: &mut redis::Connection) -> std::collections::BTreeMap<String, u64> {
    let info: String = run(conn, &["INFO", "sem"]);
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(k, _)| !k.ends_with("_time"))
        .map(|(k, v)| (k.to_string(), v.trim().parse().expect("a number")))
        .collect()
}

/// The server's fencing floor (`INFO sem`, `sem_ticket_floor`): the clock in microseconds when
/// the module loaded (taken again when the server finished loading data or became a primary),
/// or one past the node's last fair ticket, whichever is higher. A fair grant to a name with a
/// counter hands out `max(counter + 1, floor)`.
pub fn ticket_floor(conn: &mut redis::Connection) -> i64 {
    let floor = info_sem(conn)["sem_ticket_floor"];
    assert!(floor > 0, "the module took no fencing floor when it loaded");
    i64::try_from(floor).expect("a floor below 2^63")
}

/// The server's clock and floor, read before a fair grant to a name without a counter (a new
/// name, or one whose counter is gone), which hands out the clock of that grant in
/// microseconds: `max(1, floor, now_ms × 1000)`. The name's next grants then count up by one.
pub struct FirstGrant {
    floor: i64,
    before_ms: i64,
}

impl FirstGrant {
    /// Read on the node that will make the grant, before the command that leads to it.
    pub fn before(conn: &mut redis::Connection) -> FirstGrant {
        let floor = ticket_floor(conn);
        let before_ms = server_ms(conn);
        FirstGrant { floor, before_ms }
    }

    /// The same from a floor and a clock reading the caller already has.
    pub fn since(floor: i64, before_ms: i64) -> FirstGrant {
        FirstGrant { floor, before_ms }
    }

    /// Whether `ticket` is such a first grant's, made by `after_ms`: the clock of some
    /// millisecond in the window, in microseconds, or the floor if that is higher.
    pub fn allows(&self, ticket: i64, after_ms: i64) -> bool {
        // Every floor is a clock in microseconds too, so a multiple of 1000.
        let lowest = self.floor.max(self.before_ms * 1000);
        let highest = self.floor.max(after_ms * 1000);
        (lowest..=highest).contains(&ticket) && (ticket == self.floor || ticket % 1000 == 0)
    }

    /// `ticket`, checked to be such a first grant's since [`FirstGrant::before`], up to now on
    /// `conn`'s server: [`FirstGrant::allows`], or a ticket the node's floor gave after other
    /// grants moved it past theirs (the floor now is one past the node's last ticket).
    pub fn ticket(&self, conn: &mut redis::Connection, ticket: i64) -> i64 {
        let after_ms = server_ms(conn);
        let floor_now = ticket_floor(conn);
        let lowest = self.floor.max(self.before_ms * 1000);
        let from_floor = (lowest..floor_now).contains(&ticket);
        assert!(
            self.allows(ticket, after_ms) || from_floor,
            "ticket {ticket} is not the clock of a grant from {} to {after_ms} ms (floor {} then, \
             {floor_now} now)",
            self.before_ms,
            self.floor
        );
        ticket
    }

    /// The ticket `name`'s holder `id` holds (its score in `<name>:owner`), checked as
    /// [`FirstGrant::ticket`] does.
    pub fn holder(&self, conn: &mut redis::Connection, name: &str, id: &str) -> i64 {
        let score: Option<i64> = run(conn, &["ZSCORE", &format!("{name}:owner"), id]);
        let ticket = score.unwrap_or_else(|| panic!("{id} holds no ticket of {name}"));
        self.ticket(conn, ticket)
    }
}

/// A replica of `primary`, with no persistence, once its link is up.
pub fn start_replica_of(primary: &Server) -> Server {
    let port = primary.port.to_string();
    let replica = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--replicaof",
        "127.0.0.1",
        &port,
    ]);
    let mut conn = replica.connection();
    wait_until("the replica is in sync", Duration::from_secs(20), || {
        run::<String>(&mut conn, &["INFO", "replication"]).contains("master_link_status:up")
    });
    replica
}

/// Waits until the one replica has processed everything the primary did so far, whichever
/// connection did it. `WAIT` covers its own connection's last write only, so this connection
/// writes last (a key it deletes again: nothing is left of it).
pub fn wait_for_replica(primary: &mut redis::Connection) {
    let _: () = run(primary, &["SET", "__redsem_test_sync", "1"]);
    let _: () = run(primary, &["DEL", "__redsem_test_sync"]);
    let acked: i64 = run(primary, &["WAIT", "1", "5000"]);
    assert_eq!(acked, 1, "the replica did not acknowledge in time");
}

/// A command sent from a thread of its own, on a connection of its own, whose reply is read
/// later: a client blocked in the server.
pub struct Pending {
    /// The connection's `CLIENT ID`.
    pub client_id: i64,
    handle: std::thread::JoinHandle<(redis::RedisResult<redis::Value>, redis::Connection)>,
}

impl Pending {
    /// Sends `args`; the reply is waited for at most 20 s.
    pub fn send(server: &Server, args: &[&str]) -> Pending {
        let mut conn = server.connection();
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        let client_id: i64 = run(&mut conn, &["CLIENT", "ID"]);
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let handle = std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (try_run(&mut conn, &args), conn)
        });
        Pending { client_id, handle }
    }

    pub fn is_done(&self) -> bool {
        self.handle.is_finished()
    }

    /// The reply, and the connection (still open).
    pub fn finish(self) -> (redis::RedisResult<redis::Value>, redis::Connection) {
        self.handle
            .join()
            .expect("a pending command's thread panicked")
    }

    pub fn reply(self) -> redis::RedisResult<redis::Value> {
        self.finish().0
    }
}

/// The server's kind and major version: (whether Valkey, major), from `INFO server`.
pub fn server_kind(conn: &mut redis::Connection) -> (bool, u32) {
    let (valkey, major, _) = server_version(conn);
    (valkey, major)
}

/// How the module hears of another client's change to a waited key (src/server/events.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyWatch {
    /// Keyspace events while anybody waits (Redis 8.2 and later).
    KeyspaceWhileWaiting,
    /// Keyspace events from the first wait on, for good (Redis 7.0; `key-events keyspace` on
    /// Redis 7.2 to 8.1 and Valkey but 8.1 to 9.0).
    KeyspaceForGood,
    /// The key server event while anybody waits (Redis 7.2 to 8.1, Valkey).
    KeyEvent,
}

/// How the module follows changes to keys on this server, loaded with `module_args`; `None`
/// where those arguments make it refuse to load.
pub fn key_watch(conn: &mut redis::Connection, module_args: &[&str]) -> Option<KeyWatch> {
    let (valkey, major, minor) = server_version(conn);
    let version = (major, minor);
    let key_event = valkey || version >= (7, 2);
    let moves_caller = valkey && ((8, 1)..(9, 1)).contains(&version);
    let keyspace = match !valkey && version >= (8, 2) {
        true => KeyWatch::KeyspaceWhileWaiting,
        false => KeyWatch::KeyspaceForGood,
    };
    let prefer = module_args
        .windows(2)
        .find(|pair| pair[0] == "key-events")
        .map_or("auto", |pair| pair[1]);
    match prefer {
        "server" => key_event.then_some(KeyWatch::KeyEvent),
        "keyspace" => (!moves_caller).then_some(keyspace),
        _ if keyspace == KeyWatch::KeyspaceWhileWaiting => Some(keyspace),
        _ if key_event => Some(KeyWatch::KeyEvent),
        _ => Some(keyspace),
    }
}

/// The server's kind and version: (whether Valkey, major, minor), from `INFO server`.
pub fn server_version(conn: &mut redis::Connection) -> (bool, u32, u32) {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(conn)
        .expect("INFO server");
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(|value| value.trim().to_string())
    };
    let (valkey, version) = match field("valkey_version") {
        Some(version) => (true, version),
        None => (false, field("redis_version").unwrap_or_default()),
    };
    let mut parts = version.split('.').map(|part| part.parse().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (valkey, major, minor)
}

/// Whether a server in Redis Cluster mode, with the module loaded with `module_args`, refuses
/// SEM.* calls of a connection in the short form (no command filter declares their keys):
/// Redis 8.4 and later, or `command-filter 0`.
pub fn cluster_refuses_short_form(
    valkey: bool,
    major: u32,
    minor: u32,
    module_args: &[&str],
) -> bool {
    let no_filter = module_args
        .windows(2)
        .any(|pair| pair[0] == "command-filter" && matches!(pair[1], "0" | "no"));
    no_filter || (!valkey && (major, minor) >= (8, 4))
}

/// The long form of a SEM.* call: every derived key named, after the name for a call on one
/// semaphore, after the arguments (each name's four, in the names' order) for a set.
pub fn long_form(args: &[&str]) -> Vec<String> {
    const SUFFIXES: [&str; 4] = [":owner", ":counter", ":permits", ":limit"];
    let derived = |name: &str| SUFFIXES.map(|suffix| format!("{name}{suffix}"));
    let owned: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let step = match args[0].to_ascii_uppercase().as_str() {
        "SEM.ACQUIREALL" => 3,
        "SEM.RELEASEALL" | "SEM.REFRESHALL" => 1,
        _ => {
            let mut long = owned[..2].to_vec();
            long.extend(derived(args[1]));
            long.extend_from_slice(&owned[2..]);
            return long;
        }
    };
    let count: usize = args[1].parse().expect("numsems");
    let mut long = owned;
    for i in 0..count {
        long.extend(derived(args[2 + i * step]));
    }
    long
}

/// A connection that sent one command and reads its reply later.
pub struct RawClient {
    reader: BufReader<TcpStream>,
}

impl RawClient {
    pub fn connect(server: &Server) -> RawClient {
        let socket = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        RawClient {
            reader: BufReader::new(socket),
        }
    }

    pub fn send(&mut self, args: &[&str]) {
        let mut command = format!("*{}\r\n", args.len());
        for arg in args {
            command.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        self.reader
            .get_mut()
            .write_all(command.as_bytes())
            .expect("send");
    }

    /// The next reply, as text: a bulk string's or status's content, `nil`, `:<n>`, or
    /// `-<error>`. (The commands here reply nothing else.)
    pub fn reply(&mut self) -> String {
        let line = self.line();
        match line.as_bytes().first() {
            Some(b'$') if line == "$-1" => "nil".into(),
            Some(b'$') => {
                let body = self.line();
                assert_eq!(body.len().to_string(), line[1..], "bulk length");
                body
            }
            Some(b'+') => line[1..].to_string(),
            Some(b':' | b'-') | Some(b'_') => line,
            _ => panic!("unexpected reply {line:?}"),
        }
    }

    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.reader
            .get_mut()
            .set_read_timeout(Some(timeout))
            .expect("read timeout");
    }

    /// The next reply if one arrives within the read timeout.
    pub fn try_reply(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                let line = line.trim_end_matches("\r\n").to_string();
                match line.as_bytes().first() {
                    Some(b'$') if line != "$-1" => Some(self.line()),
                    _ => Some(line),
                }
            }
        }
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("read a reply");
        line.trim_end_matches("\r\n").to_string()
    }
}
