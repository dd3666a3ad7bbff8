//! The model of the Redis commands other clients and operators run on the semaphores' keys:
//! deletions, renames, values of other types, foreign sorted-set writes, expiries, counters.

use super::keyspace::{show, Bytes, Entry, Keyspace, Value, ZSet};
use super::wire::Reply;

/// Redis's string2ll: optional '-', no leading zero (but "0"), no spaces, fits an i64.
pub fn string2ll(s: &[u8]) -> Option<i64> {
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    if digits.is_empty()
        || !digits.iter().all(u8::is_ascii_digit)
        || digits[0] == b'0'
        || digits.len() > 19
    {
        return None;
    }
    let magnitude: i128 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let value = if negative { -magnitude } else { magnitude };
    i64::try_from(value).ok()
}

fn zset_mut<'a>(keys: &'a mut Keyspace, key: &[u8]) -> Result<Option<&'a mut ZSet>, Reply> {
    match keys.get_mut(key) {
        None => Ok(None),
        Some(Entry {
            value: Value::ZSet(z),
            ..
        }) => Ok(Some(z)),
        Some(_) => Err(wrongtype()),
    }
}

fn wrongtype() -> Reply {
    Reply::Err("WRONGTYPE Operation against a key holding the wrong kind of value".into())
}

fn arg_i64(arg: &[u8]) -> i64 {
    string2ll(arg).unwrap_or_else(|| panic!("numeric argument {}", show(arg)))
}

/// Whether the command's outcome depends on the exact time it ran (beyond which keys had
/// expired): PEXPIRE and EXPIRE set an expiry relative to it.
pub fn needs_time(args: &[Bytes]) -> bool {
    args[0].eq_ignore_ascii_case(b"PEXPIRE") || args[0].eq_ignore_ascii_case(b"EXPIRE")
}

/// The possible outcomes of `args` run at `now` on `keys` (already as of that instant).
pub fn apply(keys: &Keyspace, args: &[Bytes], now: i64, latest: i64) -> Vec<(Reply, Keyspace)> {
    let mut keys = keys.clone();
    let name = args[0].to_ascii_uppercase();
    let reply = match name.as_slice() {
        b"DEL" => {
            let n = args[1..]
                .iter()
                .filter(|k| keys.remove(*k).is_some())
                .count();
            Reply::Int(n as i64)
        }
        b"RENAME" => match keys.remove(&args[1]) {
            None => Reply::Err("ERR no such key".into()),
            Some(entry) => {
                keys.insert(args[2].clone(), entry);
                Reply::Status("OK".into())
            }
        },
        b"SET" => {
            keys.insert(
                args[1].clone(),
                Entry {
                    value: Value::Str(args[2].clone()),
                    expire: None,
                },
            );
            Reply::Status("OK".into())
        }
        b"LPUSH" => match keys.get_mut(&args[1]) {
            None => {
                keys.insert(
                    args[1].clone(),
                    Entry {
                        value: Value::List(vec![args[2].clone()]),
                        expire: None,
                    },
                );
                Reply::Int(1)
            }
            Some(Entry {
                value: Value::List(l),
                ..
            }) => {
                l.insert(0, args[2].clone());
                Reply::Int(l.len() as i64)
            }
            Some(_) => wrongtype(),
        },
        b"HSET" => {
            let (field, value) = (args[2].clone(), args[3].clone());
            match keys.get_mut(&args[1]) {
                None => {
                    keys.insert(
                        args[1].clone(),
                        Entry {
                            value: Value::Hash(vec![(field, value)]),
                            expire: None,
                        },
                    );
                    Reply::Int(1)
                }
                Some(Entry {
                    value: Value::Hash(h),
                    ..
                }) => match h.iter_mut().find(|(f, _)| *f == field) {
                    Some(pair) => {
                        pair.1 = value;
                        Reply::Int(0)
                    }
                    None => {
                        h.push((field, value));
                        h.sort();
                        Reply::Int(1)
                    }
                },
                Some(_) => wrongtype(),
            }
        }
        b"HDEL" => match keys.get_mut(&args[1]) {
            None => Reply::Int(0),
            Some(Entry {
                value: Value::Hash(h),
                ..
            }) => {
                let before = h.len();
                h.retain(|(f, _)| *f != args[2]);
                let removed = before - h.len();
                if h.is_empty() {
                    keys.remove(&args[1]);
                }
                Reply::Int(removed as i64)
            }
            Some(_) => wrongtype(),
        },
        b"ZADD" => {
            let score: f64 = parse_score(&args[2]);
            match zset_mut(&mut keys, &args[1]) {
                Err(e) => e,
                Ok(Some(z)) => Reply::Int(i64::from(z.insert(&args[3], score))),
                Ok(None) => {
                    let mut z = ZSet::default();
                    z.insert(&args[3], score);
                    keys.insert(
                        args[1].clone(),
                        Entry {
                            value: Value::ZSet(z),
                            expire: None,
                        },
                    );
                    Reply::Int(1)
                }
            }
        }
        b"ZREM" => match zset_mut(&mut keys, &args[1]) {
            Err(e) => e,
            Ok(None) => Reply::Int(0),
            Ok(Some(z)) => {
                let removed = z.remove(&args[2]);
                if z.is_empty() {
                    keys.remove(&args[1]);
                }
                Reply::Int(i64::from(removed))
            }
        },
        b"PERSIST" => match keys.get_mut(&args[1]) {
            Some(entry) if entry.expire.is_some() => {
                entry.expire = None;
                Reply::Int(1)
            }
            _ => Reply::Int(0),
        },
        b"PEXPIRE" | b"EXPIRE" => {
            let unit = if name.as_slice() == b"EXPIRE" {
                1000
            } else {
                1
            };
            let ms = arg_i64(&args[2]) * unit;
            let at = now + ms;
            let Some(entry) = keys.get_mut(&args[1]) else {
                return vec![(Reply::Int(0), keys)];
            };
            entry.expire = Some(at);
            // Redis deletes the key instead when the expiry is already due by its clock, which
            // may have moved on since it took `now` (up to the end of the step).
            let mut outcomes = Vec::new();
            if at <= latest {
                let mut gone = keys.clone();
                gone.remove(&args[1]);
                outcomes.push((Reply::Int(1), gone));
            }
            outcomes.push((Reply::Int(1), keys));
            return outcomes;
        }
        b"INCRBY" => {
            let by = arg_i64(&args[2]);
            match keys.get_mut(&args[1]) {
                None => {
                    keys.insert(
                        args[1].clone(),
                        Entry {
                            value: Value::Str(by.to_string().into_bytes()),
                            expire: None,
                        },
                    );
                    Reply::Int(by)
                }
                Some(Entry {
                    value: Value::Str(s),
                    ..
                }) => match string2ll(s).and_then(|old| old.checked_add(by)) {
                    Some(new) => {
                        *s = new.to_string().into_bytes();
                        Reply::Int(new)
                    }
                    None => Reply::AnyErr,
                },
                Some(_) => wrongtype(),
            }
        }
        b"FLUSHDB" => {
            keys.clear();
            Reply::Status("OK".into())
        }
        b"DEBUG" => Reply::Status("OK".into()),
        other => panic!("the model has no rule for {}", show(other)),
    };
    vec![(reply, keys)]
}

/// A ZADD score as Redis reads it (strtod, with "inf" spelled as Redis accepts it).
pub fn parse_score(arg: &[u8]) -> f64 {
    let text = std::str::from_utf8(arg).expect("ASCII score");
    match text {
        "+inf" | "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        _ => text.parse().unwrap_or_else(|_| panic!("score {text}")),
    }
}
