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

/// The (inode, directory) pairs a record names: whose names it changes, and where.
pub fn names(r: &Record) -> Vec<(u32, u32)> {
    match r {
        Record::Create { dir, ino, .. } | Record::Link { dir, ino, .. } | Record::Unlink { dir, ino, .. } => {
            vec![(*ino, *dir)]
        }
        Record::Rename { src_dir, dst_dir, ino, replaced, exchange, .. } => {
            let mut v = vec![(*ino, *src_dir)];
            if dst_dir != src_dir {
                v.push((*ino, *dst_dir));
            }
            if *replaced != 0 {
                v.push((*replaced, *dst_dir));
                if *exchange && dst_dir != src_dir {
                    v.push((*replaced, *src_dir));
                }
            }
            v
        }
        _ => Vec::new(),
    }
}

/// The inode a record removes a name of, if it may be its last (unlink, rename over it).
pub fn removes(r: &Record) -> Option<u32> {
    match r {
        Record::Unlink { ino, .. } => Some(*ino),
        Record::Rename { replaced, exchange: false, .. } if *replaced != 0 => Some(*replaced),
        _ => None,
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
