//! Waiting inside the server: `WAIT seconds` and `BOUND` on SEM.ACQUIRE and SEM.ACQUIREFAIR.
//! Every blocked client is a real connection in its own thread, with a read timeout, so a wait
//! that never ends fails its test instead of hanging it. Commands are written as one line of
//! words (no argument here contains a space).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Barrier, Mutex, MutexGuard};
use std::thread::{self, sleep, JoinHandle};
use std::time::{Duration, Instant};

use common::state::snapshot_of_all_keys;
use common::stream::{aof_commands, Command, ReplicationStream};
use common::*;

/// How long a blocked client waits for its reply before its test fails.
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);
/// A generous bound for "eventually" (the machine may be busy with other tests).
const EVENTUALLY: Duration = Duration::from_secs(10);
/// How late after a holder's deadline its permit may reach the next waiter.
const LEASE_END_SLACK_MS: i64 = 50;

/// A server whose every write reaches the AOF before it replies.
const AOF_ARGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
];

/// The module's commands: none may ever appear in a replicated stream or an AOF.
const SEM_COMMANDS: [&str; 5] = [
    "SEM.ACQUIRE",
    "SEM.ACQUIREFAIR",
    "SEM.REFRESH",
    "SEM.RELEASE",
    "SEM.GET",
];

/// Held by the tests that measure time and by the load tests, so that the 50 clients of a
/// load test never delay another test's timers.
static TIMING: Mutex<()> = Mutex::new(());

fn timing() -> MutexGuard<'static, ()> {
    TIMING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Commands as lines, and their replies
// ---------------------------------------------------------------------------------------------

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Runs `line`; panics on an error reply.
fn cmd<T: redis::FromRedisValue>(conn: &mut redis::Connection, line: &str) -> T {
    run(conn, &words(line))
}

/// A reply to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Nil,
    Id(String),
    Ticket(String, u64),
    Error(String),
    /// The connection failed or timed out before a reply came.
    Unanswered(String),
}

fn id(id: &str) -> Reply {
    Reply::Id(id.into())
}

fn ticket(id: &str, ticket: u64) -> Reply {
    Reply::Ticket(id.into(), ticket)
}

fn reply_of(line: &str, result: redis::RedisResult<redis::Value>) -> Reply {
    use redis::Value;
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).expect("UTF-8 identifier");
    match result {
        Ok(Value::Nil) => Reply::Nil,
        Ok(Value::BulkString(bytes)) => Reply::Id(text(&bytes)),
        Ok(Value::Array(items)) => match &items[..] {
            [Value::BulkString(bytes), Value::Int(ticket)] => {
                Reply::Ticket(text(bytes), u64::try_from(*ticket).expect("ticket"))
            }
            other => panic!("{line}: unexpected reply {other:?}"),
        },
        Ok(other) => panic!("{line}: unexpected reply {other:?}"),
        Err(err) if err.is_timeout() || err.is_io_error() || err.is_connection_dropped() => {
            Reply::Unanswered(format!("{line}: {err}"))
        }
        Err(err) => Reply::Error(error_text(&err)),
    }
}

/// The ticket of `reply`, the first fair grant of a name without a counter since `fresh` was
/// read: the clock of that grant (see [`FirstGrant`]).
fn first_of(fresh: &FirstGrant, conn: &mut redis::Connection, reply: &Reply) -> u64 {
    match reply {
        Reply::Ticket(_, ticket) => fresh.ticket(conn, *ticket as i64) as u64,
        other => panic!("a grant without a ticket: {other:?}"),
    }
}

/// Runs an acquire (or anything that replies like one) and returns its reply.
fn acquire(conn: &mut redis::Connection, line: &str) -> Reply {
    reply_of(line, try_run(conn, &words(line)))
}

// ---------------------------------------------------------------------------------------------
// Blocked clients
// ---------------------------------------------------------------------------------------------

/// A connection of its own, ready to send one command that may block.
struct Client {
    conn: redis::Connection,
    /// Its `CLIENT ID`.
    id: i64,
}

impl Client {
    fn new(server: &Server) -> Client {
        let mut conn = server.connection();
        conn.set_read_timeout(Some(REPLY_TIMEOUT))
            .expect("read timeout");
        let id = cmd(&mut conn, "CLIENT ID");
        Client { conn, id }
    }

    /// Sends `line` from a thread of its own.
    fn send(self, line: &str) -> Blocked {
        let Client { mut conn, id } = self;
        let line = line.to_string();
        let handle = thread::spawn(move || {
            let sent = Instant::now();
            let result = try_run::<redis::Value>(&mut conn, &words(&line));
            let at_ms = unix_ms_now();
            let elapsed = sent.elapsed();
            Done {
                reply: reply_of(&line, result),
                at_ms,
                elapsed,
                conn,
            }
        });
        Blocked {
            client_id: id,
            handle,
        }
    }
}

/// A command sent from its own thread, maybe still waiting for its reply.
struct Blocked {
    client_id: i64,
    handle: JoinHandle<Done>,
}

/// What a blocked command got.
struct Done {
    reply: Reply,
    /// When the reply arrived (local Unix ms).
    at_ms: i64,
    /// From sending the command to its reply.
    elapsed: Duration,
    /// Its connection, still open (a BOUND permit lives as long as it).
    conn: redis::Connection,
}

