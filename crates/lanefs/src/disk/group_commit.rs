//! Group commit: concurrent fsyncs share one device flush.
//!
//! A caller is covered by a flush only if its writes completed before that flush started:
//! tickets are taken before the flush reads how far they go, so a ticket taken later always
//! waits for a later flush.

use crate::device::BlockDevice;
use crate::error::Result;
use crate::sync::rank::{Condvar, Mutex, Rank};
use std::sync::atomic::{AtomicU64, Ordering};

/// Group commit: concurrent fsyncs share one device flush. A caller whose writes completed
/// before a flush started is covered by that flush.
pub(crate) struct GroupCommit {
    tickets: AtomicU64,
    state: Mutex<GroupState>,
    cv: Condvar,
}

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit {
            tickets: AtomicU64::new(0),
            state: Mutex::new(Rank::GroupCommit, GroupState::default()),
            cv: Condvar::new(),
        }
    }
}

#[derive(Default)]
struct GroupState {
    /// Every ticket up to this one is durable.
    durable: u64,
    flushing: bool,
}

impl GroupCommit {
    /// Makes every write the caller completed before calling durable. Returns whether the
    /// caller issued the device flush itself (false: another caller's flush covered it).
    pub fn sync(&self, dev: &dyn BlockDevice) -> Result<bool> {
        let mine = self.tickets.fetch_add(1, Ordering::AcqRel) + 1;
        let mut st = self.state.lock();
        let mut flushed = false;
        // Bounded: each pass either returns or waits for a flush that ends in finite time.
        loop {
            if st.durable >= mine {
                return Ok(flushed);
            }
            if st.flushing {
                self.cv.wait(&mut st);
                continue;
            }
            st.flushing = true;
            let covers = self.tickets.load(Ordering::Acquire);
            drop(st);
            let r = dev.flush();
            flushed = true;
            st = self.state.lock();
            st.flushing = false;
            if r.is_ok() {
                // The flush covers every ticket taken before it read `covers`, this one too.
                debug_assert!(covers >= mine, "a flush started after ticket {mine} covers it");
                st.durable = st.durable.max(covers);
            }
            self.cv.notify_all();
            r?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn a_lone_caller_flushes_itself_and_threads_never_flush_more_than_they_call() {
        let dev = Arc::new(MemDevice::new(1 << 20));
        let g = Arc::new(GroupCommit::default());
        for _ in 0..3 {
            assert!(g.sync(&*dev).unwrap(), "nobody else flushed for it");
        }
        let flushed = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (dev, g, flushed) = (dev.clone(), g.clone(), flushed.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        if g.sync(&*dev).unwrap() {
                            flushed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = flushed.load(Ordering::Relaxed);
        assert!((1..=1600).contains(&n), "{n} flushes for 1,600 calls");
        assert_eq!(
            n as u64 + 3,
            dev.flush_count(),
            "the callers that said they flushed are the device's flushes"
        );
        let st = g.state.lock();
        assert_eq!(st.durable, g.tickets.load(Ordering::Acquire), "every ticket durable at the end");
        assert!(!st.flushing);
    }
}
