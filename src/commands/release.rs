//! `SEM.RELEASE` and `SEM.REFRESH`, and what a release or refresh found of its holder (the sets'
//! too).

use redis_module::{RedisString, RedisValue};

use super::call::{identifier, Call};
use crate::args::{parse_lease_ms, parse_release_count};
use crate::config;
use crate::error::SemError;
use crate::semaphore::{self, Holder};
use crate::server::now_ms;
use crate::stats::{self, COUNTERS};
use crate::store::RedisStore;
use crate::write::{Step, Write};

/// `SEM.RELEASE name identifier [COUNT k]`
pub fn release<'a>(step: &Step<'a>, call: &Call<'a>) -> Result<RedisValue, SemError> {
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

/// `SEM.REFRESH name identifier lease`
pub fn refresh<'a>(step: &Step<'a>, call: &Call<'a>) -> Result<RedisValue, SemError> {
    let [id, lease] = call.exact_args()?;
    let id = identifier(id)?;
    let lease_ms = parse_lease_ms(lease.as_slice(), config::max_lease_ms())?;
    let mut write = Write::open(step, &call.keys())?;
    let refreshed = semaphore::refresh(write.store_mut(), now_ms(), id, lease_ms)?;
    ended(write.store_mut(), refreshed, id, false);
    write.commit();
    Ok(RedisValue::Integer(refreshed.reply()))
}

/// Counts what a refresh or (`release`) a release found of its holder, and tells of it.
pub fn ended(store: &mut RedisStore, found: Holder, id: &RedisString, release: bool) {
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
