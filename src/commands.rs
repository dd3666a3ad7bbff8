//! One thin handler per SEM.* command: parse, open the keys, apply the rule, reply. Every call
//! enters through [`entry`], which answers the server's keys-position requests, takes the key
//! names the command filter inserted (see `keys.rs`), and keeps panics out of redis-server.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};
use serde_json::{json, Value};

use crate::args::{
    non_empty, parse_lease_ms, parse_limit, parse_release_count, parse_stored_limit,
    parse_timeout_ms,
};
use crate::config;
use crate::error::SemError;
use crate::grant::{self, Try};
use crate::keys::{has_hash_tag, is_derived, key_plan, Command};
use crate::queue::{arrival, Arrival, SemKey, Wants};
use crate::request::{parse_options, Ask, Form};
use crate::semaphore::{self, AcquireRequest, Holder, Snapshot, Store};
use crate::server::acl;
use crate::server::block::caller;
use crate::server::command::{run, Arg, Expanded};
use crate::server::command_info::key_flags;
use crate::server::key::Access;
use crate::server::{
    guard, in_cluster, is_keys_position_request, is_primary, key_at, now_ms, selected_db,
};
use crate::stats::{self, COUNTERS};
use crate::store::{RedisStore, SemKeys};
use crate::types::Kind;
use crate::waiting;
use crate::write::{Step, Write};

mod sets;

/// The entry point of every SEM.* command.
pub extern "C" fn entry(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard(raw::REDISMODULE_ERR as c_int, || {
        waiting::scope(&Context::new(ctx), false, || run(ctx, argv, argc, dispatch))
    })
}

/// Runs the command named by `args[0]`. Answers the server's keys-position requests
/// (`getkeys-api`: ACL checks and Redis Cluster use them) without running it, and turns a panic
/// (a bug) into an error reply instead of letting it unwind into redis-server.
fn dispatch(ctx: &Context, args: &[Arg]) -> RedisResult {
    let run = || {
        let command = args
            .first()
            .and_then(|name| Command::from_name(name.as_slice()))
            .ok_or(SemError::Internal)?;
        if is_keys_position_request(ctx) {
            report_keys(ctx, args, command);
            return Ok(RedisValue::NoReply);
        }
        if args.len() < 2 {
            return Err(SemError::Arity(command.name()));
        }
        let expanded = with_keys(ctx, args, command)?;
        let args = expanded.as_ref().map_or(args, Expanded::args);
        // The handler's writes end in `step`; the lines of the semaphores written are served
        // once it returns, whatever it answers.
        let step = Step::for_command(ctx);
        let reply = if command.set_step().is_some() {
            sets::SetCall::new(ctx, args, command).and_then(|call| match command {
                Command::AcquireAll => sets::acquire_all(ctx, &step, &call),
                Command::ReleaseAll => sets::release_all(&step, &call),
                _ => sets::refresh_all(&step, &call),
            })
        } else {
            Call::new(ctx, args, command).and_then(|call| match command {
                Command::Acquire => acquire(ctx, &step, &call, Kind::Plain),
                Command::AcquireFair => acquire(ctx, &step, &call, Kind::Fair),
                Command::Refresh => refresh(&step, &call),
                Command::Release => release(&step, &call),
                Command::Get => get(ctx, &call),
                Command::WaitEmpty => wait_empty(ctx, &call),
                Command::Limit => limit(ctx, &step, &call),
                Command::AcquireAll | Command::ReleaseAll | Command::RefreshAll => {
                    Err(SemError::Internal)
                }
            })
        };
        step.serve();
        reply
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(SemError::Internal.into()),
    }
}

/// `SEM.REFRESH name identifier lease`
fn refresh<'a>(step: &Step<'a>, call: &Call<'a>) -> Result<RedisValue, SemError> {
    let [id, lease] = call.exact_args()?;
    let id = identifier(id)?;
    let lease_ms = parse_lease_ms(lease.as_slice(), config::max_lease_ms())?;
    let mut write = Write::open(step, &call.keys())?;
    let refreshed = semaphore::refresh(write.store_mut(), now_ms(), id, lease_ms)?;
    ended(write.store_mut(), refreshed, id, false);
    write.commit();
    Ok(RedisValue::Integer(refreshed.reply()))
}

