//! The engine: every piece of state a mounted file system has, and the glue between MEMFS and
//! DISKFS (loading inodes on first use, the dirty set, group commit, the operation clock).
//!
//! Locking: every lock here has a rank in the one hierarchy written in `sync::rank`, which
//! test builds enforce on every acquisition. No lock is held across device I/O except the gate
//! (by design: it is how a checkpoint keeps fsync from changing block validity under it), a
//! lane's chain writer (journal blocks of one lane complete in chain order), and `cp_serial`.
//!
//! This file holds [`Engine`] itself, the operation clock, the dirty set and the checkpoint
//! bounds; each child one more job of the glue:
//! - `options`: [`FsOptions`], how a mount behaves.
//! - `load`: inodes loaded from disk on first use.
//! - `space`: admission control — what an operation may dirty before the space runs out.
//! - `group_commit`: concurrent fsyncs sharing one device flush.
//! - `io`: bytes written by cause, for write amplification.

mod group_commit;
mod io;
mod load;
mod options;
mod space;

pub(crate) use group_commit::GroupCommit;
pub(crate) use io::{IoCounters, WriteKind};
pub use options::FsOptions;
pub use space::data_room;

use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::layout::{Geometry, LogType};
use crate::format::node::Timespec;
use crate::format::Checkpoint;
use crate::journal::{ChainWriter, Stamp};
use crate::mem::mnode::MNode;
use crate::mem::pages::CacheStats;
use crate::mem::Cells;
use crate::nat::NatTable;
use crate::oplog::{InFlight, Timestamp};
use crate::seg::{LaneSet, SegmentTable};
use crate::sync::rank::{Condvar, Mutex, RwLock};
use crate::sync::{current_cpu, PassSem, PerCpu, PerCpuCounter};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// The log journal blocks go to (per lane). Node logs hold nothing else between checkpoints
/// except the checkpoint's own cold copies of nodes, so the journal stays compact.
pub const JOURNAL_LOG: LogType = LogType::ColdNode;

/// `FsOptions::nvm_inline_pages` on a device whose flush costs something.
pub const DEFAULT_INLINE_PAGES: usize = 4;

/// Timestamps for records: monotonic across mounts (each mount starts past the newest stamp
/// it found on disk) and ordered across cores (the synchronized TSC, ties by CPU).
pub(crate) struct StampClock {
    base: u64,
    t0: u64,
}

impl StampClock {
    pub fn new(floor: u64) -> StampClock {
        StampClock { base: floor + 1, t0: Timestamp::now().ticks() }
    }
    pub fn stamp_of(&self, ts: Timestamp) -> Stamp {
        Stamp { ticks: self.base + ts.ticks().saturating_sub(self.t0), cpu: ts.cpu() }
    }
    pub fn now(&self) -> Stamp {
        self.stamp_of(Timestamp::now())
    }
}

/// Inodes deleted between checkpoints before one is asked for (see `Engine::count_deleted`).
pub(crate) const DELETED_INODES_PER_CHECKPOINT: u64 = 4096;

/// Checkpoint bookkeeping.
pub(crate) struct CpState {
    pub cp: Checkpoint,
    pub pack: u32,
    /// Sequence number of the last checkpoint started / made durable.
    pub started: u64,
    pub durable: u64,
    /// The last checkpoint whose emptied segments are free again (after `durable`: they are
    /// discarded first, outside the gate). What waits for space waits for this one.
    pub settled: u64,
    /// The checkpoint every fsync waits for, whatever it flushes (0: none): one that moved a
    /// lane's journal head, or any with region journals (`Engine::enter_flush`).
    pub fence: u64,
    /// The stamp of the last checkpoint snapshot: unjournaled directory records stamped at or
    /// before it are held by that checkpoint until it is durable.
    pub snap_stamp: u64,
    /// The checkpoint in progress's captured inodes not yet claimed for install.
    pub installs: crate::flush::checkpoint::Installs,
}