impl Blocked {
    fn is_done(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the reply (at most [`REPLY_TIMEOUT`]).
    fn finish(self) -> Done {
        self.handle.join().expect("a blocked client panicked")
    }

    fn reply(self) -> Reply {
        self.finish().reply
    }
}

/// Sends `line` (an acquire with WAIT) from a new connection, and returns once the line of
/// its semaphore is one longer.
fn queue(server: &Server, conn: &mut redis::Connection, line: &str) -> Blocked {
    queue_from(Client::new(server), conn, line)
}

fn queue_from(client: Client, conn: &mut redis::Connection, line: &str) -> Blocked {
    let name = words(line)[1].to_string();
    let before = waiters_in_line(conn, &name);
    let blocked = client.send(line);
    let deadline = Instant::now() + EVENTUALLY;
    while waiters_in_line(conn, &name) != before + 1 {
        if blocked.is_done() {
            panic!("{line} did not wait: {:?}", blocked.reply());
        }
        assert!(Instant::now() < deadline, "{line} never joined the line");
        sleep(Duration::from_millis(5));
    }
    blocked
}

/// Asserts `blocked` has no reply yet.
fn assert_waiting(blocked: &Blocked, what: &str) {
    assert!(
        !blocked.is_done(),
        "{what} got a reply while it should wait"
    );
}

/// A raw socket that sends `line` and never reads: dropping it is a client that goes away
/// while it waits.
fn raw_send(server: &Server, line: &str) -> TcpStream {
    let mut socket = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    let args = words(line);
    let mut command = format!("*{}\r\n", args.len());
    for arg in args {
        command.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    socket.write_all(command.as_bytes()).expect("send");
    socket
}

// ---------------------------------------------------------------------------------------------
// Reading the server
// ---------------------------------------------------------------------------------------------

/// The identifiers in `name`'s holder set (expired ones included), lowest deadline first.
fn holders(conn: &mut redis::Connection, name: &str) -> Vec<String> {
    zset(conn, name).into_iter().map(|(id, _)| id).collect()
}

/// `holder`'s deadline (Unix ms, server clock).
fn deadline_of(conn: &mut redis::Connection, name: &str, holder: &str) -> i64 {
    let score: Option<i64> = run(conn, &["ZSCORE", name, holder]);
    score.unwrap_or_else(|| panic!("{holder} holds no permit of {name}"))
}

/// The server's clock minus ours (both read on this machine, so about 0).
fn server_clock_offset(conn: &mut redis::Connection) -> i64 {
    let before = unix_ms_now();
    let server = server_ms(conn);
    let after = unix_ms_now();
    server - (before + after) / 2
}

fn kill_client(conn: &mut redis::Connection, client_id: i64) {
    let killed: i64 = cmd(conn, &format!("CLIENT KILL ID {client_id}"));
    assert_eq!(killed, 1, "client {client_id} was not there to kill");
}

fn wait_until_gone(conn: &mut redis::Connection, client_id: i64) {
    wait_until("the server saw the connection close", EVENTUALLY, || {
        let list: String = cmd(conn, &format!("CLIENT LIST ID {client_id}"));
        list.trim().is_empty()
    });
}

fn client_unblock(conn: &mut redis::Connection, blocked: &Blocked, how: &str) {
    let unblocked: i64 = cmd(conn, &format!("CLIENT UNBLOCK {} {how}", blocked.client_id));
    assert_eq!(unblocked, 1, "CLIENT UNBLOCK found no blocked client");
}

// ---------------------------------------------------------------------------------------------
// 1. First come, first served
// ---------------------------------------------------------------------------------------------

/// Ten clients wait on a limit-1 semaphore, each one joining only once the one before it is in
/// line; the holder leaves, then each grantee in turn: they are served in exactly that order.
fn ten_waiters_in_arrival_order(command: &str) {
    let fair = command == "SEM.ACQUIREFAIR";
    let with_ticket = if fair { "WITHTICKET" } else { "" };
    let server = Server::start();
    let mut conn = server.connection();
    let fresh = FirstGrant::before(&mut conn);
    let granted = acquire(
        &mut conn,
        &format!("{command} line 1 30 ID h {with_ticket}"),
    );
    // A fair name's tickets start from the clock of its first grant; a plain one takes none.
    let first = fair.then(|| first_of(&fresh, &mut conn, &granted));
    assert_eq!(
        granted,
        match first {
            Some(first) => ticket("h", first),
            None => id("h"),
        }
    );

    let names: Vec<String> = (0..10).map(|k| format!("w{k}")).collect();
    let mut blocked = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let line = format!("{command} line 1 30 ID {name} WAIT 10 {with_ticket}");
        blocked.push(queue(&server, &mut conn, &line));
        let json = sem_json(&mut conn, "line");
        assert_eq!(json["waiters"], k + 1);
        assert!(json["longest_wait_ms"].as_i64().is_some_and(|ms| ms >= 0));
    }

    let released: i64 = cmd(&mut conn, "SEM.RELEASE line h");
    assert_eq!(released, 1);
    let mut blocked = blocked.into_iter();
    for (k, name) in names.iter().enumerate() {
        let reply = blocked.next().expect("one per name").reply();
        let expected = match first {
            Some(first) => ticket(name, first + k as u64 + 1),
            None => id(name),
        };
        assert_eq!(reply, expected, "waiter {k}");
        assert_eq!(holders(&mut conn, "line"), [name.as_str()]);
        assert_eq!(waiters_in_line(&mut conn, "line"), 9 - k as u64);
        for later in blocked.as_slice() {
            assert_waiting(later, "a waiter behind the one served");
        }
        let released: i64 = cmd(&mut conn, &format!("SEM.RELEASE line {name}"));
        assert_eq!(released, 1, "{name} releases");
    }
    let json = sem_json(&mut conn, "line");
    assert_eq!(json["waiters"], 0);
    assert_eq!(json["longest_wait_ms"], serde_json::Value::Null);
    assert_eq!(cmd::<i64>(&mut conn, "EXISTS line line:owner"), 0);
    if let Some(first) = first {
        assert_eq!(cmd::<u64>(&mut conn, "GET line:counter"), first + 10);
    }
}

#[test]
fn fair_waiters_are_served_in_arrival_order_with_the_next_tickets() {
    ten_waiters_in_arrival_order("SEM.ACQUIREFAIR");
}

#[test]
fn plain_waiters_are_served_in_arrival_order() {
    ten_waiters_in_arrival_order("SEM.ACQUIRE");
}

// ---------------------------------------------------------------------------------------------
// 2. Lease end, with no other command
// ---------------------------------------------------------------------------------------------

/// Asserts the permit reached `holder` (lease `lease_ms`) within [`LEASE_END_SLACK_MS`] after
/// `deadline`: by the grant time the server recorded (its new deadline minus its lease) and by
/// the time its reply arrived (on the server's clock).
fn assert_granted_at_deadline(
    conn: &mut redis::Connection,
    (name, holder, lease_ms): (&str, &str, i64),
    done: &Done,
    deadline: i64,
    offset_ms: i64,
) {
    let granted_at = deadline_of(conn, name, holder) - lease_ms;
    let arrived_at = done.at_ms + offset_ms;
    eprintln!(
        "{name}: {holder} granted {} ms and answered {} ms after the deadline",
        granted_at - deadline,
        arrived_at - deadline
    );
    assert!(
        (deadline..=deadline + LEASE_END_SLACK_MS).contains(&granted_at),
        "{holder} granted {} ms after the deadline {deadline}",
        granted_at - deadline
    );
    assert!(
        (deadline..=deadline + LEASE_END_SLACK_MS).contains(&arrived_at),
        "{holder}'s reply arrived {} ms after the deadline {deadline} (granted {} ms after it)",
        arrived_at - deadline,
        granted_at - deadline
    );
}

#[test]
fn a_lease_end_grants_the_next_waiter_with_no_other_command() {
    let _quiet = timing();
    let server = Server::start();
    let mut conn = server.connection();
    let offset = server_clock_offset(&mut conn);
    let waiter = Client::new(&server);

    let _: String = cmd(&mut conn, "SEM.ACQUIRE lease 1 0.3 ID h");
    let deadline = deadline_of(&mut conn, "lease", "h");
    let blocked = queue_from(waiter, &mut conn, "SEM.ACQUIRE lease 1 10 ID w WAIT 5");
    // It joined the line while the holder was live; from here on, nobody sends anything.
    let json = sem_json(&mut conn, "lease");
    assert_eq!(json["holders"][0]["id"], "h", "too slow: {json}");

    let done = blocked.finish();
    assert_eq!(done.reply, id("w"));
    assert_granted_at_deadline(&mut conn, ("lease", "w", 10_000), &done, deadline, offset);
    assert_eq!(holders(&mut conn, "lease"), ["w"]);
    assert_eq!(waiters_in_line(&mut conn, "lease"), 0);
}

#[test]
fn staggered_lease_ends_serve_one_waiter_each() {
    let _quiet = timing();
    let server = Server::start();
    let mut conn = server.connection();
    let offset = server_clock_offset(&mut conn);
    let clients: Vec<Client> = (0..3).map(|_| Client::new(&server)).collect();

    let fresh = FirstGrant::before(&mut conn);
    let mut deadlines = Vec::new();
    for (holder, lease) in [("h1", "0.6"), ("h2", "0.8"), ("h3", "1")] {
        let line = format!("SEM.ACQUIREFAIR chain 3 {lease} ID {holder}");
        let _: String = cmd(&mut conn, &line);
        deadlines.push(deadline_of(&mut conn, "chain", holder));
    }
    let first = fresh.holder(&mut conn, "chain", "h1") as u64;
    let names = ["w1", "w2", "w3"];
    let blocked: Vec<Blocked> = clients
        .into_iter()
        .zip(names)
        .map(|(client, name)| {
            let line = format!("SEM.ACQUIREFAIR chain 3 10 ID {name} WAIT 5 WITHTICKET");
            queue_from(client, &mut conn, &line)
        })
        .collect();
    let json = sem_json(&mut conn, "chain");
    assert_eq!(
        json["holders"].as_array().map(Vec::len),
        Some(3),
        "too slow"
    );

    let mut blocked = blocked.into_iter();
    for (k, (name, deadline)) in names.iter().zip(deadlines).enumerate() {
        let done = blocked.next().expect("three").finish();
        assert_eq!(done.reply, ticket(name, first + k as u64 + 3));
        assert_granted_at_deadline(&mut conn, ("chain", name, 10_000), &done, deadline, offset);
        for later in blocked.as_slice() {
            assert_waiting(later, "a waiter whose holder's lease has not ended");
        }
    }
    assert_eq!(holders(&mut conn, "chain"), names);
}

// ---------------------------------------------------------------------------------------------
// 3. Wait timeouts, and the WAIT and BOUND options
// ---------------------------------------------------------------------------------------------

#[test]
fn a_wait_ends_with_nil_when_its_time_is_up() {
    let _quiet = timing();
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR t 1 30 ID h");
    let _: String = cmd(&mut conn, "SEM.ACQUIRE tp 1 30 ID h");
    let before = snapshot_of_all_keys(&mut conn);

    for line in [
        "SEM.ACQUIRE tp 1 10 WAIT 0.2",
        "SEM.ACQUIREFAIR t 1 10 WAIT 0.2 WITHTICKET",
    ] {
        let done = Client::new(&server).send(line).finish();
        assert_eq!(done.reply, Reply::Nil, "{line}");
        let ms = done.elapsed.as_millis();
        eprintln!("{line}: nil after {ms} ms");
        assert!((190..=600).contains(&ms), "{line} answered after {ms} ms");
        let json = sem_json(&mut conn, words(line)[1]);
        assert_eq!(json["waiters"], 0, "the line is empty after it");
        assert_eq!(json["longest_wait_ms"], serde_json::Value::Null);
    }
    assert_eq!(
        snapshot_of_all_keys(&mut conn),
        before,
        "the waits changed nothing"
    );
}

#[test]
fn wait_0_waits_without_limit_until_client_unblock() {
    let _quiet = timing();
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIRE forever 1 30 ID h");
    let blocked = queue(&server, &mut conn, "SEM.ACQUIRE forever 1 10 WAIT 0");
    sleep(Duration::from_secs(1));
    assert_waiting(&blocked, "WAIT 0 after 1 s");
    let longest = sem_json(&mut conn, "forever")["longest_wait_ms"].as_i64();
    assert!(longest.is_some_and(|ms| ms >= 1000), "{longest:?}");

    client_unblock(&mut conn, &blocked, "");
    assert_eq!(blocked.reply(), Reply::Nil);
    assert_eq!(waiters_in_line(&mut conn, "forever"), 0);
    assert_eq!(holders(&mut conn, "forever"), ["h"]);
}

#[test]
fn bad_wait_and_bound_options_are_refused_and_change_nothing() {
    let server = Server::start();
    let mut conn = server.connection();
    let fresh = FirstGrant::before(&mut conn);
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR opt 1 30 ID h");
    let first = fresh.holder(&mut conn, "opt", "h") as u64;
    let _: String = cmd(&mut conn, "SEM.ACQUIRE optp 1 30 ID h");
    let before = snapshot_of_all_keys(&mut conn);
    let wait_error = "ERR WAIT must be";
    let syntax_error = "ERR syntax error";
    let cases = [
        ("WAIT -1", wait_error),
        ("WAIT abc", wait_error),
        ("WAIT 1.2345", wait_error),
        ("WAIT 31536001", wait_error),
        ("WAIT +1", wait_error),
        ("WAIT 1e3", wait_error),
        ("WAIT 0x10", wait_error),
        ("WAIT", syntax_error),
        ("WAIT 1 WAIT 1", syntax_error),
        ("BOUND BOUND", syntax_error),
        ("BOUND WAIT", syntax_error),
        ("BOUND 1", syntax_error),
    ];
    for name in ["opt", "optp"] {
        let command = if name == "opt" {
            "SEM.ACQUIREFAIR"
        } else {
            "SEM.ACQUIRE"
        };
        for (options, expected) in cases {
            let line = format!("{command} {name} 1 10 {options}");
            let err = error_of(&mut conn, &words(&line));
            assert!(err.starts_with(expected), "{line}: {err}");
        }
        // An empty WAIT value.
        let err = error_of(&mut conn, &[command, name, "1", "10", "WAIT", ""]);
        assert!(err.starts_with(wait_error), "empty WAIT: {err}");
    }
    assert_eq!(snapshot_of_all_keys(&mut conn), before);
    assert_eq!(
        waiters_in_line(&mut conn, "opt") + waiters_in_line(&mut conn, "optp"),
        0
    );

    // Any order, any case; the largest wait is allowed (a renewal replies at once).
    let line = "sem.acquirefair opt 1 30 bound wait 31536000 withticket id h";
    assert_eq!(acquire(&mut conn, line), ticket("h", first));
    let line = "SEM.ACQUIRE optp 1 30 Bound Id h Wait 0.001";
    assert_eq!(acquire(&mut conn, line), id("h"));
}

// ---------------------------------------------------------------------------------------------
// 4. Head-of-line
// ---------------------------------------------------------------------------------------------

/// The reply a grant of `holder` gets: with its ticket when fair.
fn granted(holder: &str, fair_ticket: Option<u64>) -> Reply {
    match fair_ticket {
        Some(fair_ticket) => ticket(holder, fair_ticket),
        None => id(holder),
    }
}

/// Holder `holder`'s ticket when `command` is fair, its name's first since `fresh` was read.
fn first_held(
    command: &str,
    fresh: &FirstGrant,
    conn: &mut redis::Connection,
    holder: &str,
) -> Option<u64> {
    (command == "SEM.ACQUIREFAIR").then(|| fresh.holder(conn, "hol", holder) as u64)
}

/// A holds (limit 2), W1 (limit 1) is first in line, W2 (limit 2) behind it: W2 is not served
/// while W1 waits, though one live holder is below its limit. When A leaves, W1 is served, then
/// W2 (W1 alone is still below its limit of 2), in that order.
fn head_of_line(command: &str) {
    let tail = if command == "SEM.ACQUIREFAIR" {
        "WITHTICKET"
    } else {
        ""
    };
    let server = Server::start();
    let mut conn = server.connection();
    let fresh = FirstGrant::before(&mut conn);
    let _: redis::Value = cmd(&mut conn, &format!("{command} hol 2 30 ID A"));
    let first = first_held(command, &fresh, &mut conn, "A");
    let w1 = queue(
        &server,
        &mut conn,
        &format!("{command} hol 1 30 ID W1 WAIT 10 {tail}"),
    );
    let w2 = queue(
        &server,
        &mut conn,
        &format!("{command} hol 2 30 ID W2 WAIT 10 {tail}"),
    );
    assert_eq!(cmd::<i64>(&mut conn, "SEM.GET hol"), 1);
    // A write on the semaphore serves the line again: still nobody.
    assert_eq!(cmd::<i64>(&mut conn, "SEM.REFRESH hol A 30"), 1);
    sleep(Duration::from_millis(200));
    assert_waiting(&w1, "W1 (limit 1, one holder)");
    assert_waiting(&w2, "W2 behind W1");
    assert_eq!(holders(&mut conn, "hol"), ["A"]);
    assert_eq!(waiters_in_line(&mut conn, "hol"), 2);

    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE hol A"), 1);
    assert_eq!(w1.reply(), granted("W1", first.map(|t| t + 1)));
    assert_eq!(
        w2.reply(),
        granted("W2", first.map(|t| t + 2)),
        "W2 is served after W1"
    );
    let mut now_holding = holders(&mut conn, "hol");
    now_holding.sort();
    assert_eq!(now_holding, ["W1", "W2"]);
    assert_eq!(waiters_in_line(&mut conn, "hol"), 0);
}

/// A and B hold (limit 3); W1 (limit 1) is first in line, W2 (limit 3) behind it. A release
/// frees a permit W2 could take, but W1 still does not fit: nobody is served. The next release
/// serves W1, then W2.
fn head_of_line_across_a_release(command: &str) {
    let tail = if command == "SEM.ACQUIREFAIR" {
        "WITHTICKET"
    } else {
        ""
    };
    let server = Server::start();
    let mut conn = server.connection();
    let fresh = FirstGrant::before(&mut conn);
    let _: redis::Value = cmd(&mut conn, &format!("{command} hol 3 30 ID A"));
    let first = first_held(command, &fresh, &mut conn, "A");
    let _: redis::Value = cmd(&mut conn, &format!("{command} hol 3 30 ID B"));
    let w1 = queue(
        &server,
        &mut conn,
        &format!("{command} hol 1 30 ID W1 WAIT 10 {tail}"),
    );
    let w2 = queue(
        &server,
        &mut conn,
        &format!("{command} hol 3 30 ID W2 WAIT 10 {tail}"),
    );
    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE hol A"), 1);
    sleep(Duration::from_millis(200));
    assert_waiting(&w1, "W1 (limit 1) while B holds");
    assert_waiting(&w2, "W2 (limit 3, one holder) behind W1");
    assert_eq!(holders(&mut conn, "hol"), ["B"]);
    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE hol B"), 1);
    assert_eq!(w1.reply(), granted("W1", first.map(|t| t + 2)));
    assert_eq!(w2.reply(), granted("W2", first.map(|t| t + 3)));
    assert_eq!(cmd::<i64>(&mut conn, "SEM.GET hol"), 2);
}

#[test]
fn head_of_line_plain() {
    head_of_line("SEM.ACQUIRE");
    head_of_line_across_a_release("SEM.ACQUIRE");
}

#[test]
fn head_of_line_fair() {
    head_of_line("SEM.ACQUIREFAIR");
    head_of_line_across_a_release("SEM.ACQUIREFAIR");
}

// ---------------------------------------------------------------------------------------------
// 5. Newcomers while others wait
// ---------------------------------------------------------------------------------------------

#[test]
fn a_plain_caller_without_wait_may_barge_ahead_of_the_line() {
    let server = Server::start();
    let mut conn = server.connection();
    // A holds with limit 2, W1 (limit 1) waits at the head: a permit is free for a limit-2
    // caller.
    let _: String = cmd(&mut conn, "SEM.ACQUIRE b 2 30 ID A");
    let w1 = queue(&server, &mut conn, "SEM.ACQUIRE b 1 30 ID W1 WAIT 10");
    assert_eq!(acquire(&mut conn, "SEM.ACQUIRE b 2 10 ID X"), id("X"));
    assert_eq!(
        acquire(&mut conn, "SEM.ACQUIRE b 2 10"),
        Reply::Nil,
        "full now"
    );
    // A renewal by an existing holder is served at once, with or without WAIT.
    let a_before = deadline_of(&mut conn, "b", "A");
    assert_eq!(acquire(&mut conn, "SEM.ACQUIRE b 2 60 ID A"), id("A"));
    assert!(
        deadline_of(&mut conn, "b", "A") > a_before,
        "A's lease moved"
    );
    let renewal = Client::new(&server).send("SEM.ACQUIRE b 1 60 ID X WAIT 10");
    assert_eq!(
        renewal.reply(),
        id("X"),
        "a renewal with WAIT does not queue"
    );
    assert_waiting(&w1, "W1");
    assert_eq!(waiters_in_line(&mut conn, "b"), 1);
    // A waiting newcomer queues even though it would fit.
    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE b X"), 1);
    let w2 = queue(&server, &mut conn, "SEM.ACQUIRE b 2 30 ID W2 WAIT 10");
    assert_eq!(holders(&mut conn, "b"), ["A"]);

    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE b A"), 1);
    assert_eq!(w1.reply(), id("W1"));
    assert_eq!(w2.reply(), id("W2"));
}

#[test]
fn a_fair_caller_without_wait_is_refused_while_others_wait() {
    let server = Server::start();
    let mut conn = server.connection();
    let fresh = FirstGrant::before(&mut conn);
    let granted = acquire(&mut conn, "SEM.ACQUIREFAIR f 2 30 ID A WITHTICKET");
    let first = first_of(&fresh, &mut conn, &granted) as i64;
    assert_eq!(granted, ticket("A", first as u64));
    let w1 = queue(&server, &mut conn, "SEM.ACQUIREFAIR f 1 30 ID W1 WAIT 10");
    let before = snapshot_of_all_keys(&mut conn);
    assert_eq!(acquire(&mut conn, "SEM.ACQUIREFAIR f 2 10"), Reply::Nil);
    let refused = acquire(&mut conn, "SEM.ACQUIREFAIR f 2 10 ID Y WITHTICKET");
    assert_eq!(refused, Reply::Nil, "no barging into a fair line");
    assert_eq!(snapshot_of_all_keys(&mut conn), before, "nothing changed");

    // A renewal of the fair holder happens at once and keeps its ticket, with or without WAIT.
    let renewed = acquire(&mut conn, "SEM.ACQUIREFAIR f 2 60 ID A WITHTICKET");
    assert_eq!(renewed, ticket("A", first as u64));
    let renewal = Client::new(&server).send("SEM.ACQUIREFAIR f 1 60 ID A WAIT 10 WITHTICKET");
    assert_eq!(
        renewal.reply(),
        ticket("A", first as u64),
        "a renewal with WAIT does not queue"
    );
    assert_eq!(
        cmd::<i64>(&mut conn, "GET f:counter"),
        first,
        "no ticket was taken"
    );
    assert_waiting(&w1, "the fair W1");
    // A waiting newcomer queues behind W1 even though a permit is free for it.
    let w2 = queue(&server, &mut conn, "SEM.ACQUIREFAIR f 2 30 ID W2 WAIT 10");
    assert_eq!(holders(&mut conn, "f"), ["A"]);

    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE f A"), 1);
    assert_eq!(w1.reply(), id("W1"));
    assert_eq!(w2.reply(), id("W2"));
    assert_eq!(
        zset(&mut conn, "f:owner"),
        [("W1".into(), first + 1), ("W2".into(), first + 2)]
    );
}

// ---------------------------------------------------------------------------------------------
// 6. BOUND
// ---------------------------------------------------------------------------------------------

#[test]
fn a_bound_permit_comes_back_when_its_connection_is_killed() {
    let server = Server::start();
    let mut conn = server.connection();
    let mut bound = Client::new(&server);
    assert_eq!(
        acquire(&mut bound.conn, "SEM.ACQUIRE bk 1 30 ID x BOUND"),
        id("x")
    );
    let waiter = queue(&server, &mut conn, "SEM.ACQUIRE bk 1 30 ID w WAIT 10");
    kill_client(&mut conn, bound.id);
    assert_eq!(waiter.reply(), id("w"));
    assert_eq!(holders(&mut conn, "bk"), ["w"]);
    assert_eq!(
        cmd::<i64>(&mut conn, "SEM.RELEASE bk x"),
        0,
        "x's permit was given back"
    );
}

#[test]
fn a_bound_permit_comes_back_when_its_socket_closes() {
    let server = Server::start();
    let mut conn = server.connection();
    let fresh = FirstGrant::before(&mut conn);
    let mut bound = Client::new(&server);
    let got = acquire(
        &mut bound.conn,
        "SEM.ACQUIREFAIR bs 1 30 ID y BOUND WITHTICKET",
    );
    let first = first_of(&fresh, &mut conn, &got) as i64;
    assert_eq!(got, ticket("y", first as u64));
    let waiter = queue(
        &server,
        &mut conn,
        "SEM.ACQUIREFAIR bs 1 30 ID w WAIT 10 WITHTICKET",
    );
    drop(bound);
    assert_eq!(waiter.reply(), ticket("w", first as u64 + 1));
    assert_eq!(holders(&mut conn, "bs"), ["w"]);
    assert_eq!(zset(&mut conn, "bs:owner"), [("w".into(), first + 1)]);
}

#[test]
fn a_bound_waiter_keeps_its_permit_only_while_its_connection_lives() {
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIRE bw 1 30 ID h");
    let first = queue(
        &server,
        &mut conn,
        "SEM.ACQUIRE bw 1 30 ID w1 WAIT 10 BOUND",
    );
    let second = queue(&server, &mut conn, "SEM.ACQUIRE bw 1 30 ID w2 WAIT 10");
    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE bw h"), 1);
    let done = first.finish();
    assert_eq!(done.reply, id("w1"));
    sleep(Duration::from_millis(100));
    assert_waiting(&second, "w2 while w1 holds");
    // w1's permit was granted from the line, BOUND: closing its connection gives it back.
    drop(done.conn);
    assert_eq!(second.reply(), id("w2"));
    assert_eq!(holders(&mut conn, "bw"), ["w2"]);
}

#[test]
fn a_bound_renewal_from_another_connection_moves_the_binding() {
    let server = Server::start();
    let mut conn = server.connection();
    let mut one = Client::new(&server);
    let mut two = Client::new(&server);
    let line = "SEM.ACQUIRE mv 1 30 ID x BOUND";
    assert_eq!(acquire(&mut one.conn, line), id("x"));
    assert_eq!(acquire(&mut two.conn, line), id("x"));
    kill_client(&mut conn, one.id);
    wait_until_gone(&mut conn, one.id);
    sleep(Duration::from_millis(100));
    assert_eq!(holders(&mut conn, "mv"), ["x"], "the binding moved to two");
    let waiter = queue(&server, &mut conn, "SEM.ACQUIRE mv 1 30 ID w WAIT 10");
    kill_client(&mut conn, two.id);
    assert_eq!(waiter.reply(), id("w"));
}

#[test]
fn an_unbound_permit_survives_its_connection_until_its_lease_ends() {
    let _quiet = timing();
    let server = Server::start();
    let mut conn = server.connection();
    let offset = server_clock_offset(&mut conn);
    let mut unbound = Client::new(&server);
    assert_eq!(
        acquire(&mut unbound.conn, "SEM.ACQUIRE ub 1 0.8 ID z"),
        id("z")
    );
    let deadline = deadline_of(&mut conn, "ub", "z");
    let waiter = queue(&server, &mut conn, "SEM.ACQUIRE ub 1 10 ID w WAIT 5");
    let unbound_id = unbound.id;
    drop(unbound);
    wait_until_gone(&mut conn, unbound_id);
    assert!(
        server_ms(&mut conn) < deadline,
        "too slow to look before the deadline"
    );
    assert_waiting(&waiter, "the waiter while z's lease runs");
    assert_eq!(holders(&mut conn, "ub"), ["z"]);
    let done = waiter.finish();
    assert_eq!(done.reply, id("w"));
    assert_granted_at_deadline(&mut conn, ("ub", "w", 10_000), &done, deadline, offset);
}

// ---------------------------------------------------------------------------------------------
// 7. What else ends a wait
// ---------------------------------------------------------------------------------------------

#[test]
fn a_waiter_that_goes_away_leaves_no_trace() {
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIRE gone 1 30 ID h");

    // A socket that closes while it waits.
    let socket = raw_send(&server, "SEM.ACQUIRE gone 1 30 ID s WAIT 10");
    wait_until("the socket waits", EVENTUALLY, || {
        waiters_in_line(&mut conn, "gone") == 1
    });
    drop(socket);
    wait_until("the closed socket left the line", EVENTUALLY, || {
        waiters_in_line(&mut conn, "gone") == 0
    });

    // A connection the server kills while it waits.
    let killed = queue(&server, &mut conn, "SEM.ACQUIRE gone 1 30 ID k WAIT 10");
    kill_client(&mut conn, killed.client_id);
    wait_until("the killed client left the line", EVENTUALLY, || {
        waiters_in_line(&mut conn, "gone") == 0
    });
    let json = sem_json(&mut conn, "gone");
    assert_eq!(json["longest_wait_ms"], serde_json::Value::Null);
    let reply = killed.reply();
    assert!(
        matches!(reply, Reply::Unanswered(_)),
        "the killed waiter got {reply:?}"
    );

    // Nobody is served any more: the release leaves the semaphore empty.
    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE gone h"), 1);
    sleep(Duration::from_millis(100));
    assert_eq!(cmd::<i64>(&mut conn, "DBSIZE"), 0, "no key left");
    assert_eq!(cmd::<i64>(&mut conn, "SEM.GET gone"), 0);
}

#[test]
fn where_the_server_forbids_blocking_wait_answers_at_once() {
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIRE nb 1 30 ID h");
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR nbf 1 30 ID h");

    let started = Instant::now();
    let (plain, fair): (Option<String>, Option<String>) = redis::pipe()
        .atomic()
        .cmd("SEM.ACQUIRE")
        .arg(&["nb", "1", "10", "WAIT", "5"])
        .cmd("SEM.ACQUIREFAIR")
        .arg(&["nbf", "1", "10", "WAIT", "5"])
        .query(&mut conn)
        .expect("MULTI/EXEC");
    assert_eq!((plain, fair), (None, None));
    let script = "return redis.call(ARGV[1], KEYS[1], 1, 10, 'WAIT', 5)";
    let plain: Option<String> = run(&mut conn, &["EVAL", script, "1", "nb", "SEM.ACQUIRE"]);
    let fair: Option<String> = run(&mut conn, &["EVAL", script, "1", "nbf", "SEM.ACQUIREFAIR"]);
    assert_eq!((plain, fair), (None, None));
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    assert_eq!(
        waiters_in_line(&mut conn, "nb") + waiters_in_line(&mut conn, "nbf"),
        0
    );

    // Where a permit is free, they get it at once as usual.
    let (granted,): (Option<String>,) = redis::pipe()
        .atomic()
        .cmd("SEM.ACQUIRE")
        .arg(&["nb", "2", "10", "ID", "m", "WAIT", "5"])
        .query(&mut conn)
        .expect("MULTI/EXEC");
    assert_eq!(granted.as_deref(), Some("m"));
    let script = "return redis.call('SEM.ACQUIRE', KEYS[1], 3, 10, 'ID', 'e', 'WAIT', 5)";
    let granted: Option<String> = run(&mut conn, &["EVAL", script, "1", "nb"]);
    assert_eq!(granted.as_deref(), Some("e"));
}

#[test]
fn client_unblock_ends_a_wait_with_nil_or_an_error() {
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIRE cu 1 30 ID h");
    let line = "SEM.ACQUIRE cu 1 30 WAIT 10";

    let blocked = queue(&server, &mut conn, line);
    client_unblock(&mut conn, &blocked, "");
    assert_eq!(blocked.reply(), Reply::Nil);
    assert_eq!(waiters_in_line(&mut conn, "cu"), 0);

    let blocked = queue(&server, &mut conn, line);
    client_unblock(&mut conn, &blocked, "ERROR");
    match blocked.reply() {
        Reply::Error(err) => assert!(err.starts_with("UNBLOCKED"), "{err}"),
        other => panic!("CLIENT UNBLOCK ERROR gave {other:?}"),
    }
    assert_eq!(waiters_in_line(&mut conn, "cu"), 0);
    assert_eq!(holders(&mut conn, "cu"), ["h"]);

    // A waiter behind an unblocked one moves up, and the next release serves it.
    let first = queue(&server, &mut conn, line);
    let second = queue(&server, &mut conn, "SEM.ACQUIRE cu 1 30 ID next WAIT 10");
    client_unblock(&mut conn, &first, "");
    assert_eq!(first.reply(), Reply::Nil);
    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE cu h"), 1);
    assert_eq!(second.reply(), id("next"));
}

#[test]
fn deleting_the_keys_serves_the_head_on_an_empty_semaphore() {
    let server = Server::start();
    let mut conn = server.connection();
    let lease = "30";

    // Plain: DEL of the holder set.
    let _: String = cmd(&mut conn, &format!("SEM.ACQUIRE d 1 {lease} ID h"));
    let w1 = queue(&server, &mut conn, "SEM.ACQUIRE d 1 30 ID w1 WAIT 10");
    let w2 = queue(&server, &mut conn, "SEM.ACQUIRE d 1 30 ID w2 WAIT 10");
    assert_eq!(cmd::<i64>(&mut conn, "DEL d"), 1);
    assert_eq!(w1.reply(), id("w1"));
    assert_eq!(holders(&mut conn, "d"), ["w1"]);
    assert_waiting(&w2, "w2 behind the new holder");
    assert_eq!(waiters_in_line(&mut conn, "d"), 1);
    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE d w1"), 1);
    assert_eq!(w2.reply(), id("w2"));

    // Fair: DEL of the holder and owner sets; the counter goes on.
    let fresh = FirstGrant::before(&mut conn);
    let _: String = cmd(&mut conn, &format!("SEM.ACQUIREFAIR df 1 {lease} ID h"));
    let first = fresh.holder(&mut conn, "df", "h") as u64;
    let w = queue(
        &server,
        &mut conn,
        "SEM.ACQUIREFAIR df 1 30 ID w WAIT 10 WITHTICKET",
    );
    assert_eq!(cmd::<i64>(&mut conn, "DEL df df:owner"), 2);
    assert_eq!(w.reply(), ticket("w", first + 1));
    assert_eq!(holders(&mut conn, "df"), ["w"]);
}

#[test]
fn flushdb_serves_the_head_on_an_empty_semaphore() {
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR fl 1 30 ID h");
    let w1 = queue(
        &server,
        &mut conn,
        "SEM.ACQUIREFAIR fl 1 30 ID w1 WAIT 10 WITHTICKET",
    );
    let w2 = queue(&server, &mut conn, "SEM.ACQUIREFAIR fl 1 30 ID w2 WAIT 10");
    let fresh = FirstGrant::before(&mut conn);
    let _: () = cmd(&mut conn, "FLUSHDB");
    // The counter went with the rest: the next ticket is the clock of the grant, as for a new
    // name, past the tickets of earlier clocks that old holders may still use.
    let got = w1.reply();
    let first = first_of(&fresh, &mut conn, &got);
    assert_eq!(got, ticket("w1", first));
    assert_eq!(holders(&mut conn, "fl"), ["w1"]);
    assert_waiting(&w2, "w2 behind the new holder");
    let _: () = cmd(&mut conn, "FLUSHALL");
    assert_eq!(w2.reply(), id("w2"));
    assert_eq!(holders(&mut conn, "fl"), ["w2"]);
}

#[test]
fn overwriting_the_holder_set_answers_the_waiters_wrongtype() {
    let server = Server::start();
    let mut conn = server.connection();
    // The module does not follow writes of strings: the waiters learn of the overwrite when
    // the line is next served, at the holder's lease end (well before their timeouts).
    let _: String = cmd(&mut conn, "SEM.ACQUIRE ow 1 0.5 ID h");
    let line = "SEM.ACQUIRE ow 1 30 WAIT 10";
    let w1 = queue(&server, &mut conn, line);
    let w2 = queue(&server, &mut conn, line);
    let _: () = cmd(&mut conn, "SET ow x");
    for waiter in [w1, w2] {
        match waiter.reply() {
            Reply::Error(err) => assert!(err.starts_with("WRONGTYPE"), "{err}"),
            other => panic!("a waiter on an overwritten key got {other:?}"),
        }
    }
    assert_eq!(cmd::<String>(&mut conn, "GET ow"), "x");
    // SEM.GET answers WRONGTYPE too while the key is a string: look once it is gone.
    assert_eq!(cmd::<i64>(&mut conn, "DEL ow"), 1);
    assert_eq!(
        waiters_in_line(&mut conn, "ow"),
        0,
        "the line went with the errors"
    );
}

#[test]
fn becoming_a_replica_answers_every_waiter_with_an_error_at_once() {
    let server = Server::start();
    let other = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIRE r1 1 30 ID h");
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR r2 1 30 ID h");
    let waiting = [
        queue(&server, &mut conn, "SEM.ACQUIRE r1 1 30 WAIT 10"),
        queue(&server, &mut conn, "SEM.ACQUIRE r1 1 30 WAIT 0 BOUND"),
        queue(
            &server,
            &mut conn,
            "SEM.ACQUIREFAIR r2 1 30 WAIT 10 WITHTICKET",
        ),
    ];
    let started = Instant::now();
    let _: () = cmd(&mut conn, &format!("REPLICAOF 127.0.0.1 {}", other.port));
    for waiter in waiting {
        match waiter.reply() {
            // Redis (and Valkey) answer every blocked client themselves when the server becomes
            // a replica, before the module hears of it; the module's own answer is READONLY.
            Reply::Error(err) => assert!(
                err.starts_with("UNBLOCKED") || err.starts_with("READONLY"),
                "a waiter on a new replica got {err:?}"
            ),
            other => panic!("a waiter on a new replica got {other:?}"),
        }
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(2),
        "answered after {elapsed:?}"
    );
    assert_eq!(
        waiters_in_line(&mut conn, "r1") + waiters_in_line(&mut conn, "r2"),
        0
    );
}

/// A waiter that goes away in the same event-loop iteration as its grant (one transaction
/// releases and kills it, or ends its wait with CLIENT UNBLOCK): Redis still reports the
/// disconnect for a client the module answered, whose answer it has not processed yet. The
/// permit goes back, nothing is unblocked twice, and the server lives on.
#[test]
fn a_waiter_gone_in_the_same_moment_as_its_grant_gives_the_permit_back() {
    let server = Server::start();
    let mut conn = server.connection();
    for (round, how) in [
        "KILL ID {}",
        "KILL ID {}",
        "UNBLOCK {}",
        "UNBLOCK {}",
        "UNBLOCK {} ERROR",
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("race{round}");
        let _: String = cmd(&mut conn, &format!("SEM.ACQUIRE {name} 1 30 ID a"));
        let waiter = Client::new(&server);
        // Redis 7.0 sends no reply at all after a plain CLIENT UNBLOCK here (it skips the
        // module's callback for a client the module already answered): do not wait long.
        waiter
            .conn
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("read timeout");
        let waiter_id = waiter.id;
        let blocked = queue_from(
            waiter,
            &mut conn,
            &format!("SEM.ACQUIRE {name} 1 30 ID b WAIT 10"),
        );
        let mut transaction = redis::pipe();
        transaction
            .atomic()
            .cmd("SEM.RELEASE")
            .arg(&name)
            .arg("a")
            .cmd("CLIENT")
            .arg(words(&how.replace("{}", &waiter_id.to_string())));
        let (released, gone): (i64, i64) = transaction.query(&mut conn).expect("EXEC");
        assert_eq!((released, gone), (1, 1), "{how}");
        let reply = if how.starts_with("KILL") {
            None
        } else {
            Some(blocked.reply())
        };
        match reply {
            // Valkey delivers the grant a plain CLIENT UNBLOCK raced with: the permit is held.
            Some(Reply::Id(holder)) => {
                assert_eq!((how, holder.as_str()), ("UNBLOCK {}", "b"));
                assert_eq!(holders(&mut conn, &name), ["b"]);
                assert_eq!(cmd::<i64>(&mut conn, &format!("SEM.RELEASE {name} b")), 1);
            }
            Some(Reply::Error(err)) => {
                assert!(
                    how.ends_with("ERROR") && err.starts_with("UNBLOCKED"),
                    "{how}: {err}"
                )
            }
            Some(Reply::Unanswered(_)) | None => {
                assert_ne!(how, "UNBLOCK {} ERROR", "an error reply is due")
            }
            Some(other) => panic!("{how}: {other:?}"),
        }
        // Undelivered, the permit goes back.
        wait_until("the permit came back", EVENTUALLY, || {
            holders(&mut conn, &name).is_empty()
        });
        assert_eq!(waiters_in_line(&mut conn, &name), 0);
        let pong: String = cmd(&mut conn, "PING");
        assert_eq!(pong, "PONG");
    }
}

/// The server becomes a replica in the same transaction that grants a waiter: Redis answers
/// every blocked client itself, the one just granted too; the server lives on.
#[test]
fn becoming_a_replica_in_the_same_moment_as_a_grant() {
    let server = Server::start();
    let other = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIRE rg 1 30 ID a");
    let granted = queue(&server, &mut conn, "SEM.ACQUIRE rg 1 30 ID b WAIT 10");
    let behind = queue(&server, &mut conn, "SEM.ACQUIRE rg 1 30 ID c WAIT 10");
    let mut transaction = redis::pipe();
    transaction
        .atomic()
        .cmd("SEM.RELEASE")
        .arg("rg")
        .arg("a")
        .cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port);
    let (released, _): (i64, String) = transaction.query(&mut conn).expect("EXEC");
    assert_eq!(released, 1);
    for waiter in [granted, behind] {
        match waiter.reply() {
            Reply::Error(err) => assert!(err.starts_with("UNBLOCKED"), "{err}"),
            other => panic!("a waiter on a new replica got {other:?}"),
        }
    }
    sleep(Duration::from_millis(300));
    let pong: String = cmd(&mut conn, "PING");
    assert_eq!(pong, "PONG");
    let info: String = cmd(&mut conn, "INFO sem");
    assert!(info.contains("sem_waiters:0"), "{info}");
    assert!(!server.log().contains("crashed"), "{}", server.log());
}

