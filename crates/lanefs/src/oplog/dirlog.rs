//! Per-core operation logs of one directory (ScaleFS).
//!
//! Every namespace operation on a directory appends one record, stamped at its linearization
//! point, to the log of the core it runs on; cores never share a log, so operations on one
//! directory from different cores do not meet here. Two consumers read the logs: fsync of the
//! directory (records not yet journaled, merged by timestamp) and the checkpoint (every record
//! since the last checkpoint, to learn which names changed). A rename appears in the logs of
//! both directories as one shared record, so it is journaled once, atomically.
//!
//! A log holds every record since the last checkpoint, journaled or not, and fsyncs come far
//! more often than checkpoints (with a persistent-memory region, tens of thousands of them in
//! between), so each per-core log keeps a cursor before which every record is journaled: an
//! fsync reads only the tail, not the whole history. Records become journaled, and only go back
//! to unjournaled when a failed fsync gives them back, which then calls [`DirLog::rewind`].

use crate::journal::{Record, Stamp};
use crate::sync::rank::{Mutex, Rank};
use crate::sync::PerCpu;
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

/// Most (inode, directory) pairs [`names`] can list: a rename's inode in both directories, its
/// whiteout, and the inode it replaces (or exchanges) in both. (A rename never has both a
/// whiteout and an exchange, but a record read back need not be sensible: every branch fits.)
const MAX_NAMES: usize = 5;

/// The (inode, directory) pairs a record names: whose names it changes, and where. No heap:
/// the checkpoint calls it for every record it releases, and the allocation was a visible
/// share of its time in one shared directory (MWUM).
pub fn names(r: &Record) -> std::iter::Take<std::array::IntoIter<(u32, u32), MAX_NAMES>> {
    let mut v = [(0u32, 0u32); MAX_NAMES];
    let mut n = 0;
    let mut push = |p: (u32, u32)| {
        // Each branch below pushes at most once: MAX_NAMES covers them all.
        debug_assert!(n < MAX_NAMES, "a record names more than {MAX_NAMES} (inode, directory) pairs");
        v[n] = p;
        n += 1;
    };
    match r {
        Record::Create { dir, ino, .. } | Record::Link { dir, ino, .. } | Record::Unlink { dir, ino, .. } => {
            push((*ino, *dir));
        }
        Record::Rename { src_dir, dst_dir, ino, replaced, exchange, whiteout, .. } => {
            push((*ino, *src_dir));
            if let Some(w) = whiteout {
                push((w.ino, *src_dir));
            }
            if dst_dir != src_dir {
                push((*ino, *dst_dir));
            }
            if *replaced != 0 {
                push((*replaced, *dst_dir));
                if *exchange && dst_dir != src_dir {
                    push((*replaced, *src_dir));
                }
            }
        }
        _ => {}
    }
    v.into_iter().take(n)
}

/// The inode a record removes a name of, if it may be its last (unlink, rename over it).
pub fn removes(r: &Record) -> Option<u32> {
    match r {
        Record::Unlink { ino, .. } => Some(*ino),
        Record::Rename { replaced, exchange: false, .. } if *replaced != 0 => Some(*replaced),
        _ => None,
    }
}

/// One core's log of a directory.
#[derive(Default)]
struct Shard {
    ops: Vec<Arc<LoggedOp>>,
    /// Every record before this index is journaled (unless a rewind is pending).
    skip: usize,
    /// The records a checkpoint in progress took ([`DirLog::hold_all`]): durable once it is,
    /// offered to fsyncs until then ([`DirLog::release_held`]).
    held: Vec<Arc<LoggedOp>>,
    /// As `skip`, for `held`.
    held_skip: usize,
}

/// The records of `ops` from the first unjournaled one on, moving the cursor `skip` up to it.
fn tail<'a>(ops: &'a [Arc<LoggedOp>], skip: &mut usize) -> &'a [Arc<LoggedOp>] {
    debug_assert!(*skip <= ops.len());
    while *skip < ops.len() && ops[*skip].journaled.load(Ordering::Acquire) {
        *skip += 1;
    }
    &ops[*skip..]
}

impl Shard {
    /// The records from the first unjournaled one on, held ones first.
    fn tails(&mut self) -> impl Iterator<Item = &Arc<LoggedOp>> {
        let held = tail(&self.held, &mut self.held_skip);
        let ops = tail(&self.ops, &mut self.skip);
        held.iter().chain(ops)
    }
}

/// The logs of one directory.
pub struct DirLog {
    shards: PerCpu<Mutex<Shard>>,
}

impl Default for DirLog {
    fn default() -> Self {
        Self::new()
    }
}

impl DirLog {
    pub fn new() -> DirLog {
        DirLog { shards: PerCpu::new(|_| Mutex::new(Rank::OplogShard, Shard::default())) }
    }

    /// Appends to the current core's log.
    pub fn push(&self, op: Arc<LoggedOp>) {
        self.shards.current().lock().ops.push(op);
    }

    /// Appends the records of one operation, which share its stamp: in one shard, so that every
    /// listing (and so replay) keeps them in this order.
    pub fn push_all(&self, ops: impl IntoIterator<Item = Arc<LoggedOp>>) {
        self.shards.current().lock().ops.extend(ops);
    }