/// A mounted file system.
pub struct Engine {
    /// The device, behind `halt`: a [`crate::device::HaltDevice`].
    pub(crate) dev: Arc<dyn BlockDevice>,
    /// The shutdown gate every device and region write of this mount passes (`Fs::shutdown`).
    pub(crate) halt: Arc<crate::device::Halt>,
    pub(crate) g: Geometry,
    pub(crate) nat: NatTable,
    /// The persistent-memory region holding the NAT (`FsOptions::nvm`), when mounted with one.
    pub(crate) nvm: Option<crate::pmem::nat::NvmNat>,
    /// The lane journals in that region: fsync commits there (see `crate::pmem`).
    pub(crate) nvm_log: Option<crate::pmem::journal::NvmJournal>,
    pub(crate) table: Arc<SegmentTable>,
    pub(crate) lanes: LaneSet,
    pub(crate) cells: Cells<MNode>,
    pub(crate) pass: PassSem,
    pub(crate) inflight: InFlight,
    pub(crate) gate: RwLock<()>,
    pub(crate) cp_serial: Mutex<()>,
    pub(crate) chains: Vec<Mutex<ChainWriter>>,
    /// Per lane: how far its chain is written and durable, for the flushed-through mark that
    /// spares recovery reading back durable transactions' data (`journal::ChainMarks`).
    pub(crate) chain_marks: Vec<crate::journal::ChainMarks>,
    pub(crate) group: GroupCommit,
    /// Per-CPU sets of the inodes changed since the last checkpoint snapshot (an inode is in
    /// the one `MNode::dirty_pos` names). An inode that dies leaves its set for a dead list
    /// (`Engine::bury`).
    pub(crate) dirty: PerCpu<Mutex<std::collections::HashSet<u32>>>,
    /// Per-CPU lists of inodes that died (no name, not open) since the last checkpoint
    /// snapshot: the next checkpoint drops them. The snapshot swaps these lists and the dirty
    /// ones whole, so it does no work per dead inode while every operation waits.
    pub(crate) dead: PerCpu<Mutex<Vec<u32>>>,
    /// The access-time policy (`mem::atime::AtimePolicy`, one byte: a remount changes it).
    pub(crate) atime: std::sync::atomic::AtomicU8,
    /// Per-CPU lists of inodes whose atime changed under lazytime and is in no dirty set.
    pub(crate) lazy: PerCpu<Mutex<Vec<u32>>>,
    /// File-system age (`elapsed_secs`) when the oldest lazy atime was queued (0: none).
    pub(crate) lazy_since: AtomicU64,
    /// The next checkpoint writes every lazy atime (a `sync`).
    pub(crate) lazy_flush: AtomicBool,
    /// Unlinked while open.
    pub(crate) orphans: Mutex<std::collections::BTreeSet<u32>>,
    pub(crate) cp: Mutex<CpState>,
    pub(crate) cp_done: Condvar,
    pub(crate) clock: StampClock,
    pub(crate) cache: Arc<CacheStats>,
    pub(crate) opts: FsOptions,
    pub(crate) rename_lock: Mutex<()>,
    /// Generations of new inodes (`crate::generation`).
    pub(crate) generations: crate::generation::Generations,
    pub(crate) journal_blocks: PerCpuCounter,
    pub(crate) logged_ops: PerCpuCounter,
    /// Inodes whose last name went since the last checkpoint snapshot.
    pub(crate) deleted_inodes: PerCpuCounter,
    /// Inodes that joined the dirty set since the last checkpoint snapshot.
    pub(crate) dirty_inodes: PerCpuCounter,
    /// Xattr blocks the next checkpoint will write for the sets changed since the last one
    /// (`XattrState::owed`, summed): space admitted but not yet taken.
    pub(crate) xattr_owed: AtomicI64,
    /// Set after a failed checkpoint: the in-memory state no longer matches what can be made
    /// durable, so every further change is refused (like ext4's errors=remount-ro).
    pub(crate) failed: AtomicBool,
    /// Why it failed, for the error every later change gets.
    pub(crate) failure: Mutex<String>,
    /// Wakes the background checkpoint thread.
    pub(crate) cp_kick: (Mutex<bool>, Condvar),
    /// Tells the background thread to end.
    pub(crate) stop: AtomicBool,
    /// Bytes written to the device, by cause.
    pub(crate) io: IoCounters,
    /// File-system age at mount (seconds) and when that was: segment ages for cleaning.
    pub(crate) age_at_mount: u64,
    pub(crate) mounted_at: std::time::Instant,
    /// The cleaner's state (one cleaning round at a time).
    pub(crate) gc: crate::gc::Cleaner,
    /// Blocks claimed by fallocates making their reservations now (`Engine::claim`): counted
    /// as promised, never recorded by a checkpoint.
    pub(crate) claimed: AtomicU64,
    /// How long checkpoints held operations out (`flush::checkpoint::CpPauses`).
    pub(crate) cp_pauses: crate::flush::checkpoint::CpPauses,
}

