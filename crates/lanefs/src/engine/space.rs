//! Admission control: what an operation may dirty before the space runs out.
//!
//! Every block an operation dirties must fit, together with what the next checkpoint needs for
//! what is dirty already, in the space left outside the cleaner's reserve; an operation that
//! does not fit waits for a checkpoint and cleaning, then fails with ENOSPC. Operations that
//! free space may dip into the reserve, so a full file system can always be emptied.

use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

use super::Engine;

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
        self.engine.mem.claimed.fetch_sub(self.blocks, Ordering::AcqRel);
    }
}

impl Engine {
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
        let used = self.disk.table.valid_count() + self.mem.committed_blocks() + self.mem.promised_blocks();
        self.disk.g.user_blocks() as i64 - used as i64
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
        let margin = self.disk.g.main_blocks() / 16 + self.disk.g.open_blocks();
        if self.disk.available_blocks()
            > self.mem.committed_blocks() + short + self.mem.promised_blocks() + margin
        {
            return Ok(());
        }
        let long = long().min(short) as i64;
        let now_ok = || self.mem.committed_blocks() + short < self.disk.available_blocks();
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
            if self.disk.table.pending_segments() > 0 || self.mem.dirty_inodes.sum() > 0 {
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
                let _serial = self.ckpt.cp_serial.lock();
                self.space_left() < long && self.mem.dirty_inodes.sum() == 0
            };
            if full {
                why = "the space left is short with nothing dirty";
                break;
            }
            if now_ok() {
                // Only the space left is short, and only a checkpoint can change that.
                continue;
            }
            let want = (self.mem.committed_blocks() + short).saturating_sub(self.disk.available_blocks());
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
                self.disk.table.valid_count(),
                self.mem.committed_blocks(),
                self.mem.promised_blocks(),
                self.disk.g.user_blocks(),
                self.disk.table.free_segments(),
                self.disk.table.pending_segments(),
            ),
        ))
    }

    /// Claims `blocks` of space for reservations a fallocate is about to make (counted as
    /// promised until the returned claim is dropped, by when the reservations it makes count
    /// themselves), plus room for `nodes` node blocks the next checkpoint writes for them.
    /// ENOSPC, with nothing claimed, when they do not fit in the space left.
    pub(crate) fn claim(&self, blocks: u64, nodes: u64) -> Result<Claim<'_>> {
        let c = Claim { engine: self, blocks };
        self.mem.claimed.fetch_add(blocks, Ordering::AcqRel);
        // Nothing more for good: the claim is in the space left already.
        self.admit_with(nodes, || 0)?;
        Ok(c)
    }

    /// Admits an operation that frees space (unlink, rmdir, rename over a file) but needs a few
    /// metadata blocks first: it may use the reserve, so a full file system can be emptied.
    pub(crate) fn admit_freeing(&self, blocks: u64) -> Result<()> {
        let all = || self.disk.table.free_segments() * 512;
        if self.mem.committed_blocks() + blocks < all() {
            return Ok(());
        }
        self.wait_for_checkpoint()?;
        if self.mem.committed_blocks() + blocks < all() {
            return Ok(());
        }
        let want = (self.mem.committed_blocks() + blocks).saturating_sub(all());
        if self.clean_foreground(want)? && self.mem.committed_blocks() + blocks < all() {
            return Ok(());
        }
        Err(Error::errno(libc::ENOSPC, "file system full, even for metadata"))
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
