//! Shutdown at the I/O layer: the instant after which nothing more reaches the image.
//!
//! A [`Halt`] is shared by a mount's [`HaltDevice`] (the device the engine writes through) and
//! its persistent-memory region: every write, flush and discard of the device and every store
//! and persist of the region is admitted by [`Halt::enter`] first, and fails with EIO once
//! [`Halt::halt`] has been called. `halt` returns only after every write admitted before it has
//! completed, so from its return on the image and the region stay exactly as they are: what a
//! power cut at that instant leaves (every write that completed is there, flushed or not), and
//! what the next mount recovers from. This is the file system's shutdown (`Fs::shutdown`, the
//! XFS_IOC_GOINGDOWN ioctl).
//!
//! Invariants: once `is_halted` is true it stays true; no write is admitted after `halt`
//! returns; `halt` waits only for writes admitted before it, each of which is one device or
//! region call, so it ends. Reads are not gated: they change nothing (the engine refuses every
//! operation of a shut-down file system before it reads).
//!
//! Admission is the Dekker handshake of `sync::pass_sem` without its lock: a writer adds one to
//! its CPU slot's count and then reads the flag; `halt` sets the flag and then reads every
//! slot, all sequentially consistent, so either the writer sees the flag (and backs out) or
//! `halt` sees the writer (and waits for it). A guard gives back to the slot it took, whatever
//! CPU it ends on, so each slot's count is exact. No lock is taken, so the gate has no rank.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use super::{BlockDevice, IoMode, ReadReq, WriteReq};
use crate::sync::PerCpu;

/// The shutdown state of one mount (see the module docs).
pub struct Halt {
    halted: AtomicBool,
    /// Writes admitted and not yet completed, per CPU slot.
    inflight: PerCpu<AtomicUsize>,
}

impl std::fmt::Debug for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Halt").field("halted", &self.is_halted()).finish()
    }
}

/// One admitted write; dropping it completes the write.
#[must_use]
pub struct HaltGuard<'a> {
    slot: &'a AtomicUsize,
}

impl Drop for HaltGuard<'_> {
    fn drop(&mut self) {
        self.slot.fetch_sub(1, SeqCst);
    }
}

/// The error every write gets once the mount is shut down.
pub fn halted_error() -> io::Error {
    io::Error::other(ShutDown)
}

/// The cause carried by [`halted_error`]: `EIO` for a caller, "file system shut down" for a human.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutDown;

impl std::fmt::Display for ShutDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("file system shut down")
    }
}

impl std::error::Error for ShutDown {}

impl Default for Halt {
    fn default() -> Self {
        Halt { halted: AtomicBool::new(false), inflight: PerCpu::new(|_| AtomicUsize::new(0)) }
    }
}

impl Halt {
    /// A gate that is open (not halted), to share between the devices it stops.
    pub fn new() -> Arc<Halt> {
        Arc::new(Halt::default())
    }

    /// Whether [`Halt::halt`] has been called.
    pub fn is_halted(&self) -> bool {
        self.halted.load(SeqCst)
    }

    /// Admits one write, or refuses it ([`halted_error`]) once the mount is shut down. Hold the
    /// guard until the write has completed.
    pub fn enter(&self) -> io::Result<HaltGuard<'_>> {
        let slot = self.inflight.current();
        slot.fetch_add(1, SeqCst);
        let guard = HaltGuard { slot };
        if self.halted.load(SeqCst) {
            return Err(halted_error());
        }
        Ok(guard)
    }

    /// Shuts the mount down: no write is admitted from now on, and once this returns every
    /// write admitted before has completed. Returns whether this call did it (false: it was
    /// shut down already, and this call still waited for the writes in flight).
    pub fn halt(&self) -> bool {
        let first = !self.halted.swap(true, SeqCst);
        // Bounded: each admitted write is one device or region call, and no new one is admitted.
        let mut spins = 0u32;
        while self.inflight.iter().map(|s| s.load(SeqCst)).sum::<usize>() != 0 {
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        debug_assert!(self.is_halted());
        first
    }
}

