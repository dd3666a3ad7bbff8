//! What a server holds, read back for comparison: every key with its value and expiry.

use std::collections::BTreeMap;

use super::{run, zset};

#[derive(Debug, PartialEq)]
pub enum Contents {
    /// Members and exact scores, lowest first. Parsing the scores as integers also checks
    /// they are whole (deadlines in Unix ms, tickets).
    SortedSet(Vec<(String, i64)>),
    Text(String),
    /// Fields and values, sorted by field.
    Hash(Vec<(String, String)>),
}

/// One key as the module leaves it: its value and its absolute expiry.
#[derive(Debug, PartialEq)]
pub struct KeyState {
    pub contents: Contents,
    /// PEXPIRETIME: Unix ms, or -1 when the key does not expire.
    pub expire_at_ms: i64,
}

/// Every key of the database. Taken while no key is about to expire, so reading cannot
/// race an expiry.
pub fn snapshot_of_all_keys(conn: &mut redis::Connection) -> BTreeMap<String, KeyState> {
    let names: Vec<String> = run(conn, &["KEYS", "*"]);
    names
        .into_iter()
        .map(|name| {
            let kind: String = run(conn, &["TYPE", &name]);
            let contents = match kind.as_str() {
                "zset" => Contents::SortedSet(zset(conn, &name)),
                "string" => Contents::Text(run(conn, &["GET", &name])),
                "hash" => {
                    let mut fields: Vec<(String, String)> = run(conn, &["HGETALL", &name]);
                    fields.sort_by(|a, b| a.0.cmp(&b.0));
                    Contents::Hash(fields)
                }
                other => panic!("{name} has unexpected type {other}"),
            };
            let expire_at_ms = run(conn, &["PEXPIRETIME", &name]);
            let state = KeyState {
                contents,
                expire_at_ms,
            };
            (name, state)
        })
        .collect()
}
