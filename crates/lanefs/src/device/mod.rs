//! Block I/O: the bottom layer.
//!
//! A [`BlockDevice`] reads and writes whole 4 KiB blocks of an image file or a block device.
//! Writes and reads come in batches of discontiguous blocks at discontiguous addresses so that a
//! commit or a checkpoint becomes one submission (scatter-gather I/O, ARCHITECTURE.md). Nothing is
//! durable until [`BlockDevice::flush`] returns.
//!
//! Invariants every back end keeps: every request is a whole number of blocks inside
//! `0..block_count()`, and the whole batch is checked before any byte moves (a bad request is
//! `InvalidInput`, never a panic and never half a batch); no two writes of one batch overlap, so
//! the result does not depend on completion order; a batch returns only when every request in it
//! has completed (or the first error is known and nothing is still in flight); `flush` covers
//! every write that completed before it was called.
//!
//! Back ends: [`FileDevice`] (io_uring + O_DIRECT where direct I/O is real, vectored
//! `pwritev`/`preadv` otherwise) and [`MemDevice`] (RAM, tests); [`HaltDevice`] stops every
//! write at a shutdown ([`halt`]). The crash-recording device is the `lanefs-crashtest` crate's,
//! which takes its sequence numbers from an [`EventClock`] it may share with a region.
//! This module's `unsafe` code lives only in `uring.rs` and `aligned.rs` (the crate's other
//! `unsafe` modules: see `pmem/persist.rs`).

use std::io;
use std::path::Path;
use std::sync::Arc;

mod aligned;
mod event_clock;
mod file;
pub mod halt;
mod mem;
pub(crate) mod plan;
mod uring;

pub use aligned::{is_direct_aligned, AlignedBuf, DIRECT_ALIGN};
pub use event_clock::EventClock;
pub use file::{create_image, DeviceOptions, FileDevice, IoChoice};
pub(crate) use file::{fs_name, TMPFS_MAGIC};
pub use halt::{Halt, HaltDevice};
pub use mem::MemDevice;

/// Opens an image file or block device as a shareable [`BlockDevice`] (see [`FileDevice::open`]).
pub fn open(path: impl AsRef<Path>, opts: DeviceOptions) -> io::Result<Arc<dyn BlockDevice>> {
    Ok(Arc::new(FileDevice::open(path, opts)?))
}

/// Block size of every device and of the format: 4 KiB.
pub const BLOCK_SIZE: usize = 4096;

/// One block's bytes, on a cache line of their own: what a cached page, a journal's data
/// record and a commit's page block hold (behind an `Arc`). The alignment is for the copies in
/// and out of them: glibc's `memcpy` moves 4 KiB with `rep movsb`, which runs several times
/// slower when the source is aligned and the destination is not (AMD Zen before glibc 2.40,
/// BZ 30994; DWOL at 0.1x with mimalloc's page-aligned buffers in session 18). A bare
/// `Arc<[u8; BLOCK_SIZE]>` puts the bytes 16 bytes after its counts, so every copy from a
/// caller's page-aligned buffer into the cache was that case.
#[derive(Clone, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct BlockData(pub [u8; BLOCK_SIZE]);

impl std::ops::Deref for BlockData {
    type Target = [u8; BLOCK_SIZE];
    fn deref(&self) -> &[u8; BLOCK_SIZE] {
        &self.0
    }
}

impl std::ops::DerefMut for BlockData {
    fn deref_mut(&mut self) -> &mut [u8; BLOCK_SIZE] {
        &mut self.0
    }
}

impl std::fmt::Debug for BlockData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockData({BLOCK_SIZE} bytes)")
    }
}

/// Which I/O path a device uses; reported by `lanefs inspect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// io_uring: one submission per batch; with O_DIRECT unless the device's `describe` says
    /// "buffered" (forced on a file system where direct I/O is not real).
    Uring,
    /// Buffered (or O_DIRECT) vectored pwritev/preadv, one call per contiguous run.
    Sync,
    /// Memory only (tests).
    Memory,
}

impl std::fmt::Display for IoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoMode::Uring => "io_uring+O_DIRECT",
            IoMode::Sync => "sync-vectored",
            IoMode::Memory => "memory",
        })
    }
}

