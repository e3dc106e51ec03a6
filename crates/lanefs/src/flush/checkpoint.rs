//! Taking a checkpoint.
//!
//! 0. Files with many dirty or logged pages write them back first, the gate shared (fsyncs
//!    go on; `flush/writeback.rs`), so that the snapshot takes only what changed since.
//! 1. Take the gate exclusively: in-flight fsyncs and writebacks finish, new ones wait.
//! 2. Exclusive phase of the pass-through semaphore (every operation drained): stamp the
//!    checkpoint, open its epoch in the segment table, swap out the dirty sets and dead lists
//!    whole, and snapshot each live dirty inode — attributes, dirty pages (shared,
//!    copy-on-write), current mapping (shared, `mem::cowmap`), and for a directory its logs
//!    (set aside whole, still offered to fsyncs: `DirLog::hold_all`) and touched-name sets
//!    (swapped out whole, `mem::dir`). Dead inodes are not visited (`Engine::bury`). No I/O
//!    happens here, and no work per dead inode, directory record or touched name; namespace
//!    and data operations resume right after. What the phase did is counted
//!    (`ExclusiveWork`). Then the gate is released: fsync and writeback run beside the rest.
//! 3. Write the snapshot: data pages to new blocks, changed dentry blocks, each inode's changed
//!    nodes, in batches claimed from the install queue (`Installs`), which fsyncs and
//!    writebacks of captured files claim from too and install themselves instead of waiting
//!    (`Engine::help_install`); deleted inodes' trees are dropped. Then the NAT and SIT blocks that changed, the
//!    segment summaries and the pack (`checkpoint::commit`, which flushes before and after).
//! 4. Node ids freed before the snapshot become reusable; fsyncs waiting for this checkpoint
//!    proceed; the directory records it held become journaled. Then segments emptied before
//!    its SIT was taken (and touched by nothing after its snapshot) become free (`settled`:
//!    what waits for space waits for this), and segments freed by an earlier checkpoint and
//!    still free are discarded (lazily: `SegmentTable::checkpoint_done`).
//!
//! Why fsync and writeback may run during step 3 (docs/ARCHITECTURE.md, "Checkpoints beside
//! fsync"): they touch no inode the snapshot captured before this checkpoint has installed it
//! (`Engine::enter_flush`; a captured regular file's fsync then journals the bridge the
//! install left, `mem::mnode::Bridge`, and other captured inodes wait until the checkpoint is
//! durable); the blocks they write are young, left out of this
//! checkpoint's SIT (`SegmentTable::validate_young`), and the only blocks they invalidate are
//! young ones; a segment they take a block from is not freed by this checkpoint; what they
//! journal follows this checkpoint's journal heads and is stamped after its stamp, and the
//! directory records this checkpoint holds are journaled again by any fsync that depends on
//! them, so a crash before the pack lands replays them on top of the previous checkpoint.
//! When the snapshot moved a lane's journal head, or with region journals (emptied once the
//! pack is durable), fsyncs wait for the whole checkpoint as before (`CpState::fence`).
//!
//! Records in the journals stamped at or before the checkpoint's stamp are part of it; the new
//! journal heads are where each lane's chain stood at the snapshot.

use crate::checkpoint::{commit, CommitSet};
use crate::engine::{Engine, WriteKind, JOURNAL_LOG};
use crate::error::{Error, Result};
use crate::format::checkpoint::{LaneCheckpoint, CP_FLAG_CLEAN};
use crate::format::node::{Inode, NodeBody, NodeFooter, BODY_LEN, INODE_ADDRS, INODE_NIDS, NEW_ADDR};
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::format::tree::XATTR_NODE_OFS;
use crate::format::xattr::{self, XattrNode, MAX_XATTR_STREAM, XATTR_PAYLOAD};
use crate::format::LogType;
use crate::journal::ChainPos;
use crate::mem::cowmap::CowMap;
use crate::mem::dir::Touched;
use crate::mem::mnode::{DiskState, MNode, Meta, XattrDisk, S_IFLNK};
use crate::mem::pages::{PageBuf, PAGE_SIZE};
use crate::node::{BlockMap, InodeTree, NodeWriter};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a name of a directory maps to (None: absent).
type DentryTo = Option<(u32, u8)>;

struct InodeSnap {
    m: Arc<MNode>,
    meta: Meta,
    size: u64,
    atime: crate::format::node::Timespec,
    mtime: crate::format::node::Timespec,
    ctime: crate::format::node::Timespec,
    flags: u32,
    parent: u32,
    pages: Vec<(u64, PageBuf)>,
    /// The current mapping at the snapshot: a shared copy (`mem::cowmap`), O(1) to take.
    map: CowMap,
    /// For directories: names whose entry changed, with the entry at the snapshot, as the
    /// directory's shards recorded them (`mem::dir`).
    names: Vec<Touched>,
    xattrs_changed: bool,
    /// Blocks the cleaner asked to move, still mapped at the snapshot and not rewritten by
    /// it: (logical index, address). Filtered after the exclusive phase.
    relocate: Vec<(u64, u32)>,
    /// Writeback's unjournaled blocks, superseded by the checkpoint; with the two below, what
    /// a regular file's bridge holds (`mem::mnode::Bridge`).
    unjournaled: std::collections::BTreeMap<u64, (u32, u32)>,
    /// The truncation not journaled at the snapshot.
    truncated_from: Option<u64>,
    /// Names of the xattrs changed and not journaled at the snapshot.
    xattr_names: std::collections::BTreeSet<Vec<u8>>,
}

/// One inode's new data blocks, written before they are installed.
#[derive(Default)]
struct DataPlan {
    /// Dirty pages: (index, new block).
    fresh: Vec<(u64, u32)>,
    /// A symlink's target, written for the first time.
    symlink: Option<u32>,
    /// Cleaner moves: (index, old block, new block).
    moved: Vec<(u64, u32, u32)>,
}

/// Data blocks the checkpoint's writer claims at a time (`Installs::claim_batch`): what an
/// fsync of a file in the claimed batch may still wait for, so smaller than one device write
/// (`Engine::write_reqs`, 256 blocks); varmail's fsyncs waited on whole 256-block batches.
const INSTALL_BATCH_BLOCKS: usize = 32;

/// A captured inode an fsync or writeback claimed from [`Installs`], to install it.
pub(crate) struct Claimed(InodeSnap, WriterArgs);