/// `SEM.RELEASE name identifier [COUNT k]`
fn release<'a>(step: &Step<'a>, call: &Call<'a>) -> Result<RedisValue, SemError> {
    let [id, options @ ..] = call.options() else {
        return Err(SemError::Arity(call.command.name()));
    };
    let mut count = None;
    let mut options = options.iter();
    while let Some(option) = options.next() {
        if option.as_slice().eq_ignore_ascii_case(b"COUNT") && count.is_none() {
            let value = options.next().ok_or(SemError::Syntax)?;
            count = Some(parse_release_count(value.as_slice())?);
        } else {
            return Err(SemError::Syntax);
        }
    }
    let id = identifier(id)?;
    let mut write = Write::open(step, &call.keys())?;
    let released = semaphore::release(write.store_mut(), now_ms(), id, count)?;
    ended(write.store_mut(), released, id, true);
    write.commit();
    Ok(RedisValue::Integer(released.reply()))
}

/// Counts what a refresh or (`release`) a release found of its holder, and tells of it.
fn ended(store: &mut RedisStore, found: Holder, id: &RedisString, release: bool) {
    match found {
        Holder::Live if release => {
            stats::count(&COUNTERS.released);
            store.released(id.as_slice());
            store.notify(c"sem.release");
        }
        Holder::Live => stats::count(&COUNTERS.refreshed),
        Holder::Expired => {
            stats::count(&COUNTERS.lost);
            store.notify(c"sem.lost");
        }
        Holder::Absent => {}
    }
}

/// `SEM.GET name [JSON]`
fn get(ctx: &Context, call: &Call) -> Result<RedisValue, SemError> {
    let json = match call.options() {
        [] => false,
        [option] if option.as_slice().eq_ignore_ascii_case(b"JSON") => true,
        _ => return Err(SemError::Syntax),
    };
    let keys = call.keys();
    let store = RedisStore::open(ctx, &keys, Access::Read)?;
    let now = now_ms();
    if json {
        let snapshot = semaphore::snapshot(&store, now)?;
        let stored_limit = store.stored_limit()?;
        let line = waiting::line(&call.sem(ctx), now);
        Ok(RedisValue::BulkString(
            snapshot_json(keys.name.as_slice(), &snapshot, stored_limit, line).to_string(),
        ))
    } else {
        Ok(RedisValue::Integer(semaphore::in_use(&store, now)? as i64))
    }
}

/// `SEM.LIMIT name [n | CLEAR]`: the operator's limit, which every acquire of `name` uses
/// instead of its own while it is stored (0 pauses the semaphore). A raised limit serves the
/// line at once; nobody loses a permit to a lowered one.
fn limit<'a>(ctx: &Context, step: &Step<'a>, call: &Call<'a>) -> Result<RedisValue, SemError> {
    let change = match call.options() {
        [] => None,
        [arg] if arg.as_slice().eq_ignore_ascii_case(b"CLEAR") => Some(None),
        [arg] => Some(Some(parse_stored_limit(arg.as_slice())?)),
        _ => return Err(SemError::Arity(call.command.name())),
    };
    let Some(limit) = change else {
        let store = RedisStore::open(ctx, &call.keys(), Access::Read)?;
        return Ok(match store.stored_limit()? {
            Some(limit) => RedisValue::Integer(limit as i64),
            None => RedisValue::Null,
        });
    };
    let mut write = Write::open(step, &call.keys())?;
    let had = write.store().stored_limit()?.is_some();
    // A limit set to what it was changes nothing, and ends nothing.
    if write.store_mut().set_stored_limit(limit)? {
        stats::count(&COUNTERS.limits_set);
        write.commit();
    }
    Ok(match limit {
        Some(_) => RedisValue::SimpleStringStatic("OK"),
        None => RedisValue::Integer(i64::from(had)),
    })
}

/// `SEM.WAITEMPTY name seconds`: 1 once `name` has no live holder (at once if it has none), 0
/// when `seconds` pass first. It takes nothing and holds nobody back.
fn wait_empty(ctx: &Context, call: &Call) -> Result<RedisValue, SemError> {
    let [seconds] = call.exact_args()?;
    let wait_ms = parse_timeout_ms(seconds.as_slice())?;
    let store = RedisStore::open(ctx, &call.keys(), Access::Read)?;
    let now = now_ms();
    if semaphore::in_use(&store, now)? == 0 {
        return Ok(RedisValue::Integer(1));
    }
    // Inside MULTI or a script, as WAIT: the answer is what holds now.
    let caller = caller(ctx, true);
    if !caller.may_block {
        return Ok(RedisValue::Integer(0));
    }
    if !is_primary(ctx) {
        return Err(SemError::ReplicaCannotWait);
    }
    let line = [(call.sem(ctx), store.next_deadline(now))];
    waiting::block(ctx, caller.client, Wants::Empty, &line, now, wait_ms)?;
    stats::count(&COUNTERS.empty_waits_started);
    Ok(RedisValue::NoReply)
}

