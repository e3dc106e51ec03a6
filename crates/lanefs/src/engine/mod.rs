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

mod load;
mod options;
mod space;

pub(crate) use crate::disk::WriteKind;
pub use options::FsOptions;
pub use space::data_room;

use crate::disk::Disk;
use crate::error::{Error, Result};
use crate::flush::checkpoint::Checkpointer;
use crate::format::layout::LogType;
use crate::format::node::Timespec;
use crate::journal::Stamp;
use crate::mem::mnode::MNode;
use crate::mem::Memfs;
use crate::oplog::Timestamp;
use crate::sync::{current_cpu, PerCpuCounter};
use std::sync::atomic::Ordering;

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

/// A mounted file system: the composition of its layers' parts. Each part is the state of one
/// layer and reaches only the parts below it; what needs more than one part lives here.
pub struct Engine {
    /// DISKFS: the device, the NAT, the segments and lanes, the journal chains.
    pub(crate) disk: Disk,
    /// MEMFS: the mnodes and what they owe the next checkpoint.
    pub(crate) mem: Memfs,
    /// The checkpointer and the cleaner.
    pub(crate) ckpt: Checkpointer,
    pub(crate) clock: StampClock,
    pub(crate) opts: FsOptions,
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
        (cpu as u32 % self.disk.lanes.lane_count(), cpu)
    }

    /// Refuses every operation once the file system is shut down (`Fs::shutdown`).
    pub(crate) fn check_live(&self) -> Result<()> {
        if self.disk.halt.is_halted() {
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
        if self.ckpt.failed.load(Ordering::Acquire) {
            let why = self.ckpt.failure.lock().clone();
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
            self.ckpt.requests.dirty_inodes.add(1);
            let slot = self.mem.dirty.current_slot();
            let mut set = self.mem.dirty.get(slot).lock();
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
            let gone = self.mem.dirty.get(slot).lock().remove(&m.ino);
            debug_assert!(gone, "inode {} is in the set its dirty_pos names", m.ino);
        }
        self.mem.dead.current().lock().push(m.ino);
    }

    /// Asks the background thread for a checkpoint.
    pub(crate) fn kick_checkpoint(&self) {
        let (m, cv) = &self.ckpt.requests.kick;
        *m.lock() = true;
        cv.notify_one();
    }

    /// Stops the file system: every later change fails with EIO naming `why`, and whoever
    /// waits for a checkpoint wakes up to that error.
    pub(crate) fn stop_with_failure(&self, why: String) {
        tracing::error!("lanefs: file system stopped: {why}");
        *self.ckpt.failure.lock() = why;
        self.ckpt.failed.store(true, Ordering::Release);
        self.ckpt.cp_done.notify_all();
    }

    /// Asks for a checkpoint and waits until one that started after this call is durable.
    pub(crate) fn wait_for_checkpoint(&self) -> Result<()> {
        let target = self.ckpt.cp.lock().started + 1;
        self.kick_checkpoint();
        let mut cp = self.ckpt.cp.lock();
        while cp.settled < target {
            self.check_writable()?;
            if self.ckpt.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            self.ckpt.cp_done.wait_for(&mut cp, std::time::Duration::from_millis(100));
        }
        Ok(())
    }

    /// Counts an inode that lost its last name: it keeps its memory (mnode, cached pages) until
    /// the checkpoint that deletes it, so a checkpoint is asked for every
    /// [`DELETED_INODES_PER_CHECKPOINT`] of them. Without a region the journal's bound comes
    /// first in a mail spool's delete-heavy loop; with one, checkpoints are rare otherwise and
    /// the dead files' pages pile up (varmail: gigabytes in seconds).
    pub(crate) fn count_deleted(&self) {
        self.count_toward(&self.ckpt.requests.deleted_inodes, DELETED_INODES_PER_CHECKPOINT, 1);
    }

    /// Counts one logged namespace operation toward `FsOptions::logged_ops_limit`.
    pub(crate) fn count_op(&self) {
        self.count_toward(&self.ckpt.requests.logged_ops, self.opts.logged_ops_limit, 1);
    }

    /// Counts journal blocks written toward `FsOptions::journal_blocks_limit`.
    pub(crate) fn count_journal(&self, blocks: u64) {
        self.count_toward(&self.ckpt.requests.journal_blocks, self.opts.journal_blocks_limit, blocks);
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
