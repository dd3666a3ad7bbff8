use std::collections::HashMap;

use super::*;
use crate::fencing;
use crate::types::{deadline_ms, MAX_TICKET};

/// The key layout as plain maps: what `<name>`, `<name>:owner` and `<name>:counter` hold, with
/// scores as doubles, as Redis keeps them, so tests can write what other clients might.
#[derive(Default, Debug)]
struct MemoryStore {
    holders: HashMap<Vec<u8>, f64>,
    owners: HashMap<Vec<u8>, f64>,
    counter: Option<u64>,
    counter_is_garbage: bool,
    /// `<name>:permits` holds something that is not a count (another client wrote it).
    weights_are_garbage: bool,
    /// `<name>:permits`: holders' permits beyond 1, and the `""` total.
    weights: HashMap<Vec<u8>, u64>,
    extra: Option<u64>,
    /// `<name>:limit`.
    stored_limit: Option<u64>,
    stored_limit_is_garbage: bool,
    /// Every change, in order, as the effects a replica would receive.
    effects: Vec<String>,
}

impl IdBytes for Vec<u8> {
    fn id_bytes(&self) -> &[u8] {
        self
    }
}

fn sorted_by_score(map: &HashMap<Vec<u8>, f64>) -> Vec<(Vec<u8>, f64)> {
    let mut entries: Vec<(Vec<u8>, f64)> = map.iter().map(|(k, &v)| (k.clone(), v)).collect();
    entries.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    entries
}

fn text(id: &[u8]) -> String {
    String::from_utf8_lossy(id).into_owned()
}

impl Store for MemoryStore {
    type Id = Vec<u8>;

    fn holder_count(&self) -> u64 {
        self.holders.len() as u64
    }
    fn owner_count(&self) -> u64 {
        self.owners.len() as u64
    }
    fn deadline(&self, id: &Vec<u8>) -> Option<i64> {
        self.holders.get(id).map(|&score| deadline_ms(score))
    }
    fn owner_score(&self, id: &Vec<u8>) -> Option<f64> {
        self.owners.get(id).copied()
    }
    fn expired(&self, now_ms: i64) -> Vec<Vec<u8>> {
        sorted_by_score(&self.holders)
            .into_iter()
            .filter(|(_, score)| *score <= now_ms as f64)
            .map(|(id, _)| id)
            .collect()
    }
    fn counter(&self) -> Result<Option<u64>, SemError> {
        if self.counter_is_garbage {
            return Err(SemError::CounterNotInteger);
        }
        Ok(self.counter)
    }
    fn live_by_deadline(&self, now_ms: i64) -> Vec<(Vec<u8>, i64)> {
        sorted_by_score(&self.holders)
            .into_iter()
            .filter(|(_, score)| *score > now_ms as f64)
            .map(|(id, score)| (id, deadline_ms(score)))
            .collect()
    }
    fn owners_by_score(&self) -> Vec<(Vec<u8>, f64)> {
        sorted_by_score(&self.owners)
    }
    fn has_weights(&self) -> bool {
        !self.weights.is_empty() || self.extra.is_some()
    }
    fn stored_limit(&self) -> Result<Option<u64>, SemError> {
        if self.stored_limit_is_garbage {
            return Err(SemError::StoredLimitCorrupt);
        }
        Ok(self.stored_limit)
    }
    fn weight(&self, id: &Vec<u8>) -> Result<u64, SemError> {
        if self.weights_are_garbage {
            return Err(SemError::PermitsCorrupt);
        }
        Ok(self.weights.get(id).copied().unwrap_or(1))
    }
    fn extra(&self) -> Result<u64, SemError> {
        if self.weights_are_garbage {
            return Err(SemError::PermitsCorrupt);
        }
        Ok(self.extra.unwrap_or(0))
    }
    fn put_weights(&mut self, set: Option<(&Vec<u8>, u64)>, removed: &[&Vec<u8>], extra: u64) {
        let mut changes = Vec::new();
        if let Some((id, permits)) = set {
            if permits > 1 {
                self.weights.insert(id.clone(), permits);
                changes.push(format!("{}={permits}", text(id)));
            } else if self.weights.remove(id).is_some() {
                changes.push(format!("-{}", text(id)));
            }
        }
        for id in removed {
            if self.weights.remove(*id).is_some() {
                changes.push(format!("-{}", text(id)));
            }
        }
        self.extra = (extra > 0).then_some(extra);
        changes.push(format!("extra={extra}"));
        self.effects.push(format!("P {}", changes.join(" ")));
    }
    fn clear_weights(&mut self) {
        if self.has_weights() {
            self.weights.clear();
            self.extra = None;
            self.effects.push("DEL p".into());
        }
    }

