//! The engine: every piece of state a mounted file system has, and the glue between MEMFS and
//! DISKFS (loading inodes on first use, the dirty set, group commit, the operation clock).
//!
//! Locking: every lock here has a rank in the one hierarchy written in `sync::rank`, which
//! test builds enforce on every acquisition. No lock is held across device I/O except the gate
//! (by design: it is how a checkpoint keeps fsync from changing block validity under it), a
//! lane's chain writer (journal blocks of one lane complete in chain order), and `cp_serial`.

use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::diskdir::DiskDir;
use crate::error::{Error, Result};
use crate::format::dentry::DentryBlock;
use crate::format::layout::{Geometry, LogType};
use crate::format::node::Timespec;
use crate::format::tree::XATTR_NODE_OFS;
use crate::format::xattr::{self, XattrNode};
use crate::format::Checkpoint;
use crate::journal::{ChainWriter, Stamp};
use crate::mem::cowmap::CowMap;
use crate::mem::mnode::{DiskState, MNode, Meta, XattrDisk, S_IFDIR, S_IFLNK};
use crate::mem::pages::CacheStats;
use crate::mem::xattr::{XattrSet, XattrState};
use crate::mem::Cells;
use crate::nat::NatTable;
use crate::oplog::{InFlight, Timestamp};
use crate::seg::{LaneSet, SegmentTable};
use crate::sync::rank::{Condvar, Mutex, Rank, RwLock};
use crate::sync::{current_cpu, PassSem, PerCpu, PerCpuCounter};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The log journal blocks go to (per lane). Node logs hold nothing else between checkpoints
/// except the checkpoint's own cold copies of nodes, so the journal stays compact.
pub const JOURNAL_LOG: LogType = LogType::ColdNode;

/// `FsOptions::nvm_inline_pages` on a device whose flush costs something.
pub const DEFAULT_INLINE_PAGES: usize = 4;

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
    /// come far more often. `None` (the default): [`DEFAULT_INLINE_PAGES`] unless the device's
    /// flush is free (`BlockDevice::flush_is_free`: an image in RAM), where the extra
    /// checkpoints cost more than the flushes saved. See `crate::pmem`.
    pub nvm_inline_pages: Option<usize>,
    /// When reads update access times (`relatime` unless told otherwise; see `mem::atime`).
    pub atime: crate::mem::atime::AtimePolicy,
    /// Cooperative checkpoints (the default): an fsync or writeback of a file that the
    /// checkpoint in progress captured and has not written yet writes it itself, as the
    /// checkpoint would, instead of waiting for the checkpoint's writer to reach it
    /// (`Engine::help_install`). false: it waits (`-o cooperative=off`, for measurement).
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

/// Data blocks that fit in `space` free blocks with their direct nodes (and one node more,
/// and a block of slack): `n + n.div_ceil(ADDRS_PER_NODE) + 1 <= space` for the result `n`,
/// which is what a fallocate of `n` blocks claims.
pub fn data_room(space: u64) -> u64 {
    let per = crate::format::node::ADDRS_PER_NODE as u64;
    space.saturating_sub(space.div_ceil(per + 1)).saturating_sub(2)
}

/// Space claimed by a fallocate in progress (`Engine::claim`), given back when dropped.
pub(crate) struct Claim<'a> {
    engine: &'a Engine,
    blocks: u64,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.engine.claimed.fetch_sub(self.blocks, Ordering::AcqRel);
    }
}

/// Inodes deleted between checkpoints before one is asked for (see `Engine::count_deleted`).
pub(crate) const DELETED_INODES_PER_CHECKPOINT: u64 = 4096;

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

/// What a device write is for (write amplification is everything over user bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    /// fsync: data blocks and journal blocks.
    Journal,
    /// Dirty pages pushed out under cache pressure.
    Writeback,
    /// A checkpoint's data, nodes and metadata.
    Checkpoint,
    /// Blocks the cleaner moved.
    Cleaning,
}