/// A waiter's grant that only renewed a live permit of its identifier (another connection took
/// that identifier meanwhile) never reached the waiter: the permit stays with its holder.
#[test]
fn an_undelivered_renewal_leaves_the_permit_to_its_holder() {
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIRE rn 2 30 ID a");
    let head = Client::new(&server);
    let head_id = head.id;
    let _head = queue_from(
        head,
        &mut conn,
        "SEM.ACQUIRE rn 2 30 ID big COUNT 2 WAIT 10",
    );
    let behind = Client::new(&server);
    let behind_id = behind.id;
    let _behind = queue_from(behind, &mut conn, "SEM.ACQUIRE rn 2 30 ID x WAIT 10");
    // Another connection takes `x` ahead of the line (plain callers without WAIT may).
    let mut other = server.connection();
    assert_eq!(acquire(&mut other, "SEM.ACQUIRE rn 2 30 ID x"), id("x"));
    let mut moment = redis::pipe();
    moment
        .atomic()
        .cmd("CLIENT")
        .arg(&["UNBLOCK", &head_id.to_string()][..])
        .cmd("SEM.RELEASE")
        .arg("rn")
        .arg("a")
        .cmd("CLIENT")
        .arg(&["KILL", "ID", &behind_id.to_string()][..]);
    let replies: (i64, i64, i64) = moment.query(&mut conn).expect("EXEC");
    assert_eq!(replies, (1, 1, 1));
    wait_until_gone(&mut conn, behind_id);
    sleep(Duration::from_millis(50));
    assert_eq!(holders(&mut conn, "rn"), ["x"]);
    assert_eq!(cmd::<i64>(&mut other, "SEM.RELEASE rn x"), 1);
}

