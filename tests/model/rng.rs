//! A tiny seeded PRNG (splitmix64): the same seed gives the same choices, so a failing run's
//! seed names its sequence of steps.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`); the modulo bias is negligible for the small `n` used here.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    /// True with probability `percent` / 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// One of `table`'s values, each as likely as its weight.
    pub fn weighted<T: Copy>(&mut self, table: &[(u32, T)]) -> T {
        let total: u64 = table.iter().map(|(w, _)| u64::from(*w)).sum();
        let mut roll = self.next_u64() % total;
        for &(weight, value) in table {
            if roll < u64::from(weight) {
                return value;
            }
            roll -= u64::from(weight);
        }
        unreachable!("the roll is below the total weight")
    }
}
