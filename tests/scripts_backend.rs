//! The client packages' Lua script (clients/scripts/redsem.lua), which runs the semaphore where
//! no module can be loaded, against the module itself: the same replies and the same keys for a
//! long random sequence of calls, semaphores that scripts started and the module carries on
//! after `MODULE LOAD` (and scripts that hand their calls to it), the limit under contention,
//! and the script's line: first come first served, grants handed over and told on each
//! waiter's list, lease ends served by `TICK`, places that run out, memory full.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Barrier;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use common::*;
use redis::Value;

/// The one script every package loads, as it is: it runs when memory is full.
const SCRIPT: &str = include_str!("../clients/scripts/redsem.lua");
/// How long a waiter's place is held after its last attempt.
const PLACE_MS: i64 = 6000;

/// The text the packages send a newcomer's acquire with: the file with its first line
/// `#!lua flags=allow-oom` made `#!lua`, which the server refuses at `maxmemory`.
fn acquire_text() -> String {
    let (first, rest) = SCRIPT.split_once('\n').expect("a first line");
    assert_eq!(first, "#!lua flags=allow-oom");
    format!("#!lua\n{rest}")
}

fn sha() -> String {
    redis::Script::new(SCRIPT).get_hash().to_string()
}

/// The six keys of `name`, in the script's order.
fn script_keys(name: &str) -> Vec<String> {
    ["", ":owner", ":counter", ":permits", ":limit", ":wake"]
        .iter()
        .map(|suffix| format!("{name}{suffix}"))
        .collect()
}

/// Runs `op args...` on `name` as the packages do: `EVALSHA`, and on NOSCRIPT `EVAL` once.
fn script(conn: &mut redis::Connection, name: &str, op: &str, args: &[&str]) -> RedisResult {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha
        .arg(sha())
        .arg(6)
        .arg(script_keys(name))
        .arg(op)
        .arg(args);
    match evalsha.query(conn) {
        Err(err) if err.kind() == redis::ErrorKind::NoScriptError => redis::cmd("EVAL")
            .arg(SCRIPT)
            .arg(6)
            .arg(script_keys(name))
            .arg(op)
            .arg(args)
            .query(conn),
        other => other,
    }
}

type RedisResult = redis::RedisResult<Value>;

/// The script's `[reply, retry_ms, ahead]` of an acquire.
fn acquire_reply3(value: Value) -> (Value, i64, i64) {
    match value {
        Value::Array(mut three) if three.len() == 3 => {
            let ahead = match three.pop() {
                Some(Value::Int(n)) => n,
                other => panic!("ahead is not an integer: {other:?}"),
            };
            let retry = match three.pop() {
                Some(Value::Int(ms)) => ms,
                other => panic!("retry_ms is not an integer: {other:?}"),
            };
            (three.pop().expect("three elements"), retry, ahead)
        }
        other => panic!("an acquire through the script replied {other:?}"),
    }
}

/// The script's `[reply, retry_ms]` of an acquire without `LINE`, with nobody in line.
fn acquire_reply(value: Value) -> (Value, i64) {
    let (reply, retry, ahead) = acquire_reply3(value);
    assert_eq!(ahead, 0, "nobody waits in the line");
    (reply, retry)
}

/// An acquire through the script that must not fail: its reply and retry_ms.
fn script_acquire(
    conn: &mut redis::Connection,
    name: &str,
    op: &str,
    args: &[&str],
) -> (Value, i64) {
    let value = script(conn, name, op, args)
        .unwrap_or_else(|err| panic!("{op} {name} {args:?}: {}", error_text(&err)));
    acquire_reply(value)
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".into(),
        other => format!("{other:?}"),
    }
}

fn int(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// A `[id, ticket]` reply, split.
fn id_and_ticket(value: &Value) -> (String, i64) {
    match value {
        Value::Array(pair) if pair.len() == 2 => (text(&pair[0]), int(&pair[1])),
        other => panic!("not [id, ticket]: {other:?}"),
    }
}

/// A small deterministic pseudo-random generator (xorshift64*), so every run takes the same
/// sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------------------------
// The differential run

/// One call, as the module takes it (`SEM.<op> name args...`) and as the script does
/// (`<op> args...` on name's keys).
#[derive(Debug, Clone)]
enum Step {
    Call {
        name: String,
        op: &'static str,
        args: Vec<String>,
    },
    /// Let short leases run out.
    Sleep(u64),
    /// The same plain command on both servers (another client writing a key).
    Foreign(Vec<String>),
}

const NAMES: [&str; 3] = ["d:plain", "d:fair", "d:mixed"];
const IDS: [&str; 5] = ["i1", "i2", "i3", "i4", "i5"];
const LEASES: [&str; 5] = ["0.3", "0.45", "0.7", "1", "30"];

fn random_step(rng: &mut Rng) -> Step {
    let name = rng.pick(&NAMES).to_string();
    let id = rng.pick(&IDS).to_string();
    let lease = rng.pick(&LEASES).to_string();
    let call = |op, args: Vec<String>| Step::Call {
        name: name.clone(),
        op,
        args,
    };
    let roll = rng.below(100);
    let mut step = match roll {
        0..=44 => {
            let fair_percent = match name.as_str() {
                "d:plain" => 15,
                "d:fair" => 85,
                _ => 50,
            };
            let fair = rng.chance(fair_percent);
            let limit = (1 + rng.below(4)).to_string();
            let mut args = vec![limit, lease, "ID".into(), id];
            if rng.chance(30) {
                args.extend(["COUNT".into(), (1 + rng.below(3)).to_string()]);
            }
            if fair && rng.chance(60) {
                args.push("WITHTICKET".into());
            }
            call(if fair { "ACQUIREFAIR" } else { "ACQUIRE" }, args)
        }
        45..=64 => {
            let mut args = vec![id];
            if rng.chance(30) {
                args.extend(["COUNT".into(), (1 + rng.below(3)).to_string()]);
            }
            call("RELEASE", args)
        }
        65..=76 => call("REFRESH", vec![id, lease]),
        77..=83 => call("GET", vec![]),
        84..=91 => {
            let args = match rng.below(10) {
                0..=2 => vec![],
                3..=4 => vec!["CLEAR".into()],
                _ => vec![rng.below(5).to_string()],
            };
            call("LIMIT", args)
        }
        92..=93 => Step::Sleep(350),
        _ => {
            // A call with one wrong argument: the errors must be the module's.
            let bad: &[(&'static str, &[&str])] = &[
                ("ACQUIRE", &["0", "1", "ID", "x"]),
                ("ACQUIRE", &["abc", "1", "ID", "x"]),
                ("ACQUIRE", &["4294967296", "1", "ID", "x"]),
                ("ACQUIRE", &["2", "0", "ID", "x"]),
                ("ACQUIRE", &["2", "1.2345", "ID", "x"]),
                ("ACQUIRE", &["2", "1m", "ID", "x"]),
                ("ACQUIRE", &["2", ".5", "ID", "x"]),
                ("ACQUIRE", &["2", "31536000.001", "ID", "x"]),
                ("ACQUIRE", &["2", "1", "ID", ""]),
                ("ACQUIRE", &["2", "1", "ID", "x", "COUNT", "3"]),
                ("ACQUIRE", &["2", "1", "ID", "x", "COUNT", "0"]),
                ("ACQUIRE", &["2", "1", "ID", "x", "COUNT"]),
                ("ACQUIRE", &["2", "1", "ID", "x", "WITHTICKET"]),
                ("ACQUIRE", &["2", "1", "ID", "x", "NOPE"]),
                ("ACQUIRE", &["2", "1", "ID", "x", "ID", "y"]),
                ("ACQUIRE", &["2"]),
                (
                    "ACQUIREFAIR",
                    &["2", "1", "ID", "x", "WITHTICKET", "WITHTICKET"],
                ),
                ("ACQUIREFAIR", &["2", "1", "id", "x", "count", "x"]),
                ("RELEASE", &["x", "COUNT", "0"]),
                ("RELEASE", &["x", "COUNT", "4294967296"]),
                ("RELEASE", &["x", "COUNT"]),
                ("RELEASE", &["x", "NOPE"]),
                ("RELEASE", &[""]),
                ("REFRESH", &["x"]),
                ("REFRESH", &["x", "0.0001"]),
                ("REFRESH", &["", "1"]),
                ("REFRESH", &["x", "1", "2"]),
                ("LIMIT", &["-1"]),
                ("LIMIT", &["4294967296"]),
                ("LIMIT", &["1", "2"]),
                ("GET", &["NOPE"]),
            ];
            let (op, args) = bad[rng.below(bad.len() as u64) as usize];
            call(op, args.iter().map(|a| a.to_string()).collect())
        }
    };
    // Now and then a weighted holder gives back one permit of several.
    if let Step::Call { op, args, .. } = &mut step {
        if *op == "RELEASE" && args.len() == 1 && rng.chance(10) {
            args.extend(["COUNT".into(), "1".into()]);
        }
    }
    step
}

/// One semaphore's keys, read back.
#[derive(Debug, Clone, Default, PartialEq)]
struct SemKeys {
    holders: Vec<(String, i64)>,
    owners: BTreeMap<String, i64>,
    counter: Option<String>,
    permits: BTreeMap<String, String>,
    limit: Option<String>,
    /// PEXPIRETIME of `<name>`, `<name>:owner`, `<name>:permits`.
    expiries: [i64; 3],
}

/// Reads every key (but the wake-up lists) and each semaphore's keys in one atomic step, with
/// the server's time: `[now_ms, [key, type, ...], per name: [holders, owners, [counter],
/// permits, [limit], [expiries]]]`. A key of another type reads as empty (the types are
/// compared with the keys).
const SNAPSHOT: &str = r#"
local t = redis.call('TIME')
local out = { tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), {} }
for _, key in ipairs(redis.call('KEYS', '*')) do
  if not key:find(':wake$') then
    table.insert(out[2], key)
    table.insert(out[2], redis.call('TYPE', key).ok)
  end
end
local function read(key, kind, ...)
  if redis.call('TYPE', key).ok ~= kind then return {} end
  local value = redis.call(...)
  if type(value) ~= 'table' then value = { value } end
  return value
end
for _, name in ipairs(ARGV) do
  local owner, permits = name .. ':owner', name .. ':permits'
  table.insert(out, {
    read(name, 'zset', 'ZRANGE', name, 0, -1, 'WITHSCORES'),
    read(owner, 'zset', 'ZRANGE', owner, 0, -1, 'WITHSCORES'),
    read(name .. ':counter', 'string', 'GET', name .. ':counter'),
    read(permits, 'hash', 'HGETALL', permits),
    read(name .. ':limit', 'string', 'GET', name .. ':limit'),
    { redis.call('PEXPIRETIME', name), redis.call('PEXPIRETIME', owner),
      redis.call('PEXPIRETIME', permits) },
  })
end
return out
"#;

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::Array(items) => items.iter().map(text).collect(),
        other => panic!("not an array: {other:?}"),
    }
}

/// Pairs of a flat `[member, score, ...]`, scores rounded (another client may write any).
fn scored(value: &Value) -> Vec<(String, i64)> {
    strings(value)
        .chunks(2)
        .map(|pair| {
            (
                pair[0].clone(),
                pair[1].parse::<f64>().expect("a score") as i64,
            )
        })
        .collect()
}

fn pairs(value: &Value) -> BTreeMap<String, String> {
    strings(value)
        .chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect()
}

