//! Checks one step against the model. The server's clock is known only to lie between two TIME
//! readings, so every instant of that window is tried: the instant Redis checks key expiry by
//! (fixed for the whole command, transaction or script) and, for each command, the instant the
//! module reads its clock (at or after the previous one). A step matches when some choice gives
//! exactly the replies and, read back, the keys the server has.

use std::collections::BTreeSet;

use super::keyspace::{compare, logical_view, show_keys, Bytes, Dump, Keyspace, Value};
use super::ops;
use super::sem::{
    arity_text, execute, execute_set, interpret, interpret_in_script, script_arity_text, Call,
    Client, Interp, Op, SetCall, SetOp, World,
};
use super::steps::{is_sem, Step};
use super::wire::{fits, Reply};

/// The transaction error after a queueing error.
const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";

/// Applications of a rule tried per step before giving up on it as inconclusive.
const BUDGET: usize = 400_000;

enum Action {
    Sem {
        interp: Interp,
        new_id: Bytes,
        /// A direct call with `WAIT ms` or a SEM.WAITEMPTY timeout (ms > 0): a full semaphore
        /// (or, for SEM.WAITEMPTY, one with a holder) blocks the caller.
        wait_ms: Option<i64>,
        client: Client,
    },
    Op(Vec<Bytes>),
    /// The main client's connection closed: its BOUND permits are given back, from the
    /// module's timer.
    GiveBack,
}

/// One possible outcome of an action: the reply, the world after, a label for the statistics,
/// and the module's latest clock reading.
type Outcome = (Reply, World, String, i64);

fn sem_outcome(
    interp: &Interp,
    new_id: &[u8],
    client: Client,
    world: &World,
    now: i64,
) -> (Reply, World, String) {
    match interp {
        Interp::RedisArity(cmd) => (
            Reply::Err(arity_text(*cmd)),
            world.clone(),
            "error: arity (redis)".to_string(),
        ),
        Interp::ScriptArity(_) => (
            Reply::Err(script_arity_text().into()),
            world.clone(),
            "error: arity (server, in a script)".to_string(),
        ),
        Interp::Refused(err) => (
            Reply::Err(err.text()),
            world.clone(),
            format!("error: {}", err.label()),
        ),
        Interp::Call(call) => {
            let mut after = world.clone();
            match execute(&mut after, call, now, new_id, client) {
                Ok((reply, effect)) => (reply, after, format!("{effect:?}")),
                Err(err) => (
                    Reply::Err(err.text()),
                    world.clone(),
                    format!("error: {}", err.label()),
                ),
            }
        }
        Interp::Set(set) => {
            let mut after = world.clone();
            match execute_set(&mut after, set, now, new_id, client) {
                Ok((reply, effect)) => (reply, after, format!("{effect:?}")),
                Err(err) => (
                    Reply::Err(err.text()),
                    world.clone(),
                    format!("error: {} (set)", err.label()),
                ),
            }
        }
    }
}

/// Adds `world` (reached at `t`) to `states` unless an equal one is there; keeps the earliest
/// time. Returns whether it must be (re)visited.
fn add_state(states: &mut Vec<(World, i64)>, world: World, t: i64) -> Option<usize> {
    match states.iter().position(|(w, _)| *w == world) {
        Some(i) if states[i].1 > t => {
            states[i].1 = t;
            Some(i)
        }
        Some(_) => None,
        None => {
            states.push((world, t));
            Some(states.len() - 1)
        }
    }
}