    fn put_holder(&mut self, id: &Vec<u8>, deadline_ms: i64, put: Put) -> PutOutcome {
        let outcome = match (self.holders.get_mut(id), put) {
            (Some(_), Put::IfNew) => PutOutcome::NotHeld,
            (Some(deadline), _) => {
                *deadline = deadline_ms as f64;
                PutOutcome::Updated
            }
            (None, Put::IfHeld) => PutOutcome::NotHeld,
            (None, Put::Upsert | Put::IfNew) => {
                self.holders.insert(id.clone(), deadline_ms as f64);
                PutOutcome::Added
            }
        };
        if outcome != PutOutcome::NotHeld {
            self.effects
                .push(format!("ZADD h {deadline_ms} {}", text(id)));
        }
        outcome
    }
    fn put_owner(&mut self, id: &Vec<u8>, ticket: u64) {
        self.owners.insert(id.clone(), ticket as f64);
        self.effects.push(format!("ZADD o {ticket} {}", text(id)));
    }
    fn set_counter(&mut self, ticket: u64) {
        self.counter = Some(ticket);
        self.effects.push(format!("SET c {ticket}"));
    }
    fn remove(&mut self, ids: &[Vec<u8>]) -> usize {
        let holders: Vec<String> = ids
            .iter()
            .filter(|id| self.holders.remove(*id).is_some())
            .map(|id| text(id))
            .collect();
        let owners: Vec<String> = ids
            .iter()
            .filter(|id| self.owners.remove(*id).is_some())
            .map(|id| text(id))
            .collect();
        if !holders.is_empty() {
            self.effects.push(format!("ZREM h {}", holders.join(" ")));
        }
        if !owners.is_empty() {
            self.effects.push(format!("ZREM o {}", owners.join(" ")));
        }
        holders.len()
    }
    fn remove_owners(&mut self, ids: &[Vec<u8>]) {
        let owners: Vec<String> = ids
            .iter()
            .filter(|id| self.owners.remove(*id).is_some())
            .map(|id| text(id))
            .collect();
        if !owners.is_empty() {
            self.effects.push(format!("ZREM o {}", owners.join(" ")));
        }
    }
    fn clear_owners(&mut self) {
        if !self.owners.is_empty() {
            self.owners.clear();
            self.effects.push("DEL o".into());
        }
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
        count: None,
        ticket_floor: 0,
    }
}

