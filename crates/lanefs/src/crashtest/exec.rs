//! Runs workload operations on a mounted lanefs and records them in the [`History`].
//!
//! Each operation notes the write-log length before it starts; after it returns, the thread
//! that ran it records what changed (under the history lock). An fsync takes its promises when
//! it starts, from what was recorded by then — so in a multi-threaded run it promises exactly
//! the operations that had returned before it was called — and files them when it returns.

use super::ops::{pattern, split, xattr_value, Op};
use super::oracle::{read_file_state, Acked, History, Id, OpRecord};
use crate::fs::{Attr, FileKind, Fs};
use parking_lot::Mutex;

/// What an operation runs against.
pub struct Exec<'a> {
    pub fs: &'a Fs,
    /// The write-log length now.
    pub events: &'a (dyn Fn() -> usize + Sync),
    /// Device errors so far (calls that returned an error).
    pub io_errors: &'a (dyn Fn() -> u64 + Sync),
    pub hist: &'a Mutex<History>,
    pub thread: usize,
    /// Findings made while running (an I/O error not reported to the caller, ...).
    pub findings: &'a Mutex<Vec<String>>,
    /// Inodes opened by `open`, by the path they were opened as.
    pub handles: std::cell::RefCell<std::collections::HashMap<String, crate::fs::Ino>>,
}

fn parent_and_name(path: &str) -> Result<(&str, &[u8]), String> {
    split(path).map(|(p, n)| (p, n.as_bytes())).ok_or_else(|| format!("{path}: no name"))
}

