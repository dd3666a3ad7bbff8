//! The random steps: SEM.* calls (every option, valid and invalid arguments, in MULTI/EXEC and
//! from Lua), interleaved with what other clients and operators do to the same keys.

use super::keyspace::{Bytes, Keyspace, Value};
use super::rng::Rng;
use super::sem::{
    counter_key, deadline_ms, interpret, limit_key, owner_key, parse_limit, permits_key, Call, Cmd,
    Interp, Op, SetCall, SetOp, DERIVED,
};
use super::wire::{cmd, show_command};

/// The semaphore names: few, so that steps collide. The last one has a hash tag.
pub const NAMES: [&str; 3] = ["a", "b", "{c}x"];
/// Identifiers clients pass (one is not UTF-8); server-made UUIDs join them while they hold.
pub const IDS: [&[u8]; 5] = [b"i0", b"i1", b"i2", b"i3", b"\xffz"];

/// Runs up to two SEM.* calls on the name KEYS[1]. ARGV: the number of calls, then per call its
/// argument count and arguments (command name first, the name left out). A negative count
/// passes a call's arguments as they are (a call on a set of semaphores names its own).
pub const EVAL_SCRIPT: &str = r#"
local out = {}
local pos = 2
for c = 1, tonumber(ARGV[1]) do
  local argc = tonumber(ARGV[pos])
  local whole = argc < 0
  if whole then argc = -argc end
  local args = {}
  for j = 1, argc do args[j] = ARGV[pos + j] end
  pos = pos + argc + 1
  if whole then
    out[c] = redis.pcall(unpack(args))
  else
    out[c] = redis.pcall(args[1], KEYS[1], unpack(args, 2))
  end
end
if #out == 1 then return out[1] end
return out
"#;

/// Every key a step may touch: each name's four keys.
pub fn universe() -> Vec<Bytes> {
    NAMES
        .iter()
        .flat_map(|n| {
            let n = n.as_bytes();
            [
                n.to_vec(),
                owner_key(n),
                counter_key(n),
                permits_key(n),
                limit_key(n),
            ]
        })
        .collect()
}

#[derive(Clone, Debug)]
pub enum Step {
    /// One SEM.* command.
    Sem(Vec<Bytes>),
    /// SEM.* commands inside MULTI/EXEC.
    Multi(Vec<Vec<Bytes>>),
    /// SEM.* commands from one Lua script, on the name passed as KEYS[1].
    Eval(Vec<Vec<Bytes>>),
    /// Another client's or an operator's command.
    Op(Vec<Bytes>),
    /// Fair grants with another client's deletions or a flush between them, pipelined: all
    /// within about one millisecond (tickets must still grow).
    Burst(Vec<Vec<Bytes>>),
    /// Time passes (ms).
    Sleep(u64),
    /// The main client's connection closes (CLIENT KILL from its successor): the module gives
    /// its BOUND permits back.
    Reconnect,
}

impl Step {
    /// The commands the step sends, in order.
    pub fn commands(&self) -> Vec<Vec<Bytes>> {
        match self {
            Step::Sem(args) | Step::Op(args) => vec![args.clone()],
            Step::Burst(cmds) => cmds.clone(),
            Step::Multi(cmds) => {
                let mut all = vec![cmd(&["MULTI"])];
                all.extend(cmds.iter().cloned());
                all.push(cmd(&["EXEC"]));
                all
            }
            Step::Eval(calls) => {
                let mut args = cmd(&["EVAL", EVAL_SCRIPT, "1"]);
                // KEYS[1]: the name of the first call on one semaphore, else a set's first.
                let key = calls
                    .iter()
                    .find(|c| !is_set(c))
                    .map(|c| c[1].clone())
                    .or_else(|| calls[0].get(2).cloned())
                    .unwrap_or_default();
                args.push(key);
                args.push(calls.len().to_string().into_bytes());
                for call in calls {
                    if is_set(call) {
                        args.push(format!("-{}", call.len()).into_bytes());
                        args.extend(call.iter().cloned());
                        continue;
                    }
                    let rest: Vec<&Bytes> = std::iter::once(&call[0]).chain(&call[2..]).collect();
                    args.push(rest.len().to_string().into_bytes());
                    args.extend(rest.into_iter().cloned());
                }
                vec![args]
            }
            Step::Sleep(_) => vec![],
            // The runner sends CLIENT KILL ID <the old connection> on the new one.
            Step::Reconnect => vec![],
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Step::Sem(_) => "sem",
            Step::Multi(_) => "multi",
            Step::Eval(_) => "eval",
            Step::Burst(_) => "burst",
            Step::Op(args) => match args[0].to_ascii_uppercase().as_slice() {
                b"DEL" => "op DEL",
                b"RENAME" => "op RENAME",
                b"SET" => "op SET",
                b"LPUSH" => "op LPUSH",
                b"HSET" => "op HSET",
                b"HDEL" => "op HDEL",
                b"ZADD" => "op ZADD",
                b"ZREM" => "op ZREM",
                b"PERSIST" => "op PERSIST",
                b"PEXPIRE" => "op PEXPIRE",
                b"INCRBY" => "op INCRBY",
                b"FLUSHDB" => "op FLUSHDB",
                b"EXPIRE" => "op EXPIRE",
                b"DEBUG" => "op DEBUG SET-ACTIVE-EXPIRE",
                _ => "op ?",
            },
            Step::Sleep(_) => "sleep",
            Step::Reconnect => "reconnect",
        }
    }