/// Every key but the script's wake-up lists, with its type, and each semaphore's keys, at
/// the server's time `at`.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    at: i64,
    keys: BTreeMap<String, String>,
    sems: BTreeMap<String, SemKeys>,
}

fn snapshot(conn: &mut redis::Connection) -> Snapshot {
    let value: Value = redis::cmd("EVAL")
        .arg(SNAPSHOT)
        .arg(0)
        .arg(&NAMES[..])
        .query(conn)
        .expect("the snapshot script");
    let Value::Array(parts) = value else {
        panic!("snapshot: {value:?}")
    };
    let sems = NAMES
        .iter()
        .zip(&parts[2..])
        .map(|(name, sem)| {
            let Value::Array(sem) = sem else {
                panic!("snapshot of {name}: {sem:?}")
            };
            let expiries: Vec<i64> = match &sem[5] {
                Value::Array(items) => items.iter().map(int).collect(),
                other => panic!("expiries: {other:?}"),
            };
            let keys = SemKeys {
                holders: scored(&sem[0]),
                owners: scored(&sem[1]).into_iter().collect(),
                counter: strings(&sem[2]).pop(),
                permits: pairs(&sem[3]),
                limit: strings(&sem[4]).pop(),
                expiries: [expiries[0], expiries[1], expiries[2]],
            };
            (name.to_string(), keys)
        })
        .collect();
    Snapshot {
        at: int(&parts[0]),
        keys: pairs(&parts[1]),
        sems,
    }
}

impl Snapshot {
    fn deadlines(&self) -> impl Iterator<Item = i64> + '_ {
        self.sems
            .values()
            .flat_map(|sem| sem.holders.iter().map(|(_, deadline)| *deadline))
    }
}

/// Deadlines on the two servers differ by the time between the two calls of a step.
const DEADLINE_TOLERANCE_MS: i64 = 250;
/// No step runs while a deadline is this close to now, on either server: a holder is then
/// live on both or expired on both whatever the few milliseconds between them.
const MARGIN_MS: i64 = 100;
/// A step with a deadline within it or this close to it (the machine stalled for longer than
/// the margin) may rightly differ: the servers looked at different sides of the deadline.
const SLACK_MS: i64 = 20;

/// What each server handed out: the last ticket of each name.
#[derive(Default)]
struct Tickets {
    last: HashMap<String, i64>,
}

impl Tickets {
    /// Checks the tickets `after` shows that `before` did not (at most one new grant a step):
    /// each above every earlier one of its name and what `rule` allows after the counter
    /// `before` shows; the counter is the last.
    fn check(
        &mut self,
        server: &str,
        before: &Snapshot,
        after: &Snapshot,
        rule: impl Fn(Option<i64>, i64) -> bool,
    ) {
        for (name, sem) in &after.sems {
            let old = &before.sems[name].owners;
            let counter = before.sems[name].counter.as_ref();
            let counter = counter.map(|text| text.parse().expect("an integer counter"));
            let new: Vec<i64> = sem
                .owners
                .iter()
                .filter(|(id, ticket)| old.get(*id) != Some(ticket))
                .map(|(_, ticket)| *ticket)
                .collect();
            assert!(new.len() <= 1, "{server} {name}: two new tickets in a step");
            if let Some(&ticket) = new.first() {
                let last = self.last.get(name).copied().unwrap_or(0);
                assert!(
                    ticket > last,
                    "{server} {name}: ticket {ticket} after {last}"
                );
                assert!(
                    rule(counter, ticket),
                    "{server} {name}: ticket {ticket} after counter {counter:?}"
                );
                self.last.insert(name.clone(), ticket);
            }
            if let Some(counter) = &sem.counter {
                assert_eq!(
                    counter.parse().ok(),
                    self.last.get(name).copied(),
                    "{server} {name}: the counter is the last ticket"
                );
            }
        }
    }
}

/// The keys' expiries as the module keeps them: `<name>`, its owner set and its weights expire
/// at the latest deadline.
fn assert_expiries(server: &str, snap: &Snapshot) {
    for (name, sem) in &snap.sems {
        let [holders, owners, permits] = sem.expiries;
        match sem.holders.iter().map(|(_, d)| *d).max() {
            None => assert_eq!(holders, -2, "{server} {name}"),
            Some(latest) => assert_eq!(holders, latest, "{server} {name}: {sem:?}"),
        }
        for (key, at, present) in [
            ("owner", owners, !sem.owners.is_empty()),
            ("permits", permits, !sem.permits.is_empty()),
        ] {
            match present {
                false => assert_eq!(at, -2, "{server} {name}:{key}"),
                true => assert_eq!(at, holders, "{server} {name}:{key}: {sem:?}"),
            }
        }
    }
}

fn assert_same_keys(step: &str, module: &Snapshot, script: &Snapshot) {
    assert_eq!(
        module.keys, script.keys,
        "{step}: the keys differ\n{module:?}\n{script:?}"
    );
    for (name, m) in &module.sems {
        let s = &script.sems[name];
        let ids = |sem: &SemKeys| {
            sem.holders
                .iter()
                .map(|(id, _)| id.clone())
                .collect::<BTreeSet<_>>()
        };
        assert_eq!(ids(m), ids(s), "{step} {name}: holders\n{m:?}\n{s:?}");
        let deadlines: BTreeMap<&String, i64> = s.holders.iter().map(|(id, d)| (id, *d)).collect();
        for (id, deadline) in &m.holders {
            let diff = (deadline - deadlines[id]).abs();
            assert!(
                diff <= DEADLINE_TOLERANCE_MS,
                "{step} {name}: {id}'s deadlines differ by {diff} ms"
            );
        }
        let owners = |sem: &SemKeys| sem.owners.keys().cloned().collect::<BTreeSet<_>>();
        assert_eq!(owners(m), owners(s), "{step} {name}: owners");
        assert_eq!(
            m.counter.is_some(),
            s.counter.is_some(),
            "{step} {name}: counter"
        );
        assert_eq!(m.permits, s.permits, "{step} {name}: permits");
        assert_eq!(m.limit, s.limit, "{step} {name}: limit");
        for (key, (a, b)) in ["name", "owner", "permits"]
            .iter()
            .zip(m.expiries.iter().zip(&s.expiries))
        {
            let same = match (*a, *b) {
                (a, b) if a < 0 || b < 0 => a == b,
                (a, b) => (a - b).abs() <= DEADLINE_TOLERANCE_MS,
            };
            assert!(same, "{step} {name}: {key} expires at {a} and {b}");
        }
    }
}

/// Calls without `LINE` leave no line behind: no `:line`, `:places` or waiter's list.
fn assert_no_line(conn: &mut redis::Connection) {
    for name in NAMES {
        for pattern in [format!("{name}:line"), format!("{name}:places")] {
            let exists: i64 = run(conn, &["EXISTS", &pattern]);
            assert_eq!(exists, 0, "{pattern}");
        }
        let lists: Vec<String> = run(conn, &["KEYS", &format!("{name}:wake:*")]);
        assert!(lists.is_empty(), "{lists:?}");
    }
}

/// Compares the replies of one step; returns the script's retry_ms of a refused acquire.
fn compare_replies(
    step: usize,
    call: &str,
    module: RedisResult,
    script: RedisResult,
    acquire: bool,
) -> (Value, Value, Option<i64>) {
    match (module, script) {
        (Err(m), Err(s)) => {
            assert_eq!(error_text(&m), error_text(&s), "step {step}: {call}");
            (Value::Nil, Value::Nil, None)
        }
        (Ok(m), Ok(s)) if acquire => {
            let (reply, retry) = acquire_reply(s);
            match (&m, &reply) {
                (Value::Array(_), Value::Array(_)) => {
                    assert_eq!(id_and_ticket(&m).0, id_and_ticket(&reply).0, "step {step}");
                }
                _ => assert_eq!(m, reply, "step {step}: {call}"),
            }
            match reply {
                Value::Nil => (m, reply, Some(retry)),
                _ => {
                    assert_eq!(retry, 0, "step {step}: a grant's retry_ms");
                    (m, reply, None)
                }
            }
        }
        (Ok(m), Ok(s)) => {
            assert_eq!(m, s, "step {step}: {call}");
            (m, s, None)
        }
        (m, s) => panic!("step {step}: {call}: the module replied {m:?}, the script {s:?}"),
    }
}

/// A reply's ticket, if it is `[id, ticket]`: the holder's entry in the owner set after.
fn check_ticket_reply(step: usize, reply: &Value, after: &Snapshot, name: &str) {
    if let Value::Array(_) = reply {
        let (id, ticket) = id_and_ticket(reply);
        assert_eq!(
            after.sems[name].owners.get(&id),
            Some(&ticket),
            "step {step}: the ticket replied is the owner entry"
        );
    }
}

/// Waits until no deadline is within the margin of now, so that both servers agree on which
/// holders are live; returns now.
fn clear_of_deadlines(conn: &mut redis::Connection, a: &Snapshot, b: &Snapshot) -> i64 {
    loop {
        let now = server_ms(conn);
        let near = a
            .deadlines()
            .chain(b.deadlines())
            .filter(|d| (d - now).abs() <= MARGIN_MS)
            .max();
        match near {
            Some(deadline) => sleep(Duration::from_millis(
                (deadline + MARGIN_MS + 1 - now) as u64,
            )),
            None => return now,
        }
    }
}

