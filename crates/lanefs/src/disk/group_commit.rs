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
    /// Makes every write the caller completed before calling durable.
    pub fn sync(&self, dev: &dyn BlockDevice) -> Result<()> {
        let mine = self.tickets.fetch_add(1, Ordering::AcqRel) + 1;
        let mut st = self.state.lock();
        // Bounded: each pass either returns or waits for a flush that ends in finite time.
        loop {
            if st.durable >= mine {
                return Ok(());
            }
            if st.flushing {
                self.cv.wait(&mut st);
                continue;
            }
            st.flushing = true;
            let covers = self.tickets.load(Ordering::Acquire);
            drop(st);
            let r = dev.flush();
            st = self.state.lock();
            st.flushing = false;
            if r.is_ok() {
                st.durable = st.durable.max(covers);
            }
            self.cv.notify_all();
            r?;
        }
    }
}
