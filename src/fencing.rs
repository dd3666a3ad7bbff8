//! Fencing tickets that never repeat, even after a failover or a restart that lost the last
//! grants.
//!
//! With asynchronous replication a primary may acknowledge fair grants that never reach its
//! replica (or its AOF) before it dies; the node that takes over holds an older counter and would
//! hand the same tickets out again. So whenever this node's data may be behind what clients were
//! told (it finished loading data at startup, or it became a primary), the next fair grant of each
//! name first moves that name's counter by the margin (`sem.fencing-margin`, 10^9 by default:
//! more fair grants than one name can receive while a primary's writes are unreplicated, at a
//! million grants a second more than 16 minutes of them, while leaving room for 9 million such
//! jumps below 2^53) further: past any grant a lost primary could have made. The names already moved are kept in memory until the next such event, so the cost
//! is one ordered-set lookup per fair grant and memory for the names used since.

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::config::FENCING_MARGIN;

struct State {
    armed: bool,
    moved: BTreeSet<Vec<u8>>,
}

static STATE: Mutex<State> = Mutex::new(State {
    armed: false,
    moved: BTreeSet::new(),
});

fn state() -> std::sync::MutexGuard<'static, State> {
    // A panic while holding the lock cannot leave the state inconsistent: keep using it.
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// This node's data may be behind what clients were told: every name's next fair grant jumps.
pub fn arm() {
    let mut state = state();
    state.armed = true;
    state.moved.clear();
}

/// Forgets everything (a new load of the module).
pub fn reset() {
    let mut state = state();
    state.armed = false;
    state.moved.clear();
}

/// The margin the next fair grant of `name` must add to its counter: the configured margin
/// once per name after [`arm`], otherwise 0.
pub fn margin_for(name: &[u8]) -> u64 {
    let state = state();
    if state.armed && !state.moved.contains(name) {
        FENCING_MARGIN.get() as u64
    } else {
        0
    }
}

/// A fair grant of `name` moved its counter by the margin.
pub fn moved(name: &[u8]) {
    let mut state = state();
    if state.armed {
        state.moved.insert(name.to_vec());
    }
}

/// How many names have moved since the last [`arm`] (for tests and INFO).
#[cfg(test)]
fn moved_count() -> usize {
    state().moved.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_jumps_once_after_each_arming() {
        assert_eq!(margin_for(b"a"), 0, "nothing jumps before the first arming");
        arm();
        let margin = FENCING_MARGIN.get() as u64;
        assert_eq!(margin_for(b"a"), margin);
        moved(b"a");
        assert_eq!(margin_for(b"a"), 0);
        assert_eq!(margin_for(b"b"), margin);
        assert_eq!(moved_count(), 1);
        arm();
        assert_eq!(
            margin_for(b"a"),
            margin,
            "a new arming moves every name again"
        );
        assert_eq!(moved_count(), 0);
    }
}
