//! Installing the captured inodes (step 3 of `flush::checkpoint`): each inode's data written to
//! new blocks (`prepare_data`), then put in its mappings with its dentry blocks and node tree
//! (`install_inode`), by the checkpoint's writer in batches (`install_offered`) or by an fsync
//! or writeback that claimed the inode (`help_install`); and the deleted inodes' trees dropped.
//!
//! Invariants: an inode is installed by the checkpoint that captured it, exactly once (the
//! claim in `Installs`); its data blocks are written before anything maps them (a reader that
//! misses the page cache finds only written blocks); everything an install changes in the
//! inode's disk state happens under its `disk` lock, held from the dentry blocks to the new
//! tree; every block a new tree or mapping supersedes is invalidated exactly once (now if only
//! the journal knew it, with the old tree otherwise).

use super::installs::{Claimed, INSTALL_BATCH_BLOCKS};
use super::snapshot::InodeSnap;
use crate::disk::WriteKind;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::node::{Inode, NodeBody, NodeFooter, BODY_LEN, INODE_ADDRS, INODE_NIDS, NEW_ADDR};
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::format::tree::XATTR_NODE_OFS;
use crate::format::xattr::{self, XattrNode, MAX_XATTR_STREAM, XATTR_PAYLOAD};
use crate::format::LogType;
use crate::mem::cowmap::CowMap;
use crate::mem::mnode::{DiskState, MNode, XattrDisk, S_IFLNK};
use crate::mem::pages::PAGE_SIZE;
use crate::node::{BlockMap, InodeTree, NodeWriter};
use std::sync::atomic::Ordering;

/// What a name of a directory maps to (None: absent).
type DentryTo = Option<(u32, u8)>;

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

