//! redsem: distributed counting semaphores as native Redis commands. This file registers; the
//! rest is described in the README's Development section.

mod args;
mod commands;
mod config;
mod docs;
mod error;
mod fencing;
mod keys;
mod queue;
mod semaphore;
mod server;
mod stats;
mod store;
mod types;
mod waiting;

// Unit tests run outside redis-server, where Redis's allocator does not exist.
#[cfg(not(test))]
use redis_module::alloc::RedisAlloc as Allocator;
#[cfg(test)]
use std::alloc::System as Allocator;

use keys::Command;
use redis_module::{redis_module, Context, RedisString, Status};

/// Refuses a server that lacks what redsem needs, then creates the commands and declares their
/// keys, the settings, the command filter and the server events.
fn init(ctx: &Context, args: &[RedisString]) -> Status {
    let missing = server::missing_api();
    if !missing.is_empty() {
        ctx.log_warning(&format!(
            "redsem needs Redis 7.0 or later; this server lacks {}",
            missing.join(", ")
        ));
        return Status::Err;
    }
    // The library may stay mapped after a MODULE UNLOAD: start from a clean slate.
    config::reset();
    stats::reset();
    fencing::reset();
    waiting::reset();
    let module_args: Vec<&[u8]> = args.iter().map(|arg| arg.as_slice()).collect();
    let registered = config::apply_module_args(&module_args)
        .and_then(|()| server::config::register(ctx.ctx))
        .and_then(|()| {
            Command::ALL.into_iter().try_for_each(|command| {
                let flags = docs::command(command.name()).module_flags();
                server::command::create(ctx.ctx, command.name(), commands::entry, &flags)
            })
        })
        .and_then(|()| server::command_info::register(ctx.ctx))
        .and_then(|()| server::timer::init(ctx.ctx))
        .and_then(|()| server::info::register(ctx.ctx))
        .and_then(|()| server::filter::register(ctx.ctx))
        .and_then(|()| server::events::subscribe(ctx.ctx));
    if let Err(reason) = registered {
        ctx.log_warning(&format!("redsem: {reason}"));
        return Status::Err;
    }
    server::signal_only_changed_keys(ctx);
    Status::Ok
}

/// `MODULE UNLOAD`: refused while a connection holds BOUND permits, which would otherwise never
/// be given back on disconnect. (Redis itself refuses while clients wait or a timer is armed.)
fn deinit(ctx: &Context) -> Status {
    if waiting::queued_anywhere() || waiting::any_bindings() {
        ctx.log_warning(
            "redsem: not unloading while clients wait for permits or hold BOUND permits",
        );
        return Status::Err;
    }
    server::timer::shutdown();
    Status::Ok
}

redis_module! {
    name: "sem",
    version: 1,
    allocator: (Allocator, Allocator),
    data_types: [],
    init: init,
    deinit: deinit,
    commands: [],
}
