//! The keys of the model: a small Redis keyspace (sorted sets, strings, lists, hashes, each with
//! an optional absolute expiry), read back from the server in one atomic script per step.

use std::collections::BTreeMap;
use std::fmt;

use redis::Value as Resp;

pub type Bytes = Vec<u8>;

/// Bytes as text for messages: UTF-8 shown as is, other bytes escaped.
pub fn show(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// A score as Redis would print it, shortened.
pub fn score_text(score: f64) -> String {
    if score.fract() == 0.0 && score.abs() < 1e16 {
        format!("{}", score as i64)
    } else {
        format!("{score:e}")
    }
}

/// A sorted set: members with their scores, in Redis's order (score, then member bytes).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ZSet(Vec<(Bytes, f64)>);

impl ZSet {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &(Bytes, f64)> {
        self.0.iter()
    }

    pub fn score(&self, member: &[u8]) -> Option<f64> {
        self.0.iter().find(|(m, _)| m == member).map(|(_, s)| *s)
    }

    pub fn contains(&self, member: &[u8]) -> bool {
        self.score(member).is_some()
    }

    /// Adds `member` or moves its score; true when it was added.
    pub fn insert(&mut self, member: &[u8], score: f64) -> bool {
        let added = !self.remove(member);
        let at = self
            .0
            .iter()
            .position(|(m, s)| (*s, m.as_slice()) > (score, member))
            .unwrap_or(self.0.len());
        self.0.insert(at, (member.to_vec(), score));
        added
    }

    /// True when `member` was there.
    pub fn remove(&mut self, member: &[u8]) -> bool {
        match self.0.iter().position(|(m, _)| m == member) {
            Some(at) => {
                self.0.remove(at);
                true
            }
            None => false,
        }
    }

    pub fn highest_score(&self) -> Option<f64> {
        self.0.last().map(|(_, s)| *s)
    }

    /// Replaces member `from` by `to`, keeping its score.
    pub fn rename_member(&mut self, from: &[u8], to: &[u8]) {
        if let Some(score) = self.score(from) {
            self.remove(from);
            self.insert(to, score);
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    ZSet(ZSet),
    Str(Bytes),
    List(Vec<Bytes>),
    /// Fields sorted by name (HGETALL's order is not part of what is compared).
    Hash(Vec<(Bytes, Bytes)>),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::ZSet(_) => "zset",
            Value::Str(_) => "string",
            Value::List(_) => "list",
            Value::Hash(_) => "hash",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub value: Value,
    /// Absolute expiry in Unix ms (PEXPIRETIME), `None` without one.
    pub expire: Option<i64>,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Value::ZSet(z) => {
                write!(f, "zset{{")?;
                for (i, (m, s)) in z.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{}: {}", show(m), score_text(*s))?;
                }
                write!(f, "}}")?;
            }
            Value::Str(s) => write!(f, "string {:?}", show(s))?,
            Value::List(l) => write!(
                f,
                "list {:?}",
                l.iter().map(|x| show(x)).collect::<Vec<_>>()
            )?,
            Value::Hash(h) => write!(
                f,
                "hash {:?}",
                h.iter()
                    .map(|(k, v)| (show(k), show(v)))
                    .collect::<Vec<_>>()
            )?,
        }
        match self.expire {
            Some(at) => write!(f, " @{at}"),
            None => Ok(()),
        }
    }
}

pub type Keyspace = BTreeMap<Bytes, Entry>;

/// `keys` as a command running at `now` sees them: a key whose expiry passed (`now > expire`)
/// is gone.
pub fn logical_view(keys: &Keyspace, now: i64) -> Keyspace {
    keys.iter()
        .filter(|(_, e)| e.expire.is_none_or(|at| now <= at))
        .map(|(k, e)| (k.clone(), e.clone()))
        .collect()
}

pub fn show_keys(keys: &Keyspace) -> String {
    if keys.is_empty() {
        return "  (no keys)\n".into();
    }
    keys.iter()
        .map(|(k, e)| format!("  {} = {e}\n", show(k)))
        .collect()
}

