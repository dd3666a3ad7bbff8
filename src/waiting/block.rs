//! Blocking a caller for what it wants, where there is room for one more waiter.

use std::sync::atomic::AtomicU64;

use redis_module::{Context, RedisValue};

use crate::config;
use crate::error::SemError;
use crate::memory;
use crate::queue::{SemKey, Wants};
use crate::server::block;
use crate::server::events::{self, Needs};
use crate::server::memory as server_memory;
use crate::server::{is_valkey, timer};
use crate::state::{self, read, with};
use crate::stats::{self, COUNTERS};

/// The bounds on waiters' memory the settings give now.
pub(super) fn memory_bounds() -> memory::Bounds {
    memory::Bounds {
        percent: config::WAITERS_MAXMEMORY_PERCENT.get() as u64,
        max_bytes: config::MAX_WAITERS_MEMORY.get() as u64,
    }
}

/// What one more waiting client costs this server, in bytes.
pub(super) fn per_waiter_bytes() -> u64 {
    memory::per_waiter_bytes(is_valkey())
}

/// Whether one more may wait for each of `sems` (`sem.max-waiters-per-semaphore`), on the
/// server (`sem.max-waiters`), and in the memory waiters may take (`memory.rs`).
fn check_room<'a>(mut sems: impl Iterator<Item = &'a SemKey>) -> Result<(), SemError> {
    read(|s| {
        let per_semaphore = config::MAX_WAITERS_PER_SEMAPHORE.get();
        let total = config::MAX_WAITERS.get();
        let crowded = sems.any(|sem| {
            let here = s.registry.queued(sem) + s.registry.waiting_for_empty(sem);
            here as i64 >= per_semaphore
        });
        if crowded {
            Err(SemError::TooManyWaiters {
                per_semaphore: true,
                max: per_semaphore,
            })
        } else if s.registry.total_waiters() as i64 >= total {
            Err(SemError::TooManyWaiters {
                per_semaphore: false,
                max: total,
            })
        } else {
            Ok(s.registry.total_waiters() as u64)
        }
    })
    .and_then(|waiters| {
        memory::admit(
            waiters,
            per_waiter_bytes(),
            server_memory::now(),
            memory_bounds(),
        )
        .inspect_err(|_| stats::count(&COUNTERS.waits_refused_memory))
    })
}

/// Blocks the caller (connection `client`) for what it `wants` (permits, a set's permits, or an empty semaphore) in
/// the line of each of `sems`, each with its soonest lease end. The timer is armed for the
/// wait's end (`wait_ms`, 0: none) and the next lease end.
pub fn block(
    ctx: &Context,
    client: u64,
    wants: Wants,
    sems: &[(SemKey, Option<i64>)],
    now_ms: i64,
    wait_ms: i64,
) -> Result<(), SemError> {
    check_room(sems.iter().map(|(sem, _)| sem))?;
    state::following(|f| events::follow_waits(ctx.ctx, f))?;
    let bound = match &wants {
        Wants::Permits(ask) => ask.bound,
        Wants::Set(parts) => parts.iter().any(|(_, ask)| ask.bound),
        Wants::Empty => false,
    };
    if bound {
        state::following(|f| events::follow(ctx.ctx, f, Needs::Bound));
    }
    let blocked = block::block(ctx).ok_or(SemError::CannotWait)?;
    let until = (wait_ms > 0).then(|| now_ms.saturating_add(wait_ms));
    for (sem, _) in sems {
        state::watch_name(sem.db, &sem.name);
    }
    let due = with(|s| {
        let first = sems[0].0.clone();
        s.registry
            .enqueue(first, client, wants, now_ms, until, blocked);
        for (sem, next) in sems {
            s.registry.newcomer_lease_end(sem, *next);
        }
        s.registry.next_due_ms()
    });
    if let Some(at) = due {
        state::arming(|a| timer::arm(a, at, now_ms));
    }
    Ok(())
}

/// The end of an acquire the rule did not grant now, single or set: with `wait_ms` the caller
/// (connection `client`) waits for what `wait()` says it wants, in the lines it names (the reply
/// comes later), else it is refused (nil) and counted in `refused`.
pub fn wait_or_refuse(
    ctx: &Context,
    client: u64,
    wait_ms: Option<i64>,
    now_ms: i64,
    refused: &AtomicU64,
    wait: impl FnOnce() -> (Wants, Vec<(SemKey, Option<i64>)>),
) -> Result<RedisValue, SemError> {
    let Some(wait_ms) = wait_ms else {
        stats::count(refused);
        return Ok(RedisValue::Null);
    };
    let (wants, lines) = wait();
    block(ctx, client, wants, &lines, now_ms, wait_ms)?;
    stats::count(&COUNTERS.waits_started);
    Ok(RedisValue::NoReply)
}