/// Redis 7.0 filters a command again when it runs it after a pause: a SEM.* call sent while
/// writes are paused runs as sent once they resume.
#[test]
fn calls_sent_while_writes_are_paused_run_as_sent_afterwards() {
    let server = Server::start();
    let mut conn = server.connection();
    let _: String = cmd(&mut conn, "SEM.ACQUIRE pz 3 30 ID a");
    let _: String = cmd(&mut conn, "SEM.ACQUIRE pz 3 30 ID r");
    let _: () = cmd(&mut conn, "CLIENT PAUSE 300 WRITE");
    let sent: Vec<_> = [
        "SEM.ACQUIRE pz 3 30 ID b",
        "SEM.RELEASE pz a",
        "SEM.REFRESH pz r 30",
        "SEM.ACQUIREFAIR pf 2 30 ID f",
    ]
    .into_iter()
    .map(|line| {
        let mut client = Client::new(&server);
        thread::spawn(move || try_run::<redis::Value>(&mut client.conn, &words(line)))
    })
    .collect();
    let replies: Vec<redis::Value> = sent
        .into_iter()
        .map(|thread| thread.join().unwrap().expect("no error reply"))
        .collect();
    use redis::Value::{BulkString, Int};
    assert_eq!(
        replies,
        [
            BulkString(b"b".to_vec()),
            Int(1),
            Int(1),
            BulkString(b"f".to_vec())
        ]
    );
}

