//! lseek(2) with SEEK_DATA and SEEK_HOLE: where a file's data and holes are.
//!
//! A 4 KiB page holds data when it has a block (written, or preallocated by fallocate: POSIX lets
//! a file system report preallocated ranges as data) or a dirty page in memory. Pages in flight
//! (taken by fsync, writeback or a checkpoint, their new block not installed yet) are in neither
//! set for a moment; every such flight happens under the gate (fsync, writeback) or during a
//! checkpoint (`cp_serial`), so the lookup holds both and sees each page in one of the two
//! places.

use crate::error::{Error, Result};
use crate::fs::{ino32, Fs, Ino};
use crate::mem::pages::PAGE_SIZE;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

/// What to look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// The first byte at or after the offset that belongs to data.
    Data,
    /// The first byte at or after the offset that belongs to a hole (the end of the file counts
    /// as a hole).
    Hole,
}

impl Fs {
    /// lseek(2) SEEK_DATA / SEEK_HOLE from `off`. ENXIO when `off` is at or past the end, or
    /// (SEEK_DATA) no data follows it. A file that is not a regular file is all data.
    pub fn seek(&self, ino: Ino, off: u64, what: Seek) -> Result<u64> {
        self.engine.disk.check_live()?;
        let m = {
            let _g = self.engine.mem.pass.shared();
            self.engine.mnode(ino32(ino)?)?
        };
        let nxio = || Error::errno(libc::ENXIO, "offset past the data of the file");
        let page = PAGE_SIZE as u64;
        let Some((pages, _)) = m.pages() else {
            let size = m.size.load(Ordering::Acquire);
            return match what {
                _ if off >= size => Err(nxio()),
                Seek::Data => Ok(off),
                Seek::Hole => Ok(size),
            };
        };
        // No page is in flight while no checkpoint runs and the gate is held exclusively (see
        // the module comment).
        let _serial = self.engine.ckpt.cp_serial.lock();
        let _gate = self.engine.ckpt.gate.write();
        let size = m.size.load(Ordering::Acquire);
        if off >= size {
            return Err(nxio());
        }
        let first = off / page;
        let last = (size - 1) / page;
        let mut data: BTreeSet<u64> = m.disk.lock().cur_map.range(first..=last).map(|(&i, _)| i).collect();
        let dirty = parking_lot::Mutex::new(Vec::new());
        pages.dirty_unmapped(|i| {
            if (first..=last).contains(&i) {
                dirty.lock().push(i);
            }
            // Count nothing: the answer is not used, only the indices seen.
            true
        });
        data.extend(dirty.into_inner());
        match what {
            Seek::Data => match data.range(first..).next() {
                Some(&i) if i == first => Ok(off),
                Some(&i) => Ok(i * page),
                None => Err(nxio()),
            },
            Seek::Hole => {
                let mut idx = first;
                for &i in data.range(first..) {
                    if i != idx {
                        break;
                    }
                    idx += 1;
                }
                if idx == first {
                    Ok(off)
                } else {
                    Ok((idx * page).min(size))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Seek;
    use crate::device::MemDevice;
    use crate::{Fs, FsOptions, MkfsOptions, ROOT};
    use std::sync::Arc;

    #[test]
    fn data_and_holes_in_memory_and_on_disk() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        Fs::format(&*dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
        let fs = Fs::open(dev.clone(), FsOptions::default()).unwrap();
        let f = fs.create(ROOT, b"sparse", 0o644, 0, 0).unwrap().ino;
        // data at pages 2 and 3, hole at 0..2 and 4..10, data at 10, size 10 pages + 100.
        fs.write_at(f, 2 * 4096 + 5, &[1u8; 8000]).unwrap();
        fs.write_at(f, 10 * 4096, &[2u8; 100]).unwrap();
        let check = |fs: &Fs| {
            assert_eq!(fs.seek(f, 0, Seek::Data).unwrap(), 2 * 4096);
            assert_eq!(fs.seek(f, 0, Seek::Hole).unwrap(), 0);
            assert_eq!(fs.seek(f, 3 * 4096 + 7, Seek::Data).unwrap(), 3 * 4096 + 7);
            assert_eq!(fs.seek(f, 2 * 4096, Seek::Hole).unwrap(), 4 * 4096);
            assert_eq!(fs.seek(f, 5 * 4096, Seek::Data).unwrap(), 10 * 4096);
            assert_eq!(fs.seek(f, 10 * 4096, Seek::Hole).unwrap(), 10 * 4096 + 100);
            assert_eq!(fs.seek(f, 10 * 4096 + 100, Seek::Data).unwrap_err().to_errno(), libc::ENXIO);
            assert_eq!(fs.seek(f, 10 * 4096 + 99, Seek::Hole).unwrap(), 10 * 4096 + 100);
        };
        check(&fs);
        fs.fsync(f, false).unwrap();
        check(&fs);
        fs.sync().unwrap();
        check(&fs);
        fs.unmount().unwrap();
        let fs = Fs::open(dev, FsOptions::default()).unwrap();
        check(&fs);
        // A file grown by truncate is one hole.
        let g = fs.create(ROOT, b"grown", 0o644, 0, 0).unwrap().ino;
        fs.truncate(g, 1 << 20).unwrap();
        assert_eq!(fs.seek(g, 0, Seek::Hole).unwrap(), 0);
        assert_eq!(fs.seek(g, 0, Seek::Data).unwrap_err().to_errno(), libc::ENXIO);
        fs.unmount().unwrap();
    }
}
