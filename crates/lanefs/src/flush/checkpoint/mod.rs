//! Taking a checkpoint.
//!
//! 0. Files with many dirty or logged pages write them back first, the gate shared (fsyncs
//!    go on; `flush/writeback.rs`), so that the snapshot takes only what changed since.
//! 1. Take the gate exclusively: in-flight fsyncs and writebacks finish, new ones wait.
//! 2. Exclusive phase of the pass-through semaphore (every operation drained): stamp the
//!    checkpoint, open its epoch in the segment table, swap out the dirty sets and dead lists
//!    whole, open the install queue, and move the epoch on (`Memfs::epoch`): every inode of the
//!    swapped sets is now owed to this checkpoint. No I/O happens here, and no work per inode
//!    (dead or alive), directory record or touched name; namespace and data operations resume
//!    right after. What the phase did is counted (`ExclusiveWork`). Then the gate is released:
//!    fsync and writeback run beside the rest.
//!    Each owed inode is then captured once, by whoever touches it first (`snapshot.rs`,
//!    `Engine::capture_if_owed`): an operation, fsync or writeback before it changes it, or this
//!    checkpoint's writer, which captures the rest in inode order — attributes, dirty pages
//!    (shared, copy-on-write), current mapping (shared, `mem::cowmap`), and for a directory its
//!    logs (set aside whole, still offered to fsyncs: `DirLog::hold_all`) and touched-name sets
//!    (swapped out whole, `mem::dir`). Nothing changes an owed inode before its capture, so
//!    the captures are the instant of the phase.
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

//!
//! Where each step lives: this file takes a checkpoint (steps 1 and 4, and step 3's commit);
//! `snapshot.rs` is the exclusive phase (step 2); `installs.rs` the install queue and
//! `install.rs` the installs themselves (step 3); `pauses.rs` what the phases cost the
//! foreground; `background.rs` the thread that takes checkpoints on a timer and cleans;
//! `state.rs` the checkpointer's state ([`Checkpointer`]) and the requests for one.

mod background;
mod install;
mod installs;
mod pauses;
mod snapshot;
mod state;
#[cfg(test)]
mod tests;

pub(crate) use background::Background;
pub(crate) use installs::Installs;
pub use pauses::{CpPauses, ExclusiveWork};
pub(crate) use state::{Checkpointer, CpRequests, CpState};