/// Runs `steps` on a server with the module (SEM.*) and one without (the script), comparing
/// the replies and the keys after each. `own_keys`: no other client writes the keys, so each
/// server's tickets and expiries must also follow the module's rules exactly, and a step that
/// a deadline fell into (see below) starts both servers again from empty; otherwise it fails.
fn run_differential(steps: &[Step], own_keys: bool) {
    let module_server = Server::start();
    let script_server = Server::start_without_module();
    let mut m = module_server.connection();
    let mut s = script_server.connection();
    let mut module_floor = ticket_floor(&mut m);
    let mut before_m = snapshot(&mut m);
    let mut before_s = snapshot(&mut s);
    let mut tickets_m = Tickets::default();
    let mut tickets_s = Tickets::default();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut restarts = 0;
    for (at, step) in steps.iter().enumerate() {
        let mut started_at = clear_of_deadlines(&mut m, &before_m, &before_s);
        let script_start = server_ms(&mut s);
        let mut replies = None;
        match step {
            Step::Sleep(ms) => {
                sleep(Duration::from_millis(*ms));
                started_at = clear_of_deadlines(&mut m, &before_m, &before_s);
            }
            Step::Foreign(args) => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let module: RedisResult = try_run(&mut m, &args);
                let script: RedisResult = try_run(&mut s, &args);
                assert_eq!(module.is_ok(), script.is_ok(), "step {at}: {args:?}");
            }
            Step::Call { name, op, args } => {
                let sem_command = format!("SEM.{op}");
                let mut module_args = vec![sem_command.as_str(), name.as_str()];
                module_args.extend(args.iter().map(String::as_str));
                let script_args: Vec<&str> = args.iter().map(String::as_str).collect();
                let module: RedisResult = try_run(&mut m, &module_args);
                let script_reply = script(&mut s, name, op, &script_args);
                replies = Some((name, *op, format!("{module_args:?}"), module, script_reply));
            }
        }
        let script_end = server_ms(&mut s);
        let after_m = snapshot(&mut m);
        let after_s = snapshot(&mut s);
        // A deadline within the step (the machine stalled for longer than the margin) may
        // have passed between the two servers' calls or reads: they may rightly differ.
        let window = started_at - SLACK_MS..=after_m.at.max(after_s.at) + SLACK_MS;
        let crossed = before_m
            .deadlines()
            .chain(before_s.deadlines())
            .chain(after_m.deadlines())
            .chain(after_s.deadlines())
            .find(|d| window.contains(d));
        if let Some(deadline) = crossed {
            let stalled = after_s.at - started_at;
            assert!(
                own_keys,
                "step {at}: a deadline ({deadline}) fell within the step, {stalled} ms long"
            );
            eprintln!(
                "step {at}: a deadline fell within the step, {stalled} ms long: both servers start \
                 again from empty"
            );
            restarts += 1;
            let _: () = run(&mut m, &["FLUSHALL"]);
            let _: () = run(&mut s, &["FLUSHALL"]);
            before_m = snapshot(&mut m);
            before_s = snapshot(&mut s);
            tickets_m = Tickets::default();
            tickets_s = Tickets::default();
            continue;
        }
        let context = format!("step {at} {step:?}");
        if let Some((name, op, call, module, script_reply)) = replies {
            let acquire = op.starts_with("ACQUIRE");
            let outcome = match (&module, &script_reply) {
                (Err(err), _) => error_text(err),
                (Ok(Value::Nil), _) if acquire => "refused".into(),
                _ => "ok".into(),
            };
            *counts.entry(format!("{op}: {outcome}")).or_default() += 1;
            let (m_reply, s_reply, retry) =
                compare_replies(at, &call, module, script_reply, acquire);
            check_ticket_reply(at, &m_reply, &after_m, name);
            check_ticket_reply(at, &s_reply, &after_s, name);
            if let Some(retry) = retry {
                // The time from the call to the earliest deadline still ahead of it.
                let next = after_s.sems[name.as_str()]
                    .holders
                    .iter()
                    .map(|(_, d)| *d)
                    .filter(|&d| d > script_start)
                    .min();
                match next {
                    None => assert_eq!(retry, 0, "{context}: retry_ms without a live holder"),
                    Some(deadline) => assert!(
                        (deadline - script_end..=deadline - script_start).contains(&retry),
                        "{context}: retry_ms {retry}, the next deadline in {} ms",
                        deadline - script_start
                    ),
                }
            }
        }
        assert_same_keys(&context, &after_m, &after_s);
        assert_no_line(&mut s);
        if own_keys {
            assert_expiries("module", &after_m);
            assert_expiries("script", &after_s);
            // The module: after a counter, the next one up and at least its floor (one past
            // the node's last ticket); without one, the clock of the grant or the floor.
            let fresh = FirstGrant::since(module_floor, started_at);
            tickets_m.check(
                "module",
                &before_m,
                &after_m,
                |counter, ticket| match counter {
                    Some(counter) => ticket == (counter + 1).max(module_floor),
                    None => ticket == module_floor || fresh.allows(ticket, after_m.at),
                },
            );
            // The script: above the counter, and at least its clock in microseconds at the
            // grant; above the counter's next only by that clock.
            tickets_s.check("script", &before_s, &after_s, |counter, ticket| {
                let next = counter.map_or(1, |c| c + 1);
                let clock = script_start * 1000..=script_end * 1000 + 999;
                ticket >= next
                    && ticket >= script_start * 1000
                    && (ticket == next || clock.contains(&ticket))
            });
        }
        module_floor = ticket_floor(&mut m);
        before_m = after_m;
        before_s = after_s;
    }
    for (outcome, count) in &counts {
        eprintln!("{count:5} {outcome}");
    }
    eprintln!("{restarts} restarts");
    assert!(
        restarts * 10 <= steps.len(),
        "{restarts} of {} steps had a deadline within them: the machine is too slow",
        steps.len()
    );
}

#[test]
fn a_random_sequence_answers_and_writes_as_the_module_does() {
    let mut rng = Rng(0x5eed_2024_0036_0001);
    let steps: Vec<Step> = (0..400).map(|_| random_step(&mut rng)).collect();
    let started = Instant::now();
    run_differential(&steps, true);
    eprintln!("400 steps in {:?}", started.elapsed());
}

fn call(name: &str, op: &'static str, args: &[&str]) -> Step {
    Step::Call {
        name: name.into(),
        op,
        args: args.iter().map(|a| a.to_string()).collect(),
    }
}

fn foreign(args: &[&str]) -> Step {
    Step::Foreign(args.iter().map(|a| a.to_string()).collect())
}

#[test]
fn corner_cases_answer_as_the_module_does() {
    let n = "d:mixed";
    run_differential(
        &[
            // Names and identifiers.
            call("", "GET", &[]),
            call("", "ACQUIRE", &["2", "30", "ID", "a"]),
            call(n, "ACQUIRE", &["2", "30", "ID", "a", "COUNT", "2"]),
            call(n, "ACQUIRE", &["2", "30", "ID", "a", "COUNT", "1"]),
            call(n, "ACQUIRE", &["2", "30", "ID", "a"]),
            call(n, "ACQUIRE", &["3", "30", "ID", "b"]),
            call(n, "ACQUIREFAIR", &["3", "30", "ID", "c"]),
            call(n, "RELEASE", &["a", "COUNT", "3"]),
            call(n, "RELEASE", &["a", "COUNT", "1"]),
            call(n, "GET", &[]),
            call(n, "RELEASE", &["a"]),
            call(n, "RELEASE", &["a"]),
            call(n, "RELEASE", &["b"]),
            // Fair, with tickets; a renewal keeps its ticket.
            call(n, "ACQUIREFAIR", &["2", "30", "ID", "f1", "WITHTICKET"]),
            call(
                n,
                "ACQUIREFAIR",
                &["2", "30", "ID", "f2", "COUNT", "1", "WITHTICKET"],
            ),
            call(n, "ACQUIREFAIR", &["2", "30", "ID", "f1", "WITHTICKET"]),
            call(n, "ACQUIREFAIR", &["2", "30", "ID", "f3", "WITHTICKET"]),
            call(n, "ACQUIRE", &["5", "30", "ID", "p"]),
            // A stored limit: pause, then raise, then clear.
            call(n, "LIMIT", &["0"]),
            call(n, "LIMIT", &[]),
            call(n, "ACQUIREFAIR", &["9", "30", "ID", "f4"]),
            call(n, "ACQUIREFAIR", &["9", "30", "ID", "f1"]),
            call(n, "LIMIT", &["0007"]),
            call(n, "LIMIT", &["7"]),
            call(n, "ACQUIREFAIR", &["1", "30", "ID", "f4", "COUNT", "1"]),
            call(n, "LIMIT", &["CLEAR"]),
            call(n, "LIMIT", &["clear"]),
            call(n, "REFRESH", &["f2", "60"]),
            call(n, "REFRESH", &["nobody", "60"]),
            call(n, "RELEASE", &["f1"]),
            call(n, "RELEASE", &["f2"]),
            call(n, "RELEASE", &["f3"]),
            call(n, "RELEASE", &["f4"]),
            // Expiry: a lost holder is told so, and the next call prunes it.
            call(n, "ACQUIRE", &["2", "0.5", "ID", "e1", "COUNT", "2"]),
            Step::Sleep(900),
            call(n, "GET", &[]),
            call(n, "REFRESH", &["e1", "5"]),
            call(n, "ACQUIRE", &["2", "0.5", "ID", "e1", "COUNT", "2"]),
            call(n, "ACQUIRE", &["3", "30", "ID", "e3"]),
            Step::Sleep(900),
            call(n, "RELEASE", &["e1", "COUNT", "1"]),
            call(n, "RELEASE", &["e3"]),
            call(n, "ACQUIREFAIR", &["2", "0.5", "ID", "e2", "WITHTICKET"]),
            call(n, "ACQUIREFAIR", &["2", "30", "ID", "e4", "WITHTICKET"]),
            Step::Sleep(900),
            call(n, "ACQUIREFAIR", &["2", "30", "ID", "e2", "WITHTICKET"]),
            call(n, "RELEASE", &["e2"]),
            call(n, "RELEASE", &["e4"]),
            // Keys another client wrote.
            foreign(&["SET", "d:mixed:counter", "x"]),
            call(n, "ACQUIREFAIR", &["2", "30", "ID", "c1"]),
            call(n, "ACQUIRE", &["2", "30", "ID", "c1"]),
            call(n, "RELEASE", &["c1"]),
            foreign(&["SET", "d:mixed:counter", "9007199254740992"]),
            call(n, "ACQUIREFAIR", &["2", "30", "ID", "c2"]),
            foreign(&["DEL", "d:mixed:counter"]),
            foreign(&["SET", "d:mixed:limit", "lots"]),
            call(n, "ACQUIRE", &["2", "30", "ID", "l1"]),
            call(n, "LIMIT", &[]),
            call(n, "LIMIT", &["3"]),
            call(n, "LIMIT", &["CLEAR"]),
            call(n, "GET", &[]),
            foreign(&["DEL", "d:mixed:limit"]),
            foreign(&["HSET", "d:mixed:permits", "w", "many"]),
            call(n, "GET", &[]),
            call(n, "ACQUIRE", &["2", "30", "ID", "w"]),
            foreign(&["DEL", "d:mixed:permits"]),
            foreign(&["SET", "d:mixed", "string"]),
            call(n, "GET", &[]),
            call(n, "ACQUIRE", &["2", "30", "ID", "t"]),
            call(n, "RELEASE", &["t"]),
            call(n, "LIMIT", &[]),
            foreign(&["DEL", "d:mixed"]),
            foreign(&["SET", "d:mixed:owner", "string"]),
            call(n, "REFRESH", &["t", "1"]),
            foreign(&["DEL", "d:mixed:owner"]),
            // Owner entries without a holder are leftovers, removed by the next write.
            call(n, "ACQUIRE", &["2", "30", "ID", "o1"]),
            foreign(&["ZADD", "d:mixed:owner", "5", "ghost"]),
            call(n, "GET", &[]),
            call(n, "ACQUIRE", &["2", "30", "ID", "o2"]),
            call(n, "RELEASE", &["o1"]),
            call(n, "RELEASE", &["o2"]),
            call(n, "ACQUIREFAIR", &["2", "30", "ID", "o3"]),
            foreign(&["ZADD", "d:mixed:owner", "7", "ghost"]),
            call(n, "ACQUIREFAIR", &["3", "30", "ID", "o4", "WITHTICKET"]),
            foreign(&["ZADD", "d:mixed:owner", "1.5", "o3"]),
            call(n, "ACQUIREFAIR", &["3", "30", "ID", "o3", "WITHTICKET"]),
            call(n, "RELEASE", &["o3"]),
            call(n, "RELEASE", &["o4"]),
        ],
        false,
    );
}

// ---------------------------------------------------------------------------------------------
// Migration: scripts first, the module later