    /// Whether only the module may change keys in this step (SEM.* commands, a reconnection's
    /// give-backs, time passing).
    pub fn module_only(&self) -> bool {
        !matches!(self, Step::Op(_) | Step::Burst(_))
    }

    /// The other clients' commands the step sends.
    pub fn ops(&self) -> Vec<&Vec<Bytes>> {
        match self {
            Step::Op(args) => vec![args],
            Step::Burst(cmds) => cmds.iter().filter(|c| !is_sem(c)).collect(),
            _ => vec![],
        }
    }

    /// The step as redis-cli lines.
    pub fn describe(&self) -> String {
        match self {
            Step::Sleep(ms) => format!("(sleep {ms} ms)"),
            Step::Reconnect => {
                "(the main client reconnects: CLIENT KILL ID <old connection>)".to_string()
            }
            Step::Eval(calls) => {
                let calls: Vec<String> = calls.iter().map(|c| show_command(c)).collect();
                format!(
                    "EVAL <script running {}> (KEYS[1] = the name)\n    {}",
                    calls.len(),
                    calls.join("\n    ")
                )
            }
            other => other
                .commands()
                .iter()
                .map(|c| show_command(c))
                .collect::<Vec<_>>()
                .join("\n    "),
        }
    }
}

/// What the generator may look at: the keys as last read, and the server clock then.
pub struct Seen<'a> {
    pub keys: &'a Keyspace,
    pub now_ms: i64,
}

impl Seen<'_> {
    fn members(&self, key: &[u8]) -> Vec<Bytes> {
        match self.keys.get(key).map(|e| &e.value) {
            Some(Value::ZSet(z)) => z.iter().map(|(m, _)| m.clone()).collect(),
            _ => Vec::new(),
        }
    }
}

/// Whether `args` call a command on a set of semaphores.
/// Whether `args` is a SEM.* command.
pub fn is_sem(args: &[Bytes]) -> bool {
    args.first()
        .is_some_and(|c| c.len() > 4 && c[..4].eq_ignore_ascii_case(b"sem."))
}

pub fn is_set(args: &[Bytes]) -> bool {
    Cmd::from_name(&args[0]).is_some_and(|c| c.set_step().is_some())
}

fn b(s: &str) -> Bytes {
    s.as_bytes().to_vec()
}

/// One of `words`.
fn word(rng: &mut Rng, words: &[&str]) -> Bytes {
    b(words[rng.below(words.len())])
}

/// A command name in upper, lower or mixed case.
fn spell(rng: &mut Rng, word: &str) -> Bytes {
    match rng.below(6) {
        0 => word.to_ascii_lowercase().into_bytes(),
        1 => word
            .bytes()
            .enumerate()
            .map(|(i, c)| {
                if i % 2 == 0 {
                    c.to_ascii_lowercase()
                } else {
                    c
                }
            })
            .collect(),
        _ => b(word),
    }
}

/// Most steps use "a", which operators rarely touch; "b" and "{c}x" get most of the tampering.
fn sem_name(rng: &mut Rng) -> Bytes {
    b(rng.weighted(&[(5, NAMES[0]), (3, NAMES[1]), (2, NAMES[2])]))
}

fn op_name(rng: &mut Rng) -> Bytes {
    b(rng.weighted(&[(1, NAMES[0]), (3, NAMES[1]), (3, NAMES[2])]))
}

fn any_key(rng: &mut Rng) -> Bytes {
    let name = op_name(rng);
    match rng.below(5) {
        0 => name,
        1 => owner_key(&name),
        2 => counter_key(&name),
        3 => permits_key(&name),
        _ => limit_key(&name),
    }
}

fn identifier(rng: &mut Rng, seen: &Seen, name: &[u8]) -> Bytes {
    let known = seen.members(name);
    if !known.is_empty() && rng.percent(25) {
        return rng.pick(&known).clone();
    }
    rng.pick(&IDS).to_vec()
}

