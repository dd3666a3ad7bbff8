//! `SEM.RELEASE` and `SEM.REFRESH`.

use redis_module::RedisValue;

use super::call::{identifier, Call};
use crate::args::{parse_lease_ms, parse_release_count};
use crate::config;
use crate::error::SemError;
use crate::semaphore;
use crate::server::now_ms;
use crate::store::Ending;
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
    write
        .store_mut()
        .holder_ended(released, id.as_slice(), Ending::Release);
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
    write
        .store_mut()
        .holder_ended(refreshed, id.as_slice(), Ending::Refresh);
    write.commit();
    Ok(RedisValue::Integer(refreshed.reply()))
}