#[test]
fn a_semaphore_started_by_scripts_goes_on_under_the_module() {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    let nil: Value = run(&mut conn, &["COMMAND", "INFO", "SEM.ACQUIRE"]);
    assert_eq!(nil, Value::Array(vec![Value::Nil]), "no module yet");

    for id in ["a", "b"] {
        let (reply, _) = script_acquire(&mut conn, "m:plain", "ACQUIRE", &["3", "60", "ID", id]);
        assert_eq!(text(&reply), id);
    }
    script_acquire(
        &mut conn,
        "m:w",
        "ACQUIRE",
        &["5", "60", "ID", "w1", "COUNT", "3"],
    );
    script_acquire(&mut conn, "m:w", "ACQUIRE", &["5", "60", "ID", "w2"]);
    let mut script_tickets = Vec::new();
    for id in ["f1", "f2"] {
        let (reply, _) = script_acquire(
            &mut conn,
            "m:fair",
            "ACQUIREFAIR",
            &["5", "60", "ID", id, "WITHTICKET"],
        );
        script_tickets.push(id_and_ticket(&reply).1);
    }
    let ok = script(&mut conn, "m:lim", "LIMIT", &["1"]).expect("LIMIT 1");
    assert_eq!(ok, Value::Okay);
    script_acquire(&mut conn, "m:lim", "ACQUIRE", &["10", "60", "ID", "l1"]);
    script_acquire(&mut conn, "m:one", "ACQUIRE", &["1", "60", "ID", "holder"]);
    script_acquire(&mut conn, "m:two", "ACQUIRE", &["1", "60", "ID", "holder"]);
    script_acquire(
        &mut conn,
        "m:three",
        "ACQUIRE",
        &["1", "60", "ID", "holder"],
    );
    take_place(&mut conn, "m:two", "ACQUIRE", &["1", "60", "ID", "in-line"]);

    let path = module_path();
    let loaded: String = run(
        &mut conn,
        &["MODULE", "LOAD", path.to_str().expect("a UTF-8 path")],
    );
    assert_eq!(loaded, "OK");

    // Everything is in place.
    for (name, in_use) in [
        ("m:plain", 2),
        ("m:w", 4),
        ("m:fair", 2),
        ("m:lim", 1),
        ("m:one", 1),
    ] {
        let got: i64 = run(&mut conn, &["SEM.GET", name]);
        assert_eq!(got, in_use, "{name}");
    }
    let stored: i64 = run(&mut conn, &["SEM.LIMIT", "m:lim"]);
    assert_eq!(stored, 1);
    let refused: Option<String> = run(&mut conn, &["SEM.ACQUIRE", "m:lim", "10", "60", "ID", "l2"]);
    assert_eq!(refused, None, "the stored limit is in force");
    let json = sem_json(&mut conn, "m:fair");
    assert_eq!(json["fair"], true);
    let tickets: Vec<i64> = json["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["ticket"].as_i64().expect("a ticket"))
        .collect();
    assert_eq!(
        tickets, script_tickets,
        "the script's tickets, in grant order"
    );
    let json = sem_json(&mut conn, "m:w");
    let permits: Vec<u64> = json["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["permits"].as_u64().expect("permits"))
        .collect();
    assert_eq!(permits.iter().sum::<u64>(), 4, "{json}");

    // The module releases and refreshes the script's holders.
    let released: i64 = run(&mut conn, &["SEM.RELEASE", "m:plain", "a"]);
    assert_eq!(released, 1);
    let refreshed: i64 = run(&mut conn, &["SEM.REFRESH", "m:plain", "b", "120"]);
    assert_eq!(refreshed, 1);
    let deadline: i64 = run(&mut conn, &["ZSCORE", "m:plain", "b"]);
    let expiry: i64 = run(&mut conn, &["PEXPIRETIME", "m:plain"]);
    assert_eq!(expiry, deadline);
    let released: i64 = run(&mut conn, &["SEM.RELEASE", "m:w", "w1", "COUNT", "1"]);
    assert_eq!(released, 1);
    let in_use: i64 = run(&mut conn, &["SEM.GET", "m:w"]);
    assert_eq!(in_use, 3);
    let renewed = try_run::<Value>(
        &mut conn,
        &["SEM.ACQUIRE", "m:w", "5", "60", "ID", "w1", "COUNT", "3"],
    );
    assert_eq!(
        error_text(&renewed.expect_err("a COUNT the holder does not hold")),
        "ERR the holder holds 2 permits: renew with that COUNT, or none"
    );
    let mismatch = try_run::<Value>(&mut conn, &["SEM.ACQUIRE", "m:fair", "5", "60"]);
    assert!(error_text(&mismatch.expect_err("fair holders")).contains("live fair holders"));

    // Fair tickets go on above every ticket the script handed out.
    let (id, ticket): (String, i64) = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "m:fair", "5", "60", "WITHTICKET"],
    );
    let highest = *script_tickets.iter().max().expect("tickets");
    assert!(ticket > highest, "{ticket} after {highest}");
    let counter: i64 = run(&mut conn, &["GET", "m:fair:counter"]);
    assert_eq!(counter, ticket);
    let released: i64 = run(&mut conn, &["SEM.RELEASE", "m:fair", &id]);
    assert_eq!(released, 1);

    // A module waiter is served by the release of the script's holder.
    let waiter = Pending::send(
        &server,
        &[
            "SEM.ACQUIRE",
            "m:one",
            "1",
            "30",
            "ID",
            "waiter",
            "WAIT",
            "10",
        ],
    );
    until_in_line(&mut conn, "m:one", 1);
    let released: i64 = run(&mut conn, &["SEM.RELEASE", "m:one", "holder"]);
    assert_eq!(released, 1);
    let served = waiter.reply().expect("the waiter's reply");
    assert_eq!(text(&served), "waiter");
    let holders = zset(&mut conn, "m:one");
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].0, "waiter");

    // The script hands its calls to the module once it is loaded: a release through it serves
    // the module's waiter at once, and the script's own waiters are told to use the module.
    let waiter = Pending::send(
        &server,
        &[
            "SEM.ACQUIRE",
            "m:three",
            "1",
            "30",
            "ID",
            "w3",
            "WAIT",
            "10",
        ],
    );
    until_in_line(&mut conn, "m:three", 1);
    let released = script(&mut conn, "m:three", "RELEASE", &["holder"]).expect("RELEASE");
    assert_eq!(released, Value::Int(1));
    assert_eq!(text(&waiter.reply().expect("the waiter's reply")), "w3");
    let refreshed = script(&mut conn, "m:three", "REFRESH", &["w3", "40"]).expect("REFRESH");
    assert_eq!(refreshed, Value::Int(1));
    let calls: String = run(&mut conn, &["INFO", "commandstats"]);
    assert!(
        calls.contains("cmdstat_sem.refresh:calls=2"),
        "one SEM.REFRESH above, one through the script: {calls}"
    );

    let released = script(&mut conn, "m:two", "RELEASE", &["holder"]).expect("RELEASE");
    assert_eq!(released, Value::Int(1));
    assert_eq!(told(&mut conn, "m:two", "in-line"), vec!["M".to_string()]);
    let exists: i64 = run(&mut conn, &["EXISTS", "m:two:line", "m:two:places"]);
    assert_eq!(exists, 0, "the script's line is given up");
    let value = script(
        &mut conn,
        "m:two",
        "ACQUIRE",
        &["1", "60", "ID", "in-line", "LINE"],
    )
    .expect("an acquire through the script");
    let (reply, retry, ahead) = acquire_reply3(value);
    assert_eq!(
        (text(&reply), retry, ahead),
        ("in-line".to_string(), 0, -1),
        "the module's grant"
    );
    let exists: i64 = run(&mut conn, &["EXISTS", "m:two:wake:in-line"]);
    assert_eq!(exists, 0);
}

// ---------------------------------------------------------------------------------------------
// Contention

const CLIENTS: usize = 24;
const LIMIT: i64 = 3;
const HAMMER_FOR: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
struct Tally {
    grants: u64,
    refusals: u64,
    max_inside: i64,
    tickets: Vec<i64>,
}

fn hammer_client(server: &Server, fair: bool, name: &str, client: usize, start: &Barrier) -> Tally {
    let mut conn = server.connection();
    let mut tally = Tally::default();
    let limit = LIMIT.to_string();
    start.wait();
    let until = Instant::now() + HAMMER_FOR;
    let mut attempt = 0;
    while Instant::now() < until {
        attempt += 1;
        let id = format!("c{client}-{attempt}");
        let (reply, retry) = match fair {
            true => script_acquire(
                &mut conn,
                name,
                "ACQUIREFAIR",
                &[&limit, "10", "ID", &id, "WITHTICKET"],
            ),
            false => script_acquire(&mut conn, name, "ACQUIRE", &[&limit, "10", "ID", &id]),
        };
        if reply == Value::Nil {
            assert!(retry > 0 && retry <= 10_000, "retry_ms {retry}");
            tally.refusals += 1;
            continue;
        }
        tally.grants += 1;
        if fair {
            tally.tickets.push(id_and_ticket(&reply).1);
        }
        let inside: i64 = run(&mut conn, &["INCR", "inside"]);
        tally.max_inside = tally.max_inside.max(inside);
        let _: i64 = run(&mut conn, &["DECR", "inside"]);
        let released = script(&mut conn, name, "RELEASE", &[&id]).expect("RELEASE");
        assert_eq!(
            released,
            Value::Int(1),
            "{id} lost its permit before releasing it"
        );
    }
    tally
}

/// The counter's values as the server wrote them, in order: every `SET <name>:counter` the
/// script made, as MONITOR shows it, until `ECHO monitor-end`.
fn monitor_counter(server: &Server, name: &str) -> thread::JoinHandle<Vec<i64>> {
    let mut monitor = RawClient::connect(server);
    monitor.send(&["MONITOR"]);
    assert_eq!(monitor.reply(), "OK");
    let needle = format!("\"SET\" \"{name}:counter\" \"");
    thread::spawn(move || {
        let mut written = Vec::new();
        loop {
            let line = monitor.reply();
            if line.contains("\"monitor-end\"") {
                return written;
            }
            if let Some(at) = line.find(&needle) {
                let value = line[at + needle.len()..].trim_end_matches('"');
                written.push(value.parse().expect("a ticket"));
            }
        }
    })
}

fn hammer(fair: bool, name: &str) {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    let monitor = fair.then(|| monitor_counter(&server, name));
    let start = Barrier::new(CLIENTS);
    let mut total = Tally::default();
    thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let start = &start;
                let server = &server;
                scope.spawn(move || hammer_client(server, fair, name, client, start))
            })
            .collect();
        for handle in clients {
            let tally = handle.join().expect("a client panicked");
            total.grants += tally.grants;
            total.refusals += tally.refusals;
            total.max_inside = total.max_inside.max(tally.max_inside);
            total.tickets.extend(tally.tickets);
        }
    });
    eprintln!(
        "{name}: {} grants, {} refusals, at most {} inside",
        total.grants, total.refusals, total.max_inside
    );
    assert!(total.grants > 0 && total.refusals > 0, "{total:?}");
    assert!(
        total.max_inside <= LIMIT,
        "limit exceeded: {}",
        total.max_inside
    );
    assert!(
        total.max_inside > 1,
        "never two holders at once: no real contention"
    );
    let in_use = script(&mut conn, name, "GET", &[]).expect("GET");
    assert_eq!(in_use, Value::Int(0));
    let left: Vec<String> = run(&mut conn, &["KEYS", "*"]);
    let left: BTreeSet<String> = left.into_iter().filter(|k| !k.ends_with(":wake")).collect();
    let mut expected = BTreeSet::from(["inside".to_string()]);
    if fair {
        expected.insert(format!("{name}:counter"));
    }
    assert_eq!(left, expected, "only the counter is left");

    let Some(monitor) = monitor else { return };
    let _: String = run(&mut conn, &["ECHO", "monitor-end"]);
    let in_grant_order = monitor.join().expect("the monitor");
    assert!(
        in_grant_order.windows(2).all(|pair| pair[0] < pair[1]),
        "tickets do not grow in grant order"
    );
    assert_eq!(
        in_grant_order.len() as u64,
        total.grants,
        "one ticket per grant"
    );
    let replied: HashSet<i64> = total.tickets.iter().copied().collect();
    assert_eq!(
        replied.len(),
        total.tickets.len(),
        "a ticket was handed out twice"
    );
    assert_eq!(
        replied,
        in_grant_order.iter().copied().collect::<HashSet<_>>()
    );
    let counter: i64 = run(&mut conn, &["GET", &format!("{name}:counter")]);
    assert_eq!(Some(&counter), in_grant_order.last());
}

