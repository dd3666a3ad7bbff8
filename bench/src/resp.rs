//! Bare RESP connections for the scale and instr sets: thousands of sockets
//! that each send one blocking command and read one reply, or a few that send
//! one command at a time. The redis crate's
//! multiplexed connections (a driver task and buffers each) would weigh more
//! on the load generator than the measurement needs.

use std::io::{Read, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::BoxError;

/// The replies the scale and instr sets' commands get.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Nil,
    Text(String),
    Int(i64),
    Error(String),
    /// An array of scalars (`BLPOP`'s key and value).
    Array(Vec<Reply>),
}

/// One client connection with its server-side id (for `CLIENT UNBLOCK`).
pub struct RawConn {
    // Small: replies are identifiers and nils, and 10,000 of these are open.
    io: BufReader<TcpStream>,
    pub id: i64,
}

impl RawConn {
    /// Connects and asks the server for the connection's id, which also
    /// proves the server has accepted it.
    pub async fn open(port: u16) -> Result<Self, BoxError> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        let mut conn = RawConn {
            io: BufReader::with_capacity(256, stream),
            id: 0,
        };
        conn.send(&["CLIENT", "ID"]).await?;
        conn.id = match conn.read().await? {
            Reply::Int(id) => id,
            other => return Err(format!("CLIENT ID replied {other:?}").into()),
        };
        Ok(conn)
    }

    pub async fn send(&mut self, args: &[&str]) -> Result<(), BoxError> {
        self.io.get_mut().write_all(&encode(args)).await?;
        Ok(())
    }

    pub async fn read(&mut self) -> Result<Reply, BoxError> {
        let text = self.line().await?;
        match text.strip_prefix('*') {
            Some(len) if len != "-1" => {
                // Arrays of scalars only (BLPOP's, a ticket's): nothing here nests.
                let len: usize = len.parse()?;
                let mut items = Vec::with_capacity(len);
                for _ in 0..len {
                    let item = self.line().await?;
                    items.push(self.scalar(&item).await?);
                }
                Ok(Reply::Array(items))
            }
            _ => self.scalar(&text).await,
        }
    }

    async fn line(&mut self) -> Result<String, BoxError> {
        let mut line = Vec::with_capacity(64);
        if self.io.read_until(b'\n', &mut line).await? == 0 {
            return Err("the server closed a connection".into());
        }
        Ok(std::str::from_utf8(&line)?
            .trim_end_matches(['\r', '\n'])
            .to_string())
    }

    async fn scalar(&mut self, text: &str) -> Result<Reply, BoxError> {
        let (kind, rest) = text.split_at(text.len().min(1));
        Ok(match kind {
            "+" => Reply::Text(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(rest.parse()?),
            "$" | "*" if rest == "-1" => Reply::Nil,
            "_" => Reply::Nil,
            "$" => {
                let len: usize = rest.parse()?;
                let mut body = vec![0; len + 2];
                self.io.read_exact(&mut body).await?;
                body.truncate(len);
                Reply::Text(String::from_utf8(body)?)
            }
            _ => return Err(format!("unexpected reply {text:?}").into()),
        })
    }
}

/// A command as a RESP array of bulk strings.
pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Now as Unix milliseconds (with fractions), the unit of the module's
/// deadlines; the server runs on this machine, so the clocks agree.
pub fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// One `PING` of the pinger: when it was sent (Unix ms) and its round trip.
#[derive(Clone, Copy, Debug)]
pub struct Ping {
    pub sent_unix_ms: f64,
    pub rtt: Duration,
}

/// Sends `PING` about every millisecond on a connection of its own until
/// `stop` is set. On an OS thread of its own, with blocking I/O, so the
/// load generator's async tasks (thousands of waiters read at once during a
/// storm) do not delay its reads.
pub fn spawn_pinger(
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Result<Vec<Ping>, String>> {
    std::thread::spawn(move || {
        let fail = |e: std::io::Error| format!("pinger: {e}");
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(fail)?;
        stream.set_nodelay(true).map_err(fail)?;
        let ping = encode(&["PING"]);
        let mut pong = [0u8; 7];
        let mut pings = Vec::with_capacity(64 * 1024);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let sent_unix_ms = unix_ms();
            let sent = Instant::now();
            stream.write_all(&ping).map_err(fail)?;
            stream.read_exact(&mut pong).map_err(fail)?;
            if &pong != b"+PONG\r\n" {
                return Err(format!("pinger: unexpected reply {pong:?}"));
            }
            pings.push(Ping {
                sent_unix_ms,
                rtt: sent.elapsed(),
            });
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(pings)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_bulk_strings() {
        assert_eq!(
            encode(&["GET", "k"]),
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n".to_vec()
        );
    }
}