impl Engine {
    /// The checkpoint's side of the install queue: claims the offered inodes in order, in
    /// batches of about [`INSTALL_BATCH_BLOCKS`], writes their data and installs them. Inodes
    /// an fsync or writeback claimed first (`Engine::help_install`) are theirs.
    pub(super) fn install_offered(
        &self,
        w: &NodeWriter,
        bridge: (u64, crate::journal::Stamp),
        writes: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<()> {
        // Bounded: each pass claims at least one inode or finds none left.
        let mut passes = 0usize;
        loop {
            let mut batch = self.ckpt.cp.lock().installs.claim_batch(INSTALL_BATCH_BLOCKS);
            if batch.is_empty() {
                return Ok(());
            }
            passes += 1;
            debug_assert!(
                passes <= self.ckpt.cp.lock().installs.offered(),
                "a pass claims an inode at least"
            );
            debug_assert!(
                batch.iter().all(|s| s.m.captured_by.load(Ordering::Acquire) == bridge.0),
                "claimed inodes are this checkpoint's"
            );
            // Data first: a block enters a file's mapping (where a reader that misses the page
            // cache would look for it) only after it is written.
            let (mut data, mut moves) = (Vec::new(), Vec::new());
            let mut plans = Vec::with_capacity(batch.len());
            for s in &mut batch {
                self.settle_inode(s);
                plans.push(self.prepare_data(w, s, &mut data, &mut moves)?);
            }
            self.disk.write_all(&data, WriteKind::Checkpoint)?;
            self.disk.write_all(&moves, WriteKind::Cleaning)?;
            drop((data, moves));
            for (mut s, plan) in batch.into_iter().zip(plans) {
                self.install_inode(w, &mut s, plan, writes, bridge)?;
            }
            // fsyncs of these inodes wait for nothing more of this checkpoint
            // (`Engine::enter_flush`). Under the lock they wait with, so none misses it.
            drop(self.ckpt.cp.lock());
            self.ckpt.cp_done.notify_all();
            if writes.len() >= 1024 {
                self.disk.write_all(writes, WriteKind::Checkpoint)?;
                writes.clear();
            }
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
        debug_assert_eq!(
            s.m.captured_by.load(Ordering::Acquire),
            args.bridge.0,
            "a helper installs this checkpoint's inode"
        );
        // It installs for the checkpoint in its write phase, which waits for it before it
        // commits (`wait_for_helpers`): no later one can have started.
        debug_assert!(
            {
                let cp = self.ckpt.cp.lock();
                cp.started == args.bridge.0 && cp.durable < args.bridge.0
            },
            "a helper installs during its checkpoint's write phase"
        );
        self.disk.io.cp_helped.add(1);
        let w = self.node_writer(&args);
        self.settle_inode(&mut s);
        let r = (|| {
            let (mut data, mut moves, mut writes) = (Vec::new(), Vec::new(), Vec::new());
            let plan = self.prepare_data(&w, &s, &mut data, &mut moves)?;
            self.disk.write_all(&data, WriteKind::Checkpoint)?;
            self.disk.write_all(&moves, WriteKind::Cleaning)?;
            self.install_inode(&w, &mut s, plan, &mut writes, args.bridge)?;
            self.disk.write_all(&writes, WriteKind::Checkpoint)
        })();
        let mut cp = self.ckpt.cp.lock();
        debug_assert!(cp.installs.helping > 0);
        cp.installs.helping -= 1;
        if let Err(e) = &r {
            cp.installs.failed.get_or_insert_with(|| e.to_string());
        }
        drop(cp);
        self.ckpt.cp_done.notify_all();
        r
    }

    /// A captured inode's snapshot, by whoever installs it (the checkpoint's writer or a
    /// helper), before its data is prepared: the cleaner's moves still mapped as the snapshot
    /// saw them and not rewritten by it; the bridge's parts dropped where no fsync journals a
    /// bridge.
    fn settle_inode(&self, s: &mut InodeSnap) {
        // The page search below needs the snapshot's pages in index order (`take_dirty`).
        debug_assert!(s.pages.windows(2).all(|p| p[0].0 < p[1].0), "inode {}: pages in order", s.m.ino);
        s.relocate.sort_unstable();
        s.relocate.dedup();
        let (map, pages) = (&s.map, &s.pages);
        s.relocate.retain(|(idx, a)| {
            map.get(idx) == Some(a) && pages.binary_search_by_key(idx, |(i, _)| *i).is_err()
        });
        debug_assert!(
            s.relocate.iter().all(|(_, a)| *a != NEW_ADDR),
            "the cleaner moves written blocks only"
        );
        if !self.bridges(&s.m) {
            s.unjournaled = Default::default();
            s.xattr_names = Default::default();
        }
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
            Ok(self.disk.lanes.alloc(w.lane, log, owner, w.mtime)? as u32)
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
        debug_assert_eq!(plan.fresh.len(), s.pages.len(), "inode {ino}: a block per dirty page");
        if !s.relocate.is_empty() {
            let addrs: Vec<u64> = s.relocate.iter().map(|&(_, a)| a as u64).collect();
            let bytes = crate::checkpoint::read_blocks(&*self.disk.dev, &addrs)?;
            // Moved data goes to the cold log: it outlived at least one segment.
            let log = if m.is_dir() { LogType::HotData } else { LogType::ColdData };
            for (&(idx, old), b) in s.relocate.iter().zip(bytes.chunks(crate::device::BLOCK_SIZE)) {
                let a = alloc(idx, log)?;
                moves.push((a as u64, b.to_vec()));
                plan.moved.push((idx, old, a));
            }
        }
        debug_assert_eq!(plan.moved.len(), s.relocate.len(), "inode {ino}: a copy per block moved");
        Ok(plan)
    }

    /// Installs one inode's written data blocks in its mappings, writes its changed dentry
    /// blocks and nodes (queued in `writes`), and retires the blocks they replace.
    ///
    /// In this order: the bridge is built; then, under the inode's `disk` lock held to the
    /// end (no fsync or writeback sees the inode half installed), its dentry blocks, its fresh
    /// pages, the cleaner's moves, the blocks the new tree no longer holds, and the xattrs and
    /// node tree.
    fn install_inode(
        &self,
        w: &NodeWriter,
        s: &mut InodeSnap,
        plan: DataPlan,
        writes: &mut Vec<(u64, Vec<u8>)>,
        (seq, stamp): (u64, crate::journal::Stamp),
    ) -> Result<()> {
        debug_assert_eq!(
            s.m.captured_by.load(Ordering::Acquire),
            seq,
            "inode {}: installed by its capturer",
            s.m.ino
        );
        debug_assert_eq!(plan.fresh.len(), s.pages.len(), "inode {}: one block per dirty page", s.m.ino);
        let DataPlan { fresh, symlink, moved } = plan;
        let bridge = self.bridge_of(s, &fresh, seq, stamp);
        let mut tree_map: BlockMap = s.map.to_btree();
        if let Some(a) = symlink {
            tree_map.insert(0, a);
        }
        let s: &InodeSnap = s;
        let m = &s.m;
        let mut disk = m.disk.lock();
        if m.is_dir() {
            self.install_dentries(w, s, &mut disk, &mut tree_map, writes)?;
        }
        disk.map_gen += 1;
        self.install_pages(s, &mut disk, &mut tree_map, &fresh)?;
        self.install_moves(&mut disk, &mut tree_map, moved)?;
        self.retire_replaced(&mut disk, &tree_map)?;
        self.write_tree(w, s, &mut disk, &tree_map, writes)?;
        if bridge.is_some() {
            debug_assert!(m.installed_by.load(Ordering::Acquire) < seq, "inode {}: installed once", m.ino);
            disk.bridge = bridge;
            m.installed_by.store(seq, Ordering::Release);
        }
        Ok(())
    }

    /// The snapshot's state beyond the journal, for fsyncs before this checkpoint is
    /// durable (None where no fsync journals a bridge: `Engine::bridges`): every page it
    /// wrote (whatever became of the page since: what came after is journaled after it),
    /// writeback's blocks, the truncation and the xattrs.
    fn bridge_of(
        &self,
        s: &mut InodeSnap,
        fresh: &[(u64, u32)],
        seq: u64,
        stamp: crate::journal::Stamp,
    ) -> Option<crate::mem::mnode::Bridge> {
        self.bridges(&s.m).then(|| {
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
        })
    }

    /// A directory's touched names applied to its dentry blocks, in name order; the changed
    /// blocks written (queued in `writes`) and mapped, in the tree and the current mapping.
    fn install_dentries(
        &self,
        w: &NodeWriter,
        s: &InodeSnap,
        disk: &mut DiskState,
        tree_map: &mut BlockMap,
        writes: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<()> {
        let ino = s.m.ino;
        debug_assert!(s.m.is_dir(), "inode {ino}: dentries of a directory only");
        debug_assert!(s.pages.is_empty(), "directory {ino}: no data pages, only dentry blocks");
        let put = |idx: u64, bytes: Vec<u8>, writes: &mut Vec<(u64, Vec<u8>)>| -> Result<u32> {
            let owner = SummaryEntry { kind: SummaryKind::Data, nid: ino, ofs: idx as u32 };
            let addr = self.disk.lanes.alloc(w.lane, LogType::HotData, owner, w.mtime)?;
            writes.push((addr, bytes));
            Ok(addr as u32)
        };
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
        disk.cur_map = CowMap::from(&*tree_map);
        disk.map_gen += 1;
        Ok(())
    }

    /// The fresh blocks of the snapshot's pages: each enters the tree, and the current
    /// mapping too where the page is still cached and its mapping unchanged since the
    /// snapshot (the block it replaces dies now if only the journal knew it); otherwise it is
    /// garbage once this tree is superseded.
    fn install_pages(
        &self,
        s: &InodeSnap,
        disk: &mut DiskState,
        tree_map: &mut BlockMap,
        fresh: &[(u64, u32)],
    ) -> Result<()> {
        let ino = s.m.ino;
        debug_assert_eq!(fresh.len(), s.pages.len(), "inode {ino}: a fresh block per snapshot page");
        let pages = s.m.pages().map(|(p, _)| p);
        for &(idx, a) in fresh {
            debug_assert!(a != NEW_ADDR && a != 0, "inode {ino}: page {idx} has a real block");
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
                        self.disk.table.invalidate(old as u64)?;
                    }
                }
            } else {
                // Truncated or remapped since the snapshot: the block belongs to this
                // checkpoint's tree only, and dies once that tree is superseded.
                disk.garbage.push(a);
            }
        }
        Ok(())
    }

