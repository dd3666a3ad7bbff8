//! Steps with waiters in the background: clients on their own connections blocked in
//! `SEM.ACQUIRE/ACQUIREFAIR ... WAIT` or in `SEM.WAITEMPTY`, read later, while the run goes on with the waited name's
//! keys (other clients' reads and writes, releases, refreshes, leases running out); and a timer
//! storm (many leases ending in the same millisecond, with waiters behind them).
//!
//! The module grants these waiters on its own, at instants no step chooses, so the per-step
//! model does not follow them: an episode is checked by invariants instead, and the model then
//! takes the keys read back at its end (every background reply is in by then). The checks:
//! - every waiter answers within its WAIT (plus slack), nil no earlier than its WAIT;
//! - a grant names the waiter's identifier, and while nobody could have removed it since, the
//!   holder set has it (with its permits), its lease starting after the wait began;
//! - the limit is never exceeded: at no instant do the permits of live holders the module
//!   granted add up to more than the limit (a holder another client removed counts as gone
//!   from the read before it), so no lease starts before the one it replaced ended;
//! - waiters are served in arrival order: a later waiter's lease starts no earlier than an
//!   earlier one's, and not before an earlier one that timed out stopped waiting;
//! - when another client deletes the semaphore's keys, the waiters at the head of the line that
//!   fit are granted at once; when it overwrites the holder set with a string, every waiter is
//!   answered WRONGTYPE by the line's next lease end or a waiter's timeout (the module does not
//!   follow writes of strings, hashes and sorted sets: src/server/events.rs);
//! - other clients' reads of the waited keys make the module serve no line
//!   (`sem_lines_served` stays put), when nothing else is due meanwhile;
//! - no key is empty, and the keys stay readable;
//! - in a storm, every waiter is granted, each lease starting at or after the deadline, and
//!   the module's timer ran;
//! - a wait for empty answers 1 only when no holder was live at some instant of its wait, and
//!   soon after the permits in use reached 0 (0 only if they never stayed at 0 before its
//!   timeout, as far as the reads tell); it is answered 1 at once when another client deletes
//!   the keys and nobody waits for permits; it holds no acquirer back (the arrival-order and
//!   timing checks above run with it in the episode);
//! - a set waiter (`SEM.ACQUIREALL` of the waited name and a fresh second one) is held to the
//!   same line, limit and timing rules as a single waiter on the waited name.

use std::collections::BTreeMap;
use std::io::Write;
use std::thread::{self, sleep, JoinHandle};
use std::time::{Duration, Instant};

use super::keyspace::{show, show_keys, time_ms, Bytes, Dump, Value};
use super::sem::{counter_key, deadline_ms, limit_key, owner_key, permits_key};
use super::steps::NAMES;
use super::wire::{cmd, pipeline, reply_of, show_command, Reply};
use super::Run;

/// How late past its WAIT a waiter may be answered (a shared, loaded machine).
const SLACK_MS: u64 = 600;
/// How late after its permits came free a waiter may be served (the timer's latency on a
/// loaded machine).
const TIMING_MS: i64 = 30;
/// How soon a change that must answer a waiter at once does so.
const PROMPT_MS: u64 = 600;

/// What a background connection's thread hands back: the connection, its CLIENT ID, the
/// reply, and when it arrived.
type Answer = (redis::Connection, i64, Result<Reply, String>, Instant);

pub struct Waiter {
    pub no: usize,
    pub args: Vec<Bytes>,
    pub id: Bytes,
    pub fair: bool,
    pub count: u64,
    pub lease_ms: i64,
    pub wait_ms: i64,
    pub with_ticket: bool,
    /// The server clock before it was sent, and once it was seen waiting (or answered): its
    /// wait began in between.
    pub since_lo: i64,
    pub since_hi: i64,
    pub sent_at: Instant,
    thread: Option<JoinHandle<Answer>>,
    pub answer: Option<(Reply, Instant)>,
    /// Its lease's start, from the holder set, once seen.
    pub start: Option<i64>,
    /// Destructive steps (releases, other clients' writes) done since it was sent.
    pub destroyed: bool,
    pub checked: bool,
    /// A SEM.WAITEMPTY waiter: it takes nothing, and waits in no line.
    pub for_empty: bool,
    /// A SEM.ACQUIREALL waiter: it also takes a permit of the episode's other semaphore.
    pub set: bool,
}

impl Waiter {
    fn granted(&self) -> bool {
        matches!(&self.answer, Some((reply, _)) if self.is_grant(reply))
    }

    /// Its wait ended without what it waited for (nil, or 0 for a wait for empty).
    fn timed_out(&self) -> bool {
        let nothing = if self.for_empty {
            Reply::Int(0)
        } else {
            Reply::Nil
        };
        matches!(&self.answer, Some((reply, _)) if *reply == nothing)
    }

    fn emptied(&self) -> bool {
        self.for_empty && matches!(&self.answer, Some((Reply::Int(1), _)))
    }

    fn is_grant(&self, reply: &Reply) -> bool {
        if self.for_empty {
            return false;
        }
        if self.set {
            return match reply {
                Reply::Bulk(id) => *id == self.id && !self.with_ticket,
                Reply::Array(items) if self.with_ticket => match items.as_slice() {
                    [Reply::Bulk(id), Reply::Array(tickets)] => {
                        *id == self.id
                            && tickets.len() == 2
                            && tickets.iter().all(|t| matches!(t, Reply::Int(t) if *t > 0))
                    }
                    _ => false,
                },
                _ => false,
            };
        }
        match reply {
            Reply::Bulk(id) => *id == self.id && !self.with_ticket,
            Reply::Array(items) if self.with_ticket => {
                matches!(items.as_slice(), [Reply::Bulk(id), Reply::Int(t)] if *id == self.id && *t > 0)
            }
            _ => false,
        }
    }

    fn describe(&self) -> String {
        let answer = match &self.answer {
            Some((reply, at)) => format!(
                "{reply} after {} ms",
                at.duration_since(self.sent_at).as_millis()
            ),
            None => "no answer yet".to_string(),
        };
        format!(
            "waiter #{} (wait began in {}..{}): {} -> {answer}",
            self.no,
            self.since_lo,
            self.since_hi,
            show_command(&self.args)
        )
    }
}

/// A holder's life as far as the reads tell: `start..end` (ms), with its permits.
#[derive(Clone, Debug)]
struct Span {
    start: i64,
    end: i64,
    weight: u64,
    fair: bool,
    gone: bool,
}

fn lease_text(ms: i64) -> Bytes {
    format!("{}.{:03}", ms / 1000, ms % 1000).into_bytes()
}