/// `SEM.ACQUIRE name limit lease [ID identifier] [COUNT n] [WAIT seconds] [BOUND]` and
/// `SEM.ACQUIREFAIR name limit lease [ID identifier] [COUNT n] [WITHTICKET] [WAIT seconds]
/// [BOUND]`
fn acquire<'a>(
    ctx: &Context,
    step: &Step<'a>,
    call: &Call<'a>,
    kind: Kind,
) -> Result<RedisValue, SemError> {
    let [limit, lease, options @ ..] = call.options() else {
        return Err(SemError::Arity(call.command.name()));
    };
    let limit = parse_limit(limit.as_slice())?;
    let lease_ms = parse_lease_ms(lease.as_slice(), config::max_lease_ms())?;
    let options = parse_options(Form::Single(kind), limit, options, |a| a.as_slice())?;
    let caller = caller(ctx, options.bound || options.wait_ms.is_some());
    if options.bound && caller.in_script {
        return Err(SemError::BoundInScript);
    }
    let mut write = Write::open(step, &call.keys())?;
    let made;
    let id = match options.id {
        Some(id) => &**id,
        None => {
            made = write.store().id(new_identifier(&mut [0; 36]));
            &made
        }
    };
    let ask = Ask {
        rule: AcquireRequest {
            kind,
            limit,
            lease_ms,
            count: options.count,
            ticket_floor: 0,
        },
        holder: Vec::new(),
        with_ticket: options.with_ticket,
        bound: options.bound,
    };
    let now = now_ms();
    // Inside MULTI, a script, or for a client that denies blocking, WAIT is no wait.
    let wait_ms = options.wait_ms.filter(|_| caller.may_block);
    let queued = if waiting::queued_anywhere() {
        waiting::queued(&write.key())
    } else {
        0
    };
    let how = match arrival(kind, wait_ms.is_some(), queued) {
        Arrival::TryNow => Try::Acquire,
        Arrival::RenewOrWait | Arrival::RenewOrRefuse => Try::RenewOnly,
    };
    let bind_to = ask.bound.then_some(caller.client);
    let sem = write.sem();
    let Some(granted) = grant::try_grant(write.store_mut(), sem, &ask, id, now, how, bind_to)?
    else {
        let Some(wait_ms) = wait_ms else {
            stats::count(&COUNTERS.refused);
            write.commit();
            return Ok(RedisValue::Null);
        };
        let line = [(write.key(), write.store().next_deadline(now))];
        let ask = Ask {
            holder: id.as_slice().to_vec(),
            ..ask
        };
        waiting::block(ctx, caller.client, Wants::Permits(ask), &line, now, wait_ms)?;
        stats::count(&COUNTERS.waits_started);
        write.commit();
        return Ok(RedisValue::NoReply);
    };
    if ask.bound {
        waiting::follow_bound(ctx);
    }
    write.commit();
    let id = RedisValue::BulkRedisString(id.safe_clone(ctx));
    Ok(grant::reply(id, [granted.ticket], false, ask.with_ticket))
}

/// A SEM.* call's arguments, seen without the key names the command filter inserted.
struct Call<'a> {
    command: Command,
    /// The command name, the name, the derived names, then the other arguments.
    args: &'a [Arg],
    /// Where the other arguments start.
    rest: usize,
}

impl<'a> Call<'a> {
    /// A call must carry the derived names; one without them did not pass the filter, which no
    /// client can avoid. The name is checked first, before any other argument.
    fn new(ctx: &Context, args: &'a [Arg], command: Command) -> Result<Call<'a>, SemError> {
        let name = args[1].as_slice();
        non_empty(name, SemError::EmptyName)?;
        // Redis refuses keys of several slots (CROSSSLOT) before the call; this names the
        // cause for the rare name whose derived keys share its slot by chance.
        if in_cluster(ctx) && !has_hash_tag(name) {
            return Err(SemError::NeedsHashTag);
        }
        // The keys are there: the client or the filter sent them, or `with_keys` inserted them.
        let rest = 2 + command.derived_suffixes().len();
        Ok(Call {
            command,
            args,
            rest,
        })
    }

    /// The arguments after the name.
    fn options(&self) -> &'a [Arg] {
        &self.args[self.rest..]
    }

