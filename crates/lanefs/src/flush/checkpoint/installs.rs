//! The install queue of the checkpoint in progress (`Installs`): the inodes its snapshot
//! captured, offered to its writer and to the fsyncs and writebacks that would wait for one.
//!
//! Invariants: one checkpoint offers at a time (`open` asserts the queue is empty and no
//! helper is installing); each inode is added once, by its capture; each offered inode is
//! claimed at most once, by the writer
//! (`claim_batch`) or a helper (`claim`), so it is installed exactly once; a helper counts
//! itself in `helping` until its install is done (`Engine::help_install`), and the checkpoint
//! takes the NAT and the SIT only once none is left (`Checkpointer::wait_for_helpers`).

use super::snapshot::InodeSnap;
use crate::mem::mnode::MNode;
use std::sync::Arc;

/// Data blocks the checkpoint's writer claims at a time (`Installs::claim_batch`): what an
/// fsync of a file in the claimed batch may still wait for, so smaller than one device write
/// (`Disk::write_reqs`, 256 blocks); varmail's fsyncs waited on whole 256-block batches.
pub(super) const INSTALL_BATCH_BLOCKS: usize = 32;

/// A captured inode an fsync or writeback claimed from [`Installs`], to install it.
pub(crate) struct Claimed(pub(super) InodeSnap, pub(super) WriterArgs);

/// What a helper needs to write as the checkpoint would (`NodeWriter`, the bridge).
#[derive(Clone, Copy)]
pub(super) struct WriterArgs {
    pub(super) lane: u32,
    pub(super) cpu: usize,
    pub(super) cp_ver: u64,
    pub(super) mtime: u64,
    pub(super) bridge: (u64, crate::journal::Stamp),
}

/// The captured inodes of the checkpoint in progress that nobody has claimed for install yet
/// (`CpState::installs`, under the `cp` lock). They come in as they are captured
/// (`Engine::capture_if_owed`: by the checkpoint's writer, or by the first operation, fsync or
/// writeback to touch one after the snapshot). The checkpoint's writer claims them in order
/// (`claim_batch`) once it has captured every one; an fsync or writeback that would wait for
/// one of them claims it instead (`claim`) and installs it itself (`Engine::help_install`).
/// Each is installed exactly once.
#[derive(Default)]
pub(crate) struct Installs {
    /// The checkpoint offering them (0: none).
    seq: u64,
    args: Option<WriterArgs>,
    /// In the order they were captured; `None` once claimed.
    slots: Vec<Option<InodeSnap>>,
    /// The checkpoint's next slot to claim.
    next: usize,
    /// Slots that helpers may claim: regular files (bridged), by inode number.
    by_ino: std::collections::HashMap<u32, usize>,
    /// Inodes a capture found dead (no name, nothing holding them) that no one buried: this
    /// checkpoint deletes them.
    pub(super) found_dead: Vec<Arc<MNode>>,
    /// The directories whose logs this checkpoint holds (`DirLog::hold_all`).
    pub(super) held_dirs: Vec<Arc<MNode>>,
    /// Helpers installing now.
    pub(super) helping: usize,
    /// Why a helper's install failed (the checkpoint fails with it).
    pub(super) failed: Option<String>,
    /// Debug builds: each owed inode as the exclusive phase saw it, which its capture, taken
    /// later, must find unchanged (a change before the capture is a missed
    /// `Engine::capture_if_owed`).
    #[cfg(debug_assertions)]
    pub(super) seen: std::collections::HashMap<u32, super::snapshot::Fingerprint>,
}

impl Installs {
    /// Opens the queue for checkpoint `seq`, in its exclusive phase: captures may come from
    /// the moment the phase ends.
    pub(super) fn open(&mut self, seq: u64, args: WriterArgs) {
        assert!(self.slots.is_empty() && self.helping == 0, "one checkpoint at a time");
        debug_assert!(seq > 0 && self.seq == 0, "opened once, by a checkpoint");
        debug_assert!(self.found_dead.is_empty() && self.held_dirs.is_empty(), "taken by the last one");
        (self.seq, self.args, self.next, self.failed) = (seq, Some(args), 0, None);
    }

    /// Adds a captured inode; `helpable`: an fsync or writeback may claim it by number.
    pub(super) fn add(&mut self, s: InodeSnap, helpable: bool) {
        debug_assert!(self.seq != 0, "captures only while open");
        debug_assert_eq!(s.m.captured_by.load(std::sync::atomic::Ordering::Acquire), self.seq);
        if helpable {
            let old = self.by_ino.insert(s.m.ino, self.slots.len());
            // Each inode is captured once per checkpoint (`MNode::dirty_epoch`).
            debug_assert!(old.is_none(), "inode {} captured twice", s.m.ino);
        }
        self.slots.push(Some(s));
        debug_assert!(self.by_ino.len() <= self.slots.len(), "an inode offered once");
    }

    /// How many inodes this checkpoint offered (claimed or not): a bound on its claims.
    pub(super) fn offered(&self) -> usize {
        self.slots.len()
    }

    /// The next slots in order, skipping claimed ones, until their data reaches `blocks`.
    pub(super) fn claim_batch(&mut self, blocks: usize) -> Vec<InodeSnap> {
        debug_assert!(self.seq != 0 || self.slots.is_empty(), "claims only while offered");
        let mut out = Vec::new();
        let mut n = 0;
        while self.next < self.slots.len() && (out.is_empty() || n < blocks) {
            if let Some(s) = self.slots[self.next].take() {
                n += s.pages.len() + s.relocate.len() + 1;
                out.push(s);
            }
            self.next += 1;
        }
        debug_assert!(self.next <= self.slots.len());
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
        debug_assert_eq!(s.m.ino, ino, "the slot holds the inode asked for");
        self.helping += 1;
        debug_assert!(self.helping <= self.slots.len(), "a helper per claimed slot at most");
        Some(Claimed(s, self.args.expect("offered with its writer")))
    }

    /// Ends the offer (the checkpoint claimed or gave up the rest).
    pub(super) fn close(&mut self) {
        self.slots.clear();
        self.by_ino.clear();
        self.found_dead.clear();
        self.held_dirs.clear();
        #[cfg(debug_assertions)]
        self.seen.clear();
        (self.seq, self.args, self.next) = (0, None, 0);
    }
}