/// What the dump script read, at one instant of the server clock.
#[derive(Clone, Debug)]
pub struct Dump {
    pub keys: Keyspace,
    pub encodings: BTreeMap<Bytes, String>,
    /// TIME inside the script: at or after the instant the script's reads expired keys by.
    pub time_ms: i64,
    /// Violations of the structural invariants seen while reading (empty keys, DBSIZE, ...).
    pub problems: Vec<String>,
    /// Keys whose expiry is past 2^53 (a Lua number cannot hold it exactly): it must be read
    /// again with PEXPIRETIME outside the script ([`Dump::set_big_expiry`]).
    pub big_expiries: Vec<Bytes>,
}

impl Dump {
    /// Sets an expiry the script could not read exactly, from PEXPIRETIME's `reply`.
    pub fn set_big_expiry(&mut self, key: &[u8], reply: &Resp) -> Result<(), String> {
        let at = int(reply)?;
        if at <= 9_007_199_254_740_992 {
            return Err(format!(
                "{}: PEXPIRETIME {at} read after the script, which read more than 2^53",
                show(key)
            ));
        }
        let entry = self.keys.get_mut(key).ok_or("the key is gone")?;
        entry.expire = Some(at);
        Ok(())
    }
}

/// Reads every key of `KEYS` atomically, with the checks that abort a server holding an empty
/// sorted set (ZRANK, ZRANDMEMBER), DBSIZE (no key outside the universe: counted after the
/// reads, which delete the keys whose expiry passed), and TIME.
pub const DUMP_SCRIPT: &str = r#"
local out = {0}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)['ok']
  local e = {t}
  if t ~= 'none' then
    e[2] = redis.call('PEXPIRETIME', k)
    -- Lua numbers are doubles: an expiry past 2^53 is read again outside the script.
    if e[2] > 9007199254740992 then e[2] = 'big' end
    e[3] = redis.call('OBJECT', 'ENCODING', k)
    if t == 'zset' then
      e[4] = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
      e[5] = redis.call('ZCARD', k)
      local any = redis.call('ZRANDMEMBER', k)
      e[6] = any
      e[7] = redis.call('ZRANK', k, any or 'none')
    elseif t == 'string' then
      e[4] = {redis.call('GET', k)}
    elseif t == 'list' then
      e[4] = redis.call('LRANGE', k, 0, -1)
    elseif t == 'hash' then
      e[4] = redis.call('HGETALL', k)
    else
      e[4] = {}
    end
  end
  out[i + 1] = e
end
out[1] = redis.call('DBSIZE')
out[#KEYS + 2] = redis.call('TIME')
return out
"#;

fn bytes(v: &Resp) -> Result<Bytes, String> {
    match v {
        Resp::BulkString(b) => Ok(b.clone()),
        Resp::SimpleString(s) => Ok(s.as_bytes().to_vec()),
        Resp::Okay => Ok(b"OK".to_vec()),
        other => Err(format!("expected a string, got {other:?}")),
    }
}

fn int(v: &Resp) -> Result<i64, String> {
    match v {
        Resp::Int(i) => Ok(*i),
        Resp::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("expected an integer, got {}", show(b))),
        other => Err(format!("expected an integer, got {other:?}")),
    }
}

fn array(v: &Resp) -> Result<&[Resp], String> {
    match v {
        Resp::Array(items) => Ok(items),
        other => Err(format!("expected an array, got {other:?}")),
    }
}

/// TIME's reply in Unix ms.
pub fn time_ms(v: &Resp) -> Result<i64, String> {
    let parts = array(v)?;
    if parts.len() != 2 {
        return Err(format!("TIME replied {v:?}"));
    }
    Ok(int(&parts[0])? * 1000 + int(&parts[1])? / 1000)
}