/// A BOUND holder's connection closes, and in the same moment another connection acquires the
/// same identifier again: the pending give-back must not take the new permit away.
#[test]
fn a_regrant_in_the_same_moment_outlives_the_give_back_of_the_old_permit() {
    let server = Server::start();
    let mut conn = server.connection();
    for bound in ["BOUND", ""] {
        let name = format!("again{}", bound.len());
        let mut first = Client::new(&server);
        let _: String = cmd(
            &mut first.conn,
            &format!("SEM.ACQUIRE {name} 1 30 ID h BOUND"),
        );
        let mut moment = redis::pipe();
        moment
            .atomic()
            .cmd("CLIENT")
            .arg(&["KILL", "ID", &first.id.to_string()][..])
            .cmd("SEM.ACQUIRE")
            .arg(words(&format!("{name} 1 30 ID h {bound}")));
        let (killed, again): (i64, String) = moment.query(&mut conn).expect("EXEC");
        assert_eq!((killed, again.as_str()), (1, "h"));
        wait_until_gone(&mut conn, first.id);
        sleep(Duration::from_millis(50));
        assert_eq!(holders(&mut conn, &name), ["h"], "{bound}");
        assert_eq!(cmd::<i64>(&mut conn, &format!("SEM.RELEASE {name} h")), 1);
    }
}

