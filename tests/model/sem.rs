//! The model of the SEM.* commands: argument parsing (args.rs), error precedence (commands.rs),
//! the rules (semaphore.rs) and key expiry (store.rs), over the model's keyspace. Written from
//! the documented rules; every error is decided before the first change, as in the module.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;

use super::keyspace::{Bytes, Entry, Keyspace, Value, ZSet};
use super::wire::Reply;

pub const MAX_LIMIT: u64 = u32::MAX as u64;
/// `sem.max-lease` at its default: one year.
pub const MAX_LEASE_MS: u64 = 365 * 24 * 3600 * 1000;
pub const MAX_TICKET: u64 = 1 << 53;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Plain,
    Fair,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmd {
    Acquire,
    AcquireFair,
    Refresh,
    Release,
    Get,
    WaitEmpty,
    Limit,
    AcquireAll,
    ReleaseAll,
    RefreshAll,
}

impl Cmd {
    pub const ALL: [Cmd; 10] = [
        Cmd::Acquire,
        Cmd::AcquireFair,
        Cmd::Refresh,
        Cmd::Release,
        Cmd::Get,
        Cmd::WaitEmpty,
        Cmd::Limit,
        Cmd::AcquireAll,
        Cmd::ReleaseAll,
        Cmd::RefreshAll,
    ];

    pub fn lower(self) -> &'static str {
        match self {
            Cmd::Acquire => "sem.acquire",
            Cmd::AcquireFair => "sem.acquirefair",
            Cmd::Refresh => "sem.refresh",
            Cmd::Release => "sem.release",
            Cmd::Get => "sem.get",
            Cmd::WaitEmpty => "sem.waitempty",
            Cmd::Limit => "sem.limit",
            Cmd::AcquireAll => "sem.acquireall",
            Cmd::ReleaseAll => "sem.releaseall",
            Cmd::RefreshAll => "sem.refreshall",
        }
    }

    /// For a command on a set of semaphores, how far apart its names are (a name, limit and
    /// count each for SEM.ACQUIREALL).
    pub fn set_step(self) -> Option<usize> {
        match self {
            Cmd::AcquireAll => Some(3),
            Cmd::ReleaseAll | Cmd::RefreshAll => Some(1),
            _ => None,
        }
    }

    pub fn from_name(name: &[u8]) -> Option<Cmd> {
        Cmd::ALL
            .into_iter()
            .find(|c| c.lower().as_bytes().eq_ignore_ascii_case(name))
    }

    /// The arity Redis checks (negative in COMMAND INFO: at least this many arguments, the
    /// command name and the inserted keys included).
    fn redis_min_args(self) -> usize {
        match self {
            Cmd::Acquire | Cmd::AcquireFair | Cmd::Refresh => 4,
            Cmd::Release | Cmd::WaitEmpty => 3,
            Cmd::Get | Cmd::Limit => 2,
            Cmd::AcquireAll => 6,
            Cmd::ReleaseAll => 4,
            Cmd::RefreshAll => 5,
        }
    }
}

/// The key names the module's command filter inserts after the name, for every command.
pub const DERIVED: [&[u8]; 4] = [b":owner", b":counter", b":permits", b":limit"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SemErr {
    Syntax,
    Arity(Cmd),
    InvalidLimit,
    /// `SEM.LIMIT name n`: n is not 0..=4294967295 (nor CLEAR).
    InvalidStoredLimit,
    /// `<name>:limit` holds something other than 0..=4294967295.
    StoredLimitCorrupt,
    InvalidLease,
    InvalidWait,
    InvalidTimeout,
    InvalidNumsems,
    NamedTwice,
    InvalidCount,
    InvalidReleaseCount,
    BoundInScript,
    CountMismatch(u64),
    CountTooLarge(u64),
    PermitsCorrupt,
    EmptyName,
    EmptyIdentifier,
    WrongType,
    CounterNotInteger,
    CounterExhausted,
    InvalidTicket,
    KindMismatch(Kind),
}

impl SemErr {
    pub fn text(&self) -> String {
        match self {
            SemErr::Syntax => "ERR syntax error".into(),
            SemErr::Arity(cmd) => arity_text(*cmd),
            SemErr::InvalidLimit => "ERR limit must be an integer from 1 to 4294967295".into(),
            SemErr::InvalidStoredLimit => "ERR limit must be an integer from 0 (pause) to \
                                            4294967295, or CLEAR"
                .into(),
            SemErr::StoredLimitCorrupt => "ERR the semaphore's limit key does not hold an \
                                           integer from 0 to 4294967295"
                .into(),
            SemErr::InvalidLease => "ERR lease must be a number of seconds greater than 0 and \
                                     at most 31536000, with at most 3 decimals"
                .into(),
            SemErr::InvalidWait => "ERR WAIT must be a number of seconds from 0 (no limit) to \
                                    31536000, with at most 3 decimals"
                .into(),
            SemErr::InvalidTimeout => "ERR timeout must be a number of seconds from 0 (no \
                                       limit) to 31536000, with at most 3 decimals"
                .into(),
            SemErr::InvalidNumsems => "ERR numsems must be an integer from 1 to 64, followed by \
                                       that many semaphores"
                .into(),
            SemErr::NamedTwice => {
                "ERR a semaphore is named twice, or one name is another's \
                                   key (<name>:owner, <name>:counter, <name>:permits, <name>:limit)"
                    .into()
            }
            SemErr::InvalidCount => {
                "ERR COUNT must be an integer from 1 to the limit (at most 4294967295)".into()
            }
            SemErr::InvalidReleaseCount => {
                "ERR COUNT must be an integer from 1 to 4294967295".into()
            }
            SemErr::BoundInScript => "ERR BOUND cannot be used from a script or function: its \
                                      connection is not the client's"
                .into(),
            SemErr::CountMismatch(held) => {
                format!("ERR the holder holds {held} permits: renew with that COUNT, or none")
            }
            SemErr::CountTooLarge(held) => {
                format!("ERR COUNT is more than the {held} permits the holder holds")
            }
            SemErr::PermitsCorrupt => "ERR the semaphore's permits key holds a value that is \
                                       not a count of permits"
                .into(),
            SemErr::EmptyName => "ERR semaphore name must not be empty".into(),
            SemErr::EmptyIdentifier => "ERR identifier must not be empty".into(),
            SemErr::WrongType => {
                "WRONGTYPE Operation against a key holding the wrong kind of value".into()
            }
            SemErr::CounterNotInteger => "ERR the semaphore's counter key does not hold an \
                                          integer from 0 to 9007199254740992 (2^53)"
                .into(),
            SemErr::CounterExhausted => "ERR the semaphore's counter reached 2^53: no ticket \
                                         is left that a sorted-set score holds exactly"
                .into(),
            SemErr::InvalidTicket => "ERR the holder has no valid ticket in the semaphore's \
                                      owner set (a whole number from 1 to 2^53)"
                .into(),
            SemErr::KindMismatch(Kind::Fair) => "ERR the semaphore has live fair holders: use \
                                                 SEM.ACQUIREFAIR until they are gone"
                .into(),
            SemErr::KindMismatch(Kind::Plain) => "ERR the semaphore has live plain holders: \
                                                  use SEM.ACQUIRE until they are gone"
                .into(),
        }
    }

    /// A short label for the run's statistics.
    pub fn label(&self) -> &'static str {
        match self {
            SemErr::Syntax => "syntax",
            SemErr::Arity(_) => "arity (module)",
            SemErr::InvalidLimit => "limit",
            SemErr::InvalidStoredLimit => "stored limit",
            SemErr::StoredLimitCorrupt => "limit key corrupt",
            SemErr::InvalidLease => "lease",
            SemErr::InvalidWait => "wait",
            SemErr::InvalidTimeout => "timeout",
            SemErr::InvalidNumsems => "numsems",
            SemErr::NamedTwice => "named twice",
            SemErr::InvalidCount => "count",
            SemErr::InvalidReleaseCount => "release count",
            SemErr::BoundInScript => "BOUND in a script",
            SemErr::CountMismatch(_) => "count mismatch",
            SemErr::CountTooLarge(_) => "count too large",
            SemErr::PermitsCorrupt => "permits corrupt",
            SemErr::EmptyName => "empty name",
            SemErr::EmptyIdentifier => "empty identifier",
            SemErr::WrongType => "WRONGTYPE",
            SemErr::CounterNotInteger => "counter not an integer",
            SemErr::CounterExhausted => "counter exhausted",
            SemErr::InvalidTicket => "invalid ticket",
            SemErr::KindMismatch(Kind::Fair) => "fair holders live",
            SemErr::KindMismatch(Kind::Plain) => "plain holders live",
        }
    }
}