fn weighted(request: AcquireRequest, count: u64) -> AcquireRequest {
    AcquireRequest {
        count: Some(count),
        ..request
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

fn run_on(store: &mut MemoryStore, steps: &[Step]) {
    for (i, (at, who, request, want)) in steps.iter().enumerate() {
        let effects_before = store.effects.len();
        let got = acquire(store, T0 + at, &id(who), request);
        assert_eq!(&got, want, "step {i} ({who} at +{at})");
        if got.is_err() {
            assert_eq!(
                store.effects.len(),
                effects_before,
                "step {i}: an error changed nothing"
            );
        }
    }
}

/// Runs `steps` on a name whose counter stands at 0, so fair tickets count from 1 (a name with
/// no counter starts from the clock: `a_name_without_a_counter_starts_from_the_clock`).
fn run(steps: &[Step]) -> MemoryStore {
    let mut store = counted();
    run_on(&mut store, steps);
    store
}

/// A name whose counter stands at 0.
fn counted() -> MemoryStore {
    MemoryStore {
        counter: Some(0),
        ..MemoryStore::default()
    }
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
    assert_eq!(
        store.counter,
        Some(0),
        "plain grants leave the counter alone"
    );
    assert_eq!(store.holders[&id("a")], (T0 + 1000) as f64);
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
    assert_eq!(store.holders[&id("b")], (T0 + 200) as f64);
}

#[test]
fn acquiring_again_with_the_same_id_renews_without_a_second_permit() {
    let store = run(&[
        (0, "a", plain(1, 100), Ok(granted(None))),
        (50, "a", plain(1, 100), Ok(renewed(None))),
        (120, "b", plain(1, 100), Ok(Acquired::Full)),
    ]);
    assert_eq!(store.holders.len(), 1);
    assert_eq!(store.holders[&id("a")], (T0 + 150) as f64);
}

#[test]
fn a_renewal_succeeds_even_when_the_callers_limit_is_now_exceeded() {
    run(&[
        (0, "a", plain(2, 100), Ok(granted(None))),
        (1, "b", plain(2, 100), Ok(granted(None))),
        (2, "b", plain(1, 100), Ok(renewed(None))),
        (
            3,
            "a",
            fair(5, 100),
            Err(SemError::KindMismatch { held: Kind::Plain }),
        ),
    ]);
    run(&[
        (0, "a", fair(2, 100), Ok(granted(Some(1)))),
        (1, "b", fair(2, 100), Ok(granted(Some(2)))),
        (2, "b", fair(1, 100), Ok(renewed(Some(2)))),
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
    assert_eq!(store.owners[&id("a")], 1.0);
    assert_eq!(store.owners[&id("c")], 3.0);
}

#[test]
fn a_ticket_floor_lifts_the_next_ticket_once_and_tickets_go_on_from_there() {
    let mut store = MemoryStore {
        counter: Some(7),
        ..MemoryStore::default()
    };
    let request = AcquireRequest {
        ticket_floor: 1000,
        ..fair(5, 100)
    };
    run_on(
        &mut store,
        &[
            (0, "a", request, Ok(granted(Some(1000)))),
            // The counter is past the floor now: the next ticket is the next one up.
            (1, "b", request, Ok(granted(Some(1001)))),
        ],
    );
    assert_eq!(store.counter, Some(1001));
    assert_eq!(
        &store.effects[..3],
        ["ZADD h 1700000000100 a", "SET c 1000", "ZADD o 1000 a"]
    );
    // A refusal or a renewal takes no ticket and moves no counter, whatever the floor.
    let request = AcquireRequest {
        ticket_floor: 5000,
        ..fair(2, 100)
    };
    run_on(
        &mut store,
        &[
            (2, "c", request, Ok(Acquired::Full)),
            (3, "a", request, Ok(renewed(Some(1000)))),
        ],
    );
    assert_eq!(store.counter, Some(1001));
    // A counter already past the floor is not lowered by it.
    let request = AcquireRequest {
        ticket_floor: 500,
        ..fair(5, 100)
    };
    run_on(&mut store, &[(4, "d", request, Ok(granted(Some(1002))))]);
}

#[test]
fn a_name_without_a_counter_starts_from_the_clock() {
    // Its counter went (a flush, a swap, a move): its old holders may still use tickets up to
    // the clock's, so the next one starts there, not at 1 nor at the node's older floor.
    let mut store = MemoryStore::default();
    let request = AcquireRequest {
        ticket_floor: 1000,
        ..fair(5, 100)
    };
    let at = |ms: i64| fencing::floor_at(T0 + ms);
    run_on(
        &mut store,
        &[
            (7, "a", request, Ok(granted(Some(at(7))))),
            // From there on the counter: the next one up, whatever the clock.
            (9, "b", request, Ok(granted(Some(at(7) + 1)))),
        ],
    );
    assert_eq!(store.counter, Some(at(7) + 1));
    store.counter = None;
    run_on(&mut store, &[(20, "c", request, Ok(granted(Some(at(20)))))]);
    // A refusal takes no ticket and writes no counter.
    let mut full = MemoryStore::default();
    run_on(
        &mut full,
        &[
            (0, "a", fair(1, 100), Ok(granted(Some(at(0))))),
            (1, "b", fair(1, 100), Ok(Acquired::Full)),
        ],
    );
    assert_eq!(full.counter, Some(at(0)));
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
    run_on(
        &mut store,
        &[
            // Once the fair holder expired, the name may be used as a plain semaphore.
            (100, "b", plain(5, 100), Ok(granted(None))),
            (
                101,
                "c",
                fair(5, 100),
                Err(SemError::KindMismatch { held: Kind::Plain }),
            ),
            // A fair name's tickets keep growing from its counter.
            (200, "c", fair(5, 100), Ok(granted(Some(2)))),
        ],
    );
    assert_eq!(store.owners.len(), 1);
}

#[test]
fn errors_are_found_before_any_change() {
    let mut store = MemoryStore::default();
    store.holders.insert(id("old"), (T0 - 1) as f64);
    store.owners.insert(id("old"), 7.0);
    store.counter_is_garbage = true;
    run_on(
        &mut store,
        &[(0, "a", fair(1, 100), Err(SemError::CounterNotInteger))],
    );
    assert!(store.holders.contains_key(&id("old")), "nothing was pruned");

    store.counter_is_garbage = false;
    store.counter = Some(MAX_TICKET);
    run_on(
        &mut store,
        &[(0, "a", fair(1, 100), Err(SemError::CounterExhausted))],
    );
    store.counter = Some(MAX_TICKET - 1);
    run_on(
        &mut store,
        &[(0, "a", fair(1, 100), Ok(granted(Some(MAX_TICKET))))],
    );
    assert_eq!(store.holders.len(), 1, "old was pruned by the grant");
}

#[test]
fn a_full_semaphore_needs_no_counter() {
    let mut store = run(&[(0, "a", fair(1, 100), Ok(granted(Some(1))))]);
    store.counter_is_garbage = true;
    run_on(
        &mut store,
        &[
            (1, "b", fair(1, 100), Ok(Acquired::Full)),
            (2, "a", fair(1, 100), Ok(renewed(Some(1)))),
            (3, "b", fair(2, 100), Err(SemError::CounterNotInteger)),
        ],
    );
}

#[test]
fn a_fair_grant_with_room_makes_one_holder_write() {
    let mut store = run(&[(0, "a", fair(5, 100), Ok(granted(Some(1))))]);
    store.effects.clear();
    run_on(&mut store, &[(10, "a", fair(5, 100), Ok(renewed(Some(1))))]);
    assert_eq!(store.effects, ["ZADD h 1700000000110 a"]);
    // An identifier whose permit expired takes a new ticket, not its old one.
    store.effects.clear();
    run_on(
        &mut store,
        &[(110, "a", fair(5, 100), Ok(granted(Some(2))))],
    );
    assert_eq!(
        store.effects,
        [
            "ZREM h a",
            "ZREM o a",
            "ZADD h 1700000000210 a",
            "SET c 2",
            "ZADD o 2 a"
        ]
    );
}

#[test]
fn a_renewal_replies_only_a_valid_ticket() {
    for bad in [
        f64::INFINITY,
        1e300,
        -5.0,
        0.0,
        2.5,
        9_223_372_036_854_775_808.0,
    ] {
        let mut store = run(&[(0, "a", fair(2, 100), Ok(granted(Some(1))))]);
        store.owners.insert(id("a"), bad);
        let effects = store.effects.len();
        run_on(
            &mut store,
            &[(1, "a", fair(2, 100), Err(SemError::InvalidTicket))],
        );
        assert_eq!(store.effects.len(), effects, "score {bad}");
        assert_eq!(
            snapshot(&store, T0 + 1),
            Err(SemError::InvalidTicket),
            "score {bad}"
        );
    }
}

#[test]
fn owner_entries_without_holders_are_leftovers_removed_by_the_next_write() {
    // Another client deleted `<name>` of a fair semaphore: its owner set is left over.
    let mut store = run(&[
        (0, "a", fair(5, 1000), Ok(granted(Some(1)))),
        (0, "b", fair(5, 1000), Ok(granted(Some(2)))),
    ]);
    store.holders.clear();
    let view = snapshot(&store, T0 + 1).unwrap();
    assert!(!view.fair, "kind follows the live holders");
    assert!(view.holders.is_empty());
    store.effects.clear();
    run_on(&mut store, &[(1, "p", plain(5, 1000), Ok(granted(None)))]);
    assert_eq!(store.effects, ["DEL o", "ZADD h 1700000001001 p"]);
    run_on(&mut store, &[(2, "q", plain(5, 1000), Ok(granted(None)))]);

    // A foreign owner entry beside live fair holders: removed, the kind stays fair.
    let mut store = run(&[(0, "a", fair(5, 1000), Ok(granted(Some(1))))]);
    store.owners.insert(id("ghost"), 9.0);
    assert!(snapshot(&store, T0).unwrap().fair);
    store.effects.clear();
    assert_eq!(
        release(&mut store, T0 + 1, &id("nobody"), None),
        Ok(Holder::Absent)
    );
    assert_eq!(store.effects, ["ZREM o ghost"]);
    assert_eq!(store.owners.len(), 1);

    // Foreign owner entries beside plain holders: removed, the kind stays plain.
    let mut store = run(&[(0, "a", plain(5, 1000), Ok(granted(None)))]);
    store.owners.insert(id("ghost"), 1.0);
    store.owners.insert(id("ghost2"), 2.0);
    assert!(!snapshot(&store, T0).unwrap().fair);
    run_on(&mut store, &[(1, "b", plain(5, 1000), Ok(granted(None)))]);
    assert!(store.owners.is_empty());

    // As many foreign owner entries as live holders read as a fair semaphore: the documented
    // blind spot, which stays safe (the limit holds, tickets stay valid).
    let mut store = run(&[(0, "a", plain(5, 1000), Ok(granted(None)))]);
    store.owners.insert(id("ghost"), 1.0);
    assert!(snapshot(&store, T0).unwrap().fair);
    run_on(
        &mut store,
        &[(
            1,
            "b",
            plain(5, 1000),
            Err(SemError::KindMismatch { held: Kind::Fair }),
        )],
    );
}

#[test]
fn foreign_holder_scores_read_as_deadlines() {
    let mut store = MemoryStore::default();
    store.holders.insert(id("seconds"), 1_700_000_000.0); // the recipe's seconds: long expired
    store.holders.insert(id("forever"), f64::INFINITY);
    store.holders.insert(id("half"), (T0 + 10) as f64 + 0.5);
    assert_eq!(in_use(&store, T0), Ok(2));
    assert_eq!(in_use(&store, T0 + 10), Ok(2));
    assert_eq!(in_use(&store, T0 + 11), Ok(1));
    run_on(&mut store, &[(11, "a", plain(2, 100), Ok(granted(None)))]);
    assert!(!store.holders.contains_key(&id("seconds")));
    assert!(!store.holders.contains_key(&id("half")));
    let view = snapshot(&store, T0 + 11).unwrap();
    assert_eq!(view.holders.last().unwrap().ms_left, i64::MAX - (T0 + 11));
}

#[test]
fn refresh_extends_only_live_holders() {
    let mut store = counted();
    run_on(&mut store, &[(0, "a", fair(3, 100), Ok(granted(Some(1))))]);
    assert_eq!(
        refresh(&mut store, T0 + 99, &id("a"), 500),
        Ok(Holder::Live)
    );
    assert_eq!(store.holders[&id("a")], (T0 + 599) as f64);
    assert_eq!(store.owners[&id("a")], 1.0, "the ticket is kept");
    assert_eq!(
        refresh(&mut store, T0 + 599, &id("a"), 500),
        Ok(Holder::Expired),
        "expired at its deadline"
    );
    assert!(store.holders.is_empty() && store.owners.is_empty());
    store.effects.clear();
    assert_eq!(
        refresh(&mut store, T0, &id("never"), 500),
        Ok(Holder::Absent)
    );
    assert!(
        store.effects.is_empty(),
        "a refresh that finds nothing changes nothing"
    );
}

#[test]
fn refresh_of_a_lost_holder_clears_what_is_left_of_it() {
    let mut store = MemoryStore::default();
    store.owners.insert(id("ghost"), 4.0);
    assert_eq!(
        refresh(&mut store, T0, &id("ghost"), 500),
        Ok(Holder::Absent)
    );
    assert!(store.owners.is_empty());
}

#[test]
fn release_reports_whether_the_permit_was_still_held() {
    let mut store = counted();
    run_on(
        &mut store,
        &[
            (0, "a", fair(3, 100), Ok(granted(Some(1)))),
            (0, "b", fair(3, 100), Ok(granted(Some(2)))),
        ],
    );
    assert_eq!(
        release(&mut store, T0 + 50, &id("a"), None),
        Ok(Holder::Live)
    );
    assert_eq!(
        release(&mut store, T0 + 50, &id("a"), None),
        Ok(Holder::Absent),
        "released twice"
    );
    assert_eq!(
        release(&mut store, T0 + 100, &id("b"), None),
        Ok(Holder::Expired),
        "expired holder"
    );
    assert!(store.holders.is_empty() && store.owners.is_empty());
    assert_eq!(store.counter, Some(2), "the counter is never rolled back");
}

#[test]
fn in_use_ignores_expired_holders_without_removing_them() {
    let mut store = MemoryStore::default();
    run_on(
        &mut store,
        &[
            (0, "a", plain(3, 100), Ok(granted(None))),
            (0, "b", plain(3, 200), Ok(granted(None))),
        ],
    );
    assert_eq!(in_use(&store, T0 + 99), Ok(2));
    assert_eq!(in_use(&store, T0 + 100), Ok(1));
    assert_eq!(in_use(&store, T0 + 200), Ok(0));
    assert_eq!(store.holders.len(), 2);
}

#[test]
fn snapshot_lists_fair_holders_by_ticket() {
    let mut store = counted();
    run_on(
        &mut store,
        &[
            (0, "a", fair(3, 900), Ok(granted(Some(1)))),
            (0, "b", fair(3, 100), Ok(granted(Some(2)))),
            (0, "c", fair(3, 50), Ok(granted(Some(3)))),
        ],
    );
    let view = snapshot(&store, T0 + 60).unwrap();
    let want = Snapshot {
        fair: true,
        counter: Some(3),
        in_use: 2,
        holders: vec![
            HolderView {
                id: id("a"),
                ms_left: 840,
                ticket: Some(1),
                permits: 1,
            },
            HolderView {
                id: id("b"),
                ms_left: 40,
                ticket: Some(2),
                permits: 1,
            },
        ],
    };
    assert_eq!(view, want);
}

#[test]
fn snapshot_lists_plain_holders_by_deadline() {
    let mut store = MemoryStore::default();
    run_on(
        &mut store,
        &[
            (0, "a", plain(3, 900), Ok(granted(None))),
            (0, "b", plain(3, 100), Ok(granted(None))),
        ],
    );
    let view = snapshot(&store, T0).unwrap();
    assert!(!view.fair);
    assert_eq!(view.counter, None);
    let ids: Vec<(Vec<u8>, i64)> = view
        .holders
        .into_iter()
        .map(|h| (h.id, h.ms_left))
        .collect();
    assert_eq!(ids, [(id("b"), 100), (id("a"), 900)]);
}

#[test]
fn while_others_wait_only_a_renewal_happens() {
    let mut store = run(&[(0, "a", fair(1, 100), Ok(granted(Some(1))))]);
    store.holders.insert(id("gone"), (T0 - 5) as f64);
    store.effects.clear();
    assert_eq!(renew(&mut store, T0 + 1, &id("b"), &fair(5, 100)), Ok(None));
    assert!(
        store.effects.is_empty(),
        "a newcomer that cannot renew changes nothing"
    );
    assert_eq!(
        renew(&mut store, T0 + 1, &id("a"), &fair(5, 100)),
        Ok(Some(renewed(Some(1))))
    );
    assert_eq!(store.holders[&id("a")], (T0 + 101) as f64);
    assert!(
        !store.holders.contains_key(&id("gone")),
        "a renewal prunes like any write"
    );
    assert_eq!(
        renew(&mut store, T0 + 2, &id("a"), &plain(5, 100)),
        Err(SemError::KindMismatch { held: Kind::Fair })
    );
    store.owners.insert(id("a"), 0.5);
    assert_eq!(
        renew(&mut store, T0 + 3, &id("a"), &fair(5, 100)),
        Err(SemError::InvalidTicket)
    );
}

#[test]
fn weighted_holders_take_all_their_permits_or_none() {
    let mut store = run(&[
        (0, "w", weighted(plain(8, 1000), 5), Ok(granted(None))),
        (1, "a", weighted(plain(8, 1000), 4), Ok(Acquired::Full)),
        (2, "b", weighted(plain(8, 1000), 3), Ok(granted(None))),
        (3, "c", plain(8, 1000), Ok(Acquired::Full)),
    ]);
    assert_eq!(in_use(&store, T0 + 3), Ok(8));
    assert_eq!(store.weights[&id("w")], 5);
    assert_eq!(store.extra, Some(4 + 2));
    // Renewing keeps the count; another COUNT is an error that changes nothing.
    let effects = store.effects.len();
    run_on(
        &mut store,
        &[(
            4,
            "w",
            weighted(plain(8, 1000), 2),
            Err(SemError::CountMismatch { held: 5 }),
        )],
    );
    assert_eq!(store.effects.len(), effects);
    run_on(
        &mut store,
        &[
            (5, "w", plain(8, 1000), Ok(renewed(None))),
            (6, "w", weighted(plain(8, 1000), 5), Ok(renewed(None))),
        ],
    );
    assert_eq!(store.weights[&id("w")], 5);
}

#[test]
fn one_permit_holders_keep_todays_layout() {
    let store = run(&[
        (0, "a", weighted(plain(8, 1000), 1), Ok(granted(None))),
        (0, "b", plain(8, 1000), Ok(granted(None))),
    ]);
    assert!(
        !store.has_weights(),
        "no permits key for holders of one permit"
    );
    let store = run(&[(0, "c", weighted(fair(8, 1000), 1), Ok(granted(Some(1))))]);
    assert!(!store.has_weights());
}

#[test]
fn partial_release_keeps_the_holder_and_its_ticket() {
    let mut store = run(&[(0, "w", weighted(fair(10, 1000), 6), Ok(granted(Some(1))))]);
    assert_eq!(
        release(&mut store, T0 + 1, &id("w"), Some(7)),
        Err(SemError::CountTooLarge { held: 6 })
    );
    assert_eq!(
        release(&mut store, T0 + 1, &id("w"), Some(4)),
        Ok(Holder::Live)
    );
    assert_eq!(store.weights[&id("w")], 2);
    assert_eq!(store.extra, Some(1));
    assert_eq!(store.owners[&id("w")], 1.0, "the ticket stays");
    assert_eq!(in_use(&store, T0 + 1), Ok(2));
    assert_eq!(
        release(&mut store, T0 + 2, &id("w"), Some(1)),
        Ok(Holder::Live)
    );
    assert!(!store.has_weights(), "one permit left: no field");
    assert_eq!(in_use(&store, T0 + 2), Ok(1));
    assert_eq!(
        release(&mut store, T0 + 3, &id("w"), None),
        Ok(Holder::Live)
    );
    assert!(store.holders.is_empty() && store.owners.is_empty());
    // COUNT on a holder of one permit, and on a non-holder.
    run_on(
        &mut store,
        &[(4, "x", fair(10, 1000), Ok(granted(Some(2))))],
    );
    assert_eq!(
        release(&mut store, T0 + 5, &id("x"), Some(2)),
        Err(SemError::CountTooLarge { held: 1 })
    );
    assert_eq!(
        release(&mut store, T0 + 5, &id("nobody"), Some(2)),
        Ok(Holder::Absent)
    );
}

#[test]
fn an_expired_weighted_holder_frees_all_its_permits() {
    let mut store = run(&[
        (0, "w", weighted(plain(10, 100), 6), Ok(granted(None))),
        (0, "v", weighted(plain(10, 1000), 3), Ok(granted(None))),
        (1, "a", weighted(plain(10, 1000), 2), Ok(Acquired::Full)),
    ]);
    assert_eq!(
        in_use(&store, T0 + 100),
        Ok(3),
        "w's six permits are free at its deadline"
    );
    store.effects.clear();
    run_on(
        &mut store,
        &[(100, "a", weighted(plain(10, 1000), 7), Ok(granted(None)))],
    );
    assert_eq!(
        store.effects,
        [
            "ZREM h w",
            "P -w extra=2",
            "ZADD h 1700000001100 a",
            "P a=7 extra=8"
        ]
    );
    assert_eq!(in_use(&store, T0 + 100), Ok(10));
    // When no holder is left, the permits key goes with them.
    run_on(
        &mut store,
        &[(5000, "b", plain(10, 1000), Ok(granted(None)))],
    );
    assert!(!store.has_weights());
}

#[test]
fn a_large_request_at_the_head_is_measured_against_permits_in_use() {
    // Readers hold one permit each; a writer asks for the whole limit.
    let mut store = run(&[
        (0, "r1", fair(4, 1000), Ok(granted(Some(1)))),
        (0, "r2", fair(4, 1000), Ok(granted(Some(2)))),
        (1, "writer", weighted(fair(4, 1000), 4), Ok(Acquired::Full)),
    ]);
    release(&mut store, T0 + 2, &id("r1"), None).unwrap();
    run_on(
        &mut store,
        &[(2, "writer", weighted(fair(4, 1000), 4), Ok(Acquired::Full))],
    );
    release(&mut store, T0 + 3, &id("r2"), None).unwrap();
    run_on(
        &mut store,
        &[(
            3,
            "writer",
            weighted(fair(4, 1000), 4),
            Ok(granted(Some(3))),
        )],
    );
    run_on(&mut store, &[(4, "r3", fair(4, 1000), Ok(Acquired::Full))]);
}

/// Whether an acquire's plan grants, as a set's survey asks it.
fn would_grant<S: Store>(
    store: &S,
    now_ms: i64,
    id: &S::Id,
    request: &AcquireRequest,
) -> Result<bool, SemError> {
    plan_acquire(store, now_ms, id, request)?.grants(store, id)
}

/// The errors a set release's or refresh's plans find.
fn check_release<S: Store>(store: &S, now_ms: i64, id: &S::Id) -> Result<(), SemError> {
    plan_release(store, now_ms, id, None).map(drop)
}

fn check_refresh<S: Store>(store: &S, now_ms: i64) -> Result<(), SemError> {
    plan_refresh(store, now_ms, 1_000).map(drop)
}

/// A plan tells what `acquire` then does, and changes nothing.
#[test]
fn a_plan_foretells_acquire_without_a_change() {
    let lease = 1_000;
    let held_by_h = |request: AcquireRequest, ticket| -> Vec<Step> {
        vec![(0, "h", request, Ok(granted(ticket)))]
    };
    // (setup, request, who, at)
    let cases: Vec<(Vec<Step>, AcquireRequest, &str, i64)> = vec![
        (vec![], plain(1, lease), "a", 0),
        (held_by_h(plain(1, lease), None), plain(1, lease), "a", 10),
        (held_by_h(plain(1, lease), None), plain(1, lease), "h", 10),
        (
            held_by_h(plain(1, lease), None),
            plain(1, lease),
            "a",
            1_000,
        ),
        (
            held_by_h(plain(3, lease), None),
            weighted(plain(3, lease), 2),
            "a",
            10,
        ),
        (
            held_by_h(plain(3, lease), None),
            weighted(plain(3, lease), 3),
            "a",
            10,
        ),
        (held_by_h(fair(2, lease), Some(1)), fair(2, lease), "a", 10),
        (held_by_h(fair(1, lease), Some(1)), fair(1, lease), "h", 10),
        (held_by_h(fair(1, lease), Some(1)), fair(1, lease), "a", 10),
    ];
    for (i, (setup, request, who, at)) in cases.into_iter().enumerate() {
        let mut store = run(&setup);
        let effects = store.effects.len();
        let foretold = would_grant(&store, T0 + at, &id(who), &request).expect("no error");
        assert_eq!(
            store.effects.len(),
            effects,
            "case {i}: it changed something"
        );
        let acquired = acquire(&mut store, T0 + at, &id(who), &request).expect("no error");
        assert_eq!(
            foretold,
            matches!(acquired, Acquired::Granted { .. }),
            "case {i}: {acquired:?}"
        );
    }
}

#[test]
fn a_plan_answers_the_errors_acquire_would() {
    let lease = 1_000;
    let store = run(&[(0, "h", fair(3, lease), Ok(granted(Some(1))))]);
    assert_eq!(
        would_grant(&store, T0 + 10, &id("a"), &plain(3, lease)),
        Err(SemError::KindMismatch { held: Kind::Fair })
    );
    let store = run(&[(0, "h", weighted(plain(3, lease), 2), Ok(granted(None)))]);
    assert_eq!(
        would_grant(&store, T0 + 10, &id("h"), &weighted(plain(3, lease), 1)),
        Err(SemError::CountMismatch { held: 2 })
    );
}

/// A stored limit replaces the caller's: raised, lowered, 0 (paused) or absent; renewals and
/// the permits already held never depend on it.
#[test]
fn a_stored_limit_applies_instead_of_the_callers() {
    let lease = 60_000;
    // (stored limit, caller's limit, live holders, whether a new permit is granted)
    let table = [
        (None, 2, 1, true),
        (None, 2, 2, false),
        (Some(3), 2, 2, true),
        (Some(1), 5, 1, false),
        (Some(0), 5, 0, false),
        (Some(2), 1, 1, true),
    ];
    for (i, (stored, limit, live, want)) in table.into_iter().enumerate() {
        let mut store = MemoryStore::default();
        for h in 0..live {
            let holder = format!("h{h}");
            let got = acquire(&mut store, T0, &id(&holder), &plain(10, lease));
            assert!(matches!(got, Ok(Acquired::Granted { .. })), "case {i}");
        }
        store.stored_limit = stored;
        let foretold = would_grant(&store, T0 + 1, &id("new"), &plain(limit, lease));
        let got = acquire(&mut store, T0 + 1, &id("new"), &plain(limit, lease)).expect("no error");
        assert_eq!(
            matches!(got, Acquired::Granted { .. }),
            want,
            "case {i}: {got:?}"
        );
        assert_eq!(foretold, Ok(want), "case {i}");
        if live > 0 {
            // A holder renews whatever the stored limit says.
            let renewed = acquire(&mut store, T0 + 2, &id("h0"), &plain(limit, lease));
            assert_eq!(renewed, Ok(super::tests::renewed(None)), "case {i}");
        }
    }
}

/// The plans of a set release or refresh find exactly the errors the rules would answer.
#[test]
fn plans_find_the_errors_of_release_and_refresh() {
    let lease = 60_000;
    let mut store = run(&[(0, "h", weighted(plain(5, lease), 2), Ok(granted(None)))]);
    assert_eq!(check_release(&store, T0 + 1, &id("h")), Ok(()));
    assert_eq!(check_refresh(&store, T0 + 1), Ok(()));
    store.weights_are_garbage = true;
    let released = release(&mut store, T0 + 1, &id("h"), None);
    assert!(released.is_err(), "{released:?}");
    assert_eq!(
        check_release(&store, T0 + 1, &id("h")),
        released.map(|_| ())
    );
    let refreshed = refresh(&mut store, T0 + 1, &id("h"), lease);
    assert_eq!(check_refresh(&store, T0 + 1), refreshed.map(|_| ()));
    assert!(check_refresh(&store, T0 + 1).is_err());
}

/// A broken stored limit is the same error for a plan as for `acquire`, a renewal's
/// included (a set acquire must not find it only halfway through its grants).
#[test]
fn a_plan_reads_the_stored_limit_where_acquire_does() {
    let lease = 60_000;
    let mut store = run(&[(0, "h", weighted(plain(5, lease), 3), Ok(granted(None)))]);
    store.stored_limit_is_garbage = true;
    for (who, count) in [("h", 3), ("h", 1), ("new", 1)] {
        let request = weighted(plain(5, lease), count);
        let foretold = would_grant(&store, T0 + 1, &id(who), &request);
        assert_eq!(foretold, Err(SemError::StoredLimitCorrupt), "{who} {count}");
        let effects = store.effects.len();
        assert_eq!(
            acquire(&mut store, T0 + 1, &id(who), &request),
            Err(SemError::StoredLimitCorrupt)
        );
        assert_eq!(store.effects.len(), effects);
    }
}
