//! The commands on a set of semaphores: `SEM.ACQUIREALL`, `SEM.RELEASEALL`, `SEM.REFRESHALL`.
//! Each names `numsems` semaphores; the command filter appends every name's derived keys after
//! the client's arguments (see `keys.rs`). A set acquire surveys every semaphore first and
//! changes nothing unless each would grant; then each records the holder exactly as a single
//! acquire would, so everything else (refresh, release, expiry, BOUND, replication) works per
//! semaphore unchanged.

use redis_module::{Context, RedisString, RedisValue};

use super::call::{identifier, new_identifier};
use crate::args::{parse_count, parse_lease_ms, parse_limit};
use crate::config;
use crate::error::SemError;
use crate::grant;
use crate::keys::{has_hash_tag, is_derived, set_name_positions, Command, DERIVED};
use crate::queue::{set_arrival, SemKey, Wants};
use crate::request::{parse_options, Ask, Form};
use crate::semaphore::{self, Holder, HolderPlan};
use crate::server::block::caller;
use crate::server::command::Arg;
use crate::server::{in_cluster, key_at, now_ms, selected_db};
use crate::state;
use crate::stats::{self, COUNTERS};
use crate::store::{Ending, RedisStore, SemKeys};
use crate::waiting;
use crate::waiting::block::wait_or_refuse;
use crate::write::{Step, Write};

/// A call on a set of semaphores, seen without the keys the filter appended.
pub struct SetCall<'a> {
    command: Command,
    args: &'a [Arg],
    /// Where each name is.
    names: Vec<usize>,
    /// Where the client's arguments end and the appended keys begin.
    sent: usize,
}

impl<'a> SetCall<'a> {
    pub fn new(ctx: &Context, args: &'a [Arg], command: Command) -> Result<SetCall<'a>, SemError> {
        let step = command.set_step().ok_or(SemError::Internal)?;
        let arity = SemError::Arity(command.name());
        let numsems = args[1].as_slice();
        let n = set_name_positions(step, numsems, usize::MAX)
            .ok_or(SemError::InvalidNumsems)?
            .len();
        let derived = command.derived_suffixes();
        let sent = args
            .len()
            .checked_sub(n * derived.len())
            .ok_or(arity.clone())?;
        let names = set_name_positions(step, numsems, sent)
            .filter(|names| names[names.len() - 1] + step <= sent)
            .ok_or(arity.clone())?;
        // The filter appended every name's keys; a call without them ends before a name.
        let appended = names.iter().enumerate().all(|(i, &pos)| {
            derived.iter().enumerate().all(|(j, suffix)| {
                let key = args[sent + i * derived.len() + j].as_slice();
                is_derived(key, args[pos].as_slice(), suffix)
            })
        });
        if !appended {
            return Err(arity);
        }
        let call = SetCall {
            command,
            args,
            names,
            sent,
        };
        let cluster = in_cluster(ctx);
        for (i, &pos) in call.names.iter().enumerate() {
            let name = args[pos].as_slice();
            if name.is_empty() {
                return Err(SemError::EmptyName);
            }
            if cluster && !has_hash_tag(name) {
                return Err(SemError::NeedsHashTag);
            }
            let clash = |other: &[u8]| {
                other == name
                    || command.derived_suffixes().iter().any(|suffix| {
                        is_derived(other, name, suffix) || is_derived(name, other, suffix)
                    })
            };
            if call.names[..i].iter().any(|&p| clash(args[p].as_slice())) {
                return Err(SemError::NamedTwice);
            }
        }
        Ok(call)
    }

    /// The client's arguments after the names (after the last triple for SEM.ACQUIREALL).
    fn rest(&self) -> &'a [Arg] {
        let step = self.command.set_step().unwrap_or(1);
        let end = self.names[self.names.len() - 1] + step;
        self.args.get(end..self.sent).unwrap_or(&[])
    }