fn limit(rng: &mut Rng) -> Bytes {
    b(rng.weighted(&[
        (30, "1"),
        (30, "2"),
        (20, "3"),
        (20, "4"),
        (3, "01"),
        (3, "002"),
        (2, "007"),
        (1, "4294967295"),
    ]))
}

/// A lease of 5 ms to 400 ms mostly, in the spellings the rule allows.
fn lease(rng: &mut Rng) -> Bytes {
    let ms: i64 = match rng.below(100) {
        0 => 3_600_000,
        1 => 31_536_000_000,
        2..=4 => 1000,
        _ => rng.range(5, 400),
    };
    let whole = ms / 1000;
    let frac = ms % 1000;
    let whole_text = if rng.percent(10) {
        format!("00{whole}")
    } else {
        whole.to_string()
    };
    let text = if frac == 0 {
        match rng.below(3) {
            0 => format!("{whole_text}.0"),
            1 => format!("{whole_text}.000"),
            _ => whole_text,
        }
    } else {
        let digits = format!("{frac:03}");
        let trimmed = if rng.percent(50) {
            digits.trim_end_matches('0').to_string()
        } else {
            digits
        };
        format!("{whole_text}.{trimmed}")
    };
    text.into_bytes()
}

pub const BAD_LIMITS: [&str; 9] = [
    "0",
    "-1",
    "4294967296",
    "abc",
    "",
    "1.0",
    "+1",
    " 1",
    "99999999999999999999999",
];
pub const BAD_COUNTS: [&str; 6] = ["0", "-1", "", "abc", "4294967296", "1.0"];
pub const BAD_WAITS: [&str; 7] = ["-1", "", "soon", "1e3", "31536000.001", "0.0001", ".5"];
pub const BAD_LEASES: [&str; 12] = [
    "0",
    "1e3",
    "-5",
    "0.0001",
    ".5",
    "31536000.001",
    "0.000",
    "",
    "1.",
    "inf",
    "1.2.3",
    "999999999",
];

/// A `WAIT` value: short, since a direct call waits for real (never 0, no limit, there).
fn wait_value(rng: &mut Rng, direct: bool) -> Bytes {
    if !direct && rng.percent(25) {
        return word(rng, &["0", "0.000", "00"]);
    }
    let ms = rng.range(1, 150);
    format!("0.{ms:03}").into_bytes()
}

/// A well-formed SEM.* command; `direct`: sent on its own (not in MULTI/EXEC or a script).
fn sem_command(rng: &mut Rng, seen: &Seen, direct: bool) -> Vec<Bytes> {
    let name = sem_name(rng);
    // Mostly the kind the semaphore already has, so that grants and renewals are common; the
    // other kind now and then.
    let fair_now = !seen.members(&owner_key(&name)).is_empty();
    let plain_now = !fair_now && !seen.members(&name).is_empty();
    let (plain, fair) = match (plain_now, fair_now) {
        (true, _) => (40, 10),
        (_, true) => (10, 40),
        _ => (25, 25),
    };
    let which = rng.weighted(&[
        (plain, "SEM.ACQUIRE"),
        (fair, "SEM.ACQUIREFAIR"),
        (15, "SEM.REFRESH"),
        (14, "SEM.RELEASE"),
        (11, "SEM.GET"),
        (if direct { 3 } else { 6 }, "SEM.WAITEMPTY"),
        (14, "set"),
        (6, "SEM.LIMIT"),
    ]);
    if which == "set" {
        return set_command(rng, seen, direct);
    }
    if which == "SEM.LIMIT" {
        return limit_command(rng, seen, direct);
    }
    let mut args = vec![spell(rng, which), name.clone()];
    match which {
        "SEM.ACQUIRE" | "SEM.ACQUIREFAIR" => {
            args.push(limit(rng));
            args.push(lease(rng));
            let mut options: Vec<Vec<Bytes>> = Vec::new();
            if rng.percent(75) {
                options.push(vec![spell(rng, "ID"), identifier(rng, seen, &name)]);
            }
            if which == "SEM.ACQUIREFAIR" && rng.percent(50) {
                options.push(vec![spell(rng, "WITHTICKET")]);
            }
            if rng.percent(if direct { 8 } else { 20 }) {
                options.push(vec![spell(rng, "WAIT"), wait_value(rng, direct)]);
            }
            if rng.percent(20) {
                options.push(vec![spell(rng, "BOUND")]);
            }
            if rng.percent(20) {
                // Mostly within the limit; the rule refuses 0 and more than the limit.
                let limit = parse_limit(&args[2]).unwrap_or(1) as i64;
                let n = if rng.percent(90) {
                    rng.range(1, limit.min(4))
                } else {
                    rng.range(0, limit + 1)
                };
                options.push(vec![spell(rng, "COUNT"), n.to_string().into_bytes()]);
            }
            for i in (1..options.len()).rev() {
                let j = rng.below(i + 1);
                options.swap(i, j);
            }
            args.extend(options.into_iter().flatten());
        }
        "SEM.REFRESH" => {
            args.push(identifier(rng, seen, &name));
            args.push(lease(rng));
        }
        "SEM.RELEASE" => {
            args.push(identifier(rng, seen, &name));
            if rng.percent(15) {
                args.extend([
                    spell(rng, "COUNT"),
                    rng.range(1, 3).to_string().into_bytes(),
                ]);
            }
        }
        "SEM.WAITEMPTY" => args.push(empty_timeout(rng, seen, &name, direct)),
        _ => {
            if rng.percent(50) {
                args.push(spell(rng, "JSON"));
            }
        }
    }
    args
}