/// Seconds and nanoseconds now, from the coarse clock (as the kernel stamps files): writes in
/// the same tick store the same time, so a timestamp update is usually a read, not a write to
/// a line every writer of the file shares.
pub(crate) fn now() -> Timespec {
    #[cfg(test)]
    if let Some(t) = test_clock::read() {
        return t;
    }
    let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    Timespec { sec: t.tv_sec, nsec: t.tv_nsec as u32 }
}

impl Engine {
    /// The lane and CPU slot of the calling thread.
    pub(crate) fn lane(&self) -> (u32, usize) {
        let cpu = current_cpu();
        (cpu as u32 % self.lanes.lane_count(), cpu)
    }

    /// Refuses every operation once the file system is shut down (`Fs::shutdown`).
    pub(crate) fn check_live(&self) -> Result<()> {
        if self.halt.is_halted() {
            return Err(Error::Io(crate::device::halt::halted_error()));
        }
        Ok(())
    }

    /// Refuses changes after a shutdown or a failed checkpoint, and on a read-only mount.
    pub(crate) fn check_writable(&self) -> Result<()> {
        self.check_live()?;
        if self.opts.read_only {
            return Err(Error::errno(libc::EROFS, "mounted read-only"));
        }
        if self.failed.load(Ordering::Acquire) {
            let why = self.failure.lock().clone();
            return Err(Error::errno(
                libc::EIO,
                format!("file system stopped after a failed checkpoint ({why})"),
            ));
        }
        Ok(())
    }

    /// Adds `m` to the dirty set (idempotent and cheap when it is there already: a read of a
    /// flag, no write to a line other cores share).
    pub(crate) fn mark_dirty(&self, m: &MNode) {
        if m.in_dirty_set.load(Ordering::Acquire) {
            return;
        }
        if !m.in_dirty_set.swap(true, Ordering::AcqRel) {
            self.dirty_inodes.add(1);
            let slot = self.dirty.current_slot();
            let mut set = self.dirty.get(slot).lock();
            m.dirty_pos.store(slot as u64 + 1, Ordering::Relaxed);
            set.insert(m.ino);
        }
    }

    /// `m` just died (its last name went with it closed, or its last handle with no name):
    /// moves it from the dirty set to a dead list, so that the checkpoint's snapshot neither
    /// visits nor captures it. The caller holds the pass-through semaphore shared (the
    /// snapshot swaps the lists only with it exclusive) and marked `m` dirty under that hold.
    pub(crate) fn bury(&self, m: &MNode) {
        debug_assert!(m.in_dirty_set.load(Ordering::Acquire), "inode {} dies dirty", m.ino);
        if m.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        let slot = m.dirty_pos.load(Ordering::Relaxed);
        debug_assert!(slot != 0, "inode {} was marked dirty", m.ino);
        if let Some(slot) = (slot as usize).checked_sub(1) {
            let gone = self.dirty.get(slot).lock().remove(&m.ino);
            debug_assert!(gone, "inode {} is in the set its dirty_pos names", m.ino);
        }
        self.dead.current().lock().push(m.ino);
    }

    /// Asks the background thread for a checkpoint.
    pub(crate) fn kick_checkpoint(&self) {
        let (m, cv) = &self.cp_kick;
        *m.lock() = true;
        cv.notify_one();
    }