/// Bytes written by cause since mount (per CPU, summed on read).
pub(crate) struct IoCounters {
    /// Bytes users wrote (what write amplification is measured against).
    pub user: PerCpuCounter,
    pub journal: PerCpuCounter,
    pub writeback: PerCpuCounter,
    pub checkpoint: PerCpuCounter,
    pub cleaning: PerCpuCounter,
    /// Bytes fsync committed to the region's lane journals (not device bytes).
    pub nvm_journal: PerCpuCounter,
    /// Device flushes fsync asked for (each may be shared by a group of fsyncs).
    pub fsync_flushes: PerCpuCounter,
    /// fsyncs and writebacks that waited for a checkpoint in progress (`Engine::enter_flush`).
    pub cp_waits: PerCpuCounter,
    /// fsyncs that journaled a checkpoint's bridge (`mem::mnode::Bridge`).
    pub cp_bridges: PerCpuCounter,
    /// Captured inodes an fsync or writeback installed for the checkpoint in progress instead
    /// of waiting for it (`Engine::help_install`).
    pub cp_helped: PerCpuCounter,
    /// (user, cleaning, other) totals already added to the checkpoint's persistent counters:
    /// each checkpoint adds what the totals grew by since.
    saved: Mutex<[u64; 3]>,
}

impl Default for IoCounters {
    fn default() -> Self {
        IoCounters {
            user: PerCpuCounter::default(),
            journal: PerCpuCounter::default(),
            writeback: PerCpuCounter::default(),
            checkpoint: PerCpuCounter::default(),
            cleaning: PerCpuCounter::default(),
            nvm_journal: PerCpuCounter::default(),
            fsync_flushes: PerCpuCounter::default(),
            cp_waits: PerCpuCounter::default(),
            cp_bridges: PerCpuCounter::default(),
            cp_helped: PerCpuCounter::default(),
            saved: Mutex::new(Rank::IoSaved, [0; 3]),
        }
    }
}

impl IoCounters {
    pub fn count(&self, kind: WriteKind, bytes: u64) {
        match kind {
            WriteKind::Journal => self.journal.add(bytes),
            WriteKind::Writeback => self.writeback.add(bytes),
            WriteKind::Checkpoint => self.checkpoint.add(bytes),
            WriteKind::Cleaning => self.cleaning.add(bytes),
        };
    }

    /// Bytes (by users, by cleaning, by everything else) written since the last call.
    pub fn take_unsaved(&self) -> [u64; 3] {
        let now = [
            self.user.sum(),
            self.cleaning.sum(),
            self.journal.sum() + self.writeback.sum() + self.checkpoint.sum(),
        ];
        let mut saved = self.saved.lock();
        let delta = std::array::from_fn(|i| now[i].saturating_sub(saved[i]));
        *saved = now;
        delta
    }
}

