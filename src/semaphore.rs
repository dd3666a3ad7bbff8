//! The semaphore rules, over any [`Store`] of one semaphore's holders and with the time passed
//! in, so they are unit-tested here with an injected clock and no server.
//!
//! A holder is live while `now_ms < deadline`. Every writing rule first removes the expired
//! holders it finds (that is the recipe's ZREMRANGEBYSCORE), so the cost of a call is
//! O((1 + expired) log holders), never a walk over all holders.

use std::slice;

use serde_json::{json, Value};

use crate::error::SemError;

/// Sorted-set scores are doubles: tickets above this would be rounded.
pub const MAX_TICKET: u64 = 1 << 53;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Granted while fewer than `limit` holders are live.
    Plain,
    /// Also hands each grant the next ticket of `<name>:counter`, recorded in `<name>:owner`.
    Fair,
}

/// A holder identifier's bytes, however the store keeps them.
pub trait IdBytes {
    fn id_bytes(&self) -> &[u8];
}

/// One semaphore's keys, as the rules see them. Mutations apply at once; a store over Redis keys
/// also replicates each effect with its absolute values.
pub trait Store {
    /// A holder identifier as the store keeps it.
    type Id: IdBytes;

    /// Holders in `<name>`, live or expired but not yet removed.
    fn holder_count(&self) -> u64;
    /// Whether `<name>:owner` has entries: the holders are fair ones.
    fn has_owners(&self) -> bool;
    fn deadline(&self, id: &Self::Id) -> Option<i64>;
    fn ticket(&self, id: &Self::Id) -> Option<u64>;
    /// Holders whose deadline is at or before `now_ms`, soonest first.
    fn expired(&self, now_ms: i64) -> Vec<Self::Id>;
    /// The last ticket handed out; `None` when `<name>:counter` does not exist.
    fn counter(&self) -> Result<Option<u64>, SemError>;
    /// Live holders, soonest deadline first.
    fn live_by_deadline(&self, now_ms: i64) -> Vec<(Self::Id, i64)>;
    /// Entries of `<name>:owner`, lowest ticket first.
    fn owners_by_ticket(&self) -> Vec<(Self::Id, u64)>;

