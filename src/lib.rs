//! redsem: distributed counting semaphores as native Redis commands. This file registers; the
//! rest is described in docs/development.md.

mod args;
mod commands;
mod config;
mod docs;
mod error;
mod fencing;
mod grant;
mod keys;
mod memory;
mod names;
mod queue;
mod request;
mod semaphore;
mod server;
mod state;
mod stats;
mod store;
mod types;
mod waiting;
mod write;

// Unit tests run outside redis-server, where Redis's allocator does not exist.
#[cfg(not(test))]
use redis_module::alloc::RedisAlloc as Allocator;
#[cfg(test)]
use std::alloc::System as Allocator;

use keys::Command;
use redis_module::{redis_module, Context, RedisString, Status};
use server::hooks::{Hooks, InfoFields};

/// Refuses a server that lacks what redsem needs, then creates the commands and declares their
/// keys, the settings, the command filter (Redis Cluster only) and the server events.
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
    stats::reset_distributions();
    stats::forget_grants();
    fencing::reset();
    // A start with nothing to load fires no loading event, and this node may have handed out
    // tickets in an earlier life: go on from the clock at least, whatever the data says.
    fencing::take_floor(server::clock_ms());
    state::reset();
    server::memory::reset();
    server::hooks::install(hooks());
    let version = server::server_version(ctx.ctx);
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
        .and_then(|()| state::arming(|a| server::timer::init(ctx.ctx, a)))
        .and_then(|()| server::info::register(ctx.ctx))
        .and_then(|()| {
            let (valkey, major, minor) = version;
            let mode = match config::command_filter() && server::is_cluster(ctx.ctx) {
                true => server::filter::mode_for(valkey, major, minor),
                false => server::filter::Mode::None,
            };
            server::filter::register(ctx.ctx, mode)
        })
        .and_then(|()| {
            state::following(|f| {
                server::events::subscribe(ctx.ctx, f, version, config::key_events())
            })
        });
    server::memory::refresh(ctx.ctx);
    if let Err(reason) = registered {
        ctx.log_warning(&format!("redsem: {reason}"));
        return Status::Err;
    }
    server::set_module_options(ctx);
    Status::Ok
}

/// What the server's callbacks (server/) hand on, and to whom.
fn hooks() -> Hooks {
    Hooks {
        timer_fired: |ctx| {
            state::arming(server::timer::fires);
            waiting::timer::on_timer(ctx);
        },
        timer_job: |ctx| {
            state::arming(server::timer::job_runs);
            waiting::timer::on_timer(ctx);
        },
        hurry: |ctx| state::arming(|a| server::timer::hurry(ctx.ctx, a)),
        reply: waiting::outcome::reply_hook,
        free: waiting::outcome::free_hook,
        left: waiting::left,
        // This node's data may be behind what clients were told: fair tickets go on from a
        // floor taken from the clock (fencing.rs).
        loading_ended: || {
            fencing::take_floor(server::clock_ms());
            waiting::recheck_all();
        },
        became_primary: || fencing::take_floor(server::clock_ms()),
        became_replica: waiting::became_replica,
        connection_closed: waiting::connection_closed,
        flushed: waiting::flushed,
        swapped: waiting::swapped,
        follows_keys: state::follows_foreign_changes,
        may_concern: state::may_concern,
        key_changed: waiting::touched,
        slot_changed: waiting::recheck_all,
        key_evicted,
        commands_processed: stats::note_commands_processed,
        info: info_fields,
    }
}

/// The server evicted `key` of database `db`: whether it was a semaphore's (a derived key by its
/// name, or a name somebody waits on; a holder set nobody waits on is a sorted set like any
/// other once it is gone), counted in `INFO sem`.
fn key_evicted(db: i32, key: &[u8]) -> bool {
    let ours = keys::DERIVED
        .iter()
        .any(|suffix| key.len() > suffix.len() && key.ends_with(suffix))
        || waiting::waits_on(db, key);
    if ours {
        stats::count(&stats::COUNTERS.evicted_keys);
        waiting::touched(db, key);
    }
    ours
}

/// `INFO sem`: the counters, the waiting side's gauges, the fencing floor, then the
/// distributions.
fn info_fields() -> InfoFields {
    let mut fields = stats::counters();
    fields.extend(waiting::gauges());
    fields.push(("ticket_floor", fencing::floor()));
    (fields, stats::distributions())
}

/// `MODULE UNLOAD`: refused while a connection holds BOUND permits, which would otherwise never
/// be given back on disconnect. (Redis itself refuses while clients wait or a timer is armed.)
fn deinit(ctx: &Context) -> Status {
    if state::queued_anywhere() || state::any_bindings() {
        ctx.log_warning(
            "redsem: not unloading while clients wait for permits or hold BOUND permits",
        );
        return Status::Err;
    }
    server::timer::shutdown();
    Status::Ok
}

/// The version `MODULE LIST` reports, encoded as Redis modules do (1.2.3 is 10203), from the
/// crate's version so the module, its packages and the server agree on one number.
const MODULE_VERSION: i32 = encode_version(
    env!("CARGO_PKG_VERSION_MAJOR"),
    env!("CARGO_PKG_VERSION_MINOR"),
    env!("CARGO_PKG_VERSION_PATCH"),
);

/// `major * 10000 + minor * 100 + patch`; fails the build when a part does not fit in its digits.
const fn encode_version(major: &str, minor: &str, patch: &str) -> i32 {
    let (major, minor, patch) = (parse(major), parse(minor), parse(patch));
    assert!(
        minor < 100 && patch < 100 && major < 200_000,
        "version does not fit the encoding"
    );
    major * 10_000 + minor * 100 + patch
}

/// Decimal digits to a number, usable in a const (str::parse is not).
const fn parse(digits: &str) -> i32 {
    let bytes = digits.as_bytes();
    assert!(!bytes.is_empty(), "empty version part");
    let mut value = 0;
    let mut i = 0;
    while i < bytes.len() {
        assert!(
            bytes[i].is_ascii_digit(),
            "version part is not decimal digits"
        );
        value = value * 10 + (bytes[i] - b'0') as i32;
        i += 1;
    }
    value
}

redis_module! {
    name: "sem",
    version: MODULE_VERSION,
    allocator: (Allocator, Allocator),
    data_types: [],
    init: init,
    deinit: deinit,
    commands: [],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_encode_as_redis_modules_do() {
        assert_eq!(encode_version("1", "2", "3"), 10203);
        assert_eq!(encode_version("0", "1", "0"), 100);
        assert_eq!(encode_version("10", "0", "99"), 100099);
    }

    #[test]
    fn the_module_version_is_the_crates() {
        let parts: Vec<i32> = env!("CARGO_PKG_VERSION")
            .split(['.', '-', '+'])
            .take(3)
            .map(|part| part.parse().unwrap())
            .collect();
        assert_eq!(
            MODULE_VERSION,
            parts[0] * 10_000 + parts[1] * 100 + parts[2]
        );
    }
}
