//! A recording wrapper for crash-consistency testing.
//!
//! [`CrashDevice`] passes every call to the device it wraps and logs what reached it: one
//! [`EventKind::Write`] per block and one [`EventKind::Flush`] per successful flush. From the log
//! and the image the device started with, [`state_at`] and [`state_with_subset`] rebuild any
//! image a crash could leave: everything before a flush is durable, and any subset of the writes
//! in flight after it may also have landed, in any order (an SSD's volatile cache reorders).
//!
//! A flush takes an exclusive barrier against writes, so the log position of a flush separates
//! exactly the writes it covers (completed before it was called) from those it does not.
//!
//! Every event takes its sequence number from an [`EventClock`], private to the device unless
//! one is shared ([`CrashDevice::with_clock`]) with a persistent-memory region's recorder
//! ([`lanefs::RegionOptions::clock`]): the two logs then merge into one timeline. A number is
//! taken under the log's lock after the event reached the wrapped device and before the call
//! returns, so if one event's call returned before another's began (a flush before the region
//! persist that commits the fsync it served), its number is the smaller.
//! [`FaultPlan`] makes chosen calls fail the way real devices do: EIO, a short write, a torn block.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use lanefs::device::{BlockDevice, EventClock, IoMode, ReadReq, WriteReq, BLOCK_SIZE};
use lanefs::sync::{Mutex, Rank, RwLock};
use lanefs::testing::device::check_writes;

/// What reached the wrapped device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// One block (`data.len() == BLOCK_SIZE`) written at block `addr`.
    Write {
        /// Block address.
        addr: u64,
        /// The block's bytes.
        data: Vec<u8>,
    },
    /// A flush that returned success: every write logged before it is durable.
    Flush,
}

/// One logged event; `seq` is its number on the device's [`EventClock`] (from 0 in log order
/// when the clock is the device's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashEvent {
    /// Position in the clock's single order of events.
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
}

impl CrashEvent {
    /// Whether the event is a successful flush.
    pub fn is_flush(&self) -> bool {
        matches!(self.kind, EventKind::Flush)
    }
}

/// How a write call that the plan picks goes wrong. The caller always gets EIO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFault {
    /// Nothing lands.
    Fail,
    /// The first `blocks` blocks of the batch (in request order) land.
    Short {
        /// Blocks that land.
        blocks: usize,
    },
    /// The first `blocks` blocks land whole, the next one only its first `bytes` bytes.
    Torn {
        /// Blocks that land whole.
        blocks: usize,
        /// Bytes of the next block that land.
        bytes: usize,
    },
}

/// Which calls fail. Calls are counted from 1 from the moment the plan is installed, writes and
/// flushes separately; calls rejected as invalid input are not counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultPlan {
    writes: BTreeMap<u64, WriteFault>,
    flushes: BTreeSet<u64>,
}

impl FaultPlan {
    /// A plan with no faults: every batch lands.
    pub fn new() -> FaultPlan {
        FaultPlan::default()
    }

    /// The `nth` write call fails with EIO and writes nothing.
    pub fn fail_write(mut self, nth: u64) -> FaultPlan {
        self.writes.insert(nth, WriteFault::Fail);
        self
    }

    /// The `nth` write call lands only its first `blocks` blocks, then fails with EIO.
    pub fn short_write(mut self, nth: u64, blocks: usize) -> FaultPlan {
        self.writes.insert(nth, WriteFault::Short { blocks });
        self
    }

    /// The `nth` write call lands its first `blocks` blocks and the first `bytes` bytes of the
    /// next block (the rest of that block keeps its old bytes), then fails with EIO.
    pub fn torn_write(mut self, nth: u64, blocks: usize, bytes: usize) -> FaultPlan {
        self.writes.insert(nth, WriteFault::Torn { blocks, bytes });
        self
    }

    /// The `nth` flush call fails with EIO without flushing.
    pub fn fail_flush(mut self, nth: u64) -> FaultPlan {
        self.flushes.insert(nth);
        self
    }
}

