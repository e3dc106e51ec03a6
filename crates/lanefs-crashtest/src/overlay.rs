//! Crash images without copying whole images.
//!
//! A crash state is the base image plus the writes that reached the device before the crash.
//! [`Overlay`] keeps the base shared (one `Arc` for every state of a run), the durable prefix of
//! the write log as a shared map (built once per flush point), and the state's own writes —
//! the subset of in-flight writes, and whatever mount and unmount write later — in a private
//! map. Rebuilding a state costs a few pointer copies instead of a 50 MiB image copy, and
//! [`Overlay::image`] gives the same bytes as [`crate::state_with_subset`] (tested).

use crate::crash_device::{CrashEvent, EventKind};
use lanefs::device::{BlockDevice, IoMode, ReadReq, WriteReq, BLOCK_SIZE};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

/// One block of bytes, shared between states.
pub type Block = Arc<[u8]>;

/// Block address -> contents.
pub type BlockMap = HashMap<u64, Block>;

/// A write log with shared block contents (converted once from [`CrashEvent`]s).
#[derive(Debug, Clone, Default)]
pub struct WriteLog {
    /// `None` for a flush, `Some((addr, bytes))` for a block write; indices as in the event log.
    pub events: Vec<Option<(u64, Block)>>,
}

impl WriteLog {
    /// The log of `events` (a recording's device events).
    pub fn from_events(events: &[CrashEvent]) -> WriteLog {
        WriteLog {
            events: events
                .iter()
                .map(|e| match &e.kind {
                    EventKind::Write { addr, data } => Some((*addr, Block::from(data.as_slice()))),
                    EventKind::Flush => None,
                })
                .collect(),
        }
    }

    /// Events in the log.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Indices of the flushes.
    pub fn flush_points(&self) -> Vec<usize> {
        self.events.iter().enumerate().filter(|(_, e)| e.is_none()).map(|(i, _)| i).collect()
    }

    /// The writes in flight after flush `flush` (None: from the start) up to the next flush.
    pub fn window(&self, flush: Option<usize>) -> std::ops::Range<usize> {
        let start = flush.map_or(0, |f| f + 1).min(self.events.len());
        let end =
            self.events[start..].iter().position(Option::is_none).map_or(self.events.len(), |p| start + p);
        start..end
    }

    /// For every flush point in order (and first for "no flush yet"), the map of blocks durable
    /// at it: `maps[0]` is empty (only the base), `maps[k + 1]` covers up to flush point `k`.
    pub fn durable_maps(&self) -> Vec<Arc<BlockMap>> {
        let mut out = vec![Arc::new(BlockMap::new())];
        let mut cur = BlockMap::new();
        for e in &self.events {
            match e {
                Some((addr, b)) => {
                    cur.insert(*addr, b.clone());
                }
                None => out.push(Arc::new(cur.clone())),
            }
        }
        out
    }
}

/// A block device made of a shared base image, a shared durable map and private writes.
#[derive(Debug)]
pub struct Overlay {
    base: Arc<Vec<u8>>,
    blocks: u64,
    durable: Arc<BlockMap>,
    private: RwLock<BlockMap>,
}

impl Overlay {
    /// The base image alone. A trailing partial block is ignored.
    pub fn new(base: Arc<Vec<u8>>) -> Overlay {
        Overlay::with_durable(base, Arc::new(BlockMap::new()))
    }

    /// The base image under the blocks `durable` holds.
    pub fn with_durable(base: Arc<Vec<u8>>, durable: Arc<BlockMap>) -> Overlay {
        let blocks = (base.len() / BLOCK_SIZE) as u64;
        Overlay { base, blocks, durable, private: RwLock::new(BlockMap::new()) }
    }

    /// A device of `blocks` blocks (shorter than the base: a truncated image).
    pub fn truncated(base: Arc<Vec<u8>>, blocks: u64) -> Overlay {
        let mut o = Overlay::new(base);
        o.blocks = o.blocks.min(blocks);
        o
    }

    /// Lays the writes `extra` (indices into `log`, applied in the order given) over the
    /// durable state. Indices that are not writes are ignored.
    pub fn apply_log(&self, log: &WriteLog, extra: &[usize]) {
        let mut p = self.private.write();
        for &i in extra {
            if let Some(Some((addr, b))) = log.events.get(i) {
                p.insert(*addr, b.clone());
            }
        }
    }

