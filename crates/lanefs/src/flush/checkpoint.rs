//! Taking a checkpoint.
//!
//! 0. Files with many dirty or logged pages write them back first, the gate shared (fsyncs
//!    go on; `flush/writeback.rs`), so that step 3 holds the gate for what changed since.
//! 1. Take the gate exclusively: in-flight fsyncs and writebacks finish, new ones wait. This
//!    keeps block validity still while the checkpoint writes the SIT that must match its trees.
//! 2. Exclusive phase of the pass-through semaphore (every operation drained): stamp the
//!    checkpoint, swap out the dirty set, and snapshot each dirty inode — attributes, dirty
//!    pages (shared, copy-on-write), current mapping, and the names its directory log says
//!    changed. No I/O happens here; namespace and data operations resume right after.
//! 3. Write the snapshot: data pages to new blocks, changed dentry blocks, each inode's changed
//!    nodes; deleted inodes' trees are dropped. Then the NAT and SIT blocks that changed, the
//!    segment summaries and the pack (`checkpoint::commit`, which flushes before and after).
//! 4. Node ids freed before the snapshot become reusable; fsyncs waiting for this checkpoint
//!    proceed. Then, with the gate released, segments emptied before the snapshot become free
//!    (`settled`: what waits for space waits for this), and segments freed by an earlier
//!    checkpoint and still free are discarded (lazily: `SegmentTable::checkpoint_done`).
//!
//! Records in the journals stamped at or before the checkpoint's stamp are part of it; the new
//! journal heads are where each lane's chain stood at the snapshot.

use crate::checkpoint::{commit, CommitSet};
use crate::engine::{Engine, WriteKind, JOURNAL_LOG};
use crate::error::Result;
use crate::format::checkpoint::{LaneCheckpoint, CP_FLAG_CLEAN};
use crate::format::node::{Inode, NodeBody, NodeFooter, INODE_ADDRS, INODE_NIDS, NEW_ADDR};
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::format::tree::XATTR_NODE_OFS;
use crate::format::LogType;
use crate::journal::{ChainPos, Record};
use crate::mem::mnode::{DiskState, MNode, Meta, S_IFLNK};
use crate::mem::pages::{PageBuf, PAGE_SIZE};
use crate::node::{BlockMap, InodeTree, NodeWriter};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A name of a directory and its entry at the snapshot (None: absent).
type NameChange = (Vec<u8>, Option<(u32, u8)>);

struct InodeSnap {
    m: Arc<MNode>,
    meta: Meta,
    size: u64,
    mtime: crate::format::node::Timespec,
    ctime: crate::format::node::Timespec,
    parent: u32,
    pages: Vec<(u64, PageBuf)>,
    map: BlockMap,
    /// For directories: names whose entry changed, with the entry at the snapshot.
    names: Vec<NameChange>,
    xattrs_changed: bool,
    /// Blocks the cleaner asked to move, still mapped at the snapshot and not rewritten by
    /// it: (logical index, address).
    relocate: Vec<(u64, u32)>,
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

struct Snapshot {
    seq: u64,
    stamp: u64,
    inodes: Vec<InodeSnap>,
    deleted: Vec<Arc<MNode>>,
    orphans: Vec<u32>,
    heads: Vec<ChainPos>,
    /// Directory records this checkpoint took that no journal had: their pending counts are
    /// dropped after the exclusive phase (an fsync cannot start before then: the gate).
    uncount: Vec<Arc<crate::oplog::dirlog::LoggedOp>>,
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
        let gate = self.gate.write();
        let mut snap = {
            let _x = self.pass.exclusive();
            self.snapshot()
        };
        for op in std::mem::take(&mut snap.uncount) {
            self.count_pending(&op.record, -1);
        }
        let seq = snap.seq;
        let r = self.write_snapshot(snap, clean);
        drop(gate);
        let deleted = match r {
            Ok(deleted) => deleted,
            Err(e) => {
                *self.failure.lock() = e.to_string();
                self.failed.store(true, Ordering::Release);
                self.cp_done.notify_all();
                return Err(e);
            }
        };
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