/// One write of `data.len() / BLOCK_SIZE` blocks starting at block `addr`.
#[derive(Debug, Clone, Copy)]
pub struct WriteReq<'a> {
    /// Block address on the device.
    pub addr: u64,
    /// One block's bytes (`BLOCK_SIZE`).
    pub data: &'a [u8],
}

/// One read of `buf.len() / BLOCK_SIZE` blocks starting at block `addr`.
#[derive(Debug)]
pub struct ReadReq<'a> {
    /// Block address on the device.
    pub addr: u64,
    /// Where the block's bytes go (`BLOCK_SIZE`).
    pub buf: &'a mut [u8],
}

/// A device of fixed size made of 4 KiB blocks.
pub trait BlockDevice: Send + Sync {
    /// Number of blocks on the device.
    fn block_count(&self) -> u64;
    /// Reads every request of the batch. Buffers need no particular alignment.
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> std::io::Result<()>;
    /// Writes every request of the batch. Completion is not durability: see `flush`.
    /// Requests must not overlap one another (`InvalidInput` otherwise).
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> std::io::Result<()>;
    /// Makes every completed write durable (fdatasync or a cache flush).
    fn flush(&self) -> std::io::Result<()>;
    /// The I/O path in use.
    fn io_mode(&self) -> IoMode;
    /// Tells the device that the blocks no longer hold data (TRIM). Optional; their contents
    /// are unspecified afterwards.
    fn discard(&self, _addr: u64, _blocks: u64) -> std::io::Result<()> {
        Ok(())
    }
    /// One line on the I/O path, for `lanefs inspect`.
    fn describe(&self) -> String {
        self.io_mode().to_string()
    }
    /// Whether `flush` costs next to nothing because the device is memory (an image in tmpfs,
    /// a `MemDevice`): a policy that writes more to flush less does not pay there.
    fn flush_is_free(&self) -> bool {
        false
    }

    /// Reads one block at `addr`: a batch of one.
    fn read_block(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.read_batch(&mut [ReadReq { addr, buf }])
    }
    /// Writes one block at `addr`: a batch of one (not durable before [`BlockDevice::flush`]).
    fn write_block(&self, addr: u64, data: &[u8]) -> std::io::Result<()> {
        self.write_batch(&[WriteReq { addr, data }])
    }
}

/// Forwards every method of `BlockDevice` through a smart pointer.
macro_rules! forward_block_device {
    ($ptr:ident) => {
        impl<T: BlockDevice + ?Sized> BlockDevice for $ptr<T> {
            fn block_count(&self) -> u64 {
                (**self).block_count()
            }
            fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> std::io::Result<()> {
                (**self).read_batch(reqs)
            }
            fn write_batch(&self, reqs: &[WriteReq<'_>]) -> std::io::Result<()> {
                (**self).write_batch(reqs)
            }
            fn flush(&self) -> std::io::Result<()> {
                (**self).flush()
            }
            fn io_mode(&self) -> IoMode {
                (**self).io_mode()
            }
            fn discard(&self, addr: u64, blocks: u64) -> std::io::Result<()> {
                (**self).discard(addr, blocks)
            }
            fn describe(&self) -> String {
                (**self).describe()
            }
            fn flush_is_free(&self) -> bool {
                (**self).flush_is_free()
            }
        }
    };
}

// Lets a shared device (`Arc<dyn BlockDevice>` from [`open`]) be wrapped, e.g. by
// lanefs-crashtest's `CrashDevice`.
forward_block_device!(Arc);
forward_block_device!(Box);

#[cfg(test)]
mod tests {
    use super::{BlockData, BLOCK_SIZE};
    use std::sync::Arc;

    /// The bytes of a shared block start on a cache line, whatever the allocator: the copies
    /// into and out of the page cache depend on it (`BlockData`).
    #[test]
    fn shared_block_bytes_are_cache_line_aligned() {
        let blocks: Vec<Arc<BlockData>> =
            (0..64).map(|i| Arc::new(BlockData([i as u8; BLOCK_SIZE]))).collect();
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(b.as_ptr() as usize % 64, 0, "block {i} at {:p}", b.as_ptr());
            assert_eq!(b[BLOCK_SIZE - 1], i as u8);
        }
        let mut c = (*blocks[3]).clone();
        c[0] = 9;
        assert_eq!((c[0], blocks[3][0]), (9, 3), "a clone is a copy");
    }
}