    /// Replaces block `addr` (no bounds check beyond the device: out-of-range is ignored).
    pub fn put(&self, addr: u64, data: &[u8]) {
        if addr < self.blocks && data.len() == BLOCK_SIZE {
            self.private.write().insert(addr, Block::from(data));
        }
    }

    /// The current bytes of block `addr` (zeros past the base).
    pub fn block(&self, addr: u64) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_SIZE];
        self.read_one(addr, &mut b);
        b
    }

    fn read_one(&self, addr: u64, out: &mut [u8]) {
        if let Some(b) = self.private.read().get(&addr) {
            out.copy_from_slice(b);
            return;
        }
        if let Some(b) = self.durable.get(&addr) {
            out.copy_from_slice(b);
            return;
        }
        let start = addr as usize * BLOCK_SIZE;
        match self.base.get(start..start + BLOCK_SIZE) {
            Some(src) => out.copy_from_slice(src),
            None => out.fill(0),
        }
    }

    /// The whole image as bytes.
    pub fn image(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.blocks as usize * BLOCK_SIZE];
        for (a, chunk) in out.chunks_mut(BLOCK_SIZE).enumerate() {
            self.read_one(a as u64, chunk);
        }
        out
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn check(addr: u64, len: usize, blocks: u64) -> io::Result<u64> {
    if len == 0 || !len.is_multiple_of(BLOCK_SIZE) {
        return Err(invalid(format!(
            "request at block {addr}: length {len} is not a multiple of {BLOCK_SIZE}"
        )));
    }
    let n = (len / BLOCK_SIZE) as u64;
    match addr.checked_add(n) {
        Some(end) if end <= blocks => Ok(n),
        _ => Err(invalid(format!(
            "request of {n} block(s) at block {addr} runs past the end ({blocks} blocks)"
        ))),
    }
}

impl BlockDevice for Overlay {
    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        for r in reqs.iter() {
            check(r.addr, r.buf.len(), self.blocks)?;
        }
        for r in reqs.iter_mut() {
            for (k, chunk) in r.buf.chunks_mut(BLOCK_SIZE).enumerate() {
                self.read_one(r.addr + k as u64, chunk);
            }
        }
        Ok(())
    }

    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> io::Result<()> {
        for r in reqs {
            check(r.addr, r.data.len(), self.blocks)?;
        }
        let mut p = self.private.write();
        for r in reqs {
            for (k, chunk) in r.data.chunks(BLOCK_SIZE).enumerate() {
                p.insert(r.addr + k as u64, Block::from(chunk));
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn io_mode(&self) -> IoMode {
        IoMode::Memory
    }

    fn describe(&self) -> String {
        "crash-state overlay".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crash_device::{state_with_subset, CrashDevice};
    use lanefs::MemDevice;

    #[test]
    fn overlay_matches_state_with_subset() {
        let dev = CrashDevice::new(MemDevice::new(32 * BLOCK_SIZE as u64));
        let base = dev.inner().snapshot();
        let blk = |v: u8| vec![v; BLOCK_SIZE];
        dev.write_block(1, &blk(1)).unwrap();
        dev.flush().unwrap();
        dev.write_block(2, &blk(2)).unwrap();
        dev.write_block(2, &blk(3)).unwrap();
        dev.write_block(5, &blk(5)).unwrap();
        dev.flush().unwrap();
        dev.write_block(6, &blk(6)).unwrap();
        let ev = dev.events();
        let log = WriteLog::from_events(&ev);
        let maps = log.durable_maps();
        assert_eq!(maps.len(), 3);
        let base = Arc::new(base);
        let flushes = log.flush_points();
        for (k, f) in std::iter::once(None).chain(flushes.iter().map(|&f| Some(f))).enumerate() {
            let win: Vec<usize> = log.window(f).collect();
            for extra in [vec![], win.clone(), win.iter().rev().copied().collect()] {
                let o = Overlay::with_durable(base.clone(), maps[k].clone());
                o.apply_log(&log, &extra);
                assert_eq!(o.image(), state_with_subset(&base, &ev, f, &extra).unwrap(), "{f:?} {extra:?}");
            }
        }
        let o = Overlay::truncated(base.clone(), 4);
        assert_eq!(o.block_count(), 4);
        assert!(o.read_block(4, &mut blk(0)).is_err());
    }
}