/// Whether the server names itself in its arity error for a call from a script (Redis does,
/// Valkey does not).
pub static SCRIPT_ARITY_NAMES_REDIS: AtomicBool = AtomicBool::new(true);

/// The server's arity error for a call from a script.
pub fn script_arity_text() -> &'static str {
    if SCRIPT_ARITY_NAMES_REDIS.load(Ordering::Relaxed) {
        "ERR Wrong number of args calling Redis command from script"
    } else {
        "ERR Wrong number of args calling command from script"
    }
}

/// Redis's own arity error, which the module's uses too.
pub fn arity_text(cmd: Cmd) -> String {
    format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.lower()
    )
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Acquire {
        kind: Kind,
        limit: u64,
        lease_ms: i64,
        /// `None`: the server makes a UUID.
        id: Option<Bytes>,
        with_ticket: bool,
        /// WAIT, in ms (0: no limit); no wait inside MULTI/EXEC or a script.
        wait_ms: Option<i64>,
        bound: bool,
        /// COUNT n: the permits asked for.
        count: Option<u64>,
    },
    Refresh {
        id: Bytes,
        lease_ms: i64,
    },
    Release {
        id: Bytes,
        count: Option<u64>,
    },
    Get {
        json: bool,
    },
    /// SEM.WAITEMPTY: `wait_ms` 0 is no limit.
    WaitEmpty {
        wait_ms: i64,
    },
    /// SEM.LIMIT: `None` reads the stored limit; `Some(Some(n))` stores n, `Some(None)` clears.
    Limit {
        change: Option<Option<u64>>,
    },
}

/// What a call on a set of semaphores does, once its arguments are read.
#[derive(Clone, Debug, PartialEq)]
pub enum SetOp {
    Acquire {
        /// Per name: the limit and the count.
        asks: Vec<(u64, u64)>,
        lease_ms: i64,
        id: Option<Bytes>,
        fair: bool,
        with_ticket: bool,
        wait_ms: Option<i64>,
        bound: bool,
    },
    Release {
        id: Bytes,
    },
    Refresh {
        id: Bytes,
        lease_ms: i64,
    },
}

/// SEM.ACQUIREALL, SEM.RELEASEALL or SEM.REFRESHALL on `names`, in the order named.
#[derive(Clone, Debug, PartialEq)]
pub struct SetCall {
    pub names: Vec<Bytes>,
    pub op: SetOp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: Bytes,
    pub op: Op,
}

/// What a SEM.* command line means before any key is looked at.
#[derive(Clone, Debug, PartialEq)]
pub enum Interp {
    /// Refused by Redis itself (too few arguments), before the module runs: inside MULTI this
    /// is a queueing error that aborts the transaction.
    RedisArity(Cmd),
    /// Refused by the server itself in a script where the filter inserts no keys (Valkey 9:
    /// see src/server/filter.rs), with the server's own message for scripts.
    ScriptArity(Cmd),
    /// Refused by the module's argument checks.
    Refused(SemErr),
    Call(Call),
    Set(SetCall),
}

