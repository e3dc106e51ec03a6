//! Per-core operation logs of one directory (ScaleFS).
//!
//! Every namespace operation on a directory appends one record, stamped at its linearization
//! point, to the log of the core it runs on; cores never share a log, so operations on one
//! directory from different cores do not meet here. Two consumers read the logs: fsync of the
//! directory (records not yet journaled, merged by timestamp) and the checkpoint (every record
//! since the last checkpoint, to learn which names changed). A rename appears in the logs of
//! both directories as one shared record, so it is journaled once, atomically.

use crate::journal::{Record, Stamp};
use crate::sync::PerCpu;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One logged operation.
pub struct LoggedOp {
    pub record: Record,
    /// Written to a journal (by an fsync of either directory it touches).
    pub journaled: AtomicBool,
}

impl LoggedOp {
    pub fn new(record: Record) -> Arc<LoggedOp> {
        Arc::new(LoggedOp { record, journaled: AtomicBool::new(false) })
    }
    pub fn stamp(&self) -> Stamp {
        self.record.stamp()
    }
}

/// The logs of one directory.
pub struct DirLog {
    shards: PerCpu<Mutex<Vec<Arc<LoggedOp>>>>,
}

impl Default for DirLog {
    fn default() -> Self {
        Self::new()
    }
}

impl DirLog {
    pub fn new() -> DirLog {
        DirLog { shards: PerCpu::new(|_| Mutex::new(Vec::new())) }
    }

    /// Appends to the current core's log.
    pub fn push(&self, op: Arc<LoggedOp>) {
        self.shards.current().lock().push(op);
    }

    /// Records not yet journaled, in no particular order.
    pub fn unjournaled(&self) -> Vec<Arc<LoggedOp>> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            out.extend(s.lock().iter().filter(|o| !o.journaled.load(Ordering::Acquire)).cloned());
        }
        out
    }

    /// Whether any record is not yet journaled.
    pub fn has_unjournaled(&self) -> bool {
        self.shards.iter().any(|s| s.lock().iter().any(|o| !o.journaled.load(Ordering::Acquire)))
    }

    /// Every record, emptying the logs (the checkpoint's snapshot).
    pub fn take_all(&self) -> Vec<Arc<LoggedOp>> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            out.append(&mut s.lock());
        }
        out
    }

    /// Number of records held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