    /// Stops the file system: every later change fails with EIO naming `why`, and whoever
    /// waits for a checkpoint wakes up to that error.
    pub(crate) fn stop_with_failure(&self, why: String) {
        tracing::error!("lanefs: file system stopped: {why}");
        *self.failure.lock() = why;
        self.failed.store(true, Ordering::Release);
        self.cp_done.notify_all();
    }

    /// Asks for a checkpoint and waits until one that started after this call is durable.
    pub(crate) fn wait_for_checkpoint(&self) -> Result<()> {
        let target = self.cp.lock().started + 1;
        self.kick_checkpoint();
        let mut cp = self.cp.lock();
        while cp.settled < target {
            self.check_writable()?;
            if self.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            self.cp_done.wait_for(&mut cp, std::time::Duration::from_millis(100));
        }
        Ok(())
    }

    /// Counts an inode that lost its last name: it keeps its memory (mnode, cached pages) until
    /// the checkpoint that deletes it, so a checkpoint is asked for every
    /// [`DELETED_INODES_PER_CHECKPOINT`] of them. Without a region the journal's bound comes
    /// first in a mail spool's delete-heavy loop; with one, checkpoints are rare otherwise and
    /// the dead files' pages pile up (varmail: gigabytes in seconds).
    pub(crate) fn count_deleted(&self) {
        self.count_toward(&self.deleted_inodes, DELETED_INODES_PER_CHECKPOINT, 1);
    }

    /// Counts one logged namespace operation toward `FsOptions::logged_ops_limit`.
    pub(crate) fn count_op(&self) {
        self.count_toward(&self.logged_ops, self.opts.logged_ops_limit, 1);
    }

    /// Counts journal blocks written toward `FsOptions::journal_blocks_limit`.
    pub(crate) fn count_journal(&self, blocks: u64) {
        self.count_toward(&self.journal_blocks, self.opts.journal_blocks_limit, blocks);
    }

    /// Adds `n` to this CPU's slot of `counter` (reset by each checkpoint snapshot) and asks for
    /// a checkpoint once the total reaches `bound`. The total is summed only when the slot
    /// crosses a multiple of a quarter of its share (no shared line is written on the path).
    /// Not when one slot alone reaches its share: a single thread would then checkpoint at
    /// `bound / slots` (half the bound on two CPUs), twice as often as the bound asks for.
    fn count_toward(&self, counter: &PerCpuCounter, bound: u64, n: u64) {
        let step = (bound / (4 * counter.slots() as u64)).max(1);
        let now = counter.add(n);
        if now / step != (now - n) / step && counter.sum() >= bound {
            self.kick_checkpoint();
        }
    }
}

/// A clock of the calling thread for unit tests: [`now`] calls it instead of reading the
/// coarse clock. It gives a test a time that differs from every earlier one without waiting
/// for the tick, and a hook at the moment an operation stamps its times (where it may run
/// something, such as a checkpoint, on another thread). Per thread, so tests running in
/// parallel never see each other's.
#[cfg(test)]
pub(crate) mod test_clock {
    use crate::format::node::Timespec;
    use std::cell::RefCell;

    type Clock = Box<dyn FnMut() -> Timespec>;

    thread_local! {
        static CLOCK: RefCell<Option<Clock>> = const { RefCell::new(None) };
    }

    /// From now on this thread's [`super::now`] returns what `f` returns.
    pub(crate) fn set(f: impl FnMut() -> Timespec + 'static) {
        CLOCK.with(|c| *c.borrow_mut() = Some(Box::new(f)));
    }

    /// Back to the coarse clock.
    pub(crate) fn clear() {
        CLOCK.with(|c| *c.borrow_mut() = None);
    }

    /// The test clock's time, if one is set. It is taken out while it runs, so that a clock
    /// that calls into the engine reads the real clock instead of itself.
    pub(super) fn read() -> Option<Timespec> {
        let mut f = CLOCK.with(|c| c.borrow_mut().take())?;
        let t = f();
        CLOCK.with(|c| {
            c.borrow_mut().get_or_insert(f);
        });
        Some(t)
    }
}
