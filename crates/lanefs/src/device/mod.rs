//! Block I/O: the bottom layer.
//!
//! A [`BlockDevice`] reads and writes whole 4 KiB blocks of an image file or a block device.
//! Writes and reads come in batches of discontiguous blocks at discontiguous addresses so that a
//! commit or a checkpoint becomes one submission (scatter-gather I/O, DESIGN.md). Nothing is
//! durable until [`BlockDevice::flush`] returns.
//!
//! Invariants every back end keeps: every request is a whole number of blocks inside
//! `0..block_count()`; a batch returns only when every request in it has completed (or the first
//! error is known); `flush` covers every write that completed before it was called.

pub const BLOCK_SIZE: usize = 4096;

/// Which I/O path a device uses; reported by `lanefs inspect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT and io_uring: one submission per batch.
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
    pub addr: u64,
    pub data: &'a [u8],
}

/// One read of `buf.len() / BLOCK_SIZE` blocks starting at block `addr`.
#[derive(Debug)]
pub struct ReadReq<'a> {
    pub addr: u64,
    pub buf: &'a mut [u8],
}

/// A device of fixed size made of 4 KiB blocks.
pub trait BlockDevice: Send + Sync {
    /// Number of blocks on the device.
    fn block_count(&self) -> u64;
    /// Reads every request of the batch. Buffers need no particular alignment.
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> std::io::Result<()>;
    /// Writes every request of the batch. Completion is not durability: see `flush`.
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> std::io::Result<()>;
    /// Makes every completed write durable (fdatasync or a cache flush).
    fn flush(&self) -> std::io::Result<()>;
    /// The I/O path in use.
    fn io_mode(&self) -> IoMode;
    /// Tells the device that the blocks no longer hold data (TRIM). Optional.
    fn discard(&self, _addr: u64, _blocks: u64) -> std::io::Result<()> {
        Ok(())
    }

    fn read_block(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.read_batch(&mut [ReadReq { addr, buf }])
    }
    fn write_block(&self, addr: u64, data: &[u8]) -> std::io::Result<()> {
        self.write_batch(&[WriteReq { addr, data }])
    }
}
