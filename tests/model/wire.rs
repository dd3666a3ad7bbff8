//! Replies as the model predicts them, and commands sent as one pipelined write.

use std::fmt;

use redis::{ConnectionLike, Value as Resp};

use super::keyspace::{show, Bytes};

/// A reply, or a pattern for one.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Bytes),
    Status(String),
    Array(Vec<Reply>),
    /// An error reply: `CODE message`.
    Err(String),
    /// Pattern: any error reply (Redis's own errors in operator steps).
    AnyErr,
    /// Pattern: a server-made identifier (a lower-case UUID v4), which this placeholder stands
    /// for in the model until the reply names it.
    NewId(Bytes),
    /// Pattern: a bulk string holding this JSON document.
    Json(serde_json::Value),
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Nil => write!(f, "(nil)"),
            Reply::Int(i) => write!(f, "(integer) {i}"),
            Reply::Bulk(b) => write!(f, "\"{}\"", show(b)),
            Reply::Status(s) => write!(f, "{s}"),
            Reply::Array(items) => {
                write!(f, "[")?;
                for (i, item) in items.iter().enumerate() {
                    write!(f, "{}{item}", if i == 0 { "" } else { ", " })?;
                }
                write!(f, "]")
            }
            Reply::Err(e) => write!(f, "(error) {e}"),
            Reply::AnyErr => write!(f, "(any error)"),
            Reply::NewId(p) => write!(f, "<new uuid {}>", show(p)),
            Reply::Json(j) => write!(f, "json {j}"),
        }
    }
}

pub fn reply_of(value: &Resp) -> Reply {
    match value {
        Resp::Nil => Reply::Nil,
        Resp::Int(i) => Reply::Int(*i),
        Resp::BulkString(b) => Reply::Bulk(b.clone()),
        Resp::SimpleString(s) => Reply::Status(s.clone()),
        Resp::Okay => Reply::Status("OK".into()),
        Resp::Array(items) => Reply::Array(items.iter().map(reply_of).collect()),
        Resp::ServerError(err) => Reply::Err(match err.details() {
            Some(detail) => format!("{} {detail}", err.code()),
            None => err.code().to_string(),
        }),
        other => panic!("unexpected RESP value {other:?}"),
    }
}

/// A lower-case UUID v4 in its hyphenated form.
pub fn is_uuid_v4(id: &[u8]) -> bool {
    id.len() == 36
        && id.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            14 => c == b'4',
            19 => matches!(c, b'8' | b'9' | b'a' | b'b'),
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
        })
}

/// Whether `actual` fits `pattern`; a `NewId` placeholder is bound to the identifier the
/// server made (pushed onto `bound` as `(placeholder, identifier)`).
pub fn fits(pattern: &Reply, actual: &Reply, bound: &mut Vec<(Bytes, Bytes)>) -> bool {
    match (pattern, actual) {
        (Reply::AnyErr, Reply::Err(_)) => true,
        (Reply::NewId(placeholder), Reply::Bulk(id)) => {
            if let Some((_, known)) = bound.iter().find(|(p, _)| p == placeholder) {
                return known == id;
            }
            if is_uuid_v4(id) {
                bound.push((placeholder.clone(), id.clone()));
                true
            } else {
                false
            }
        }
        (Reply::Json(want), Reply::Bulk(text)) => {
            serde_json::from_slice::<serde_json::Value>(text).is_ok_and(|got| got == *want)
        }
        (Reply::Array(want), Reply::Array(got)) => {
            want.len() == got.len() && want.iter().zip(got).all(|(w, g)| fits(w, g, bound))
        }
        (want, got) => want == got,
    }
}

/// RESP for one command.
pub fn pack(out: &mut Vec<u8>, args: &[Bytes]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Sends `commands` in one write and reads their replies (errors included, in place).
pub fn pipeline(
    conn: &mut redis::Connection,
    commands: &[Vec<Bytes>],
) -> redis::RedisResult<Vec<Resp>> {
    let mut packed = Vec::with_capacity(256);
    for command in commands {
        pack(&mut packed, command);
    }
    conn.req_packed_commands(&packed, 0, commands.len())
}

/// A command from string arguments.
pub fn cmd(args: &[&str]) -> Vec<Bytes> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// A command for display: arguments quoted as redis-cli would take them.
pub fn show_command(args: &[Bytes]) -> String {
    args.iter()
        .map(|a| {
            let text = show(a);
            // escape_ascii escapes what redis-cli unescapes inside double quotes.
            if text.is_empty() || text.contains(' ') || text.as_bytes() != a.as_slice() {
                format!("\"{text}\"")
            } else {
                text
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
