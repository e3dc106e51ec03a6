//! How a mounted file system behaves: the options a mount is given, and their defaults.
//!
//! The engine's copy is never written once it is built (recovery resolves the device-dependent
//! ones first), so reading it takes no lock; what a remount may change (the atime policy) the
//! engine keeps apart, in an atomic.

use std::time::Duration;

/// How a mounted file system behaves.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Memory for cached file pages; dirty pages beyond half of it are written back, clean
    /// pages beyond all of it are evicted.
    pub cache_bytes: u64,
    /// Take a checkpoint this often (None: only on sync, unmount and bounds).
    pub checkpoint_interval: Option<Duration>,
    /// Take a checkpoint once the journals hold this many blocks.
    pub journal_blocks_limit: u64,
    /// Take a checkpoint once this many namespace operations are logged.
    pub logged_ops_limit: u64,
    /// Never write the device: recovery replays into memory only, every change fails with
    /// EROFS, fsync and sync do nothing, and no checkpoint is taken (a `-o ro` mount).
    pub read_only: bool,
    /// Mount the last checkpoint alone: the journals (and the region's) are not replayed, so
    /// what was fsynced since that checkpoint is not seen (`-o norecovery`, as XFS has it: a
    /// last resort to look at an image whose journals cannot be trusted or written). Only with
    /// `read_only` (EINVAL otherwise): a later mount still recovers everything.
    pub no_recovery: bool,
    /// Persistent-memory region (`--nvm FILE`) holding the NAT and the lane journals (so fsync
    /// commits there instead of writing journal blocks); see `crate::pmem`. Created with
    /// `nvm_size` bytes when missing and the image's NAT is still on the device.
    pub nvm: Option<std::path::PathBuf>,
    /// Size of a region created by mount (`--nvm-size`); None: [`crate::pmem::default_size`].
    pub nvm_size: Option<u64>,
    /// How the region is mapped and persisted (tests and benchmarks force a method).
    pub nvm_region: crate::pmem::RegionOptions,
    /// With a region: an fsync with at most this many dirty pages logs them inline in the
    /// region's journal (no data block write, no device flush on that fsync); the device gets
    /// them at the next checkpoint; 0: data always goes to data blocks. Inline takes the
    /// device's flush off small fsyncs but fills the region a page per record, so checkpoints
    /// come far more often. `None` (the default): `DEFAULT_INLINE_PAGES` (4) unless the device's
    /// flush is free (`BlockDevice::flush_is_free`: an image in RAM), where the extra
    /// checkpoints cost more than the flushes saved. See `crate::pmem`.
    pub nvm_inline_pages: Option<usize>,
    /// When reads update access times (`relatime` unless told otherwise; see `mem::atime`).
    pub atime: crate::mem::atime::AtimePolicy,
    /// Cooperative I/O (the default), Son's two ideas:
    /// - checkpoints: an fsync or writeback of a file that the checkpoint in progress captured
    ///   and has not written yet writes it itself, as the checkpoint would, instead of waiting
    ///   for the checkpoint's writer to reach it (`Engine::help_install`);
    /// - commit: an fsync queues its data and journal blocks, and whichever waiting fsync
    ///   finds no batch in flight writes everyone's queued blocks in one scatter-gather batch,
    ///   then issues the one device flush that covers them (`disk/commit.rs`), instead of each
    ///   writing its own and sharing only the flush. Only where the device's flush costs
    ///   something (`BlockDevice::flush_is_free` false): with a free one it saves nothing.
    ///
    /// false: both as before, the fsync waits for the checkpoint and writes its own blocks
    /// before group commit's flush (`-o cooperative=off`, for measurement).
    pub cooperative: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            cache_bytes: 256 << 20,
            checkpoint_interval: Some(Duration::from_secs(30)),
            journal_blocks_limit: 16384,
            logged_ops_limit: 1 << 20,
            read_only: false,
            no_recovery: false,
            nvm: None,
            nvm_size: None,
            nvm_region: crate::pmem::RegionOptions::default(),
            nvm_inline_pages: None,
            atime: crate::mem::atime::AtimePolicy::default(),
            cooperative: true,
        }
    }
}
