//! The key layout of one semaphore, kept from the client-side recipe so redis-cli can inspect it,
//! and how a call names all of its keys to the server.
//!
//! Redis checks ACLs and Cluster slots (MOVED, ASK, TRYAGAIN) only on the keys a command
//! declares, so a call must carry every key it touches. The command filter inserts the derived
//! keys right after the name: `SEM.ACQUIRE jobs 3 30` runs as
//! `SEM.ACQUIRE jobs jobs:owner jobs:counter jobs:permits 3 30`, and the command reports those positions
//! as keys (`getkeys-api`). Clients never send them: a static key range would make
//! cluster-aware clients hash `limit` and `lease` as keys.

/// Suffix of the fair semaphore's sorted set of tickets.
pub const OWNER_SUFFIX: &[u8] = b":owner";
/// Suffix of the fair semaphore's last handed-out ticket.
pub const COUNTER_SUFFIX: &[u8] = b":counter";
/// Suffix of the permits of holders that hold more than one (`COUNT`).
pub const PERMITS_SUFFIX: &[u8] = b":permits";
/// Suffix of the limit an operator stored (`SEM.LIMIT`), which every acquire uses instead of
/// its own while it exists.
pub const LIMIT_SUFFIX: &[u8] = b":limit";

/// Every derived key, in the order the filter inserts them after the name.
pub const DERIVED: &[&[u8]] = &[OWNER_SUFFIX, COUNTER_SUFFIX, PERMITS_SUFFIX, LIMIT_SUFFIX];

/// Every name is `sem.` and lowercase letters, at most 16 bytes: ORing 0x20 into each byte
/// but the dot (byte 3) makes an upper-case letter lower-case and leaves a name's byte unchanged,
/// and maps no other byte to a letter or to the dot, so two names of one length are equal
/// ignoring ASCII case exactly when their folded words are (padding folds the same on both).
const CASE: u128 = u128::from_le_bytes([
    0x20, 0x20, 0x20, 0, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
]);

/// `name` (at most 16 bytes) as a little-endian word, zero-padded, case-folded by [`CASE`].
const fn folded(name: &[u8]) -> u128 {
    let mut bytes = [0u8; 16];
    let mut i = 0;
    while i < name.len() {
        bytes[i] = name[i];
        i += 1;
    }
    u128::from_le_bytes(bytes) | CASE
}

/// Each command's folded name, by its place in [`Command`].
const FOLDED: [u128; Command::ALL.len()] = {
    let mut words = [0; Command::ALL.len()];
    let mut i = 0;
    while i < words.len() {
        words[i] = folded(Command::ALL[i].name().as_bytes());
        i += 1;
    }
    words
};

/// The SEM.* commands, as the filter and the handlers tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Acquire,
    AcquireFair,
    Refresh,
    Release,
    Get,
    WaitEmpty,
    Limit,
    AcquireAll,
    ReleaseAll,
    RefreshAll,
}

impl Command {
    pub const ALL: [Command; 10] = [
        Command::Acquire,
        Command::AcquireFair,
        Command::Refresh,
        Command::Release,
        Command::Get,
        Command::WaitEmpty,
        Command::Limit,
        Command::AcquireAll,
        Command::ReleaseAll,
        Command::RefreshAll,
    ];