#[test]
fn clients_through_the_script_never_exceed_a_plain_limit() {
    hammer(false, "cplain");
}

#[test]
fn clients_through_the_script_never_exceed_a_fair_limit_and_tickets_grow_in_grant_order() {
    hammer(true, "cfair");
}

// ---------------------------------------------------------------------------------------------
// The line

/// Waits until `n` clients are blocked on the server.
fn until_blocked(conn: &mut redis::Connection, n: u64) {
    wait_until(&format!("{n} blocked"), Duration::from_secs(10), || {
        let info: String = run(conn, &["INFO", "clients"]);
        info.lines()
            .find_map(|line| line.strip_prefix("blocked_clients:"))
            .is_some_and(|value| value.trim() == n.to_string())
    });
}

/// An acquire with `LINE` that is refused: retry_ms and how many wait ahead.
fn take_place(conn: &mut redis::Connection, name: &str, op: &str, args: &[&str]) -> (i64, i64) {
    let mut args = args.to_vec();
    args.push("LINE");
    let value = script(conn, name, op, &args).expect("an acquire with LINE");
    let (reply, retry, ahead) = acquire_reply3(value);
    assert_eq!(reply, Value::Nil, "{op} {args:?} was granted");
    (retry, ahead)
}

/// What the script told waiter `id` of `name`, oldest first (the list is left as it is).
fn told(conn: &mut redis::Connection, name: &str, id: &str) -> Vec<String> {
    run(conn, &["LRANGE", &format!("{name}:wake:{id}"), "0", "-1"])
}

#[test]
fn the_line_serves_waiters_first_come_first_served_and_nobody_barges_into_a_fair_one() {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    let (held, _) = script_acquire(
        &mut conn,
        "f",
        "ACQUIREFAIR",
        &["1", "60", "ID", "holder", "WITHTICKET"],
    );
    let mut last_ticket = id_and_ticket(&held).1;
    let waiters = ["w0", "w1", "w2", "w3", "w4"];
    for (i, id) in waiters.iter().enumerate() {
        let (retry, ahead) = take_place(&mut conn, "f", "ACQUIREFAIR", &["1", "60", "ID", id]);
        assert_eq!(ahead, i as i64, "{id}");
        assert!(retry > 59_000 && retry <= 60_000, "retry_ms {retry}");
    }
    // Again: the place is kept, not taken anew at the end.
    let (_, ahead) = take_place(&mut conn, "f", "ACQUIREFAIR", &["1", "60", "ID", "w1"]);
    assert_eq!(ahead, 1);
    // A fair newcomer without LINE is refused while anyone waits, and takes no place.
    let value = script(
        &mut conn,
        "f",
        "ACQUIREFAIR",
        &["2", "60", "ID", "newcomer"],
    )
    .expect("acquire");
    let (reply, _, ahead) = acquire_reply3(value);
    assert_eq!((reply, ahead), (Value::Nil, 5));

    // The first waiter's BLPOP wakes on the release with its grant.
    let mut blocked = Some(Pending::send(&server, &["BLPOP", "f:wake:w0", "10"]));
    until_blocked(&mut conn, 1);
    let mut previous = "holder".to_string();
    for id in waiters {
        let released = script(&mut conn, "f", "RELEASE", &[&previous]).expect("RELEASE");
        assert_eq!(released, Value::Int(1));
        let holders = zset(&mut conn, "f");
        assert_eq!(holders.len(), 1);
        assert_eq!(holders[0].0, id, "granted in arrival order");
        let message = if let Some(pending) = blocked.take() {
            match pending.reply().expect("BLPOP's reply") {
                Value::Array(pair) => {
                    assert_eq!(text(&pair[0]), "f:wake:w0");
                    text(&pair[1])
                }
                other => panic!("BLPOP replied {other:?}"),
            }
        } else {
            let mut list = told(&mut conn, "f", id);
            assert_eq!(list.len(), 1, "{id}: {list:?}");
            list.remove(0)
        };
        let ticket: i64 = message
            .strip_prefix('G')
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{id} was told {message:?}"));
        assert!(ticket > last_ticket, "{ticket} after {last_ticket}");
        let owner: i64 = run(&mut conn, &["ZSCORE", "f:owner", id]);
        assert_eq!(owner, ticket);
        last_ticket = ticket;
        previous = id.to_string();
    }
    script(&mut conn, "f", "RELEASE", &[&previous]).expect("RELEASE");
    for id in &waiters[1..] {
        let _: i64 = run(&mut conn, &["DEL", &format!("f:wake:{id}")]);
    }
    let keys: Vec<String> = run(&mut conn, &["KEYS", "*"]);
    assert_eq!(keys, vec!["f:counter".to_string()], "the line left nothing");

    // Plain: the same line; a newcomer without LINE may take a permit the first waiter cannot
    // use (it asks for more than is free), as SEM.ACQUIRE without WAIT does.
    script_acquire(&mut conn, "p", "ACQUIRE", &["3", "60", "ID", "h1"]);
    script_acquire(&mut conn, "p", "ACQUIRE", &["3", "60", "ID", "h2"]);
    let (_, ahead) = take_place(
        &mut conn,
        "p",
        "ACQUIRE",
        &["3", "60", "ID", "big", "COUNT", "2"],
    );
    assert_eq!(ahead, 0);
    let (_, ahead) = take_place(&mut conn, "p", "ACQUIRE", &["3", "60", "ID", "small"]);
    assert_eq!(ahead, 1, "a waiter behind one that does not fit waits");
    let value = script(&mut conn, "p", "ACQUIRE", &["3", "60", "ID", "barger"]).expect("acquire");
    assert_eq!(text(&acquire_reply3(value).0), "barger");
    script(&mut conn, "p", "RELEASE", &["h1"]).expect("RELEASE");
    assert!(
        told(&mut conn, "p", "big").is_empty(),
        "one free permit: big waits"
    );
    assert!(
        told(&mut conn, "p", "small").is_empty(),
        "nobody passes big"
    );
    script(&mut conn, "p", "RELEASE", &["h2"]).expect("RELEASE");
    assert_eq!(told(&mut conn, "p", "big"), vec!["G".to_string()]);
    assert!(
        told(&mut conn, "p", "small").is_empty(),
        "big holds 2, barger 1: full"
    );
    script(&mut conn, "p", "RELEASE", &["barger"]).expect("RELEASE");
    assert_eq!(told(&mut conn, "p", "small"), vec!["G".to_string()]);
    let in_use = script(&mut conn, "p", "GET", &[]).expect("GET");
    assert_eq!(in_use, Value::Int(3));
    let exists: i64 = run(&mut conn, &["EXISTS", "p:line", "p:places"]);
    assert_eq!(exists, 0, "no empty line is left");
}

#[test]
fn tick_serves_a_lease_end_and_leave_gives_the_grant_made_before_it() {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    script_acquire(&mut conn, "t", "ACQUIRE", &["1", "0.3", "ID", "short"]);
    let (retry, ahead) = take_place(&mut conn, "t", "ACQUIRE", &["1", "30", "ID", "first"]);
    assert_eq!(ahead, 0);
    assert!(retry > 0 && retry <= 300, "retry_ms {retry}");
    take_place(&mut conn, "t", "ACQUIRE", &["1", "30", "ID", "second"]);
    let early: i64 = script(&mut conn, "t", "TICK", &[])
        .map(|v| int(&v))
        .expect("TICK");
    assert!(early > 0 && early <= retry, "TICK before the end: {early}");
    assert!(told(&mut conn, "t", "first").is_empty());
    sleep(Duration::from_millis(retry as u64 + 20));
    let before = server_ms(&mut conn);
    let next: i64 = script(&mut conn, "t", "TICK", &[])
        .map(|v| int(&v))
        .expect("TICK");
    assert_eq!(told(&mut conn, "t", "first"), vec!["G".to_string()]);
    let deadline: i64 = run(&mut conn, &["ZSCORE", "t", "first"]);
    assert!(deadline >= before + 30_000, "the lease starts at the grant");
    assert!(next > 29_000 && next <= 30_000, "the next deadline: {next}");
    assert!(
        told(&mut conn, "t", "second").is_empty(),
        "its lease is far: no H"
    );

    // LEAVE hands over a grant made before it: the caller holds that permit.
    let released = script(&mut conn, "t", "RELEASE", &["first"]).expect("RELEASE");
    assert_eq!(released, Value::Int(1));
    let left = script(&mut conn, "t", "LEAVE", &["second"]).expect("LEAVE");
    assert_eq!(text(&left), "G");
    let holders = zset(&mut conn, "t");
    assert_eq!(holders[0].0, "second");
    let exists: i64 = run(
        &mut conn,
        &["EXISTS", "t:wake:second", "t:line", "t:places"],
    );
    assert_eq!(exists, 0);
    // A grant told on the list while the waiter was between two tries, then renewed by its
    // next try, leaves no message behind for a later wait with the same identifier.
    script(&mut conn, "t", "RELEASE", &["second"]).expect("RELEASE");
    script_acquire(&mut conn, "t", "ACQUIRE", &["1", "30", "ID", "keeper"]);
    take_place(&mut conn, "t", "ACQUIRE", &["1", "30", "ID", "second"]);
    script(&mut conn, "t", "RELEASE", &["keeper"]).expect("RELEASE");
    assert_eq!(told(&mut conn, "t", "second"), vec!["G".to_string()]);
    let value = script(
        &mut conn,
        "t",
        "ACQUIRE",
        &["1", "30", "ID", "second", "LINE"],
    )
    .expect("the next try");
    assert_eq!(text(&acquire_reply3(value).0), "second", "a renewal");
    assert!(
        told(&mut conn, "t", "second").is_empty(),
        "the told grant went with it"
    );
    // LEAVE without a grant: nil, and the place goes.
    take_place(&mut conn, "t", "ACQUIRE", &["1", "30", "ID", "third"]);
    let left = script(&mut conn, "t", "LEAVE", &["third"]).expect("LEAVE");
    assert_eq!(left, Value::Nil);
    let exists: i64 = run(&mut conn, &["EXISTS", "t:line", "t:places"]);
    assert_eq!(exists, 0);

    // A new first waiter whose holder's lease ends soon is told "H" and the milliseconds to
    // that end.
    script(&mut conn, "t", "RELEASE", &["second"]).expect("RELEASE");
    script_acquire(&mut conn, "t", "ACQUIRE", &["2", "30", "ID", "long"]);
    script_acquire(&mut conn, "t", "ACQUIRE", &["2", "1", "ID", "soon"]);
    take_place(&mut conn, "t", "ACQUIRE", &["2", "30", "ID", "a"]);
    take_place(&mut conn, "t", "ACQUIRE", &["2", "30", "ID", "b"]);
    script(&mut conn, "t", "RELEASE", &["long"]).expect("RELEASE");
    let soon_ends: f64 = run(&mut conn, &["ZSCORE", "t", "soon"]);
    let soon_ends = soon_ends.ceil() as i64;
    let at = server_ms(&mut conn);
    assert_eq!(told(&mut conn, "t", "a"), vec!["G".to_string()]);
    let nudge = told(&mut conn, "t", "b");
    assert_eq!(nudge.len(), 1, "{nudge:?}");
    let ms: i64 = nudge[0]
        .strip_prefix('H')
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("{nudge:?}"));
    assert!(
        ms > 0 && ms <= 1000 && (at + ms - soon_ends).abs() <= 100,
        "told H{ms} at {at}, soon's lease ends at {soon_ends} (within 2.5 s)"
    );
}