/// SEM.LIMIT: a read, a store (0 pauses the semaphore) or a clear. The stores are mostly
/// limits that let some grants through, and clears are as common, so that a pause ends soon.
fn limit_command(rng: &mut Rng, seen: &Seen, _direct: bool) -> Vec<Bytes> {
    let name = sem_name(rng);
    let mut args = vec![spell(rng, "SEM.LIMIT"), name.clone()];
    match rng.weighted(&[(30, "read"), (40, "store"), (30, "clear")]) {
        "read" => {}
        "store" => {
            // Now and then the limit stored already (no write, WATCH does not fire).
            let stored = match seen.keys.get(&limit_key(&name)).map(|e| &e.value) {
                Some(Value::Str(s)) if rng.percent(30) => Some(s.clone()),
                _ => None,
            };
            args.push(stored.unwrap_or_else(|| {
                b(rng.weighted(&[
                    (8, "0"),
                    (25, "1"),
                    (25, "2"),
                    (20, "3"),
                    (10, "5"),
                    (3, "00"),
                    (3, "002"),
                    (2, "4294967295"),
                ]))
            }));
        }
        _ => args.push(spell(rng, "CLEAR")),
    }
    args
}

/// A SEM.LIMIT broken in one way (or, by chance, still valid).
fn broken_limit_command(rng: &mut Rng, seen: &Seen, direct: bool) -> Vec<Bytes> {
    let mut args = limit_command(rng, seen, direct);
    match rng.below(6) {
        0 => {
            args.truncate(2);
            args.push(word(
                rng,
                &[
                    "-1",
                    "4294967296",
                    "abc",
                    "",
                    "1.0",
                    "+1",
                    " 1",
                    "-0",
                    "CLEARX",
                    "99999999999999999999999",
                ],
            ));
        }
        1 => {
            args.truncate(2);
            args.extend([b("2"), b("2")]);
        }
        2 => {
            args.truncate(2);
            args.extend([spell(rng, "CLEAR"), b("1")]);
        }
        3 => args[1] = Vec::new(),
        4 => args.truncate(1),
        _ => args.push(b("extra")),
    }
    args
}

/// A SEM.WAITEMPTY timeout: short, since a direct call waits for real (never 0 there); now
/// and then just past the last lease of the name, so that the wait sees it end.
fn empty_timeout(rng: &mut Rng, seen: &Seen, name: &[u8], direct: bool) -> Bytes {
    if !direct && rng.percent(25) {
        return word(rng, &["0", "0.000", "00"]);
    }
    let last = match seen.keys.get(name).map(|e| &e.value) {
        Some(Value::ZSet(z)) => z.highest_score().map(deadline_ms),
        _ => None,
    };
    if let Some(left) = last
        .map(|at| at.saturating_sub(seen.now_ms))
        .filter(|&l| (1..150).contains(&l))
    {
        if direct && rng.percent(60) {
            return format!("0.{:03}", left + rng.range(2, 20)).into_bytes();
        }
    }
    let ms = rng.range(1, if direct { 30 } else { 150 });
    format!("0.{ms:03}").into_bytes()
}

/// 1 to 3 of the names, distinct, in a random order.
fn set_names(rng: &mut Rng) -> Vec<Bytes> {
    let mut names: Vec<Bytes> = NAMES.iter().map(|n| b(n)).collect();
    for i in (1..names.len()).rev() {
        let j = rng.below(i + 1);
        names.swap(i, j);
    }
    names.truncate(rng.weighted(&[(2, 1), (5, 2), (3, 3)]));
    names
}