    /// The keys of the `i`th semaphore.
    fn keys(&self, i: usize) -> SemKeys<'a> {
        let at = self.sent + i * DERIVED.len();
        SemKeys {
            name: &self.args[self.names[i]],
            owner: &self.args[at],
            counter: &self.args[at + 1],
            permits: &self.args[at + 2],
            limit: &self.args[at + 3],
        }
    }

    fn sem(&self, ctx: &Context, i: usize) -> SemKey {
        SemKey {
            db: selected_db(ctx),
            name: self.args[self.names[i]].as_slice().into(),
        }
    }

    /// Every semaphore's keys, opened for writing; a key of the wrong type is an error before
    /// anything changes.
    fn open_all<'r>(&self, step: &'r Step<'a>) -> Result<Vec<Write<'r, 'a>>, SemError> {
        (0..self.names.len())
            .map(|i| Write::open(step, &self.keys(i)))
            .collect()
    }
}

/// The keys of a set call, for the server's keys-position requests: the names, and the
/// appended keys when the arguments carry them.
pub fn report_keys(
    ctx: &Context,
    args: &[Arg],
    command: Command,
    name_flags: u32,
    derived_flags: u32,
) {
    let step = command.set_step().unwrap_or(1);
    let numsems = args[1].as_slice();
    let Some(n) = set_name_positions(step, numsems, usize::MAX).map(|p| p.len()) else {
        return;
    };
    let derived = n * command.derived_suffixes().len();
    let appended = args.len().checked_sub(derived).and_then(|sent| {
        let names = set_name_positions(step, numsems, sent)?;
        let ours = names.iter().enumerate().all(|(i, &pos)| {
            command
                .derived_suffixes()
                .iter()
                .enumerate()
                .all(|(j, suffix)| {
                    is_derived(
                        args[sent + i * DERIVED.len() + j].as_slice(),
                        args[pos].as_slice(),
                        suffix,
                    )
                })
        });
        ours.then_some((names, sent))
    });
    match appended {
        Some((names, sent)) => {
            for pos in names {
                key_at(ctx, pos, name_flags);
            }
            for pos in sent..args.len() {
                key_at(ctx, pos, derived_flags);
            }
        }
        // As a client sent it (COMMAND GETKEYS): the names it has.
        None => {
            for pos in set_name_positions(step, numsems, args.len()).unwrap_or_default() {
                key_at(ctx, pos, name_flags);
            }
        }
    }
}