    /// The command's name as registered, and as Redis writes it in error messages.
    pub const fn name(self) -> &'static str {
        match self {
            Command::Acquire => "sem.acquire",
            Command::AcquireFair => "sem.acquirefair",
            Command::Refresh => "sem.refresh",
            Command::Release => "sem.release",
            Command::Get => "sem.get",
            Command::WaitEmpty => "sem.waitempty",
            Command::Limit => "sem.limit",
            Command::AcquireAll => "sem.acquireall",
            Command::ReleaseAll => "sem.releaseall",
            Command::RefreshAll => "sem.refreshall",
        }
    }

    /// Which command `name` calls (case-insensitive), if a SEM.* one. Cheap for the others:
    /// the filter asks this of every command the server runs.
    pub fn from_name(name: &[u8]) -> Option<Command> {
        // By length first: at most three names share one. Then one compare of the whole name
        // as a word (see `folded`) per candidate instead of a case fold per byte.
        let candidates: &[Command] = match name.len() {
            7 => &[Command::Get],
            9 => &[Command::Limit],
            11 => &[Command::Acquire, Command::Release, Command::Refresh],
            13 => &[Command::WaitEmpty],
            14 => &[
                Command::AcquireAll,
                Command::ReleaseAll,
                Command::RefreshAll,
            ],
            15 => &[Command::AcquireFair],
            _ => return None,
        };
        let word = folded(name);
        candidates
            .iter()
            .copied()
            .find(|&command| FOLDED[command as usize] == word)
    }

    /// The suffixes of the derived keys the command reads or writes, in the order they follow
    /// the name. Every command names all four: any write may grant a permit to a waiter (which
    /// takes a ticket when fair, under the stored limit if there is one) or expire a weighted
    /// holder, and `SEM.GET ... JSON` shows them.
    pub fn derived_suffixes(self) -> &'static [&'static [u8]] {
        DERIVED
    }

    /// For a command on a set of semaphores (`numsems name ...`), how far apart the names are:
    /// a name, limit and count each for SEM.ACQUIREALL, one word each for the others.
    pub fn set_step(self) -> Option<usize> {
        match self {
            Command::AcquireAll => Some(3),
            Command::ReleaseAll | Command::RefreshAll => Some(1),
            _ => None,
        }
    }
}

/// The most semaphores one call may name.
pub const MAX_SET: usize = 64;

/// Where the names of a call on a set of semaphores are, given `numsems` as sent and the
/// number of arguments the client sent (command name included): `None` when `numsems` is not
/// a number from 1 to [`MAX_SET`] or the arguments end before the last name. The filter
/// appends each name's derived keys after the client's arguments, in the names' order.
pub fn set_name_positions(step: usize, numsems: &[u8], sent: usize) -> Option<Vec<usize>> {
    if numsems.is_empty() || numsems.len() > 2 || !numsems.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: usize = std::str::from_utf8(numsems).ok()?.parse().ok()?;
    if !(1..=MAX_SET).contains(&n) {
        return None;
    }
    let positions: Vec<usize> = (0..n).map(|i| 2 + i * step).collect();
    (positions[n - 1] < sent).then_some(positions)
}

/// Where a call sent without its derived keys must receive them: each name's keys (see
/// [`DERIVED`]), in the names' order, go in at `at`. The filter and, where the filter cannot
/// insert them, the command itself follow the same plan, so a call runs the same either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPlan {
    /// A call on one semaphore: its keys go right after the name.
    Single,
    /// A call on a set: every name's keys go after the client's arguments (`at`).
    Set { at: usize, names: Vec<usize> },
}

impl KeyPlan {
    pub fn at(&self) -> usize {
        match self {
            KeyPlan::Single => 2,
            KeyPlan::Set { at, .. } => *at,
        }
    }

    pub fn names(&self) -> &[usize] {
        match self {
            KeyPlan::Single => &[1],
            KeyPlan::Set { names, .. } => names,
        }
    }
}

