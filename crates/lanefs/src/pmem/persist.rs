//! How stores reach persistence: cache-line write-back instructions or msync.
//!
//! The crate's `unsafe` lives in small modules that exist for it: the io_uring buffers
//! (`device/uring.rs`, `device/aligned.rs`), the per-CPU slots (`sync/percpu.rs`,
//! `oplog/clock.rs`), the mapping in `pmem/` (`mod.rs`, `open.rs`, `access.rs`), and here: one
//! instruction per cache line, in inline assembly because stable Rust has no intrinsics for CLWB
//! and CLFLUSHOPT.

use std::fmt;

/// Bytes per cache line: the unit a write-back instruction flushes and the unit of the crash
/// model's "persisted" state.
pub const LINE: usize = 64;

/// How [`super::PmemRegion::persist`] makes a range durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistMethod {
    /// CLWB per 64-byte line, then SFENCE (the line stays cached).
    Clwb,
    /// CLFLUSHOPT per 64-byte line, then SFENCE (the line is evicted).
    Clflushopt,
    /// msync(MS_SYNC) of the pages the range touches.
    Msync,
}

impl fmt::Display for PersistMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PersistMethod::Clwb => "clwb+sfence",
            PersistMethod::Clflushopt => "clflushopt+sfence",
            PersistMethod::Msync => "msync",
        })
    }
}

impl PersistMethod {
    /// Whether this CPU can execute the method.
    pub fn available(self) -> bool {
        match self {
            PersistMethod::Msync => true,
            PersistMethod::Clwb => leaf7_ebx() & (1 << 24) != 0,
            PersistMethod::Clflushopt => leaf7_ebx() & (1 << 23) != 0,
        }
    }

    /// The best cache-line method this CPU has (CLWB, else CLFLUSHOPT), if any.
    pub fn best_cache_flush() -> Option<PersistMethod> {
        [PersistMethod::Clwb, PersistMethod::Clflushopt].into_iter().find(|m| m.available())
    }

    /// Every method this CPU can execute.
    pub fn all_available() -> Vec<PersistMethod> {
        [PersistMethod::Clwb, PersistMethod::Clflushopt, PersistMethod::Msync]
            .into_iter()
            .filter(|m| m.available())
            .collect()
    }
}

/// EBX of CPUID leaf 7, sub-leaf 0 (structured extended features: bit 23 CLFLUSHOPT, bit 24
/// CLWB), read once. `std::arch::is_x86_feature_detected!` does not know these two features.
///
/// CPUID became a safe intrinsic in newer toolchains; the `unsafe` blocks stay for the crate's
/// minimum Rust version, where it is not.
#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)]
fn leaf7_ebx() -> u32 {
    static EBX: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EBX.get_or_init(|| {
        use core::arch::x86_64::{__cpuid, __cpuid_count};
        // SAFETY: CPUID exists on every x86_64 CPU, reads no memory and has no side effect.
        let max_leaf = unsafe { __cpuid(0) }.eax;
        if max_leaf < 7 {
            return 0;
        }
        // SAFETY: as above; leaf 7 exists (max_leaf >= 7).
        unsafe { __cpuid_count(7, 0) }.ebx
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn leaf7_ebx() -> u32 {
    0
}

/// Writes back every cache line of `[start, start + len)` with `method` (CLWB or CLFLUSHOPT),
/// without a fence: call [`fence`] after the last range.
///
/// The caller guarantees that the range lies inside one live mapping and that `method` is
/// available (checked once when the region was opened).
#[cfg(target_arch = "x86_64")]
pub(super) fn write_back(method: PersistMethod, start: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let end = start as usize + len;
    let mut line = start as usize & !(LINE - 1);
    match method {
        PersistMethod::Clwb => {
            while line < end {
                // SAFETY: `line` is the address of a cache line that holds a byte of the caller's
                // range, inside a live mapping; CLWB reads no memory visible to Rust, writes none,
                // and only asks the cache to write the line back. The CPU has CLWB (checked when
                // the region chose its method).
                unsafe { core::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags)) };
                line += LINE;
            }
        }
        PersistMethod::Clflushopt => {
            while line < end {
                // SAFETY: as for CLWB above; CLFLUSHOPT also evicts the line, which changes no
                // value a later load sees. The CPU has CLFLUSHOPT (checked at open).
                unsafe {
                    core::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags))
                };
                line += LINE;
            }
        }
        PersistMethod::Msync => unreachable!("msync is not a cache-line method"),
    }
}

/// Waits until the write-backs issued before it are complete (SFENCE): the stores they cover
/// are then in the persistence domain, before any later store.
#[cfg(target_arch = "x86_64")]
pub(super) fn fence() {
    // SAFETY: SFENCE has no operands and touches no memory; SSE is part of the x86_64 baseline.
    unsafe { core::arch::x86_64::_mm_sfence() };
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn write_back(_method: PersistMethod, _start: *const u8, _len: usize) {
    unreachable!("cache-line methods are never available off x86_64")
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn fence() {}