/// While writes are paused (`CLIENT PAUSE ... WRITE`, as `FAILOVER` and a Cluster manual
/// failover do), nothing may be written or propagated, not even from the module's timer: Redis
/// asserts it, and keeps keys whose expiry passed in place. Grants and give-backs wait for the
/// pause to end; a wait that ends meanwhile is still answered on time.
#[test]
fn nothing_is_written_while_writes_are_paused() {
    let _timing = timing();
    let primary = Server::start_with(&PRIMARY_ARGS);
    let replica = start_replica_of(&primary);
    let mut conn = primary.connection();

    // The holder set's expiry passes during the pause.
    let _: String = cmd(&mut conn, "SEM.ACQUIRE pa 1 0.3 ID h");
    let expired_set = queue(&primary, &mut conn, "SEM.ACQUIRE pa 1 30 ID wa WAIT 10");
    // A lease ends during the pause while another holder lives on.
    let fresh = FirstGrant::before(&mut conn);
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR pb 2 0.3 ID h1");
    let first = fresh.holder(&mut conn, "pb", "h1") as u64;
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR pb 2 30 ID h2");
    let lease_end = queue(
        &primary,
        &mut conn,
        "SEM.ACQUIREFAIR pb 2 30 ID wb WAIT 10 WITHTICKET",
    );
    let short_wait = queue(
        &primary,
        &mut conn,
        "SEM.ACQUIREFAIR pb 2 30 ID wd WAIT 0.5",
    );
    // A BOUND holder's connection closes during the pause.
    let mut bound = Client::new(&primary);
    let _: String = cmd(&mut bound.conn, "SEM.ACQUIRE pc 1 30 ID hc BOUND");
    let give_back = queue(&primary, &mut conn, "SEM.ACQUIRE pc 1 30 ID wc WAIT 10");

    let _: () = cmd(&mut conn, "CLIENT PAUSE 60000 WRITE");
    drop(bound);
    sleep(Duration::from_millis(1000));
    let pong: String = cmd(&mut conn, "PING");
    assert_eq!(pong, "PONG");
    assert_eq!(short_wait.reply(), Reply::Nil, "a wait ends on time");
    for (waiter, what) in [
        (&expired_set, "a waiter on an expired set"),
        (&lease_end, "a waiter after a lease end"),
        (&give_back, "a waiter on a BOUND permit"),
    ] {
        assert_waiting(waiter, what);
    }
    assert_eq!(holders(&mut conn, "pc"), ["hc"], "nothing given back yet");

    let _: () = cmd(&mut conn, "CLIENT UNPAUSE");
    assert_eq!(expired_set.reply(), id("wa"));
    assert_eq!(lease_end.reply(), ticket("wb", first + 2));
    assert_eq!(give_back.reply(), id("wc"));
    assert_eq!(holders(&mut conn, "pc"), ["wc"]);
    wait_for_replica(&mut conn);
    assert_eq!(
        snapshot_of_all_keys(&mut replica.connection()),
        snapshot_of_all_keys(&mut conn)
    );
}

/// Another client shortens the holder set's expiry (or memory pressure evicts it): its waiters
/// are served when it goes, not at the last lease end.
#[test]
fn a_holder_set_that_expires_early_serves_its_waiters() {
    let server = Server::start();
    let mut conn = server.connection();
    let lease = "100";
    let _: String = cmd(&mut conn, &format!("SEM.ACQUIRE early 1 {lease} ID h"));
    let waiter = queue(&server, &mut conn, "SEM.ACQUIRE early 1 30 ID w WAIT 10");
    let _: i64 = cmd(&mut conn, "PEXPIRE early 100");
    let done = waiter.finish();
    assert_eq!(done.reply, id("w"));
    assert!(
        done.elapsed < Duration::from_secs(5),
        "served after {:?}",
        done.elapsed
    );
    assert_eq!(holders(&mut conn, "early"), ["w"]);
}

// ---------------------------------------------------------------------------------------------
// 8. Replication and AOF
// ---------------------------------------------------------------------------------------------