    fn snapshot(&self) -> Snapshot {
        let seq = {
            let mut cp = self.cp.lock();
            cp.started += 1;
            cp.started
        };
        let stamp = self.clock.now().ticks;
        let mut inos: Vec<u32> = Vec::new();
        for d in self.dirty.iter() {
            inos.append(&mut d.lock());
        }
        inos.sort_unstable();
        inos.dedup();
        let mut inodes = Vec::new();
        let mut deleted = Vec::new();
        let mut uncount = Vec::new();
        for ino in inos {
            let Some(m) = self.cells.get(ino as u64) else { continue };
            m.in_dirty_set.store(false, Ordering::Release);
            m.captured_by.store(seq, Ordering::Release);
            let (meta, xattrs_changed) = {
                let mut meta = m.meta.lock();
                if meta.nlink == 0 && m.open.load(Ordering::Acquire) == 0 {
                    drop(meta);
                    deleted.push(m);
                    continue;
                }
                let xattrs_changed = std::mem::take(&mut meta.xattrs_cp_dirty);
                (meta.clone(), xattrs_changed)
            };
            // The checkpoint makes whatever is pending durable by itself.
            m.attr_dirty.store(false, Ordering::Release);
            let pages = m.pages().map(|(p, _)| p.take_dirty()).unwrap_or_default();
            let (map, mut relocate) = {
                let mut disk = m.disk.lock();
                disk.unjournaled.clear();
                disk.truncated_from = None;
                (disk.cur_map.clone(), std::mem::take(&mut disk.relocate))
            };
            relocate.sort_unstable();
            relocate.dedup();
            relocate.retain(|(idx, a)| {
                map.get(idx) == Some(a) && pages.binary_search_by_key(idx, |(i, _)| *i).is_err()
            });
            let mut names = Vec::new();
            if let Some(d) = m.dir() {
                let ops = d.log.take_all();
                let mut touched: Vec<&[u8]> = Vec::with_capacity(ops.len());
                for op in &ops {
                    if !op.journaled.load(Ordering::Acquire) {
                        // Taken into this checkpoint: durable with it. Its pending counts
                        // drop once operations resume (`uncount`).
                        op.journaled.store(true, Ordering::Release);
                        uncount.push(op.clone());
                    }
                    match &op.record {
                        Record::Create { dir, name, .. }
                        | Record::Link { dir, name, .. }
                        | Record::Unlink { dir, name, .. }
                            if *dir == ino =>
                        {
                            touched.push(name);
                        }
                        Record::Rename { src_dir, src_name, dst_dir, dst_name, .. } => {
                            if *src_dir == ino {
                                touched.push(src_name);
                            }
                            if *dst_dir == ino {
                                touched.push(dst_name);
                            }
                        }
                        _ => {}
                    }
                }
                touched.sort_unstable();
                touched.dedup();
                names = touched
                    .into_iter()
                    .map(|n| {
                        let e = d.map.lookup(n).map(|e| (e.ino, e.file_type));
                        (n.to_vec(), e)
                    })
                    .collect();
            }
            let size = match m.dir() {
                Some(d) => d.map.reported_size(),
                None => m.size.load(Ordering::Acquire),
            };
            let (mtime, ctime, parent) = (m.mtime(), m.ctime(), m.parent.load(Ordering::Acquire));
            inodes.push(InodeSnap {
                m,
                meta,
                size,
                mtime,
                ctime,
                parent,
                pages,
                map,
                names,
                xattrs_changed,
                relocate,
            });
        }
        let orphans = self.orphans.lock().iter().copied().collect();
        self.reanchor_journal_heads();
        let heads = self.chains.iter().map(|c| c.lock().pos()).collect();
        self.journal_blocks.take();
        self.logged_ops.take();
        self.deleted_inodes.take();
        self.dirty_inodes.take();
        Snapshot { seq, stamp, inodes, deleted, orphans, heads, uncount }
    }