/// What a helper needs to write as the checkpoint would (`NodeWriter`, the bridge).
#[derive(Clone, Copy)]
struct WriterArgs {
    lane: u32,
    cpu: usize,
    cp_ver: u64,
    mtime: u64,
    bridge: (u64, crate::journal::Stamp),
}

/// The captured inodes of the checkpoint in progress that nobody has claimed for install yet
/// (`CpState::installs`, under the `cp` lock). The checkpoint's writer claims them in order
/// (`claim_batch`); an fsync or writeback that would wait for one of them claims it instead
/// (`claim`) and installs it itself (`Engine::help_install`). Each is installed exactly once.
#[derive(Default)]
pub(crate) struct Installs {
    /// The checkpoint offering them (0: none).
    seq: u64,
    args: Option<WriterArgs>,
    /// In the snapshot's order; `None` once claimed.
    slots: Vec<Option<InodeSnap>>,
    /// The checkpoint's next slot to claim.
    next: usize,
    /// Slots that helpers may claim: regular files (bridged), by inode number.
    by_ino: std::collections::HashMap<u32, usize>,
    /// Helpers installing now.
    helping: usize,
    /// Why a helper's install failed (the checkpoint fails with it).
    failed: Option<String>,
}

impl Installs {
    fn offer(
        &mut self,
        seq: u64,
        args: WriterArgs,
        inodes: Vec<InodeSnap>,
        helpable: impl Fn(&MNode) -> bool,
    ) {
        assert!(self.slots.is_empty() && self.helping == 0, "one checkpoint at a time");
        self.by_ino =
            inodes.iter().enumerate().filter(|(_, s)| helpable(&s.m)).map(|(i, s)| (s.m.ino, i)).collect();
        self.slots = inodes.into_iter().map(Some).collect();
        (self.seq, self.args, self.next, self.failed) = (seq, Some(args), 0, None);
    }

    /// The next slots in order, skipping claimed ones, until their data reaches `blocks`.
    fn claim_batch(&mut self, blocks: usize) -> Vec<InodeSnap> {
        let mut out = Vec::new();
        let mut n = 0;
        while self.next < self.slots.len() && (out.is_empty() || n < blocks) {
            if let Some(s) = self.slots[self.next].take() {
                n += s.pages.len() + s.relocate.len() + 1;
                out.push(s);
            }
            self.next += 1;
        }
        out
    }

    /// Inode `ino`'s slot, if checkpoint `seq` still offers it unclaimed. The claimant must
    /// pass it to `Engine::help_install`, which counts it out of `helping` again.
    pub(crate) fn claim(&mut self, ino: u32, seq: u64) -> Option<Claimed> {
        if seq != self.seq {
            return None;
        }
        let i = *self.by_ino.get(&ino)?;
        let s = self.slots[i].take()?;
        self.helping += 1;
        Some(Claimed(s, self.args.expect("offered with its writer")))
    }

    /// Ends the offer (the checkpoint claimed or gave up the rest).
    fn close(&mut self) {
        self.slots.clear();
        self.by_ino.clear();
        (self.seq, self.args, self.next) = (0, None, 0);
    }
}

struct Snapshot {
    seq: u64,
    stamp: u64,
    /// The stamp the bridges' records carry (`stamp` is its ticks).
    full_stamp: crate::journal::Stamp,
    inodes: Vec<InodeSnap>,
    /// Inodes dead at the snapshot, which this checkpoint drops (`settle_snapshot` fills it
    /// from the two below).
    deleted: Vec<Arc<MNode>>,
    /// The per-CPU dead lists, swapped out whole (`Engine::bury`).
    dead: Vec<Vec<u32>>,
    /// Dirty inodes the phase found dead that no one buried.
    found_dead: Vec<Arc<MNode>>,
    orphans: Vec<u32>,
    heads: Vec<ChainPos>,
    /// The directories whose logs this checkpoint holds (`DirLog::hold_all`): released, their
    /// records journaled and pending counts dropped, once it is durable.
    held_dirs: Vec<Arc<MNode>>,
    /// Reserved blocks at the snapshot (`mem::reserve`).
    reserved: u64,
}

/// Work exclusive phases did since mount, item by item: what tests bound (wall-clock time is
/// the bench's business). Dead inodes, directory records, touched names and mapping entries
/// are not items: they are handed over in whole lists, logs and shards (`swaps`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExclusiveWork {
    /// Exclusive phases (checkpoint snapshots).
    pub phases: u64,
    /// Dirty inodes looked at one by one (captured, or found dead by no one's burial).
    pub inodes: u64,
    /// Lists, log shards and touched-name shards swapped out whole.
    pub swaps: u64,
}

/// How long checkpoints held the foreground out, in microseconds: the exclusive phase (the
/// snapshot, under the pass-through semaphore held exclusively: every operation waits) and the
/// gate's exclusive hold around it (fsync and writeback wait; the write phase no longer holds
/// it). Each is timed from the request for the exclusive hold, so the wait for operations in
/// flight to drain counts.
#[derive(Debug, Default)]
pub struct CpPauses {
    exclusive_max: AtomicU64,
    /// The longest exclusive phase since [`CpPauses::take_exclusive_peak`] was last called.
    exclusive_peak: AtomicU64,
    write_max: AtomicU64,
    /// `ExclusiveWork` since mount.
    work_phases: AtomicU64,
    work_inodes: AtomicU64,
    work_swaps: AtomicU64,
}

impl CpPauses {
    fn record_work(&self, w: ExclusiveWork) {
        self.work_phases.fetch_add(w.phases, Ordering::Relaxed);
        self.work_inodes.fetch_add(w.inodes, Ordering::Relaxed);
        self.work_swaps.fetch_add(w.swaps, Ordering::Relaxed);
    }

    /// What the exclusive phases did since mount.
    pub fn work(&self) -> ExclusiveWork {
        ExclusiveWork {
            phases: self.work_phases.load(Ordering::Relaxed),
            inodes: self.work_inodes.load(Ordering::Relaxed),
            swaps: self.work_swaps.load(Ordering::Relaxed),
        }
    }

    fn exclusive(&self, d: std::time::Duration) {
        let us = micros(d);
        self.exclusive_max.fetch_max(us, Ordering::Relaxed);
        self.exclusive_peak.fetch_max(us, Ordering::Relaxed);
    }

    fn write_phase(&self, d: std::time::Duration) {
        self.write_max.fetch_max(micros(d), Ordering::Relaxed);
    }