/// The holders of a limit-1 `name` that believe they hold: each must be live on the server,
/// and there is at most one.
fn assert_one_believer(conn: &mut redis::Connection, name: &str, believers: &[&str], at: &str) {
    let now = server_ms(conn);
    for id in believers {
        let deadline: Option<f64> = run(conn, &["ZSCORE", name, id]);
        assert!(
            deadline.is_some_and(|d| d.ceil() as i64 > now),
            "{at}: {id} believes it holds a permit of {name}, which the server does not count \
             (deadline {deadline:?}, now {now}); believers {believers:?}"
        );
    }
    assert!(
        believers.len() <= 1,
        "{at}: {believers:?} all believe they hold {name} of limit 1"
    );
}

/// `op args...` on `name` through the script `source`, which must not fail.
fn eval_ok(
    conn: &mut redis::Connection,
    source: &str,
    name: &str,
    op: &str,
    args: &[&str],
) -> Value {
    eval_text(conn, source, name, op, args)
        .unwrap_or_else(|err| panic!("{op} {name} {args:?}: {}", error_text(&err)))
}

/// A waiter granted while it was away (through a failover the new primary serves the line
/// while the waiter reconnects; the lists are keys and survive it), whose short lease ran out
/// before it came back, holds nothing: neither its next `BLPOP` after its resent attempt put it
/// back in line, nor `LEAVE`, hands it that grant, so a newcomer that took the permit is the
/// one holder of a limit-1 name. Through the quick path and through the full routines.
#[test]
fn a_grant_whose_lease_ran_out_before_its_waiter_came_back_is_never_taken() {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    let full_source = full_routines_text();
    for (path, source) in [("quick", SCRIPT), ("full", full_source.as_str())] {
        let conn = &mut conn;
        for round in 0..6 {
            let name = format!("{path}{round}");
            let name = name.as_str();
            let at = format!("{path} round {round}");
            let first = eval_ok(conn, source, name, "ACQUIRE", &["1", "0.1", "ID", "first"]);
            assert_eq!(text(&acquire_reply3(first).0), "first", "{at}");
            let args = ["1", "0.2", "ID", "waiter", "LINE"];
            let placed = eval_ok(conn, source, name, "ACQUIRE", &args);
            assert_eq!(acquire_reply3(placed).0, Value::Nil, "{at}");
            // The waiter is away. The first lease ends; TICK (another waiter's, or any call
            // that serves the line) grants the waiter and tells it on its list.
            sleep(Duration::from_millis(130));
            eval_ok(conn, source, name, "TICK", &[]);
            assert_eq!(told(conn, name, "waiter"), ["G"], "{at}");
            // Its lease ends before it comes back; a newcomer takes the permit.
            sleep(Duration::from_millis(230));
            let newcomer = eval_ok(
                conn,
                source,
                name,
                "ACQUIRE",
                &["1", "30", "ID", "newcomer"],
            );
            assert_eq!(text(&acquire_reply3(newcomer).0), "newcomer", "{at}");
            let mut believers = vec!["newcomer"];
            if round % 2 == 0 {
                // Back: its resent attempt is refused and puts it in line; then it blocks on
                // its list.
                let again = eval_ok(conn, source, name, "ACQUIRE", &args);
                let (reply, _, ahead) = acquire_reply3(again);
                assert_eq!((reply, ahead), (Value::Nil, 0), "{at}");
                let list = format!("{name}:wake:waiter");
                let popped: Option<(String, String)> = run(conn, &["BLPOP", &list, "0.05"]);
                if popped.is_some_and(|(_, message)| message.starts_with('G')) {
                    believers.push("waiter");
                }
            } else {
                // Back with its wait over: it leaves, taking a grant made to it meanwhile.
                let left = eval_ok(conn, source, name, "LEAVE", &["waiter"]);
                if text(&left).starts_with('G') {
                    believers.push("waiter");
                }
            }
            assert_one_believer(conn, name, &believers, &at);
        }
        // A grant told and still live is handed over by LEAVE, as before.
        let name = format!("{path}-live");
        let name = name.as_str();
        eval_ok(conn, source, name, "ACQUIRE", &["1", "0.1", "ID", "first"]);
        eval_ok(
            conn,
            source,
            name,
            "ACQUIRE",
            &["1", "30", "ID", "waiter", "LINE"],
        );
        sleep(Duration::from_millis(130));
        eval_ok(conn, source, name, "TICK", &[]);
        let left = eval_ok(conn, source, name, "LEAVE", &["waiter"]);
        assert_eq!(text(&left), "G", "{path}");
        assert_one_believer(conn, name, &["waiter"], path);
    }
}

#[test]
fn a_place_that_ran_out_is_passed_over_and_the_line_expires() {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    script_acquire(&mut conn, "d", "ACQUIRE", &["1", "60", "ID", "holder"]);
    take_place(&mut conn, "d", "ACQUIRE", &["1", "60", "ID", "dead"]);
    take_place(&mut conn, "d", "ACQUIRE", &["1", "60", "ID", "alive"]);
    let place: String = run(&mut conn, &["HGET", "d:places", "dead"]);
    let (deadline, rest) = place.split_once(' ').expect("a place");
    let deadline: i64 = deadline.parse().expect("a deadline");
    let now = server_ms(&mut conn);
    assert!(
        (now + PLACE_MS - 1000..=now + PLACE_MS).contains(&deadline),
        "{place}"
    );
    let pttl: i64 = run(&mut conn, &["PTTL", "d:line"]);
    assert!(pttl > PLACE_MS - 1000 && pttl <= PLACE_MS, "PTTL {pttl}");
    // The dead waiter's place as it stands once its time is up (its process stopped trying).
    let _: i64 = run(
        &mut conn,
        &["HSET", "d:places", "dead", &format!("{} {rest}", now - 1)],
    );
    script(&mut conn, "d", "RELEASE", &["holder"]).expect("RELEASE");
    assert!(told(&mut conn, "d", "dead").is_empty());
    assert_eq!(told(&mut conn, "d", "alive"), vec!["G".to_string()]);
    let line: i64 = run(&mut conn, &["EXISTS", "d:line", "d:places"]);
    assert_eq!(line, 0);

    // A line nobody comes back to expires with its lists.
    take_place(&mut conn, "d", "ACQUIRE", &["1", "60", "ID", "gone"]);
    script(&mut conn, "d", "RELEASE", &["alive"]).expect("RELEASE");
    assert_eq!(told(&mut conn, "d", "gone"), vec!["G".to_string()]);
    let pttl: i64 = run(&mut conn, &["PTTL", "d:wake:gone"]);
    assert!(pttl > 0 && pttl <= PLACE_MS, "PTTL {pttl}");
}

#[test]
fn refresh_and_release_work_when_memory_is_full_and_a_newcomer_is_refused() {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    script_acquire(&mut conn, "d:fair", "ACQUIREFAIR", &["3", "60", "ID", "a"]);
    script_acquire(&mut conn, "d:fair", "ACQUIREFAIR", &["3", "60", "ID", "b"]);
    let before = snapshot(&mut conn);
    let _: () = run(
        &mut conn,
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    );
    let _: () = run(&mut conn, &["CONFIG", "SET", "maxmemory", "1"]);
    let text_acquire = acquire_text();
    let refused = redis::cmd("EVAL")
        .arg(&text_acquire)
        .arg(6)
        .arg(script_keys("d:fair"))
        .arg("ACQUIREFAIR")
        .arg(&["3", "60", "ID", "c"][..])
        .query::<Value>(&mut conn);
    let refused = error_text(&refused.expect_err("full"));
    let after = snapshot(&mut conn);
    assert_eq!(
        after.sems["d:fair"].holders, before.sems["d:fair"].holders,
        "nothing changed"
    );
    assert_eq!(after.sems["d:fair"].counter, before.sems["d:fair"].counter);
    let refreshed = script(&mut conn, "d:fair", "REFRESH", &["a", "90"]);
    let released = script(&mut conn, "d:fair", "RELEASE", &["b"]);
    let _: () = run(&mut conn, &["CONFIG", "SET", "maxmemory", "0"]);
    assert!(refused.starts_with("OOM command not allowed"), "{refused}");
    assert_eq!(refreshed.expect("REFRESH when full"), Value::Int(1));
    assert_eq!(released.expect("RELEASE when full"), Value::Int(1));
    let value = redis::cmd("EVAL")
        .arg(&text_acquire)
        .arg(6)
        .arg(script_keys("d:fair"))
        .arg("ACQUIREFAIR")
        .arg(&["3", "60", "ID", "c"][..])
        .query::<Value>(&mut conn)
        .expect("room again");
    assert_eq!(text(&acquire_reply(value).0), "c");
}

#[test]
fn a_refusal_tells_the_time_to_the_earliest_deadline() {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    script_acquire(&mut conn, "r", "ACQUIRE", &["2", "30", "ID", "late"]);
    script_acquire(&mut conn, "r", "ACQUIRE", &["2", "5", "ID", "soon"]);
    let soon: i64 = run(&mut conn, &["ZSCORE", "r", "soon"]);
    let before = server_ms(&mut conn);
    let (refused, retry) = script_acquire(&mut conn, "r", "ACQUIRE", &["2", "30", "ID", "third"]);
    let after = server_ms(&mut conn);
    assert_eq!(refused, Value::Nil);
    assert!(
        (soon - after..=soon - before).contains(&retry),
        "retry_ms {retry}, the earliest deadline in {} ms",
        soon - before
    );
    // A refused weighted or fair acquire tells the same.
    let (refused, retry2) = script_acquire(
        &mut conn,
        "r",
        "ACQUIRE",
        &["2", "30", "ID", "x", "COUNT", "2"],
    );
    assert_eq!(refused, Value::Nil);
    assert!(
        retry2 <= retry && retry2 > retry - 1000,
        "{retry2} after {retry}"
    );

    // Paused with nobody holding: no deadline to wait for.
    let ok = script(&mut conn, "p", "LIMIT", &["0"]).expect("LIMIT 0");
    assert_eq!(ok, Value::Okay);
    let (retry, ahead) = take_place(&mut conn, "p", "ACQUIREFAIR", &["5", "30", "ID", "x"]);
    assert_eq!((retry, ahead), (0, 0));
    take_place(&mut conn, "p", "ACQUIREFAIR", &["5", "30", "ID", "y"]);
    take_place(&mut conn, "p", "ACQUIREFAIR", &["5", "30", "ID", "z"]);
    // Raising the limit serves as many waiters as it frees permits, in order.
    let ok = script(&mut conn, "p", "LIMIT", &["2"]).expect("LIMIT 2");
    assert_eq!(ok, Value::Okay);
    assert_eq!(told(&mut conn, "p", "x").len(), 1);
    assert_eq!(told(&mut conn, "p", "y").len(), 1);
    assert!(told(&mut conn, "p", "z").is_empty());
    let cleared = script(&mut conn, "p", "LIMIT", &["CLEAR"]).expect("LIMIT CLEAR");
    assert_eq!(cleared, Value::Int(1));
    assert_eq!(
        told(&mut conn, "p", "z").len(),
        1,
        "the callers' own limit of 5 again"
    );

    // Expired holders removed by another call serve the line (as far as the limit leaves
    // room), and a weighted one's field goes with it.
    script_acquire(&mut conn, "e", "ACQUIRE", &["4", "30", "ID", "keep"]);
    script_acquire(
        &mut conn,
        "e",
        "ACQUIRE",
        &["4", "0.1", "ID", "e1", "COUNT", "3"],
    );
    take_place(
        &mut conn,
        "e",
        "ACQUIRE",
        &["4", "30", "ID", "w", "COUNT", "2"],
    );
    sleep(Duration::from_millis(200));
    let in_use = script(&mut conn, "e", "GET", &[]).expect("GET");
    assert_eq!(in_use, Value::Int(1));
    assert!(told(&mut conn, "e", "w").is_empty(), "GET writes nothing");
    script(&mut conn, "e", "REFRESH", &["keep", "30"]).expect("REFRESH");
    assert_eq!(told(&mut conn, "e", "w"), vec!["G".to_string()]);
    let permits: BTreeMap<String, String> = run(&mut conn, &["HGETALL", "e:permits"]);
    assert_eq!(
        permits,
        BTreeMap::from([
            ("w".to_string(), "2".to_string()),
            ("".to_string(), "1".to_string())
        ]),
        "the expired weighted holder's field went; the waiter's came"
    );
}

