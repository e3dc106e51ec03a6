//! flush: bringing the disk up to date from MEMFS.
//!
//! fsync writes a *transaction* to the caller's lane journal: the directory operations the
//! file or directory depends on (merged from the per-core logs by timestamp, with create/unlink
//! pairs absorbed), the file's attributes, and the mapping of its newly written data blocks with
//! their checksums. Data and journal blocks go out in one scatter-gather batch, then one device
//! flush shared with every concurrent fsync: with cooperative commit (the default), the batch
//! holds every queued fsync's blocks and is written by whichever of them found no batch being
//! written (`disk/commit.rs`), and its flush is shared through group commit too; with
//! `FsOptions::cooperative` off, each fsync writes its own batch and group commit shares the
//! flush. Recovery replays transactions whose data checksums match, so a crash between the
//! batch and the flush cannot expose stale data.
//!
//! With a persistent-memory region (`FsOptions::nvm`) the transaction goes to the lane's
//! journal in the region instead, after the data is written and flushed, and is durable before
//! its records are released; see `crate::pmem` and `flush/nvm.rs`.
//!
//! Which directories an fsync flushes (durability contract, ARCHITECTURE.md): every directory whose
//! log holds an unjournaled record naming the file (its create, links, renames); for every
//! record flushed, every directory with unjournaled records naming an inode it names (so an
//! unlink never lands without the link that keeps the inode alive, and both sides of a rename
//! go together); for a directory, the directories naming it (its own creation: the ancestor
//! rule); and for the removal of a directory, its own log (the unlinks that emptied it) —
//! repeated until nothing new is added (ScaleFS's rename dependencies and ancestor rule).
//! Each inode counts, per directory, its records no journal holds yet, so the closure starts
//! from exact sets whatever other fsyncs run meanwhile.
//!
//! fsyncs of one directory take its records one after the other (its flush lock) and write
//! them side by side. A later one may depend on an earlier one's records, so it counts as
//! durable only once the earlier one's write completed: each flush leaves a ticket
//! (`crate::sync::ticket`) in its directories, and the next one waits for it before its device
//! flush or region commit. A ticket is written only if every one it waited for was, so the
//! last ticket of a directory stands for all before it.

pub mod checkpoint;
mod nvm;
pub mod writeback;

use crate::device::WriteReq;
use crate::disk::{unshare, BlockBytes, ChainPart, CommitError, CommitReq, WriteKind};
use crate::engine::{Engine, JOURNAL_LOG};
use crate::error::{Error, Result};
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::journal::{Record, Transaction};
use crate::mem::mnode::MNode;
use crate::mem::pages::PageBuf;
use crate::oplog::dirlog::{names, removes, LoggedOp};
use crate::sync::rank::MutexGuard;
use crate::sync::ticket::{Ticket, TicketGuard};
use crate::sync::Rank;
use nvm::RegionCommit;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The directory operations one fsync writes.
struct DirOps {
    /// Every record marked journaled by this flush (absorbed ones too).
    taken: Vec<Arc<LoggedOp>>,
    /// The records written.
    ops: Vec<Arc<LoggedOp>>,
    /// Whether `m`'s own Create is among them (then its attributes are there too).
    creates_m: bool,
    /// The unresolved tickets of the flushes that collected from these directories before
    /// this one (`sync::ticket`): this transaction counts as durable only once they are
    /// written.
    before: Vec<Arc<Ticket>>,
}

impl Engine {
    /// Whether fsyncs commit through the device's commit queue (`disk/commit.rs`): with
    /// cooperative commit asked for (`FsOptions::cooperative`), where the device's flush costs
    /// something. Where it is free (an image in RAM) a shared batch saves nothing and only
    /// makes each lane's fsync wait for the others' writes: DWSL at two threads ran at half
    /// the speed of each lane writing its own batch (docs/benchmarks.md, session 18).
    fn commits_together(&self) -> bool {
        self.opts.cooperative && !self.disk.dev.flush_is_free()
    }

