//! Timestamps for linearization points, and the registry of operations in flight.
//!
//! A [`Timestamp`] is `(ticks, cpu)`, ordered lexicographically: two CPUs may read the same tick,
//! and the CPU id makes the order total. The property every user relies on: if taking timestamp
//! A *happens before* taking timestamp B (same thread, or through any synchronization such as a
//! lock hand-off or a flag), then A < B.
//!
//! Where the ticks come from ([`ClockSource`], chosen once per process):
//! - `Tsc`: `rdtscp` when the CPU reports an invariant TSC (CPUID 0x80000007 EDX bit 8, or the
//!   kernel's `constant_tsc` + `nonstop_tsc` flags) and has RDTSCP. The TSC then ticks at a
//!   constant rate in every power state, and the kernel synchronizes it across cores at boot; on
//!   the development machine cores agree within about 120 cycles. That skew is below the cost of
//!   any cross-core communication (moving one cache line between cores takes hundreds of cycles),
//!   so a happens-before edge between cores always spans more ticks than the skew and the
//!   ordering above holds. `rdtscp` itself waits for earlier loads to complete and later stores
//!   cannot become visible before it retires, so it cannot be reordered across the synchronizing
//!   load or store in hardware; compiler fences keep the compiler from doing it. Its auxiliary
//!   value is the CPU id on Linux, so the tie-break comes for free.
//! - `Monotonic`: CLOCK_MONOTONIC nanoseconds otherwise (or when `LANEFS_CLOCK=monotonic` is set,
//!   for machines whose TSC misbehaves although CPUID says otherwise). To keep the happens-before
//!   ordering and strict increase without relying on clock resolution, every stamp is raised above
//!   the last one issued process-wide through one atomic. That line is shared by all cores: the
//!   fallback trades scalability for correctness on machines without a usable TSC.
//!
//! Why a merge must wait (ScaleFS section 5.2): an operation takes its timestamp at its
//! linearization point but appends its log record a little later. A merge that stamps itself at
//! `t` and then reads the logs could miss an operation stamped before `t` whose record is not yet
//! appended, while applying a later one that depends on it (an unlink before the create it undoes,
//! a resurrected name). So an operation registers in [`InFlight`] when it takes its timestamp and
//! leaves when its record is in the log, and the merge calls [`InFlight::wait_below`]`(t)` before
//! reading. The decision of when to merge and what to read is the engine's; this module provides
//! the registry.

use crate::sync::percpu::{current_cpu, PerCpu};
use crate::sync::rank::{Condvar, Held, Mutex, Rank};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// A point in the linearization order: ticks first, then CPU id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    // Field order is the comparison order (derived Ord is lexicographic).
    ticks: u64,
    cpu: u32,
}

impl Timestamp {
    /// Smaller than or equal to every timestamp.
    #[cfg(test)]
    pub const MIN: Timestamp = Timestamp { ticks: 0, cpu: 0 };
    /// Greater than or equal to every timestamp.
    #[cfg(test)]
    pub const MAX: Timestamp = Timestamp { ticks: u64::MAX, cpu: u32::MAX };

    /// The current time from the process's [`ClockSource`].
    #[inline]
    pub fn now() -> Timestamp {
        now_from(source())
    }

    /// A timestamp from raw parts (for decoding and tests).
    #[cfg(test)]
    pub const fn from_parts(ticks: u64, cpu: u32) -> Timestamp {
        Timestamp { ticks, cpu }
    }

    /// The tick count (TSC cycles or nanoseconds, depending on the source).
    pub fn ticks(self) -> u64 {
        self.ticks
    }

    /// The CPU that took the timestamp (the tie-breaker).
    pub fn cpu(self) -> u32 {
        self.cpu
    }
}

/// Where timestamps come from; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// `rdtscp` on an invariant, synchronized TSC.
    Tsc,
    /// CLOCK_MONOTONIC nanoseconds, made strictly increasing through one shared atomic.
    Monotonic,
}

/// The source this process uses, decided on first use.
pub fn source() -> ClockSource {
    static SOURCE: OnceLock<ClockSource> = OnceLock::new();
    *SOURCE.get_or_init(|| {
        let forced = std::env::var("LANEFS_CLOCK").is_ok_and(|v| v.eq_ignore_ascii_case("monotonic"));
        if !forced && tsc_usable() {
            ClockSource::Tsc
        } else {
            ClockSource::Monotonic
        }
    })
}

#[inline]
fn now_from(src: ClockSource) -> Timestamp {
    match src {
        ClockSource::Tsc => tsc::now(),
        ClockSource::Monotonic => monotonic_now(),
    }
}