#[derive(Debug, Default)]
struct FaultState {
    plan: FaultPlan,
    writes: u64,
    flushes: u64,
}

#[derive(Debug, Default)]
struct Log {
    events: Vec<CrashEvent>,
    clock: EventClock,
}

impl Log {
    fn push(&mut self, kind: EventKind) {
        let seq = self.clock.tick();
        self.events.push(CrashEvent { seq, kind });
    }
}

/// A raw errno rather than a custom error, so that `Error::errno` and the FUSE adapter report
/// exactly EIO, as for a real failing device.
fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// Wraps a device, logs every block write and flush, and injects faults.
#[derive(Debug)]
pub struct CrashDevice<D: BlockDevice> {
    inner: D,
    barrier: RwLock<()>,
    log: Mutex<Log>,
    faults: Mutex<FaultState>,
}

impl<D: BlockDevice> CrashDevice<D> {
    /// Records every write and flush that reaches `inner`.
    pub fn new(inner: D) -> CrashDevice<D> {
        CrashDevice::with_faults(inner, FaultPlan::new())
    }

    /// As [`CrashDevice::new`], failing batches as `plan` says.
    pub fn with_faults(inner: D, plan: FaultPlan) -> CrashDevice<D> {
        let dev = CrashDevice::with_clock(inner, EventClock::new());
        dev.set_fault_plan(plan);
        dev
    }

    /// A recording device whose events take their numbers from `clock` (shared with a region's
    /// recorder, so both logs merge into one timeline).
    pub fn with_clock(inner: D, clock: EventClock) -> CrashDevice<D> {
        CrashDevice {
            inner,
            barrier: RwLock::new(Rank::CrashBarrier, ()),
            log: Mutex::new(Rank::CrashLog, Log { events: Vec::new(), clock }),
            faults: Mutex::new(Rank::CrashFaults, FaultState::default()),
        }
    }

    /// The clock the log's sequence numbers come from.
    pub fn clock(&self) -> EventClock {
        self.log.lock().clock.clone()
    }

    /// Installs a new plan and restarts the call counters.
    pub fn set_fault_plan(&self, plan: FaultPlan) {
        *self.faults.lock() = FaultState { plan, writes: 0, flushes: 0 };
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The wrapped device, consuming the recorder.
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// A copy of the log.
    pub fn events(&self) -> Vec<CrashEvent> {
        self.log.lock().events.clone()
    }

    /// Runs `f` on the log without copying it (writers wait meanwhile).
    pub fn with_events<R>(&self, f: impl FnOnce(&[CrashEvent]) -> R) -> R {
        f(&self.log.lock().events)
    }

    /// Events recorded so far.
    pub fn event_count(&self) -> usize {
        self.log.lock().events.len()
    }

    /// Indices in the log of the successful flushes.
    pub fn flush_points(&self) -> Vec<usize> {
        self.with_events(flush_points)
    }

    fn record_blocks(&self, blocks: Vec<(u64, Vec<u8>)>) {
        let mut log = self.log.lock();
        for (addr, data) in blocks {
            log.push(EventKind::Write { addr, data });
        }
    }
}

/// The batch as single blocks in request order.
fn split_blocks<'a>(reqs: &[WriteReq<'a>]) -> Vec<(u64, &'a [u8])> {
    reqs.iter()
        .flat_map(|r| r.data.chunks(BLOCK_SIZE).enumerate().map(move |(k, c)| (r.addr + k as u64, c)))
        .collect()
}

