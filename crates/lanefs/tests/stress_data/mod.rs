//! What the library and mount stress tests (tests/stress.rs, lanefs-cli's tests/fuse_stress.rs)
//! share besides the watchdog: the set-up pattern their stable zones are checked against, random
//! write payloads, and the run time from `LANEFS_STRESS_SECS`.

use lanefs::rng::Rng;

fn word(i: u64) -> [u8; 8] {
    let w = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (w ^ (w >> 29)).to_le_bytes()
}

/// The set-up contents of `[off, off + buf.len())`: a function of the offset alone.
pub fn fill_pattern(off: u64, buf: &mut [u8]) {
    let mut i = 0;
    while i < buf.len() {
        let o = off + i as u64;
        let (w, s) = (word(o / 8), (o % 8) as usize);
        let n = (8 - s).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&w[s..s + n]);
        i += n;
    }
}

pub fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Seconds each stress test runs (15 by default: CI's quick mode).
pub fn secs_from_env() -> u64 {
    std::env::var("LANEFS_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(15)
}