    /// Sets `id`'s deadline, adding `id` unless `Put::IfHeld`. One lookup answers both "is it
    /// a holder?" and "write it".
    fn put_holder(&mut self, id: &Self::Id, deadline_ms: i64, put: Put) -> PutOutcome;
    fn put_owner(&mut self, id: &Self::Id, ticket: u64);
    fn set_counter(&mut self, ticket: u64);
    /// Removes `ids` from `<name>` and from `<name>:owner`, wherever they are present, as one
    /// step per key. Returns how many were in `<name>`.
    fn remove(&mut self, ids: &[Self::Id]) -> usize;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// Add `id`, or move its deadline if it is already a holder.
    Upsert,
    /// Only move the deadline of an existing holder.
    IfHeld,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Added,
    Updated,
    /// `Put::IfHeld` and `id` was not a holder: nothing changed.
    NotHeld,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireRequest {
    pub kind: Kind,
    pub limit: u64,
    pub lease_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// `renewed`: the identifier already held a live permit; only its deadline moved.
    Granted {
        ticket: Option<u64>,
        renewed: bool,
    },
    Full,
}

/// SEM.ACQUIRE / SEM.ACQUIREFAIR: grants `id` a permit when fewer than `limit` holders are live.
/// Everything that can fail is checked before the first change, so an error changes nothing.
pub fn acquire<S: Store>(
    store: &mut S,
    now_ms: i64,
    id: &S::Id,
    request: &AcquireRequest,
) -> Result<Acquired, SemError> {
    let expired = store.expired(now_ms);
    let live = store.holder_count().saturating_sub(expired.len() as u64);
    if live > 0 {
        let held = held_kind(store);
        if held != request.kind {
            return Err(SemError::KindMismatch { held });
        }
    }
    let next_ticket = match request.kind {
        Kind::Plain => None,
        Kind::Fair => Some(next_ticket(store.counter()?.unwrap_or(0))?),
    };

    store.remove(&expired);
    // A full semaphore still renews a holder that retries with its identifier.
    let put = if live < request.limit {
        Put::Upsert
    } else {
        Put::IfHeld
    };
    match store.put_holder(id, now_ms + request.lease_ms, put) {
        PutOutcome::NotHeld => Ok(Acquired::Full),
        PutOutcome::Updated => Ok(Acquired::Granted {
            ticket: store.ticket(id),
            renewed: true,
        }),
        PutOutcome::Added => {
            if let Some(ticket) = next_ticket {
                store.set_counter(ticket);
                store.put_owner(id, ticket);
            }
            Ok(Acquired::Granted {
                ticket: next_ticket,
                renewed: false,
            })
        }
    }
}

/// SEM.REFRESH: moves a live holder's deadline to `now + lease`. A holder that had expired has
/// lost its permit (another may have been granted it) and gets `false`.
pub fn refresh<S: Store>(store: &mut S, now_ms: i64, id: &S::Id, lease_ms: i64) -> bool {
    let expired = store.expired(now_ms);
    store.remove(&expired);
    match store.put_holder(id, now_ms + lease_ms, Put::IfHeld) {
        PutOutcome::Updated => true,
        PutOutcome::Added | PutOutcome::NotHeld => {
            store.remove(slice::from_ref(id));
            false
        }
    }
}

/// SEM.RELEASE: gives a live permit back. An expired holder gets `false`: its critical section
/// may have overlapped another holder's, which its caller should know.
pub fn release<S: Store>(store: &mut S, now_ms: i64, id: &S::Id) -> bool {
    // An expired `id` goes with the others, so what is left of it here was live.
    let expired = store.expired(now_ms);
    store.remove(&expired);
    store.remove(slice::from_ref(id)) == 1
}

/// SEM.GET: live holders, without removing anything (it runs on read-only replicas too).
pub fn live_count<S: Store>(store: &S, now_ms: i64) -> u64 {
    store
        .holder_count()
        .saturating_sub(store.expired(now_ms).len() as u64)
}

/// SEM.GET JSON: the semaphore's state, holders in grant order. Fair holders are listed by
/// ticket; plain ones, which keep no grant record, by deadline.
pub fn snapshot<S: Store>(store: &S, name: &[u8], now_ms: i64) -> Result<Value, SemError> {
    let fair = held_kind(store) == Kind::Fair;
    let holders: Vec<Value> = if fair {
        store
            .owners_by_ticket()
            .into_iter()
            .filter_map(|(id, ticket)| {
                let deadline = store.deadline(&id).filter(|&d| d > now_ms)?;
                Some(holder_json(id.id_bytes(), deadline - now_ms, Some(ticket)))
            })
            .collect()
    } else {
        store
            .live_by_deadline(now_ms)
            .into_iter()
            .map(|(id, deadline)| holder_json(id.id_bytes(), deadline - now_ms, None))
            .collect()
    };
    Ok(json!({
        "name": String::from_utf8_lossy(name),
        "fair": fair,
        "counter": store.counter()?,
        "holders": holders,
    }))
}

fn holder_json(id: &[u8], ms_left: i64, ticket: Option<u64>) -> Value {
    json!({
        "id": String::from_utf8_lossy(id),
        "ms_left": ms_left,
        "ticket": ticket,
    })
}

fn held_kind<S: Store>(store: &S) -> Kind {
    if store.has_owners() {
        Kind::Fair
    } else {
        Kind::Plain
    }
}

fn next_ticket(counter: u64) -> Result<u64, SemError> {
    if counter >= MAX_TICKET {
        return Err(SemError::CounterExhausted);
    }
    Ok(counter + 1)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The key layout as plain maps: what `<name>`, `<name>:owner` and `<name>:counter` hold.
    #[derive(Default, Debug)]
    struct MemoryStore {
        holders: HashMap<Vec<u8>, i64>,
        owners: HashMap<Vec<u8>, u64>,
        counter: Option<u64>,
        counter_is_garbage: bool,
    }

    impl IdBytes for Vec<u8> {
        fn id_bytes(&self) -> &[u8] {
            self
        }
    }

    impl Store for MemoryStore {
        type Id = Vec<u8>;

        fn holder_count(&self) -> u64 {
            self.holders.len() as u64
        }
        fn has_owners(&self) -> bool {
            !self.owners.is_empty()
        }
        fn deadline(&self, id: &Vec<u8>) -> Option<i64> {
            self.holders.get(id).copied()
        }
        fn ticket(&self, id: &Vec<u8>) -> Option<u64> {
            self.owners.get(id).copied()
        }
        fn expired(&self, now_ms: i64) -> Vec<Vec<u8>> {
            let mut expired: Vec<(i64, Vec<u8>)> = self
                .holders
                .iter()
                .filter(|(_, &d)| d <= now_ms)
                .map(|(id, &d)| (d, id.clone()))
                .collect();
            expired.sort();
            expired.into_iter().map(|(_, id)| id).collect()
        }
        fn counter(&self) -> Result<Option<u64>, SemError> {
            if self.counter_is_garbage {
                return Err(SemError::CounterNotInteger);
            }
            Ok(self.counter)
        }
        fn live_by_deadline(&self, now_ms: i64) -> Vec<(Vec<u8>, i64)> {
            let mut live: Vec<(i64, Vec<u8>)> = self
                .holders
                .iter()
                .filter(|(_, &d)| d > now_ms)
                .map(|(id, &d)| (d, id.clone()))
                .collect();
            live.sort();
            live.into_iter().map(|(d, id)| (id, d)).collect()
        }
        fn owners_by_ticket(&self) -> Vec<(Vec<u8>, u64)> {
            let mut owners: Vec<(u64, Vec<u8>)> =
                self.owners.iter().map(|(id, &t)| (t, id.clone())).collect();
            owners.sort();
            owners.into_iter().map(|(t, id)| (id, t)).collect()
        }
        fn put_holder(&mut self, id: &Vec<u8>, deadline_ms: i64, put: Put) -> PutOutcome {
            match (self.holders.get_mut(id), put) {
                (Some(deadline), _) => {
                    *deadline = deadline_ms;
                    PutOutcome::Updated
                }
                (None, Put::IfHeld) => PutOutcome::NotHeld,
                (None, Put::Upsert) => {
                    self.holders.insert(id.clone(), deadline_ms);
                    PutOutcome::Added
                }
            }
        }
        fn put_owner(&mut self, id: &Vec<u8>, ticket: u64) {
            self.owners.insert(id.clone(), ticket);
        }
        fn set_counter(&mut self, ticket: u64) {
            self.counter = Some(ticket);
        }
        fn remove(&mut self, ids: &[Vec<u8>]) -> usize {
            ids.iter()
                .filter(|id| {
                    self.owners.remove(*id);
                    self.holders.remove(*id).is_some()
                })
                .count()
        }
    }

    const T0: i64 = 1_700_000_000_000;

    fn id(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    fn plain(limit: u64, lease_ms: i64) -> AcquireRequest {
        AcquireRequest {
            kind: Kind::Plain,
            limit,
            lease_ms,
        }
    }

    fn fair(limit: u64, lease_ms: i64) -> AcquireRequest {
        AcquireRequest {
            kind: Kind::Fair,
            ..plain(limit, lease_ms)
        }
    }

    fn granted(ticket: Option<u64>) -> Acquired {
        Acquired::Granted {
            ticket,
            renewed: false,
        }
    }

    fn renewed(ticket: Option<u64>) -> Acquired {
        Acquired::Granted {
            ticket,
            renewed: true,
        }
    }

    /// One step of a scenario: at `.0` ms after T0, `.1` asks with `.2`; the outcome is `.3`.
    type Step = (
        i64,
        &'static str,
        AcquireRequest,
        Result<Acquired, SemError>,
    );

    fn run(steps: &[Step]) -> MemoryStore {
        let mut store = MemoryStore::default();
        for (i, (at, who, request, want)) in steps.iter().enumerate() {
            let got = acquire(&mut store, T0 + at, &id(who), request);
            assert_eq!(&got, want, "step {i} ({who} at +{at})");
        }
        store
    }

    #[test]
    fn plain_grants_up_to_the_limit_then_refuses() {
        let store = run(&[
            (0, "a", plain(2, 1000), Ok(granted(None))),
            (1, "b", plain(2, 1000), Ok(granted(None))),
            (2, "c", plain(2, 1000), Ok(Acquired::Full)),
            // A larger limit from another caller counts the same holders.
            (3, "c", plain(3, 1000), Ok(granted(None))),
        ]);
        assert_eq!(store.holders.len(), 3);
        assert!(store.owners.is_empty());
        assert_eq!(store.counter, None);
        assert_eq!(store.holders[&id("a")], T0 + 1000);
    }

    #[test]
    fn a_holder_expires_exactly_at_its_deadline() {
        let store = run(&[
            (0, "a", plain(1, 100), Ok(granted(None))),
            (99, "b", plain(1, 100), Ok(Acquired::Full)),
            (100, "b", plain(1, 100), Ok(granted(None))),
        ]);
        assert!(
            !store.holders.contains_key(&id("a")),
            "expired holder is removed"
        );
        assert_eq!(store.holders[&id("b")], T0 + 200);
    }

    #[test]
    fn acquiring_again_with_the_same_id_renews_without_a_second_permit() {
        let store = run(&[
            (0, "a", plain(1, 100), Ok(granted(None))),
            (50, "a", plain(1, 100), Ok(renewed(None))),
            (120, "b", plain(1, 100), Ok(Acquired::Full)),
        ]);
        assert_eq!(store.holders.len(), 1);
        assert_eq!(store.holders[&id("a")], T0 + 150);
    }

    #[test]
    fn a_renewal_succeeds_even_when_the_callers_limit_is_now_exceeded() {
        run(&[
            (0, "a", plain(2, 100), Ok(granted(None))),
            (1, "b", plain(2, 100), Ok(granted(None))),
            (2, "b", plain(1, 100), Ok(renewed(None))),
        ]);
    }

    #[test]
    fn fair_grants_take_increasing_tickets_and_refusals_take_none() {
        let store = run(&[
            (0, "a", fair(2, 1000), Ok(granted(Some(1)))),
            (1, "b", fair(2, 1000), Ok(granted(Some(2)))),
            (2, "c", fair(2, 1000), Ok(Acquired::Full)),
            (3, "a", fair(2, 1000), Ok(renewed(Some(1)))),
            // b expires (a was renewed); c's retry takes the next ticket, never a reused one.
            (1001, "c", fair(2, 1000), Ok(granted(Some(3)))),
        ]);
        assert_eq!(store.counter, Some(3));
        assert_eq!(
            store.owners.len(),
            2,
            "b's owner entry went with its holder"
        );
        assert_eq!(store.owners[&id("a")], 1);
        assert_eq!(store.owners[&id("c")], 3);
    }

    #[test]
    fn kinds_do_not_mix_while_live_holders_remain() {
        let mut store = run(&[
            (0, "a", fair(5, 100), Ok(granted(Some(1)))),
            (
                1,
                "b",
                plain(5, 100),
                Err(SemError::KindMismatch { held: Kind::Fair }),
            ),
        ]);
        assert_eq!(store.holders.len(), 1, "the refused call changed nothing");
        // Once the fair holder expired, the name may be used as a plain semaphore.
        let got = acquire(&mut store, T0 + 100, &id("b"), &plain(5, 100));
        assert_eq!(got, Ok(granted(None)));
        assert!(store.owners.is_empty());
        let got = acquire(&mut store, T0 + 101, &id("c"), &fair(5, 100));
        assert_eq!(got, Err(SemError::KindMismatch { held: Kind::Plain }));
        // A fair name's tickets keep growing from its counter.
        let got = acquire(&mut store, T0 + 200, &id("c"), &fair(5, 100));
        assert_eq!(got, Ok(granted(Some(2))));
    }

    #[test]
    fn errors_are_found_before_any_change() {
        let mut store = MemoryStore::default();
        store.put_holder(&id("old"), T0 - 1, Put::Upsert);
        store.put_owner(&id("old"), 7);
        store.counter_is_garbage = true;
        let got = acquire(&mut store, T0, &id("a"), &fair(1, 100));
        assert_eq!(got, Err(SemError::CounterNotInteger));
        assert!(store.holders.contains_key(&id("old")), "nothing was pruned");

        store.counter_is_garbage = false;
        store.counter = Some(MAX_TICKET);
        let got = acquire(&mut store, T0, &id("a"), &fair(1, 100));
        assert_eq!(got, Err(SemError::CounterExhausted));
        assert_eq!(store.holders.len(), 1);
    }

    #[test]
    fn refresh_extends_only_live_holders() {
        let mut store = MemoryStore::default();
        assert_eq!(
            acquire(&mut store, T0, &id("a"), &fair(3, 100)),
            Ok(granted(Some(1)))
        );
        assert!(refresh(&mut store, T0 + 99, &id("a"), 500));
        assert_eq!(store.holders[&id("a")], T0 + 599);
        assert_eq!(store.owners[&id("a")], 1, "the ticket is kept");
        assert!(
            !refresh(&mut store, T0 + 599, &id("a"), 500),
            "expired at its deadline"
        );
        assert!(store.holders.is_empty() && store.owners.is_empty());
        assert!(!refresh(&mut store, T0, &id("never"), 500));
    }

    #[test]
    fn refresh_of_a_lost_holder_clears_what_is_left_of_it() {
        let mut store = MemoryStore::default();
        store.put_owner(&id("ghost"), 4);
        assert!(!refresh(&mut store, T0, &id("ghost"), 500));
        assert!(store.owners.is_empty());
    }

    #[test]
    fn release_reports_whether_the_permit_was_still_held() {
        let mut store = MemoryStore::default();
        acquire(&mut store, T0, &id("a"), &fair(3, 100)).unwrap();
        acquire(&mut store, T0, &id("b"), &fair(3, 100)).unwrap();
        assert!(release(&mut store, T0 + 50, &id("a")));
        assert!(!release(&mut store, T0 + 50, &id("a")), "released twice");
        assert!(!release(&mut store, T0 + 100, &id("b")), "expired holder");
        assert!(store.holders.is_empty() && store.owners.is_empty());
        assert_eq!(store.counter, Some(2), "the counter is never rolled back");
    }

    #[test]
    fn live_count_ignores_expired_holders_without_removing_them() {
        let mut store = MemoryStore::default();
        acquire(&mut store, T0, &id("a"), &plain(3, 100)).unwrap();
        acquire(&mut store, T0, &id("b"), &plain(3, 200)).unwrap();
        assert_eq!(live_count(&store, T0 + 99), 2);
        assert_eq!(live_count(&store, T0 + 100), 1);
        assert_eq!(live_count(&store, T0 + 200), 0);
        assert_eq!(store.holders.len(), 2);
    }

    #[test]
    fn snapshot_lists_fair_holders_by_ticket() {
        let mut store = MemoryStore::default();
        acquire(&mut store, T0, &id("a"), &fair(3, 900)).unwrap();
        acquire(&mut store, T0, &id("b"), &fair(3, 100)).unwrap();
        acquire(&mut store, T0, &id("c"), &fair(3, 50)).unwrap();
        let got = snapshot(&store, b"jobs", T0 + 60).unwrap();
        assert_eq!(
            got,
            json!({
                "name": "jobs",
                "fair": true,
                "counter": 3,
                "holders": [
                    {"id": "a", "ms_left": 840, "ticket": 1},
                    {"id": "b", "ms_left": 40, "ticket": 2},
                ],
            })
        );
    }

    #[test]
    fn snapshot_lists_plain_holders_by_deadline() {
        let mut store = MemoryStore::default();
        acquire(&mut store, T0, &id("a"), &plain(3, 900)).unwrap();
        acquire(&mut store, T0, &id("b"), &plain(3, 100)).unwrap();
        let got = snapshot(&store, b"jobs", T0).unwrap();
        assert_eq!(
            got,
            json!({
                "name": "jobs",
                "fair": false,
                "counter": null,
                "holders": [
                    {"id": "b", "ms_left": 100, "ticket": null},
                    {"id": "a", "ms_left": 900, "ticket": null},
                ],
            })
        );
    }
}