use crate::checkpoint::{commit, CommitSet};
use crate::disk::WriteKind;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::checkpoint::{LaneCheckpoint, CP_FLAG_CLEAN};
use crate::format::SegNo;
use crate::mem::mnode::MNode;
use crate::node::NodeWriter;
use crate::sync::Rank;
use installs::WriterArgs;
use snapshot::Snapshot;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Engine {
    /// Takes a checkpoint now. `clean` marks an unmount.
    pub fn checkpoint(&self, clean: bool) -> Result<()> {
        self.checkpoint_between(clean, || {})
    }

    /// [`Engine::checkpoint`], running `between` right after the exclusive phase and the
    /// gate's release, before the writer captures what is still owed: where the foreground
    /// meets owed inodes (the tests put their operations there).
    fn checkpoint_between(&self, clean: bool, between: impl FnOnce()) -> Result<()> {
        if self.opts.read_only {
            return Ok(());
        }
        // The gate and the semaphore are taken below; a thread holding either would wait for
        // itself (an operation or an fsync must ask for a checkpoint, not take one).
        debug_assert!(
            ![Rank::Gate, Rank::PassSem].iter().any(|r| crate::sync::rank::held().contains(r)),
            "a checkpoint is taken holding no gate and no operation"
        );
        let _one = self.ckpt.cp_serial.lock();
        self.check_writable()?;
        self.write_back_early();
        let gate_asked = std::time::Instant::now();
        let gate = self.ckpt.gate.write();
        let (mut snap, args) = {
            let asked = std::time::Instant::now();
            let exclusive = self.mem.pass.exclusive();
            #[allow(unused_mut)]
            let mut snap = self.snapshot(&gate, &exclusive, clean);
            // Open before the phase ends: the first operation to touch an owed inode captures
            // it into the queue, and an fsync or writeback of a captured file that finds it
            // unclaimed installs it itself instead of waiting (`Engine::help_install`).
            let args = self.writer_args(&snap);
            {
                let mut cp = self.ckpt.cp.lock();
                cp.installs.open(snap.seq, args);
                #[cfg(debug_assertions)]
                {
                    cp.installs.seen = std::mem::take(&mut snap.seen);
                }
            }
            // Last in the phase: from here on a change joins the next checkpoint's dirty set,
            // and an inode still in this one's is owed to it, to be captured before any change
            // into the queue just opened. A thread that holds neither the semaphore nor the
            // gate (an fsync looking its inode up) may capture from this store on, while the
            // phase has nothing left to do.
            self.mem.epoch.store(snap.seq + 1, Ordering::Release);
            // Timed to the release, not past it: the release wakes the operations that waited,
            // and one woken on this CPU may run before this thread does again (5-8 ms on two
            // cores with two workers), a time in which operations run.
            let held = asked.elapsed();
            drop(exclusive);
            self.ckpt.cp_pauses.exclusive(held);
            (snap, args)
        };
        {
            // One checkpoint at a time (`cp_serial`): this one is the last started, and every
            // earlier one is durable and settled.
            let cp = self.ckpt.cp.lock();
            debug_assert_eq!(snap.seq, cp.started, "the snapshot is the checkpoint just started");
            debug_assert_eq!(cp.durable + 1, snap.seq, "the one before is durable");
            debug_assert!(cp.settled <= cp.durable, "settled only once durable");
        }
        // fsync and writeback go on beside the write phase: they touch no inode the snapshot
        // captured before its install (`Engine::enter_flush`), and capture an owed one first;
        // their blocks are young (out of this checkpoint's SIT) and the segments they write to
        // outlive it (`SegmentTable::open_epoch`). Timed to the release, as the exclusive phase
        // is.
        let held = gate_asked.elapsed();
        drop(gate);
        self.ckpt.cp_pauses.write_phase(held);
        between();
        // Whatever the foreground has not captured yet, then what needs every capture done.
        self.capture_rest(&mut snap);
        self.settle_snapshot(&mut snap);
        let seq = snap.seq;
        let held = std::mem::take(&mut snap.held_dirs);
        let r = self.write_snapshot(snap, args, clean);
        let deleted = match r {
            Ok(deleted) => deleted,
            Err(e) => {
                self.ckpt.stop_with_failure(e.to_string());
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
        self.disk.table.checkpoint_done(|segs| self.discard_segments(segs));
        {
            let mut cp = self.ckpt.cp.lock();
            debug_assert_eq!(cp.durable, seq, "settled once durable, and no later one started meanwhile");
            debug_assert!(cp.settled < seq, "settled moves forward");
            cp.settled = seq;
        }
        self.ckpt.cp_done.notify_all();
        Ok(())
    }

    /// How this checkpoint writes nodes and data (its lane, CPU slot, version and segment
    /// time) and the bridge it leaves: the same for its writer and its helpers.
    fn writer_args(&self, snap: &Snapshot) -> WriterArgs {
        let (_, cpu) = self.disk.lane();
        let args = WriterArgs {
            lane: self.checkpoint_lane(),
            cpu,
            cp_ver: self.ckpt.cp.lock().cp.version + 1,
            mtime: self.disk.elapsed_secs(),
            bridge: (snap.seq, snap.full_stamp),
        };
        debug_assert!(args.lane < self.disk.lanes.lane_count(), "lane {} exists", args.lane);
        debug_assert_eq!(args.bridge.1.ticks, snap.stamp, "bridges carry the checkpoint's stamp");
        args
    }

    fn node_writer(&self, a: &WriterArgs) -> NodeWriter<'_> {
        NodeWriter {
            g: &self.disk.g,
            nat: &self.disk.nat,
            lanes: &self.disk.lanes,
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
        let snap_stamp = self.ckpt.cp.lock().snap_stamp;
        for d in dirs {
            // The snapshot holds the logs of directories only (`Engine::capture`).
            let Some(dir) = d.dir() else {
                debug_assert!(false, "inode {} held as a directory is not one", d.ino);
                continue;
            };
            for op in dir.log.release_held().iter().flatten() {
                debug_assert!(op.record.stamp().ticks <= snap_stamp, "held records are the snapshot's");
                if !op.journaled.swap(true, Ordering::AcqRel) {
                    self.count_pending(&op.record, -1);
                }
            }
        }
    }

    /// Writes the snapshot and commits it; returns the inodes it deleted, for the caller to
    /// drop once the gate is released.
    fn write_snapshot(&self, snap: Snapshot, args: WriterArgs, clean: bool) -> Result<Vec<Arc<MNode>>> {
        let (cp_ver, mtime) = (args.cp_ver, args.mtime);
        debug_assert!(snap.owed.is_empty() && snap.owed_lazy.is_empty(), "every owed inode captured");
        debug_assert!(
            snap.deleted.windows(2).all(|p| p[0].ino < p[1].ino),
            "deleted inodes in inode order, once each (`settle_snapshot`)"
        );
        debug_assert_eq!(snap.heads.len(), self.disk.chains.len(), "a journal head per lane");
        let w = self.node_writer(&args);
        // Node and dentry blocks: no reader looks for them by a file's mapping, so they are
        // written in large batches after the data they name.
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        let installed = self.install_offered(&w, args.bridge, &mut writes);
        // Whatever happened, nothing stays offered, and no helper is still writing for this
        // checkpoint when it commits (or gives up).
        self.ckpt.cp.lock().installs.close();
        self.ckpt.wait_for_helpers();
        installed?;
        if let Some(why) = self.ckpt.cp.lock().installs.failed.take() {
            return Err(Error::errno(
                libc::EIO,
                format!("an install an fsync did for the checkpoint: {why}"),
            ));
        }
        for m in &snap.deleted {
            debug_assert!(m.dead.load(Ordering::Acquire), "inode {} is deleted only dead", m.ino);
            self.drop_deleted(&w, m)?;
            // Out of the cache before its id can be reused (`nat.checkpoint_done` below): a
            // create given the id must not find this mnode there. Nothing can reach it any
            // more: no name, not open.
            self.mem.cells.remove_if_same(m.ino as u64, m);
        }
        self.disk.write_all(&writes, WriteKind::Checkpoint)?;
        drop(writes);

        let nat = self.disk.nat.take_dirty_blocks();
        let taken = self.disk.table.take_checkpoint_sit();
        let sit: Vec<_> = taken.blocks.into_iter().map(|(_, b)| b).collect();
        // The cursors with the summaries of the segments they name, then the segments closed
        // until now: one an fsync closed meanwhile is written whole (its closed summary), not
        // as the open one read a moment before.
        let (cursors, active) = self.disk.lanes.active_cursors_and_summaries();
        let mut summaries = self.disk.lanes.take_closed_summaries();
        let closed: std::collections::HashSet<SegNo> = summaries.iter().map(|s| s.segno).collect();
        summaries.extend(active.into_iter().filter(|s| !closed.contains(&s.segno)));
        // NAT, SIT, summaries and the pack (whose size depends on lanes and orphans; one block
        // is close enough for the counters).
        let meta_blocks = (nat.len() + sit.len() + summaries.len() * 2 + 1) as u64;
        self.disk.io.count(WriteKind::Checkpoint, meta_blocks * crate::device::BLOCK_SIZE as u64);
        let cps = self.ckpt.cp.lock();
        debug_assert_eq!(cps.cp.version + 1, cp_ver, "checkpoints commit one at a time, in order");
        debug_assert!(snap.stamp >= cps.cp.stamp, "checkpoint stamps never go back");
        let mut cp = cps.cp.clone();
        cp.version = cp_ver;
        cp.flags = if clean { CP_FLAG_CLEAN } else { 0 };
        cp.stamp = snap.stamp;
        cp.reserved_blocks = snap.reserved;
        cp.valid_blocks = taken.valid;
        cp.valid_nodes = self.disk.nat.valid_nodes();
        cp.valid_inodes = self.disk.nat.valid_inodes();
        cp.next_nid = self.disk.nat.next_nid_hint();
        // Read after the snapshot: above the generation of every inode it holds.
        cp.next_generation = self.mem.generations.persist_value();
        cp.elapsed_secs = mtime;
        let [user, cleaning, other] = self.disk.io.take_unsaved();
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
        let nat = self.disk.stage_nat(&mut cp, nat)?;
        let written =
            commit(&*self.disk.dev, &self.disk.g, &mut cp, pack, &CommitSet { nat, sit, summaries })?;
        self.disk.apply_nat(cp.version)?;
        self.disk.nat.checkpoint_done();
        self.gc_checkpoint_done();
        let mut cps = self.ckpt.cp.lock();
        debug_assert_ne!(written, pack, "a commit writes the pack not in use");
        debug_assert_eq!(cps.durable + 1, snap.seq, "durable moves one checkpoint at a time");
        cps.cp = cp;
        cps.pack = written;
        cps.durable = snap.seq;
        drop(cps);
        self.ckpt.cp_done.notify_all();
        Ok(snap.deleted)
    }
}