/// Fair tickets of a name whose keys went between two grants (`DEL` of the name, its owner set
/// and its counter, or `FLUSHDB`) start again from the server's clock in microseconds: two fair
/// grants pipelined with the delete between them, most often within one millisecond, get two
/// tickets, the second above the first, in every round.
#[test]
fn a_fair_ticket_after_its_keys_went_is_above_the_one_before() {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    let sha: String = run(&mut conn, &["SCRIPT", "LOAD", SCRIPT]);
    let deletes: [&[&str]; 2] = [
        &["DEL", "fence", "fence:owner", "fence:counter"],
        &["FLUSHDB"],
    ];
    for delete in deletes {
        let mut repeats = Vec::new();
        for round in 0..200 {
            let acquire = |id: &str| {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&sha).arg(6).arg(script_keys("fence"));
                cmd.arg(&["ACQUIREFAIR", "1", "30", "ID", id, "WITHTICKET"][..]);
                cmd
            };
            let (a, b): (Value, Value) = redis::pipe()
                .add_command(acquire("a"))
                .add_command(redis::cmd(delete[0]).arg(&delete[1..]).to_owned())
                .ignore()
                .add_command(acquire("b"))
                .query(&mut conn)
                .expect("the pipeline");
            let (a, _) = acquire_reply(a);
            let (b, _) = acquire_reply(b);
            let (a, b) = (id_and_ticket(&a).1, id_and_ticket(&b).1);
            if b <= a {
                repeats.push((round, a, b));
            }
            let _: () = run(&mut conn, &["FLUSHDB"]);
        }
        assert!(
            repeats.is_empty(),
            "{delete:?}: {} of 200 rounds gave the second grant a ticket not above the first \
             (round, first, second): {:?}",
            repeats.len(),
            &repeats[..repeats.len().min(5)]
        );
    }
}

#[test]
fn the_script_loads_by_the_sha1_of_its_bytes_and_refuses_what_needs_the_module() {
    let server = Server::start_without_module();
    let mut conn = server.connection();
    let loaded: String = run(&mut conn, &["SCRIPT", "LOAD", SCRIPT]);
    assert_eq!(loaded, sha());
    let _: () = run(&mut conn, &["SCRIPT", "FLUSH"]);
    // NOSCRIPT, then EVAL, which loads it.
    let in_use = script(&mut conn, "x", "get", &[]).expect("GET");
    assert_eq!(in_use, Value::Int(0));
    let exists: Vec<i64> = run(&mut conn, &["SCRIPT", "EXISTS", &sha()]);
    assert_eq!(exists, vec![1]);

    let error = |conn: &mut redis::Connection, op: &str, args: &[&str]| {
        error_text(&script(conn, "x", op, args).expect_err("an error"))
    };
    assert_eq!(
        error(&mut conn, "ACQUIRE", &["2", "30", "ID", "a", "BOUND"]),
        "ERR BOUND needs the redsem module loaded in the server"
    );
    assert!(
        error(&mut conn, "ACQUIRE", &["2", "30", "ID", "a", "WAIT", "1"])
            .starts_with("ERR WAIT needs the redsem module loaded in the server")
    );
    assert!(error(&mut conn, "ACQUIRE", &["2", "30"]).contains("ID <identifier> is required"));
    assert_eq!(
        error(&mut conn, "GET", &["JSON"]),
        "ERR SEM.GET JSON needs the redsem module loaded in the server"
    );
    assert!(
        error(&mut conn, "WAITEMPTY", &["1"]).starts_with("ERR unknown redsem script operation")
    );
    let wrong_keys = redis::cmd("EVALSHA")
        .arg(sha())
        .arg(6)
        .arg(
            &[
                "x",
                "x:owner",
                "x:counter",
                "x:permits",
                "x:limit",
                "y:wake",
            ][..],
        )
        .arg("GET")
        .query::<Value>(&mut conn);
    assert!(error_text(&wrong_keys.expect_err("wrong keys")).contains("takes 6 keys"));
    let keys: Vec<String> = run(&mut conn, &["KEYS", "*"]);
    assert!(keys.is_empty(), "errors wrote {keys:?}");
}

// ---------------------------------------------------------------------------------------------
// The quick path against the full routines

/// The script with its quick path turned off: every call goes through the full routines.
fn full_routines_text() -> String {
    let on = "\nlocal QUICK = true\n";
    assert!(
        SCRIPT.contains(on),
        "the script turns its quick path on in one line"
    );
    SCRIPT.replacen(on, "\nlocal QUICK = false\n", 1)
}

fn eval_text(
    conn: &mut redis::Connection,
    text: &str,
    name: &str,
    op: &str,
    args: &[&str],
) -> RedisResult {
    redis::cmd("EVAL")
        .arg(text)
        .arg(6)
        .arg(script_keys(name))
        .arg(op)
        .arg(args)
        .query(conn)
}

/// Every key of a server with its type, PEXPIRETIME and content (zsets and hashes as pairs),
/// and the server's time first.
const DUMP: &str = r#"
local t = redis.call('TIME')
local out = { tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) }
for _, key in ipairs(redis.call('KEYS', '*')) do
  local kind = redis.call('TYPE', key).ok
  local content = {}
  if kind == 'zset' then content = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  elseif kind == 'hash' then content = redis.call('HGETALL', key)
  elseif kind == 'list' then content = redis.call('LRANGE', key, 0, -1)
  elseif kind == 'string' then content = { redis.call('GET', key) } end
  table.insert(out, { key, kind, redis.call('PEXPIRETIME', key), content })
end
return out
"#;

#[derive(Debug, Clone, PartialEq)]
struct Dumped {
    kind: String,
    expires: i64,
    /// zset: member -> score; hash: field -> value; list and string: index -> item.
    content: BTreeMap<String, String>,
}

struct Dump {
    at: i64,
    keys: BTreeMap<String, Dumped>,
}

fn dump(conn: &mut redis::Connection) -> Dump {
    let value: Value = redis::cmd("EVAL")
        .arg(DUMP)
        .arg(0)
        .query(conn)
        .expect("the dump");
    let Value::Array(mut parts) = value else {
        panic!("dump: {value:?}")
    };
    let rest = parts.split_off(1);
    let keys = rest
        .iter()
        .map(|entry| {
            let Value::Array(entry) = entry else {
                panic!("dump entry: {entry:?}")
            };
            let kind = text(&entry[1]);
            let items = strings(&entry[3]);
            let content = match kind.as_str() {
                "zset" | "hash" => items
                    .chunks(2)
                    .map(|pair| (pair[0].clone(), pair[1].clone()))
                    .collect(),
                _ => items
                    .into_iter()
                    .enumerate()
                    .map(|(i, item)| (format!("{i:04}"), item))
                    .collect(),
            };
            let dumped = Dumped {
                kind,
                expires: int(&entry[2]),
                content,
            };
            (text(&entry[0]), dumped)
        })
        .collect();
    Dump {
        at: int(&parts[0]),
        keys,
    }
}

/// A fair one, a plain one, and one of up to 12 holders (the script reads at most 8 whole).
const QUICK_NAMES: [&str; 3] = ["q:fair", "q:plain", "q:wide"];
/// The two servers' calls of a step are made one after the other: their times differ by
/// milliseconds, well within this, and leases differ by more than it.
const QUICK_TOLERANCE_MS: i64 = 150;

impl Dump {
    /// Every time in the keys: holders' deadlines, places' deadlines, expiries.
    fn times(&self) -> Vec<i64> {
        let mut times = Vec::new();
        for (key, dumped) in &self.keys {
            if dumped.expires > 0 {
                times.push(dumped.expires);
            }
            if QUICK_NAMES.contains(&key.as_str()) {
                times.extend(
                    dumped
                        .content
                        .values()
                        .filter_map(|s| s.parse::<f64>().ok())
                        .map(|d| d.ceil() as i64),
                );
            }
            if key.ends_with(":places") {
                times.extend(
                    dumped
                        .content
                        .values()
                        .filter_map(|s| s.split(' ').next()?.parse::<i64>().ok()),
                );
            }
        }
        times
    }
}