    /// The longest exclusive phase since mount.
    pub fn exclusive_max_us(&self) -> u64 {
        self.exclusive_max.load(Ordering::Relaxed)
    }

    /// The longest exclusive hold of the gate (fsync and writeback held out) since mount.
    pub fn write_max_us(&self) -> u64 {
        self.write_max.load(Ordering::Relaxed)
    }

    /// The longest exclusive phase since the previous call (or mount), and a fresh start: what a
    /// benchmark run reports for its own span.
    pub fn take_exclusive_peak(&self) -> u64 {
        self.exclusive_peak.swap(0, Ordering::Relaxed)
    }
}

/// `d` in whole microseconds, saturating.
fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Engine {
    /// Takes a checkpoint now. `clean` marks an unmount.
    pub fn checkpoint(&self, clean: bool) -> Result<()> {
        if self.opts.read_only {
            return Ok(());
        }
        let _one = self.cp_serial.lock();
        self.check_writable()?;
        self.write_back_early();
        let gate_asked = std::time::Instant::now();
        let gate = self.gate.write();
        let mut snap = {
            let asked = std::time::Instant::now();
            let exclusive = self.pass.exclusive();
            let snap = self.snapshot(clean);
            drop(exclusive);
            self.cp_pauses.exclusive(asked.elapsed());
            snap
        };
        // Offered before the gate opens: an fsync or writeback of a captured file that finds
        // it unclaimed installs it itself instead of waiting (`Engine::help_install`).
        let args = self.writer_args(&snap);
        let inodes = std::mem::take(&mut snap.inodes);
        self.cp.lock().installs.offer(snap.seq, args, inodes, |m| self.bridges(m));
        // fsync and writeback go on beside the write phase: they touch no inode the snapshot
        // captured (`Engine::enter_flush`), their blocks are young (out of this checkpoint's
        // SIT) and the segments they write to outlive it (`SegmentTable::open_epoch`).
        drop(gate);
        self.cp_pauses.write_phase(gate_asked.elapsed());
        self.settle_snapshot(&mut snap);
        let seq = snap.seq;
        let held = std::mem::take(&mut snap.held_dirs);
        let r = self.write_snapshot(snap, args, clean);
        let deleted = match r {
            Ok(deleted) => deleted,
            Err(e) => {
                self.stop_with_failure(e.to_string());
                return Err(e);
            }
        };
        self.release_held(&held);
        // The deleted inodes' memory (their cached pages above all) is freed here, not while
        // every fsync waits at the gate: a mail spool deletes thousands of files a checkpoint.
        drop(deleted);
        // Segments emptied before the SIT was taken are free now. Discarding (a hole punched
        // in an image file, TRIM on a device) can take milliseconds: it runs after the gate
        // and the waiting fsyncs are let go.
        self.table.checkpoint_done(|segs| self.discard_segments(segs));
        self.cp.lock().settled = seq;
        self.cp_done.notify_all();
        Ok(())
    }

    /// The exclusive phase (every operation drained): what the checkpoint must take at this
    /// instant, and nothing it can take after. Lists, logs and touched-name sets are swapped
    /// out whole; each live dirty inode is captured (its mapping shared, not copied); dead
    /// inodes are not visited at all (`Engine::bury` took them out of the dirty set). The work
    /// done per item is counted in `cp_pauses` (`ExclusiveWork`).
    fn snapshot(&self, clean: bool) -> Snapshot {
        let mut work = ExclusiveWork { phases: 1, ..Default::default() };
        let seq = {
            let mut cp = self.cp.lock();
            cp.started += 1;
            cp.started
        };
        let full_stamp = self.clock.now();
        let stamp = full_stamp.ticks;
        // From here on, blocks taken belong to the next epoch (`SegmentTable::open_epoch`).
        self.table.open_epoch(seq);
        self.cp.lock().snap_stamp = stamp;
        let mut sets = Vec::with_capacity(self.dirty.len());
        for d in self.dirty.iter() {
            sets.push(std::mem::take(&mut *d.lock()));
            work.swaps += 1;
        }
        let mut dead = Vec::with_capacity(self.dead.len());
        for d in self.dead.iter() {
            dead.push(std::mem::take(&mut *d.lock()));
            work.swaps += 1;
        }
        let mut inos: Vec<u32> = sets.iter().flatten().copied().collect();
        // Lazy access times go out on unmount, `sync`, or once they are old (`mem::atime`).
        let all_lazy = clean || self.lazy_flush.swap(false, Ordering::AcqRel);
        inos.extend(self.take_lazy(all_lazy));
        inos.sort_unstable();
        inos.dedup();
        let mut inodes = Vec::with_capacity(inos.len());
        // Found dead here rather than buried (recovery's unlinks): few.
        let mut found_dead = Vec::new();
        let mut held_dirs = Vec::new();
        for ino in inos {
            work.inodes += 1;
            let Some(m) = self.cells.get(ino as u64) else { continue };
            if m.dead.load(Ordering::Acquire) {
                // Buried before this phase (a lazy atime, or dirtied again while dead): on a
                // dead list taken above.
                continue;
            }
            let (meta, xattrs_changed, xattr_names) = {
                let mut meta = m.meta.lock();
                if meta.nlink == 0 && m.open.load(Ordering::Acquire) == 0 {
                    drop(meta);
                    m.dead.store(true, Ordering::Release);
                    found_dead.push(m);
                    continue;
                }
                // Whatever is pending is this checkpoint's now: the xattrs it writes (their
                // blocks no longer owed) and those an fsync would journal.
                self.xattr_settled(&mut meta.xattrs);
                let xattr_names = std::mem::take(&mut meta.xattrs.unjournaled);
                let xattrs_changed = std::mem::take(&mut meta.xattrs.cp_dirty);
                // Cheap: the xattr set is shared, not copied.
                (meta.clone(), xattrs_changed, xattr_names)
            };
            m.in_dirty_set.store(false, Ordering::Release);
            m.captured_by.store(seq, Ordering::Release);
            // The checkpoint makes whatever is pending durable by itself.
            m.attr_dirty.store(false, Ordering::Release);
            m.atime_dirty.store(false, Ordering::Release);
            let pages = m.pages().map(|(p, _)| p.take_dirty()).unwrap_or_default();
            let (map, relocate, unjournaled, truncated_from) = {
                let mut disk = m.disk.lock();
                let truncated_from = disk.truncated_from.take();
                // The count this checkpoint records is the NEW_ADDR entries its trees get:
                // every reserved block is unwritten, and no page written here draws on one.
                debug_assert!(disk.reserved.iter().all(|i| disk.cur_map.get(&i) == Some(&NEW_ADDR)));
                debug_assert!(pages.iter().all(|(i, _)| !disk.reserved.contains(*i)));
                // Shared, not copied (`mem::cowmap`); the unjournaled set is dropped after the
                // phase.
                (
                    disk.cur_map.clone(),
                    std::mem::take(&mut disk.relocate),
                    std::mem::take(&mut disk.unjournaled),
                    truncated_from,
                )
            };
            let mut names = Vec::new();
            if let Some(d) = m.dir() {
                // One swap per core and per shard with changes: the records are released once
                // the checkpoint is durable, and the names sorted after the phase.
                work.swaps += d.log.hold_all() as u64;
                held_dirs.push(m.clone());
                names = d.map.take_touched();
                work.swaps += names.len() as u64;
            }
            let size = match m.dir() {
                Some(d) => d.map.reported_size(),
                None => m.size.load(Ordering::Acquire),
            };
            let (mtime, ctime, parent) = (m.mtime(), m.ctime(), m.parent.load(Ordering::Acquire));
            let (atime, flags) = (m.atime(), m.iflags());
            inodes.push(InodeSnap {
                m,
                meta,
                size,
                atime,
                mtime,
                ctime,
                flags,
                parent,
                pages,
                map,
                names,
                xattrs_changed,
                relocate,
                unjournaled,
                truncated_from,
                xattr_names,
            });
        }
        let orphans = self.orphans.lock().iter().copied().collect();
        let reserved = self.cache.reserved_blocks.load(Ordering::Acquire);
        let moved = self.reanchor_journal_heads();
        let heads = self.chains.iter().map(|c| c.lock().pos()).collect();
        // fsyncs wait for this checkpoint, whatever they flush, when a lane's chain left its
        // head behind (a transaction after the new head is out of reach from the last
        // checkpoint's, which recovery reads if this one never lands), or with region journals
        // (emptied once the pack is durable: `Engine::apply_nat`).
        if moved || self.nvm_log.is_some() {
            self.cp.lock().fence = seq;
        }
        self.journal_blocks.take();
        self.logged_ops.take();
        self.deleted_inodes.take();
        self.dirty_inodes.take();
        self.cp_pauses.record_work(work);
        Snapshot {
            seq,
            stamp,
            full_stamp,
            inodes,
            deleted: Vec::new(),
            dead,
            found_dead,
            orphans,
            heads,
            held_dirs,
            reserved,
        }
    }

    /// Right after the exclusive phase, fsyncs and writeback running again beside it: the
    /// snapshot's work that needs no frozen moment (none of them touches what it changes).
    ///
    /// - Dead inodes: their pending xattr and journal state is dropped and their reservations
    ///   given back, which the reserved count taken in the phase still held. A dead inode has
    ///   no name and no open handle, so nothing changed it since the phase.
    /// - Each captured inode's cleaner moves are checked against its snapshot, and its touched
    ///   names sorted.
    fn settle_snapshot(&self, snap: &mut Snapshot) {
        let buried =
            std::mem::take(&mut snap.dead).into_iter().flatten().filter_map(|ino| self.cells.get(ino as u64));
        let mut deleted: Vec<Arc<MNode>> = buried.chain(std::mem::take(&mut snap.found_dead)).collect();
        deleted.sort_unstable_by_key(|m| m.ino);
        for m in &deleted {
            debug_assert!(m.dead.load(Ordering::Acquire));
            {
                let mut meta = m.meta.lock();
                debug_assert!(meta.nlink == 0 && m.open.load(Ordering::Acquire) == 0, "inode {} dead", m.ino);
                self.xattr_settled(&mut meta.xattrs);
                meta.xattrs.unjournaled.clear();
            }
            m.attr_dirty.store(false, Ordering::Release);
            m.atime_dirty.store(false, Ordering::Release);
            let mut disk = m.disk.lock();
            disk.unjournaled.clear();
            disk.truncated_from = None;
            // Its unwritten blocks go with it.
            let gone = disk.reserved.clear();
            debug_assert!(gone <= snap.reserved, "the count held inode {}'s reservations", m.ino);
            snap.reserved = snap.reserved.saturating_sub(gone);
        }
        snap.deleted = deleted;
    }

    /// A captured inode's snapshot, by whoever installs it (the checkpoint's writer or a
    /// helper), before its data is prepared: the cleaner's moves still mapped as the snapshot
    /// saw them and not rewritten by it; the bridge's parts dropped where no fsync journals a
    /// bridge.
    fn settle_inode(&self, s: &mut InodeSnap) {
        s.relocate.sort_unstable();
        s.relocate.dedup();
        let (map, pages) = (&s.map, &s.pages);
        s.relocate.retain(|(idx, a)| {
            map.get(idx) == Some(a) && pages.binary_search_by_key(idx, |(i, _)| *i).is_err()
        });
        if !self.bridges(&s.m) {
            s.unjournaled = Default::default();
            s.xattr_names = Default::default();
        }
    }

    /// How this checkpoint writes nodes and data (its lane, CPU slot, version and segment
    /// time) and the bridge it leaves: the same for its writer and its helpers.
    fn writer_args(&self, snap: &Snapshot) -> WriterArgs {
        let (_, cpu) = self.lane();
        WriterArgs {
            lane: self.checkpoint_lane(),
            cpu,
            cp_ver: self.cp.lock().cp.version + 1,
            mtime: self.elapsed_secs(),
            bridge: (snap.seq, snap.full_stamp),
        }
    }

    fn node_writer(&self, a: &WriterArgs) -> NodeWriter<'_> {
        NodeWriter {
            g: &self.g,
            nat: &self.nat,
            lanes: &self.lanes,
            lane: a.lane,
            cpu: a.cpu,
            cp_ver: a.cp_ver,
            mtime: a.mtime,
        }
    }

    /// Once the checkpoint is durable: the directory records it held are journaled (in it),
    /// and their pending counts drop. An fsync that journaled one meanwhile counted it down
    /// itself. (One whose write then failed and gave the record back finds it gone from the
    /// log: its count stays up, and later fsyncs of that inode only look at one directory more
    /// than they need; the record itself is durable in the checkpoint.)
    fn release_held(&self, dirs: &[Arc<MNode>]) {
        for d in dirs {
            let Some(dir) = d.dir() else { continue };
            for op in dir.log.release_held().iter().flatten() {
                if !op.journaled.swap(true, Ordering::AcqRel) {
                    self.count_pending(&op.record, -1);
                }
            }
        }
    }

    /// Each lane's next journal block is reserved ahead of use. If the lane's journal log has
    /// moved on since (other blocks of that log filled the segment), the segment holding the
    /// reserved head can be emptied, freed once a checkpoint is durable and reused by another
    /// log: the lane's next fsync would then write its journal block over live data. So every
    /// checkpoint, before it takes the SIT, moves such a head into the log's current segment
    /// (active segments are never freed), and records that position as the lane's head.
    fn reanchor_journal_heads(&self) -> bool {
        let cursors = self.lanes.cursors();
        let mtime = self.elapsed_secs();
        let mut moved = false;
        for (l, chain) in self.chains.iter().enumerate() {
            let mut chain = chain.lock();
            let (addr, _) = chain.position();
            // Recovery from this checkpoint starts reading there: the head's segment must
            // outlive it (`SegmentTable::touch`).
            self.table.touch(addr as u64);
            let active = cursors[l][JOURNAL_LOG as usize].segno;
            if self.g.seg_of(addr as u64).map(|(s, _)| s) == Some(active) {
                continue;
            }
            let owner = SummaryEntry { kind: SummaryKind::Journal, nid: l as u32, ofs: 0 };
            match self.lanes.reserve(l as u32, JOURNAL_LOG, owner, mtime) {
                Ok(head) => {
                    chain.restart_at(head as u32);
                    moved = true;
                }
                // No block free for it: the head stays (the allocation of the next fsync's
                // blocks would fail the same way).
                Err(e) => tracing::warn!("lanefs: lane {l}: journal head not moved: {e}"),
            }
        }
        moved
    }

    /// Writes the snapshot and commits it; returns the inodes it deleted, for the caller to
    /// drop once the gate is released.
    fn write_snapshot(&self, snap: Snapshot, args: WriterArgs, clean: bool) -> Result<Vec<Arc<MNode>>> {
        let (cp_ver, mtime) = (args.cp_ver, args.mtime);
        let w = self.node_writer(&args);
        // Node and dentry blocks: no reader looks for them by a file's mapping, so they are
        // written in large batches after the data they name.
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        let installed = self.install_offered(&w, args.bridge, &mut writes);
        // Whatever happened, nothing stays offered, and no helper is still writing for this
        // checkpoint when it commits (or gives up).
        self.cp.lock().installs.close();
        self.wait_for_helpers();
        installed?;
        if let Some(why) = self.cp.lock().installs.failed.take() {
            return Err(Error::errno(
                libc::EIO,
                format!("an install an fsync did for the checkpoint: {why}"),
            ));
        }
        for m in &snap.deleted {
            self.drop_deleted(&w, m)?;
            // Out of the cache before its id can be reused (`nat.checkpoint_done` below): a
            // create given the id must not find this mnode there. Nothing can reach it any
            // more: no name, not open.
            self.cells.remove_if_same(m.ino as u64, m);
        }
        self.write_all(&writes, WriteKind::Checkpoint)?;
        drop(writes);

        let nat = self.nat.take_dirty_blocks();
        let taken = self.table.take_checkpoint_sit();
        let sit: Vec<_> = taken.blocks.into_iter().map(|(_, b)| b).collect();
        // The cursors with the summaries of the segments they name, then the segments closed
        // until now: one an fsync closed meanwhile is written whole (its closed summary), not
        // as the open one read a moment before.
        let (cursors, active) = self.lanes.active_cursors_and_summaries();
        let mut summaries = self.lanes.take_closed_summaries();
        let closed: std::collections::HashSet<u32> = summaries.iter().map(|s| s.segno).collect();
        summaries.extend(active.into_iter().filter(|s| !closed.contains(&s.segno)));
        // NAT, SIT, summaries and the pack (whose size depends on lanes and orphans; one block
        // is close enough for the counters).
        let meta_blocks = (nat.len() + sit.len() + summaries.len() * 2 + 1) as u64;
        self.io.count(WriteKind::Checkpoint, meta_blocks * crate::device::BLOCK_SIZE as u64);
        let cps = self.cp.lock();
        let mut cp = cps.cp.clone();
        cp.version = cp_ver;
        cp.flags = if clean { CP_FLAG_CLEAN } else { 0 };
        cp.stamp = snap.stamp;
        cp.reserved_blocks = snap.reserved;
        cp.valid_blocks = taken.valid;
        cp.valid_nodes = self.nat.valid_nodes();
        cp.valid_inodes = self.nat.valid_inodes();
        cp.next_nid = self.nat.next_nid_hint();
        // Read after the snapshot: above the generation of every inode it holds.
        cp.next_generation = self.generations.persist_value();
        cp.elapsed_secs = mtime;
        let [user, cleaning, other] = self.io.take_unsaved();
        cp.user_bytes_written = cp.user_bytes_written.saturating_add(user);
        cp.gc_bytes_written = cp.gc_bytes_written.saturating_add(cleaning);
        cp.cp_bytes_written = cp.cp_bytes_written.saturating_add(other);
        cp.lanes = cursors
            .into_iter()
            .zip(&snap.heads)
            .map(|(logs, h)| LaneCheckpoint { logs, journal_head: h.addr, journal_seq: h.seq })
            .collect();
        cp.orphans = snap.orphans.clone();
        let pack = cps.pack;
        drop(cps);
        let nat = self.stage_nat(&mut cp, nat)?;
        let written = commit(&*self.dev, &self.g, &mut cp, pack, &CommitSet { nat, sit, summaries })?;
        self.apply_nat(cp.version)?;
        self.nat.checkpoint_done();
        self.gc_checkpoint_done();
        let mut cps = self.cp.lock();
        cps.cp = cp;
        cps.pack = written;
        cps.durable = snap.seq;
        drop(cps);
        self.cp_done.notify_all();
        Ok(snap.deleted)
    }

    /// The checkpoint's side of the install queue: claims the offered inodes in order, in
    /// batches of about [`INSTALL_BATCH_BLOCKS`], writes their data and installs them. Inodes
    /// an fsync or writeback claimed first (`Engine::help_install`) are theirs.
    fn install_offered(
        &self,
        w: &NodeWriter,
        bridge: (u64, crate::journal::Stamp),
        writes: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<()> {
        // Bounded: each pass claims at least one inode or finds none left.
        loop {
            let mut batch = self.cp.lock().installs.claim_batch(INSTALL_BATCH_BLOCKS);
            if batch.is_empty() {
                return Ok(());
            }
            // Data first: a block enters a file's mapping (where a reader that misses the page
            // cache would look for it) only after it is written.
            let (mut data, mut moves) = (Vec::new(), Vec::new());
            let mut plans = Vec::with_capacity(batch.len());
            for s in &mut batch {
                self.settle_inode(s);
                plans.push(self.prepare_data(w, s, &mut data, &mut moves)?);
            }
            self.write_all(&data, WriteKind::Checkpoint)?;
            self.write_all(&moves, WriteKind::Cleaning)?;
            drop((data, moves));
            for (mut s, plan) in batch.into_iter().zip(plans) {
                self.install_inode(w, &mut s, plan, writes, bridge)?;
            }
            // fsyncs of these inodes wait for nothing more of this checkpoint
            // (`Engine::enter_flush`). Under the lock they wait with, so none misses it.
            drop(self.cp.lock());
            self.cp_done.notify_all();
            if writes.len() >= 1024 {
                self.write_all(writes, WriteKind::Checkpoint)?;
                writes.clear();
            }
        }
    }

    /// Waits until no fsync or writeback is still installing an inode for the checkpoint in
    /// progress (their node blocks must be written, and their NAT entries set, before the
    /// checkpoint takes the NAT and the SIT).
    fn wait_for_helpers(&self) {
        let mut cp = self.cp.lock();
        // Bounded: each helper finishes its one inode and counts itself out.
        while cp.installs.helping > 0 {
            self.cp_done.wait(&mut cp);
        }
    }

    /// Son's cooperative checkpoint (issue 18): an fsync or writeback of a file that the
    /// checkpoint in progress captured and has not installed yet claims it
    /// (`Installs::claim`) and installs it here, on its own thread, instead of waiting for the
    /// checkpoint's writer to reach it. The install is the checkpoint's own (`prepare_data`,
    /// `install_inode`: the checkpoint's lane, version and bridge), written at once; the
    /// checkpoint waits for it before it takes the NAT and the SIT (`wait_for_helpers`).
    pub(crate) fn help_install(&self, claimed: Claimed) -> Result<()> {
        let Claimed(mut s, args) = claimed;
        self.io.cp_helped.add(1);
        let w = self.node_writer(&args);
        self.settle_inode(&mut s);
        let r = (|| {
            let (mut data, mut moves, mut writes) = (Vec::new(), Vec::new(), Vec::new());
            let plan = self.prepare_data(&w, &s, &mut data, &mut moves)?;
            self.write_all(&data, WriteKind::Checkpoint)?;
            self.write_all(&moves, WriteKind::Cleaning)?;
            self.install_inode(&w, &mut s, plan, &mut writes, args.bridge)?;
            self.write_all(&writes, WriteKind::Checkpoint)
        })();
        let mut cp = self.cp.lock();
        debug_assert!(cp.installs.helping > 0);
        cp.installs.helping -= 1;
        if let Err(e) = &r {
            cp.installs.failed.get_or_insert_with(|| e.to_string());
        }
        drop(cp);
        self.cp_done.notify_all();
        r
    }

    /// Allocates and queues one inode's data blocks: its dirty pages, a new symlink's target,
    /// and the blocks the cleaner moves (read now; a valid block cannot change, and no segment
    /// is freed before this checkpoint is durable). Nothing names the new blocks yet.
    fn prepare_data(
        &self,
        w: &NodeWriter,
        s: &InodeSnap,
        data: &mut Vec<(u64, Vec<u8>)>,
        moves: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<DataPlan> {
        let m = &s.m;
        let ino = m.ino;
        let alloc = |idx: u64, log: LogType| -> Result<u32> {
            let owner = SummaryEntry { kind: SummaryKind::Data, nid: ino, ofs: idx as u32 };
            Ok(self.lanes.alloc(w.lane, log, owner, w.mtime)? as u32)
        };
        let data_log = if m.is_dir() { LogType::HotData } else { LogType::WarmData };
        let mut plan = DataPlan::default();
        for (idx, buf) in &s.pages {
            let a = alloc(*idx, data_log)?;
            data.push((a as u64, buf.to_vec()));
            plan.fresh.push((*idx, a));
        }
        if m.file_type == S_IFLNK && !s.map.contains_key(&0) {
            let mut b = s.meta.symlink.clone();
            b.resize(PAGE_SIZE, 0);
            let a = alloc(0, data_log)?;
            data.push((a as u64, b));
            plan.symlink = Some(a);
        }
        if !s.relocate.is_empty() {
            let addrs: Vec<u64> = s.relocate.iter().map(|&(_, a)| a as u64).collect();
            let bytes = crate::checkpoint::read_blocks(&*self.dev, &addrs)?;
            // Moved data goes to the cold log: it outlived at least one segment.
            let log = if m.is_dir() { LogType::HotData } else { LogType::ColdData };
            for (&(idx, old), b) in s.relocate.iter().zip(bytes.chunks(crate::device::BLOCK_SIZE)) {
                let a = alloc(idx, log)?;
                moves.push((a as u64, b.to_vec()));
                plan.moved.push((idx, old, a));
            }
        }
        Ok(plan)
    }

    /// Installs one inode's written data blocks in its mappings, writes its changed dentry
    /// blocks and nodes (queued in `writes`), and retires the blocks they replace.
    fn install_inode(
        &self,
        w: &NodeWriter,
        s: &mut InodeSnap,
        plan: DataPlan,
        writes: &mut Vec<(u64, Vec<u8>)>,
        (seq, stamp): (u64, crate::journal::Stamp),
    ) -> Result<()> {
        let m = &s.m;
        let ino = m.ino;
        let put = |idx: u64, bytes: Vec<u8>, writes: &mut Vec<(u64, Vec<u8>)>| -> Result<u32> {
            let owner = SummaryEntry { kind: SummaryKind::Data, nid: ino, ofs: idx as u32 };
            let addr = self.lanes.alloc(w.lane, LogType::HotData, owner, w.mtime)?;
            writes.push((addr, bytes));
            Ok(addr as u32)
        };
        let fresh = plan.fresh;
        // The snapshot's state beyond the journal, for fsyncs before this checkpoint is
        // durable: every page it wrote (whatever became of the page since: what came after
        // is journaled after it), writeback's blocks, the truncation and the xattrs.
        let bridge = self.bridges(m).then(|| {
            debug_assert_eq!(fresh.len(), s.pages.len());
            let pages =
                fresh.iter().zip(&s.pages).map(|(&(idx, a), (_, buf))| (idx, a, buf.clone())).collect();
            let xattrs = std::mem::take(&mut s.xattr_names)
                .into_iter()
                .map(|n| {
                    let v = s.meta.xattrs.set.get(&n).map(|v| v.to_vec());
                    (n, v)
                })
                .collect();
            let attr = crate::journal::InodeAttr {
                mode: s.meta.mode,
                uid: s.meta.uid,
                gid: s.meta.gid,
                size: s.size,
                atime: s.atime,
                mtime: s.mtime,
                ctime: s.ctime,
                crtime: s.meta.crtime,
                rdev: s.meta.rdev,
                flags: s.flags,
                generation: s.meta.generation,
            };
            crate::mem::mnode::Bridge {
                seq,
                stamp,
                attr,
                truncated_from: s.truncated_from,
                blocks: std::mem::take(&mut s.unjournaled),
                pages,
                xattrs,
                journaled: false,
            }
        });
        let mut tree_map: BlockMap = s.map.to_btree();
        if let Some(a) = plan.symlink {
            tree_map.insert(0, a);
        }
        let mut disk = m.disk.lock();
        if m.is_dir() {
            let dd = disk.dentries.get_or_insert_with(Default::default);
            let mut names: Vec<(&[u8], DentryTo)> =
                s.names.iter().flat_map(|t| t.iter().map(|(n, e)| (&**n, *e))).collect();
            // In name order, as a directory's blocks were always filled: the layout does not
            // depend on hashing.
            names.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (name, e) in names {
                dd.set(name, e);
            }
            let dirty = dd.take_dirty(ino);
            for (idx, blk) in dirty {
                let a = put(idx, blk.encode()?, writes)?;
                tree_map.insert(idx, a);
            }
            disk.cur_map = CowMap::from(&tree_map);
            disk.map_gen += 1;
        }
        disk.map_gen += 1;
        let pages = m.pages().map(|(p, _)| p);
        for &(idx, a) in &fresh {
            tree_map.insert(idx, a);
            let still = pages.is_some_and(|p| p.settle(idx));
            // A reserved block is not unchanged even if it maps as the snapshot saw it
            // (NEW_ADDR): the snapshot's page drew on the reservation, so the range was
            // preallocated again since (punch or zero range, then fallocate), and it must read
            // as zeros, not as this page.
            let unchanged = disk.cur_map.get(&idx) == s.map.get(&idx) && !disk.reserved.contains(idx);
            // A page in flight leaves the cache only by a truncate or punch, which drops its
            // mapping in the same critical section under this lock. Its mapping can then look
            // unchanged only if it had none, or had the never-written placeholder and a
            // fallocate put the placeholder back: either way the block holds cut data (a
            // mapped block installed here read back as the fallocated range's contents).
            debug_assert!(
                still || !unchanged || matches!(s.map.get(&idx), None | Some(&NEW_ADDR)),
                "inode {ino}: page {idx} gone while its block is still mapped"
            );
            if still && unchanged {
                let old = s.map.get(&idx).copied();
                disk.cur_map.insert(idx, a);
                if let Some(old) = old {
                    // Journal-only blocks superseded here die now; tree blocks below.
                    if disk.tree_map.get(&idx) != Some(&old) && old != NEW_ADDR {
                        self.table.invalidate(old as u64)?;
                    }
                }
            } else {
                // Truncated or remapped since the snapshot: the block belongs to this
                // checkpoint's tree only, and dies once that tree is superseded.
                disk.garbage.push(a);
            }
        }
        // Cleaning: a moved copy replaces the block if the file still maps it there and this
        // checkpoint did not rewrite it (a write, truncate or dentry change since wins; the
        // copy is then dead at once).
        for (idx, old, a) in plan.moved {
            if tree_map.get(&idx) != Some(&old) || disk.cur_map.get(&idx) != Some(&old) {
                self.table.invalidate(a as u64)?;
                continue;
            }
            tree_map.insert(idx, a);
            disk.cur_map.insert(idx, a);
            // A block only the journal knew dies now; a tree block below, with the old tree.
            if disk.tree_map.get(&idx) != Some(&old) {
                self.table.invalidate(old as u64)?;
            }
        }
        // Garbage left the current mapping, but may be in this checkpoint's tree (dropped by a
        // truncate after the snapshot, or a fresh block the mapping moved past): then it is a
        // tree block like any other, and dies exactly once, when a later tree drops it (the
        // diff below, one checkpoint on). Keeping it as garbage too would kill it twice.
        let garbage = std::mem::take(&mut disk.garbage);
        if !garbage.is_empty() {
            let in_tree: std::collections::HashSet<u32> = tree_map.values().copied().collect();
            for a in garbage {
                if !in_tree.contains(&a) {
                    self.table.invalidate(a as u64)?;
                }
            }
        }
        // Blocks of the previous tree that this tree no longer holds.
        let old_tree_map = std::mem::replace(&mut disk.tree_map, tree_map.clone());
        for (idx, a) in old_tree_map {
            if tree_map.get(&idx) != Some(&a) && a != NEW_ADDR {
                self.table.invalidate(a as u64)?;
            }
        }
        let old_tree = disk.tree.take().unwrap_or_else(|| InodeTree::empty(ino));
        let size = s.size;
        let inode = Inode {
            mode: s.meta.mode,
            uid: s.meta.uid,
            gid: s.meta.gid,
            nlink: s.meta.nlink,
            size,
            blocks: 0,
            atime: s.atime,
            mtime: s.mtime,
            ctime: s.ctime,
            crtime: s.meta.crtime,
            rdev: s.meta.rdev,
            generation: s.meta.generation,
            flags: s.flags,
            xattr_nid: 0,
            parent: s.parent,
            name: Vec::new(),
            nids: [0; INODE_NIDS],
            addrs: vec![0; INODE_ADDRS],
        };
        let inode = self.write_xattrs(w, m.ino, inode, &mut disk, s, writes)?;
        let log = if m.is_dir() { LogType::HotNode } else { LogType::WarmNode };
        let (tree, blocks) = crate::node::write_inode(w, &inode, &tree_map, &old_tree, log)?;
        writes.extend(blocks);
        disk.tree = Some(tree);
        if bridge.is_some() {
            disk.bridge = bridge;
            m.installed_by.store(seq, Ordering::Release);
        }
        Ok(())
    }

    /// Whether fsyncs of `m` during a checkpoint's write phase journal a bridge
    /// (`mem::mnode::Bridge`) instead of waiting for the checkpoint to be durable: regular
    /// files, without region journals (which fence every fsync off anyway: `CpState::fence`).
    pub(crate) fn bridges(&self, m: &MNode) -> bool {
        m.file_type == crate::mem::mnode::S_IFREG && self.nvm_log.is_none()
    }

    /// Writes the xattr node when the set changed (or the cleaner moves its blocks); returns
    /// the inode naming it. A set that fits goes inline in the node; a larger one goes to xattr
    /// blocks as a stream, and only the blocks whose bytes changed (or that the cleaner moves)
    /// are written again: appending names or replacing a value in place costs a block or two.
    fn write_xattrs(
        &self,
        w: &NodeWriter,
        ino: u32,
        mut inode: Inode,
        disk: &mut DiskState,
        s: &InodeSnap,
        writes: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<Inode> {
        if !s.xattrs_changed {
            inode.xattr_nid = disk.xattr.nid;
            return Ok(inode);
        }
        let set = &s.meta.xattrs.set;
        // Every value of a set that fits is shorter than the node.
        let inline = set.inline_len() <= BODY_LEN;
        // The new blocks (all allocated before anything is retired, as `write_inode` does).
        let mut blocks: Vec<u32> = Vec::new();
        let mut stream: Vec<u8> = Vec::new();
        let mut body = XattrNode::Inline(Vec::new());
        if !inline {
            stream = xattr::encode_stream(set.iter());
            if stream.len() > MAX_XATTR_STREAM {
                // setxattr refuses this; only a journal replayed in an odd order gets here.
                return Err(Error::InvalidArgument(format!(
                    "inode {ino}: xattr set of {} bytes over the {MAX_XATTR_STREAM}-byte limit",
                    stream.len()
                )));
            }
            let moved: std::collections::HashSet<(u32, u32)> = disk.xattr.relocate.iter().copied().collect();
            for (i, chunk) in stream.chunks(XATTR_PAYLOAD).enumerate() {
                let old = disk.xattr.blocks.get(i).copied();
                let same = disk.xattr.stream.chunks(XATTR_PAYLOAD).nth(i) == Some(chunk);
                match old {
                    Some(a) if same && !moved.contains(&(i as u32, a)) => blocks.push(a),
                    _ => {
                        let owner = SummaryEntry { kind: SummaryKind::Xattr, nid: ino, ofs: i as u32 };
                        // Cold data: out of the node logs, where the journal chains live.
                        let a = self.lanes.alloc(w.lane, LogType::ColdData, owner, w.mtime)?;
                        writes.push((a, xattr::encode_block(ino, i as u32, chunk)));
                        blocks.push(a as u32);
                    }
                }
            }
            body = XattrNode::Blocks {
                stream_len: stream.len() as u32,
                stream_crc: crc32c::crc32c(&stream),
                addrs: blocks.clone(),
            };
        } else if !set.is_empty() {
            body = XattrNode::Inline(set.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect());
        }
        // The old node, and the old blocks the new set does not keep.
        let kept: std::collections::HashSet<u32> = blocks.iter().copied().collect();
        self.retire_xattrs(std::mem::take(&mut disk.xattr), &kept)?;
        inode.xattr_nid = 0;
        if set.is_empty() {
            return Ok(inode);
        }
        let nid = self.nat.alloc_nid(w.cpu)?;
        let owner = SummaryEntry { kind: SummaryKind::Node, nid, ofs: XATTR_NODE_OFS };
        let addr = self.lanes.alloc(w.lane, LogType::ColdNode, owner, w.mtime)?;
        let node = crate::format::Node {
            footer: NodeFooter {
                nid,
                ino,
                node_ofs: XATTR_NODE_OFS,
                cp_ver: w.cp_ver,
                lane: w.lane as u16,
                ..Default::default()
            },
            body: NodeBody::Xattr(body),
        };
        writes.push((addr, node.encode()?));
        self.nat.set(nid, crate::format::NatEntry { block_addr: addr as u32, ino });
        disk.xattr = XattrDisk { nid, blocks, stream, relocate: Vec::new() };
        inode.xattr_nid = nid;
        Ok(inode)
    }

    /// Retires an xattr node (its block invalid, its id free) and its blocks but those in
    /// `keep` (which the set's new node lists again).
    fn retire_xattrs(&self, x: XattrDisk, keep: &std::collections::HashSet<u32>) -> Result<()> {
        if x.nid != 0 {
            let e = self.nat.get(x.nid);
            if !e.is_free() {
                self.table.invalidate(e.block_addr as u64)?;
            }
            self.nat.set(x.nid, crate::format::NatEntry::default());
            self.nat.free_nid(x.nid)?;
        }
        for a in x.blocks.into_iter().filter(|a| !keep.contains(a)) {
            self.table.invalidate(a as u64)?;
        }
        Ok(())
    }

    /// Drops a deleted inode: its nodes, its data blocks, its node ids.
    fn drop_deleted(&self, w: &NodeWriter, m: &MNode) -> Result<()> {
        let mut disk = m.disk.lock();
        let tree_map = std::mem::take(&mut disk.tree_map);
        let cur_map = std::mem::take(&mut disk.cur_map);
        disk.map_gen += 1;
        for (&idx, &a) in &cur_map {
            if tree_map.get(&idx) != Some(&a) && a != NEW_ADDR {
                self.table.invalidate(a as u64)?;
            }
        }
        for (_, a) in tree_map {
            if a != NEW_ADDR {
                self.table.invalidate(a as u64)?;
            }
        }
        for a in std::mem::take(&mut disk.garbage) {
            self.table.invalidate(a as u64)?;
        }
        match disk.tree.take() {
            Some(tree) => {
                self.retire_xattrs(std::mem::take(&mut disk.xattr), &Default::default())?;
                crate::node::drop_inode(w, &tree)?;
            }
            // Never checkpointed: only its reserved id to give back.
            None => self.nat.free_nid(m.ino)?,
        }
        // Its cached pages go with the mnode, dropped after the gate is released.
        Ok(())
    }
}
