//! Latency histogram with logarithmic buckets (HDR-style).
//!
//! A benchmark thread may run millions of operations per second, so storing every sample would
//! cost more memory (and cache traffic) than the operations being measured. Instead each thread
//! counts its samples into fixed buckets whose width grows with the value: values below 128 ns
//! are exact, larger ones land in one of 64 buckets per power of two, so any reported percentile
//! is within 1/64 (about 1.6 %) of a recorded value. Histograms of different threads merge by
//! adding counts, which keeps percentiles exact over the merged bucket set.

use std::time::Duration;

/// log2 of the number of exact values at the bottom, and twice the sub-buckets per power of two.
const SUB_BITS: u32 = 7;
const EXACT: u64 = 1 << SUB_BITS; // 128 values recorded exactly
const HALF: u64 = EXACT / 2; // 64 sub-buckets per power of two above that
/// Buckets needed to cover every u64: the exact range plus 64 per power of two from 2^7 to 2^63.
const BUCKETS: usize = (EXACT + (64 - SUB_BITS as u64) * HALF) as usize;

/// Counts of values (nanoseconds) in logarithmic buckets, plus exact count, min, max and sum.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    min: u64,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

fn index_of(v: u64) -> usize {
    if v < EXACT {
        return v as usize;
    }
    // e >= SUB_BITS: the position of the top bit; keep the top SUB_BITS bits as the sub-bucket.
    let e = 63 - v.leading_zeros() as u64;
    let shift = e - (SUB_BITS as u64 - 1);
    let top = v >> shift; // in [HALF, EXACT)
    (EXACT + (e - SUB_BITS as u64) * HALF + (top - HALF)) as usize
}

/// The smallest value and the width of bucket `i`.
fn bucket_range(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < EXACT {
        return (i, 1);
    }
    let e = (i - EXACT) / HALF + SUB_BITS as u64;
    let top = (i - EXACT) % HALF + HALF;
    let shift = e - (SUB_BITS as u64 - 1);
    (top << shift, 1u64 << shift)
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram { counts: vec![0; BUCKETS], count: 0, min: u64::MAX, max: 0, sum: 0 }
    }

    /// Records one value in nanoseconds.
    pub fn record_ns(&mut self, v: u64) {
        self.counts[index_of(v)] += 1;
        self.count += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v as u128;
    }

    pub fn record(&mut self, d: Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Adds every sample of `other` to `self`.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn min_ns(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    pub fn max_ns(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// The value at quantile `q` (0.0..=1.0) in nanoseconds: the middle of the bucket that holds
    /// the sample of rank ceil(q * count), clamped to the recorded min and max (so a histogram of
    /// one repeated value answers that value exactly). `None` when nothing was recorded.
    pub fn quantile_ns(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, width) = bucket_range(i);
                let mid = lo as f64 + (width as f64 - 1.0) / 2.0;
                return Some(mid.clamp(self.min as f64, self.max as f64));
            }
        }
        Some(self.max as f64)
    }

    /// [`Self::quantile_ns`] in microseconds, the unit of the reports.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        self.quantile_ns(q).map(|ns| ns / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel_err(got: f64, want: f64) -> f64 {
        (got - want).abs() / want
    }

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for v in (0..100_000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let i = index_of(v);
            assert!(i < BUCKETS);
            assert!(i >= last || v > 100_000);
            let (lo, w) = bucket_range(i);
            assert!(lo <= v && v - lo < w, "value {v} bucket {i} [{lo}, +{w})");
            last = i;
        }
        assert_eq!(index_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn empty_has_no_percentiles() {
        let h = Histogram::new();
        assert_eq!(h.quantile_ns(0.5), None);
        assert_eq!(h.mean_ns(), None);
    }

    #[test]
    fn constant_value_is_exact() {
        let mut h = Histogram::new();
        for _ in 0..1000 {
            h.record_ns(12_345);
        }
        assert_eq!(h.quantile_ns(0.5), Some(12_345.0));
        assert_eq!(h.quantile_ns(0.99), Some(12_345.0));
    }

    #[test]
    fn uniform_distribution_percentiles() {
        let mut h = Histogram::new();
        for v in 1..=1_000_000u64 {
            h.record_ns(v);
        }
        for (q, want) in [(0.5, 500_000.0), (0.9, 900_000.0), (0.99, 990_000.0), (0.999, 999_000.0)] {
            let got = h.quantile_ns(q).unwrap();
            assert!(rel_err(got, want) < 1.0 / 64.0, "q{q}: {got} vs {want}");
        }
        assert_eq!(h.quantile_ns(1.0), Some(1_000_000.0));
        assert_eq!(h.quantile_ns(0.0), Some(1.0));
        assert_eq!(h.mean_ns(), Some(500_000.5));
    }

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::new();
        for v in 0..100u64 {
            h.record_ns(v);
        }
        assert_eq!(h.quantile_ns(0.5), Some(49.0));
        assert_eq!(h.quantile_ns(0.99), Some(98.0));
    }

    #[test]
    fn bimodal_distribution() {
        // 98 % fast (1 µs), 2 % slow (1 ms): p50 sees the fast mode, p99 the slow one.
        let mut h = Histogram::new();
        for i in 0..10_000u64 {
            h.record_ns(if i % 50 == 0 { 1_000_000 } else { 1_000 });
        }
        assert!(rel_err(h.quantile_ns(0.5).unwrap(), 1_000.0) < 1.0 / 64.0);
        assert!(rel_err(h.quantile_ns(0.99).unwrap(), 1_000_000.0) < 1.0 / 64.0);
    }

    #[test]
    fn exponential_distribution() {
        // Deterministic inverse-CDF samples of an exponential with mean 10 µs: quantile q is
        // -ln(1-q) * mean.
        let mut h = Histogram::new();
        let n = 200_000;
        for i in 0..n {
            let u = (i as f64 + 0.5) / n as f64;
            h.record_ns((-(1.0 - u).ln() * 10_000.0) as u64);
        }
        for q in [0.5, 0.9, 0.99] {
            let want = -(1.0f64 - q).ln() * 10_000.0;
            let got = h.quantile_ns(q).unwrap();
            assert!(rel_err(got, want) < 0.02, "q{q}: {got} vs {want}");
        }
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        let mut all = Histogram::new();
        for v in 0..50_000u64 {
            let x = v * 37 % 90_001;
            if v % 3 == 0 {
                a.record_ns(x)
            } else {
                b.record_ns(x)
            }
            all.record_ns(x);
        }
        a.merge(&b);
        assert_eq!(a.count(), all.count());
        for q in [0.01, 0.5, 0.99] {
            assert_eq!(a.quantile_ns(q), all.quantile_ns(q));
        }
        assert_eq!(a.min_ns(), all.min_ns());
        assert_eq!(a.max_ns(), all.max_ns());
    }
}