/// Waits served every way a permit frees up: releases, lease ends (the module's timer), BOUND
/// disconnects; plus a wait that times out and keys that expire. Afterwards every holder left
/// has a lease of 60 s or more, and nothing waits.
fn waiting_workload(server: &Server, conn: &mut redis::Connection) {
    // Served by a release: fair and plain.
    let fresh = FirstGrant::before(conn);
    let _: String = cmd(conn, "SEM.ACQUIREFAIR rel 1 60 ID h");
    let first = fresh.holder(conn, "rel", "h") as u64;
    let w = queue(
        server,
        conn,
        "SEM.ACQUIREFAIR rel 1 60 ID w WAIT 10 WITHTICKET",
    );
    assert_eq!(cmd::<i64>(conn, "SEM.RELEASE rel h"), 1);
    assert_eq!(w.reply(), ticket("w", first + 1));
    let _: String = cmd(conn, "SEM.ACQUIRE relp 1 60 ID h");
    let w = queue(server, conn, "SEM.ACQUIRE relp 1 60 ID w WAIT 10");
    assert_eq!(cmd::<i64>(conn, "SEM.RELEASE relp h"), 1);
    assert_eq!(w.reply(), id("w"));

    // Served by lease ends: a plain one beside a long holder (the expired one is pruned), and
    // a fair one whose keys expire at that same deadline.
    let _: String = cmd(conn, "SEM.ACQUIRE lease 2 60 ID anchor");
    let _: String = cmd(conn, "SEM.ACQUIRE lease 2 0.2 ID short");
    let plain = queue(server, conn, "SEM.ACQUIRE lease 2 90 ID w WAIT 10");
    let fresh = FirstGrant::before(conn);
    let _: String = cmd(conn, "SEM.ACQUIREFAIR leasef 1 0.2 ID h");
    let leasef_first = fresh.holder(conn, "leasef", "h") as u64;
    let fair = queue(
        server,
        conn,
        "SEM.ACQUIREFAIR leasef 1 60 ID w WAIT 10 WITHTICKET",
    );
    assert_eq!(plain.reply(), id("w"));
    assert_eq!(fair.reply(), ticket("w", leasef_first + 1));

    // Served by BOUND disconnects: one killed, one closed.
    let mut killed = Client::new(server);
    let _: String = cmd(&mut killed.conn, "SEM.ACQUIRE bound 1 60 ID b BOUND");
    let w = queue(server, conn, "SEM.ACQUIRE bound 1 60 ID w WAIT 10");
    kill_client(conn, killed.id);
    assert_eq!(w.reply(), id("w"));
    let mut closed = Client::new(server);
    let _: String = cmd(&mut closed.conn, "SEM.ACQUIREFAIR boundf 1 60 ID b BOUND");
    let w = queue(
        server,
        conn,
        "SEM.ACQUIREFAIR boundf 1 60 ID w WAIT 10 BOUND",
    );
    drop(closed);
    let done = w.finish();
    assert_eq!(done.reply, id("w"));

    // A wait that times out, and a fair semaphore whose keys expire (its counter stays).
    let _: String = cmd(conn, "SEM.ACQUIRE to 1 60 ID h");
    let timed_out = Client::new(server).send("SEM.ACQUIRE to 1 60 WAIT 0.1");
    assert_eq!(timed_out.reply(), Reply::Nil);
    let _: String = cmd(conn, "SEM.ACQUIREFAIR exp 2 0.15 ID a");
    let _: String = cmd(conn, "SEM.ACQUIREFAIR exp 2 0.15 ID b");
    wait_until("exp's keys expired", EVENTUALLY, || {
        cmd::<i64>(conn, "EXISTS exp exp:owner") == 0
    });

    // w's BOUND permit on boundf lasts as long as its connection.
    drop(done.conn);
    wait_until("boundf's permit came back", EVENTUALLY, || {
        cmd::<i64>(conn, "EXISTS boundf boundf:owner") == 0
    });
    for name in ["rel", "relp", "lease", "leasef", "bound", "boundf", "to"] {
        assert_eq!(waiters_in_line(conn, name), 0, "{name}");
    }
}

/// The keys [`waiting_workload`] leaves behind.
fn keys_after_waiting_workload() -> BTreeSet<String> {
    words(
        "rel rel:owner rel:counter relp lease leasef leasef:owner leasef:counter bound \
         boundf:counter to exp:counter",
    )
    .into_iter()
    .map(String::from)
    .collect()
}

fn assert_no_sem_command(commands: &[Command]) {
    for command in commands {
        let name = command[0].to_uppercase();
        assert!(
            !SEM_COMMANDS.contains(&name.as_str()),
            "{command:?} was propagated"
        );
    }
}

#[test]
fn a_replica_holds_exactly_the_primarys_keys_after_waits() {
    let primary = Server::start_with(&PRIMARY_ARGS);
    let replica = start_replica_of(&primary);
    let mut on_primary = primary.connection();
    let mut on_replica = replica.connection();

    waiting_workload(&primary, &mut on_primary);
    wait_for_replica(&mut on_primary);

    let primary_keys = snapshot_of_all_keys(&mut on_primary);
    let names: BTreeSet<String> = primary_keys.keys().cloned().collect();
    assert_eq!(names, keys_after_waiting_workload());
    assert_eq!(snapshot_of_all_keys(&mut on_replica), primary_keys);
}

#[test]
fn a_timer_grant_replicates_as_one_multi_exec_of_effects() {
    let primary = Server::start_with(&PRIMARY_ARGS);
    let mut conn = primary.connection();
    let mut stream = ReplicationStream::attach(primary.port);

    // An anchor keeps the keys alive past the short holder's deadline, so that the grant itself
    // removes the expired holder (no key expiry races the timer).
    let fresh = FirstGrant::before(&mut conn);
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR ts 2 60 ID anchor");
    let first = fresh.holder(&mut conn, "ts", "anchor");
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR ts 2 0.3 ID short");
    let _: () = cmd(&mut conn, "SET before-grant 1");
    assert_no_sem_command(&stream.commands_until_set("before-grant"));

    let line = "SEM.ACQUIREFAIR ts 2 120 ID w WAIT 5 WITHTICKET";
    let waiter = queue(&primary, &mut conn, line);
    assert_eq!(waiter.reply(), ticket("w", first as u64 + 2));
    let _: () = cmd(&mut conn, "SET after-grant 1");
    let commands: Vec<Command> = stream
        .commands_until_set("after-grant")
        .into_iter()
        .filter(|command| !command[0].eq_ignore_ascii_case("PING"))
        .collect();

    // Everything between the two markers is the timer's grant, as one transaction.
    let deadline = deadline_of(&mut conn, "ts", "w");
    for key in ["ts", "ts:owner"] {
        let expire_at: i64 = cmd(&mut conn, &format!("PEXPIRETIME {key}"));
        assert_eq!(expire_at, deadline, "{key}");
    }
    let command = |line: &str| -> Command { words(line).into_iter().map(String::from).collect() };
    assert!(commands.len() > 2, "{commands:?}");
    assert_eq!(commands[0], command("MULTI"), "{commands:?}");
    assert_eq!(
        commands[commands.len() - 1],
        command("EXEC"),
        "{commands:?}"
    );
    let mut effects: Vec<Command> = commands[1..commands.len() - 1].to_vec();
    assert_no_sem_command(&effects);
    for effect in &mut effects {
        effect[0] = effect[0].to_uppercase();
        // Scores as numbers: "1.7e12" and "1700000000000" are the same deadline.
        if effect[0] == "ZADD" {
            let score: f64 = effect[2].parse().expect("a ZADD score");
            effect[2] = (score as i64).to_string();
        }
    }
    let expected: Vec<Command> = [
        "ZREM ts short".to_string(),
        "ZREM ts:owner short".to_string(),
        format!("ZADD ts {deadline} w"),
        format!("ZADD ts:owner {} w", first + 2),
        format!("SET ts:counter {} KEEPTTL", first + 2),
        format!("PEXPIREAT ts {deadline}"),
        format!("PEXPIREAT ts:owner {deadline}"),
    ]
    .iter()
    .map(|line| command(line))
    .collect();
    let sorted = |commands: &[Command]| {
        let mut commands = commands.to_vec();
        commands.sort();
        commands
    };
    assert_eq!(sorted(&effects), sorted(&expected), "{effects:?}");
}

#[test]
fn an_aof_reload_after_waits_restores_exactly_the_same_keys() {
    let server = Server::start_with(&AOF_ARGS);
    let mut conn = server.connection();
    waiting_workload(&server, &mut conn);
    let before = snapshot_of_all_keys(&mut conn);
    let names: BTreeSet<String> = before.keys().cloned().collect();
    assert_eq!(names, keys_after_waiting_workload());
    drop(conn);

    let dir = server.stop();
    assert_no_sem_command(&aof_commands(&dir));
    let restarted = Server::restart_in(&dir, &AOF_ARGS);
    let mut conn = restarted.connection();
    assert_eq!(snapshot_of_all_keys(&mut conn), before);
}

// ---------------------------------------------------------------------------------------------
// 9. Load
// ---------------------------------------------------------------------------------------------

const LOAD_CLIENTS: usize = 50;
const LOAD_LIMIT: i64 = 3;
const LOAD_FOR: Duration = Duration::from_secs(2);
/// Long enough that every permit is given back by SEM.RELEASE.
const LOAD_LEASE_MS: i64 = 10_000;

#[derive(Debug, Default)]
struct Tally {
    grants: u64,
    timeouts: u64,
    max_inside: i64,
    /// Fair grants in this client's order: (ticket, grant time on the server's clock).
    tickets: Vec<(u64, i64)>,
}

/// One client: acquire with WAIT, enter the critical section (`<name>-inside` counts its
/// occupants), leave, release; until time is up.
fn load_client(server: &Server, command: &str, start: &Barrier) -> Tally {
    let fair = command == "SEM.ACQUIREFAIR";
    let name = if fair { "loadf" } else { "load" };
    let line = format!(
        "{command} {name} {LOAD_LIMIT} {} WAIT 5 {}",
        LOAD_LEASE_MS / 1000,
        if fair { "WITHTICKET" } else { "" }
    );
    let incr = format!("INCR {name}-inside");
    let decr = format!("DECR {name}-inside");
    let mut conn = server.connection();
    conn.set_read_timeout(Some(REPLY_TIMEOUT))
        .expect("read timeout");
    let mut tally = Tally::default();
    start.wait();
    let until = Instant::now() + LOAD_FOR;
    while Instant::now() < until {
        let holder = match acquire(&mut conn, &line) {
            Reply::Nil => {
                tally.timeouts += 1;
                continue;
            }
            Reply::Id(holder) => holder,
            Reply::Ticket(holder, ticket) => {
                let granted_at = deadline_of(&mut conn, name, &holder) - LOAD_LEASE_MS;
                tally.tickets.push((ticket, granted_at));
                holder
            }
            other => panic!("{line}: {other:?}"),
        };
        tally.grants += 1;
        let inside: i64 = cmd(&mut conn, &incr);
        tally.max_inside = tally.max_inside.max(inside);
        let _: i64 = cmd(&mut conn, &decr);
        let released: i64 = cmd(&mut conn, &format!("SEM.RELEASE {name} {holder}"));
        assert_eq!(released, 1, "{holder} lost its permit before releasing it");
    }
    tally
}

