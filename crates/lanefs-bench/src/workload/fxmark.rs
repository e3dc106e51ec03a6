//! FxMark's micro-benchmarks (Min et al., USENIX ATC'16, table 3): one worker type per shape of
//! operation. See the parent module for the names and the layout of a run.

use super::*;

/// DWOL, DWOM, DRBL, DRBM: one block at a fixed offset, written or read.
pub(super) struct Block {
    pub(super) file: Box<dyn File>,
    pub(super) buf: AlignedBuf,
    pub(super) off: u64,
    pub(super) write: bool,
}

impl Worker for Block {
    fn op(&mut self, _: &mut Histogram) -> io::Result<Step> {
        if self.write {
            self.file.write_all_at(&self.buf, self.off)?;
        } else {
            let n = self.file.read_at(&mut self.buf, self.off)?;
            if n != BLOCK {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("short read of {n} bytes")));
            }
        }
        Ok(Step::Done)
    }
}

/// DWAL, DWSL: append blocks (and fsync), truncating at the plan's append wrap.
pub(super) struct Append {
    pub(super) file: Box<dyn File>,
    pub(super) buf: AlignedBuf,
    pub(super) off: u64,
    pub(super) wrap: u64,
    pub(super) sync: bool,
}

impl Worker for Append {
    fn op(&mut self, fsync: &mut Histogram) -> io::Result<Step> {
        self.file.write_all_at(&self.buf, self.off)?;
        self.off += BLOCK as u64;
        if self.sync {
            let t0 = Instant::now();
            self.file.fsync()?;
            fsync.record(t0.elapsed());
        }
        Ok(if self.off >= self.wrap { Step::Maintain } else { Step::Done })
    }
    fn maintain(&mut self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.off = 0;
        Ok(())
    }
}

/// MRPL (fanout 0: always `root`), MRPM (a random leaf of the tree under `root`).
pub(super) struct Lookup<'a> {
    pub(super) t: &'a dyn Target,
    pub(super) root: PathBuf,
    pub(super) fanout: usize,
    pub(super) rng: Rng,
}

impl Worker for Lookup<'_> {
    fn op(&mut self, _: &mut Histogram) -> io::Result<Step> {
        if self.fanout == 0 {
            self.t.stat(&self.root)?;
        } else {
            let mut digits = [0usize; TREE_DEPTH];
            for d in &mut digits {
                *d = self.rng.below(self.fanout as u64) as usize;
            }
            self.t.stat(&tree_path(&self.root, &digits))?;
        }
        Ok(Step::Done)
    }
}

/// MRDL, MRDM: list a whole directory.
pub(super) struct ListDir<'a> {
    pub(super) t: &'a dyn Target,
    pub(super) dir: PathBuf,
}

impl Worker for ListDir<'_> {
    fn op(&mut self, _: &mut Histogram) -> io::Result<Step> {
        let names = self.t.readdir(&self.dir)?;
        if names.is_empty() {
            return Err(io::Error::other("directory listed empty"));
        }
        Ok(Step::Done)
    }
}

pub(super) enum NameOp {
    /// MWCL, MWCM: create `{prefix}{next}`; remove all at `pool`.
    Create,
    /// MWUL, MWUM: unlink `{prefix}{next}`; recreate all when `pool` is used up.
    Unlink,
    /// MWRL: rename `{prefix}{next}` to `{prefix}{next+1}` (FxMark's renaming chain).
    RenameInPlace,
    /// MWRM: rename `{prefix}{next}` to `{to}{next}`; move all back when `pool` is used up.
    MoveTo(PathBuf),
}

/// The metadata-write workloads: a numbered sequence of names in one directory.
pub(super) struct Names<'a> {
    pub(super) t: &'a dyn Target,
    pub(super) dir: PathBuf,
    pub(super) prefix: String,
    pub(super) pool: usize,
    pub(super) next: usize,
    pub(super) what: NameOp,
}

impl<'a> Names<'a> {
    pub(super) fn new(t: &'a dyn Target, dir: PathBuf, prefix: String, pool: usize, what: NameOp) -> Self {
        Names { t, dir, prefix, pool, next: 0, what }
    }
    fn name(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}{i}", self.prefix))
    }
    fn moved(to: &Path, i: usize) -> PathBuf {
        let mut s = to.as_os_str().to_owned();
        s.push(i.to_string());
        PathBuf::from(s)
    }
    /// Creates the whole pool (MWRM's sources).
    pub(super) fn populate(&mut self) -> io::Result<()> {
        for i in 0..self.pool {
            self.t.create(&self.name(i))?;
        }
        self.next = 0;
        Ok(())
    }
}

impl Worker for Names<'_> {
    fn op(&mut self, _: &mut Histogram) -> io::Result<Step> {
        let i = self.next;
        match &self.what {
            NameOp::Create => self.t.create(&self.name(i))?,
            NameOp::Unlink => self.t.unlink(&self.name(i))?,
            NameOp::RenameInPlace => self.t.rename(&self.name(i), &self.name(i + 1))?,
            NameOp::MoveTo(to) => self.t.rename(&self.name(i), &Self::moved(to, i))?,
        }
        self.next += 1;
        let full = !matches!(self.what, NameOp::RenameInPlace) && self.next >= self.pool;
        Ok(if full { Step::Maintain } else { Step::Done })
    }

    fn maintain(&mut self) -> io::Result<()> {
        match &self.what {
            NameOp::Create => {
                for i in 0..self.next {
                    self.t.unlink(&self.name(i))?;
                }
            }
            NameOp::Unlink => {
                // Also the initial fill: `next` is the pool size, or 0 before the first op, when
                // the pool does not exist yet.
                for i in 0..self.pool {
                    self.t.create(&self.name(i))?;
                }
            }
            NameOp::RenameInPlace => {}
            NameOp::MoveTo(to) => {
                for i in 0..self.next {
                    self.t.rename(&Self::moved(to, i), &self.name(i))?;
                }
            }
        }
        self.next = 0;
        Ok(())
    }
}