impl Action {
    /// Every outcome from `world` with the module's clock at `t_min` or later (up to `t1`).
    /// `t0`: the start of the step's window. Counts rule applications in `spent`.
    fn outcomes(
        &self,
        world: &World,
        t_min: i64,
        t0: i64,
        t1: i64,
        spent: &mut usize,
    ) -> Vec<Outcome> {
        match self {
            Action::Sem {
                interp,
                new_id,
                wait_ms: Some(wait_ms),
                ..
            } => blocking_outcomes(interp, new_id, *wait_ms, world, t_min, t0, t1, spent),
            Action::Sem {
                interp,
                new_id,
                client,
                ..
            } => {
                let times = if matches!(interp, Interp::Call(_) | Interp::Set(_)) {
                    t_min..=t1
                } else {
                    t_min..=t_min
                };
                times
                    .map(|t| {
                        *spent += 1;
                        let (reply, after, label) = sem_outcome(interp, new_id, *client, world, t);
                        (reply, after, label, t)
                    })
                    .collect()
            }
            Action::Op(args) => {
                let times = if ops::needs_time(args) {
                    t_min..=t1
                } else {
                    t_min..=t_min
                };
                let mut all = Vec::new();
                for t in times {
                    *spent += 1;
                    for (reply, keys) in ops::apply(&world.keys, args, t, t1) {
                        let mut after = world.with_keys(keys);
                        if args[0].eq_ignore_ascii_case(b"FLUSHDB") {
                            after.bindings.clear();
                        }
                        let command = String::from_utf8_lossy(&args[0]).to_uppercase();
                        let label = match reply {
                            Reply::Err(_) | Reply::AnyErr => format!("op {command}: error"),
                            _ => format!("op {command}"),
                        };
                        all.push((reply, after, label, t));
                    }
                }
                all
            }
            Action::GiveBack => (t_min..=t1)
                .map(|t| {
                    *spent += 1;
                    (Reply::Nil, give_back(world, t), "give back".to_string(), t)
                })
                .collect(),
        }
    }
}

/// The module's timer gives the main client's BOUND permits back: a release of each (in
/// binding order) at `now`, outside any command (keys whose expiry passed are gone).
fn give_back(world: &World, now: i64) -> World {
    let mut after = world.with_keys(logical_view(&world.keys, now));
    let given: Vec<(Bytes, Bytes)> = world
        .bindings
        .iter()
        .filter(|(_, client)| **client == Client::Main)
        .map(|(binding, _)| binding.clone())
        .collect();
    let others = world.bindings.clone();
    for (name, id) in &given {
        let call = Call {
            name: name.clone(),
            op: Op::Release {
                id: id.clone(),
                count: None,
            },
        };
        // A key of another type: nothing is given back.
        let _ = execute(&mut after, &call, now, b"", Client::Main);
    }
    // The give-back is no command: other bindings stay as they were.
    after.bindings = others;
    for binding in given {
        after.bindings.remove(&binding);
    }
    after
}

/// What a blocked caller waits for.
#[derive(Clone, Copy, PartialEq)]
enum Blocked {
    /// A single acquire: the timer's tries remove expired holders, and a head of the line of
    /// the other kind keeps waiting.
    Single,
    /// A set acquire: a try that does not fit everywhere changes nothing; an error ends it.
    Set,
    /// SEM.WAITEMPTY: answered 1 once no live holder is left, 0 at its timeout.
    Empty,
}

impl Blocked {
    fn of(interp: &Interp) -> Blocked {
        match interp {
            Interp::Set(_) => Blocked::Set,
            Interp::Call(Call {
                op: Op::WaitEmpty { .. },
                ..
            }) => Blocked::Empty,
            _ => Blocked::Single,
        }
    }

    /// The reply of a try that leaves the caller waiting.
    fn waiting(self) -> Reply {
        match self {
            Blocked::Empty => Reply::Int(0),
            _ => Reply::Nil,
        }
    }
}

