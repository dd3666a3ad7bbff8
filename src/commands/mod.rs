//! Every SEM.* call enters through [`entry`], which answers the server's keys-position requests,
//! takes the key names the command filter inserted (see `keys.rs`), keeps panics out of
//! redis-server, dispatches to one thin handler per command (a file each here: parse, open the
//! keys, apply the rule, reply), and ends with the serving step.

mod acquire;
mod call;
mod get;
mod limit;
mod release;
mod sets;
mod wait_empty;

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, Context, RedisResult, RedisValue};

use crate::error::SemError;
use crate::keys::{is_derived, key_plan, Command};
use crate::server::acl;
use crate::server::command::{run, Arg, Expanded};
use crate::server::command_info::key_flags;
use crate::server::{guard, in_cluster, is_keys_position_request, key_at};
use crate::state;
use crate::types::Kind;
use crate::waiting;
use crate::write::Step;
use call::Call;

/// The entry point of every SEM.* command.
pub extern "C" fn entry(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard(raw::REDISMODULE_ERR as c_int, || {
        state::scope(&Context::new(ctx), false, || run(ctx, argv, argc, dispatch))
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
        let step = Step::new(ctx);
        let reply = if command.set_step().is_some() {
            sets::SetCall::new(ctx, args, command).and_then(|call| match command {
                Command::AcquireAll => sets::acquire_all(ctx, &step, &call),
                Command::ReleaseAll => sets::release_all(&step, &call),
                _ => sets::refresh_all(&step, &call),
            })
        } else {
            Call::new(ctx, args, command).and_then(|call| match command {
                Command::Acquire => acquire::acquire(ctx, &step, &call, Kind::Plain),
                Command::AcquireFair => acquire::acquire(ctx, &step, &call, Kind::Fair),
                Command::Refresh => release::refresh(&step, &call),
                Command::Release => release::release(&step, &call),
                Command::Get => get::get(ctx, &call),
                Command::WaitEmpty => wait_empty::wait_empty(ctx, &call),
                Command::Limit => limit::limit(ctx, &step, &call),
                Command::AcquireAll | Command::ReleaseAll | Command::RefreshAll => {
                    Err(SemError::Internal)
                }
            })
        };
        waiting::serve::serve_step(step, None);
        reply
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(SemError::Internal.into()),
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