/// How long after `t1` the line of `name` is next served on its own: at its next lease end
/// after `t1` (from the holder set last read) or the timeout of one of `waiting`, whichever
/// comes first. A write the module does not follow is seen then.
fn next_serve_in(ep: &Episode, name: &[u8], waiting: &[usize], t1: i64) -> u64 {
    let lease_end = ep
        .dump
        .as_ref()
        .and_then(|d| zset_of(d, name))
        .and_then(|z| {
            z.iter()
                .map(|(_, score)| *score as i64)
                .filter(|&at| at > t1)
                .min()
        });
    let timeout = waiting
        .iter()
        .map(|&i| &ep.waiters[i])
        .filter(|w| w.wait_ms > 0)
        .map(|w| w.since_hi + w.wait_ms)
        .min();
    let due = [lease_end, timeout]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(t1);
    (due - t1).max(0) as u64
}

fn zset_of<'a>(dump: &'a Dump, key: &[u8]) -> Option<&'a super::keyspace::ZSet> {
    match dump.keys.get(key).map(|e| &e.value) {
        Some(Value::ZSet(z)) => Some(z),
        _ => None,
    }
}

fn info_field(info: &redis::Value, field: &str) -> Option<u64> {
    match info {
        redis::Value::BulkString(text) => String::from_utf8_lossy(text)
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{field}:")))
            .and_then(|n| n.trim().parse().ok()),
        _ => None,
    }
}

/// One background episode's state.
struct Episode {
    name: Bytes,
    limit: u64,
    log: Vec<String>,
    waiters: Vec<Waiter>,
    spans: BTreeMap<Bytes, Span>,
    /// The server clock of the last read-back.
    last_read: i64,
    dump: Option<Dump>,
    fair_granted: bool,
    flushed: bool,
    /// A second semaphore, fresh, that set waiters take a permit of besides (limit 4).
    other: Option<Bytes>,
    /// Only reads and time passing since the waiters came: nothing but a lease's end frees a
    /// permit, so when each waiter should be served is known.
    pure: bool,
}

impl Run {
    fn episode_fail(&mut self, ep: &Episode, what: &str, detail: &str) -> ! {
        let mut text = format!("a background episode on {}:\n", show(&ep.name));
        for line in &ep.log {
            text += &format!("      {line}\n");
        }
        text += "    the waiters:\n";
        for w in &ep.waiters {
            text += &format!("      {}\n", w.describe());
        }
        let keys = ep
            .dump
            .as_ref()
            .map(|d| show_keys(&d.keys))
            .unwrap_or_default();
        self.fail_described(
            &text,
            what,
            &format!("{detail}\nthe keys last read:\n{keys}"),
        )
    }

    /// A connection for a background waiter: an idle one, or a new one.
    fn background_connection(&mut self) -> (redis::Connection, i64) {
        if let Some(conn) = self.pool.pop() {
            return conn;
        }
        let mut conn = redis::Client::open(self.server.as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .expect("a background connection");
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        let id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query(&mut conn)
            .expect("CLIENT ID");
        (conn, id)
    }

    /// Runs `commands` on the main client between two TIME readings; logs them.
    fn episode_run(
        &mut self,
        ep: &mut Episode,
        commands: &[Vec<Bytes>],
    ) -> (i64, Vec<redis::Value>, i64) {
        let mut all = vec![cmd(&["TIME"])];
        all.extend(commands.iter().cloned());
        all.push(cmd(&["TIME"]));
        let mut replies = match pipeline(&mut self.main, &all) {
            Ok(replies) => replies,
            Err(e) => self.episode_fail(ep, "the server stopped answering", &format!("{e}")),
        };
        let t1 = time_ms(&replies.pop().expect("TIME")).expect("TIME");
        let t0 = time_ms(&replies.remove(0)).expect("TIME");
        for (command, reply) in commands.iter().zip(&replies) {
            if command[0] != b"INFO" {
                ep.log.push(format!(
                    "[{t0}..{t1}] {} -> {}",
                    show_command(command),
                    reply_of(reply)
                ));
            }
        }
        (t0, replies, t1)
    }

    /// Sends `args` on a background connection and returns once the server has it waiting
    /// (or answered it), so that waiters arrive in the order sent.
    fn send_waiter(&mut self, ep: &mut Episode, mut waiter: Waiter) {
        let (t0, _, _) = self.episode_run(ep, &[]);
        waiter.since_lo = t0;
        let (mut conn, client_id) = self.background_connection();
        let args = waiter.args.clone();
        waiter.sent_at = Instant::now();
        waiter.thread = Some(thread::spawn(move || {
            let reply = pipeline(&mut conn, &[args])
                .map(|r| reply_of(&r[0]))
                .map_err(|e| e.to_string());
            (conn, client_id, reply, Instant::now())
        }));
        ep.log.push(format!(
            "waiter #{} sends {}",
            waiter.no,
            show_command(&waiter.args)
        ));
        let list = cmd(&["CLIENT", "LIST", "ID", &client_id.to_string()]);
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            let finished = waiter.thread.as_ref().is_some_and(|t| t.is_finished());
            let (_, replies, t1) = self.episode_run(ep, std::slice::from_ref(&list));
            waiter.since_hi = t1;
            let blocked = match &replies[0] {
                redis::Value::BulkString(text) => String::from_utf8_lossy(text)
                    .split_whitespace()
                    .any(|f| f.strip_prefix("flags=").is_some_and(|f| f.contains('b'))),
                _ => false,
            };
            if finished || blocked {
                break;
            }
            if Instant::now() > give_up {
                ep.waiters.push(waiter);
                self.episode_fail(ep, "a background waiter never reached the server", "");
            }
            sleep(Duration::from_micros(200));
        }
        ep.waiters.push(waiter);
        // Answered at once: taken in now, so that it counts as no longer waiting.
        let last = ep.waiters.len() - 1;
        self.take_answer(ep, last, None);
    }

