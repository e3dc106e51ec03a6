//! A sequence lock over a few words, for readers that must write no shared cache line.
//!
//! stat(2) and the path walk read an inode's mode, owner, link count and the like on every
//! call, from every thread; a mutex there makes each reader write the lock's line, and two
//! threads statting one directory then bounce it between their cores. [`SeqWords`] mirrors such
//! fields: readers only load (a counter, the words, the counter again), and a writer, which the
//! caller serialises (it holds the mutex of the authoritative copy), makes the counter odd,
//! stores the words and makes it even again.
//!
//! Invariants:
//! - A reader returns only words that one completed [`SeqWords::write`] stored together (or the
//!   initial ones): never a mix of two writes. Every word is an atomic, so a torn read is
//!   discarded, never undefined behaviour.
//! - A reader never waits for a writer: after [`READ_TRIES`] attempts that met a write in
//!   progress it gives up ([`SeqWords::read`] returns `None`) and the caller reads the
//!   authoritative copy under its mutex, which blocks properly instead of spinning against a
//!   writer that was preempted (4 and 8 threads on 2 cores).
//! - Writes are serialised by the caller; `write` asserts the counter is even on entry.
//!
//! Under `cfg(loom)` in this crate's tests the same code runs on loom's atomics
//! (`loom_model` below).

#[cfg(all(loom, test))]
use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(all(loom, test)))]
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Attempts a reader makes before it falls back to the caller's mutex.
#[cfg(not(all(loom, test)))]
pub const READ_TRIES: u32 = 64;
#[cfg(all(loom, test))]
pub const READ_TRIES: u32 = 2;

#[inline]
fn relax() {
    #[cfg(not(all(loom, test)))]
    std::hint::spin_loop();
    #[cfg(all(loom, test))]
    loom::thread::yield_now();
}

/// `N` words published together.
pub struct SeqWords<const N: usize> {
    seq: AtomicU64,
    words: [AtomicU64; N],
}

impl<const N: usize> SeqWords<N> {
    pub fn new(init: [u64; N]) -> Self {
        SeqWords { seq: AtomicU64::new(0), words: init.map(AtomicU64::new) }
    }

    /// Publishes `vals`. The caller serialises writers (holds the mutex of what this mirrors).
    /// Stores nothing when the words already hold `vals`, so that readers' lines stay shared
    /// when an attribute change leaves what they read alone.
    pub fn write(&self, vals: [u64; N]) {
        if self.words.iter().zip(&vals).all(|(w, v)| w.load(Ordering::Relaxed) == *v) {
            return;
        }
        let s = self.seq.load(Ordering::Relaxed);
        assert!(s & 1 == 0, "SeqWords::write: writers must be serialised by the caller");
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd counter before the words: a reader that sees a new word then sees the
        // counter changed on its second load.
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(vals) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The words of the last completed write, or `None` if writes kept overlapping the read
    /// ([`READ_TRIES`] times): the caller then reads under its mutex.
    #[inline]
    pub fn read(&self) -> Option<[u64; N]> {
        for _ in 0..READ_TRIES {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                relax();
                continue;
            }
            let vals: [u64; N] = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
            // Orders the word loads before the second counter load: if any of them saw a write
            // that started after `s1`, the counter has moved.
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return Some(vals);
            }
        }
        None
    }
}

impl<const N: usize> std::fmt::Debug for SeqWords<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqWords").field("words", &self.read()).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    #[test]
    fn reads_what_was_written() {
        let s = SeqWords::new([1, 2, 3]);
        assert_eq!(s.read(), Some([1, 2, 3]));
        s.write([4, 5, 6]);
        assert_eq!(s.read(), Some([4, 5, 6]));
        // An unchanged write leaves the counter alone.
        let before = s.seq.load(Ordering::Relaxed);
        s.write([4, 5, 6]);
        assert_eq!(s.seq.load(Ordering::Relaxed), before);
    }

    /// Writers (serialised by a mutex, as the engine's are) store words that all equal one
    /// value and whose sum of halves is a checksum; readers on other threads must never see a
    /// mix, and must see values only grow (each writer writes increasing values).
    #[test]
    fn many_readers_never_see_a_mix_of_two_writes() {
        const WRITERS: u64 = 3;
        const READERS: usize = 5;
        const WRITES: u64 = 20_000;
        let s = SeqWords::new([0u64; 5]);
        let lock = Mutex::new(0u64);
        let stop = AtomicBool::new(false);
        let (mut hits, mut misses) = (0u64, 0u64);
        std::thread::scope(|sc| {
            let readers: Vec<_> = (0..READERS)
                .map(|_| {
                    let (s, stop, lock) = (&s, &stop, &lock);
                    sc.spawn(move || {
                        let (mut hits, mut misses, mut last) = (0u64, 0u64, 0u64);
                        while !stop.load(Ordering::Relaxed) {
                            let v = match s.read() {
                                Some(v) => {
                                    hits += 1;
                                    v
                                }
                                None => {
                                    // The fallback: the authoritative copy under the mutex.
                                    misses += 1;
                                    let g = lock.lock().unwrap();
                                    [*g; 5]
                                }
                            };
                            assert!(v.iter().all(|&w| w == v[0]), "torn read {v:?}");
                            assert!(v[0] >= last, "went back from {last} to {}", v[0]);
                            last = v[0];
                        }
                        (hits, misses)
                    })
                })
                .collect();
            let writers: Vec<_> = (0..WRITERS)
                .map(|_| {
                    let (s, lock) = (&s, &lock);
                    sc.spawn(move || {
                        for _ in 0..WRITES {
                            let mut g = lock.lock().unwrap();
                            *g += 1;
                            s.write([*g; 5]);
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            stop.store(true, Ordering::Relaxed);
            for r in readers {
                let (h, m) = r.join().unwrap();
                hits += h;
                misses += m;
            }
        });
        assert_eq!(s.read(), Some([WRITERS * WRITES; 5]));
        assert!(hits > 0, "no read succeeded without the mutex ({misses} fell back)");
        assert_eq!(s.seq.load(Ordering::Relaxed), 2 * WRITERS * WRITES, "one even step per write");
    }
}

#[cfg(all(loom, test))]
mod loom_model {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A writer publishes two writes while a reader reads: the reader sees the initial words,
    /// the first write's or the second's, whole, or gives up; never a mix.
    #[test]
    fn a_reader_sees_one_whole_write() {
        loom::model(|| {
            let s = Arc::new(SeqWords::new([0u64, 0]));
            let w = {
                let s = s.clone();
                thread::spawn(move || {
                    s.write([1, 1]);
                    s.write([2, 2]);
                })
            };
            if let Some(v) = s.read() {
                assert_eq!(v[0], v[1], "torn read {v:?}");
            }
            w.join().unwrap();
            assert_eq!(s.read(), Some([2, 2]));
        });
    }
}
