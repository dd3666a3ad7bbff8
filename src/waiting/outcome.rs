//! What became of a wait: handed to Redis with the unblocked client, and back to the reply and
//! free hooks. The boxed outcome is made and freed here alone.

use std::os::raw::c_void;

use redis_module::{RedisResult, RedisValue};

use crate::error::SemError;
use crate::grant;
use crate::queue::Binding;
use crate::server::block::{self, Blocked};
use crate::state::{defer, GiveBack, Work};

/// What became of a wait, handed to Redis with the unblocked client and back to [`reply`] and
/// [`free`].
#[derive(Debug)]
pub enum Outcome {
    /// Permits on one semaphore.
    Granted {
        binding: Binding,
        grant: grant::Grant,
        with_ticket: bool,
        /// Whether the client got the reply; if not, a new permit is given back.
        delivered: bool,
    },
    /// Permits on each of a set's semaphores, in the order named.
    GrantedSet {
        grants: Vec<(Binding, grant::Grant)>,
        with_ticket: bool,
        delivered: bool,
    },
    /// The wait ended without a permit.
    TimedOut,
    /// `SEM.WAITEMPTY`: the semaphore has no live holder (reply 1).
    Emptied,
    /// `SEM.WAITEMPTY`: the wait ended while it still had one (reply 0).
    NotEmptied,
    Failed(SemError),
}

/// The reply of an unblocked waiter.
pub fn reply(outcome: &mut Outcome) -> RedisResult {
    match outcome {
        Outcome::Granted {
            binding,
            grant,
            with_ticket,
            delivered,
        } => {
            // Delivered: nothing is given back, so the identifier moves into the reply.
            *delivered = true;
            let id = RedisValue::StringBuffer(std::mem::take(&mut binding.holder));
            Ok(grant::reply(id, [grant.ticket], false, *with_ticket))
        }
        Outcome::GrantedSet {
            grants,
            with_ticket,
            delivered,
        } => {
            *delivered = true;
            let holder = grants
                .first_mut()
                .map(|(b, _)| std::mem::take(&mut b.holder))
                .unwrap_or_default();
            let tickets = grants.iter().map(|(_, g)| g.ticket);
            Ok(grant::reply(
                RedisValue::StringBuffer(holder),
                tickets,
                true,
                *with_ticket,
            ))
        }
        Outcome::TimedOut => Ok(RedisValue::Null),
        Outcome::Emptied => Ok(RedisValue::Integer(1)),
        Outcome::NotEmptied => Ok(RedisValue::Integer(0)),
        Outcome::Failed(err) => Err(err.clone().into()),
    }
}

/// The end of an unblocked waiter. New permits granted to a client that disconnected before
/// its reply went out are given back (a renewal only moved a deadline: never).
pub fn free(outcome: Outcome) {
    let grants = match outcome {
        Outcome::Granted {
            binding,
            grant,
            delivered: false,
            ..
        } => vec![(binding, grant)],
        Outcome::GrantedSet {
            grants,
            delivered: false,
            ..
        } => grants,
        _ => return,
    };
    for (binding, _) in grants.into_iter().filter(|(_, g)| !g.renewed) {
        defer(Work::GiveBack(binding, GiveBack::Undelivered));
    }
}

/// Unblocks `handle` with `outcome`, which Redis keeps until [`free_hook`].
pub fn unblock(handle: Blocked, outcome: Outcome) {
    block::unblock(handle, Box::into_raw(Box::new(outcome)).cast());
}

/// The reply hook: `data` is the `Outcome` that [`unblock`] handed to the unblocked client.
pub fn reply_hook(data: *mut c_void) -> RedisResult {
    // SAFETY: `end_wait` hands over a boxed `Outcome`, which Redis keeps until the free hook
    // and nothing else touches while the reply is made.
    reply(unsafe { &mut *data.cast::<Outcome>() })
}

/// The free hook: `data` is the `Outcome` that [`unblock`] handed over, now done with.
pub fn free_hook(data: *mut c_void, _disconnected: bool) {
    // SAFETY: as for `reply_hook`; Redis calls the free hook once, last.
    let outcome = unsafe { Box::from_raw(data.cast::<Outcome>()) };
    free(*outcome);
}
