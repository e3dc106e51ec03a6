//! Micro-benchmark: what one persist of a small record costs (`lanefs devbench --pmem`).
//!
//! Issue 7 budgets about 0.2-0.4 µs for persisting 256 bytes on a region emulated in /dev/shm.
//! Each iteration writes `bytes` bytes at the next 64-byte-aligned slot of a 1 MiB window (so
//! every persist has dirty lines to write back) and times the `persist` of exactly that range.

use super::{PersistMethod, PmemRegion, RegionOptions, HEADER_BYTES};
use crate::error::{Error, RegionFault, Result};
use std::path::Path;
use std::time::Instant;

/// Size of a region the benchmark creates.
pub const BENCH_REGION_SIZE: u64 = 16 << 20;

/// Result for one method.
#[derive(Debug, Clone, PartialEq)]
pub struct PersistBench {
    /// The persistence method measured.
    pub method: PersistMethod,
    /// [`PmemRegion::describe`] of the region as opened for this method.
    pub description: String,
    /// Bytes persisted per iteration.
    pub bytes: usize,
    /// Iterations timed.
    pub iterations: usize,
    /// Nanoseconds per persist: mean, median and 99th percentile.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// Nanoseconds per write of `bytes` plus its persist, mean.
    pub write_and_persist_ns: f64,
}

impl std::fmt::Display for PersistBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<18} persist {} B: mean {:.0} ns, p50 {:.0} ns, p99 {:.0} ns; write+persist {:.0} ns ({} iterations)",
            self.method.to_string(),
            self.bytes,
            self.mean_ns,
            self.p50_ns,
            self.p99_ns,
            self.write_and_persist_ns,
            self.iterations
        )
    }
}

/// Runs the benchmark on the region file at `path` (created with [`BENCH_REGION_SIZE`] and an
/// all-zero UUID if missing; an existing region is used whatever image it is bound to, and its
/// data area is overwritten) for each method in `methods` (every available one when empty).
pub fn persist_bench(
    path: &Path,
    bytes: usize,
    iterations: usize,
    methods: &[PersistMethod],
) -> Result<Vec<PersistBench>> {
    const WINDOW: usize = 1 << 20;
    if bytes == 0 || bytes > WINDOW || iterations == 0 {
        return Err(Error::InvalidArgument(format!(
            "persist benchmark needs 1..={WINDOW} bytes and at least one iteration"
        )));
    }
    let methods = if methods.is_empty() { PersistMethod::all_available() } else { methods.to_vec() };
    match PmemRegion::open(path, None, &RegionOptions::default()) {
        Ok(_) => {}
        Err(Error::Region { fault: RegionFault::Missing, .. }) => {
            PmemRegion::create(path, BENCH_REGION_SIZE, [0; 16], &RegionOptions::default())?;
        }
        Err(e) => return Err(e),
    }
    let stride = bytes.div_ceil(64) * 64;
    let slots = (WINDOW / stride).max(1);
    let payload: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
    let mut out = Vec::new();
    for m in methods {
        let r = PmemRegion::open(path, None, &RegionOptions { persist: Some(m), ..Default::default() })?;
        r.require((slots * stride) as u64, "the persist benchmark")?;
        let mut samples = Vec::with_capacity(iterations);
        let mut total = 0u128;
        // Warm-up: fault every page of the window in.
        for s in 0..slots {
            r.write_bytes(HEADER_BYTES + s * stride, &payload)?;
        }
        r.persist(HEADER_BYTES..HEADER_BYTES + slots * stride)?;
        for i in 0..iterations {
            let off = HEADER_BYTES + (i % slots) * stride;
            let t0 = Instant::now();
            r.write_bytes(off, &payload)?;
            let t1 = Instant::now();
            r.persist(off..off + bytes)?;
            let t2 = Instant::now();
            samples.push((t2 - t1).as_nanos() as u64);
            total += (t2 - t0).as_nanos();
        }
        samples.sort_unstable();
        let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize] as f64;
        out.push(PersistBench {
            method: m,
            description: r.describe(),
            bytes,
            iterations,
            mean_ns: samples.iter().sum::<u64>() as f64 / iterations as f64,
            p50_ns: pct(0.5),
            p99_ns: pct(0.99),
            write_and_persist_ns: total as f64 / iterations as f64,
        });
    }
    Ok(out)
}