    /// Each lane's next journal block is reserved ahead of use. If the lane's journal log has
    /// moved on since (other blocks of that log filled the segment), the segment holding the
    /// reserved head can be emptied, freed once a checkpoint is durable and reused by another
    /// log: the lane's next fsync would then write its journal block over live data. So every
    /// checkpoint, before it takes the SIT, moves such a head into the log's current segment
    /// (active segments are never freed), and records that position as the lane's head.
    fn reanchor_journal_heads(&self) {
        let cursors = self.lanes.cursors();
        let mtime = self.elapsed_secs();
        for (l, chain) in self.chains.iter().enumerate() {
            let mut chain = chain.lock();
            let (addr, _) = chain.position();
            let active = cursors[l][JOURNAL_LOG as usize].segno;
            if self.g.seg_of(addr as u64).map(|(s, _)| s) == Some(active) {
                continue;
            }
            let owner = SummaryEntry { kind: SummaryKind::Journal, nid: l as u32, ofs: 0 };
            match self.lanes.reserve(l as u32, JOURNAL_LOG, owner, mtime) {
                Ok(head) => chain.restart_at(head as u32),
                // No block free for it: the head stays (the allocation of the next fsync's
                // blocks would fail the same way).
                Err(e) => tracing::warn!("lanefs: lane {l}: journal head not moved: {e}"),
            }
        }
    }