fn digits_value(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u64, |acc, d| {
        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

pub fn parse_limit(arg: &[u8]) -> Option<u64> {
    digits_value(arg).filter(|v| (1..=MAX_LIMIT).contains(v))
}

/// `SEM.LIMIT name n`, and `<name>:limit` read back: as `limit`, and 0 too.
pub fn parse_stored_limit(arg: &[u8]) -> Option<u64> {
    digits_value(arg).filter(|v| *v <= MAX_LIMIT)
}

/// `digits[.d[d[d]]]` seconds in ms, saturating; `None` when malformed.
fn seconds_ms(arg: &[u8]) -> Option<u64> {
    let (whole, fraction) = match arg.iter().position(|&b| b == b'.') {
        Some(dot) => (&arg[..dot], Some(&arg[dot + 1..])),
        None => (arg, None),
    };
    let seconds = digits_value(whole)?;
    let millis = match fraction {
        None => 0,
        Some(f) if (1..=3).contains(&f.len()) => digits_value(f)? * [100, 10, 1][f.len() - 1],
        Some(_) => return None,
    };
    Some(seconds.saturating_mul(1000).saturating_add(millis))
}

pub fn parse_lease_ms(arg: &[u8]) -> Option<i64> {
    seconds_ms(arg)
        .filter(|ms| (1..=MAX_LEASE_MS).contains(ms))
        .map(|ms| ms as i64)
}

/// `WAIT seconds`: the lease rule, and 0 (no limit) allowed.
pub fn parse_wait_ms(arg: &[u8]) -> Option<i64> {
    seconds_ms(arg)
        .filter(|&ms| ms <= MAX_LEASE_MS)
        .map(|ms| ms as i64)
}

/// Redis integer syntax (no sign, no leading zero but "0"), 0 to 2^53.
pub fn parse_counter(value: &[u8]) -> Option<u64> {
    let canonical = value == b"0" || value.first().is_some_and(|d| (b'1'..=b'9').contains(d));
    digits_value(value).filter(|&v| canonical && v <= MAX_TICKET)
}

/// A field of `<name>:permits`: Redis's integer syntax; a holder's field from 2 to 4294967295
/// (the module writes none for one permit), the `""` total from 0 to 4294967295.
pub fn parse_permits(field: &[u8], value: &[u8]) -> Option<u64> {
    let canonical = value == b"0" || value.first().is_some_and(|d| (b'1'..=b'9').contains(d));
    let (min, max) = if field.is_empty() {
        (0, 4_294_967_295)
    } else {
        (2, 4_294_967_295)
    };
    digits_value(value).filter(|n| canonical && value.len() <= 20 && (min..=max).contains(n))
}

/// Whether calls run as sent, with no command filter inserting their keys (a standalone
/// server: see src/server/filter.rs): the module inserts them itself, after the server's
/// arity check of the short form.
pub static UNFILTERED: AtomicBool = AtomicBool::new(true);

/// What a call means when a script makes it.
pub fn interpret_in_script(args: &[Bytes]) -> Interp {
    if !UNFILTERED.load(Ordering::Relaxed) {
        return interpret(args);
    }
    let cmd = Cmd::from_name(&args[0]).expect("a SEM.* command");
    if args.len() < cmd.redis_min_args() {
        return Interp::ScriptArity(cmd);
    }
    match interpret(args) {
        Interp::RedisArity(cmd) => Interp::ScriptArity(cmd),
        other => other,
    }
}

pub fn interpret(args: &[Bytes]) -> Interp {
    let cmd = Cmd::from_name(&args[0]).expect("a SEM.* command");
    if let Some(step) = cmd.set_step() {
        return interpret_set(cmd, step, args);
    }
    let seen_by_redis = if args.len() >= 2 && !UNFILTERED.load(Ordering::Relaxed) {
        args.len() + DERIVED.len()
    } else {
        args.len()
    };
    if seen_by_redis < cmd.redis_min_args() {
        return Interp::RedisArity(cmd);
    }
    match parse_call(cmd, args) {
        Ok(call) => Interp::Call(call),
        Err(err) => Interp::Refused(err),
    }
}

/// `numsems`: one or two digits, from 1 to 64.
fn parse_numsems(arg: &[u8]) -> Option<usize> {
    if arg.is_empty() || arg.len() > 2 {
        return None;
    }
    digits_value(arg)
        .map(|n| n as usize)
        .filter(|n| (1..=64).contains(n))
}

/// A set command: the filter appends each name's three keys only when `numsems` is valid and
/// the arguments reach its last name; Redis's arity check sees them.
fn interpret_set(cmd: Cmd, step: usize, args: &[Bytes]) -> Interp {
    let n = args.get(1).and_then(|a| parse_numsems(a));
    let appended = n.filter(|n| 2 + (n - 1) * step < args.len());
    let inserted = match UNFILTERED.load(Ordering::Relaxed) {
        true => 0,
        false => appended.map_or(0, |n| n * DERIVED.len()),
    };
    let seen_by_redis = args.len() + inserted;
    if seen_by_redis < cmd.redis_min_args() {
        return Interp::RedisArity(cmd);
    }
    match parse_set(cmd, step, n, appended.is_some(), args) {
        Ok(set) => Interp::Set(set),
        Err(err) => Interp::Refused(err),
    }
}

/// Whether two names of one call would share a key.
fn clash(a: &[u8], b: &[u8]) -> bool {
    a == b
        || DERIVED
            .iter()
            .any(|s| a == [b, s].concat().as_slice() || b == [a, s].concat().as_slice())
}

fn parse_set(
    cmd: Cmd,
    step: usize,
    n: Option<usize>,
    appended: bool,
    args: &[Bytes],
) -> Result<SetCall, SemErr> {
    let n = n.ok_or(SemErr::InvalidNumsems)?;
    let positions: Vec<usize> = (0..n).map(|i| 2 + i * step).collect();
    // Without the appended keys the module finds no name where it looks for one.
    if !appended || positions[n - 1] + step > args.len() {
        return Err(SemErr::Arity(cmd));
    }
    let mut names: Vec<Bytes> = Vec::new();
    for &pos in &positions {
        let name = &args[pos];
        if name.is_empty() {
            return Err(SemErr::EmptyName);
        }
        if names.iter().any(|other| clash(other, name)) {
            return Err(SemErr::NamedTwice);
        }
        names.push(name.clone());
    }
    let rest = &args[positions[n - 1] + step..];
    let op = match cmd {
        Cmd::AcquireAll => {
            let mut asks = Vec::new();
            for &pos in &positions {
                let limit = parse_limit(&args[pos + 1]).ok_or(SemErr::InvalidLimit)?;
                let count = parse_limit(&args[pos + 2])
                    .filter(|&c| c <= limit)
                    .ok_or(SemErr::InvalidCount)?;
                asks.push((limit, count));
            }
            let [lease, options @ ..] = rest else {
                return Err(SemErr::Arity(cmd));
            };
            let lease_ms = parse_lease_ms(lease).ok_or(SemErr::InvalidLease)?;
            let (mut id, mut fair, mut with_ticket, mut bound) = (None, false, false, false);
            let mut wait_ms = None;
            let mut options = options.iter();
            while let Some(option) = options.next() {
                if option.eq_ignore_ascii_case(b"ID") && id.is_none() {
                    id = Some(identifier(options.next().ok_or(SemErr::Syntax)?)?);
                } else if option.eq_ignore_ascii_case(b"FAIR") && !fair {
                    fair = true;
                } else if option.eq_ignore_ascii_case(b"WITHTICKET") && !with_ticket {
                    with_ticket = true;
                } else if option.eq_ignore_ascii_case(b"BOUND") && !bound {
                    bound = true;
                } else if option.eq_ignore_ascii_case(b"WAIT") && wait_ms.is_none() {
                    let value = options.next().ok_or(SemErr::Syntax)?;
                    wait_ms = Some(parse_wait_ms(value).ok_or(SemErr::InvalidWait)?);
                } else {
                    return Err(SemErr::Syntax);
                }
            }
            if with_ticket && !fair {
                return Err(SemErr::Syntax);
            }
            SetOp::Acquire {
                asks,
                lease_ms,
                id,
                fair,
                with_ticket,
                wait_ms,
                bound,
            }
        }
        Cmd::ReleaseAll => {
            let [id] = rest else {
                return Err(SemErr::Arity(cmd));
            };
            SetOp::Release {
                id: identifier(id)?,
            }
        }
        _ => {
            let [id, lease] = rest else {
                return Err(SemErr::Arity(cmd));
            };
            let id = identifier(id)?;
            let lease_ms = parse_lease_ms(lease).ok_or(SemErr::InvalidLease)?;
            SetOp::Refresh { id, lease_ms }
        }
    };
    Ok(SetCall { names, op })
}

fn identifier(id: &[u8]) -> Result<Bytes, SemErr> {
    if id.is_empty() {
        Err(SemErr::EmptyIdentifier)
    } else {
        Ok(id.to_vec())
    }
}

fn parse_call(cmd: Cmd, args: &[Bytes]) -> Result<Call, SemErr> {
    let name = args[1].clone();
    if name.is_empty() {
        return Err(SemErr::EmptyName);
    }
    let rest = &args[2..];
    let op = match cmd {
        Cmd::Acquire | Cmd::AcquireFair => {
            let kind = if cmd == Cmd::Acquire {
                Kind::Plain
            } else {
                Kind::Fair
            };
            let [limit, lease, options @ ..] = rest else {
                return Err(SemErr::Arity(cmd));
            };
            let limit = parse_limit(limit).ok_or(SemErr::InvalidLimit)?;
            let lease_ms = parse_lease_ms(lease).ok_or(SemErr::InvalidLease)?;
            let mut id = None;
            let mut with_ticket = false;
            let mut wait_ms = None;
            let mut bound = false;
            let mut count = None;
            let mut i = 0;
            while i < options.len() {
                let option = &options[i];
                let value = options.get(i + 1).ok_or(SemErr::Syntax);
                if option.eq_ignore_ascii_case(b"ID") && id.is_none() {
                    id = Some(identifier(value?)?);
                    i += 2;
                } else if option.eq_ignore_ascii_case(b"WITHTICKET")
                    && kind == Kind::Fair
                    && !with_ticket
                {
                    with_ticket = true;
                    i += 1;
                } else if option.eq_ignore_ascii_case(b"WAIT") && wait_ms.is_none() {
                    wait_ms = Some(parse_wait_ms(value?).ok_or(SemErr::InvalidWait)?);
                    i += 2;
                } else if option.eq_ignore_ascii_case(b"BOUND") && !bound {
                    bound = true;
                    i += 1;
                } else if option.eq_ignore_ascii_case(b"COUNT") && count.is_none() {
                    let n = parse_limit(value?)
                        .filter(|&n| n <= limit)
                        .ok_or(SemErr::InvalidCount)?;
                    count = Some(n);
                    i += 2;
                } else {
                    return Err(SemErr::Syntax);
                }
            }
            Op::Acquire {
                kind,
                limit,
                lease_ms,
                id,
                with_ticket,
                wait_ms,
                bound,
                count,
            }
        }
        Cmd::Refresh => {
            let [id, lease] = rest else {
                return Err(SemErr::Arity(cmd));
            };
            let id = identifier(id)?;
            let lease_ms = parse_lease_ms(lease).ok_or(SemErr::InvalidLease)?;
            Op::Refresh { id, lease_ms }
        }
        Cmd::Release => {
            // The options are read before the identifier is checked.
            let [id, options @ ..] = rest else {
                return Err(SemErr::Arity(cmd));
            };
            let mut count = None;
            let mut options = options.iter();
            while let Some(option) = options.next() {
                if option.eq_ignore_ascii_case(b"COUNT") && count.is_none() {
                    let k = options.next().ok_or(SemErr::Syntax)?;
                    count = Some(parse_limit(k).ok_or(SemErr::InvalidReleaseCount)?);
                } else {
                    return Err(SemErr::Syntax);
                }
            }
            Op::Release {
                id: identifier(id)?,
                count,
            }
        }
        Cmd::Get => match rest {
            [] => Op::Get { json: false },
            [option] if option.eq_ignore_ascii_case(b"JSON") => Op::Get { json: true },
            _ => return Err(SemErr::Syntax),
        },
        Cmd::WaitEmpty => {
            let [seconds] = rest else {
                return Err(SemErr::Arity(cmd));
            };
            let wait_ms = parse_wait_ms(seconds).ok_or(SemErr::InvalidTimeout)?;
            Op::WaitEmpty { wait_ms }
        }
        Cmd::Limit => match rest {
            [] => Op::Limit { change: None },
            [arg] if arg.eq_ignore_ascii_case(b"CLEAR") => Op::Limit { change: Some(None) },
            [arg] => Op::Limit {
                change: Some(Some(
                    parse_stored_limit(arg).ok_or(SemErr::InvalidStoredLimit)?,
                )),
            },
            _ => return Err(SemErr::Arity(cmd)),
        },
        Cmd::AcquireAll | Cmd::ReleaseAll | Cmd::RefreshAll => unreachable!("a set command"),
    };
    Ok(Call { name, op })
}

/// The server's fencing floor (`INFO sem`, `sem_ticket_floor`): no fair ticket is below it.
/// Every fair grant moves it past its ticket; otherwise it changes only when the module loads,
/// the server loads data or it becomes a primary, which no step does.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Fencing {
    pub floor: u64,
    /// Fair grants whose ticket the floor lifted (for the run's statistics).
    pub lifted: u64,
}

/// The connection a BOUND permit is bound to: the model's main client (directly or in
/// MULTI/EXEC), or the fake client Lua scripts run on, which never disconnects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Client {
    Main,
    Script,
}

