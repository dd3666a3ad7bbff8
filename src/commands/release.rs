//! `SEM.RELEASE` and `SEM.REFRESH`.

use redis_module::{RedisString, RedisValue};

use super::call::{identifier, Call};
use crate::args::{parse_lease_ms, parse_release_count};
use crate::config;
use crate::error::SemError;
use crate::semaphore::{self, Holder};
use crate::server::now_ms;
use crate::store::{Ending, RedisStore};
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
    holder_ends(step, call, id, Ending::Release, |store, now| {
        semaphore::release(store, now, id, count)
    })
}

/// `SEM.REFRESH name identifier lease`
pub fn refresh<'a>(step: &Step<'a>, call: &Call<'a>) -> Result<RedisValue, SemError> {
    let [id, lease] = call.exact_args()?;
    let id = identifier(id)?;
    let lease_ms = parse_lease_ms(lease.as_slice(), config::max_lease_ms())?;
    holder_ends(step, call, id, Ending::Refresh, |store, now| {
        semaphore::refresh(store, now, id, lease_ms)
    })
}

/// A release or a refresh of one semaphore by `rule`, then what the holder's end owes (see
/// `RedisStore::holder_ended`); the reply tells whether it was a live holder.
fn holder_ends<'a>(
    step: &Step<'a>,
    call: &Call<'a>,
    id: &RedisString,
    ending: Ending,
    rule: impl FnOnce(&mut RedisStore<'a>, i64) -> Result<Holder, SemError>,
) -> Result<RedisValue, SemError> {
    let mut write = Write::open(step, &call.keys())?;
    let store = write.store_mut();
    let found = rule(store, now_ms())?;
    store.holder_ended(found, id.as_slice(), ending);
    write.commit();
    Ok(RedisValue::Integer(found.reply()))
}