#[cfg(target_arch = "x86_64")]
fn tsc_usable() -> bool {
    tsc::cpu_has_rdtscp() && (tsc::cpu_has_invariant_tsc() || kernel_reports_invariant_tsc())
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc_usable() -> bool {
    false
}

/// Linux sets both flags exactly when it trusts the TSC to tick at a constant rate through
/// frequency changes and idle states; some hypervisors pass the flags without the CPUID bit.
#[cfg(target_arch = "x86_64")]
fn kernel_reports_invariant_tsc() -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    info.lines().find(|l| l.starts_with("flags")).is_some_and(|l| {
        let has = |flag: &str| l.split_whitespace().any(|w| w == flag);
        has("constant_tsc") && has("nonstop_tsc")
    })
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    use super::Timestamp;
    use core::arch::x86_64::{__cpuid, __rdtscp};
    use std::sync::atomic::{compiler_fence, Ordering::SeqCst};

    pub(super) fn cpu_has_rdtscp() -> bool {
        max_extended_leaf() >= 0x8000_0001 && __cpuid(0x8000_0001).edx & (1 << 27) != 0
    }

    pub(super) fn cpu_has_invariant_tsc() -> bool {
        max_extended_leaf() >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }

    fn max_extended_leaf() -> u32 {
        __cpuid(0x8000_0000).eax
    }

    /// Only called when [`super::source`] chose `Tsc`, which requires RDTSCP.
    #[inline]
    pub(super) fn now() -> Timestamp {
        let mut aux = 0u32;
        compiler_fence(SeqCst);
        // SAFETY: RDTSCP exists on this CPU (checked through CPUID before the Tsc source is
        // chosen), and the intrinsic writes only to `aux`, a live local.
        let ticks = unsafe { __rdtscp(&mut aux) };
        compiler_fence(SeqCst);
        // Linux loads IA32_TSC_AUX with (node << 12) | cpu.
        Timestamp { ticks, cpu: aux & 0xfff }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod tsc {
    use super::Timestamp;

    /// Never chosen off x86_64 (`tsc_usable` is false); kept so that `now_from` is total.
    pub(super) fn now() -> Timestamp {
        super::monotonic_now()
    }
}

/// CLOCK_MONOTONIC (what `Instant` reads on Linux), raised above every stamp issued before.
fn monotonic_now() -> Timestamp {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    static LAST: AtomicU64 = AtomicU64::new(0);
    /// CAS attempts before giving up on real time; each failure means another thread issued a
    /// stamp, so this only runs out under heavy contention.
    const CAS_TRIES: u32 = 16;

    let epoch = *EPOCH.get_or_init(Instant::now);
    // u64 nanoseconds last 584 years of uptime; saturate rather than wrap after that.
    let raw = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let cpu = u32::try_from(current_cpu()).unwrap_or(u32::MAX);
    // Every issued value is written to LAST and LAST only grows, so a stamp whose RMW comes later
    // in LAST's modification order (as any stamp taken after a happens-before edge does) is larger.
    let mut prev = LAST.load(Ordering::Relaxed);
    for _ in 0..CAS_TRIES {
        let next = raw.max(prev.saturating_add(1));
        match LAST.compare_exchange_weak(prev, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Timestamp { ticks: next, cpu },
            Err(p) => prev = p,
        }
    }
    // Wait-free fallback: still unique and above everything issued, just not tied to real time.
    let ticks = LAST.fetch_add(1, Ordering::AcqRel).saturating_add(1);
    Timestamp { ticks, cpu }
}

/// How often a waiter re-checks a slot before parking on it. An operation is in flight only from
/// its linearization point to its log append, normally well under a microsecond.
const WAIT_SPINS: u32 = 64;

#[derive(Default)]
struct SlotState {
    next_id: u64,
    /// (registration id, timestamp) of every operation registered on this slot and not finished.
    ops: Vec<(u64, Timestamp)>,
    /// Threads parked in `wait_below` on this slot; finishing operations wake them only if > 0.
    waiters: usize,
}

impl SlotState {
    fn any_below(&self, ts: Timestamp) -> bool {
        self.ops.iter().any(|&(_, t)| t < ts)
    }
}

struct Slot {
    state: Mutex<SlotState>,
    finished: Condvar,
}

impl Default for Slot {
    fn default() -> Self {
        Slot { state: Mutex::new(Rank::ClockSlot, SlotState::default()), finished: Condvar::new() }
    }
}

/// Per-CPU registry of operations that hold a timestamp but whose log record is not yet
/// appended.
///
/// An operation calls [`begin`](Self::begin) at its linearization point: the timestamp is taken
/// *while the registration is being made* (under the slot's lock), so there is no window in which
/// an operation holds a timestamp but is invisible here. Consequently, if a merge takes
/// `t = Timestamp::now()` and then calls [`wait_below`](Self::wait_below)`(t)`, every operation
/// with a smaller timestamp is either already finished or waited for: one whose registration the
/// merge does not see took its slot lock after the merge released it, hence took its timestamp
/// after `t` was taken, hence has a larger one.
pub struct InFlight {
    slots: PerCpu<Slot>,
}

impl InFlight {
    /// A registry with one slot per possible CPU.
    pub fn new() -> Self {
        InFlight { slots: PerCpu::new(|_| Slot::default()) }
    }

    /// A registry with exactly `n` slots (at least one); any `n` is correct.
    #[cfg(test)]
    pub fn with_slots(n: usize) -> Self {
        InFlight { slots: PerCpu::with_slots(n, |_| Slot::default()) }
    }

    /// Takes a timestamp and registers the operation under it, on the caller's CPU slot. Call it
    /// at the linearization point; drop (or [`finish`](InFlightOp::finish)) the result once the
    /// operation's log record is appended.
    pub fn begin(&self) -> InFlightOp<'_> {
        let held = Held::without_waiting(Rank::InFlightOp);
        let slot = self.slots.current_slot();
        let mut st = self.slots.get(slot).state.lock();
        let ts = Timestamp::now();
        let id = st.next_id;
        st.next_id = st.next_id.wrapping_add(1);
        st.ops.push((id, ts));
        InFlightOp { reg: self, slot, id, ts, _held: held }
    }

    /// True if some registered operation has a timestamp strictly below `ts` (stale at once).
    #[cfg(test)]
    pub fn any_below(&self, ts: Timestamp) -> bool {
        self.slots.iter().any(|s| s.state.lock().any_below(ts))
    }

    /// Returns once no operation registered with a timestamp strictly below `ts` remains.
    /// Operations registered later get larger timestamps (if `ts` was taken before this call)
    /// and are not waited for. Spins briefly per slot, then parks until an operation finishes.
    ///
    /// The caller must not itself hold an [`InFlightOp`] stamped below `ts`: it would wait for
    /// itself forever.
    pub fn wait_below(&self, ts: Timestamp) {
        // Waiting for registered operations is acquiring what they hold: a caller holding a
        // lock an in-flight operation needs before it finishes would wait forever.
        let _waits = Held::acquire(Rank::InFlightOp);
        for slot in self.slots.iter() {
            let mut clear = false;
            for _ in 0..WAIT_SPINS {
                if !slot.state.lock().any_below(ts) {
                    clear = true;
                    break;
                }
                std::hint::spin_loop();
            }
            if clear {
                continue;
            }
            let mut st = slot.state.lock();
            st.waiters += 1;
            // Each wake-up follows a finish on this slot; only operations already registered can
            // be below `ts`, so this ends after at most that many wake-ups (plus spurious ones).
            while st.any_below(ts) {
                slot.finished.wait(&mut st);
            }
            st.waiters -= 1;
        }
    }

    #[cfg(test)]
    fn parked_waiters(&self) -> usize {
        self.slots.iter().map(|s| s.state.lock().waiters).sum()
    }
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n: usize = self.slots.iter().map(|s| s.state.lock().ops.len()).sum();
        f.debug_struct("InFlight").field("in_flight", &n).finish()
    }
}