/// A direct acquire with WAIT (or SEM.WAITEMPTY): tried at once; when full, the caller waits
/// while the module's timer tries again (at lease ends: here, at any later instant), each try
/// of a single acquire removing the expired holders, until a try grants the permit (finds the
/// semaphore empty) or fails, or the wait ends (nil, 0). The timer's tries run outside any
/// command, so keys whose expiry passed are gone for them.
#[allow(clippy::too_many_arguments)]
fn blocking_outcomes(
    interp: &Interp,
    new_id: &[u8],
    wait_ms: i64,
    world: &World,
    t_min: i64,
    t0: i64,
    t1: i64,
    spent: &mut usize,
) -> Vec<Outcome> {
    let blocked = Blocked::of(interp);
    let mut finals = Vec::new();
    let mut waiting: Vec<(World, i64)> = Vec::new();
    let mut todo: Vec<usize> = Vec::new();
    for t in t_min..=t1 {
        *spent += 1;
        let (reply, after, label) = sem_outcome(interp, new_id, Client::Main, world, t);
        if reply == blocked.waiting() {
            todo.extend(add_state(&mut waiting, after, t));
        } else {
            finals.push((reply, after, label, t));
        }
    }
    while let Some(i) = todo.pop() {
        let (state, from) = waiting[i].clone();
        for t in from..=t1 {
            *spent += 1;
            if *spent > BUDGET {
                return finals;
            }
            let view = state.with_keys(logical_view(&state.keys, t));
            let (reply, mut after, label) = sem_outcome(interp, new_id, Client::Main, &view, t);
            // A try of the timer that finds the holder set gone forgets the semaphore's
            // bindings (their permits went with it), even when it ends in an error or (for a
            // wait for empty, which reads only) answers.
            let names: Vec<&Bytes> = match interp {
                Interp::Call(call) => vec![&call.name],
                Interp::Set(SetCall { names, .. }) => names.iter().collect(),
                _ => vec![],
            };
            let forgets = match blocked {
                Blocked::Empty => reply != Reply::Int(0),
                _ => matches!(reply, Reply::Err(_)),
            };
            if forgets {
                for gone in names.iter().filter(|n| !view.keys.contains_key(**n)) {
                    after.bindings.retain(|(name, _), _| name != *gone);
                }
            }
            match reply {
                // The head of the line does not fit yet: it keeps waiting, nothing changed.
                Reply::Err(text)
                    if blocked == Blocked::Single
                        && (text.contains("live fair holders")
                            || text.contains("live plain holders")) => {}
                Reply::Nil if blocked == Blocked::Single => {
                    todo.extend(add_state(&mut waiting, after, t))
                }
                // Nothing changes while a set or a wait for empty keeps waiting, but a set's
                // try (at a lease end, or as another client's change is heard of) that finds a
                // holder set gone forgets that semaphore's bindings, and waits on.
                reply if reply == blocked.waiting() => {
                    if blocked == Blocked::Set {
                        let mut kept = state.clone();
                        for gone in names.iter().filter(|n| !view.keys.contains_key(**n)) {
                            kept.bindings.retain(|(name, _), _| name != *gone);
                        }
                        if kept.bindings != state.bindings {
                            todo.extend(add_state(&mut waiting, kept, t));
                        }
                    }
                }
                reply => finals.push((reply, after, format!("{label} after waiting"), t)),
            }
        }
    }
    if t1 >= t0 + wait_ms {
        for (state, t) in waiting {
            let label = match blocked {
                Blocked::Empty => "NotEmpty: waited, timed out",
                _ => "Full: waited, timed out",
            };
            finals.push((blocked.waiting(), state, label.into(), t));
        }
    }
    finals
}

/// What the server did in one step.
pub struct Observed<'a> {
    /// TIME just before and just after the step's commands.
    pub t0: i64,
    pub t1: i64,
    /// The replies of the step's commands, in order.
    pub replies: &'a [Reply],
    /// The keys read back after the step.
    pub dump: &'a Dump,
}

/// One way the model explains a step.
pub struct Match {
    pub post: World,
    /// Per command: what it did.
    pub labels: Vec<String>,
    /// The keys some command of the step changed (even if a later one changed them back).
    pub touched: BTreeSet<Bytes>,
}

struct Branch {
    world: World,
    t: i64,
    labels: Vec<String>,
    touched: BTreeSet<Bytes>,
}

pub enum Verdict {
    Matches(Vec<Match>),
    /// Too many instants to try (a very long window on a loaded machine).
    Inconclusive,
    Mismatch(String),
}

/// A step's plan: the replies expected before any rule runs (pattern, actual), and per command
/// the action and its actual reply.
type Plan = (Vec<(Reply, Reply)>, Vec<(Action, Reply)>);

