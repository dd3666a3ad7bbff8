//! Propagated commands, read as a replica or an AOF reload sees them: the replication stream
//! and the AOF's files.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// One propagated command: its arguments, name first.
pub type Command = Vec<String>;

pub fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

pub fn header_number(line: &str, prefix: char) -> usize {
    line.strip_prefix(prefix)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("expected {prefix}<number>, got {line:?}"))
}

/// Reads one command in the form replicas and the AOF receive: a RESP array of bulk strings.
/// `Ok(None)` at a clean end of input.
pub fn read_command(reader: &mut impl BufRead) -> io::Result<Option<Command>> {
    let header = match read_line(reader) {
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    };
    let mut command = Vec::new();
    for _ in 0..header_number(&header, '*') {
        let len = header_number(&read_line(reader)?, '$');
        let mut arg = vec![0; len + 2]; // with the CRLF
        reader.read_exact(&mut arg)?;
        arg.truncate(len);
        command.push(String::from_utf8(arg).expect("UTF-8 argument"));
    }
    Ok(Some(command))
}

/// The primary's replication stream, read as a replica would with the SYNC command.
pub struct ReplicationStream {
    reader: BufReader<TcpStream>,
}

impl ReplicationStream {
    /// Registers as a replica of `port` and skips the full-sync payload (the RDB), so the
    /// stream starts with the commands that follow.
    pub fn attach(port: u16) -> ReplicationStream {
        let mut socket = TcpStream::connect(("127.0.0.1", port)).expect("connect for SYNC");
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        socket.write_all(b"SYNC\r\n").expect("send SYNC");
        let mut reader = BufReader::new(socket);
        // The primary sends bare newlines as keep-alives while it prepares the RDB.
        let header = loop {
            let line = read_line(&mut reader).expect("RDB header");
            if !line.is_empty() {
                break line;
            }
        };
        if let Some(mark) = header.strip_prefix("$EOF:") {
            // Diskless sync: the payload ends with the 40-byte mark.
            let mut tail = Vec::new();
            let mut byte = [0];
            while !tail.ends_with(mark.as_bytes()) {
                reader.read_exact(&mut byte).expect("RDB payload");
                tail.push(byte[0]);
            }
        } else {
            let len = header_number(&header, '$');
            io::copy(&mut (&mut reader).take(len as u64), &mut io::sink()).expect("RDB payload");
        }
        ReplicationStream { reader }
    }

    /// Commands received until (and without) `SET <marker> ...`.
    pub fn commands_until_set(&mut self, marker: &str) -> Vec<Command> {
        let mut commands = Vec::new();
        loop {
            let command = read_command(&mut self.reader)
                .expect("reading the replication stream")
                .expect("the primary closed the replication stream");
            if command.len() >= 2 && command[0].eq_ignore_ascii_case("SET") && command[1] == marker
            {
                return commands;
            }
            commands.push(command);
        }
    }
}

/// Every command of the AOF's incremental files, in file-name order; asserts the base file
/// is there too (an RDB preamble, which holds no command).
pub fn aof_commands(dir: &Path) -> Vec<Command> {
    let aof_dir = dir.join("appendonlydir");
    let mut files: Vec<_> = std::fs::read_dir(&aof_dir)
        .unwrap_or_else(|err| panic!("{}: {err}", aof_dir.display()))
        .map(|entry| entry.expect("AOF directory entry").path())
        .collect();
    files.sort();
    assert!(
        files.iter().any(|f| f.to_string_lossy().contains(".base.")),
        "no base AOF file in {files:?}"
    );
    let mut commands = Vec::new();
    for file in files
        .iter()
        .filter(|f| f.extension() == Some("aof".as_ref()))
    {
        let mut reader = BufReader::new(std::fs::File::open(file).expect("open AOF"));
        while let Some(command) = read_command(&mut reader).expect("read AOF") {
            commands.push(command);
        }
    }
    commands
}