impl<D: BlockDevice> BlockDevice for CrashDevice<D> {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }

    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        self.inner.read_batch(reqs)
    }

    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> io::Result<()> {
        check_writes(reqs, self.inner.block_count())?;
        let _shared = self.barrier.read();
        let fault = {
            let mut f = self.faults.lock();
            f.writes += 1;
            let n = f.writes;
            f.plan.writes.get(&n).copied()
        };
        let blocks = split_blocks(reqs);
        let (landed, torn) = match fault {
            None => {
                self.inner.write_batch(reqs)?;
                let all = blocks.iter().map(|&(a, d)| (a, d.to_vec())).collect();
                self.record_blocks(all);
                return Ok(());
            }
            Some(WriteFault::Fail) => (0, None),
            Some(WriteFault::Short { blocks: k }) => (k.min(blocks.len()), None),
            Some(WriteFault::Torn { blocks: k, bytes }) => {
                let k = k.min(blocks.len());
                (k, blocks.get(k).map(|&b| (b, bytes.min(BLOCK_SIZE))))
            }
        };
        let mut partial: Vec<(u64, Vec<u8>)> =
            blocks[..landed].iter().map(|&(a, d)| (a, d.to_vec())).collect();
        if let Some(((addr, new), bytes)) = torn {
            let mut merged = vec![0u8; BLOCK_SIZE];
            self.inner.read_block(addr, &mut merged)?;
            merged[..bytes].copy_from_slice(&new[..bytes]);
            partial.push((addr, merged));
        }
        let sub: Vec<WriteReq<'_>> = partial.iter().map(|(a, d)| WriteReq { addr: *a, data: d }).collect();
        self.inner.write_batch(&sub)?;
        self.record_blocks(partial);
        Err(eio())
    }

    fn flush(&self) -> io::Result<()> {
        let _exclusive = self.barrier.write();
        let fail = {
            let mut f = self.faults.lock();
            f.flushes += 1;
            let n = f.flushes;
            f.plan.flushes.contains(&n)
        };
        if fail {
            return Err(eio());
        }
        self.inner.flush()?;
        self.log.lock().push(EventKind::Flush);
        Ok(())
    }

    fn io_mode(&self) -> IoMode {
        self.inner.io_mode()
    }

    fn describe(&self) -> String {
        format!("crash-recording over {}", self.inner.describe())
    }

    fn discard(&self, addr: u64, blocks: u64) -> io::Result<()> {
        // Not logged: discarded contents are unspecified, and replay keeps the old bytes, which is
        // one of the allowed outcomes.
        self.inner.discard(addr, blocks)
    }
}

/// Indices of the flush events in `events`.
pub fn flush_points(events: &[CrashEvent]) -> Vec<usize> {
    events.iter().enumerate().filter(|(_, e)| e.is_flush()).map(|(i, _)| i).collect()
}