/// The replies a step's commands must give before any rule runs, and the per-command checks.
fn plan(step: &Step, replies: &[Reply]) -> Result<Plan, String> {
    let new_id = |i: usize| format!("\0new{i}").into_bytes();
    let sem = |args: &Vec<Bytes>, i: usize, client: Client| Action::Sem {
        interp: match client {
            Client::Script => interpret_in_script(args),
            _ => interpret(args),
        },
        new_id: new_id(i),
        wait_ms: None,
        client,
    };
    // A direct call may block (WAIT ms, ms > 0); inside MULTI/EXEC or a script it cannot.
    let direct = |args: &Vec<Bytes>| {
        let interp = interpret(args);
        let wait_ms = match &interp {
            Interp::Call(Call {
                op: Op::Acquire {
                    wait_ms: Some(ms), ..
                },
                ..
            })
            | Interp::Call(Call {
                op: Op::WaitEmpty { wait_ms: ms },
                ..
            })
            | Interp::Set(SetCall {
                op: SetOp::Acquire {
                    wait_ms: Some(ms), ..
                },
                ..
            }) if *ms > 0 => Some(*ms),
            _ => None,
        };
        Action::Sem {
            interp,
            new_id: new_id(0),
            wait_ms,
            client: Client::Main,
        }
    };
    let mut fixed = Vec::new();
    let mut levels = Vec::new();
    match step {
        Step::Sleep(_) => {}
        Step::Reconnect => {
            fixed.push((Reply::Int(1), replies[0].clone()));
            levels.push((Action::GiveBack, Reply::Nil));
        }
        Step::Sem(args) => levels.push((direct(args), replies[0].clone())),
        Step::Op(args) => levels.push((Action::Op(args.clone()), replies[0].clone())),
        Step::Burst(cmds) => {
            for (i, (c, reply)) in cmds.iter().zip(replies).enumerate() {
                let action = match is_sem(c) {
                    true => sem(c, i, Client::Main),
                    false => Action::Op(c.clone()),
                };
                levels.push((action, reply.clone()));
            }
        }
        Step::Multi(cmds) => {
            let interps: Vec<Interp> = cmds.iter().map(|c| interpret(c)).collect();
            let queueing_error = interps.iter().any(|i| matches!(i, Interp::RedisArity(_)));
            fixed.push((Reply::Status("OK".into()), replies[0].clone()));
            for (i, interp) in interps.iter().enumerate() {
                let want = match interp {
                    Interp::RedisArity(cmd) => Reply::Err(arity_text(*cmd)),
                    _ => Reply::Status("QUEUED".into()),
                };
                fixed.push((want, replies[1 + i].clone()));
            }
            let exec = replies[1 + cmds.len()].clone();
            if queueing_error {
                fixed.push((Reply::Err(EXECABORT.into()), exec));
            } else {
                match exec {
                    Reply::Array(items) if items.len() == cmds.len() => {
                        for (i, (c, item)) in cmds.iter().zip(items).enumerate() {
                            levels.push((sem(c, i, Client::Main), item));
                        }
                    }
                    other => return Err(format!("EXEC replied {other}")),
                }
            }
        }
        Step::Eval(calls) => {
            if calls.len() == 1 {
                levels.push((sem(&calls[0], 0, Client::Script), replies[0].clone()));
            } else {
                match &replies[0] {
                    Reply::Array(items) if items.len() == calls.len() => {
                        for (i, (c, item)) in calls.iter().zip(items).enumerate() {
                            levels.push((sem(c, i, Client::Script), item.clone()));
                        }
                    }
                    other => return Err(format!("the script replied {other}")),
                }
            }
        }
    }
    Ok((fixed, levels))
}

/// Replaces each placeholder of a server-made identifier by the identifier the reply named:
/// in the sets, in the permits' fields, and in the bindings.
fn substitute(world: &mut World, bound: &[(Bytes, Bytes)]) {
    for (placeholder, id) in bound {
        for entry in world.keys.values_mut() {
            match &mut entry.value {
                Value::ZSet(z) => z.rename_member(placeholder, id),
                Value::Hash(fields) => {
                    for (field, _) in fields.iter_mut() {
                        if field == placeholder {
                            *field = id.clone();
                        }
                    }
                    fields.sort();
                }
                _ => {}
            }
        }
        let renamed: Vec<_> = world
            .bindings
            .iter()
            .filter(|((_, held), _)| held == placeholder)
            .map(|(key, client)| (key.clone(), *client))
            .collect();
        for ((name, _), client) in renamed {
            world.bindings.remove(&(name.clone(), placeholder.clone()));
            world.bindings.insert((name, id.clone()), client);
        }
    }
}

/// The instants at which Redis may have checked key expiry: each gives a different view.
fn expiry_instants(keys: &Keyspace, t0: i64, t1: i64) -> Vec<i64> {
    let mut instants = vec![t0];
    for at in keys.values().filter_map(|e| e.expire) {
        if at >= t0 && at < t1 {
            instants.push(at + 1);
        }
    }
    instants.sort_unstable();
    instants.dedup();
    instants
}

