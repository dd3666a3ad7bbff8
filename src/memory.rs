//! What waiting clients cost the server's memory, and how much of it they may take.
//!
//! A client blocked by a module costs the server two temporary clients with 16 KB reply
//! buffers besides its connection (measured per waiter over a `BLPOP` client on the same
//! server: 34.4 KB on Valkey 8.1 and 9.1, 35.7 to 36.3 KB on Redis 7.0, 8.2 and 8.4). That
//! memory counts toward `maxmemory`: enough waiters would make the server evict its data (or,
//! under `noeviction`, refuse other clients' writes). So a new waiter is admitted only while
//! - with `maxmemory` set: all waiters together stay within `sem.waiters-maxmemory-percent` of
//!   it, and the server has room for one more below `maxmemory` (a waiter never makes the
//!   server evict a key or refuse a write);
//! - without: all waiters together stay within `sem.max-waiters-memory` bytes.
//!
//! A share of `maxmemory` rather than only the room left before eviction: the room left is
//! what the data and other clients need next; waiters that filled it would turn the next
//! writes into evictions. The share keeps what waiting may ever take small and known.

use crate::error::SemError;
use crate::server::memory::Memory;

/// What one more waiting client costs the server, in bytes (see the module comment).
pub fn per_waiter_bytes(valkey: bool) -> u64 {
    if valkey {
        34_400
    } else {
        36_300
    }
}

/// The settings the admission follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `sem.waiters-maxmemory-percent`: the share of `maxmemory` waiters may take.
    pub percent: u64,
    /// `sem.max-waiters-memory`: the bytes waiters may take without `maxmemory`.
    pub max_bytes: u64,
}

/// The bytes all waiters may take on a server with `memory`.
pub fn limit(memory: Memory, bounds: Bounds) -> u64 {
    match memory.maxmemory {
        0 => bounds.max_bytes,
        max => max / 100 * bounds.percent + max % 100 * bounds.percent / 100,
    }
}

/// Whether one more waiter may block, `waiters` already waiting at `per_waiter` bytes each.
pub fn admit(
    waiters: u64,
    per_waiter: u64,
    memory: Memory,
    bounds: Bounds,
) -> Result<(), SemError> {
    let limit = limit(memory, bounds);
    let after = waiters.saturating_add(1).saturating_mul(per_waiter);
    if after > limit {
        return Err(SemError::WaitersMemory {
            limit,
            maxmemory: memory.maxmemory > 0,
        });
    }
    if memory.maxmemory > 0 && memory.used.saturating_add(per_waiter) > memory.maxmemory {
        return Err(SemError::NoMemoryToWait);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_take_a_share_of_maxmemory_and_never_the_room_left() {
        let mb = 1024 * 1024;
        let bounds = Bounds {
            percent: 5,
            max_bytes: 1024 * mb,
        };
        let at = |maxmemory, used| Memory { maxmemory, used };
        // (waiters, per waiter, memory, admitted)
        let table: &[(u64, u64, Memory, bool)] = &[
            // No maxmemory: the byte bound, whatever is used.
            (0, 36_300, at(0, 0), true),
            (29_000, 36_300, at(0, 0), true),
            (29_580, 36_300, at(0, 0), false),
            // 64 MB: 5 % is 3,355,443 bytes, 92 waiters of 36,300.
            (91, 36_300, at(64 * mb, 22 * mb), true),
            (92, 36_300, at(64 * mb, 22 * mb), false),
            // Within the share, but no room below maxmemory for one more.
            (0, 36_300, at(64 * mb, 64 * mb - 36_299), false),
            (0, 36_300, at(64 * mb, 64 * mb - 36_300), true),
            (0, 36_300, at(64 * mb, 70 * mb), false),
        ];
        for &(waiters, per_waiter, memory, admitted) in table {
            assert_eq!(
                admit(waiters, per_waiter, memory, bounds).is_ok(),
                admitted,
                "{waiters} waiting, {memory:?}"
            );
        }
        assert_eq!(limit(at(64 * mb, 0), bounds), 3_355_443);
        assert_eq!(
            limit(
                at(100, 0),
                Bounds {
                    percent: 100,
                    ..bounds
                }
            ),
            100
        );
        assert_eq!(
            admit(92, 36_300, at(64 * mb, 0), bounds),
            Err(SemError::WaitersMemory {
                limit: 3_355_443,
                maxmemory: true
            })
        );
    }
}
