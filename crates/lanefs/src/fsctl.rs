//! Whole-file-system controls, as the kernel file systems' ioctls offer them: the label
//! (FS_IOC_GETFSLABEL / FS_IOC_SETFSLABEL) and batched discard of free space (FITRIM).
//! The shutdown (XFS_IOC_GOINGDOWN) is `device::halt` and `Fs::shutdown`.
//!
//! The label lives in both superblock copies, which nothing else rewrites after mkfs. A new
//! label is written to copy A, flushed, then to copy B, flushed: a crash at any point leaves
//! at least one valid copy, and mount takes A before B, so it sees the old label or the new.
//!
//! FITRIM discards free segments only. A segment is free once the checkpoint that no longer
//! references it is durable; segments emptied since (prefree, committing) and segments lanes
//! hold are never touched, because the next checkpoint or a recovery may still read them.
//! Each segment is out of the free map while it is discarded, so no lane can start writing
//! into it meanwhile.

use crate::checkpoint::read_superblock;
use crate::device::BLOCK_SIZE;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::layout::SegNo;
use crate::format::superblock::{LABEL_MAX, SB_ADDRS};
use crate::seg::DISCARD_PER_ROUND;

/// What a FITRIM asks for, in bytes of the device (`struct fstrim_range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrimRange {
    /// First byte of the range.
    pub start: u64,
    /// Bytes in the range (clipped to the device).
    pub len: u64,
    /// Free extents shorter than this are left alone.
    pub minlen: u64,
}

impl Engine {
    /// The label: the bytes of the superblock's label field up to the first NUL.
    pub(crate) fn label(&self) -> Result<Vec<u8>> {
        self.disk.check_live()?;
        let sb = read_superblock(&*self.disk.dev)?.sb;
        let end = sb.label.iter().position(|&c| c == 0).unwrap_or(sb.label.len());
        Ok(sb.label[..end].to_vec())
    }

    /// Sets the label: at most [`LABEL_MAX`] bytes, no NUL (EINVAL otherwise).
    pub(crate) fn set_label(&self, label: &[u8]) -> Result<()> {
        self.check_writable()?;
        if label.len() > LABEL_MAX {
            return Err(Error::errno(libc::EINVAL, format!("a label holds at most {LABEL_MAX} bytes")));
        }
        if label.contains(&0) {
            return Err(Error::errno(libc::EINVAL, "a label cannot hold a NUL byte"));
        }
        // One superblock writer at a time; checkpoints write other blocks, so sharing their
        // lock costs nothing that matters.
        let _one = self.ckpt.cp_serial.lock();
        let mut sb = read_superblock(&*self.disk.dev)?.sb;
        sb.label = [0; 32];
        sb.label[..label.len()].copy_from_slice(label);
        let bytes = sb.encode();
        for addr in SB_ADDRS {
            self.disk.dev.write_block(addr, &bytes)?;
            self.disk.dev.flush()?;
        }
        Ok(())
    }

    /// FITRIM: discards the free segments of `r` (but the cleaner's reserve of lowest ones,
    /// see `SegmentTable::free_runs`) and returns the bytes discarded. Arguments are checked
    /// as ext4 checks them: EINVAL for a range shorter than a block, a start past the end of
    /// the device, or a `minlen` longer than the main area. A read-only mount gives EROFS.
    pub(crate) fn trim(&self, r: TrimRange) -> Result<u64> {
        self.check_writable()?;
        let bs = BLOCK_SIZE as u64;
        let dev_bytes = self.disk.g.total_blocks * bs;
        if r.len < bs {
            return Err(Error::errno(libc::EINVAL, format!("trim range of {} bytes, under a block", r.len)));
        }
        if r.start >= dev_bytes {
            return Err(Error::errno(
                libc::EINVAL,
                format!("trim start {} past the device ({dev_bytes} bytes)", r.start),
            ));
        }
        if r.minlen > self.disk.g.main_blocks() * bs {
            return Err(Error::errno(
                libc::EINVAL,
                format!("trim minimum length {} over the main area", r.minlen),
            ));
        }
        let end = r.start.saturating_add(r.len).min(dev_bytes);
        // Whole blocks inside the range, then the part of the main area they cover.
        let main_end = self.disk.g.main_blkaddr + self.disk.g.main_blocks();
        let first = r.start.div_ceil(bs).max(self.disk.g.main_blkaddr);
        let last = (end / bs).min(main_end);
        if first >= last {
            return Ok(0);
        }
        // Both ends are main-area blocks (clamped to it above).
        let Some(((lo_seg, _), (hi_seg, _))) = self.disk.g.seg_of(first).zip(self.disk.g.seg_of(last - 1))
        else {
            return Ok(0);
        };
        let segs = lo_seg..hi_seg.next();
        let keep = self.disk.g.cleaning_reserve() as usize;
        let mut trimmed = 0u64;
        for run in self.disk.table.free_runs(segs, keep) {
            // The part of the run inside [first, last), in blocks.
            let lo = self.disk.g.seg_start(run.start).max(first);
            let hi = self.disk.g.seg_start(run.end).min(last);
            if (hi - lo) * bs < r.minlen.max(1) {
                continue;
            }
            // At most DISCARD_PER_ROUND segments out of the map at once.
            let mut at = run.start;
            while at < run.end {
                let chunk = at..SegNo(at.0 + DISCARD_PER_ROUND as u32).min(run.end);
                at = chunk.end;
                let taken = self.disk.table.take_for_trim(chunk, keep);
                let r = self.discard_taken(&taken, lo, hi);
                self.disk.table.return_trimmed(&taken);
                trimmed += r? * bs;
            }
        }
        debug_assert!(trimmed <= (last - first) * bs);
        Ok(trimmed)
    }

    /// Discards the blocks of the segments `taken` (ascending) that lie in `[lo, hi)`, one
    /// device call per run of consecutive segments; returns the blocks discarded.
    fn discard_taken(&self, taken: &[SegNo], lo: u64, hi: u64) -> Result<u64> {
        let mut blocks = 0;
        let mut i = 0;
        while i < taken.len() {
            let mut j = i + 1;
            while j < taken.len() && taken[j] == taken[j - 1].next() {
                j += 1;
            }
            let a = self.disk.g.seg_start(taken[i]).max(lo);
            let b = self.disk.g.seg_start(taken[j - 1].next()).min(hi);
            if a < b {
                self.disk.dev.discard(a, b - a)?;
                blocks += b - a;
            }
            i = j;
        }
        Ok(blocks)
    }
}