/// One registered operation; deregisters on drop.
#[must_use = "dropping the registration at once means the operation is no longer in flight"]
pub struct InFlightOp<'a> {
    reg: &'a InFlight,
    /// The slot it registered on (the thread may have migrated since).
    slot: usize,
    id: u64,
    ts: Timestamp,
    /// Registered operations are waited for by merges: a rank in the lock hierarchy.
    _held: Held,
}

impl InFlightOp<'_> {
    /// The operation's timestamp, taken at registration.
    pub fn timestamp(&self) -> Timestamp {
        self.ts
    }

    /// Deregisters: the operation's log record is appended. Same as dropping.
    #[cfg(test)]
    pub fn finish(self) {}
}

impl Drop for InFlightOp<'_> {
    fn drop(&mut self) {
        let slot = self.reg.slots.get(self.slot);
        let mut st = slot.state.lock();
        if let Some(i) = st.ops.iter().position(|&(id, _)| id == self.id) {
            st.ops.swap_remove(i);
        }
        if st.waiters > 0 {
            slot.finished.notify_all();
        }
    }
}

impl std::fmt::Debug for InFlightOp<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlightOp").field("ts", &self.ts).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

    fn sources() -> Vec<ClockSource> {
        let mut v = vec![ClockSource::Monotonic];
        if tsc_usable() {
            v.push(ClockSource::Tsc);
        }
        v
    }

    #[test]
    fn ordering_is_ticks_then_cpu() {
        crate::sync::rank::exempt_this_thread();
        let a = Timestamp::from_parts(5, 9);
        let b = Timestamp::from_parts(6, 0);
        let c = Timestamp::from_parts(6, 1);
        assert!(a < b && b < c);
        assert!(Timestamp::MIN <= a && c <= Timestamp::MAX);
        assert_eq!((c.ticks(), c.cpu()), (6, 1));
    }

    #[test]
    fn invariant_tsc_is_used_when_reported() {
        crate::sync::rank::exempt_this_thread();
        // The development machine reports an invariant TSC; wherever one is reported the
        // default (un-forced) source must be the TSC.
        if std::env::var_os("LANEFS_CLOCK").is_none() && tsc_usable() {
            assert_eq!(source(), ClockSource::Tsc);
        }
    }

    #[test]
    fn one_thread_strictly_increases() {
        crate::sync::rank::exempt_this_thread();
        for src in sources() {
            let mut prev = now_from(src);
            for _ in 0..100_000 {
                let t = now_from(src);
                assert!(t > prev, "{src:?}: {t:?} not after {prev:?}");
                prev = t;
            }
        }
    }

    /// Two threads pass a token back and forth; each takes a timestamp after seeing the token
    /// and before passing it on. The stamps, in token order, must strictly increase.
    #[test]
    fn happens_before_across_threads() {
        crate::sync::rank::exempt_this_thread();
        const STEPS: u64 = 20_000;
        for src in sources() {
            let turn = AtomicU64::new(0);
            let stamps: Vec<Vec<(u64, Timestamp)>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2u64)
                    .map(|me| {
                        let turn = &turn;
                        s.spawn(move || {
                            crate::sync::rank::exempt_this_thread();
                            let mut mine = Vec::new();
                            let mut step = me;
                            while step < STEPS {
                                let mut spins = 0u32;
                                while turn.load(Ordering::Acquire) != step {
                                    spins += 1;
                                    if spins < 100 {
                                        std::hint::spin_loop();
                                    } else {
                                        std::thread::yield_now();
                                    }
                                }
                                mine.push((step, now_from(src)));
                                turn.store(step + 1, Ordering::Release);
                                step += 2;
                            }
                            mine
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut all: Vec<_> = stamps.into_iter().flatten().collect();
            all.sort_by_key(|&(step, _)| step);
            assert_eq!(all.len() as u64, STEPS);
            for w in all.windows(2) {
                assert!(w[0].1 < w[1].1, "{src:?}: step {} {:?} !< {:?}", w[1].0, w[0].1, w[1].1);
            }
        }
    }

    #[test]
    fn wait_below_waits_for_lower_and_not_for_higher() {
        crate::sync::rank::exempt_this_thread();
        let reg = InFlight::new();
        let before = Timestamp::now();
        let op = reg.begin();
        let t_op = op.timestamp();
        assert!(t_op > before);
        let after = Timestamp::now();
        assert!(reg.any_below(after));
        assert!(!reg.any_below(t_op), "strictly below");
        // Not waited for: nothing registered is below these.
        reg.wait_below(t_op);
        reg.wait_below(before);

        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                crate::sync::rank::exempt_this_thread();
                reg.wait_below(after);
                done.store(true, SeqCst);
            });
            // Deterministic: wait until the waiter is parked on the registered op.
            while reg.parked_waiters() == 0 {
                assert!(!done.load(SeqCst), "wait_below returned while a lower op is in flight");
                std::thread::yield_now();
            }
            assert!(!done.load(SeqCst));
            op.finish();
        });
        assert!(done.load(SeqCst));
        assert!(!reg.any_below(Timestamp::MAX));
    }

    #[test]
    fn wait_below_concurrent_ops() {
        crate::sync::rank::exempt_this_thread();
        // Many operations register and finish while a merger repeatedly waits; after each wait,
        // nothing below its timestamp is registered.
        let reg = InFlight::with_slots(2);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    crate::sync::rank::exempt_this_thread();
                    while !stop.load(SeqCst) {
                        let op = reg.begin();
                        std::hint::spin_loop();
                        drop(op);
                    }
                });
            }
            for _ in 0..2_000 {
                let t = Timestamp::now();
                reg.wait_below(t);
                // Operations registered after the wait have larger stamps than t, so none below.
                assert!(!reg.any_below(t));
            }
            stop.store(true, SeqCst);
        });
    }
}