    /// Writes the snapshot and commits it; returns the inodes it deleted, for the caller to
    /// drop once the gate is released.
    fn write_snapshot(&self, snap: Snapshot, clean: bool) -> Result<Vec<Arc<MNode>>> {
        let (lane, cpu) = self.lane();
        let cp_ver = self.cp.lock().cp.version + 1;
        let mtime = self.elapsed_secs();
        let w = NodeWriter { g: &self.g, nat: &self.nat, lanes: &self.lanes, lane, cpu, cp_ver, mtime };
        // Node and dentry blocks: no reader looks for them by a file's mapping, so they are
        // written in large batches after the data they name.
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut next = 0;
        // Bounded: each pass takes at least one inode.
        while next < snap.inodes.len() {
            // Data first, in batches: a block enters a file's mapping (where a reader that
            // misses the page cache would look for it) only after it is written.
            let first = next;
            let (mut data, mut moves) = (Vec::new(), Vec::new());
            let mut plans = Vec::new();
            while next < snap.inodes.len() && (next == first || data.len() + moves.len() < 1024) {
                plans.push(self.prepare_data(&w, &snap.inodes[next], &mut data, &mut moves)?);
                next += 1;
            }
            self.write_all(&data, WriteKind::Checkpoint)?;
            self.write_all(&moves, WriteKind::Cleaning)?;
            drop((data, moves));
            for (s, plan) in snap.inodes[first..next].iter().zip(plans) {
                self.install_inode(&w, s, plan, &mut writes)?;
            }
            if writes.len() >= 1024 {
                self.write_all(&writes, WriteKind::Checkpoint)?;
                writes.clear();
            }
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
        let sit: Vec<_> = self.table.take_dirty_sit_blocks().into_iter().map(|(_, b)| b).collect();
        let mut summaries = self.lanes.take_closed_summaries();
        summaries.extend(self.lanes.active_summaries());
        let cursors = self.lanes.cursors();
        // NAT, SIT, summaries and the pack (whose size depends on lanes and orphans; one block
        // is close enough for the counters).
        let meta_blocks = (nat.len() + sit.len() + summaries.len() * 2 + 1) as u64;
        self.io.count(WriteKind::Checkpoint, meta_blocks * crate::device::BLOCK_SIZE as u64);
        let cps = self.cp.lock();
        let mut cp = cps.cp.clone();
        cp.version = cp_ver;
        cp.flags = if clean { CP_FLAG_CLEAN } else { 0 };
        cp.stamp = snap.stamp;
        cp.valid_blocks = self.table.total_valid();
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

    /// Allocates and queues one inode's data blocks: its dirty pages, a new symlink's target,
    /// and the blocks the cleaner moves (read now; a valid block cannot change, and nothing
    /// frees it while the gate is held). Nothing names the new blocks yet.
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
        s: &InodeSnap,
        plan: DataPlan,
        writes: &mut Vec<(u64, Vec<u8>)>,
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
        let mut tree_map = s.map.clone();
        if let Some(a) = plan.symlink {
            tree_map.insert(0, a);
        }
        let mut disk = m.disk.lock();
        if m.is_dir() {
            let dd = disk.dentries.get_or_insert_with(Default::default);
            for (name, e) in &s.names {
                dd.set(name, *e);
            }
            let dirty = dd.take_dirty(ino);
            for (idx, blk) in dirty {
                let a = put(idx, blk.encode()?, writes)?;
                tree_map.insert(idx, a);
            }
            disk.cur_map = tree_map.clone();
            disk.map_gen += 1;
        }
        disk.map_gen += 1;
        let pages = m.pages().map(|(p, _)| p);
        for &(idx, a) in &fresh {
            tree_map.insert(idx, a);
            let still = pages.is_some_and(|p| p.settle(idx));
            // The block is this checkpoint's to install if the mapping is what the snapshot
            // saw: a truncate or punch drops a page and its block in one critical section
            // under this lock, so a page that had a block and whose mapping is unchanged still
            // owns it, even if the page itself is no longer cached (stress runs found such a
            // page; its block was then freed by the tree diff while still mapped, and freed
            // again later). A page that had no block and is gone was truncated.
            let unchanged = disk.cur_map.get(&idx) == s.map.get(&idx);
            if unchanged && (still || s.map.contains_key(&idx)) {
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
            atime: s.meta.atime,
            mtime: s.mtime,
            ctime: s.ctime,
            crtime: s.meta.crtime,
            rdev: s.meta.rdev,
            generation: s.meta.generation,
            flags: s.meta.flags,
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
        Ok(())
    }

    /// Writes the xattr node when the set changed; returns the inode naming it.
    fn write_xattrs(
        &self,
        w: &NodeWriter,
        ino: u32,
        mut inode: Inode,
        disk: &mut DiskState,
        s: &InodeSnap,
        writes: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<Inode> {
        let old_nid = disk.xattr_nid;
        if !s.xattrs_changed {
            inode.xattr_nid = old_nid;
            return Ok(inode);
        }
        if old_nid != 0 {
            let e = self.nat.get(old_nid);
            if !e.is_free() {
                self.table.invalidate(e.block_addr as u64)?;
            }
            self.nat.free_nid(old_nid)?;
        }
        if s.meta.xattrs.is_empty() {
            disk.xattr_nid = 0;
            inode.xattr_nid = 0;
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
            body: NodeBody::Xattr(s.meta.xattrs.clone()),
        };
        writes.push((addr, node.encode()?));
        self.nat.set(nid, crate::format::NatEntry { block_addr: addr as u32, ino });
        disk.xattr_nid = nid;
        inode.xattr_nid = nid;
        Ok(inode)
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
                let xnid = std::mem::take(&mut disk.xattr_nid);
                if xnid != 0 {
                    let e = self.nat.get(xnid);
                    if !e.is_free() {
                        self.table.invalidate(e.block_addr as u64)?;
                    }
                    self.nat.free_nid(xnid)?;
                }
                crate::node::drop_inode(w, &tree)?;
            }
            // Never checkpointed: only its reserved id to give back.
            None => self.nat.free_nid(m.ino)?,
        }
        // Its cached pages go with the mnode, dropped after the gate is released.
        Ok(())
    }
}