/// `SEM.ACQUIREALL numsems name limit count [name limit count ...] lease [ID identifier]
/// [FAIR] [WITHTICKET] [WAIT seconds] [BOUND]`
pub fn acquire_all<'a>(
    ctx: &Context,
    step: &Step<'a>,
    call: &SetCall<'a>,
) -> Result<RedisValue, SemError> {
    let mut counts = Vec::with_capacity(call.names.len());
    for &pos in &call.names {
        let limit = parse_limit(call.args[pos + 1].as_slice())?;
        let count = parse_count(call.args[pos + 2].as_slice(), limit)?;
        counts.push((limit, count));
    }
    let [lease, options @ ..] = call.rest() else {
        return Err(SemError::Arity(call.command.name()));
    };
    let lease_ms = parse_lease_ms(lease.as_slice(), config::max_lease_ms())?;
    let options = parse_options(Form::Set, 0, options, |a| a.as_slice())?;
    let caller = caller(ctx, true);
    if options.bound && caller.in_script {
        return Err(SemError::BoundInScript);
    }
    let kind = options.kind;
    let mut writes = call.open_all(step)?;
    let made;
    let id: &RedisString = match options.id {
        Some(id) => id,
        None => {
            made = RedisString::create_from_slice(ctx.ctx, new_identifier(&mut [0; 36]));
            &made
        }
    };
    let asks: Vec<Ask> = counts
        .iter()
        .map(|&(limit, count)| {
            Ask::new(
                &options,
                limit,
                lease_ms,
                Some(count),
                id.as_slice().to_vec(),
            )
        })
        .collect();
    let now = now_ms();
    // Inside MULTI, a script, or for a client that denies blocking, WAIT is no wait.
    let wait_ms = options.wait_ms.filter(|_| caller.may_block);
    // Survey every semaphore before the first change (its errors are the call's); then each
    // must grant as its line lets the set in (`queue::set_arrival`).
    let survey = grant::survey(writes.iter().map(Write::store), &asks, id, now)?;
    let queued: Vec<usize> = (0..writes.len())
        .map(|i| {
            if state::queued_anywhere() {
                state::queued(&call.sem(ctx, i))
            } else {
                0
            }
        })
        .collect();
    let arrivals = set_arrival(kind, wait_ms.is_some(), &queued);
    let all = survey
        .iter()
        .zip(arrivals)
        .all(|(p, arrival)| p.fits && (p.renews || arrival.may_acquire()));
    if !all {
        let refused = &COUNTERS.set_refused;
        let reply = wait_or_refuse(ctx, caller.client, wait_ms, now, refused, || {
            let lines = (0..writes.len())
                .map(|i| (call.sem(ctx, i), writes[i].store().next_deadline(now)))
                .collect::<Vec<_>>();
            let parts = lines.iter().map(|(sem, _)| sem.clone()).zip(asks).collect();
            (Wants::Set(parts), lines)
        })?;
        // A refused set only surveyed: it ends no write.
        if wait_ms.is_some() {
            writes.into_iter().for_each(Write::commit);
        }
        return Ok(reply);
    }
    let bind_to = asks[0].bind_to(caller.client);
    if options.bound {
        waiting::follow_bound(ctx);
    }
    let sems: Vec<(i32, &[u8])> = writes.iter().map(Write::sem).collect();
    let grants = grant::grant_all(
        writes.iter_mut().map(Write::store_mut),
        &sems,
        &asks,
        survey,
        id,
        now,
        bind_to,
    )?;
    writes.into_iter().for_each(Write::commit);
    stats::count(&COUNTERS.set_acquired);
    let tickets = grants.iter().map(|g| g.ticket);
    let id = RedisValue::BulkRedisString(id.safe_clone(ctx));
    Ok(grant::reply(id, tickets, true, options.with_ticket))
}

/// `SEM.RELEASEALL numsems name [name ...] identifier`
pub fn release_all<'a>(step: &Step<'a>, call: &SetCall<'a>) -> Result<RedisValue, SemError> {
    let [id] = call.rest() else {
        return Err(SemError::Arity(call.command.name()));
    };
    let id = identifier(id)?;
    let writes = call.open_all(step)?;
    let now = now_ms();
    on_every(writes, id, Ending::Release, |store| {
        semaphore::plan_release(store, now, id, None)
    })
}

/// `SEM.REFRESHALL numsems name [name ...] identifier lease`
pub fn refresh_all<'a>(step: &Step<'a>, call: &SetCall<'a>) -> Result<RedisValue, SemError> {
    let [id, lease] = call.rest() else {
        return Err(SemError::Arity(call.command.name()));
    };
    let id = identifier(id)?;
    let lease_ms = parse_lease_ms(lease.as_slice(), config::max_lease_ms())?;
    let writes = call.open_all(step)?;
    let now = now_ms();
    on_every(writes, id, Ending::Refresh, |store| {
        semaphore::plan_refresh(store, now, lease_ms)
    })
}

/// Plans a release or a refresh of `id` on every semaphore before the first change (an error
/// changes none of them), then applies each plan; the reply counts the live holders found.
fn on_every<'r, 'a>(
    mut writes: Vec<Write<'r, 'a>>,
    id: &RedisString,
    ending: Ending,
    plan: impl Fn(&RedisStore<'a>) -> Result<HolderPlan<RedisString>, SemError>,
) -> Result<RedisValue, SemError> {
    let plans = writes
        .iter()
        .map(|write| plan(write.store()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut held = 0;
    for (write, plan) in writes.iter_mut().zip(plans) {
        let store = write.store_mut();
        let found = plan.apply(store, id);
        held += i64::from(found == Holder::Live);
        store.holder_ended(found, id.as_slice(), ending);
    }
    writes.into_iter().for_each(Write::commit);
    Ok(RedisValue::Integer(held))
}