fn apply(image: &mut Vec<u8>, addr: u64, data: &[u8]) {
    let Some(start) = usize::try_from(addr).ok().and_then(|a| a.checked_mul(BLOCK_SIZE)) else {
        return;
    };
    let end = start.saturating_add(data.len());
    if image.len() < end {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

/// The image after `base` received the first `upto` events (clamped to the log length), in
/// order. Writes past the end of `base` grow the image.
pub fn state_at(base: &[u8], events: &[CrashEvent], upto: usize) -> Vec<u8> {
    let mut image = base.to_vec();
    for e in &events[..upto.min(events.len())] {
        if let EventKind::Write { addr, data } = &e.kind {
            apply(&mut image, *addr, data);
        }
    }
    image
}

/// The log range of writes in flight after `flush` (`None`: from the start): up to the next
/// flush or the end of the log.
fn window(events: &[CrashEvent], flush: Option<usize>) -> std::ops::Range<usize> {
    let start = flush.map_or(0, |f| f + 1).min(events.len());
    let end = events[start..].iter().position(CrashEvent::is_flush).map_or(events.len(), |p| start + p);
    start..end
}

/// Indices of the writes that a crash after flush `flush` (`None`: before any flush) may or may
/// not have persisted.
pub fn in_flight_after(events: &[CrashEvent], flush: Option<usize>) -> Vec<usize> {
    window(events, flush).filter(|&i| matches!(events[i].kind, EventKind::Write { .. })).collect()
}

/// A crash image: everything up to and including flush `upto_flush` (`None`: nothing beyond
/// `base`), then the writes listed in `extra`, applied in the order given (so a reordering
/// device is expressible). Each index in `extra` must be a write in flight after that flush (see
/// [`in_flight_after`]); anything else is `InvalidInput`, since a harness passing it has a bug.
pub fn state_with_subset(
    base: &[u8],
    events: &[CrashEvent],
    upto_flush: Option<usize>,
    extra: &[usize],
) -> io::Result<Vec<u8>> {
    let bad = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    if let Some(f) = upto_flush {
        if !events.get(f).is_some_and(CrashEvent::is_flush) {
            return Err(bad(format!("event {f} is not a flush")));
        }
    }
    let win = window(events, upto_flush);
    let mut image = state_at(base, events, win.start);
    for &i in extra {
        match events.get(i) {
            Some(CrashEvent { kind: EventKind::Write { addr, data }, .. }) if win.contains(&i) => {
                apply(&mut image, *addr, data)
            }
            _ => {
                return Err(bad(format!(
                    "event {i} is not a write in flight after the flush (window {win:?})"
                )))
            }
        }
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lanefs::device::MemDevice;

    fn block(v: u8) -> Vec<u8> {
        vec![v; BLOCK_SIZE]
    }

    #[test]
    fn windows_and_subsets() {
        let dev = CrashDevice::new(MemDevice::new(16 * BLOCK_SIZE as u64));
        let base = dev.inner().snapshot();
        dev.write_block(1, &block(1)).unwrap(); // 0
        dev.flush().unwrap(); // 1
        dev.write_block(2, &block(2)).unwrap(); // 2
        dev.write_block(2, &block(3)).unwrap(); // 3
        dev.write_block(5, &block(5)).unwrap(); // 4
        dev.flush().unwrap(); // 5
        dev.write_block(6, &block(6)).unwrap(); // 6
        let ev = dev.events();
        assert_eq!(dev.flush_points(), vec![1, 5]);
        assert_eq!(in_flight_after(&ev, None), vec![0]);
        assert_eq!(in_flight_after(&ev, Some(1)), vec![2, 3, 4]);
        assert_eq!(in_flight_after(&ev, Some(5)), vec![6]);

        // Reordered: the older write to block 2 lands last.
        let img = state_with_subset(&base, &ev, Some(1), &[3, 2]).unwrap();
        assert_eq!(&img[2 * BLOCK_SIZE..3 * BLOCK_SIZE], &block(2)[..]);
        assert_eq!(&img[BLOCK_SIZE..2 * BLOCK_SIZE], &block(1)[..]);
        assert_eq!(&img[5 * BLOCK_SIZE..6 * BLOCK_SIZE], &block(0)[..]);

        assert!(state_with_subset(&base, &ev, Some(2), &[]).is_err());
        assert!(state_with_subset(&base, &ev, Some(1), &[6]).is_err());
        assert!(state_with_subset(&base, &ev, Some(1), &[99]).is_err());
        assert_eq!(state_with_subset(&base, &ev, None, &[]).unwrap(), base);
        assert_eq!(state_at(&base, &ev, usize::MAX), dev.inner().snapshot());
    }

    #[test]
    fn seq_numbers_follow_log_order() {
        let dev = CrashDevice::new(MemDevice::new(4 * BLOCK_SIZE as u64));
        dev.write_batch(&[WriteReq { addr: 0, data: &[7u8; 2 * BLOCK_SIZE] }]).unwrap();
        dev.flush().unwrap();
        let seqs: Vec<u64> = dev.events().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![0, 1, 2]);
    }

    #[test]
    fn a_shared_clock_numbers_both_logs() {
        let clock = EventClock::new();
        let dev = CrashDevice::with_clock(MemDevice::new(4 * BLOCK_SIZE as u64), clock.clone());
        dev.write_block(0, &block(1)).unwrap();
        // Another recorder takes number 1.
        assert_eq!(clock.tick(), 1);
        dev.flush().unwrap();
        let seqs: Vec<u64> = dev.events().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![0, 2]);
        assert_eq!(clock.now(), 3);
        assert_eq!(dev.clock(), clock);
        assert_ne!(EventClock::new(), clock);
    }
}
