//! Per-CPU identity and per-CPU storage.
//!
//! A [`PerCpu<T>`] holds one `T` per possible CPU, each in its own cache line
//! ([`CachePadded`]), so that threads on different cores that touch "their" slot never share a
//! line. The slot is chosen with `sched_getcpu`, which is only a hint: the thread may migrate the
//! moment after the call. Every user must therefore be correct when two threads use the same slot
//! or one thread uses two slots; per-CPU placement buys speed, never correctness. Slot lookups wrap
//! modulo the slot count, so a CPU id beyond what we counted at start-up (hotplug, odd topologies)
//! still lands in a valid slot.

use crossbeam::utils::CachePadded;
use std::sync::OnceLock;

/// Upper bound on the number of slots we allocate, whatever the system reports. A corrupt or
/// surprising sysfs must not make us allocate without bound; ids above it wrap.
const MAX_CPUS: usize = 4096;

/// The CPU the calling thread is running on right now (0 if the kernel cannot tell).
///
/// The answer may be stale by the time it is used; see the module documentation.
#[inline]
pub fn current_cpu() -> usize {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours; it only returns an
    // int (or -1 with errno set), which we check before use.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(0)
}

/// The number of CPUs that can ever be online (one more than the highest possible CPU id),
/// computed once per process. Used to size per-CPU arrays.
pub fn possible_cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| detect_possible_cpus().clamp(1, MAX_CPUS))
}

fn detect_possible_cpus() -> usize {
    // "possible" rather than "online" or the affinity mask: sched_getcpu can return any possible
    // id once a CPU is hot-plugged in, and a slot array sized for fewer CPUs would alias them.
    if let Some(n) =
        std::fs::read_to_string("/sys/devices/system/cpu/possible").ok().and_then(|s| parse_cpu_list_max(&s))
    {
        return n + 1;
    }
    // SAFETY: sysconf only reads a configuration value; it has no memory arguments.
    let conf = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    if let Ok(n) = usize::try_from(conf) {
        if n > 0 {
            return n;
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Highest id in a kernel cpu list such as `0-3,8-11` or `0`.
fn parse_cpu_list_max(s: &str) -> Option<usize> {
    s.trim()
        .split(',')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let last = part.rsplit('-').next().unwrap_or(part);
            last.trim().parse::<usize>().ok()
        })
        .try_fold(None, |acc: Option<usize>, id| id.map(|id| Some(acc.map_or(id, |a| a.max(id)))))
        .flatten()
}

/// One cache-line-padded `T` per CPU slot.
pub struct PerCpu<T> {
    slots: Box<[CachePadded<T>]>,
}

impl<T> PerCpu<T> {
    /// One slot per possible CPU, slot `i` initialised with `init(i)`.
    pub fn new(init: impl FnMut(usize) -> T) -> Self {
        Self::with_slots(possible_cpus(), init)
    }

    /// Exactly `n` slots (at least one), slot `i` initialised with `init(i)`. Tests and models use
    /// this to get a fixed slot count independent of the machine.
    pub fn with_slots(n: usize, mut init: impl FnMut(usize) -> T) -> Self {
        let n = n.clamp(1, MAX_CPUS);
        let slots = (0..n).map(|i| CachePadded::new(init(i))).collect();
        PerCpu { slots }
    }

    /// Number of slots.
    #[inline]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The slot index that CPU `cpu` maps to (ids wrap modulo the slot count).
    #[inline]
    pub fn slot_of(&self, cpu: usize) -> usize {
        cpu % self.slots.len()
    }

    /// The slot index for the CPU the caller runs on now.
    #[inline]
    pub fn current_slot(&self) -> usize {
        self.slot_of(current_cpu())
    }

    /// The slot for CPU `cpu` (wrapping).
    #[inline]
    pub fn get(&self, cpu: usize) -> &T {
        &self.slots[self.slot_of(cpu)]
    }

    /// The slot for the CPU the caller runs on now.
    #[inline]
    pub fn current(&self) -> &T {
        self.get(current_cpu())
    }

    /// Every slot, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|s| &**s)
    }
}

impl<T: Default> Default for PerCpu<T> {
    fn default() -> Self {
        Self::new(|_| T::default())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for PerCpu<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_list_parsing() {
        assert_eq!(parse_cpu_list_max("0\n"), Some(0));
        assert_eq!(parse_cpu_list_max("0-1\n"), Some(1));
        assert_eq!(parse_cpu_list_max("0-3,8-11"), Some(11));
        assert_eq!(parse_cpu_list_max("4,2"), Some(4));
        assert_eq!(parse_cpu_list_max(""), None);
        assert_eq!(parse_cpu_list_max("x-y"), None);
    }

    #[test]
    fn current_cpu_is_within_possible() {
        let n = possible_cpus();
        assert!(n >= 1);
        assert!(current_cpu() < n, "cpu {} >= possible {}", current_cpu(), n);
    }

    #[test]
    fn slots_are_padded_and_wrap() {
        let p = PerCpu::with_slots(3, |i| i * 10);
        assert_eq!(p.len(), 3);
        assert_eq!(*p.get(1), 10);
        assert_eq!(*p.get(4), 10);
        assert_eq!(p.iter().copied().collect::<Vec<_>>(), vec![0, 10, 20]);
        let a = p.get(0) as *const usize as usize;
        let b = p.get(1) as *const usize as usize;
        assert!(b - a >= 64, "slots share a cache line");
        assert!(*p.current() % 10 == 0);
    }
}

/// A counter split per CPU: an add writes only the caller's cache line; a read sums the slots.
pub struct PerCpuCounter {
    slots: PerCpu<std::sync::atomic::AtomicU64>,
}

impl Default for PerCpuCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl PerCpuCounter {
    pub fn new() -> Self {
        PerCpuCounter { slots: PerCpu::new(|_| std::sync::atomic::AtomicU64::new(0)) }
    }

    /// Adds `n` on the current CPU's slot; returns that slot's new value.
    #[inline]
    pub fn add(&self, n: u64) -> u64 {
        self.slots.current().fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n
    }

    /// The total (not a snapshot: concurrent adds may or may not be counted).
    pub fn sum(&self) -> u64 {
        self.slots.iter().map(|s| s.load(std::sync::atomic::Ordering::Relaxed)).sum()
    }

    /// Resets every slot; returns what they held.
    pub fn take(&self) -> u64 {
        self.slots.iter().map(|s| s.swap(0, std::sync::atomic::Ordering::Relaxed)).sum()
    }

    /// Number of slots (a per-slot share of a bound is `bound / slots()`).
    pub fn slots(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod counter_tests {
    use super::*;

    #[test]
    fn counter_adds_from_many_threads() {
        let c = std::sync::Arc::new(PerCpuCounter::new());
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        c.add(1);
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(c.sum(), 80_000);
        assert_eq!(c.take(), 80_000);
        assert_eq!(c.sum(), 0);
    }
}
