//! `SEM.WAITEMPTY`.

use redis_module::{Context, RedisValue};

use super::call::Call;
use crate::args::parse_timeout_ms;
use crate::error::SemError;
use crate::queue::Wants;
use crate::semaphore;
use crate::server::block::caller;
use crate::server::key::Access;
use crate::server::{is_primary, now_ms};
use crate::stats::{self, COUNTERS};
use crate::store::RedisStore;
use crate::waiting;

/// `SEM.WAITEMPTY name seconds`: 1 once `name` has no live holder (at once if it has none), 0
/// when `seconds` pass first. It takes nothing and holds nobody back.
pub fn wait_empty(ctx: &Context, call: &Call) -> Result<RedisValue, SemError> {
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
    waiting::block::block(ctx, caller.client, Wants::Empty, &line, now, wait_ms)?;
    stats::count(&COUNTERS.empty_waits_started);
    Ok(RedisValue::NoReply)
}