impl Exec<'_> {
    fn resolve(&self, path: &str) -> Result<Attr, String> {
        self.fs.resolve(path).map_err(|e| format!("{path}: {e}"))
    }

    fn state(&self, a: &Attr) -> Result<super::oracle::FileState, String> {
        let a = self.fs.getattr(a.ino).map_err(|e| format!("getattr: {e}"))?;
        read_file_state(self.fs, &a)
    }

    /// Runs `op`, records it, and returns its result.
    pub fn run(&self, op: &Op) -> Result<(), String> {
        let ev = (self.events)();
        let errs = (self.io_errors)();
        let r = self.run_inner(op, ev);
        let ev_end = (self.events)();
        let device_failed = (self.io_errors)() > errs;
        if device_failed && r.is_ok() {
            self.findings.lock().push(format!(
                "thread {} `{op}`: the device returned an error during the call, but the call succeeded",
                self.thread
            ));
        }
        self.hist.lock().log.push(OpRecord {
            thread: self.thread,
            ev_start: ev,
            ev_end,
            text: op.to_string(),
            result: r.clone(),
        });
        r
    }

    /// Re-reads a file after a data operation and records its state if it changed (also after
    /// an error: a write may change memory and then fail in writeback).
    fn record_file(&self, ev: usize, a: &Attr) {
        if let Ok(st) = self.state(a) {
            self.hist.lock().set_file(ev, Id::of(a), st);
        }
    }

    fn run_inner(&self, op: &Op, ev: usize) -> Result<(), String> {
        let fs = self.fs;
        let e = |r: crate::Result<()>| r.map_err(|e| e.to_string());
        match op {
            Op::Create(path) | Op::Mkdir(path) => {
                let (pp, name) = parent_and_name(path)?;
                let parent = self.resolve(pp)?;
                let a = match op {
                    Op::Create(_) => fs.create(parent.ino, name, 0o644, 0, 0),
                    _ => fs.mkdir(parent.ino, name, 0o755, 0, 0),
                }
                .map_err(|e| e.to_string())?;
                let id = Id::of(&a);
                let st = if a.kind == FileKind::Dir { None } else { self.state(&a).ok() };
                let mut h = self.hist.lock();
                h.new_inode(id, a.kind);
                h.set_entry(ev, Id::of(&parent), name, Some(id));
                if let Some(st) = st {
                    h.set_file(ev, id, st);
                }
                Ok(())
            }
            Op::Link(from, to) => {
                let src = self.resolve(from)?;
                let (pp, name) = parent_and_name(to)?;
                let parent = self.resolve(pp)?;
                e(fs.link(src.ino, parent.ino, name).map(|_| ()))?;
                self.hist.lock().set_entry(ev, Id::of(&parent), name, Some(Id::of(&src)));
                Ok(())
            }
            Op::Unlink(path) | Op::Rmdir(path) => {
                let (pp, name) = parent_and_name(path)?;
                let parent = self.resolve(pp)?;
                match op {
                    Op::Unlink(_) => e(fs.unlink(parent.ino, name))?,
                    _ => e(fs.rmdir(parent.ino, name))?,
                }
                self.hist.lock().set_entry(ev, Id::of(&parent), name, None);
                Ok(())
            }
            Op::Exchange(a, b) => {
                let (sp, sname) = parent_and_name(a)?;
                let (dp, dname) = parent_and_name(b)?;
                let sdir = self.resolve(sp)?;
                let ddir = self.resolve(dp)?;
                let x = fs.lookup(sdir.ino, sname).map_err(|e| format!("{a}: {e}"))?;
                let y = fs.lookup(ddir.ino, dname).map_err(|e| format!("{b}: {e}"))?;
                e(fs.rename(sdir.ino, sname, ddir.ino, dname, crate::fs::RENAME_EXCHANGE))?;
                if x.ino == y.ino {
                    return Ok(());
                }
                let (sd, dd) = (Id::of(&sdir), Id::of(&ddir));
                let mut h = self.hist.lock();
                let v = h.set_entries(ev, &[(sd, sname, Some(Id::of(&y))), (dd, dname, Some(Id::of(&x)))]);
                h.note_rename((sd, sname.to_vec()), v[0], (dd, dname.to_vec()), v[1]);
                Ok(())
            }
            Op::Symlink(target, path) => {
                let (pp, name) = parent_and_name(path)?;
                let parent = self.resolve(pp)?;
                let a = fs.symlink(parent.ino, name, target.as_bytes(), 0, 0).map_err(|e| e.to_string())?;
                let id = Id::of(&a);
                let st = self.state(&a).ok();
                let mut h = self.hist.lock();
                h.new_inode(id, a.kind);
                h.set_entry(ev, Id::of(&parent), name, Some(id));
                if let Some(st) = st {
                    h.set_file(ev, id, st);
                }
                Ok(())
            }
            Op::Open(path) => {
                if self.handles.borrow().contains_key(path) {
                    return Err(format!("{path}: already open"));
                }
                let a = self.resolve(path)?;
                e(fs.open_ino(a.ino).map(|_| ()))?;
                self.handles.borrow_mut().insert(path.clone(), a.ino);
                Ok(())
            }
            Op::Close(path) => {
                let ino =
                    self.handles.borrow_mut().remove(path).ok_or_else(|| format!("{path}: not open"))?;
                e(fs.release(ino))
            }
            Op::Rename(from, to) => {
                let (sp, sname) = parent_and_name(from)?;
                let (dp, dname) = parent_and_name(to)?;
                let sdir = self.resolve(sp)?;
                let ddir = self.resolve(dp)?;
                let src = fs.lookup(sdir.ino, sname).map_err(|e| format!("{from}: {e}"))?;
                let dst = fs.lookup(ddir.ino, dname).ok();
                e(fs.rename(sdir.ino, sname, ddir.ino, dname, 0))?;
                if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
                    // Two names of one inode: rename does nothing.
                    return Ok(());
                }
                let (sd, dd) = (Id::of(&sdir), Id::of(&ddir));
                let mut h = self.hist.lock();
                let v = h.set_entries(ev, &[(sd, sname, None), (dd, dname, Some(Id::of(&src)))]);
                h.note_rename((sd, sname.to_vec()), v[0], (dd, dname.to_vec()), v[1]);
                Ok(())
            }
            Op::Whiteout(from, to) => {
                let (sp, sname) = parent_and_name(from)?;
                let (dp, dname) = parent_and_name(to)?;
                let sdir = self.resolve(sp)?;
                let ddir = self.resolve(dp)?;
                let src = fs.lookup(sdir.ino, sname).map_err(|e| format!("{from}: {e}"))?;
                let dst = fs.lookup(ddir.ino, dname).ok();
                e(fs.rename(sdir.ino, sname, ddir.ino, dname, crate::fs::RENAME_WHITEOUT))?;
                if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
                    // Two names of one inode: rename does nothing, and leaves no whiteout.
                    return Ok(());
                }
                let w = fs.lookup(sdir.ino, sname).map_err(|e| format!("{from}: whiteout: {e}"))?;
                if w.kind != FileKind::CharDevice || w.rdev != 0 {
                    return Err(format!(
                        "{from}: the whiteout is a {:?} {:#x}, not a character device 0:0",
                        w.kind, w.rdev
                    ));
                }
                let wid = Id::of(&w);
                let st = self.state(&w)?;
                let (sd, dd) = (Id::of(&sdir), Id::of(&ddir));
                let mut h = self.hist.lock();
                h.new_inode(wid, w.kind);
                let v = h.set_entries(ev, &[(sd, sname, Some(wid)), (dd, dname, Some(Id::of(&src)))]);
                h.set_file(ev, wid, st);
                h.note_rename((sd, sname.to_vec()), v[0], (dd, dname.to_vec()), v[1]);
                Ok(())
            }
            Op::Write { path, off, len, tag } => {
                let a = self.resolve(path)?;
                let r = fs.write_at(a.ino, *off, &pattern(*tag, *off, *len)).map(|_| ());
                self.record_file(ev, &a);
                e(r)
            }
            Op::Truncate { path, size } => {
                let a = self.resolve(path)?;
                let r = fs.truncate(a.ino, *size);
                self.record_file(ev, &a);
                e(r)
            }
            Op::Falloc { path, mode, off, len } => {
                let a = self.resolve(path)?;
                let r = fs.fallocate(a.ino, mode.flags(), *off, *len);
                self.record_file(ev, &a);
                e(r)
            }
            Op::SetXattr { path, name, len, tag } => {
                let a = self.resolve(path)?;
                let r = fs.setxattr(a.ino, name.as_bytes(), &xattr_value(*tag, *len), 0);
                self.record_file(ev, &a);
                e(r)
            }
            Op::RemoveXattr { path, name } => {
                let a = self.resolve(path)?;
                let r = fs.removexattr(a.ino, name.as_bytes());
                self.record_file(ev, &a);
                e(r)
            }
            Op::Chmod { path, mode } => {
                let a = self.resolve(path)?;
                let r = fs
                    .setattr(a.ino, &crate::fs::SetAttr { mode: Some(*mode), ..Default::default() })
                    .map(|_| ());
                if a.kind != FileKind::Dir {
                    self.record_file(ev, &a);
                }
                e(r)
            }
            Op::Fsync(path) | Op::Fdatasync(path) => {
                let a = self.resolve(path)?;
                let datasync = matches!(op, Op::Fdatasync(_));
                let promises = self.hist.lock().promise_fsync(Id::of(&a), datasync);
                e(fs.fsync(a.ino, datasync))?;
                let ev_end = (self.events)();
                let op = self.label(op);
                self.hist.lock().acked.push(Acked { ev_end, op, promises });
                Ok(())
            }
            // Cleaning makes nothing durable that the oracle may count on (it checkpoints only
            // when it finds a victim): no promise, only crash states in the middle of it.
            Op::Clean => e(fs.clean().map(|_| ())),
            Op::Sleep(ms) => {
                std::thread::sleep(std::time::Duration::from_millis((*ms).min(1000)));
                Ok(())
            }
            Op::Sync => {
                let promises = self.hist.lock().promise_all();
                e(fs.sync())?;
                let ev_end = (self.events)();
                let op = self.label(op);
                self.hist.lock().acked.push(Acked { ev_end, op, promises });
                Ok(())
            }
        }
    }

    fn label(&self, op: &Op) -> String {
        let n = self.hist.lock().log.len();
        format!("{op} (thread {}, op #{n})", self.thread)
    }
}