/// Parses the dump script's reply for `names` (the script's KEYS, in order).
pub fn parse_dump(names: &[Bytes], reply: &Resp) -> Result<Dump, String> {
    let items = array(reply)?;
    if items.len() != names.len() + 2 {
        return Err(format!("the dump has {} items: {reply:?}", items.len()));
    }
    let dbsize = int(&items[0])?;
    let time_ms = time_ms(&items[names.len() + 1])?;
    let mut dump = Dump {
        keys: Keyspace::new(),
        encodings: BTreeMap::new(),
        time_ms,
        problems: Vec::new(),
        big_expiries: Vec::new(),
    };
    for (name, item) in names.iter().zip(&items[1..]) {
        let fields = array(item)?;
        let kind = bytes(&fields[0])?;
        if kind == b"none" {
            continue;
        }
        let key = show(name);
        let expire = match &fields[1] {
            Resp::BulkString(big) if big == b"big" => {
                dump.big_expiries.push(name.clone());
                -2
            }
            other => int(other)?,
        };
        let encoding = String::from_utf8_lossy(&bytes(&fields[2])?).into_owned();
        let contents = array(&fields[3])?;
        let value = match kind.as_slice() {
            b"zset" => {
                let mut z = ZSet::default();
                for pair in contents.chunks(2) {
                    let member = bytes(&pair[0])?;
                    let text = String::from_utf8_lossy(&bytes(&pair[1])?).into_owned();
                    let score: f64 = text
                        .parse()
                        .map_err(|_| format!("{key}: score {text:?} is not a number"))?;
                    z.insert(&member, score);
                }
                let card = int(&fields[4])?;
                if card < 1 {
                    dump.problems.push(format!("{key} is an EMPTY sorted set"));
                }
                if card != z.len() as i64 {
                    dump.problems
                        .push(format!("{key}: ZCARD {card} but ZRANGE gave {}", z.len()));
                }
                match fields.get(5) {
                    Some(Resp::BulkString(m)) if z.contains(m) => {}
                    other => dump
                        .problems
                        .push(format!("{key}: ZRANDMEMBER gave {other:?}")),
                }
                if !matches!(fields.get(6), Some(Resp::Int(_))) {
                    dump.problems
                        .push(format!("{key}: ZRANK gave {:?}", fields.get(6)));
                }
                Value::ZSet(z)
            }
            b"string" => Value::Str(bytes(&contents[0])?),
            b"list" => Value::List(contents.iter().map(bytes).collect::<Result<_, _>>()?),
            b"hash" => {
                let mut fields = contents
                    .chunks(2)
                    .map(|p| Ok((bytes(&p[0])?, bytes(&p[1])?)))
                    .collect::<Result<Vec<_>, String>>()?;
                fields.sort();
                if fields.is_empty() {
                    dump.problems.push(format!("{key} is an EMPTY hash"));
                }
                Value::Hash(fields)
            }
            other => return Err(format!("{key} has unexpected type {}", show(other))),
        };
        if let Value::List(l) = &value {
            if l.is_empty() {
                dump.problems.push(format!("{key} is an EMPTY list"));
            }
        }
        let expire = match expire {
            -1 => None,
            -2 => Some(i64::MIN), // read again: see `Dump::big_expiries`
            at if at >= 0 => Some(at),
            other => return Err(format!("{key}: PEXPIRETIME {other}")),
        };
        dump.encodings.insert(name.clone(), encoding);
        dump.keys.insert(name.clone(), Entry { value, expire });
    }
    if dbsize != dump.keys.len() as i64 {
        dump.problems.push(format!(
            "DBSIZE is {dbsize} but {} of the model's keys exist: a key outside the names' keys",
            dump.keys.len()
        ));
    }
    Ok(dump)
}

/// Whether the keys read at some instant in `lo..=hi` (the dump's window) are `expected` as a
/// command left them: a key whose expiry falls inside the window may be there or gone. Returns
/// the first difference.
pub fn compare(expected: &Keyspace, actual: &Keyspace, lo: i64, hi: i64) -> Result<(), String> {
    for (key, want) in expected {
        match (actual.get(key), want.expire) {
            (Some(got), _) if got == want => {}
            (Some(got), _) => {
                return Err(format!("{}: expected {want}, found {got}", show(key)));
            }
            (None, Some(at)) if at < hi => {} // it may have expired before the read
            (None, _) => return Err(format!("{}: expected {want}, found nothing", show(key))),
        }
        if let (Some(_), Some(at)) = (actual.get(key), want.expire) {
            if at < lo {
                return Err(format!(
                    "{}: expired at {at} but still there at {lo} or later",
                    show(key)
                ));
            }
        }
    }
    for (key, got) in actual {
        if !expected.contains_key(key) {
            return Err(format!("{}: expected nothing, found {got}", show(key)));
        }
    }
    Ok(())
}
