//! A device in RAM, for tests and the crash harness.
//!
//! The bytes live in fixed groups of blocks, each behind its own `RwLock`, so threads writing
//! different parts of the device do not contend on one lock (tests run lanes concurrently).

use std::io;

use crate::sync::rank::{Rank, RwLock};

use super::plan;
use super::{BlockDevice, IoMode, ReadReq, WriteReq, BLOCK_SIZE};

/// Blocks per lock group (1 MiB).
const GROUP_BLOCKS: u64 = 256;
const GROUP_BYTES: usize = GROUP_BLOCKS as usize * BLOCK_SIZE;

/// A RAM-backed [`BlockDevice`]. Writes are "durable" at once; `flush` only counts.
#[derive(Debug)]
pub struct MemDevice {
    groups: Vec<RwLock<Box<[u8]>>>,
    blocks: u64,
    flushes: std::sync::atomic::AtomicU64,
}

impl MemDevice {
    /// A zeroed device of `size_bytes`, rounded down to whole blocks like an image file.
    pub fn new(size_bytes: u64) -> MemDevice {
        let blocks = size_bytes / BLOCK_SIZE as u64;
        let mut groups = Vec::new();
        let mut left = blocks;
        while left > 0 {
            let n = left.min(GROUP_BLOCKS);
            groups.push(RwLock::new(Rank::Device, vec![0u8; n as usize * BLOCK_SIZE].into_boxed_slice()));
            left -= n;
        }
        MemDevice { groups, blocks, flushes: Default::default() }
    }

    /// A device holding `bytes`; a trailing partial block is dropped, as for an image file.
    pub fn from_bytes(bytes: Vec<u8>) -> MemDevice {
        let whole = bytes.len() - bytes.len() % BLOCK_SIZE;
        let groups = bytes[..whole]
            .chunks(GROUP_BYTES)
            .map(|c| RwLock::new(Rank::Device, c.to_vec().into_boxed_slice()))
            .collect();
        MemDevice { groups, blocks: (whole / BLOCK_SIZE) as u64, flushes: Default::default() }
    }

    /// A copy of the whole device. Taken group by group, so it is a consistent image only when
    /// no write runs concurrently.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.blocks as usize * BLOCK_SIZE);
        for g in &self.groups {
            out.extend_from_slice(&g.read());
        }
        out
    }

    /// How many times `flush` was called.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Calls `f(group, byte offset in group, byte offset in request, length)` for each piece of
    /// the byte range `[start, start + len)` that falls into one group.
    fn pieces(start: u64, len: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let mut done = 0usize;
        while done < len {
            let pos = start + done as u64;
            let g = (pos / GROUP_BYTES as u64) as usize;
            let in_g = (pos % GROUP_BYTES as u64) as usize;
            let n = (GROUP_BYTES - in_g).min(len - done);
            f(g, in_g, done, n);
            done += n;
        }
    }
}

impl BlockDevice for MemDevice {
    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        plan::check_reads(reqs, self.blocks)?;
        for r in reqs.iter_mut() {
            let buf = &mut *r.buf;
            Self::pieces(r.addr * BLOCK_SIZE as u64, buf.len(), |g, at, off, n| {
                if let Some(group) = self.groups.get(g) {
                    buf[off..off + n].copy_from_slice(&group.read()[at..at + n]);
                }
            });
        }
        Ok(())
    }

    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> io::Result<()> {
        plan::check_writes(reqs, self.blocks)?;
        for r in reqs {
            Self::pieces(r.addr * BLOCK_SIZE as u64, r.data.len(), |g, at, off, n| {
                if let Some(group) = self.groups.get(g) {
                    group.write()[at..at + n].copy_from_slice(&r.data[off..off + n]);
                }
            });
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn flush_is_free(&self) -> bool {
        true
    }

    fn io_mode(&self) -> IoMode {
        IoMode::Memory
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_across_groups_and_read_back() {
        let dev = MemDevice::new(600 * BLOCK_SIZE as u64 + 100);
        assert_eq!(dev.block_count(), 600);
        let data: Vec<u8> = (0..4 * BLOCK_SIZE).map(|i| (i % 251) as u8).collect();
        dev.write_batch(&[WriteReq { addr: 254, data: &data }]).unwrap();
        let mut back = vec![0u8; data.len()];
        dev.read_batch(&mut [ReadReq { addr: 254, buf: &mut back }]).unwrap();
        assert_eq!(back, data);
        let snap = dev.snapshot();
        assert_eq!(snap.len(), 600 * BLOCK_SIZE);
        assert_eq!(&snap[254 * BLOCK_SIZE..258 * BLOCK_SIZE], &data[..]);
        let again = MemDevice::from_bytes(snap.clone());
        assert_eq!(again.snapshot(), snap);
    }

    #[test]
    fn rejects_bad_requests() {
        let dev = MemDevice::new(8 * BLOCK_SIZE as u64);
        let b = vec![0u8; BLOCK_SIZE];
        assert!(dev.write_block(8, &b).is_err());
        assert!(dev.write_block(0, &b[..100]).is_err());
        let mut small = vec![0u8; 10];
        assert!(dev.read_block(0, &mut small).is_err());
        assert_eq!(MemDevice::from_bytes(vec![1; 5000]).block_count(), 1);
    }
}