    /// Cleaning: a moved copy replaces the block if the file still maps it there and this
    /// checkpoint did not rewrite it (a write, truncate or dentry change since wins; the copy
    /// is then dead at once).
    fn install_moves(
        &self,
        disk: &mut DiskState,
        tree_map: &mut BlockMap,
        moved: Vec<(u64, u32, u32)>,
    ) -> Result<()> {
        for (idx, old, a) in moved {
            debug_assert!(old != a && a != NEW_ADDR, "a move goes to a new, real block");
            if tree_map.get(&idx) != Some(&old) || disk.cur_map.get(&idx) != Some(&old) {
                self.disk.table.invalidate(a as u64)?;
                continue;
            }
            tree_map.insert(idx, a);
            disk.cur_map.insert(idx, a);
            // A block only the journal knew dies now; a tree block below, with the old tree.
            if disk.tree_map.get(&idx) != Some(&old) {
                self.disk.table.invalidate(old as u64)?;
            }
        }
        Ok(())
    }

    /// The inode's garbage not in the new tree, and the previous tree's blocks the new one no
    /// longer holds, become invalid; the new tree's map becomes the inode's.
    fn retire_replaced(&self, disk: &mut DiskState, tree_map: &BlockMap) -> Result<()> {
        // Garbage left the current mapping, but may be in this checkpoint's tree (dropped by a
        // truncate after the snapshot, or a fresh block the mapping moved past): then it is a
        // tree block like any other, and dies exactly once, when a later tree drops it (the
        // diff below, one checkpoint on). Keeping it as garbage too would kill it twice.
        let garbage = std::mem::take(&mut disk.garbage);
        if !garbage.is_empty() {
            let in_tree: std::collections::HashSet<u32> = tree_map.values().copied().collect();
            for a in garbage {
                if !in_tree.contains(&a) {
                    self.disk.table.invalidate(a as u64)?;
                }
            }
        }
        debug_assert!(disk.garbage.is_empty(), "garbage is retired once");
        // Blocks of the previous tree that this tree no longer holds.
        let old_tree_map = std::mem::replace(&mut disk.tree_map, tree_map.clone());
        for (idx, a) in old_tree_map {
            if tree_map.get(&idx) != Some(&a) && a != NEW_ADDR {
                self.disk.table.invalidate(a as u64)?;
            }
        }
        Ok(())
    }

