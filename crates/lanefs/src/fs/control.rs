//! The file system as a whole rather than one file: its counters (bytes by cause, the
//! checkpoints' pauses, contended locks), cleaning, the label, trim, and the shutdown of the
//! GOINGDOWN ioctl. Each call translates to the engine, as the rest of `Fs` does.

use super::*;

impl Fs {
    /// Bytes written since mount, by cause (see [`IoStats`]).
    pub fn io_stats(&self) -> IoStats {
        use std::sync::atomic::Ordering::Relaxed;
        let e = &self.engine;
        let (begun, durable) = {
            let cp = e.ckpt.cp.lock();
            (cp.started, cp.durable)
        };
        IoStats {
            user_bytes: e.disk.io.user.sum(),
            journal_bytes: e.disk.io.journal.sum(),
            writeback_bytes: e.disk.io.writeback.sum(),
            checkpoint_bytes: e.disk.io.checkpoint.sum(),
            cleaning_bytes: e.disk.io.cleaning.sum(),
            nvm_journal_bytes: e.disk.io.nvm_journal.sum(),
            fsync_flushes: e.disk.io.fsync_flushes.sum(),
            fsync_device_flushes: e.disk.io.fsync_device_flushes.sum(),
            fsync_batches: e.disk.io.fsync_batches.sum(),
            cleaning_rounds: e.ckpt.gc.rounds.load(Relaxed),
            segments_cleaned: e.ckpt.gc.segments_cleaned.load(Relaxed),
            checkpoints_begun: begun,
            checkpoints_durable: durable,
            cp_exclusive_us_max: e.ckpt.cp_pauses.exclusive_max_us(),
            cp_write_phase_us_max: e.ckpt.cp_pauses.write_max_us(),
            cp_waits: e.disk.io.cp_waits.sum(),
            cp_bridges: e.disk.io.cp_bridges.sum(),
            cp_helped: e.disk.io.cp_helped.sum(),
        }
    }

    /// The longest time a checkpoint's exclusive phase held operations out since the previous
    /// call (or mount), in µs; the next call starts afresh. A benchmark calls it before and
    /// after a run to get the run's own figure.
    pub fn take_cp_exclusive_peak_us(&self) -> u64 {
        self.engine.ckpt.cp_pauses.take_exclusive_peak()
    }

    /// What checkpoints' exclusive phases did since mount, item by item: dirty inodes they
    /// looked at one by one, and lists and shards they swapped out whole.
    pub fn cp_exclusive_work(&self) -> crate::flush::checkpoint::ExclusiveWork {
        self.engine.ckpt.cp_pauses.work()
    }

    /// The contention census (`sync::census`): per lock class, acquisitions that found the
    /// lock held, since the process started. Counts are the process's, not this file
    /// system's alone; take two and subtract ([`crate::sync::Census::since`]) to measure an
    /// interval.
    pub fn lock_census(&self) -> crate::sync::Census {
        crate::sync::census::snapshot()
    }

    /// Cleans every segment that has invalid blocks, now (the background cleaner does this
    /// gradually when space runs short). Returns the segments emptied.
    pub fn clean(&self) -> Result<u64> {
        self.engine.disk.check_live()?;
        self.engine.check_writable()?;
        self.engine.clean_all()
    }

    /// The label (FS_IOC_GETFSLABEL): up to [`crate::format::superblock::LABEL_MAX`] bytes.
    pub fn label(&self) -> Result<Vec<u8>> {
        self.engine.label()
    }

    /// Sets the label (FS_IOC_SETFSLABEL), in both superblock copies: EINVAL for more than
    /// [`crate::format::superblock::LABEL_MAX`] bytes or a NUL byte.
    pub fn set_label(&self, label: &[u8]) -> Result<()> {
        self.engine.set_label(label)
    }

    /// FITRIM: tells the device that the free space in `range` holds nothing (a hole punched
    /// in an image file, a discard on a block device); returns the bytes discarded. See
    /// `src/fsctl.rs` for what counts as free and the arguments refused.
    pub fn trim(&self, range: TrimRange) -> Result<u64> {
        self.engine.trim(range)
    }

    /// Shuts the file system down as a power cut would: from the moment this returns nothing
    /// more reaches the image (or the persistent-memory region) — no writeback, no checkpoint,
    /// no journal commit, no final checkpoint at unmount — and every later call returns EIO
    /// (`statfs` and `io_stats` excepted; `release` and dropping a [`Handle`] still work, in
    /// memory). Writes in flight finish or fail; the call waits for those that started.
    /// [`Fs::unmount`] still works, and the next mount recovers from the last checkpoint and
    /// the journals, exactly as after a crash: whatever was fsynced is there.
    ///
    /// This is XFS_IOC_GOINGDOWN with XFS_FSOP_GOING_FLAGS_NOLOGFLUSH (and ext4's
    /// EXT4_IOC_SHUTDOWN with EXT4_GOING_FLAGS_NOLOGFLUSH); for their other modes, which make
    /// what was done durable first, call [`Fs::sync`] before it. Shutting down again does
    /// nothing.
    ///
    /// ```
    /// # use lanefs::device::MemDevice;
    /// # use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
    /// # use std::sync::Arc;
    /// let dev = Arc::new(MemDevice::new(64 << 20));
    /// Fs::format(&*dev, &MkfsOptions::default()).unwrap();
    /// let opts = FsOptions { checkpoint_interval: None, ..Default::default() };
    /// let fs = Fs::open(dev.clone(), opts.clone()).unwrap();
    /// let kept = fs.create(ROOT, b"kept", 0o644, 0, 0).unwrap();
    /// fs.write_at(kept.ino, 0, b"durable").unwrap();
    /// fs.fsync(kept.ino, false).unwrap();
    /// let lost = fs.create(ROOT, b"lost", 0o644, 0, 0).unwrap();
    /// fs.write_at(lost.ino, 0, b"never synced").unwrap();
    /// fs.shutdown().unwrap();
    /// assert_eq!(fs.getattr(ROOT).unwrap_err().to_errno(), libc::EIO);
    /// fs.unmount().unwrap();
    ///
    /// let fs = Fs::open(dev, opts).unwrap();
    /// assert_eq!(fs.resolve("/kept").unwrap().size, 7);
    /// assert!(fs.resolve("/lost").is_err());
    /// ```
    pub fn shutdown(&self) -> Result<()> {
        if self.engine.disk.halt.halt() {
            tracing::warn!("lanefs: shut down: nothing more is written; the next mount recovers");
        }
        // The background thread and whoever waits for a checkpoint find the gate shut and stop.
        self.engine.ckpt.requests.kick_checkpoint();
        self.engine.ckpt.cp_done.notify_all();
        debug_assert!(self.is_shut_down());
        Ok(())
    }

    /// Whether [`Fs::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.engine.disk.halt.is_halted()
    }
}