    /// Waits until no checkpoint in progress still uses `m`'s mutable state (and, with
    /// `fenced`, until none fences fsyncs off: see `CpState::fence`), then returns holding the
    /// gate shared (so no checkpoint snapshot starts until the caller is done).
    ///
    /// A checkpoint holds the gate exclusively only for its snapshot: its write phase runs
    /// beside the caller, which must then touch nothing the checkpoint writes. An inode the
    /// snapshot captured is such a thing until the checkpoint has installed it (written its
    /// pages, put their blocks in its mapping and built its tree: `installed_by`); a regular
    /// file's fsync then journals the bridge (`mem::mnode::Bridge`) and goes on, anything else
    /// waits until the checkpoint is durable. An inode the snapshot did not capture has not
    /// changed since the previous snapshot, so every block it maps beyond its checkpointed
    /// tree was written after this snapshot (young: `SegmentTable::validate_young`).
    pub(crate) fn enter_flush(
        &self,
        m: &Arc<MNode>,
        fenced: bool,
    ) -> Result<crate::sync::rank::RwLockReadGuard<'_, ()>> {
        // It takes the gate, and may wait for a whole checkpoint: the caller holds neither the
        // gate nor an operation (the checkpoint's exclusive phase waits for both).
        debug_assert!(
            ![Rank::Gate, Rank::PassSem].iter().any(|r| crate::sync::rank::held().contains(r)),
            "enter_flush holding the gate or an operation"
        );
        let bridges = self.bridges(m);
        // Bounded: each round waits for a checkpoint to install m or finish; a new one
        // captures m (or fences) only if it started meanwhile, and then the next round waits
        // for that one.
        loop {
            let captured = m.captured_by.load(Ordering::Acquire);
            let fence = if fenced { self.ckpt.cp.lock().fence } else { 0 };
            // Whether the checkpoint that captured m is done with it: durable, or (bridged)
            // installed.
            let done_with = |durable: u64| {
                durable >= captured || bridges && m.installed_by.load(Ordering::Acquire) >= captured
            };
            {
                let mut cp = self.ckpt.cp.lock();
                let mut waited = false;
                // Bounded: m is installed at most once; each wait ends with a checkpoint's
                // install batch, its offer or its commit.
                while cp.durable < fence || !done_with(cp.durable) {
                    self.check_writable()?;
                    if bridges && self.opts.cooperative && cp.durable >= fence {
                        // Rather than wait for the checkpoint's writer to reach m, install
                        // it here (Son's cooperative checkpoint).
                        if let Some(claimed) = cp.installs.claim(m.ino, captured) {
                            drop(cp);
                            self.help_install(claimed)?;
                            cp = self.ckpt.cp.lock();
                            continue;
                        }
                    }
                    if !waited {
                        waited = true;
                        self.disk.io.cp_waits.add(1);
                    }
                    self.ckpt.cp_done.wait(&mut cp);
                }
            }
            let gate = self.ckpt.gate.read();
            // Owed to the checkpoint in progress (its snapshot left m dirty and no one has
            // touched it since): captured now, before the caller changes it. The next round
            // then waits for its install, or does it.
            self.capture_if_owed(m);
            let fence_now = if fenced { self.ckpt.cp.lock().fence } else { 0 };
            if m.captured_by.load(Ordering::Acquire) == captured && fence_now == fence {
                // What the caller may now touch: m, no longer used by the checkpoint that
                // captured it (durable, or installed and bridged).
                debug_assert!({
                    let durable = self.ckpt.cp.lock().durable;
                    durable >= captured || bridges && m.installed_by.load(Ordering::Acquire) >= captured
                });
                return Ok(gate);
            }
        }
    }

    /// fsync(2) and fdatasync(2).
    pub fn fsync(&self, ino: u32, datasync: bool) -> Result<()> {
        let m = self.mnode(ino)?;
        self.fsync_mnode(&m, datasync)
    }

    /// fsync of an mnode the caller holds.
    pub fn fsync_mnode(&self, m: &Arc<MNode>, datasync: bool) -> Result<()> {
        if self.opts.read_only {
            // Nothing can be dirty: there is nothing to make durable.
            return Ok(());
        }
        self.check_writable()?;
        if m.linkable.load(Ordering::Acquire) {
            // An O_TMPFILE inode no link named yet: a crash drops it whatever is journaled,
            // and records for it now would be replayed before its name's `Create` makes it,
            // to nothing. Its changes stay pending for the fsync after its link.
            return Ok(());
        }
        let gate = self.enter_flush(m, true)?;
        // An access time changed by a read is an attribute change for fsync, not for fdatasync
        // (as ext4: it dirties the inode, not its data). The gate keeps the checkpoint's
        // snapshot, which clears both marks, away meanwhile.
        if !datasync && m.atime_dirty.swap(false, Ordering::AcqRel) {
            m.attr_dirty.store(true, Ordering::Release);
            // Dirty too: a transaction that does not fit leaves it to the checkpoint.
            self.mem.mark_dirty(m);
        }
        let mut start = m.pending_dirs();
        if m.is_dir() {
            start.push(m.ino);
        }
        let r = self.flush_txn(m, &start);
        drop(gate);
        if r? {
            // The transaction did not fit its lane's journal (region or device): a checkpoint
            // (which starts after this point, so it holds everything the fsync covers) makes it
            // durable.
            self.checkpoint(false)?;
        }
        Ok(())
    }

    /// Writes one transaction for `m` and the directories reachable from `start`. Returns
    /// `true` when it made nothing durable and a checkpoint must make the changes durable
    /// instead: a transaction its lane's journal has no room for (in the region or on the
    /// device), or one that collected after a flush that then failed to write its own.
    fn flush_txn(&self, m: &Arc<MNode>, start: &[u32]) -> Result<bool> {
        // First, and alone of its kind: every other lock below is taken after it.
        let _order = m.fsync_order.lock();
        let (lane, _) = self.disk.lane();
        let dirs = self.dir_closure(start)?;
        let (dir_ops, ticket) = self.take_dir_ops(&dirs, m.ino)?;
        // Stamped after every record collected: replay applies the file's own records last.
        let stamp = self.clock.now();
        debug_assert!(
            dir_ops.ops.iter().all(|o| o.stamp().ticks <= stamp.ticks),
            "the inode's records come after its directories'"
        );
        debug_assert!(dir_ops.ops.len() <= dir_ops.taken.len(), "what is written was taken");
        let pages = m.pages().map(|(p, _)| p.take_unsynced()).unwrap_or_default();
        debug_assert!(
            pages.windows(2).all(|p| p[0].0 < p[1].0),
            "inode {}: unsynced pages in order, once each",
            m.ino
        );
        let inline = self.disk.nvm_log.is_some()
            && !pages.is_empty()
            && pages.len() <= self.opts.nvm_inline_pages.unwrap_or(0);
        let result = self.write_txn(m, lane, stamp, &dir_ops, &pages, inline);
        let written = matches!(result, Ok(Commit::Durable | Commit::FlushOwed | Commit::FlushFailed(_)));
        if written {
            if let Some((p, _)) = m.pages() {
                if inline {
                    // Durable in the region only: the device still owes them (checkpoint).
                    p.settle_logged(&pages);
                } else {
                    // Written: the pages may be evicted now (a reader then finds the blocks).
                    for (idx, _) in &pages {
                        p.settle(*idx);
                    }
                }
            }
            // Written (not yet flushed): an fsync that depends on these records no longer
            // finds them pending; its device flush comes after our write completed.
            for op in &dir_ops.taken {
                self.count_pending(&op.record, -1);
            }
        } else {
            self.give_back(&dirs, &dir_ops, m, &pages);
        }
        // Ours counts only once the flushes that collected from our directories before us
        // have written theirs: our records may depend on theirs (a create ours names), and our
        // device flush covers only writes complete before it. (With region journals, waited
        // for before our commit already: `write_txn`.)
        let before_written = dir_ops.before.iter().all(|t| t.wait());
        // A cooperative batch whose flush failed wrote ours but made nothing durable: a later
        // flush that waits for our ticket after its own (it may have been an earlier batch)
        // must not count on ours.
        let flush_failed = matches!(result, Ok(Commit::FlushFailed(_)));
        ticket.resolve(written && before_written && !flush_failed);
        match result? {
            // One device flush shared with every concurrent fsync (group commit).
            Commit::FlushOwed if before_written => {
                // Durable after the flush: what the lane's next transaction says it may skip.
                let marks = &self.disk.chain_marks[lane as usize];
                let upto = marks.written();
                if self.commits_together() {
                    // Nothing of ours to write (no records): a request without writes still
                    // waits for the next batch's flush, which starts after this call.
                    self.disk.commit_flush()?;
                } else {
                    self.disk.fsync_flush()?;
                }
                marks.flushed(upto);
                Ok(false)
            }
            // Written, and its cooperative batch's flush failed: as a failed group flush.
            Commit::FlushFailed(e) => Err(e),
            // With cooperative commit, a ticket is resolved only after its transaction's
            // flush (`commit_txn` returns then): the ones we waited for are durable too.
            Commit::Durable if before_written => Ok(false),
            // Not written, or written after a flush that was not: a checkpoint (which starts
            // after this point) holds everything either took.
            Commit::Durable | Commit::FlushOwed | Commit::Checkpoint => Ok(true),
        }
    }

    /// Under the flush locks of `dirs`: waits for the directory operations already stamped to
    /// append their records, takes every unjournaled one (`collect_dir_ops`), and leaves this
    /// flush's ticket in each directory, noting the unresolved ones it replaces in
    /// `DirOps::before`. The locks go before the caller writes: flushes of one directory
    /// collect one after the other and write side by side.
    fn take_dir_ops(&self, dirs: &[Arc<MNode>], m_ino: u32) -> Result<(DirOps, TicketGuard)> {
        let mut locks = flush_locks(dirs);
        // Operations already stamped but still appending their records must land first.
        self.mem.inflight.wait_below(crate::oplog::Timestamp::now());
        let mut dir_ops = self.collect_dir_ops(dirs, m_ino)?;
        let (ticket, guard) = Ticket::issue();
        for last in locks.iter_mut() {
            // A resolved one is done with: written, or its records given back (under these
            // locks, before it resolved) and collected again just now.
            if let Some(t) = last.replace(ticket.clone()).filter(|t| !t.is_resolved()) {
                if !dir_ops.before.iter().any(|b| Arc::ptr_eq(b, &t)) {
                    dir_ops.before.push(t);
                }
            }
        }
        debug_assert!(dir_ops.before.iter().all(|t| !Arc::ptr_eq(t, &ticket)));
        Ok((dir_ops, guard))
    }

    /// Gives back what a flush took and did not write, so that a later fsync journals it again.
    fn give_back(&self, dirs: &[Arc<MNode>], dir_ops: &DirOps, m: &MNode, pages: &[(u64, PageBuf)]) {
        // Under the flush locks again: no flush collects while the records go back.
        let _locks = flush_locks(dirs);
        for op in &dir_ops.taken {
            op.journaled.store(false, Ordering::Release);
        }
        // Their logs' cursors may have passed them.
        for d in dirs {
            d.dir().expect("dir").log.rewind();
        }
        if let Some((p, _)) = m.pages() {
            p.restore_dirty(pages);
        }
    }

    /// The directories an fsync starting at `start` must flush, in ascending inode order.
    fn dir_closure(&self, start: &[u32]) -> Result<Vec<Arc<MNode>>> {
        let mut seen = BTreeMap::new();
        let mut queue: Vec<u32> = start.to_vec();
        // Bounded by the number of directories: each is expanded once.
        while let Some(d) = queue.pop() {
            if d == 0 || seen.contains_key(&d) {
                continue;
            }
            let dm = match self.dir_mnode(d) {
                Ok(x) => x,
                // A directory removed since: its records were absorbed or are reached another way.
                Err(Error::Errno { errno: libc::ENOENT | libc::ENOTDIR, .. }) => continue,
                Err(e) => return Err(e),
            };
            // The directory's own name must be durable first (ancestor rule).
            queue.extend(dm.pending_dirs());
            for op in dm.dir().expect("dir").log.unjournaled() {
                for (ino, dir) in names(&op.record) {
                    queue.push(dir);
                    if let Some(c) = self.mem.cells.get(ino as u64) {
                        queue.extend(c.pending_dirs());
                    }
                }
                if let Some(gone) = removes(&op.record) {
                    if self.mem.cells.get(gone as u64).is_some_and(|c| c.is_dir()) {
                        // Its removal needs the removals of its entries.
                        queue.push(gone);
                    }
                }
                if let Record::Rename { ino, dst_dir, .. } = &op.record {
                    if self.mem.cells.get(*ino as u64).is_some_and(|c| c.is_dir()) {
                        // A directory moved under `dst_dir`: replayed without the moves that
                        // made `dst_dir`'s ancestors what they are now, it could land inside
                        // itself and cut a subtree off the root. Those moves come too.
                        queue.extend(self.ancestors_pending_dirs(*dst_dir));
                    }
                }
            }
            seen.insert(d, dm);
        }
        // Each directory expanded once: the map's order is the flush-lock order
        // (`flush_locks`), ascending inode numbers.
        debug_assert!(seen.values().all(|d| d.is_dir()), "the closure holds directories only");
        Ok(seen.into_values().collect())
    }

    /// The directories holding unjournaled records that name `dir` or any of its ancestors (as
    /// they are now, up to the root).
    fn ancestors_pending_dirs(&self, dir: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut d = dir;
        // Bounded: a path is at most max_nid directories long (a loop in memory would be a bug
        // elsewhere; the bound keeps it from hanging fsync).
        for _ in 0..self.disk.g.max_nid {
            if d == 0 || d == crate::format::layout::ROOT_INO {
                break;
            }
            let Ok(m) = self.dir_mnode(d) else { break };
            out.extend(m.pending_dirs());
            d = m.parent.load(Ordering::Acquire);
        }
        out
    }

    /// Adds `n` to the pending counts of the (inode, directory) pairs `r` names.
    pub(crate) fn count_pending(&self, r: &Record, n: i32) {
        for (ino, dir) in names(r) {
            // No reference count taken: the checkpoint calls this for every record it
            // releases, and the count is a line the inode's other users write too.
            self.mem.cells.with(ino as u64, |c| c.note_pending(dir, n));
        }
    }

    /// Unjournaled operations of `dirs`, merged by timestamp, create/unlink pairs of inodes
    /// that are gone absorbed; marks them journaled.
    fn collect_dir_ops(&self, dirs: &[Arc<MNode>], m_ino: u32) -> Result<DirOps> {
        let mut seen = HashSet::new();
        let mut ops: Vec<Arc<LoggedOp>> = Vec::new();
        for d in dirs {
            for op in d.dir().expect("dir").log.unjournaled() {
                if seen.insert(Arc::as_ptr(&op) as usize) {
                    ops.push(op);
                }
            }
        }
        ops.sort_by_key(|o| o.stamp());
        // Absorption: an inode created and unlinked again, now without links and not open, never
        // reaches the journal (ScaleFS). Its operations are journaled as done all the same.
        // Not a create that a checkpoint in progress holds (stamped at or before its snapshot):
        // that checkpoint makes it durable, and the unlink must follow it.
        let held_upto = self.ckpt.cp.lock().snap_stamp;
        let mut created: BTreeMap<u32, usize> = BTreeMap::new();
        let mut absorbed: BTreeSet<usize> = BTreeSet::new();
        for (i, op) in ops.iter().enumerate() {
            match &op.record {
                Record::Create { ino, stamp, .. } if stamp.ticks > held_upto => {
                    created.insert(*ino, i);
                }
                Record::Unlink { ino, .. } => {
                    if let Some(&ci) = created.get(ino) {
                        let gone = match self.mem.cells.get(*ino as u64) {
                            Some(c) => c.meta.lock().nlink == 0 && !c.held(),
                            None => true,
                        };
                        let mentioned_between = ops[ci + 1..i].iter().any(|o| mentions(&o.record, *ino));
                        if gone && !mentioned_between {
                            absorbed.insert(ci);
                            absorbed.insert(i);
                        }
                    }
                }
                _ => {}
            }
        }
        // Absorbed in pairs: a create with the unlink that undoes it.
        debug_assert!(absorbed.len().is_multiple_of(2), "absorbed in create/unlink pairs");
        let mut out = DirOps { taken: Vec::new(), ops: Vec::new(), creates_m: false, before: Vec::new() };
        for (i, op) in ops.into_iter().enumerate() {
            // Journaled now so no other flush writes it too; still counted as pending until it
            // is written, so an fsync that depends on it finds the directory, collects after us
            // and waits for our ticket before it counts as durable.
            op.journaled.store(true, Ordering::Release);
            out.taken.push(op.clone());
            if absorbed.contains(&i) {
                continue;
            }
            if matches!(&op.record, Record::Create { ino, .. } if *ino == m_ino) {
                out.creates_m = true;
            }
            out.ops.push(op);
        }
        Ok(out)
    }

    /// Allocates and writes data blocks and the journal transaction. With region journals the
    /// transaction is durable on return (`flush/nvm.rs`), else the caller owes a device flush;
    /// a transaction the region has no room for is given back (as on an error) for a checkpoint.
    /// `inline` (region journals only): the pages go into the transaction as `Data` records,
    /// and no data block is written.
    fn write_txn(
        &self,
        m: &Arc<MNode>,
        lane: u32,
        stamp: crate::journal::Stamp,
        dir_ops: &DirOps,
        pages: &[(u64, PageBuf)],
        inline: bool,
    ) -> Result<Commit> {
        debug_assert!(!inline || self.disk.nvm_log.is_some());
        let mtime = self.disk.elapsed_secs();
        let mut parts = self.place_pages(m, lane, pages, inline, mtime)?;
        parts.records = dir_ops.ops.iter().map(|o| o.record.clone()).collect();
        self.take_inode_records(m, stamp, pages, inline, &mut parts)?;
        let TxnParts { writes, map, records, undo } = parts;
        if records.is_empty() {
            // Without a region, a flush still covers what an fsync this one depends on wrote
            // (it marked the records journaled; the caller waits for its ticket first); with
            // one, that fsync makes them durable before it resolves its ticket.
            return Ok(if self.disk.nvm_log.is_some() { Commit::Durable } else { Commit::FlushOwed });
        }
        let txn = Transaction::new(records);
        let r = self.commit_txn(lane, &txn, &writes, dir_ops, mtime);
        if !matches!(r, Ok(Commit::Durable | Commit::FlushOwed | Commit::FlushFailed(_))) {
            // Give back what this transaction took, so a later fsync journals it again.
            self.restore_inode(m, undo, &map);
        }
        r
    }

    /// Places the pages (unless `inline`) in new blocks of the lane's log: the writes to make
    /// and the mapping they give, with each block's checksum.
    fn place_pages(
        &self,
        m: &MNode,
        lane: u32,
        pages: &[(u64, PageBuf)],
        inline: bool,
        mtime: u64,
    ) -> Result<TxnParts> {
        // The pages themselves (shared, copy-on-write), not copies: a writer that comes
        // meanwhile copies the page instead.
        let mut writes: Vec<(u64, PageBuf)> = Vec::with_capacity(pages.len());
        let mut map: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
        for (idx, buf) in pages.iter().filter(|_| !inline) {
            let owner = SummaryEntry { kind: SummaryKind::Data, nid: m.ino, ofs: *idx as u32 };
            let addr = self
                .disk
                .lanes
                .alloc_young(lane, crate::format::LogType::WarmData, owner, mtime)
                .map_err(nospace)?;
            map.insert(*idx, (addr as u32, crc32c::crc32c(&buf[..])));
            writes.push((addr, buf.clone()));
        }
        debug_assert_eq!(
            writes.len(),
            if inline { 0 } else { pages.len() },
            "a block per page unless inline"
        );
        debug_assert_eq!(map.len(), writes.len(), "each placed page mapped once");
        Ok(TxnParts { writes, map, records: Vec::new(), undo: Undo::default() })
    }

    /// Under the inode's mapping lock: maps the placed blocks (dropping those of pages
    /// truncated meanwhile), lets go of blocks no mapping holds, and adds the inode's own
    /// records (a checkpoint's bridge, truncation, attributes, xattrs, block maps, inline
    /// pages), noting in `parts.undo` what they took.
    fn take_inode_records(
        &self,
        m: &MNode,
        stamp: crate::journal::Stamp,
        pages: &[(u64, PageBuf)],
        inline: bool,
        parts: &mut TxnParts,
    ) -> Result<()> {
        let mut disk = m.disk.lock();
        let pm = m.pages().map(|(p, _)| p);
        let mut gone = Vec::new();
        for (&idx, &(addr, _)) in &parts.map {
            // The page stays in flight (cached, not evictable) until its block is written:
            // a reader that missed the cache would read the new address too early.
            if pm.is_some_and(|p| p.is_cached(idx)) {
                disk.remap(idx, addr);
            } else {
                gone.push((idx, addr));
            }
        }
        for (idx, addr) in gone {
            // Truncated while in flight: neither mapped nor journaled.
            parts.map.remove(&idx);
            parts.writes.retain(|w| w.0 != addr as u64);
            self.disk.table.invalidate(addr as u64)?;
        }
        // Blocks that left the mapping and are in no checkpoint: dead now. (Young, if a
        // checkpoint is being written: `enter_flush`.)
        for a in std::mem::take(&mut disk.garbage) {
            self.disk.table.invalidate(a as u64)?;
        }
        // A checkpoint in progress captured m and installed it (`enter_flush`): what it
        // took that no journal holds goes first, under its own stamp, for recovery from
        // the previous checkpoint should this one never land. Stale once it is durable.
        let durable = self.ckpt.cp.lock().durable;
        if disk.bridge.as_ref().is_some_and(|b| b.seq <= durable) {
            disk.bridge = None;
        }
        if let Some(b) = disk.bridge.as_mut().filter(|b| !b.journaled) {
            parts.records.extend(b.records(m.ino));
            b.journaled = true;
            parts.undo.bridge = Some(b.seq);
            self.disk.io.cp_bridges.add(1);
        }
        let mut own_map = std::mem::take(&mut disk.unjournaled);
        parts.undo.unjournaled = own_map.clone();
        own_map.extend(parts.map.iter().map(|(&i, &v)| (i, v)));
        if let Some(from) = disk.truncated_from.take() {
            parts.undo.truncated_from = Some(from);
            parts.records.push(Record::Truncate { stamp, ino: m.ino, from_block: from });
        }
        // Inline pages still cached (checked under the mapping's lock, as for blocks): a
        // page truncated since is neither logged nor mapped.
        let logged: Vec<Record> = pages
            .iter()
            .filter(|(idx, _)| inline && pm.is_some_and(|p| p.is_cached(*idx)))
            .map(|(idx, buf)| Record::Data { stamp, ino: m.ino, idx: *idx, data: buf.clone() })
            .collect();
        let mut meta = m.meta.lock();
        parts.undo.attr_dirty = m.attr_dirty.swap(false, Ordering::AcqRel);
        // Attributes unchanged since they were last journaled or checkpointed need no record
        // (an fsync with nothing to do writes nothing); a file's blocks go with its size.
        if parts.undo.attr_dirty || !own_map.is_empty() || !logged.is_empty() {
            parts.records.push(Record::SetAttr { stamp, ino: m.ino, attr: m.attr_record(&meta) });
        }
        // Each xattr changed since it was last journaled, as it is now: what changed, not
        // the whole set (which may hold megabytes).
        parts.undo.xattr_names = std::mem::take(&mut meta.xattrs.unjournaled);
        for name in &parts.undo.xattr_names {
            parts.records.push(match meta.xattrs.set.get(name) {
                Some(v) => Record::SetXattr { stamp, ino: m.ino, name: name.clone(), value: v.to_vec() },
                None => Record::RemoveXattr { stamp, ino: m.ino, name: name.clone() },
            });
        }
        drop(meta);
        parts.records.extend(Record::map_runs(m.ino, stamp, &own_map));
        // After the maps: same stamp, and replay applies a transaction's records in order,
        // so a page logged inline wins over an older block writeback placed at its index.
        parts.records.extend(logged);
        Ok(())
    }

    /// Commits `txn` with its data `writes`: to the lane's journal in the region when there is
    /// one, else appended to the lane's device journal chain and written in one batch.
    fn commit_txn(
        &self,
        lane: u32,
        txn: &Transaction,
        writes: &[(u64, PageBuf)],
        dir_ops: &DirOps,
        mtime: u64,
    ) -> Result<Commit> {
        // A region commit is durable at once: not before the transactions ours may depend
        // on (the ones that collected from our directories first) are. Not written: given
        // back, for the checkpoint the caller takes.
        if self.disk.nvm_log.is_some() && !dir_ops.before.iter().all(|t| t.wait()) {
            return Ok(Commit::Checkpoint);
        }
        match self.commit_to_region(lane, txn, writes)? {
            RegionCommit::Committed => return Ok(Commit::Durable),
            RegionCommit::Full => return Ok(Commit::Checkpoint),
            RegionCommit::NoRegion => {}
        }
        // Cooperative commit (`disk/commit.rs`): a place in the queue is reserved before the
        // chain lock, whose holder must never wait for one (a failed batch's submitter takes
        // the chain lock to rewind it).
        let slot = self.commits_together().then(|| self.disk.commit_slot());
        let mut chain = self.disk.chains[lane as usize].lock();
        // A failed write must not leave a hole in the chain that hides later transactions:
        // on error the writer goes back to where it was (the next append overwrites).
        let before = chain.clone();
        let durable = self.disk.chain_marks[lane as usize].durable();
        let blocks = match chain.append_flushed(txn, durable, || {
            let owner = SummaryEntry { kind: SummaryKind::Journal, nid: lane, ofs: 0 };
            self.disk.lanes.reserve(lane, JOURNAL_LOG, owner, mtime).map(|a| a as u32)
        }) {
            Ok(b) => b,
            // The journal has no room left on the device: like a full region journal, the
            // checkpoint the caller takes makes the changes durable and frees the journal.
            Err(Error::NoSpace) => {
                *chain = before;
                return Ok(Commit::Checkpoint);
            }
            Err(e) => return Err(e),
        };
        self.ckpt.requests.count_journal(blocks.len() as u64);
        if let Some(slot) = slot {
            // Pushed under the chain lock: queue order is chain order, and batches run in
            // queue order, so within a lane journal blocks still complete in chain order.
            let part = ChainPart { lane, end: chain.position().1, before };
            let writes = writes
                .iter()
                .map(|(a, p)| (*a, BlockBytes::Page(p.clone())))
                .chain(blocks.into_iter().map(|(a, d)| (a, BlockBytes::Owned(d))))
                .collect();
            let pending = slot.push(CommitReq { writes, chain: Some(part) });
            drop(chain);
            // Written and flushed with everyone queued meanwhile, by whichever of us found no
            // batch in flight; a failed write has put the chain back (`Disk::rewind`).
            return match self.disk.commit_wait(pending) {
                Ok(()) => Ok(Commit::Durable),
                Err(CommitError::Write(e)) => Err(unshare(e)),
                Err(CommitError::Flush(e)) => Ok(Commit::FlushFailed(unshare(e))),
            };
        }
        // Within a lane, journal blocks complete in chain order: the chain lock is held
        // until the batch (data and journal blocks together) is written.
        let reqs: Vec<_> =
            page_reqs(writes).chain(blocks.iter().map(|(a, d)| WriteReq { addr: *a, data: d })).collect();
        if let Err(e) = self.disk.write_reqs(&reqs, WriteKind::Journal) {
            *chain = before;
            return Err(e);
        }
        self.disk.chain_marks[lane as usize].wrote(chain.position().1);
        Ok(Commit::FlushOwed)
    }

    /// Gives back what a transaction not written took from the inode, so that a later fsync
    /// journals it again. (The pages are put back dirty by the caller; their new blocks were
    /// never good.)
    fn restore_inode(&self, m: &MNode, mut undo: Undo, map: &BTreeMap<u64, (u32, u32)>) {
        // Give back what this transaction took, so a later fsync journals it again. (The
        // pages are put back dirty by the caller; their new blocks were never good.)
        let mut disk = m.disk.lock();
        for (idx, v) in undo.unjournaled {
            if !map.contains_key(&idx) {
                disk.unjournaled.entry(idx).or_insert(v);
            }
        }
        if let Some(from) = undo.truncated_from {
            disk.truncated_from = Some(disk.truncated_from.map_or(from, |t| t.min(from)));
        }
        if let (Some(seq), Some(b)) = (undo.bridge, disk.bridge.as_mut()) {
            if b.seq == seq {
                b.journaled = false;
            }
        }
        drop(disk);
        if undo.attr_dirty {
            m.attr_dirty.store(true, Ordering::Release);
        }
        if !undo.xattr_names.is_empty() {
            m.meta.lock().xattrs.unjournaled.append(&mut undo.xattr_names);
        }
    }
}