    /// The inode node with the snapshot's attributes, its xattrs (`write_xattrs`) and its node
    /// tree over `tree_map` (`node::write_inode`), queued in `writes`; the new tree becomes
    /// the inode's.
    fn write_tree(
        &self,
        w: &NodeWriter,
        s: &InodeSnap,
        disk: &mut DiskState,
        tree_map: &BlockMap,
        writes: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<()> {
        let m = &s.m;
        debug_assert_eq!(
            s.meta.mode & crate::format::node::S_IFMT,
            m.file_type,
            "inode {}: the type its mode says",
            m.ino
        );
        let old_tree = disk.tree.take().unwrap_or_else(|| InodeTree::empty(m.ino));
        let inode = Inode {
            mode: s.meta.mode,
            uid: s.meta.uid,
            gid: s.meta.gid,
            nlink: s.meta.nlink,
            size: s.size,
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
        let inode = self.write_xattrs(w, m.ino, inode, disk, s, writes)?;
        let log = if m.is_dir() { LogType::HotNode } else { LogType::WarmNode };
        let (tree, blocks) = crate::node::write_inode(w, &inode, tree_map, &old_tree, log)?;
        debug_assert!(!blocks.is_empty(), "inode {}: its inode node is written", m.ino);
        writes.extend(blocks);
        disk.tree = Some(tree);
        Ok(())
    }

    /// Whether fsyncs of `m` during a checkpoint's write phase journal a bridge
    /// (`mem::mnode::Bridge`) instead of waiting for the checkpoint to be durable: regular
    /// files, without region journals (which fence every fsync off anyway: `CpState::fence`),
    /// not made by O_TMPFILE (`MNode::unnamed_birth`).
    pub(crate) fn bridges(&self, m: &MNode) -> bool {
        m.file_type == crate::mem::mnode::S_IFREG
            && self.disk.nvm_log.is_none()
            && !m.unnamed_birth.load(std::sync::atomic::Ordering::Acquire)
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
                        let a = self.disk.lanes.alloc(w.lane, LogType::ColdData, owner, w.mtime)?;
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
        let nid = self.disk.nat.alloc_nid(w.cpu)?;
        let owner = SummaryEntry { kind: SummaryKind::Node, nid, ofs: XATTR_NODE_OFS };
        let addr = self.disk.lanes.alloc(w.lane, LogType::ColdNode, owner, w.mtime)?;
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
        self.disk.nat.set(nid, crate::format::NatEntry { block_addr: addr as u32, ino });
        disk.xattr = XattrDisk { nid, blocks, stream, relocate: Vec::new() };
        inode.xattr_nid = nid;
        Ok(inode)
    }

    /// Retires an xattr node (its block invalid, its id free) and its blocks but those in
    /// `keep` (which the set's new node lists again).
    fn retire_xattrs(&self, x: XattrDisk, keep: &std::collections::HashSet<u32>) -> Result<()> {
        if x.nid != 0 {
            let e = self.disk.nat.get(x.nid);
            if !e.is_free() {
                self.disk.table.invalidate(e.block_addr as u64)?;
            }
            self.disk.nat.set(x.nid, crate::format::NatEntry::default());
            self.disk.nat.free_nid(x.nid)?;
        }
        for a in x.blocks.into_iter().filter(|a| !keep.contains(a)) {
            self.disk.table.invalidate(a as u64)?;
        }
        Ok(())
    }

    /// Drops a deleted inode: its nodes, its data blocks, its node ids.
    pub(super) fn drop_deleted(&self, w: &NodeWriter, m: &MNode) -> Result<()> {
        let mut disk = m.disk.lock();
        let tree_map = std::mem::take(&mut disk.tree_map);
        let cur_map = std::mem::take(&mut disk.cur_map);
        disk.map_gen += 1;
        // `iter`, not `&cur_map`: the latter boxes its iterator, one allocation per dead inode.
        for (&idx, &a) in cur_map.iter() {
            if tree_map.get(&idx) != Some(&a) && a != NEW_ADDR {
                self.disk.table.invalidate(a as u64)?;
            }
        }
        for (_, a) in tree_map {
            if a != NEW_ADDR {
                self.disk.table.invalidate(a as u64)?;
            }
        }
        for a in std::mem::take(&mut disk.garbage) {
            self.disk.table.invalidate(a as u64)?;
        }
        match disk.tree.take() {
            Some(tree) => {
                self.retire_xattrs(std::mem::take(&mut disk.xattr), &Default::default())?;
                crate::node::drop_inode(w, &tree)?;
            }
            // Never checkpointed: only its reserved id to give back.
            None => self.disk.nat.free_nid(m.ino)?,
        }
        // Its cached pages go with the mnode, dropped after the gate is released.
        Ok(())
    }
}