/// A well-formed SEM.ACQUIREALL, SEM.RELEASEALL or SEM.REFRESHALL on some of the names.
fn set_command(rng: &mut Rng, seen: &Seen, direct: bool) -> Vec<Bytes> {
    let names = set_names(rng);
    // Mostly the kind the semaphores already have.
    let fair_now = names
        .iter()
        .any(|n| !seen.members(&owner_key(n)).is_empty());
    let which = rng.weighted(&[
        (60, "SEM.ACQUIREALL"),
        (22, "SEM.RELEASEALL"),
        (18, "SEM.REFRESHALL"),
    ]);
    let mut args = vec![spell(rng, which), names.len().to_string().into_bytes()];
    let id = identifier(rng, seen, &names[0]);
    match which {
        "SEM.ACQUIREALL" => {
            for name in &names {
                let limit_text = limit(rng);
                let limit = parse_limit(&limit_text).unwrap_or(1) as i64;
                let count = rng.range(1, limit.min(3));
                args.extend([name.clone(), limit_text, count.to_string().into_bytes()]);
            }
            args.push(lease(rng));
            let fair = rng.percent(if fair_now { 80 } else { 40 });
            let mut options: Vec<Vec<Bytes>> = Vec::new();
            if rng.percent(75) {
                options.push(vec![spell(rng, "ID"), id]);
            }
            if fair {
                options.push(vec![spell(rng, "FAIR")]);
                if rng.percent(50) {
                    options.push(vec![spell(rng, "WITHTICKET")]);
                }
            }
            if rng.percent(if direct { 8 } else { 20 }) {
                options.push(vec![spell(rng, "WAIT"), wait_value(rng, direct)]);
            }
            if rng.percent(20) {
                options.push(vec![spell(rng, "BOUND")]);
            }
            for i in (1..options.len()).rev() {
                let j = rng.below(i + 1);
                options.swap(i, j);
            }
            args.extend(options.into_iter().flatten());
        }
        "SEM.RELEASEALL" => {
            args.extend(names);
            args.push(id);
        }
        _ => {
            args.extend(names);
            args.push(id);
            args.push(lease(rng));
        }
    }
    args
}

/// A set command broken in one way (or, by chance, still valid). Every name stays in the
/// model's universe, or the call names one twice (an error before any key is opened).
fn broken_set_command(rng: &mut Rng, seen: &Seen, direct: bool) -> Vec<Bytes> {
    let mut args = set_command(rng, seen, direct);
    let acquire = args[0].eq_ignore_ascii_case(b"SEM.ACQUIREALL");
    let n = args[1][0] - b'0';
    let last_name = 2 + (n as usize - 1) * if acquire { 3 } else { 1 };
    match rng.below(14) {
        0 => args[1] = word(rng, &["0", "65", "", "x", "-1", "1.0", "007", " 1"]),
        1 => args[1] = (n + 1).to_string().into_bytes(),
        2 if n > 1 => args[1] = (n - 1).to_string().into_bytes(),
        3 => {
            // A name given twice, or another's derived key.
            let first = args[2].clone();
            let other = match rng.below(5) {
                0 => first.clone(),
                1 => owner_key(&first),
                2 => counter_key(&first),
                3 => permits_key(&first),
                _ => limit_key(&first),
            };
            args[last_name] = other;
            if n == 1 {
                args[1] = b("2");
                let at = last_name + if acquire { 3 } else { 1 };
                let mut extra = vec![first];
                if acquire {
                    extra.extend([b("2"), b("1")]);
                }
                for (k, a) in extra.into_iter().enumerate() {
                    args.insert(at + k, a);
                }
            }
        }
        4 => args[2 + rng.below(n as usize) * if acquire { 3 } else { 1 }] = Vec::new(),
        5 if acquire => args[3] = word(rng, &BAD_LIMITS),
        6 if acquire => args[4] = word(rng, &BAD_COUNTS),
        7 if acquire => args[4] = b("5"),
        8 => {
            let keep = rng.range(1, args.len() as i64 - 1) as usize;
            args.truncate(keep);
        }
        9 => args.push(b("extra")),
        10 if acquire => args.push(word(rng, &["WITHTICKET", "FAIR", "BOUND", "NOWAIT", "ID"])),
        11 if acquire => args.extend([spell(rng, "WAIT"), word(rng, &BAD_WAITS)]),
        12 => {
            let at = args.len() - if which_refresh(&args) { 1 } else { 0 };
            if acquire {
                args[last_name + 3] = word(rng, &BAD_LEASES);
            } else if which_refresh(&args) {
                args[at] = word(rng, &BAD_LEASES);
            } else {
                args[at - 1] = Vec::new();
            }
        }
        _ => {
            if !acquire {
                let at = args.len() - if which_refresh(&args) { 2 } else { 1 };
                args[at] = Vec::new();
            }
        }
    }
    args
}

