//! The key layout of one semaphore, kept from the client-side recipe so redis-cli can inspect it.

/// Suffix of the fair semaphore's sorted set of tickets.
pub const OWNER_SUFFIX: &[u8] = b":owner";
/// Suffix of the fair semaphore's last handed-out ticket.
pub const COUNTER_SUFFIX: &[u8] = b":counter";

/// Calls `use_key` with `<name><suffix>`, assembled on the stack for names of usual length so
/// the hot path opens the derived keys without a heap allocation.
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