/// Everything a command can change.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct World {
    pub keys: Keyspace,
    pub fencing: Fencing,
    /// BOUND permits: (name, identifier) and the connection that holds them. A binding ends
    /// when its permit is removed by a writing command (released, lost, or pruned as expired),
    /// by a flush, or when its connection closes (the permit is then given back).
    pub bindings: BTreeMap<(Bytes, Bytes), Client>,
}

impl World {
    /// This world with other keys.
    pub fn with_keys(&self, keys: Keyspace) -> World {
        World {
            keys,
            fencing: self.fencing.clone(),
            bindings: self.bindings.clone(),
        }
    }
}

pub fn derived_key(name: &[u8], which: usize) -> Bytes {
    [name, DERIVED[which]].concat()
}

pub fn owner_key(name: &[u8]) -> Bytes {
    derived_key(name, 0)
}

pub fn counter_key(name: &[u8]) -> Bytes {
    derived_key(name, 1)
}

pub fn permits_key(name: &[u8]) -> Bytes {
    derived_key(name, 2)
}

pub fn limit_key(name: &[u8]) -> Bytes {
    derived_key(name, 3)
}

/// A deadline in whole ms, rounded up and saturating (scores that are no deadline).
pub fn deadline_ms(score: f64) -> i64 {
    score.ceil() as i64
}

pub fn ticket_from_score(score: f64) -> Option<u64> {
    (score >= 1.0 && score <= MAX_TICKET as f64 && score.fract() == 0.0).then_some(score as u64)
}

fn check_type(keys: &Keyspace, key: &[u8], want: &str) -> Result<(), SemErr> {
    match keys.get(key) {
        Some(entry) if entry.value.type_name() != want => Err(SemErr::WrongType),
        _ => Ok(()),
    }
}

fn read_counter(keys: &Keyspace, key: &[u8]) -> Result<Option<u64>, SemErr> {
    match keys.get(key).map(|e| &e.value) {
        None => Ok(None),
        Some(Value::Str(s)) => parse_counter(s).map(Some).ok_or(SemErr::CounterNotInteger),
        Some(_) => Err(SemErr::WrongType),
    }
}