pub fn check(before: &World, step: &Step, seen: &Observed) -> Verdict {
    let (fixed, levels) = match plan(step, seen.replies) {
        Ok(plan) => plan,
        Err(why) => return Verdict::Mismatch(why),
    };
    for (want, got) in &fixed {
        if !fits(want, got, &mut Vec::new()) {
            return Verdict::Mismatch(format!("expected {want}, got {got}"));
        }
    }
    let (t0, t1) = (seen.t0, seen.t1);
    let mut matches = Vec::new();
    let mut spent = 0usize;
    for t_key in expiry_instants(&before.keys, t0, t1) {
        let start = before.with_keys(logical_view(&before.keys, t_key));
        let mut bound: Vec<(Bytes, Bytes)> = Vec::new();
        // Each branch: the world so far, the module's latest clock reading, the labels, the
        // keys some command changed (even if a later one changed them back).
        let mut frontier: Vec<Branch> = vec![Branch {
            world: start.clone(),
            t: t_key,
            labels: vec![],
            touched: BTreeSet::new(),
        }];
        for (action, actual) in &levels {
            let mut next: Vec<Branch> = Vec::new();
            for branch in &frontier {
                for (want, mut after, label, t) in
                    action.outcomes(&branch.world, branch.t, t0, t1, &mut spent)
                {
                    if spent > BUDGET {
                        return Verdict::Inconclusive;
                    }
                    let mut tried = bound.clone();
                    if !fits(&want, actual, &mut tried) {
                        continue;
                    }
                    substitute(&mut after, &tried);
                    for pair in tried {
                        if !bound.contains(&pair) {
                            bound.push(pair);
                        }
                    }
                    let mut touched = branch.touched.clone();
                    for key in branch.world.keys.keys().chain(after.keys.keys()) {
                        if branch.world.keys.get(key) != after.keys.get(key) {
                            touched.insert(key.clone());
                        }
                    }
                    // Keep one branch per distinct outcome: the one with the earliest clock,
                    // which every later instant can follow.
                    match next
                        .iter_mut()
                        .find(|b| b.world == after && b.touched == touched)
                    {
                        Some(same) => same.t = same.t.min(t),
                        None => {
                            let mut labels = branch.labels.clone();
                            labels.push(label);
                            next.push(Branch {
                                world: after,
                                t,
                                labels,
                                touched,
                            });
                        }
                    }
                }
            }
            frontier = next;
            if frontier.is_empty() {
                break;
            }
        }
        for branch in frontier {
            if compare(&branch.world.keys, &seen.dump.keys, t1, seen.dump.time_ms).is_ok() {
                matches.push(Match {
                    post: branch.world,
                    labels: branch.labels,
                    touched: branch.touched,
                });
            }
        }
    }
    if matches.is_empty() {
        Verdict::Mismatch(diagnose(before, &levels, seen))
    } else {
        Verdict::Matches(matches)
    }
}

/// What the model expected at the start of the window, for the failure report.
fn diagnose(before: &World, levels: &[(Action, Reply)], seen: &Observed) -> String {
    let mut out = String::new();
    for t in [seen.t0, seen.t1] {
        let mut world = before.with_keys(logical_view(&before.keys, t));
        out += &format!("  the model with every clock at {t}:\n");
        let mut bound = Vec::new();
        for (i, (action, actual)) in levels.iter().enumerate() {
            let mut spent = 0;
            let outcomes = action.outcomes(&world, t, seen.t0, seen.t1, &mut spent);
            let Some((want, after, label, _)) = outcomes
                .iter()
                .find(|o| fits(&o.0, actual, &mut bound.clone()))
                .or(outcomes.first())
                .cloned()
            else {
                out += &format!("    command {}: no outcome\n", i + 1);
                break;
            };
            let ok = fits(&want, actual, &mut bound);
            out += &format!(
                "    command {}: expected {want} ({label}), got {actual}{}\n",
                i + 1,
                if ok { "" } else { "   <-- differs" }
            );
            world = after;
            substitute(&mut world, &bound);
        }
        match compare(&world.keys, &seen.dump.keys, seen.t1, seen.dump.time_ms) {
            Ok(()) => out += "    keys: as expected\n",
            Err(diff) => {
                out += &format!("    keys differ: {diff}\n    expected keys:\n");
                for line in show_keys(&world.keys).lines() {
                    out += &format!("    {line}\n");
                }
            }
        }
    }
    out
}