/// The plan for a call of `command` with `argc` arguments (command name included), `arg(i)`
/// reading argument `i`: `None` when the call carries its keys already (Redis 7.0 filters a
/// command again after `CLIENT PAUSE WRITE`; clients may send the long form) or is malformed,
/// which the command answers. No call of the short form carries them: each would be an invalid
/// limit, lease, identifier or option.
pub fn key_plan<'a>(
    command: Command,
    argc: usize,
    arg: impl Fn(usize) -> Option<&'a [u8]>,
) -> Option<KeyPlan> {
    let suffixes = command.derived_suffixes();
    let carried = |names: &[usize], start: usize| {
        argc >= start + names.len() * suffixes.len()
            && names.iter().enumerate().all(|(i, &pos)| {
                arg(pos).is_some_and(|name| {
                    suffixes.iter().enumerate().all(|(j, suffix)| {
                        let at = start + i * suffixes.len() + j;
                        arg(at).is_some_and(|key| is_derived(key, name, suffix))
                    })
                })
            })
    };
    let Some(step) = command.set_step() else {
        if argc < 2 || carried(&[1], 2) {
            return None;
        }
        return Some(KeyPlan::Single);
    };
    let names = set_name_positions(step, arg(1)?, argc)?;
    let total = names.len() * suffixes.len();
    let last = names[names.len() - 1];
    if argc >= last + 1 + total && carried(&names, argc - total) {
        return None;
    }
    Some(KeyPlan::Set { at: argc, names })
}

/// Calls `use_key` with `<name><suffix>`, assembled on the stack for names of usual length so
/// the filter builds the derived names without a heap allocation of its own.
pub fn with_derived<T>(name: &[u8], suffix: &[u8], use_key: impl FnOnce(&[u8]) -> T) -> T {
    let len = name.len() + suffix.len();
    let mut stack = [0u8; 256];
    let mut heap = Vec::new();
    let key = if len <= stack.len() {
        &mut stack[..len]
    } else {
        heap.resize(len, 0);
        &mut heap[..]
    };
    key[..name.len()].copy_from_slice(name);
    key[name.len()..].copy_from_slice(suffix);
    use_key(key)
}

/// Whether `key` is `<name><suffix>`.
pub fn is_derived(key: &[u8], name: &[u8], suffix: &[u8]) -> bool {
    key.len() == name.len() + suffix.len() && key.starts_with(name) && key.ends_with(suffix)
}