/// `<name>:limit`, opened (as a string) only where it is read: an acquire that may make a new
/// grant, SEM.GET JSON, SEM.LIMIT.
fn read_stored_limit(keys: &Keyspace, name: &[u8]) -> Result<Option<u64>, SemErr> {
    match keys.get(&limit_key(name)).map(|e| &e.value) {
        None => Ok(None),
        Some(Value::Str(s)) => parse_stored_limit(s)
            .map(Some)
            .ok_or(SemErr::StoredLimitCorrupt),
        Some(_) => Err(SemErr::WrongType),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum DeadlineChange {
    None,
    Raised(i64),
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Put {
    Upsert,
    IfHeld,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum PutOutcome {
    Added,
    Updated,
    NotHeld,
}

enum Leftovers {
    None,
    All,
    Some(Vec<Bytes>),
}

/// What the next write does to `<name>:permits`.
enum Weights {
    Keep,
    /// No live holder is left: the key goes.
    Clear,
    /// These expired weighted holders lose their fields.
    Prune(Vec<Bytes>),
}

struct Survey {
    expired: Vec<Bytes>,
    live: u64,
    /// Permits held beyond one per live holder.
    extra: u64,
    kind: Option<Kind>,
    leftovers: Leftovers,
    weights: Weights,
}

impl Survey {
    fn in_use(&self) -> u64 {
        self.live.saturating_add(self.extra)
    }
}

fn is_live(score: f64, now: i64) -> bool {
    deadline_ms(score) > now
}

/// One semaphore's keys during a call; `finish` settles the expiry (store.rs) and writes them
/// back.
struct Sets {
    name: Bytes,
    holders: ZSet,
    holders_expire: Option<i64>,
    owners: ZSet,
    owners_expire: Option<i64>,
    /// `<name>:permits`: id -> permits (only beyond 1), "" -> the extra total.
    permits: BTreeMap<Bytes, Bytes>,
    permits_expire: Option<i64>,
    change: DeadlineChange,
    /// Every identifier the call removed (or tried to) from both sets: their bindings end.
    removed: Vec<Bytes>,
}

impl Sets {
    fn load(keys: &Keyspace, name: &[u8]) -> Sets {
        let zset = |key: &[u8]| match keys.get(key) {
            Some(Entry {
                value: Value::ZSet(z),
                expire,
            }) => (z.clone(), *expire),
            _ => (ZSet::default(), None),
        };
        let (holders, holders_expire) = zset(name);
        let (owners, owners_expire) = zset(&owner_key(name));
        let (permits, permits_expire) = match keys.get(&permits_key(name)) {
            Some(Entry {
                value: Value::Hash(h),
                expire,
            }) => (h.iter().cloned().collect(), *expire),
            _ => (BTreeMap::new(), None),
        };
        Sets {
            name: name.to_vec(),
            holders,
            holders_expire,
            owners,
            owners_expire,
            permits,
            permits_expire,
            change: DeadlineChange::None,
            removed: Vec::new(),
        }
    }

    fn permits_field(&self, field: &[u8]) -> Result<Option<u64>, SemErr> {
        match self.permits.get(field) {
            None => Ok(None),
            Some(v) => parse_permits(field, v)
                .map(Some)
                .ok_or(SemErr::PermitsCorrupt),
        }
    }

    /// The permits `id` holds: its field, 1 without one.
    fn weight(&self, id: &[u8]) -> Result<u64, SemErr> {
        Ok(self.permits_field(id)?.unwrap_or(1))
    }

    /// The keys at `now`, as sets rather than counts: the live and the expired holders; the
    /// owner entries left once the expired holders' go with them, those of a live holder and
    /// those of none. The recipe's keys are in step when as many entries are left as there are
    /// live holders (the rules trust that without a walk); otherwise the semaphore is fair when
    /// a live holder has an entry, and the entries of none go.
    fn survey(&self, now: i64) -> Result<Survey, SemErr> {
        let live: BTreeSet<&[u8]> = self
            .holders
            .iter()
            .filter(|(_, s)| is_live(*s, now))
            .map(|(m, _)| m.as_slice())
            .collect();
        let expired: Vec<Bytes> = self
            .holders
            .iter()
            .filter(|(_, s)| !is_live(*s, now))
            .map(|(m, _)| m.clone())
            .collect();
        let left: BTreeSet<&[u8]> = self
            .owners
            .iter()
            .map(|(m, _)| m.as_slice())
            .filter(|m| !expired.iter().any(|e| e == m))
            .collect();
        let of_none: Vec<Bytes> = left.difference(&live).map(|m| m.to_vec()).collect();
        let (kind, leftovers) = if self.owners.is_empty() {
            ((!live.is_empty()).then_some(Kind::Plain), Leftovers::None)
        } else if live.is_empty() {
            (None, Leftovers::All)
        } else if left.len() == live.len() {
            (Some(Kind::Fair), Leftovers::None)
        } else if left.is_disjoint(&live) {
            (Some(Kind::Plain), Leftovers::All)
        } else if of_none.is_empty() {
            (Some(Kind::Fair), Leftovers::None)
        } else {
            (Some(Kind::Fair), Leftovers::Some(of_none))
        };
        // The extra permits: the stored total less what the expired weighted holders held.
        let (extra, weights) = if self.permits.is_empty() {
            (0, Weights::Keep)
        } else if live.is_empty() {
            (0, Weights::Clear)
        } else {
            let mut lost = Vec::new();
            for id in &expired {
                let permits = self.weight(id)?;
                if permits > 1 {
                    lost.push((id.clone(), permits - 1));
                }
            }
            let stored = self.permits_field(b"")?.unwrap_or(0);
            let gone = lost.iter().fold(0u64, |sum, (_, n)| sum.saturating_add(*n));
            let extra = stored.saturating_sub(gone);
            let weights = if lost.is_empty() {
                Weights::Keep
            } else {
                Weights::Prune(lost.into_iter().map(|(id, _)| id).collect())
            };
            (extra, weights)
        };
        Ok(Survey {
            expired,
            live: live.len() as u64,
            extra,
            kind,
            leftovers,
            weights,
        })
    }

    /// Removes `ids` from both sets; how many were holders. A set that empties is deleted (a
    /// later add creates it again, without expiry).
    fn remove(&mut self, ids: &[Bytes]) -> usize {
        self.removed.extend(ids.iter().cloned());
        let removed = ids.iter().filter(|id| self.holders.remove(id)).count();
        for id in ids {
            self.owners.remove(id);
        }
        if self.holders.is_empty() {
            self.holders_expire = None;
        }
        if self.owners.is_empty() {
            self.owners_expire = None;
        }
        if removed > 0 {
            self.change = DeadlineChange::Unknown;
        }
        removed
    }

    fn clear_owners(&mut self) {
        self.owners = ZSet::default();
        self.owners_expire = None;
    }

    /// One write of `<name>:permits`: `set`'s field (deleted for 1 permit), `removed` fields
    /// gone, the extra total ("" deleted at 0). A key that empties is deleted.
    fn put_weights(&mut self, set: Option<(&[u8], u64)>, removed: &[Bytes], extra: u64) {
        let mut deletes: Vec<Bytes> = removed.to_vec();
        if let Some((id, permits)) = set {
            if permits > 1 {
                self.permits
                    .insert(id.to_vec(), permits.to_string().into_bytes());
            } else {
                deletes.push(id.to_vec());
            }
        }
        if extra > 0 {
            self.permits
                .insert(Vec::new(), extra.to_string().into_bytes());
        } else {
            deletes.push(Vec::new());
        }
        for field in deletes {
            self.permits.remove(&field);
        }
        if self.permits.is_empty() {
            self.permits_expire = None;
        }
    }

    fn clear_weights(&mut self) {
        self.permits.clear();
        self.permits_expire = None;
    }

    fn prune(&mut self, survey: &Survey) {
        self.remove(&survey.expired);
        match &survey.leftovers {
            Leftovers::None => {}
            Leftovers::All => self.clear_owners(),
            Leftovers::Some(ids) => {
                for id in ids {
                    self.owners.remove(id);
                }
                if self.owners.is_empty() {
                    self.owners_expire = None;
                }
            }
        }
        match &survey.weights {
            Weights::Keep => {}
            Weights::Clear => self.clear_weights(),
            Weights::Prune(ids) => self.put_weights(None, ids, survey.extra),
        }
    }

    fn put_holder(&mut self, id: &[u8], deadline: i64, put: Put) -> PutOutcome {
        let held = self.holders.contains(id);
        if !held && put == Put::IfHeld {
            return PutOutcome::NotHeld;
        }
        self.holders.insert(id, deadline as f64);
        if held {
            self.change = DeadlineChange::Unknown;
            PutOutcome::Updated
        } else {
            self.change = match self.change {
                DeadlineChange::None => DeadlineChange::Raised(deadline),
                DeadlineChange::Raised(d) => DeadlineChange::Raised(d.max(deadline)),
                DeadlineChange::Unknown => DeadlineChange::Unknown,
            };
            PutOutcome::Added
        }
    }

    fn put_owner(&mut self, id: &[u8], ticket: u64) {
        self.owners.insert(id, ticket as f64);
    }

    /// Settles the expiry (the sets and the permits expire at the latest deadline) and writes
    /// the keys back; returns the identifiers the call removed.
    fn finish(mut self, keys: &mut Keyspace) -> Vec<Bytes> {
        if self.change != DeadlineChange::None {
            const NO_EXPIRE: i64 = -1;
            let current = self.holders_expire.unwrap_or(NO_EXPIRE);
            let latest = match self.change {
                DeadlineChange::Raised(added) if current != NO_EXPIRE => Some(current.max(added)),
                _ => self.holders.highest_score().map(deadline_ms),
            };
            if let Some(latest) = latest {
                if !self.holders.is_empty() {
                    self.holders_expire = Some(latest);
                }
                if !self.owners.is_empty() {
                    self.owners_expire = Some(latest);
                }
                if !self.permits.is_empty() {
                    self.permits_expire = Some(latest);
                }
            }
        }
        let owner = owner_key(&self.name);
        let permits = permits_key(&self.name);
        let values = [
            (
                self.name.clone(),
                (!self.holders.is_empty()).then_some(Value::ZSet(self.holders)),
                self.holders_expire,
            ),
            (
                owner,
                (!self.owners.is_empty()).then_some(Value::ZSet(self.owners)),
                self.owners_expire,
            ),
            (
                permits,
                (!self.permits.is_empty()).then(|| Value::Hash(self.permits.into_iter().collect())),
                self.permits_expire,
            ),
        ];
        for (key, value, expire) in values {
            match value {
                None => {
                    keys.remove(&key);
                }
                Some(value) => {
                    keys.insert(key, Entry { value, expire });
                }
            }
        }
        self.removed
    }
}

/// Writes the counter in place: a new key has no expiry, an existing one keeps its own.
fn set_counter(keys: &mut Keyspace, key: Bytes, ticket: u64) {
    let expire = keys.get(&key).and_then(|e| e.expire);
    keys.insert(
        key,
        Entry {
            value: Value::Str(ticket.to_string().into_bytes()),
            expire,
        },
    );
}

/// The next one up from the counter, and at least the floor; without a counter, at least the
/// clock of the grant (`now` ms, in microseconds).
fn next_ticket(counter: Option<u64>, floor: u64, now: i64) -> Result<u64, SemErr> {
    let floor = match counter {
        Some(_) => floor,
        None => floor.max(u64::try_from(now).unwrap_or(0).saturating_mul(1000)),
    };
    let next = counter
        .unwrap_or(0)
        .checked_add(1)
        .ok_or(SemErr::CounterExhausted)?;
    let ticket = next.max(floor);
    if ticket > MAX_TICKET {
        return Err(SemErr::CounterExhausted);
    }
    Ok(ticket)
}

/// A fair grant at `now` handed out `ticket`: the node's floor moves past it, unless it is more
/// than a second (in microseconds) ahead of both the floor and the clock (a counter written by
/// hand); counts the grant when its ticket is the floor itself (the floor lifted the counter).
fn lifted(fencing: &mut Fencing, ticket: u64, now: i64) {
    if ticket == fencing.floor {
        fencing.lifted += 1;
    }
    let clock = u64::try_from(now).unwrap_or(0).saturating_mul(1000);
    let reach = fencing.floor.max(clock).saturating_add(1_000_000);
    if ticket >= fencing.floor && ticket < reach {
        fencing.floor = ticket + 1;
    }
}

/// What a call did, for the run's statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effect {
    Granted,
    Renewed,
    Full,
    Counted,
    Described,
    Refreshed,
    Released,
    /// REFRESH or RELEASE of a holder whose lease had run out.
    Lost,
    /// REFRESH or RELEASE of an identifier that held nothing.
    Absent,
    /// SEM.WAITEMPTY: the semaphore had no live holder, or had one.
    Empty,
    NotEmpty,
    /// SEM.ACQUIREALL granted (some of it may renew), or refused.
    SetGranted,
    SetFull,
    /// SEM.RELEASEALL or SEM.REFRESHALL, by how many semaphores the identifier held.
    SetNoneHeld,
    SetSomeHeld,
    SetAllHeld,
    /// SEM.LIMIT: read, stored or cleared (a change), or nothing to change.
    LimitRead,
    LimitChanged,
    LimitKept,
}

/// Runs `call` at module time `now` on `world`, from `client`. An error changes nothing.
/// `new_id` stands for the identifier the server makes when the call names none.
pub fn execute(
    world: &mut World,
    call: &Call,
    now: i64,
    new_id: &[u8],
    client: Client,
) -> Result<(Reply, Effect), SemErr> {
    if let Op::Acquire { bound: true, .. } = call.op {
        if client == Client::Script {
            return Err(SemErr::BoundInScript);
        }
    }
    // A write that finds the holder set missing (its key expired, or another client deleted
    // it) ends every binding of the semaphore: their permits are gone.
    let holders_gone = !matches!(call.op, Op::Get { .. } | Op::WaitEmpty { .. })
        && !world.keys.contains_key(&call.name);
    let mut removed = Vec::new();
    let (reply, effect, bind) = rules(world, call, now, new_id, &mut removed)?;
    // The permits this call removed are no longer bound; one it granted with BOUND is (even
    // when the same call pruned that identifier's expired permit first); a new permit granted
    // without BOUND ends an old binding of its identifier.
    // SEM.LIMIT looks at the bindings only when it writes.
    let wrote = !matches!(call.op, Op::Limit { .. }) || effect == Effect::LimitChanged;
    if holders_gone && wrote {
        world.bindings.retain(|(name, _), _| *name != call.name);
    }
    for id in removed {
        world.bindings.remove(&(call.name.clone(), id));
    }
    if let Some(id) = bind {
        world.bindings.insert((call.name.clone(), id), client);
    } else if let (Effect::Granted, Op::Acquire { id, .. }) = (effect, &call.op) {
        let id = id.as_deref().unwrap_or(new_id).to_vec();
        world.bindings.remove(&(call.name.clone(), id));
    }
    Ok((reply, effect))
}

/// What a refresh or release found `id` to be, given it is no live holder.
fn lost_or_absent(survey: &Survey, id: &[u8]) -> Effect {
    if survey.expired.iter().any(|e| e == id) {
        Effect::Lost
    } else {
        Effect::Absent
    }
}

/// The rules of one call; `removed` receives the identifiers it removed, and the result names
/// the identifier to bind (a BOUND grant).
fn rules(
    world: &mut World,
    call: &Call,
    now: i64,
    new_id: &[u8],
    removed: &mut Vec<Bytes>,
) -> Result<(Reply, Effect, Option<Bytes>), SemErr> {
    let name = &call.name;
    let counter = counter_key(name);
    let keys = &mut world.keys;
    // Opened in this order; the counter only where it is read (a fair grant, SEM.GET JSON).
    check_type(keys, name, "zset")?;
    check_type(keys, &owner_key(name), "zset")?;
    check_type(keys, &permits_key(name), "hash")?;
    // SEM.LIMIT surveys nothing: it reads the stored limit and writes its key (in place: an
    // expiry another client set stays).
    if let Op::Limit { change } = &call.op {
        let stored = read_stored_limit(keys, name)?;
        let Some(change) = change else {
            let reply = stored.map_or(Reply::Nil, |n| Reply::Int(n as i64));
            return Ok((reply, Effect::LimitRead, None));
        };
        let reply = match change {
            Some(_) => Reply::Status("OK".into()),
            None => Reply::Int(i64::from(stored.is_some())),
        };
        if stored == *change {
            return Ok((reply, Effect::LimitKept, None));
        }
        let key = limit_key(name);
        match change {
            Some(n) => {
                let expire = keys.get(&key).and_then(|e| e.expire);
                let value = Value::Str(n.to_string().into_bytes());
                keys.insert(key, Entry { value, expire });
            }
            None => {
                keys.remove(&key);
            }
        }
        return Ok((reply, Effect::LimitChanged, None));
    }
    let mut sets = Sets::load(keys, name);
    let survey = sets.survey(now)?;
    match &call.op {
        Op::Acquire {
            kind,
            limit,
            lease_ms,
            id,
            with_ticket,
            bound,
            count,
            ..
        } => {
            if let Some(held) = survey.kind.filter(|held| held != kind) {
                return Err(SemErr::KindMismatch(held));
            }
            let given = id.is_some();
            let id: &[u8] = id.as_deref().unwrap_or(new_id);
            let reply = |ticket: Option<u64>| {
                let id = if given {
                    Reply::Bulk(id.to_vec())
                } else {
                    Reply::NewId(id.to_vec())
                };
                match ticket {
                    Some(t) if *with_ticket => Reply::Array(vec![id, Reply::Int(t as i64)]),
                    _ => id,
                }
            };
            let bind = bound.then(|| id.to_vec());
            let permits = count.unwrap_or(1);
            // An operator's stored limit replaces the caller's (read before any renewal).
            let limit = read_stored_limit(keys, name)?.unwrap_or(*limit);
            let room = survey.in_use().saturating_add(permits) <= limit;
            let deadline = now + lease_ms;
            let live_holder = sets.holders.score(id).is_some_and(|s| is_live(s, now));
            let floor = world.fencing.floor;
            // A live holder renews: its permits must match a COUNT, and a fair one keeps a
            // valid ticket. Nothing changes before these checks.
            let renew = |sets: &mut Sets| -> Result<Option<u64>, SemErr> {
                if let Some(count) = count {
                    let held = sets.weight(id)?;
                    if *count != held {
                        return Err(SemErr::CountMismatch(held));
                    }
                }
                let ticket = match kind {
                    Kind::Plain => None,
                    Kind::Fair => Some(
                        sets.owners
                            .score(id)
                            .and_then(ticket_from_score)
                            .ok_or(SemErr::InvalidTicket)?,
                    ),
                };
                sets.prune(&survey);
                sets.put_holder(id, deadline, Put::IfHeld);
                Ok(ticket)
            };
            if count.is_none() && *kind == Kind::Plain {
                sets.prune(&survey);
                let put = if room { Put::Upsert } else { Put::IfHeld };
                let outcome = sets.put_holder(id, deadline, put);
                removed.extend(sets.finish(keys));
                return Ok(match outcome {
                    PutOutcome::NotHeld => (Reply::Nil, Effect::Full, None),
                    PutOutcome::Added => (reply(None), Effect::Granted, bind),
                    PutOutcome::Updated => (reply(None), Effect::Renewed, bind),
                });
            }
            if count.is_none() && *kind == Kind::Fair && room {
                let ticket = next_ticket(read_counter(keys, &counter)?, floor, now)?;
                let expired = survey.expired.iter().any(|e| e == id);
                if !expired && sets.holders.contains(id) {
                    let ticket = renew(&mut sets)?;
                    removed.extend(sets.finish(keys));
                    return Ok((reply(ticket), Effect::Renewed, bind));
                }
                sets.prune(&survey);
                sets.put_holder(id, deadline, Put::Upsert);
                sets.put_owner(id, ticket);
                removed.extend(sets.finish(keys));
                set_counter(keys, counter, ticket);
                lifted(&mut world.fencing, ticket, now);
                return Ok((reply(Some(ticket)), Effect::Granted, bind));
            }
            if live_holder {
                let ticket = renew(&mut sets)?;
                removed.extend(sets.finish(keys));
                return Ok((reply(ticket), Effect::Renewed, bind));
            }
            if !room {
                sets.prune(&survey);
                removed.extend(sets.finish(keys));
                return Ok((Reply::Nil, Effect::Full, None));
            }
            let ticket = match kind {
                Kind::Fair => Some(next_ticket(read_counter(keys, &counter)?, floor, now)?),
                Kind::Plain => None,
            };
            sets.prune(&survey);
            sets.put_holder(id, deadline, Put::Upsert);
            if let Some(ticket) = ticket {
                sets.put_owner(id, ticket);
            }
            if permits > 1 {
                sets.put_weights(Some((id, permits)), &[], survey.extra + (permits - 1));
            }
            removed.extend(sets.finish(keys));
            if let Some(ticket) = ticket {
                set_counter(keys, counter, ticket);
                lifted(&mut world.fencing, ticket, now);
            }
            Ok((reply(ticket), Effect::Granted, bind))
        }
        Op::Refresh { id, lease_ms } => {
            sets.prune(&survey);
            let refreshed = sets.put_holder(id, now + lease_ms, Put::IfHeld) == PutOutcome::Updated;
            if !refreshed {
                sets.remove(std::slice::from_ref(id));
            }
            removed.extend(sets.finish(keys));
            Ok(if refreshed {
                (Reply::Int(1), Effect::Refreshed, None)
            } else {
                (Reply::Int(0), lost_or_absent(&survey, id), None)
            })
        }
        Op::Release { id, count } => {
            let weighted = !sets.permits.is_empty();
            if count.is_none() && !weighted {
                sets.prune(&survey);
                let released = sets.remove(std::slice::from_ref(id)) == 1;
                removed.extend(sets.finish(keys));
                return Ok(if released {
                    (Reply::Int(1), Effect::Released, None)
                } else {
                    (Reply::Int(0), lost_or_absent(&survey, id), None)
                });
            }
            if !sets.holders.score(id).is_some_and(|s| is_live(s, now)) {
                sets.prune(&survey);
                sets.remove(std::slice::from_ref(id));
                removed.extend(sets.finish(keys));
                return Ok((Reply::Int(0), lost_or_absent(&survey, id), None));
            }
            let held = sets.weight(id)?;
            let giving = count.unwrap_or(held);
            if giving > held {
                return Err(SemErr::CountTooLarge(held));
            }
            sets.prune(&survey);
            // (A foreign field of "0" would make this `0 - 1`: the module's rule has the same
            // subtraction.)
            let extra = survey
                .extra
                .saturating_sub(giving.min(held.wrapping_sub(1)));
            if giving == held {
                sets.remove(std::slice::from_ref(id));
                if held > 1 {
                    sets.put_weights(None, std::slice::from_ref(id), extra);
                }
            } else {
                sets.put_weights(Some((id, held - giving)), &[], extra);
            }
            removed.extend(sets.finish(keys));
            Ok((Reply::Int(1), Effect::Released, None))
        }
        Op::Get { json: false } => Ok((Reply::Int(survey.in_use() as i64), Effect::Counted, None)),
        // The answer at this instant (a direct call that finds a holder waits: predict.rs).
        Op::WaitEmpty { .. } if survey.in_use() == 0 => Ok((Reply::Int(1), Effect::Empty, None)),
        Op::WaitEmpty { .. } => Ok((Reply::Int(0), Effect::NotEmpty, None)),
        Op::Limit { .. } => unreachable!("answered above"),
        Op::Get { json: true } => {
            let fair = survey.kind == Some(Kind::Fair);
            let counter = read_counter(keys, &counter)?;
            let mut holders = Vec::new();
            let mut listed: Vec<&[u8]> = Vec::new();
            if fair {
                for (id, score) in sets.owners.iter() {
                    let Some(deadline) =
                        sets.holders.score(id).map(deadline_ms).filter(|&d| d > now)
                    else {
                        continue;
                    };
                    let ticket = ticket_from_score(*score).ok_or(SemErr::InvalidTicket)?;
                    listed.push(id);
                    holders.push(json!({
                        "id": String::from_utf8_lossy(id),
                        "ms_left": deadline - now,
                        "ticket": ticket,
                        "permits": sets.weight(id)?,
                    }));
                }
            }
            for (id, score) in sets.holders.iter() {
                let deadline = deadline_ms(*score);
                if deadline > now && !listed.contains(&id.as_slice()) {
                    holders.push(json!({
                        "id": String::from_utf8_lossy(id),
                        "ms_left": deadline.saturating_sub(now),
                        "ticket": null,
                        "permits": sets.weight(id)?,
                    }));
                }
            }
            // Read after the holders, as the module's snapshot.
            let stored_limit = read_stored_limit(keys, name)?;
            let doc = json!({
                "name": String::from_utf8_lossy(name),
                "fair": fair,
                "counter": counter,
                "in_use": survey.in_use(),
                "holders": holders,
                // Nobody waits while this model's single client runs a command.
                "stored_limit": stored_limit,
                "limit_in_force": stored_limit.is_some(),
                "waiters": 0,
                "longest_wait_ms": null,
                "waiter_ages_ms": [],
                "waiting_for_empty": 0,
            });
            Ok((Reply::Json(doc), Effect::Described, None))
        }
    }
}

/// Runs a call on a set of semaphores at module time `now`. Every key is opened (a wrong type
/// anywhere is the error) before the first change; an acquire surveys every semaphore first
/// and changes nothing unless each would grant, then grants each as a single acquire with
/// COUNT would. An error changes nothing.
pub fn execute_set(
    world: &mut World,
    set: &SetCall,
    now: i64,
    new_id: &[u8],
    client: Client,
) -> Result<(Reply, Effect), SemErr> {
    if let SetOp::Acquire { bound: true, .. } = set.op {
        if client == Client::Script {
            return Err(SemErr::BoundInScript);
        }
    }
    for name in &set.names {
        check_type(&world.keys, name, "zset")?;
        check_type(&world.keys, &owner_key(name), "zset")?;
        check_type(&world.keys, &permits_key(name), "hash")?;
    }
    let calls: Vec<Call> = match &set.op {
        SetOp::Acquire {
            asks,
            lease_ms,
            id,
            fair,
            bound,
            ..
        } => set
            .names
            .iter()
            .zip(asks)
            .map(|(name, &(limit, count))| Call {
                name: name.clone(),
                op: Op::Acquire {
                    kind: if *fair { Kind::Fair } else { Kind::Plain },
                    limit,
                    lease_ms: *lease_ms,
                    id: id.clone(),
                    // Asked for every grant, so that its ticket is known.
                    with_ticket: true,
                    wait_ms: None,
                    bound: *bound,
                    count: Some(count),
                },
            })
            .collect(),
        SetOp::Release { id } => set
            .names
            .iter()
            .map(|name| Call {
                name: name.clone(),
                op: Op::Release {
                    id: id.clone(),
                    count: None,
                },
            })
            .collect(),
        SetOp::Refresh { id, lease_ms } => set
            .names
            .iter()
            .map(|name| Call {
                name: name.clone(),
                op: Op::Refresh {
                    id: id.clone(),
                    lease_ms: *lease_ms,
                },
            })
            .collect(),
    };
    if let SetOp::Acquire { .. } = set.op {
        // The survey: each semaphore alone, as if it were the only one; its error is the
        // call's, even after another's refusal.
        let mut all = true;
        for call in &calls {
            let mut probe = world.clone();
            let (reply, _) = execute(&mut probe, call, now, new_id, client)?;
            all &= reply != Reply::Nil;
        }
        if !all {
            return Ok((Reply::Nil, Effect::SetFull));
        }
    }
    let mut after = world.clone();
    let mut replies = Vec::new();
    for call in &calls {
        replies.push(execute(&mut after, call, now, new_id, client)?.0);
    }
    *world = after;
    Ok(match &set.op {
        SetOp::Acquire {
            id, with_ticket, ..
        } => {
            let id = match id {
                Some(id) => Reply::Bulk(id.clone()),
                None => Reply::NewId(new_id.to_vec()),
            };
            let tickets: Vec<Reply> = replies
                .into_iter()
                .map(|r| match r {
                    Reply::Array(items) => items[1].clone(),
                    _ => Reply::Int(0),
                })
                .collect();
            let reply = if *with_ticket {
                Reply::Array(vec![id, Reply::Array(tickets)])
            } else {
                id
            };
            (reply, Effect::SetGranted)
        }
        _ => {
            let held = replies.iter().filter(|r| **r == Reply::Int(1)).count();
            let effect = match held {
                0 => Effect::SetNoneHeld,
                n if n == set.names.len() => Effect::SetAllHeld,
                _ => Effect::SetSomeHeld,
            };
            (Reply::Int(held as i64), effect)
        }
    })
}