/// Seconds and nanoseconds now, from the coarse clock (as the kernel stamps files): writes in
/// the same tick store the same time, so a timestamp update is usually a read, not a write to
/// a line every writer of the file shares.
pub(crate) fn now() -> Timespec {
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

    /// The mnode of `ino`, loading it from disk on first use.
    /// Runs `f` on the mnode of `ino` without taking a reference (no shared store when it is
    /// cached: `Cells::with`); loads it first if it is not. `f` runs pinned: keep it short and
    /// lock-free.
    #[inline]
    pub(crate) fn with_mnode<R>(&self, ino: u32, f: impl FnOnce(&MNode) -> R) -> Result<R> {
        let mut f = Some(f);
        if let Some(r) = self.cells.with(ino as u64, |m| (f.take().expect("called once"))(m)) {
            return Ok(r);
        }
        let m = self.mnode(ino)?;
        Ok((f.take().expect("not called"))(&m))
    }

    pub(crate) fn mnode(&self, ino: u32) -> Result<Arc<MNode>> {
        if let Some(m) = self.cells.get(ino as u64) {
            return Ok(m);
        }
        let m = self.load_mnode(ino)?;
        Ok(self.cells.insert_if_absent(ino as u64, || m).0)
    }

    fn load_mnode(&self, ino: u32) -> Result<MNode> {
        let e = self.nat.get(ino);
        if e.is_free() || e.ino != ino {
            return Err(Error::errno(libc::ENOENT, format!("inode {ino}")));
        }
        let (inode, map, tree) = crate::node::read_inode(&*self.dev, &self.g, &self.nat, ino)?;
        let (xattrs, xattr_disk) = self.read_xattrs(ino, inode.xattr_nid)?;
        let meta = Meta {
            mode: inode.mode,
            uid: inode.uid,
            gid: inode.gid,
            nlink: inode.nlink,
            crtime: inode.crtime,
            rdev: inode.rdev,
            generation: inode.generation,
            xattrs: XattrState { set: Arc::new(xattrs), ..Default::default() },
            symlink: Vec::new(),
        };
        let mut disk = DiskState::new(self.cache.clone());
        disk.tree = Some(tree);
        disk.cur_map = CowMap::from(&map);
        disk.tree_map = map;
        disk.xattr = xattr_disk;
        // Unwritten blocks of the checkpoint: its count holds them already.
        for (&idx, _) in disk.cur_map.iter().filter(|(_, &a)| a == crate::format::node::NEW_ADDR) {
            disk.reserved.adopt(idx);
        }
        let is_dir = inode.mode & crate::format::node::S_IFMT == S_IFDIR;
        let is_link = inode.mode & crate::format::node::S_IFMT == S_IFLNK;
        let addrs: Vec<(u64, u32)> = disk.cur_map.iter().map(|(&i, &a)| (i, a)).collect();
        let mut meta = meta;
        let m_size;
        let mut dir_entries = Vec::new();
        if is_dir {
            let bufs = crate::checkpoint::read_blocks(
                &*self.dev,
                &addrs.iter().map(|a| a.1 as u64).collect::<Vec<_>>(),
            )?;
            let mut blocks = Vec::with_capacity(addrs.len());
            for ((_, addr), b) in addrs.iter().zip(bufs.chunks(BLOCK_SIZE)) {
                let db = DentryBlock::decode(b, ino, self.g.max_nid, Some(*addr as u64))?;
                dir_entries.extend(db.entries.iter().cloned());
                blocks.push(db);
            }
            disk.dentries = Some(DiskDir::load(blocks));
            m_size = inode.size;
        } else if is_link {
            let len = inode.size as usize;
            if len == 0 || len > crate::journal::MAX_SYMLINK_LEN || addrs.first().map(|a| a.0) != Some(0) {
                return Err(Error::corrupt(
                    crate::error::Structure::Node,
                    None,
                    format!("symlink {ino} has no target"),
                ));
            }
            let mut b = vec![0u8; BLOCK_SIZE];
            self.dev.read_block(addrs[0].1 as u64, &mut b)?;
            meta.symlink = b[..len].to_vec();
            m_size = inode.size;
        } else {
            m_size = inode.size;
        }
        let stamps = crate::mem::mnode::Stamps {
            atime: inode.atime,
            mtime: inode.mtime,
            ctime: inode.ctime,
            flags: inode.flags,
        };
        let m = MNode::new(ino, meta, m_size, stamps, &self.cache);
        {
            let mut d = m.disk.lock();
            *d = disk;
            m.note_reserved(&d);
        }
        if let Some(d) = m.dir() {
            for e in dir_entries {
                // Entries were validated by the decoder; duplicates would be corruption.
                if d.map.insert_loaded(&e.name, e.ino, e.file_type).is_err() {
                    return Err(Error::corrupt(
                        crate::error::Structure::Dentry,
                        None,
                        format!("directory {ino} holds a name twice"),
                    ));
                }
            }
            m.parent.store(inode.parent, Ordering::Relaxed);
        }
        Ok(m)
    }

    /// Reads inode `ino`'s xattrs from its xattr node (and the blocks it lists).
    fn read_xattrs(&self, ino: u32, xattr_nid: u32) -> Result<(XattrSet, XattrDisk)> {
        if xattr_nid == 0 {
            return Ok(Default::default());
        }
        let e = self.nat.get(xattr_nid);
        if e.is_free() || e.ino != ino {
            return Err(Error::corrupt(
                crate::error::Structure::Nat,
                None,
                format!("xattr node {xattr_nid} of inode {ino} missing"),
            ));
        }
        let at = Some(e.block_addr as u64);
        let mut b = vec![0u8; BLOCK_SIZE];
        self.dev.read_block(e.block_addr as u64, &mut b)?;
        let node = crate::format::Node::decode(&b, &self.g, at)?;
        let f = node.footer;
        if f.nid != xattr_nid || f.ino != ino || f.node_ofs != XATTR_NODE_OFS {
            return Err(Error::corrupt(
                crate::error::Structure::Node,
                at,
                format!(
                    "xattr node {xattr_nid} of inode {ino}: footer names node {} of inode {}",
                    f.nid, f.ino
                ),
            ));
        }
        let disk = XattrDisk { nid: xattr_nid, ..Default::default() };
        match node.body {
            crate::format::NodeBody::Xattr(XattrNode::Inline(a)) => Ok((XattrSet::from_entries(a), disk)),
            crate::format::NodeBody::Xattr(XattrNode::Blocks { stream_len, stream_crc, addrs }) => {
                let bufs = crate::checkpoint::read_blocks(
                    &*self.dev,
                    &addrs.iter().map(|&a| a as u64).collect::<Vec<_>>(),
                )?;
                let mut payloads = Vec::with_capacity(addrs.len());
                for (i, (&a, blk)) in addrs.iter().zip(bufs.chunks(BLOCK_SIZE)).enumerate() {
                    payloads.push(xattr::decode_block(blk, ino, i as u32, Some(a as u64))?);
                }
                let stream = xattr::join_stream(payloads, stream_len, stream_crc, at)?;
                let set = XattrSet::from_entries(xattr::decode_stream(&stream, at)?);
                Ok((set, XattrDisk { blocks: addrs, stream, ..disk }))
            }
            _ => Err(Error::corrupt(crate::error::Structure::Node, at, "not an xattr node")),
        }
    }

    /// Asks the background thread for a checkpoint.
    pub(crate) fn kick_checkpoint(&self) {
        let (m, cv) = &self.cp_kick;
        *m.lock() = true;
        cv.notify_one();
    }

    /// Blocks that can be allocated now without touching the cleaner's reserve. (Prefree
    /// segments do not count: the checkpoint that frees them must fit without them.)
    pub(crate) fn available_blocks(&self) -> u64 {
        self.table.free_segments().saturating_sub(self.g.cleaning_reserve()) * 512
    }

    /// Blocks users may still fill: the main area less the cleaner's reserve, one active
    /// segment per log of every lane (a log's open segment cannot be cleaned), the valid blocks,
    /// what the next checkpoint will need for what is dirty now, and the blocks promised to
    /// preallocated ranges (`mem::reserve`). Invalid blocks in dirty segments count as free:
    /// cleaning turns them into free segments. What statfs reports free.
    pub(crate) fn unused_blocks(&self) -> u64 {
        self.space_left().max(0) as u64
    }

    /// What statfs reports free: the data blocks that fit in the unused blocks together with
    /// the direct nodes that map them (one per `ADDRS_PER_NODE`, ~0.1%), so that a file of
    /// `bfree` blocks, written or preallocated, fits (fstests' generic/103 fallocates all but
    /// 512 KiB of it).
    pub(crate) fn free_data_blocks(&self) -> u64 {
        data_room(self.unused_blocks())
    }

    /// [`Engine::unused_blocks`], negative when more is promised and dirty than is left: a
    /// moment after overwrites (their old blocks stay valid until the checkpoint) or a zero
    /// range over written blocks, or on an image whose reservations a bug overcounted.
    pub(crate) fn space_left(&self) -> i64 {
        let used = self.table.valid_count() + self.committed_blocks() + self.promised_blocks();
        self.g.user_blocks() as i64 - used as i64
    }

    /// Blocks the next checkpoint will need for what is dirty now: a block per dirty page,
    /// (generously) two per dirty inode for its node and directory blocks, and the blocks of
    /// the xattr sets that changed.
    pub(crate) fn committed_blocks(&self) -> u64 {
        let pages = self.cache.dirty_pages.load(Ordering::Relaxed).max(0) as u64;
        let xattrs = self.xattr_owed.load(Ordering::Relaxed).max(0) as u64;
        pages + xattrs + 2 * self.dirty_inodes.sum()
    }

    /// Blocks promised to preallocated, unwritten ranges, and claimed by fallocates that are
    /// making their promises now.
    pub(crate) fn promised_blocks(&self) -> u64 {
        self.cache.reserved_blocks.load(Ordering::Acquire) + self.claimed.load(Ordering::Acquire)
    }

    /// Admits an operation that will dirty up to `blocks` more blocks, each of them new space.
    pub(crate) fn admit(&self, blocks: u64) -> Result<()> {
        self.admit_with(blocks, || blocks)
    }

    /// Admits an operation that will dirty up to `short` more blocks, of which `long()` (at most
    /// `short`) take space for good: the rest overwrite blocks (whose old copies die with the
    /// next checkpoint) or draw on reservations. Refuses it with ENOSPC when even a checkpoint
    /// (which turns prefree segments free) and cleaning cannot make room for the `short` blocks
    /// now, or the space left (`Engine::space_left`) is below `long()`. `long` is asked only
    /// when space is short. Call it outside the pass-through semaphore: it may wait for a
    /// checkpoint.
    pub(crate) fn admit_with(&self, short: u64, long: impl FnOnce() -> u64) -> Result<()> {
        // Fast path: room for everything dirty and promised now plus a wide margin; a margin
        // of one open segment per log makes it imply the space left, too (free segments less
        // the reserve never exceed the user blocks that are not valid by more than those).
        let margin = self.g.main_blocks() / 16 + self.g.open_blocks();
        if self.available_blocks() > self.committed_blocks() + short + self.promised_blocks() + margin {
            return Ok(());
        }
        let long = long().min(short) as i64;
        let now_ok = || self.committed_blocks() + short < self.available_blocks();
        let fits = || now_ok() && self.space_left() >= long;
        // Bounded: each round waits for a checkpoint (which frees prefree segments) or cleans
        // (which makes segments prefree); it gives up when neither can make room.
        // Why it gave up, for the error: the next ENOSPC in a stress run names its cause.
        let mut why = "still short after every round";
        for _ in 0..crate::gc::FOREGROUND_ROUNDS {
            if fits() {
                return Ok(());
            }
            // A checkpoint first: it frees prefree segments, and the blocks that dirty pages
            // overwrite die with it, which cleaning can then give back.
            if self.table.pending_segments() > 0 || self.dirty_inodes.sum() > 0 {
                self.wait_for_checkpoint()?;
                if fits() {
                    return Ok(());
                }
            }
            // The space is really used: cleaning cannot find it. (Only believed while nothing
            // is dirty: until a checkpoint, blocks that dirty data overwrites still count as
            // valid, so with other writers active the cleaner is asked all the same.)
            // No checkpoint is half written while this looks (its moved blocks are valid
            // before the blocks they replace die): its write phase holds `cp_serial`.
            let full = {
                let _serial = self.cp_serial.lock();
                self.space_left() < long && self.dirty_inodes.sum() == 0
            };
            if full {
                why = "the space left is short with nothing dirty";
                break;
            }
            if now_ok() {
                // Only the space left is short, and only a checkpoint can change that.
                continue;
            }
            let want = (self.committed_blocks() + short).saturating_sub(self.available_blocks());
            if !self.clean_foreground(want)? {
                why = "cleaning found no room";
                break;
            }
        }
        if fits() {
            return Ok(());
        }
        // One line a human can act on, with the counts admission went by (blocks).
        Err(Error::errno(
            libc::ENOSPC,
            format!(
                "file system full ({why}): {short} blocks wanted, {long} new; {} valid, {} dirty, {} \
                 promised of {} user blocks, {} free segments, {} pending",
                self.table.valid_count(),
                self.committed_blocks(),
                self.promised_blocks(),
                self.g.user_blocks(),
                self.table.free_segments(),
                self.table.pending_segments(),
            ),
        ))
    }

    /// Claims `blocks` of space for reservations a fallocate is about to make (counted as
    /// promised until the returned claim is dropped, by when the reservations it makes count
    /// themselves), plus room for `nodes` node blocks the next checkpoint writes for them.
    /// ENOSPC, with nothing claimed, when they do not fit in the space left.
    pub(crate) fn claim(&self, blocks: u64, nodes: u64) -> Result<Claim<'_>> {
        let c = Claim { engine: self, blocks };
        self.claimed.fetch_add(blocks, Ordering::AcqRel);
        // Nothing more for good: the claim is in the space left already.
        self.admit_with(nodes, || 0)?;
        Ok(c)
    }

    /// Admits an operation that frees space (unlink, rmdir, rename over a file) but needs a few
    /// metadata blocks first: it may use the reserve, so a full file system can be emptied.
    pub(crate) fn admit_freeing(&self, blocks: u64) -> Result<()> {
        let all = || self.table.free_segments() * 512;
        if self.committed_blocks() + blocks < all() {
            return Ok(());
        }
        self.wait_for_checkpoint()?;
        if self.committed_blocks() + blocks < all() {
            return Ok(());
        }
        let want = (self.committed_blocks() + blocks).saturating_sub(all());
        if self.clean_foreground(want)? && self.committed_blocks() + blocks < all() {
            return Ok(());
        }
        Err(Error::errno(libc::ENOSPC, "file system full, even for metadata"))
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

#[cfg(test)]
mod tests {
    use super::data_room;
    use crate::format::node::ADDRS_PER_NODE;

    #[test]
    fn data_room_leaves_room_for_the_nodes_of_what_fits() {
        let per = ADDRS_PER_NODE as u64;
        for space in (0..5000u64).chain([per, per + 1, 970_000, 1 << 30, u64::MAX / 4]) {
            let n = data_room(space);
            // What a fallocate of n blocks claims (`mem::ops`): n and their nodes, plus one.
            let claim = n + n.div_ceil(per) + 1;
            assert!(claim <= space || n == 0, "{space} free: {n} data blocks claim {claim}");
            assert!(space - n <= space.div_ceil(per + 1) + 2, "{space} free: only {n} data blocks");
        }
    }
}
