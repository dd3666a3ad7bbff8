//! The one grant: the acquire rule on a semaphore's open keys, then everything a grant owes,
//! whoever asked (a direct call, a set, a waiter served): bindings of the permits it removed
//! forgotten first, the counters, hold time and `sem.acquire` event, the BOUND binding; and the
//! one form of its reply.

use redis_module::{RedisString, RedisValue};

use crate::error::SemError;
use crate::fencing;
use crate::queue::SemKey;
use crate::request::Ask;
use crate::semaphore::{self, AcquirePlan, AcquireRequest, Acquired, Store};
use crate::state;
use crate::store::RedisStore;

/// A permit granted: its ticket (fair), and whether it only renewed a live permit of the
/// identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub ticket: Option<u64>,
    pub renewed: bool,
}

/// How the rule is asked.
pub enum Try {
    /// Grant if the rule would.
    Acquire,
    /// Only renew a live permit of the identifier (others wait in line before it).
    RenewOnly,
    /// Apply a plan made on these keys, unchanged since (a set's, see [`survey`]).
    Planned(AcquirePlan<RedisString>),
}

/// The rule's request for `ask` now, with this node's ticket floor.
fn rule(ask: &Ask) -> AcquireRequest {
    ask.rule(fencing::floor())
}

/// Grants `ask` to `holder` in `sem` (database `db`, `name`) on its open keys at `now_ms`, if
/// the rule allows, and does the grant's bookkeeping; `bind_to` binds the permit to a
/// connection (BOUND). `None`: the semaphore is full, nothing granted.
pub fn try_grant(
    store: &mut RedisStore,
    sem: (i32, &[u8]),
    ask: &Ask,
    holder: &RedisString,
    now_ms: i64,
    how: Try,
    bind_to: Option<u64>,
) -> Result<Option<Grant>, SemError> {
    // Permits this grant removes may be bound: their bindings go with them.
    if state::any_bindings() {
        store.keep_removed();
    }
    let request = rule(ask);
    let acquired = match how {
        Try::Acquire => semaphore::acquire(store, now_ms, holder, &request)?,
        Try::RenewOnly => {
            semaphore::renew(store, now_ms, holder, &request)?.unwrap_or(Acquired::Full)
        }
        Try::Planned(plan) => plan.apply(store, holder)?,
    };
    let key = || SemKey {
        db: sem.0,
        name: sem.1.into(),
    };
    // Bindings of permits the rule removed (expired) go, granted or not; before a grant's
    // own: one may be an expired permit of the identifier granted now.
    let (all, removed) = store.take_gone();
    state::forget_gone(key, all, &removed);
    let Acquired::Granted { ticket, renewed } = acquired else {
        return Ok(None);
    };
    if let (Some(ticket), false) = (ticket, renewed) {
        fencing::handed_out(ticket, now_ms);
    }
    store.record_grant(holder.as_slice(), renewed);
    state::granted(key, holder.as_slice(), renewed, bind_to);
    Ok(Some(Grant { ticket, renewed }))
}

/// One semaphore of a set, surveyed before any change: its acquire's plan, whether the plan
/// grants, and whether it only renews.
pub struct Planned {
    plan: AcquirePlan<RedisString>,
    pub fits: bool,
    pub renews: bool,
}

/// Plans a set's acquire on every semaphore, changing nothing: an error is the set's.
pub fn survey<'s, 'a: 's>(
    stores: impl IntoIterator<Item = &'s RedisStore<'a>>,
    asks: &[Ask],
    holder: &RedisString,
    now_ms: i64,
) -> Result<Vec<Planned>, SemError> {
    let mut floor = fencing::floor();
    stores
        .into_iter()
        .zip(asks)
        .map(|(store, ask)| {
            let plan = semaphore::plan_acquire(store, now_ms, holder, &ask.rule(floor))?;
            // Each semaphore's new ticket above the one before: the floor moves only when a
            // plan is applied, after the whole survey.
            if let Some(ticket) = plan.new_ticket() {
                floor = fencing::past(floor, ticket, now_ms);
            }
            Ok(Planned {
                fits: plan.grants(store, holder)?,
                renews: store.deadline(holder).is_some_and(|d| d > now_ms),
                plan,
            })
        })
        .collect()
}

/// Grants a set whose every semaphore's plan grants (`planned` by [`survey`] at `now_ms`,
/// nothing changed since): one grant per semaphore, in the order named.
pub fn grant_all<'s, 'a: 's>(
    stores: impl IntoIterator<Item = &'s mut RedisStore<'a>>,
    sems: &[(i32, &[u8])],
    asks: &[Ask],
    planned: Vec<Planned>,
    holder: &RedisString,
    now_ms: i64,
    bind_to: Option<u64>,
) -> Result<Vec<Grant>, SemError> {
    let mut grants = Vec::with_capacity(sems.len());
    let each = stores.into_iter().zip(sems).zip(asks).zip(planned);
    for (((store, sem), ask), planned) in each {
        let how = Try::Planned(planned.plan);
        match try_grant(store, *sem, ask, holder, now_ms, how, bind_to)? {
            Some(grant) => grants.push(grant),
            // Nothing changed between the survey and here.
            None => return Err(SemError::Internal),
        }
    }
    Ok(grants)
}

/// The reply to a grant: the identifier, or with WITHTICKET `[identifier, ticket]`; a set's
/// tickets come as an array in the order named (0 where a semaphore has none).
pub fn reply(
    holder: RedisValue,
    tickets: impl IntoIterator<Item = Option<u64>>,
    set: bool,
    with_ticket: bool,
) -> RedisValue {
    if !with_ticket {
        return holder;
    }
    let mut tickets = tickets.into_iter();
    let tickets = if set {
        RedisValue::Array(
            tickets
                .map(|t| RedisValue::Integer(t.unwrap_or(0) as i64))
                .collect(),
        )
    } else {
        match tickets.next() {
            Some(Some(t)) => RedisValue::Integer(t as i64),
            _ => return holder,
        }
    };
    RedisValue::Array(vec![holder, tickets])
}