fn which_refresh(args: &[Bytes]) -> bool {
    args[0].eq_ignore_ascii_case(b"SEM.REFRESHALL")
}

/// A SEM.* command broken in one or two ways (or, by chance, still valid).
fn broken_sem_command(rng: &mut Rng, seen: &Seen, direct: bool) -> Vec<Bytes> {
    let mut args = sem_command(rng, seen, direct);
    if is_set(&args) {
        return broken_set_command(rng, seen, direct);
    }
    if args[0].eq_ignore_ascii_case(b"SEM.LIMIT") {
        return broken_limit_command(rng, seen, direct);
    }
    if args[0].eq_ignore_ascii_case(b"SEM.WAITEMPTY") {
        match rng.below(4) {
            0 => args[2] = word(rng, &BAD_WAITS),
            1 => args.truncate(2),
            2 => args.push(b("extra")),
            _ => args[1] = Vec::new(),
        }
        return args;
    }
    let acquire = args[0].to_ascii_uppercase().starts_with(b"SEM.ACQUIRE");
    let times = if rng.percent(25) { 2 } else { 1 };
    for _ in 0..times {
        match rng.below(17) {
            0 if acquire && args.len() > 2 => args[2] = word(rng, &BAD_LIMITS),
            1 if args.len() > 3 && (acquire || args.len() == 4) => args[3] = word(rng, &BAD_LEASES),
            2 if args.len() > 1 => args[1] = Vec::new(),
            3 => match args.iter().position(|a| a.eq_ignore_ascii_case(b"ID")) {
                Some(at) if at + 1 < args.len() => args[at + 1] = Vec::new(),
                _ if acquire => args.extend([b("ID"), Vec::new()]),
                _ if args.len() >= 3 => args[2] = Vec::new(),
                _ => {}
            },
            4 => args.push(spell(rng, "ID")),
            5 => args.extend([spell(rng, "ID"), rng.pick(&IDS).to_vec()]),
            6 => args.push(spell(rng, "WITHTICKET")),
            7 => args.push(word(rng, &["NOWAIT", "LIMIT", "ID2", "JSONX", "x"])),
            8 if args.len() >= 2 => {
                let keep = rng.range(1, args.len() as i64 - 1) as usize;
                args.truncate(keep);
            }
            9 => args.push(b("extra")),
            10 => args.push(spell(rng, "JSON")),
            11 => args.extend([spell(rng, "WAIT"), word(rng, &BAD_WAITS)]),
            12 => args.push(spell(rng, "WAIT")),
            13 => args.extend([spell(rng, "BOUND"), spell(rng, "BOUND")]),
            14 => args.extend([spell(rng, "COUNT"), word(rng, &BAD_COUNTS)]),
            15 => args.extend([spell(rng, "COUNT"), b("1"), spell(rng, "COUNT"), b("1")]),
            _ => {
                if acquire && args.len() > 5 {
                    // options in another order
                    let tail = args.split_off(4);
                    let mut tail: Vec<Bytes> = tail.into_iter().rev().collect();
                    args.append(&mut tail);
                }
            }
        }
    }
    args
}

fn sem_any(rng: &mut Rng, seen: &Seen, direct: bool) -> Vec<Bytes> {
    if rng.percent(20) {
        broken_sem_command(rng, seen, direct)
    } else {
        sem_command(rng, seen, direct)
    }
}

/// Foreign scores: the infinities, huge and negative numbers, fractions, seconds-like and
/// ms-like values, deadlines in the near future, tickets.
fn foreign_score(rng: &mut Rng, seen: &Seen) -> Bytes {
    match rng.below(14) {
        0 => b("+inf"),
        1 => b("-inf"),
        2 => b("1e300"),
        3 => b("-5"),
        4 => b("9223372036854775808"),
        5 => b("0.5"),
        6 => b("1.7e12"),
        7 | 8 => (seen.now_ms + rng.range(0, 2000)).to_string().into_bytes(),
        9 => rng.range(1, 6).to_string().into_bytes(),
        10 => b("9007199254740992"),
        11 => b("9007199254740994"),
        12 => b("2.5"),
        _ => (seen.now_ms / 1000 + 60).to_string().into_bytes(),
    }
}

pub const PERMITS_VALUES: [&str; 11] = [
    "2",
    "3",
    "1",
    "0",
    "5",
    "abc",
    "-1",
    "007",
    "",
    "99999999999999999999",
    "18446744073709551615",
];

pub const COUNTER_VALUES: [&str; 13] = [
    "abc",
    "-5",
    "9007199254740992",
    "9007199254740993",
    "18446744073709551616",
    "007",
    " 5",
    "1.5",
    "",
    "0",
    "3",
    "9007199254740991",
    "8999999999",
];