fn load(command: &str) {
    let _quiet = timing();
    let fair = command == "SEM.ACQUIREFAIR";
    let name = if fair { "loadf" } else { "load" };
    let server = Server::start();
    let start = Barrier::new(LOAD_CLIENTS);
    let fresh = FirstGrant::before(&mut server.connection());
    let tallies: Vec<Tally> = thread::scope(|scope| {
        let clients: Vec<_> = (0..LOAD_CLIENTS)
            .map(|_| scope.spawn(|| load_client(&server, command, &start)))
            .collect();
        clients
            .into_iter()
            .map(|client| client.join().expect("a client panicked"))
            .collect()
    });
    let mut conn = server.connection();

    let grants: Vec<u64> = tallies.iter().map(|t| t.grants).collect();
    let total: u64 = grants.iter().sum();
    let max_inside = tallies.iter().map(|t| t.max_inside).max().unwrap_or(0);
    let timeouts: u64 = tallies.iter().map(|t| t.timeouts).sum();
    eprintln!(
        "{command} under load: {total} grants, {}..={} per client, at most {max_inside} \
         inside, {timeouts} timeouts",
        grants.iter().min().unwrap_or(&0),
        grants.iter().max().unwrap_or(&0)
    );
    assert!(max_inside <= LOAD_LIMIT, "limit exceeded: {max_inside}");
    assert!(max_inside > 1, "never two inside: no real contention");
    assert!(
        grants.iter().all(|&g| g > 0),
        "a client was never served: {grants:?}"
    );
    assert_eq!(timeouts, 0, "a wait of 5 s ran out during a 2 s load");
    assert_eq!(cmd::<i64>(&mut conn, &format!("SEM.GET {name}")), 0);
    assert_eq!(waiters_in_line(&mut conn, name), 0);
    assert_eq!(cmd::<i64>(&mut conn, &format!("GET {name}-inside")), 0);

    if fair {
        // Each client's tickets grow; all together they are exactly the `total` tickets from the
        // clock of the first grant on, and taken by ticket, their grant times never go back:
        // tickets follow the grant order.
        for tally in &tallies {
            assert!(
                tally.tickets.windows(2).all(|w| w[0].0 < w[1].0),
                "one client's tickets went back: {:?}",
                tally.tickets
            );
        }
        let by_ticket: BTreeMap<u64, i64> = tallies
            .iter()
            .flat_map(|t| t.tickets.iter().copied())
            .collect();
        assert_eq!(
            by_ticket.len() as u64,
            total,
            "a ticket was handed out twice"
        );
        let tickets: Vec<u64> = by_ticket.keys().copied().collect();
        let first = fresh.ticket(&mut conn, tickets[0] as i64) as u64;
        assert_eq!(tickets, (first..first + total).collect::<Vec<u64>>());
        let times: Vec<i64> = by_ticket.values().copied().collect();
        let back = times.windows(2).position(|w| w[0] > w[1]);
        assert_eq!(back, None, "a later ticket was granted earlier");
        assert_eq!(
            cmd::<u64>(&mut conn, "GET loadf:counter"),
            first + total - 1
        );
    }
}

#[test]
fn under_load_plain_waiters_stay_within_the_limit_and_all_get_served() {
    load("SEM.ACQUIRE");
}

#[test]
fn under_load_fair_waiters_get_tickets_in_grant_order() {
    load("SEM.ACQUIREFAIR");
}

/// Where the server can end them (Redis 8.2 and later: keyspace events; Redis 7.2 to 8.1 and
/// Valkey: the key server event), the module stops following changes to keys once a timer run
/// finds nobody waiting, and follows them again at the next wait; on Redis 7.0 it keeps
/// following them from the first wait on. Either way a waited semaphore that expires still serves its line at once.
#[test]
fn key_events_are_followed_again_after_nobody_waited() {
    let server = Server::start();
    let mut c = server.connection();
    let for_good = key_watch(&mut c, &[]) == Some(KeyWatch::KeyspaceForGood);
    let _: String = run(&mut c, &["SEM.ACQUIRE", "s", "1", "600", "ID", "h"]);
    // A wait that times out: the timer runs and finds nobody waiting any more.
    let none: Option<String> = run(&mut c, &["SEM.ACQUIRE", "s", "1", "60", "WAIT", "0.05"]);
    assert_eq!(none, None);
    wait_until("the timer is stopped", Duration::from_secs(10), || {
        info_sem(&mut c)["sem_armed_timers"] == 0
    });
    assert_eq!(
        info_sem(&mut c)["sem_event_subscriptions"],
        3 + u64::from(for_good),
        "loading, role change, config change (and keys, for good)"
    );
    let waiter = Pending::send(
        &server,
        &["SEM.ACQUIRE", "s", "1", "60", "ID", "w", "WAIT", "30"],
    );
    wait_until("the client waits", Duration::from_secs(10), || {
        info_sem(&mut c)["sem_waiters"] == 1
    });
    // The holder set expires long before the holder's lease or the wait's end.
    let started = std::time::Instant::now();
    let set: i64 = run(&mut c, &["PEXPIRE", "s", "100"]);
    assert_eq!(set, 1);
    let reply = waiter.reply().expect("granted");
    assert_eq!(reply, redis::Value::BulkString(b"w".to_vec()));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "served after {:?}",
        started.elapsed()
    );
}

/// The server events only the waiting side needs (flushes, swapped databases, connections
/// closing) cost every other command a walk of the listeners: the module follows them while
/// somebody waits or holds a BOUND permit, ends them right after the command that ended the
/// last wait or binding (before its reply), and follows them again for the next wait or BOUND
/// permit, which are served as before.
#[test]
fn waiting_events_end_after_the_last_wait_and_come_back_with_the_next() {
    let server = Server::start();
    let mut conn = server.connection();
    let subscriptions = |conn: &mut redis::Connection| info_sem(conn)["sem_event_subscriptions"];
    let resting = subscriptions(&mut conn);
    assert_eq!(resting, 3, "loading, role change and config change");
    // Followed for the rest of the load from the first wait on, where the server cannot end
    // them (src/server/events.rs).
    let for_good = u64::from(key_watch(&mut conn, &[]) == Some(KeyWatch::KeyspaceForGood));
    let keys = 1;

    // A wait that ends in a hand-off.
    let _: String = cmd(&mut conn, "SEM.ACQUIREFAIR fl 1 30 ID h");
    let w = queue(&server, &mut conn, "SEM.ACQUIREFAIR fl 1 30 ID w WAIT 10");
    assert_eq!(
        subscriptions(&mut conn),
        resting + 2 + keys,
        "flush, swap, keys"
    );
    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE fl h"), 1);
    let resting = resting + for_good;
    assert_eq!(subscriptions(&mut conn), resting);
    assert_eq!(info_sem(&mut conn)["sem_armed_timers"], 0);
    assert_eq!(w.reply(), id("w"));
    // A wait ended by a script's release (a script may run inside the server's walk of its
    // listeners: the timer ends the events, right after the command).
    let w = queue(&server, &mut conn, "SEM.ACQUIREFAIR fl 1 30 ID w1 WAIT 10");
    let released: i64 = run(
        &mut conn,
        &[
            "EVAL",
            "return redis.call('SEM.RELEASE', KEYS[1], 'w')",
            "1",
            "fl",
        ],
    );
    assert_eq!(released, 1);
    assert_eq!(subscriptions(&mut conn), resting);
    assert_eq!(info_sem(&mut conn)["sem_armed_timers"], 0);
    assert_eq!(w.reply(), id("w1"));
    // A wait that times out.
    let none: Option<String> = cmd(&mut conn, "SEM.ACQUIREFAIR fl 1 30 WAIT 0.05");
    assert_eq!(none, None);
    assert_eq!(subscriptions(&mut conn), resting);
    assert_eq!(info_sem(&mut conn)["sem_armed_timers"], 0);

    // The next wait follows flushes again.
    let w = queue(&server, &mut conn, "SEM.ACQUIREFAIR fl 1 30 ID w2 WAIT 10");
    let _: () = cmd(&mut conn, "FLUSHDB");
    assert_eq!(w.reply(), id("w2"));
    assert_eq!(subscriptions(&mut conn), resting);

    // A BOUND permit follows connections closing, and flushes, until it is given back.
    let mut bound = server.connection();
    let _: String = cmd(&mut bound, "SEM.ACQUIRE b 2 60 ID x BOUND");
    assert_eq!(subscriptions(&mut conn), resting + 3);
    drop(bound);
    wait_until("the permit is given back", EVENTUALLY, || {
        holders(&mut conn, "b").is_empty()
    });
    assert_eq!(subscriptions(&mut conn), resting);
    let mut bound = server.connection();
    let _: String = cmd(&mut bound, "SEM.ACQUIRE b 2 60 ID y BOUND");
    drop(bound);
    wait_until("the permit is given back again", EVENTUALLY, || {
        holders(&mut conn, "b").is_empty()
    });
    // A BOUND permit released by its holder ends them as well.
    let _: String = cmd(&mut conn, "SEM.ACQUIRE b 2 60 ID z BOUND");
    assert_eq!(subscriptions(&mut conn), resting + 3);
    assert_eq!(cmd::<i64>(&mut conn, "SEM.RELEASE b z"), 1);
    assert_eq!(subscriptions(&mut conn), resting);
    // A BOUND acquire that is refused follows nothing.
    let _: String = cmd(&mut conn, "SEM.ACQUIRE full 1 60 ID z");
    let refused: Option<String> = cmd(&mut conn, "SEM.ACQUIRE full 1 60 BOUND");
    assert_eq!(refused, None);
    assert_eq!(subscriptions(&mut conn), resting);
    assert_eq!(info_sem(&mut conn)["sem_armed_timers"], 0);
}