    /// The arguments after the name of a command with a fixed arity.
    fn exact_args<const N: usize>(&self) -> Result<&'a [Arg; N], SemError> {
        self.options()
            .try_into()
            .map_err(|_| SemError::Arity(self.command.name()))
    }

    /// The semaphore, as the waiting side names it.
    fn sem(&self, ctx: &Context) -> SemKey {
        SemKey {
            db: selected_db(ctx),
            name: self.args[1].as_slice().into(),
        }
    }

    /// The semaphore's key names.
    fn keys(&self) -> SemKeys<'a> {
        SemKeys {
            name: &self.args[1],
            owner: &self.args[2],
            counter: &self.args[3],
            permits: &self.args[4],
            limit: &self.args[5],
        }
    }
}

/// A call that arrives without its derived keys (no filter inserted them: see
/// `server/filter.rs`) gets them here, after the caller's ACL user is checked on them as Redis
/// checks the keys it is told of. Not in Redis Cluster: while a slot moves key by key, only a
/// server told of every key answers `ASK`/`TRYAGAIN` instead of letting the call act on the
/// part of a semaphore that has arrived, so there the call must name them (the long form).
fn with_keys(ctx: &Context, args: &[Arg], command: Command) -> Result<Option<Expanded>, SemError> {
    let Some(plan) = key_plan(command, args.len(), |i| args.get(i).map(|a| a.as_slice())) else {
        return Ok(None);
    };
    if in_cluster(ctx) {
        return Err(SemError::NeedsKeys);
    }
    let expanded = Expanded::new(args, plan.at(), plan.names(), command.derived_suffixes());
    let (_, derived_flags) = key_flags(command);
    if !acl::may_use(ctx, expanded.added(), derived_flags)? {
        return Err(SemError::NoPermission);
    }
    Ok(Some(expanded))
}

/// Where the derived names the filter inserted end in `args` (command name included): they
/// follow the name, exactly `<name><suffix>` for each of the command's suffixes.
fn derived_end(args: &[Arg], command: Command) -> Option<usize> {
    let suffixes = command.derived_suffixes();
    let end = 2 + suffixes.len();
    let name = args.get(1)?.as_slice();
    let ours = args.len() >= end
        && args[2..end]
            .iter()
            .zip(suffixes)
            .all(|(key, suffix)| is_derived(key.as_slice(), name, suffix));
    ours.then_some(end)
}

/// The keys of a call: the name, and the derived names when the arguments carry them (they do
/// not in `COMMAND GETKEYS`, which sees what a client sends).
fn report_keys(ctx: &Context, args: &[Arg], command: Command) {
    if args.len() < 2 {
        return;
    }
    let (name_flags, derived_flags) = key_flags(command);
    if command.set_step().is_some() {
        sets::report_keys(ctx, args, command, name_flags, derived_flags);
        return;
    }
    key_at(ctx, 1, name_flags);
    if let Some(end) = derived_end(args, command) {
        for pos in 2..end {
            key_at(ctx, pos, derived_flags);
        }
    }
}

pub(crate) fn identifier(id: &RedisString) -> Result<&RedisString, SemError> {
    non_empty(id.as_slice(), SemError::EmptyIdentifier)?;
    Ok(id)
}

/// A random UUID v4 in its 36-character hyphenated form, written into `buffer`.
fn new_identifier(buffer: &mut [u8; 36]) -> &[u8] {
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(buffer)
        .as_bytes()
}

/// SEM.GET JSON's document. Identifiers that are not UTF-8 are shown with U+FFFD.
fn snapshot_json(
    name: &[u8],
    snapshot: &Snapshot<RedisString>,
    stored_limit: Option<u64>,
    line: waiting::Line,
) -> Value {
    let holders: Vec<Value> = snapshot
        .holders
        .iter()
        .map(|holder| {
            json!({
                "id": String::from_utf8_lossy(holder.id.as_slice()),
                "ms_left": holder.ms_left,
                "ticket": holder.ticket,
                "permits": holder.permits,
            })
        })
        .collect();
    json!({
        "name": String::from_utf8_lossy(name),
        "fair": snapshot.fair,
        "counter": snapshot.counter,
        "in_use": snapshot.in_use,
        "holders": holders,
        "stored_limit": stored_limit,
        "limit_in_force": stored_limit.is_some(),
        "waiters": line.waiters,
        "longest_wait_ms": line.longest_wait_ms,
        "waiter_ages_ms": line.ages_ms,
        "waiting_for_empty": line.waiting_for_empty,
    })
}