fn op_command(rng: &mut Rng, seen: &Seen) -> Vec<Bytes> {
    let name = op_name(rng);
    let set_key = |rng: &mut Rng| {
        if rng.percent(60) {
            name.clone()
        } else {
            owner_key(&name)
        }
    };
    match rng.weighted(&[
        (30, "ZADD"),
        (12, "ZREM"),
        (14, "DEL"),
        (8, "RENAME"),
        (3, "SET"),
        (3, "LPUSH/HSET"),
        (6, "PERSIST"),
        (14, "PEXPIRE"),
        (14, "COUNTER"),
        (2, "FLUSHDB"),
        (4, "ACTIVE-EXPIRE"),
        (8, "PERMITS"),
        (10, "LIMIT"),
    ]) {
        "ZADD" => {
            let key = if rng.percent(5) {
                counter_key(&name)
            } else {
                set_key(rng)
            };
            let members = seen.members(&key);
            let member = if !members.is_empty() && rng.percent(50) {
                rng.pick(&members).clone()
            } else {
                rng.pick(&IDS).to_vec()
            };
            vec![b("ZADD"), key, foreign_score(rng, seen), member]
        }
        "ZREM" => {
            let key = set_key(rng);
            let members = seen.members(&key);
            let member = if !members.is_empty() && rng.percent(80) {
                rng.pick(&members).clone()
            } else {
                rng.pick(&IDS).to_vec()
            };
            vec![b("ZREM"), key, member]
        }
        "DEL" => {
            // Often a key of the wrong type, which would otherwise stay for long.
            let retyped: Vec<&Bytes> = seen
                .keys
                .iter()
                .filter(|(k, e)| {
                    let want = if k.ends_with(b":counter") || k.ends_with(b":limit") {
                        "string"
                    } else if k.ends_with(b":permits") {
                        "hash"
                    } else {
                        "zset"
                    };
                    e.value.type_name() != want
                })
                .map(|(k, _)| k)
                .collect();
            let mut args = vec![b("DEL")];
            if !retyped.is_empty() && rng.percent(60) {
                args.push((*rng.pick(&retyped)).clone());
            }
            for _ in 0..rng.range(1, 3) - (args.len() as i64 - 1) {
                args.push(any_key(rng));
            }
            args
        }
        "RENAME" => {
            let existing: Vec<&Bytes> = seen.keys.keys().collect();
            let from = if !existing.is_empty() && rng.percent(85) {
                (*rng.pick(&existing)).clone()
            } else {
                any_key(rng)
            };
            let mut to = any_key(rng);
            while to == from {
                to = any_key(rng);
            }
            vec![b("RENAME"), from, to]
        }
        "SET" => vec![b("SET"), set_key(rng), b("x")],
        "LPUSH/HSET" => {
            if rng.percent(50) {
                vec![b("LPUSH"), any_key(rng), b("v")]
            } else {
                vec![b("HSET"), any_key(rng), b("f"), b("v")]
            }
        }
        "PERSIST" => vec![b("PERSIST"), any_key(rng)],
        "PEXPIRE" => {
            let ms = if rng.percent(70) {
                rng.range(5, 300)
            } else {
                rng.range(100_000, 1_000_000)
            };
            let key = if rng.percent(20) {
                counter_key(&name)
            } else {
                set_key(rng)
            };
            vec![b("PEXPIRE"), key, ms.to_string().into_bytes()]
        }
        "COUNTER" => {
            let key = counter_key(&name);
            if rng.percent(25) {
                vec![b("INCRBY"), key, rng.range(1, 3).to_string().into_bytes()]
            } else {
                vec![b("SET"), key, word(rng, &COUNTER_VALUES)]
            }
        }
        "FLUSHDB" => vec![b("FLUSHDB")],
        "LIMIT" => {
            // Another client writes <name>:limit: a limit, garbage, a deletion, an expiry.
            let key = limit_key(&name);
            match rng.weighted(&[(35, "SET"), (15, "garbage"), (25, "DEL"), (25, "EXPIRE")]) {
                "SET" => vec![b("SET"), key, word(rng, &["0", "1", "2", "3", "4", "01"])],
                "garbage" => vec![
                    b("SET"),
                    key,
                    word(rng, &["x", "-1", "4294967296", "1.5", "", " 3", "+2"]),
                ],
                "DEL" => vec![b("DEL"), key],
                _ if rng.percent(50) => {
                    vec![
                        b("PEXPIRE"),
                        key,
                        rng.range(5, 300).to_string().into_bytes(),
                    ]
                }
                _ => vec![
                    b("EXPIRE"),
                    key,
                    rng.range(1, 1000).to_string().into_bytes(),
                ],
            }
        }
        "PERMITS" => {
            // Another client writes <name>:permits: a holder's count, the extra total, or
            // garbage; or deletes a field.
            let key = permits_key(&name);
            let members = seen.members(&name);
            let field = match rng.below(3) {
                0 => Vec::new(),
                1 if !members.is_empty() => rng.pick(&members).clone(),
                _ => rng.pick(&IDS).to_vec(),
            };
            if rng.percent(25) {
                vec![b("HDEL"), key, field]
            } else {
                vec![b("HSET"), key, field, word(rng, &PERMITS_VALUES)]
            }
        }
        _ => vec![
            b("DEBUG"),
            b("SET-ACTIVE-EXPIRE"),
            b(if rng.percent(50) { "0" } else { "1" }),
        ],
    }
}

