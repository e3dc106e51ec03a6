//! The engine: a mounted file system as the composition of its layers' parts, and the glue
//! between them (loading inodes on first use, admission, the operation clock).
//!
//! [`Engine`] holds one part per layer, each defined in its layer's module with the methods
//! that need only it:
//! - [`Disk`] (`crate::disk`): the device, the NAT, segments, lanes and their journal chains.
//! - [`Memfs`] (`crate::mem`): the mnodes, the pass-through semaphore, the dirty sets and
//!   what else MEMFS keeps for the next checkpoint.
//! - [`Checkpointer`] (`crate::flush::checkpoint`): the gate, checkpoint state and failure,
//!   the cleaner's state, and the requests for a checkpoint that MEMFS and fsync make
//!   (`CpRequests`).
//!
//! What joins the parts is still `impl Engine`, in the layer that runs it: MEMFS's operations
//! (mem/ops/, atime.rs, perm.rs), fsync, writeback and checkpoints (flush/), the cleaner's
//! rounds (gc.rs), replay (recovery/), and here admission and loading.
//!
//! Locking: every lock of the parts has a rank in the one hierarchy written in `sync::rank`,
//! which test builds enforce on every acquisition. No lock is held across device I/O except the
//! gate (by design: it is how a checkpoint keeps fsync from changing block validity under it),
//! a lane's chain writer (journal blocks of one lane complete in chain order), and `cp_serial`.
//!
//! This file holds [`Engine`] itself, the operation clock and the waits for a checkpoint;
//! each child one more job of the glue:
//! - `options`: [`FsOptions`], how a mount behaves.
//! - `load`: inodes loaded from disk on first use.
//! - `space`: admission control — what an operation may dirty before the space runs out.

mod load;
mod options;
mod space;

pub use options::FsOptions;
pub use space::data_room;

use crate::disk::Disk;
use crate::error::{Error, Result};
use crate::flush::checkpoint::Checkpointer;
use crate::format::layout::LogType;
use crate::format::node::Timespec;
use crate::journal::Stamp;
use crate::mem::Memfs;
use crate::oplog::Timestamp;
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

/// A mounted file system: the composition of its layers' parts. Each part is the state of one
/// layer and reaches only the parts below it; what needs more than one part lives here.
pub struct Engine {
    /// DISKFS: the device, the NAT, the segments and lanes, the journal chains.
    pub(crate) disk: Disk,
    /// MEMFS: the mnodes and what they owe the next checkpoint.
    pub(crate) mem: Memfs,
    /// The checkpointer and the cleaner.
    pub(crate) ckpt: Checkpointer,
    /// Stamps for records: MEMFS's operations, fsync, checkpoints and replay stamp from one
    /// clock, so it belongs to no single part.
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
    /// Refuses changes after a shutdown or a failed checkpoint, and on a read-only mount.
    pub(crate) fn check_writable(&self) -> Result<()> {
        self.disk.check_live()?;
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

    /// Asks for a checkpoint and waits until one that started after this call is durable.
    pub(crate) fn wait_for_checkpoint(&self) -> Result<()> {
        let target = self.ckpt.cp.lock().started + 1;
        self.ckpt.requests.kick_checkpoint();
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