/// Whether Redis Cluster hashes `name` by a hash tag: the bytes between the first `{` and the
/// first `}` after it, when there is at least one. Only then do `<name>`, `<name>:owner` and
/// `<name>:counter` land in the same slot, whatever suffix follows.
pub fn has_hash_tag(name: &[u8]) -> bool {
    let Some(open) = name.iter().position(|&b| b == b'{') else {
        return false;
    };
    match name[open + 1..].iter().position(|&b| b == b'}') {
        Some(len) => len > 0,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_append_the_suffix() {
        let derived = |name: &[u8], suffix| with_derived(name, suffix, <[u8]>::to_vec);
        assert_eq!(derived(b"jobs", OWNER_SUFFIX), b"jobs:owner");
        assert_eq!(derived(b"{jobs}", COUNTER_SUFFIX), b"{jobs}:counter");
        let long = vec![b'n'; 300];
        assert_eq!(
            derived(&long, OWNER_SUFFIX),
            [&long[..], OWNER_SUFFIX].concat()
        );
        assert!(is_derived(b"jobs:owner", b"jobs", OWNER_SUFFIX));
        assert!(!is_derived(b"jobs:owner", b"job", OWNER_SUFFIX));
        assert!(!is_derived(b"jobs:counter", b"jobs", OWNER_SUFFIX));
        assert!(!is_derived(b"xjobs:owner", b"jobs", OWNER_SUFFIX));
    }

    #[test]
    fn folded_names_are_in_the_commands_order() {
        for (i, command) in Command::ALL.into_iter().enumerate() {
            assert_eq!(command as usize, i);
            assert_eq!(FOLDED[i], folded(command.name().as_bytes()));
        }
    }

    #[test]
    fn one_byte_changed_matches_exactly_as_a_case_fold_per_byte() {
        for command in Command::ALL {
            let name = command.name().as_bytes();
            for at in 0..name.len() {
                for byte in 0..=u8::MAX {
                    let mut other = name.to_vec();
                    other[at] = byte;
                    let expected = name.eq_ignore_ascii_case(&other).then_some(command);
                    assert_eq!(Command::from_name(&other), expected, "{other:?}");
                }
            }
        }
    }

    #[test]
    fn commands_are_recognised_by_name_in_any_case() {
        for command in Command::ALL {
            assert_eq!(Command::from_name(command.name().as_bytes()), Some(command));
            let upper = command.name().to_ascii_uppercase();
            assert_eq!(Command::from_name(upper.as_bytes()), Some(command));
        }
        assert_eq!(
            Command::from_name(b"Sem.AcquireFair"),
            Some(Command::AcquireFair)
        );
        for other in [
            &b"GET"[..],
            b"SEM.GETX",
            b"SEM.ACQUIREX",
            b"SEMXACQUIRE",
            b"",
            b"sem.",
            b"sem\x0eacquire",
            b"sem.acquir\x05",
            b"SEM.ACQUIR[",
        ] {
            assert_eq!(Command::from_name(other), None, "{other:?}");
        }
    }

    #[test]
    fn set_calls_find_their_names() {
        assert_eq!(set_name_positions(3, b"2", 9), Some(vec![2, 5]));
        assert_eq!(set_name_positions(1, b"3", 6), Some(vec![2, 3, 4]));
        assert_eq!(set_name_positions(1, b"3", 4), None, "a name missing");
        for bad in [&b"0"[..], b"", b"-1", b"1x", b"65", b"999", b" 1"] {
            assert_eq!(set_name_positions(1, bad, 100), None, "{bad:?}");
        }
        assert_eq!(set_name_positions(1, b"64", 66).map(|p| p.len()), Some(64));
        assert_eq!(set_name_positions(1, b"07", 100).map(|p| p.len()), Some(7));
    }

    #[test]
    fn short_calls_get_a_plan_and_long_ones_none() {
        let plan = |command, args: &[&str]| {
            key_plan(command, args.len(), |i| args.get(i).map(|a| a.as_bytes()))
        };
        let single = Some(KeyPlan::Single);
        assert_eq!(
            plan(Command::Acquire, &["SEM.ACQUIRE", "j", "3", "30"]),
            single
        );
        assert_eq!(plan(Command::Get, &["SEM.GET", "j"]), single);
        assert_eq!(plan(Command::Get, &["SEM.GET"]), None, "no name");
        let long = [
            "SEM.GET",
            "j",
            "j:owner",
            "j:counter",
            "j:permits",
            "j:limit",
        ];
        assert_eq!(plan(Command::Get, &long), None);
        let partial = ["SEM.GET", "j", "j:owner", "j:counter", "j:permits", "x"];
        assert_eq!(plan(Command::Get, &partial), single);
        let set = ["SEM.RELEASEALL", "2", "a", "b", "id"];
        assert_eq!(
            plan(Command::ReleaseAll, &set),
            Some(KeyPlan::Set {
                at: 5,
                names: vec![2, 3]
            })
        );
        let mut appended = set.to_vec();
        for name in ["a", "b"] {
            for suffix in ["owner", "counter", "permits", "limit"] {
                appended.push(Box::leak(format!("{name}:{suffix}").into_boxed_str()));
            }
        }
        assert_eq!(plan(Command::ReleaseAll, &appended), None);
        assert_eq!(
            plan(Command::ReleaseAll, &["SEM.RELEASEALL", "x", "a"]),
            None
        );
        assert_eq!(
            plan(Command::ReleaseAll, &["SEM.RELEASEALL", "3", "a"]),
            None
        );
    }

    #[test]
    fn hash_tags_follow_the_cluster_rule() {
        let table: &[(&str, bool)] = &[
            ("{jobs}", true),
            ("sem:{jobs}", true),
            ("{a}b{c}", true),
            ("a{b}", true),
            ("{}", false),
            ("{}jobs{x}", false),
            ("jobs", false),
            ("{jobs", false),
            ("jobs}", false),
            ("}{", false),
        ];
        for (name, want) in table {
            assert_eq!(has_hash_tag(name.as_bytes()), *want, "{name}");
        }
    }
}