/// The flush locks of `dirs` (ascending inode order, as `Engine::dir_closure` lists them: the
/// order their rank allows), each holding its directory's last ticket.
fn flush_locks(dirs: &[Arc<MNode>]) -> Vec<MutexGuard<'_, Option<Arc<Ticket>>>> {
    debug_assert!(dirs.windows(2).all(|w| w[0].ino < w[1].ino));
    dirs.iter().map(|d| d.dir().expect("dir").flush_lock.lock()).collect()
}

/// What became of an fsync's transaction.
enum Commit {
    /// Durable already (committed to the region's lane journal).
    Durable,
    /// Written to the device journal; durable after the caller's device flush.
    FlushOwed,
    /// Written by cooperative commit, whose flush then failed.
    FlushFailed(Error),
    /// Not written (no room in the region's lane journal), everything given back: a
    /// checkpoint must make it durable.
    Checkpoint,
}

/// A transaction being put together for one inode (`Engine::write_txn`).
struct TxnParts {
    /// The data blocks to write with it: (address, page).
    writes: Vec<(u64, PageBuf)>,
    /// The blocks placed for its pages: index -> (address, checksum).
    map: BTreeMap<u64, (u32, u32)>,
    records: Vec<Record>,
    undo: Undo,
}

/// What a transaction took from its inode, given back if it fails.
#[derive(Default)]
struct Undo {
    unjournaled: BTreeMap<u64, (u32, u32)>,
    truncated_from: Option<u64>,
    attr_dirty: bool,
    xattr_names: BTreeSet<Vec<u8>>,
    /// The checkpoint whose bridge this transaction journaled.
    bridge: Option<u64>,
}

/// Whether `r` involves inode `ino`, as the inode it names or as a directory it changes (then a
/// create and removal of `ino` around it cannot be absorbed: replay needs the directory).
fn mentions(r: &Record, ino: u32) -> bool {
    match r {
        Record::Create { ino: i, dir, .. }
        | Record::Link { ino: i, dir, .. }
        | Record::Unlink { ino: i, dir, .. } => *i == ino || *dir == ino,
        Record::Rename { ino: i, replaced, src_dir, dst_dir, whiteout, .. } => {
            *i == ino
                || *replaced == ino
                || *src_dir == ino
                || *dst_dir == ino
                || whiteout.is_some_and(|w| w.ino == ino)
        }
        _ => false,
    }
}

/// The device writes of pages placed at blocks: (address, page) pairs.
fn page_reqs(pages: &[(u64, crate::mem::pages::PageBuf)]) -> impl Iterator<Item = WriteReq<'_>> {
    pages.iter().map(|(a, d)| WriteReq { addr: *a, data: &d[..] })
}

fn nospace(e: Error) -> Error {
    match e {
        Error::NoSpace => Error::errno(libc::ENOSPC, "no free segments"),
        e => e,
    }
}