    /// Takes in the answer of waiter `i` if it came (waiting for it until `until`, if given).
    fn take_answer(&mut self, ep: &mut Episode, i: usize, until: Option<Instant>) {
        if ep.waiters[i].answer.is_some() {
            return;
        }
        loop {
            let done = ep.waiters[i]
                .thread
                .as_ref()
                .is_some_and(|t| t.is_finished());
            if done {
                break;
            }
            match until {
                Some(at) if Instant::now() < at => sleep(Duration::from_millis(1)),
                _ => return,
            }
        }
        let thread = ep.waiters[i].thread.take().expect("a thread");
        let (conn, client_id, reply, at) = thread.join().expect("the waiter's thread");
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => self.episode_fail(ep, "a background waiter's connection failed", &e),
        };
        self.pool.push((conn, client_id));
        let w = &mut ep.waiters[i];
        ep.log.push(format!("waiter #{} answered {reply}", w.no));
        w.answer = Some((reply, at));
        let elapsed = at.duration_since(w.sent_at).as_millis() as i64;
        let (reply, _) = w.answer.clone().expect("an answer");
        let wait = w.wait_ms;
        let key = match &reply {
            Reply::Int(1) if w.for_empty => "background emptied",
            Reply::Int(0) if w.for_empty => "background not emptied",
            reply if w.is_grant(reply) && w.set => "background set granted",
            reply if w.is_grant(reply) => "background granted",
            Reply::Nil => "background timed out",
            Reply::Err(e) if e.starts_with("WRONGTYPE") => "background WRONGTYPE",
            _ => "background refused (other kind)",
        };
        *self.stats.background.entry(key).or_default() += 1;
        let for_empty = w.for_empty;
        let problem = match &reply {
            Reply::Int(0) if for_empty && elapsed < wait - 2 => Some(format!(
                "0 after {elapsed} ms, before its timeout of {wait} ms"
            )),
            Reply::Int(0 | 1) if for_empty => None,
            Reply::Err(e) if for_empty && e.starts_with("WRONGTYPE") => None,
            reply if for_empty => Some(format!(
                "a reply that is no answer of a wait for empty: {reply}"
            )),
            Reply::Nil if elapsed < wait - 2 => Some(format!(
                "nil after {elapsed} ms, before its WAIT of {wait} ms"
            )),
            Reply::Err(e) if e.starts_with("WRONGTYPE") || e.contains("holders") => None,
            Reply::Err(e) => Some(format!("an unexpected error: {e}")),
            Reply::Nil => None,
            reply if ep.waiters[i].is_grant(reply) => None,
            reply => Some(format!(
                "a reply that is no grant of its identifier: {reply}"
            )),
        };
        if let Some(problem) = problem {
            self.episode_fail(ep, "a background waiter's reply is wrong", &problem);
        }
    }

    /// Every answer in so far, then the keys read back and checked.
    fn episode_observe(&mut self, ep: &mut Episode) {
        for i in 0..ep.waiters.len() {
            self.take_answer(ep, i, None);
        }
        let dump = self.read_back();
        ep.log.push(format!("(keys read at {})", dump.time_ms));
        ep.dump = Some(dump.clone());
        if !dump.problems.is_empty() {
            let problems = dump.problems.join("\n");
            self.episode_fail(ep, "a key is broken (invariant 3)", &problems);
        }
        let name = ep.name.clone();
        let holders = zset_of(&dump, &name).cloned();
        if ep.pure {
            self.check_expiry(ep, &dump);
        }
        // The grants answered since the last read: their holders, unless removed since.
        for i in 0..ep.waiters.len() {
            let w = &ep.waiters[i];
            if w.checked || !w.granted() {
                continue;
            }
            let score = holders.as_ref().and_then(|z| z.score(&w.id));
            let problem = match score {
                Some(score) => {
                    let start = deadline_ms(score) - w.lease_ms;
                    ep.waiters[i].start = Some(start);
                    let w = &ep.waiters[i];
                    if start < w.since_lo || start > dump.time_ms {
                        Some(format!(
                            "waiter #{}'s lease starts at {start}, outside {}..{} (its wait \
                             began, the keys were read)",
                            w.no, w.since_lo, dump.time_ms
                        ))
                    } else {
                        None
                    }
                }
                // Gone: only another step, or its lease's end, may have removed it.
                None if !w.destroyed && dump.time_ms - w.lease_ms < w.since_lo => Some(format!(
                    "waiter #{} was granted, but its identifier is not in the holder set",
                    w.no
                )),
                None => None,
            };
            let w = &ep.waiters[i];
            let weight_ok = w.count < 2 || w.destroyed || score.is_none() || {
                let field = match dump.keys.get(&permits_key(&name)).map(|e| &e.value) {
                    Some(Value::Hash(fields)) => {
                        fields.iter().find(|(f, _)| *f == w.id).map(|(_, v)| v)
                    }
                    _ => None,
                };
                field.is_some_and(|v| *v == w.count.to_string().into_bytes())
            };
            let problem = problem.or_else(|| {
                (!weight_ok).then(|| format!("waiter #{}'s permits are not recorded", w.no))
            });
            if let Some(problem) = problem {
                self.episode_fail(ep, "a background grant is not in the keys", &problem);
            }
            ep.waiters[i].checked = true;
        }
        // The holders' lives, for the limit: granted ones appear, removed ones end (at the
        // latest at the read before, which is what counts as their end).
        let previous = ep.last_read;
        for (id, span) in ep.spans.iter_mut() {
            match holders.as_ref().and_then(|z| z.score(id)) {
                Some(score) if !span.gone => span.end = deadline_ms(score),
                // In a pure episode only its lease's end removes a holder.
                _ if !span.gone => {
                    span.gone = true;
                    if !ep.pure {
                        span.end = span.end.min(previous);
                    }
                }
                _ => {}
            }
        }
        for w in &ep.waiters {
            if let (Some(start), true, false) = (w.start, w.granted(), ep.spans.contains_key(&w.id))
            {
                ep.spans.insert(
                    w.id.clone(),
                    Span {
                        start,
                        end: start + w.lease_ms,
                        weight: w.count,
                        fair: w.fair,
                        gone: holders.as_ref().and_then(|z| z.score(&w.id)).is_none(),
                    },
                );
            }
        }
        ep.last_read = dump.time_ms;
    }

    /// While only the module wrote the name's keys, they expire at its latest deadline
    /// (invariant 4), whoever made the last grant: a command or the timer.
    fn check_expiry(&mut self, ep: &Episode, dump: &Dump) {
        let Some(holders) = dump.keys.get(&ep.name) else {
            return;
        };
        let latest = match &holders.value {
            Value::ZSet(z) => z.highest_score().map(deadline_ms),
            _ => None,
        };
        for key in [ep.name.clone(), owner_key(&ep.name), permits_key(&ep.name)] {
            let expire = dump.keys.get(&key).map(|e| e.expire);
            if expire.is_some_and(|at| at != latest) {
                let detail = format!(
                    "{} expires at {:?}, the latest deadline is {latest:?}",
                    show(&key),
                    expire.flatten()
                );
                self.episode_fail(
                    ep,
                    "a set only the module wrote does not expire at its latest deadline",
                    &detail,
                );
            }
        }
    }

    /// Whether the name's line may be served during `t0..t1` for a reason other than a read:
    /// a wait ending, a lease ending, a key expiring.
    fn something_due(ep: &Episode, t0: i64, t1: i64) -> bool {
        let (lo, hi) = (t0 - 10, t1 + 3);
        let waiting = ep.waiters.iter().filter(|w| w.answer.is_none());
        let ends = waiting
            .clone()
            .any(|w| w.since_lo + w.wait_ms <= hi && w.since_hi + w.wait_ms >= lo);
        let Some(dump) = &ep.dump else { return true };
        let expiring = [
            ep.name.clone(),
            owner_key(&ep.name),
            counter_key(&ep.name),
            permits_key(&ep.name),
        ]
        .iter()
        .filter_map(|k| dump.keys.get(k).and_then(|e| e.expire))
        .any(|at| at <= hi);
        let leases = [ep.name.clone(), owner_key(&ep.name)].iter().any(|k| {
            zset_of(dump, k).is_some_and(|z| {
                z.iter()
                    .any(|(_, s)| deadline_ms(*s) >= lo && deadline_ms(*s) <= hi)
            })
        });
        ends || expiring || leases
    }

    /// Other clients read the waited keys: no line is served for it.
    fn episode_reads(&mut self, ep: &mut Episode) {
        let name = ep.name.clone();
        let n = String::from_utf8_lossy(&name).to_string();
        let (owner, counter, permits) = (
            String::from_utf8_lossy(&owner_key(&name)).to_string(),
            String::from_utf8_lossy(&counter_key(&name)).to_string(),
            String::from_utf8_lossy(&permits_key(&name)).to_string(),
        );
        let choices = [
            cmd(&["EXISTS", &n, &owner, &counter, &permits]),
            cmd(&["TYPE", &n]),
            cmd(&["ZRANGE", &n, "0", "-1", "WITHSCORES"]),
            cmd(&["GET", &counter]),
            cmd(&["HGETALL", &permits]),
            cmd(&["PTTL", &n]),
            cmd(&["SEM.GET", &n]),
            cmd(&["SEM.GET", &n, "JSON"]),
            cmd(&["ZSCORE", &owner, "f0"]),
        ];
        let mut commands = vec![cmd(&["INFO", "sem"])];
        for _ in 0..self.rng.range(1, 4) {
            commands.push(self.rng.pick(&choices).clone());
        }
        commands.push(cmd(&["INFO", "sem"]));
        let (t0, replies, t1) = self.episode_run(ep, &commands);
        let before = info_field(&replies[0], "sem_lines_served");
        let after = info_field(&replies[replies.len() - 1], "sem_lines_served");
        if Self::something_due(ep, t0, t1) {
            return;
        }
        *self
            .stats
            .background
            .entry("quiet reads checked")
            .or_default() += 1;
        if before.is_none() || before != after {
            self.episode_fail(
                ep,
                "other clients' reads of waited keys made the module serve a line",
                &format!("sem_lines_served {before:?} before the reads, {after:?} after"),
            );
        }
    }

    /// The waiters still waiting must be answered within `later_ms` of now (and the slack):
    /// each checked by `ok`.
    fn expect_by(
        &mut self,
        ep: &mut Episode,
        which: &[usize],
        t1: i64,
        later_ms: u64,
        what: &str,
        ok: impl Fn(&Waiter) -> bool,
    ) {
        let until = Instant::now() + Duration::from_millis(PROMPT_MS + later_ms);
        for &i in which {
            self.take_answer(ep, i, Some(until));
            let w = &ep.waiters[i];
            // A wait that ends about now (or before the answer is due) may end first.
            let may_end = w.since_hi + w.wait_ms <= t1 + later_ms as i64 + 5;
            if w.answer.is_none() || !(ok(w) || (may_end && w.timed_out())) {
                let detail = format!("waiter #{} did not get {what} at once", w.no);
                self.episode_fail(ep, "another client's change was not served", &detail);
            }
        }
    }

    /// Another client writes the waited keys.
    fn episode_write(&mut self, ep: &mut Episode) {
        let name = ep.name.clone();
        for i in 0..ep.waiters.len() {
            self.take_answer(ep, i, None);
        }
        let pending: Vec<usize> = (0..ep.waiters.len())
            .filter(|&i| ep.waiters[i].answer.is_none() && !ep.waiters[i].for_empty)
            .collect();
        let empties: Vec<usize> = (0..ep.waiters.len())
            .filter(|&i| ep.waiters[i].answer.is_none() && ep.waiters[i].for_empty)
            .collect();
        let far = (ep.last_read + 600_000).to_string().into_bytes();
        let members: Vec<Bytes> = ep
            .dump
            .as_ref()
            .and_then(|d| zset_of(d, &name))
            .map(|z| z.iter().map(|(m, _)| m.clone()).collect())
            .unwrap_or_default();
        let kind = self.rng.weighted(&[
            (30, "wipe"),
            (14, "string"),
            (14, "intruder"),
            (12, "zrem"),
            (8, "extra"),
            (10, "pexpire"),
            (8, "rename"),
            (4, "flush"),
        ]);
        let command = match kind {
            "wipe" => vec![
                b"DEL".to_vec(),
                name.clone(),
                owner_key(&name),
                permits_key(&name),
            ],
            "string" => vec![b"SET".to_vec(), name.clone(), b"x".to_vec()],
            "intruder" => vec![b"ZADD".to_vec(), name.clone(), far, b"intruder".to_vec()],
            "zrem" if !members.is_empty() => {
                vec![
                    b"ZREM".to_vec(),
                    name.clone(),
                    self.rng.pick(&members).clone(),
                ]
            }
            "extra" => vec![
                b"HSET".to_vec(),
                permits_key(&name),
                Vec::new(),
                self.rng.range(1, 2).to_string().into_bytes(),
            ],
            "pexpire" => vec![
                b"PEXPIRE".to_vec(),
                name.clone(),
                self.rng.range(1, 40).to_string().into_bytes(),
            ],
            "rename" => vec![b"RENAME".to_vec(), name.clone(), counter_key(&name)],
            "flush" => cmd(&["FLUSHDB"]),
            _ => vec![b"ZREM".to_vec(), name.clone(), b"f0".to_vec()],
        };
        let counter_ok = ep.dump.as_ref().is_some_and(|d| {
            matches!(
                d.keys.get(&counter_key(&name)).map(|e| &e.value),
                None | Some(Value::Str(_))
            )
        });
        let (_, replies, t1) = self.episode_run(ep, &[command]);
        for w in ep.waiters.iter_mut() {
            w.destroyed = true;
        }
        if kind == "flush" && !matches!(reply_of(&replies[0]), Reply::Err(_)) {
            ep.flushed = true;
        }
        // Every server serves a wiped line at once (src/server/events.rs).
        let wipe_later = 0;
        match kind {
            // The waiters at the head of the line that fit an empty semaphore are granted at
            // once (as long as its kind is theirs), their leases starting no earlier.
            "wipe" if !pending.is_empty() => {
                let head_fair = ep.waiters[pending[0]].fair;
                let mut used = 0;
                let mut granted = Vec::new();
                for &i in &pending {
                    let w = &ep.waiters[i];
                    if w.fair != head_fair || used + w.count > ep.limit {
                        break;
                    }
                    used += w.count;
                    granted.push(i);
                }
                if head_fair && !counter_ok {
                    return;
                }
                *self.stats.background.entry("wipes served").or_default() += 1;
                // One answered just before (not yet taken in) fits too: it was granted then.
                self.expect_by(ep, &granted, t1, wipe_later, "a permit", |w| w.granted());
            }
            // Nobody waits for permits: the semaphore is empty from the deletion on.
            "wipe" if !empties.is_empty() => {
                *self.stats.background.entry("wipes emptied").or_default() += 1;
                self.expect_by(ep, &empties, t1, wipe_later, "1", |w| w.emptied());
            }
            "string" if !pending.is_empty() || !empties.is_empty() => {
                let pending: Vec<usize> = pending.iter().chain(&empties).copied().collect();
                *self
                    .stats
                    .background
                    .entry("overwrites served")
                    .or_default() += 1;
                // The module does not follow writes of strings: the line is served when it is
                // next served anyway.
                let later = next_serve_in(ep, &name, &pending, t1);
                // A grant answered just before the overwrite (not yet taken in) is no error.
                self.expect_by(ep, &pending, t1, later, "WRONGTYPE", |w| {
                    w.granted()
                        || w.emptied()
                        || matches!(&w.answer, Some((Reply::Err(e), _)) if e.starts_with("WRONGTYPE"))
                });
            }
            _ => {}
        }
    }

    pub fn background_episode(&mut self) {
        let free: Vec<Bytes> = NAMES
            .iter()
            .map(|n| n.as_bytes().to_vec())
            .filter(|n| !self.world.bindings.keys().any(|(name, _)| name == n))
            .collect();
        if free.is_empty() {
            return;
        }
        let name = self.rng.pick(&free).clone();
        let fair = self.rng.percent(50);
        let limit = self.rng.range(1, 3) as u64;
        let mut ep = Episode {
            name: name.clone(),
            limit,
            log: Vec::new(),
            waiters: Vec::new(),
            spans: BTreeMap::new(),
            last_read: 0,
            dump: None,
            fair_granted: false,
            flushed: false,
            other: None,
            pure: true,
        };
        // Now and then a second name for set waiters (fresh too, so that it never stops one).
        let others: Vec<&Bytes> = free.iter().filter(|n| **n != name).collect();
        if !others.is_empty() && self.rng.percent(30) {
            ep.other = Some((*self.rng.pick(&others)).clone());
        }
        // A fresh semaphore, filled (mostly) by the main client.
        let mut fresh = vec![b"DEL".to_vec()];
        for n in std::iter::once(&name).chain(&ep.other) {
            fresh.extend([
                n.clone(),
                owner_key(n),
                counter_key(n),
                permits_key(n),
                limit_key(n),
            ]);
        }
        self.episode_run(&mut ep, &[fresh]);
        let fills = if self.rng.percent(75) {
            limit
        } else {
            limit - 1
        };
        let acquire = if fair {
            "SEM.ACQUIREFAIR"
        } else {
            "SEM.ACQUIRE"
        };
        for j in 0..fills {
            let id = format!("f{j}").into_bytes();
            let lease = self.rng.range(20, 150);
            let command = vec![
                acquire.as_bytes().to_vec(),
                name.clone(),
                limit.to_string().into_bytes(),
                lease_text(lease),
                b"ID".to_vec(),
                id.clone(),
            ];
            let (t0, replies, _) = self.episode_run(&mut ep, &[command]);
            if reply_of(&replies[0]) != Reply::Bulk(id.clone()) {
                self.episode_fail(&ep, "a fresh semaphore refused a permit", "");
            }
            ep.fair_granted |= fair;
            ep.spans.insert(
                id,
                Span {
                    start: t0,
                    end: t0 + lease,
                    weight: 1,
                    fair,
                    gone: false,
                },
            );
        }
        self.episode_observe(&mut ep);
        for _ in 0..self.rng.range(1, 4) as usize {
            if self.rng.percent(25) {
                self.send_empty_waiter(&mut ep);
            }
            let no = ep.waiters.len();
            // Set waiters keep the episode's kind, so that the other name never refuses one.
            let set = ep.other.is_some() && self.rng.percent(40);
            let w_fair = if set || self.rng.percent(85) {
                fair
            } else {
                !fair
            };
            let count = if limit >= 2 && self.rng.percent(15) {
                2
            } else {
                1
            };
            let lease_ms = self.rng.range(30, 200);
            let wait_ms = self.rng.range(20, 150);
            let with_ticket = w_fair && self.rng.percent(30);
            self.background_serial += 1;
            let id = format!("bg{}", self.background_serial).into_bytes();
            let mut args = vec![
                if w_fair {
                    b"SEM.ACQUIREFAIR".to_vec()
                } else {
                    b"SEM.ACQUIRE".to_vec()
                },
                name.clone(),
                limit.to_string().into_bytes(),
                lease_text(lease_ms),
                b"ID".to_vec(),
                id.clone(),
                b"WAIT".to_vec(),
                lease_text(wait_ms),
            ];
            if count > 1 {
                args.extend([b"COUNT".to_vec(), count.to_string().into_bytes()]);
            }
            if with_ticket {
                args.push(b"WITHTICKET".to_vec());
            }
            if let (true, Some(other)) = (set, &ep.other) {
                let mut parts = [
                    vec![
                        name.clone(),
                        limit.to_string().into_bytes(),
                        count.to_string().into_bytes(),
                    ],
                    vec![other.clone(), b"4".to_vec(), b"1".to_vec()],
                ];
                if self.rng.percent(50) {
                    parts.swap(0, 1);
                }
                args = vec![b"SEM.ACQUIREALL".to_vec(), b"2".to_vec()];
                args.extend(parts.into_iter().flatten());
                args.extend([
                    lease_text(lease_ms),
                    b"ID".to_vec(),
                    id.clone(),
                    b"WAIT".to_vec(),
                    lease_text(wait_ms),
                ]);
                if w_fair {
                    args.push(b"FAIR".to_vec());
                }
                if with_ticket {
                    args.push(b"WITHTICKET".to_vec());
                }
                *self.stats.background.entry("set waiters").or_default() += 1;
            }
            let waiter = Waiter {
                no,
                args,
                id,
                fair: w_fair,
                count,
                lease_ms,
                wait_ms,
                with_ticket,
                since_lo: 0,
                since_hi: 0,
                sent_at: Instant::now(),
                thread: None,
                answer: None,
                start: None,
                destroyed: false,
                checked: false,
                for_empty: false,
                set,
            };
            self.send_waiter(&mut ep, waiter);
        }
        if self.rng.percent(30) {
            self.send_empty_waiter(&mut ep);
        }
        *self.stats.background.entry("waiters").or_default() += ep.waiters.len() as u64;

        // The run goes on with the waited name's keys.
        for _ in 0..self.rng.range(1, 5) {
            match self.rng.weighted(&[
                (30, "read"),
                (22, "write"),
                (18, "release"),
                (8, "refresh"),
                (22, "sleep"),
            ]) {
                "read" => self.episode_reads(&mut ep),
                "write" => {
                    ep.pure = false;
                    self.episode_write(&mut ep);
                }
                "release" | "refresh" if ep.dump.is_some() => {
                    ep.pure = false;
                    let refresh = self.rng.percent(30);
                    let members: Vec<Bytes> = ep
                        .dump
                        .as_ref()
                        .and_then(|d| zset_of(d, &name))
                        .map(|z| {
                            z.iter()
                                .map(|(m, _)| m.clone())
                                .filter(|m| !refresh || m.starts_with(b"f"))
                                .collect()
                        })
                        .unwrap_or_default();
                    let id = if members.is_empty() {
                        b"f0".to_vec()
                    } else {
                        self.rng.pick(&members).clone()
                    };
                    let command = if refresh {
                        let lease = lease_text(self.rng.range(20, 150));
                        vec![b"SEM.REFRESH".to_vec(), name.clone(), id, lease]
                    } else {
                        for w in ep.waiters.iter_mut() {
                            w.destroyed = true;
                        }
                        vec![b"SEM.RELEASE".to_vec(), name.clone(), id]
                    };
                    self.episode_run(&mut ep, &[command]);
                }
                _ => {
                    let ms = self.rng.range(5, 60);
                    ep.log.push(format!("(sleep {ms} ms)"));
                    sleep(Duration::from_millis(ms as u64));
                }
            }
            self.episode_observe(&mut ep);
        }

        // Every waiter answers within its WAIT and the slack; the keys are read after each
        // grant, before a later grant can prune its holder.
        loop {
            let answered = ep.waiters.iter().filter(|w| w.answer.is_some()).count();
            for i in 0..ep.waiters.len() {
                self.take_answer(&mut ep, i, None);
            }
            let now = Instant::now();
            let late = ep.waiters.iter().find(|w| {
                w.answer.is_none()
                    && now > w.sent_at + Duration::from_millis(w.wait_ms as u64 + SLACK_MS)
            });
            if let Some(w) = late {
                let detail = format!("waiter #{} is still waiting", w.no);
                self.episode_fail(&ep, "no reply within WAIT and the slack", &detail);
            }
            let now_answered = ep.waiters.iter().filter(|w| w.answer.is_some()).count();
            if now_answered > answered || now_answered == ep.waiters.len() {
                self.episode_observe(&mut ep);
            }
            if now_answered == ep.waiters.len() {
                break;
            }
            sleep(Duration::from_millis(1));
        }
        self.check_order(&ep);
        self.check_limit(&ep);
        self.check_timing(&ep);
        self.check_empty(&ep);
        ep.fair_granted |= ep.waiters.iter().any(|w| w.fair && w.granted());
        self.end_episode(ep, "background");
    }

    /// A client that waits for the episode's semaphore to empty.
    fn send_empty_waiter(&mut self, ep: &mut Episode) {
        let wait_ms = self.rng.range(20, 250);
        let args = vec![
            b"SEM.WAITEMPTY".to_vec(),
            ep.name.clone(),
            lease_text(wait_ms),
        ];
        let waiter = Waiter {
            no: ep.waiters.len(),
            args,
            id: Vec::new(),
            fair: false,
            count: 0,
            lease_ms: 0,
            wait_ms,
            with_ticket: false,
            since_lo: 0,
            since_hi: 0,
            sent_at: Instant::now(),
            thread: None,
            answer: None,
            start: None,
            destroyed: false,
            checked: false,
            for_empty: true,
            set: false,
        };
        *self
            .stats
            .background
            .entry("waiters for empty")
            .or_default() += 1;
        self.send_waiter(ep, waiter);
    }

    /// In a pure episode the holders' lives are known: a wait for empty answers 1 only if no
    /// holder was live at some instant between its arrival and its answer, and soon after one
    /// was; 0 only if the permits in use never stayed at 0 before its timeout. (A lease that
    /// ends as a waiter for permits is granted leaves no instant at 0: that gap is allowed.)
    fn check_empty(&mut self, ep: &Episode) {
        let unknown = ep.waiters.iter().any(|w| w.granted() && w.start.is_none());
        if !ep.pure || unknown {
            return;
        }
        let spans: Vec<&Span> = ep.spans.values().collect();
        let empty_at = |t: i64| !spans.iter().any(|s| s.start <= t && t < s.end);
        // A lease that starts in the very millisecond may have started after the answer.
        let maybe_empty = |t: i64| !spans.iter().any(|s| s.start < t && t < s.end);
        // Empty from `t` for longer than the timer's latency: nothing fills it at once.
        let stays_empty = |t: i64| {
            empty_at(t)
                && !spans
                    .iter()
                    .any(|s| s.start > t && s.start <= t + TIMING_MS)
        };
        for w in ep.waiters.iter().filter(|w| w.for_empty) {
            let Some((reply, at)) = &w.answer else {
                continue;
            };
            // The server's clock at the answer, about: the wait began at `since_lo` or later.
            let answered = w.since_lo + at.duration_since(w.sent_at).as_millis() as i64;
            let ends = |from: i64, to: i64| {
                std::iter::once(from)
                    .chain(spans.iter().map(|s| s.end))
                    .filter(move |&t| t >= from && t <= to)
            };
            let first_empty = ends(w.since_hi, w.since_lo + w.wait_ms - TIMING_MS)
                .filter(|&t| stays_empty(t))
                .min();
            *self
                .stats
                .background
                .entry("waits for empty timed")
                .or_default() += 1;
            let problem = match reply {
                Reply::Int(1) if !ends(w.since_lo, answered + TIMING_MS).any(maybe_empty) => Some(
                    format!(
                        "waiter #{} was answered 1 (at about {answered}), but a holder was live                          all along",
                        w.no
                    ),
                ),
                Reply::Int(1) => match first_empty {
                    Some(e) if answered > e + PROMPT_MS as i64 => Some(format!(
                        "waiter #{} was answered 1 at about {answered}, the semaphore was empty                          from {e}",
                        w.no
                    )),
                    _ => None,
                },
                Reply::Int(0) => first_empty.map(|e| {
                    format!(
                        "waiter #{} timed out, but the semaphore was empty from {e}",
                        w.no
                    )
                }),
                _ => None,
            };
            if let Some(problem) = problem {
                let lives: Vec<String> = ep
                    .spans
                    .iter()
                    .map(|(id, s)| format!("{} {}..{} x{}", show(id), s.start, s.end, s.weight))
                    .collect();
                self.episode_fail(
                    ep,
                    "a wait for empty was answered wrong",
                    &format!(
                        "{problem}
the holders' lives: {}",
                        lives.join(", ")
                    ),
                );
            }
        }
    }

    /// Waiters are served in arrival order (one line per semaphore).
    fn check_order(&mut self, ep: &Episode) {
        for (i, a) in ep.waiters.iter().enumerate() {
            if a.for_empty {
                continue;
            }
            for b in &ep.waiters[i + 1..] {
                let Some(start_b) = b.start else { continue };
                let problem = match (&a.answer, a.start) {
                    (_, Some(start_a)) if start_a > start_b => Some(format!(
                        "waiter #{}'s lease starts at {start_a}, after that of waiter #{} \
                         (at {start_b}) which came later",
                        a.no, b.no
                    )),
                    (Some((Reply::Nil, _)), _) if start_b < a.since_lo + a.wait_ms => {
                        Some(format!(
                            "waiter #{} was granted at {start_b}, before waiter #{} ahead of \
                             it stopped waiting (at {} or later)",
                            b.no,
                            a.no,
                            a.since_lo + a.wait_ms
                        ))
                    }
                    _ => None,
                };
                if let Some(problem) = problem {
                    self.episode_fail(ep, "waiters were not served in arrival order", &problem);
                }
            }
        }
    }

    /// In a pure episode, each waiter in line is served at the first instant its permits are
    /// free (within `TIMING_MS`), and times out only if they never were before its wait ended.
    fn check_timing(&mut self, ep: &Episode) {
        let unknown = ep.waiters.iter().any(|w| w.granted() && w.start.is_none());
        if !ep.pure || unknown {
            return;
        }
        *self
            .stats
            .background
            .entry("pure episodes timed")
            .or_default() += 1;
        // When the last of the waiters ahead left the line (at the earliest, at the latest).
        let mut ahead_left = (i64::MIN, i64::MIN);
        for (j, w) in ep.waiters.iter().enumerate() {
            let Some((reply, _)) = &w.answer else {
                continue;
            };
            if w.for_empty || matches!(reply, Reply::Err(_)) {
                // Refused at once: never in line.
                continue;
            }
            let later: Vec<&Bytes> = ep.waiters[j..].iter().map(|w| &w.id).collect();
            let others: Vec<&Span> = ep
                .spans
                .iter()
                .filter(|(id, _)| !later.contains(id))
                .map(|(_, s)| s)
                .collect();
            let fits = |t: i64| {
                let live = others.iter().filter(|s| s.start <= t && t < s.end);
                let used: u64 = live.clone().map(|s| s.weight).sum();
                live.clone().all(|s| s.fair == w.fair) && used + w.count <= ep.limit
            };
            // Permits only come free from here on (nobody behind is served first).
            let ready = w.since_hi.max(ahead_left.1);
            let first_fit = std::iter::once(ready)
                .chain(others.iter().map(|s| s.end).filter(|&end| end > ready))
                .filter(|&t| fits(t))
                .min()
                .expect("every lease ends");
            let problem = match w.start {
                Some(start) if w.granted() && start > first_fit + TIMING_MS => Some(format!(
                    "waiter #{} was granted at {start}, but its permits were free from {first_fit}",
                    w.no
                )),
                _ if *reply == Reply::Nil && first_fit + TIMING_MS < w.since_lo + w.wait_ms => {
                    Some(format!(
                        "waiter #{} timed out (at {} or later), but its permits were free from {first_fit}",
                        w.no,
                        w.since_lo + w.wait_ms
                    ))
                }
                _ => None,
            };
            if let Some(problem) = problem {
                let spans: Vec<String> = ep
                    .spans
                    .iter()
                    .map(|(id, s)| {
                        let kind = if s.fair { "fair" } else { "plain" };
                        format!("{} {}..{} x{} {kind}", show(id), s.start, s.end, s.weight)
                    })
                    .collect();
                let detail = format!(
                    "{problem}
the holders' lives: {}",
                    spans.join(", ")
                );
                self.episode_fail(
                    ep,
                    "a waiter was not served when its permits were free",
                    &detail,
                );
            }
            // Everyone ahead must have left before the next one is served.
            let left = match w.start {
                Some(start) => (start, start),
                None => (w.since_lo + w.wait_ms, w.since_hi + w.wait_ms + TIMING_MS),
            };
            ahead_left = (ahead_left.0.max(left.0), ahead_left.1.max(left.1));
        }
    }

    /// At no instant do live holders the module granted hold more permits than the limit.
    fn check_limit(&mut self, ep: &Episode) {
        for (id, span) in &ep.spans {
            let at = span.start;
            let live: Vec<(&Bytes, &Span)> = ep
                .spans
                .iter()
                .filter(|(_, s)| s.start <= at && at < s.end)
                .collect();
            let used: u64 = live.iter().map(|(_, s)| s.weight).sum();
            if used > ep.limit {
                let holders: Vec<String> = live
                    .iter()
                    .map(|(id, s)| format!("{} {}..{} x{}", show(id), s.start, s.end, s.weight))
                    .collect();
                let detail = format!(
                    "when {} was granted (at {at}), {used} permits were held: {}",
                    show(id),
                    holders.join(", ")
                );
                self.episode_fail(ep, "the limit was exceeded", &detail);
            }
        }
    }

    /// The model takes the keys as read at the end of an episode.
    fn end_episode(&mut self, ep: Episode, kind: &'static str) {
        let dump = ep.dump.clone().expect("keys read");
        if ep.flushed {
            self.world.bindings.clear();
        }
        for name in NAMES {
            let other = ep.other.as_deref() == Some(name.as_bytes());
            if ep.flushed || name.as_bytes() == ep.name.as_slice() || other || kind == "storm" {
                self.clean.remove(name.as_bytes());
            }
        }
        self.world.keys = dump.keys;
        self.encodings = dump.encodings;
        self.last_t1 = dump.time_ms;
        // Waiters served in the episode moved the node's floor past their tickets; it never
        // goes back.
        let floor = crate::info_sem(&mut self.main)["sem_ticket_floor"];
        if floor < self.world.fencing.floor {
            let detail = format!("the floor was {}, is {floor}", self.world.fencing.floor);
            self.episode_fail(&ep, "the fencing floor went back", &detail);
        }
        self.world.fencing.floor = floor;
        // Re-arm the watcher (the episode changed keys, which it need not tell).
        let mut watch = cmd(&["WATCH"]);
        watch.extend(self.universe.iter().cloned());
        let rearm = [cmd(&["MULTI"]), cmd(&["PING"]), cmd(&["EXEC"]), watch];
        if let Err(e) = pipeline(&mut self.watcher, &rearm) {
            self.episode_fail(&ep, "the server stopped answering", &format!("{e}"));
        }
        let line = format!(
            "#{} {kind} on {}: {} waiters\n      {}",
            self.step_no,
            show(&ep.name),
            ep.waiters.len(),
            ep.log.join("\n      ")
        );
        if let Some(trace) = &mut self.trace {
            let _ = writeln!(trace, "{line}");
        }
        self.history.push_back(line);
        if self.history.len() > super::HISTORY {
            self.history.pop_front();
        }
    }

    /// Many holders whose leases end in the same millisecond, on several names, with waiters
    /// behind them: after the deadline every waiter is granted, no lease starting before it.
    pub fn timer_storm(&mut self) {
        let free: Vec<Bytes> = NAMES
            .iter()
            .map(|n| n.as_bytes().to_vec())
            .filter(|n| !self.world.bindings.keys().any(|(name, _)| name == n))
            .collect();
        if free.is_empty() {
            return;
        }
        let total = self.rng.range(50, 300) as usize;
        let per_name = total / free.len();
        let mut ep = Episode {
            name: free[0].clone(),
            limit: per_name as u64,
            log: Vec::new(),
            waiters: Vec::new(),
            spans: BTreeMap::new(),
            last_read: 0,
            dump: None,
            fair_granted: false,
            flushed: false,
            other: None,
            pure: true,
        };
        let (now, replies, _) = self.episode_run(&mut ep, &[cmd(&["INFO", "sem"])]);
        let runs_before = info_field(&replies[0], "sem_timer_runs");
        let deadline = now + 150;
        // The recipe's layout, written directly: every lease ends at exactly `deadline`.
        let mut layout = Vec::new();
        for name in &free {
            layout.push(vec![
                b"DEL".to_vec(),
                name.clone(),
                owner_key(name),
                counter_key(name),
                permits_key(name),
                limit_key(name),
            ]);
            let mut zadd = vec![b"ZADD".to_vec(), name.clone()];
            for h in 0..per_name {
                zadd.push(deadline.to_string().into_bytes());
                zadd.push(format!("old{h}").into_bytes());
            }
            layout.push(zadd);
            layout.push(vec![
                b"PEXPIREAT".to_vec(),
                name.clone(),
                (deadline + 60_000).to_string().into_bytes(),
            ]);
        }
        let (_, replies, _) = self.episode_run(&mut ep, &layout);
        if let Some(err) = replies
            .iter()
            .map(reply_of)
            .find(|r| matches!(r, Reply::Err(_)))
        {
            self.episode_fail(&ep, "writing the storm's holders failed", &err.to_string());
        }
        let mut names_of = Vec::new();
        for (k, name) in free.iter().enumerate() {
            for _ in 0..self.rng.range(1, 3) {
                self.background_serial += 1;
                let id = format!("bg{}", self.background_serial).into_bytes();
                let lease_ms = self.rng.range(200, 500);
                let args = vec![
                    b"SEM.ACQUIRE".to_vec(),
                    name.clone(),
                    per_name.to_string().into_bytes(),
                    lease_text(lease_ms),
                    b"ID".to_vec(),
                    id.clone(),
                    b"WAIT".to_vec(),
                    b"1".to_vec(),
                ];
                let waiter = Waiter {
                    no: ep.waiters.len(),
                    args,
                    id,
                    fair: false,
                    count: 1,
                    lease_ms,
                    wait_ms: 1000,
                    with_ticket: false,
                    since_lo: 0,
                    since_hi: 0,
                    sent_at: Instant::now(),
                    thread: None,
                    answer: None,
                    start: None,
                    destroyed: false,
                    checked: false,
                    for_empty: false,
                    set: false,
                };
                self.send_waiter(&mut ep, waiter);
                names_of.push(k);
            }
        }
        *self.stats.background.entry("storm waiters").or_default() += ep.waiters.len() as u64;
        *self.stats.background.entry("storm holders").or_default() +=
            (per_name * free.len()) as u64;
        for i in 0..ep.waiters.len() {
            let until = ep.waiters[i].sent_at + Duration::from_millis(1000 + SLACK_MS);
            self.take_answer(&mut ep, i, Some(until));
        }
        let dump = self.read_back();
        ep.dump = Some(dump.clone());
        if !dump.problems.is_empty() {
            let problems = dump.problems.join("\n");
            self.episode_fail(&ep, "a key is broken (invariant 3)", &problems);
        }
        for (i, &k) in names_of.iter().enumerate() {
            let w = &ep.waiters[i];
            if !w.granted() {
                let detail = format!("waiter #{} was not granted", w.no);
                self.episode_fail(&ep, "a storm's waiter was not served", &detail);
            }
            let score = zset_of(&dump, &free[k]).and_then(|z| z.score(&w.id));
            let problem = match score {
                None => Some(format!(
                    "waiter #{}'s identifier is not in {}",
                    w.no,
                    show(&free[k])
                )),
                Some(s) if deadline_ms(s) - w.lease_ms < deadline => Some(format!(
                    "waiter #{}'s lease starts at {}, before the deadline {deadline}",
                    w.no,
                    deadline_ms(s) - w.lease_ms
                )),
                Some(_) => None,
            };
            if let Some(problem) = problem {
                self.episode_fail(&ep, "a storm's grant is wrong", &problem);
            }
        }
        let (_, replies, _) = self.episode_run(&mut ep, &[cmd(&["INFO", "sem"])]);
        let runs_after = info_field(&replies[0], "sem_timer_runs");
        if runs_before.is_none() || runs_after <= runs_before {
            let detail = format!("sem_timer_runs {runs_before:?} before, {runs_after:?} after");
            self.episode_fail(&ep, "the storm ran no timer", &detail);
        }
        self.end_episode(ep, "storm");
    }
}