pub fn step(rng: &mut Rng, seen: &Seen) -> Step {
    match rng.weighted(&[
        (62, "sem"),
        (4, "multi"),
        (4, "eval"),
        (26, "op"),
        (4, "sleep"),
        (2, "reconnect"),
        (2, "burst"),
    ]) {
        "sem" => {
            let mut args = sem_any(rng, seen, true);
            // A direct WAIT must end: 0 (no limit) only as an invalid combination's victim.
            while wait_without_limit(&args) {
                args = sem_any(rng, seen, true);
            }
            Step::Sem(args)
        }
        "multi" => {
            let n = rng.range(1, 3);
            let mut cmds: Vec<Vec<Bytes>> = (0..n).map(|_| sem_any(rng, seen, false)).collect();
            // Queueing errors (Redis's arity check) abort the transaction: keep them rare.
            for c in cmds.iter_mut() {
                while matches!(interpret(c), Interp::RedisArity(_)) && !rng.percent(10) {
                    *c = sem_any(rng, seen, false);
                }
            }
            Step::Multi(cmds)
        }
        "eval" => {
            let name = if rng.percent(3) {
                Vec::new()
            } else {
                sem_name(rng)
            };
            let n = rng.range(1, 2);
            let calls = (0..n)
                .map(|_| loop {
                    let mut c = sem_any(rng, seen, false);
                    // A script cannot pass fewer arguments than Redis's arity check wants
                    // (that is a script error with its own text), nor leave out the name.
                    if c.len() < 2 {
                        continue;
                    }
                    if !is_set(&c) {
                        c[1] = name.clone();
                    }
                    if !matches!(interpret(&c), Interp::RedisArity(_)) {
                        break c;
                    }
                })
                .collect();
            Step::Eval(calls)
        }
        "op" => Step::Op(op_command(rng, seen)),
        "burst" => Step::Burst(burst(rng)),
        "reconnect" => Step::Reconnect,
        _ => Step::Sleep(match rng.below(10) {
            0..=1 => 0,
            2..=5 => rng.range(1, 10) as u64,
            _ => rng.range(10, 50) as u64,
        }),
    }
}

/// A fair grant with a ticket, the keys of its name (or its counter, or the database) deleted,
/// and another fair grant: of the same name or another.
fn burst(rng: &mut Rng) -> Vec<Vec<Bytes>> {
    let first = sem_name(rng);
    let second = if rng.percent(50) {
        first.clone()
    } else {
        sem_name(rng)
    };
    let grant = |name: &Bytes| {
        let mut args = vec![b("SEM.ACQUIREFAIR"), name.clone()];
        args.extend(["5", "1", "WITHTICKET"].map(b));
        args
    };
    let keys = |name: &Bytes, which: &[usize]| -> Vec<Bytes> {
        which
            .iter()
            .map(|&i| match i {
                0 => name.clone(),
                i => [name.as_slice(), DERIVED[i - 1]].concat(),
            })
            .collect()
    };
    let between = match rng.below(4) {
        0 => [vec![b("DEL")], keys(&first, &[0, 1, 2])].concat(),
        1 => [vec![b("DEL")], keys(&first, &[2])].concat(),
        2 => [vec![b("DEL")], keys(&first, &[0, 1, 2, 3, 4])].concat(),
        _ => vec![b("FLUSHDB")],
    };
    vec![grant(&first), between, grant(&second)]
}

/// Whether a direct call would wait without limit (`WAIT 0`, a SEM.WAITEMPTY timeout of 0) if
/// the semaphore is full (has a holder).
fn wait_without_limit(args: &[Bytes]) -> bool {
    matches!(
        interpret(args),
        Interp::Call(Call {
            op: Op::Acquire {
                wait_ms: Some(0),
                ..
            } | Op::WaitEmpty { wait_ms: 0 },
            ..
        }) | Interp::Set(SetCall {
            op: SetOp::Acquire {
                wait_ms: Some(0),
                ..
            },
            ..
        })
    )
}