    /// Records not yet journaled, in no particular order.
    pub fn unjournaled(&self) -> Vec<Arc<LoggedOp>> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            out.extend(s.lock().tails().filter(|o| !o.journaled.load(Ordering::Acquire)).cloned());
        }
        out
    }

    /// Whether any record is not yet journaled.
    #[cfg(test)]
    pub fn has_unjournaled(&self) -> bool {
        self.shards.iter().any(|s| s.lock().tails().any(|o| !o.journaled.load(Ordering::Acquire)))
    }

    /// After records of this directory went back to unjournaled (a failed fsync gave them
    /// back): the next reader looks at the whole log again.
    pub fn rewind(&self) {
        for s in self.shards.iter() {
            let mut s = s.lock();
            s.skip = 0;
            s.held_skip = 0;
        }
    }

    /// A checkpoint's snapshot: every record so far passes to the checkpoint, which writes
    /// the names they changed. Each core's log is set aside whole (one lock per core however
    /// long the logs are), and its unjournaled records are still offered to fsyncs until
    /// [`DirLog::release_held`]: an fsync that runs before the checkpoint is durable must
    /// journal what it depends on itself (those records are stamped at or before the
    /// checkpoint's stamp, so replay on top of the checkpoint skips them). Returns how many
    /// logs were set aside.
    pub fn hold_all(&self) -> usize {
        let mut n = 0;
        for s in self.shards.iter() {
            let mut s = s.lock();
            if s.ops.is_empty() {
                continue;
            }
            n += 1;
            if s.held.is_empty() {
                s.held = std::mem::take(&mut s.ops);
                s.held_skip = s.skip;
            } else {
                // A checkpoint that failed never released its records (the file system stopped
                // with it): keep them all.
                let mut ops = std::mem::take(&mut s.ops);
                s.held.append(&mut ops);
            }
            s.skip = 0;
        }
        n
    }

    /// The checkpoint that held the records is durable: they are handed back to it, to be
    /// marked journaled.
    pub fn release_held(&self) -> Vec<Vec<Arc<LoggedOp>>> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let mut s = s.lock();
            s.held_skip = 0;
            if !s.held.is_empty() {
                out.push(std::mem::take(&mut s.held));
            }
        }
        out
    }

    /// Number of records held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock();
                s.ops.len() + s.held.len()
            })
            .sum()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(i: u64) -> Arc<LoggedOp> {
        LoggedOp::new(Record::Free { stamp: Stamp { ticks: i, cpu: 0 }, ino: 1 + i as u32 })
    }

    fn ticks(v: &[Arc<LoggedOp>]) -> Vec<u64> {
        let mut t: Vec<u64> = v.iter().map(|o| o.stamp().ticks).collect();
        t.sort_unstable();
        t
    }

    #[test]
    fn the_cursor_skips_journaled_records_and_rewinds() {
        let log = DirLog::new();
        let ops: Vec<_> = (0..6).map(op).collect();
        ops.iter().for_each(|o| log.push(o.clone()));
        // Journaled out of order (a rename journaled through the other directory).
        for i in [0, 1, 3] {
            ops[i].journaled.store(true, Ordering::Release);
        }
        assert_eq!(ticks(&log.unjournaled()), vec![2, 4, 5]);
        for i in [2, 4, 5] {
            ops[i].journaled.store(true, Ordering::Release);
        }
        assert!(log.unjournaled().is_empty() && !log.has_unjournaled());
        // A failed fsync gives two back: without the rewind the cursor has passed them.
        ops[1].journaled.store(false, Ordering::Release);
        ops[4].journaled.store(false, Ordering::Release);
        log.rewind();
        assert_eq!(ticks(&log.unjournaled()), vec![1, 4]);
        assert!(log.hold_all() >= 1);
        assert_eq!(ticks(&log.unjournaled()), vec![1, 4], "held records are still offered");
        assert_eq!(log.release_held().iter().map(Vec::len).sum::<usize>(), 6);
        assert!(log.is_empty() && log.unjournaled().is_empty());
        log.push(op(9));
        assert_eq!(ticks(&log.unjournaled()), vec![9], "the cursor starts again after hold_all");
    }

    #[test]
    fn concurrent_pushes_and_journaling_agree_with_a_full_scan() {
        let log = Arc::new(DirLog::new());
        let all = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let (log, all) = (log.clone(), all.clone());
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let o = op(t * 10_000 + i);
                        all.lock().push(o.clone());
                        log.push(o);
                        if i % 3 == 0 {
                            // An fsync: journal everything unjournaled now, in any order.
                            for o in log.unjournaled().iter().rev() {
                                o.journaled.store(true, Ordering::Release);
                            }
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        let want: Vec<Arc<LoggedOp>> =
            all.lock().iter().filter(|o| !o.journaled.load(Ordering::Acquire)).cloned().collect();
        assert_eq!(ticks(&log.unjournaled()), ticks(&want));
        assert_eq!(log.len(), 8000);
    }
}
