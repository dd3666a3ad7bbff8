//! redsem: distributed counting semaphores as native Redis commands.

mod args;
mod commands;
mod error;
mod keys;
mod semaphore;
mod store;

// Unit tests run outside redis-server, where Redis's allocator does not exist.
#[cfg(not(test))]
use redis_module::alloc::RedisAlloc as Allocator;
#[cfg(test)]
use std::alloc::System as Allocator;

use commands::check_server_api;
use redis_module::redis_module;

redis_module! {
    name: "sem",
    version: 1,
    allocator: (Allocator, Allocator),
    data_types: [],
    init: check_server_api,
    commands: [
        ["SEM.ACQUIRE", commands::acquire, "write deny-oom", 1, 1, 1, ""],
        ["SEM.ACQUIREFAIR", commands::acquire_fair, "write deny-oom", 1, 1, 1, ""],
        ["SEM.REFRESH", commands::refresh, "write deny-oom", 1, 1, 1, ""],
        ["SEM.RELEASE", commands::release, "write deny-oom", 1, 1, 1, ""],
        ["SEM.GET", commands::get, "readonly", 1, 1, 1, ""],
    ],
}
