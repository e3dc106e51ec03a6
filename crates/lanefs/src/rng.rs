//! The one pseudo-random generator of lanefs's harnesses: crashtest's workloads and crash
//! states, the bench's workloads, the stress and SIGKILL tests and the device benchmark.
//!
//! splitmix64, deterministic: every sequence is derived from a seed, so a violation can be
//! replayed from the seed it prints, and a benchmark issues the same operations on every target.
//! Nothing in the file system itself draws from it.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// One splitmix64 step from state `z`: what `Rng(z).next_u64()` returns. Also a stateless
/// 64-bit hash (the SIGKILL test derives each byte it writes from one of its position).
pub fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// splitmix64: fast, good enough for test generation, and stable across platforms and releases.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let z = self.0;
        self.0 = z.wrapping_add(GOLDEN);
        splitmix64(z)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.next_u64() % n
    }

    /// Uniform index into a slice of length `n` (`n` > 0).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// Uniform in `lo..=hi` (`lo` <= `hi`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }
}

/// A seed derived from a parent seed and a salt (independent streams for workloads and states).
pub fn derive(seed: u64, salt: u64) -> u64 {
    let mut r = Rng::new(seed ^ salt.wrapping_mul(0xD134_2543_DE82_EF95));
    r.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
            assert!(a.below(10) < 10);
            b.below(10);
        }
        assert_eq!(a.below(0), 0);
        let mut v: Vec<u32> = (0..20).collect();
        a.shuffle(&mut v);
        v.sort_unstable();
        assert_eq!(v, (0..20).collect::<Vec<_>>());
        assert_ne!(derive(1, 2), derive(1, 3));
        for _ in 0..100 {
            let x = a.range(5, 7);
            assert!((5..=7).contains(&x));
        }
        // The published splitmix64 sequence for seed 0 (Vigna's reference implementation):
        // the generator must not change under the seeds that replay old violations.
        let mut z = Rng::new(0);
        assert_eq!(z.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(z.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }
}