/// A device whose writes, flushes and discards pass through a [`Halt`]; reads pass freely.
pub struct HaltDevice {
    inner: Arc<dyn BlockDevice>,
    halt: Arc<Halt>,
}

impl HaltDevice {
    /// `inner` behind the gate `halt`: every request fails once `halt` is closed.
    pub fn new(inner: Arc<dyn BlockDevice>, halt: Arc<Halt>) -> HaltDevice {
        HaltDevice { inner, halt }
    }
}

impl BlockDevice for HaltDevice {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        self.inner.read_batch(reqs)
    }
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> io::Result<()> {
        let _admitted = self.halt.enter()?;
        self.inner.write_batch(reqs)
    }
    fn flush(&self) -> io::Result<()> {
        let _admitted = self.halt.enter()?;
        self.inner.flush()
    }
    fn io_mode(&self) -> IoMode {
        self.inner.io_mode()
    }
    fn discard(&self, addr: u64, blocks: u64) -> io::Result<()> {
        let _admitted = self.halt.enter()?;
        self.inner.discard(addr, blocks)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn flush_is_free(&self) -> bool {
        self.inner.flush_is_free()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{MemDevice, BLOCK_SIZE};

    #[test]
    fn writes_fail_after_halt_and_reads_do_not() {
        let mem = Arc::new(MemDevice::new(1 << 20));
        let halt = Halt::new();
        let dev = HaltDevice::new(mem.clone(), halt.clone());
        let one = vec![7u8; BLOCK_SIZE];
        dev.write_block(3, &one).unwrap();
        dev.flush().unwrap();
        assert!(halt.halt(), "the first halt does it");
        assert!(!halt.halt(), "a second one finds it done");
        for e in
            [dev.write_block(4, &one).unwrap_err(), dev.flush().unwrap_err(), dev.discard(3, 1).unwrap_err()]
        {
            assert_eq!(e.kind(), io::ErrorKind::Other);
            assert!(e.get_ref().is_some_and(|c| c.is::<ShutDown>()), "{e}");
        }
        let mut back = vec![0u8; BLOCK_SIZE];
        dev.read_block(3, &mut back).unwrap();
        assert_eq!(back, one);
        mem.read_block(4, &mut back).unwrap();
        assert_eq!(back, vec![0u8; BLOCK_SIZE], "a refused write must not land");
    }

    #[test]
    fn halt_waits_for_admitted_writes_and_none_land_after_it() {
        // Writers keep writing their own counter into their own block; after `halt` returns the
        // device must not change, whatever the interleaving.
        let mem = Arc::new(MemDevice::new(1 << 20));
        let halt = Halt::new();
        let dev = Arc::new(HaltDevice::new(mem.clone(), halt.clone()));
        // Each writer counts itself in after its first write, and the halt comes only once all
        // have (a fixed sleep was not enough on a loaded machine).
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let dev = dev.clone();
                let started = started.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    loop {
                        n += 1;
                        let mut b = vec![0u8; BLOCK_SIZE];
                        b[..8].copy_from_slice(&n.to_le_bytes());
                        if dev.write_block(w, &b).is_err() {
                            return n;
                        }
                        if n == 1 {
                            started.fetch_add(1, std::sync::atomic::Ordering::Release);
                        }
                    }
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while started.load(std::sync::atomic::Ordering::Acquire) < 4 {
            assert!(std::time::Instant::now() < deadline, "the writers did not start in 60 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        halt.halt();
        let snap = |m: &MemDevice| {
            (0..4u64)
                .map(|a| {
                    let mut b = vec![0u8; BLOCK_SIZE];
                    m.read_block(a, &mut b).unwrap();
                    b
                })
                .collect::<Vec<_>>()
        };
        let at_halt = snap(&mem);
        for w in writers {
            assert!(w.join().unwrap() > 1, "every writer wrote before the halt");
        }
        assert_eq!(snap(&mem), at_halt, "a write landed after halt returned");
    }
}
