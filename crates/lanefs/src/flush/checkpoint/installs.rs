//! The install queue of the checkpoint in progress (`Installs`): the inodes its snapshot
//! captured, offered to its writer and to the fsyncs and writebacks that would wait for one.
//!
//! Invariants: one checkpoint offers at a time (`offer` asserts the queue is empty and no
//! helper is installing); each offered inode is claimed at most once, by the writer
//! (`claim_batch`) or a helper (`claim`), so it is installed exactly once; a helper counts
//! itself in `helping` until its install is done (`Engine::help_install`), and the checkpoint
//! takes the NAT and the SIT only once none is left (`Checkpointer::wait_for_helpers`).

use super::snapshot::InodeSnap;
use crate::mem::mnode::MNode;

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
    pub(super) helping: usize,
    /// Why a helper's install failed (the checkpoint fails with it).
    pub(super) failed: Option<String>,
}

impl Installs {
    pub(super) fn offer(
        &mut self,
        seq: u64,
        args: WriterArgs,
        inodes: Vec<InodeSnap>,
        helpable: impl Fn(&MNode) -> bool,
    ) {
        assert!(self.slots.is_empty() && self.helping == 0, "one checkpoint at a time");
        debug_assert!(seq > 0 && self.seq == 0, "offered once, by a checkpoint");
        self.by_ino =
            inodes.iter().enumerate().filter(|(_, s)| helpable(&s.m)).map(|(i, s)| (s.m.ino, i)).collect();
        self.slots = inodes.into_iter().map(Some).collect();
        (self.seq, self.args, self.next, self.failed) = (seq, Some(args), 0, None);
        // Helpers find an inode by number: each number names one slot.
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
        (self.seq, self.args, self.next) = (0, None, 0);
    }
}