/// Two servers' keys are the same but for the times, which may differ by the time between
/// the two calls of a step.
fn assert_same_dump(step: &str, quick: &Dump, full: &Dump) {
    let names = |d: &Dump| {
        d.keys
            .iter()
            .map(|(k, v)| (k.clone(), v.kind.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(quick), names(full), "{step}: the keys differ");
    let close = |a: i64, b: i64| {
        if a < 0 || b < 0 {
            a == b
        } else {
            (a - b).abs() <= QUICK_TOLERANCE_MS
        }
    };
    for (key, q) in &quick.keys {
        let f = &full.keys[key];
        assert!(
            close(q.expires, f.expires),
            "{step}: {key} expires at {} and {}",
            q.expires,
            f.expires
        );
        assert_eq!(
            q.content.keys().collect::<Vec<_>>(),
            f.content.keys().collect::<Vec<_>>(),
            "{step}: {key}'s members"
        );
        for (member, a) in &q.content {
            let b = &f.content[member];
            let same = if QUICK_NAMES.contains(&key.as_str()) {
                let (a, b): (f64, f64) = (a.parse().expect("a score"), b.parse().expect("a score"));
                (a - b).abs() <= QUICK_TOLERANCE_MS as f64
            } else if key.ends_with(":places") {
                let (a_at, a_rest) = a.split_once(' ').unwrap_or((a, ""));
                let (b_at, b_rest) = b.split_once(' ').unwrap_or((b, ""));
                match (a_at.parse::<i64>(), b_at.parse::<i64>()) {
                    (Ok(x), Ok(y)) => close(x, y) && a_rest == b_rest,
                    _ => a == b,
                }
            } else if key.contains(":wake:") && a.starts_with('H') && b.starts_with('H') {
                // "H<ms>": the time to a lease's end, read by each server at its call.
                match (a[1..].parse::<i64>(), b[1..].parse::<i64>()) {
                    (Ok(x), Ok(y)) => (x - y).abs() <= QUICK_TOLERANCE_MS,
                    _ => a == b,
                }
            } else {
                a == b
            };
            assert!(same, "{step}: {key} {member}: {a} and {b}");
        }
    }
}

fn quick_step(rng: &mut Rng) -> Step {
    let name = rng.pick(&QUICK_NAMES).to_string();
    let ids = [
        "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10", "w11", "w12",
    ];
    let wide = name == "q:wide";
    let id = ids[rng.below(if wide { 12 } else { 6 }) as usize].to_string();
    let lease = rng.pick(&["0.3", "0.7", "30"]).to_string();
    let call = |op, args: Vec<String>| Step::Call {
        name: name.clone(),
        op,
        args,
    };
    // The wide one fills up: long leases, more acquires.
    let roll = if wide && rng.chance(40) {
        0
    } else {
        rng.below(100)
    };
    let lease = if wide && rng.chance(60) {
        "30".into()
    } else {
        lease
    };
    match roll {
        0..=44 => {
            let fair = rng.chance(if name == "q:fair" { 85 } else { 15 });
            let limit = if wide {
                8 + rng.below(5)
            } else {
                1 + rng.below(3)
            };
            let mut args = vec![limit.to_string(), lease, "ID".into(), id];
            if rng.chance(8) {
                args.extend(["COUNT".into(), (1 + rng.below(2)).to_string()]);
            }
            if fair && rng.chance(50) {
                args.push("WITHTICKET".into());
            }
            if rng.chance(65) {
                args.push("LINE".into());
            }
            call(if fair { "ACQUIREFAIR" } else { "ACQUIRE" }, args)
        }
        45..=64 => {
            let mut args = vec![id];
            if rng.chance(8) {
                args.extend(["COUNT".into(), "1".into()]);
            }
            call("RELEASE", args)
        }
        65..=74 => call("TICK", vec![]),
        75..=78 => call("LEAVE", vec![id]),
        79..=82 => call("REFRESH", vec![id, lease]),
        83..=84 => {
            let limits: &[&str] = if wide {
                &["CLEAR", "10"]
            } else {
                &["CLEAR", "1", "3"]
            };
            call("LIMIT", vec![rng.pick(limits).to_string()])
        }
        85..=86 => call("GET", vec![]),
        87..=91 => Step::Sleep(if rng.chance(50) { 350 } else { 600 }),
        _ => {
            let foreign: &[&[&str]] = &[
                &["ZADD", "q:plain", "99999999999999", "x9"],
                &["ZREM", "q:plain", "x9"],
                &["ZADD", "q:fair:owner", "5", "x8"],
                &["ZREM", "q:fair:owner", "x8"],
                &["HSET", "q:fair:places", "w9", "garbage"],
                &["ZADD", "q:fair:line", "0", "w9"],
                &["HSET", "q:plain:permits", "", "1"],
                &["DEL", "q:plain:permits"],
                &["SET", "q:fair:counter", "8000000000000000"],
                &["RPUSH", "q:plain:wake:w1", "junk"],
                &["SET", "q:plain:line", "x"],
                &["DEL", "q:plain:line"],
            ];
            Step::Foreign(rng.pick(foreign).iter().map(|s| s.to_string()).collect())
        }
    }
}

/// What the random steps reach seldom, first: a grant after an expired holder goes while
/// another stays (the name's expiry follows the grant, the latest), and a plain grant past a
/// line whose head stays, behind a dropped place (the head is nudged by the deadlines before
/// that grant: none within NUDGE_MS here), and a waiter at the head that holds. A step across a deadline starts again from the
/// seed, so time passes in a sleep short of one and the wait before the next step.
fn quick_prelude() -> Vec<Step> {
    let call = |name: &str, op, args: &[&str]| Step::Call {
        name: name.into(),
        op,
        args: args.iter().map(|s| s.to_string()).collect(),
    };
    let foreign = |args: &[&str]| Step::Foreign(args.iter().map(|s| s.to_string()).collect());
    vec![
        call("q:plain", "ACQUIRE", &["3", "0.3", "ID", "w1"]),
        call("q:plain", "ACQUIRE", &["3", "20", "ID", "w2"]),
        // Short of w1's deadline: the next step waits until it has passed.
        Step::Sleep(250),
        call("q:plain", "ACQUIRE", &["3", "30", "ID", "w3", "LINE"]),
        call("q:plain", "ACQUIRE", &["1", "30", "ID", "w4", "LINE"]),
        foreign(&["ZADD", "q:plain:line", "0", "w9"]),
        foreign(&["HSET", "q:plain:places", "w9", "garbage"]),
        call("q:plain", "ACQUIRE", &["3", "0.3", "ID", "w5"]),
        call("q:plain", "RELEASE", &["w3"]),
        call("q:plain", "RELEASE", &["w5"]),
        // A waiter at the head that holds already: the full routines decide.
        foreign(&["ZADD", "q:fair", "99999999999999", "x9"]),
        foreign(&["ZADD", "q:fair:owner", "5", "x9"]),
        foreign(&["ZADD", "q:fair:line", "0", "x9"]),
        foreign(&[
            "HSET",
            "q:fair:places",
            "x9",
            "99999999999999 fair 3 30000 0",
        ]),
        call("q:fair", "TICK", &[]),
        // The same among more holders than the script reads whole.
        foreign(&[
            "ZADD",
            "q:fair",
            "99999999999999",
            "x1",
            "99999999999999",
            "x2",
            "99999999999999",
            "x3",
            "99999999999999",
            "x4",
            "99999999999999",
            "x5",
            "99999999999999",
            "x6",
            "99999999999999",
            "x7",
            "99999999999999",
            "x8",
        ]),
        foreign(&[
            "ZADD",
            "q:fair:owner",
            "1",
            "x1",
            "2",
            "x2",
            "3",
            "x3",
            "4",
            "x4",
            "5",
            "x5",
            "6",
            "x6",
            "7",
            "x7",
            "8",
            "x8",
        ]),
        foreign(&["ZADD", "q:fair:line", "0", "x9"]),
        foreign(&[
            "HSET",
            "q:fair:places",
            "x9",
            "99999999999999 fair 12 30000 0",
        ]),
        call("q:fair", "TICK", &[]),
        foreign(&[
            "DEL",
            "q:fair",
            "q:fair:owner",
            "q:fair:line",
            "q:fair:places",
        ]),
    ]
}

fn command_info_calls(conn: &mut redis::Connection) -> i64 {
    let info: String = run(conn, &["INFO", "commandstats"]);
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_command|info:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_quick_path_answers_and_writes_as_the_full_routines_do() {
    let full_text = full_routines_text();
    let quick_server = Server::start_without_module();
    let full_server = Server::start_without_module();
    let mut q = quick_server.connection();
    let mut f = full_server.connection();
    // Tickets above every clock's: both servers hand out the same ones;
    // and the wide one starts with 7 holders of 30 s.
    let seed = |conn: &mut redis::Connection, text: &str| {
        let _: () = run(conn, &["FLUSHALL"]);
        let _: () = run(conn, &["SET", "q:fair:counter", "8000000000000000"]);
        let _: () = run(conn, &["SET", "q:plain:counter", "8000000000000000"]);
        let _: () = run(conn, &["SET", "q:wide:counter", "8000000000000000"]);
        for n in 1..=7 {
            let id = format!("s{n}");
            eval_text(conn, text, "q:wide", "ACQUIRE", &["12", "30", "ID", &id]).expect("a seed");
        }
    };
    seed(&mut q, SCRIPT);
    seed(&mut f, &full_text);
    let mut rng = Rng(0x5eed_2026_0042_0002);
    let mut before = (dump(&mut q), dump(&mut f));
    let (mut restarts, mut eligible, mut widest, steps) = (0, 0, 0, 900);
    let quick_text_calls_before = command_info_calls(&mut q);
    let full_text_calls_before = command_info_calls(&mut f);
    let mut first = quick_prelude().into_iter();
    for at in 0..steps {
        let step = first.next().unwrap_or_else(|| quick_step(&mut rng));
        // No time in the keys within the margin of now: both servers see the same side of it.
        let started = loop {
            let now = server_ms(&mut q);
            let near = before
                .0
                .times()
                .into_iter()
                .chain(before.1.times())
                .filter(|t| (t - now).abs() <= MARGIN_MS)
                .max();
            match near {
                Some(t) => sleep(Duration::from_millis((t + MARGIN_MS + 1 - now) as u64)),
                None => break now,
            }
        };
        let mut replies = None;
        match &step {
            Step::Sleep(ms) => sleep(Duration::from_millis(*ms)),
            Step::Foreign(args) => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let a: RedisResult = try_run(&mut q, &args);
                let b: RedisResult = try_run(&mut f, &args);
                assert_eq!(a.is_ok(), b.is_ok(), "step {at}: {args:?}");
            }
            Step::Call { name, op, args } => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                if matches!(*op, "ACQUIRE" | "ACQUIREFAIR" | "RELEASE" | "TICK")
                    && !args.contains(&"COUNT")
                {
                    eligible += 1;
                }
                let a = eval_text(&mut q, SCRIPT, name, op, &args);
                let b = eval_text(&mut f, &full_text, name, op, &args);
                replies = Some((*op, a, b));
            }
        }
        let after = (dump(&mut q), dump(&mut f));
        let end = after.0.at.max(after.1.at);
        let crossed = [&before.0, &before.1, &after.0, &after.1]
            .iter()
            .flat_map(|d| d.times())
            .any(|t| (started - SLACK_MS..=end + SLACK_MS).contains(&t));
        if crossed {
            restarts += 1;
            seed(&mut q, SCRIPT);
            seed(&mut f, &full_text);
            before = (dump(&mut q), dump(&mut f));
            continue;
        }
        let context = format!("step {at} {step:?}");
        if let Some((op, a, b)) = replies {
            match (a, b) {
                (Err(a), Err(b)) => assert_eq!(error_text(&a), error_text(&b), "{context}"),
                (Ok(a), Ok(b)) if op.starts_with("ACQUIRE") => {
                    let (a, a_retry, a_ahead) = acquire_reply3(a);
                    let (b, b_retry, b_ahead) = acquire_reply3(b);
                    assert_eq!((a, a_ahead), (b, b_ahead), "{context}");
                    assert!(
                        (a_retry - b_retry).abs() <= QUICK_TOLERANCE_MS,
                        "{context}: retry_ms {a_retry} and {b_retry}"
                    );
                }
                (Ok(Value::Int(a)), Ok(Value::Int(b))) if op == "TICK" => {
                    assert!(
                        (a - b).abs() <= QUICK_TOLERANCE_MS,
                        "{context}: {a} and {b}"
                    );
                }
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{context}"),
                (a, b) => panic!("{context}: quick {a:?}, full {b:?}"),
            }
        }
        assert_same_dump(&context, &after.0, &after.1);
        let wide = after.0.keys.get("q:wide").map_or(0, |k| k.content.len());
        widest = widest.max(wide);
        before = after;
    }
    // The quick text asks COMMAND INFO twice in a call it hands to the full routines.
    let handed = (command_info_calls(&mut q) - quick_text_calls_before)
        - (command_info_calls(&mut f) - full_text_calls_before);
    eprintln!(
        "{eligible} calls the quick path may take, {handed} handed on, {restarts} restarts, \
         up to {widest} holders"
    );
    assert!(
        widest > 8,
        "q:wide never had more holders than the script reads whole"
    );
    assert!(
        handed * 2 < eligible,
        "the quick path took too few: {handed} of {eligible} handed on"
    );
    assert!(
        restarts * 10 <= steps,
        "{restarts} restarts in {steps} steps: the machine is too slow"
    );
}
