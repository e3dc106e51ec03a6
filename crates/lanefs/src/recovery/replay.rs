//! Mount's last phase: the kept records applied to MEMFS, in stamp order, on one thread.
//!
//! A record that refers to what does not exist, or to a name that no longer names its inode,
//! is skipped: it was absorbed or superseded before its dependent was journaled. Everything
//! replayed is marked dirty, so the checkpoint that ends recovery makes it durable.

use crate::device::BLOCK_SIZE;
use crate::engine::Engine;
use crate::error::Result;
use crate::format::node::NEW_ADDR;
use crate::journal::{InodeAttr, Record};
use crate::mem::mnode::{ts_to_ns, MNode, Meta, S_IFDIR};
use crate::mem::xattr::XattrSet;
use crate::oplog::dirlog::LoggedOp;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Replays `records` (in replay order) into MEMFS.
pub(super) fn replay_all(engine: &Engine, records: &[Record]) -> Result<()> {
    // Replay order: by stamp, and only what the checkpoint does not hold already (replaying
    // an older record would undo what the checkpoint made durable after it).
    debug_assert!(records.windows(2).all(|w| w[0].stamp() <= w[1].stamp()), "records out of stamp order");
    let cp_stamp = engine.ckpt.cp.lock().cp.stamp;
    debug_assert!(
        records.iter().all(|r| r.stamp().ticks > cp_stamp),
        "a record older than checkpoint {cp_stamp}"
    );
    for r in records {
        engine.replay(r)?;
    }
    Ok(())
}

/// Marks dirty the checkpoint's orphans that no replayed record linked again, so the
/// checkpoint that ends recovery deletes them; returns how many.
pub(super) fn mark_orphans(engine: &Engine, orphans: Vec<u32>) -> usize {
    let listed = orphans.len();
    let mut removed = 0;
    for o in orphans {
        if let Ok(m) = engine.mnode(o) {
            if m.meta.lock().nlink == 0 {
                engine.mem.mark_dirty(&m);
                removed += 1;
            }
        }
    }
    debug_assert!(removed <= listed, "{removed} orphans removed of {listed}");
    removed
}

impl Engine {
    /// Applies one journal record to MEMFS (recovery; single-threaded, before mount returns).
    /// Records that refer to what does not exist are skipped: the only way to get them is an
    /// operation absorbed or superseded before its dependent was journaled.
    fn replay(&self, r: &Record) -> Result<()> {
        // Both checks ran when the record was decoded (chain walk or region reader): what
        // replay indexes by a record's numbers is inside the image.
        debug_assert!(r.validate().is_ok(), "replay of an invalid record {r:?}");
        debug_assert!(
            r.validate_geometry(&self.disk.g).is_ok(),
            "replay of a record outside the image {r:?}"
        );
        match r {
            Record::Create { dir, name, ino, attr, symlink, .. } => {
                self.replay_create(r, *dir, name, *ino, attr, symlink)
            }
            Record::Link { dir, name, ino, file_type, .. } => {
                self.replay_link(r, *dir, name, *ino, *file_type)
            }
            Record::Unlink { dir, name, ino, .. } => self.replay_unlink(r, *dir, name, *ino),
            Record::Rename { .. } => self.replay_rename(r),
            Record::SetAttr { ino, attr, .. } => self.replay_setattr(*ino, attr),
            Record::Map { ino, first, entries, .. } => return self.replay_map(*ino, *first, entries),
            Record::Truncate { ino, from_block, .. } => self.replay_truncate(*ino, *from_block),
            Record::Xattrs { ino, attrs, .. } => self.replay_xattrs(*ino, attrs),
            Record::SetXattr { ino, name, value, .. } => self.replay_xattr(*ino, name, Some(value)),
            Record::RemoveXattr { ino, name, .. } => self.replay_xattr(*ino, name, None),
            Record::Free { .. } => {}
            Record::Data { ino, idx, data, .. } => self.replay_data(*ino, *idx, data),
        }
        Ok(())
    }

    /// A create: the new inode and its name, unless either exists already.
    fn replay_create(&self, r: &Record, dir: u32, name: &[u8], ino: u32, attr: &InodeAttr, symlink: &[u8]) {
        let Ok(d) = self.dir_mnode(dir) else { return };
        if self.replay_new_inode(&d, name, ino, attr, symlink) || self.replay_adopt(&d, name, ino, attr) {
            // Single-threaded: whichever way it went, the name is the created inode's now.
            debug_assert_eq!(
                d.dir().expect("dir").map.lookup(name).map(|e| e.ino),
                Some(ino),
                "created name"
            );
            debug_assert!(self.mem.cells.get(ino as u64).is_some(), "created inode {ino} has no cell");
            self.replayed(&d, r);
        }
    }

    /// The first link of an O_TMPFILE inode that the checkpoint holds as an orphan (taken
    /// before the link; `mem::ops::tmpfile`): the orphan gets the name and keeps what the
    /// checkpoint wrote, and the transaction's later records bring it up to date. No other
    /// create names an inode the checkpoint has: a created inode's number was free in it.
    fn replay_adopt(&self, d: &MNode, name: &[u8], ino: u32, attr: &InodeAttr) -> bool {
        let dm = d.dir().expect("dir");
        if dm.map.lookup(name).is_some() || !self.ckpt.cp.lock().cp.orphans.contains(&ino) {
            return false;
        }
        let Ok(m) = self.mnode(ino) else { return false };
        // The cell found is the orphan's: the checkpoint named it, not a number reused.
        debug_assert_eq!(m.ino, ino, "orphan {ino}: the cell of another inode");
        if m.file_type != attr.mode & crate::format::node::S_IFMT || m.is_dir() {
            return false;
        }
        {
            let mut meta = m.meta.lock();
            if meta.nlink != 0 {
                return false;
            }
            meta.nlink = 1;
        }
        m.parent.store(d.ino, Ordering::Relaxed);
        let _ = dm.map.insert(name, ino, crate::format::dentry::dtype_of(attr.mode));
        // A link count of 1 again: the checkpoint that ends recovery keeps the orphan.
        debug_assert_eq!(m.meta.lock().nlink, 1, "adopted orphan {ino}");
        self.mem.mark_dirty(&m);
        true
    }

    /// A hard link: one more name, and one more link, for an inode that exists.
    fn replay_link(&self, r: &Record, dir: u32, name: &[u8], ino: u32, file_type: u8) {
        let (Ok(d), Ok(m)) = (self.dir_mnode(dir), self.mnode(ino)) else { return };
        // The link count raised is the named inode's.
        debug_assert_eq!(m.ino, ino, "link of {ino}: the cell of another inode");
        let dm = d.dir().expect("dir");
        if dm.map.insert(name, ino, file_type).is_ok() {
            // Single-threaded: the name inserted is the linked inode's now.
            debug_assert_eq!(
                dm.map.lookup(name).map(|e| e.ino),
                Some(ino),
                "link of {ino}: name not inserted"
            );
            m.add_nlink(1);
            self.replayed(&d, r);
            self.mem.mark_dirty(&m);
        }
    }

    /// An unlink: the name goes only if it still names `ino`.
    fn replay_unlink(&self, r: &Record, dir: u32, name: &[u8], ino: u32) {
        let Ok(d) = self.dir_mnode(dir) else { return };
        let dm = d.dir().expect("dir");
        if dm.map.lookup(name).map(|e| e.ino) != Some(ino) {
            return;
        }
        dm.map.remove(name);
        // Single-threaded: nothing puts the name back before the link count follows it.
        debug_assert!(dm.map.lookup(name).is_none(), "unlink of {ino}: name still there");
        if let Ok(m) = self.mnode(ino) {
            // The link count dropped is the inode the name named.
            debug_assert_eq!(m.ino, ino, "unlink of {ino}: the cell of another inode");
            self.unlinked(&d, &m);
        }
        self.replayed(&d, r);
    }

    /// A rename (an exchange, or a move that may replace the target and leave a whiteout),
    /// applied only while the source name still names the inode renamed.
    fn replay_rename(&self, r: &Record) {
        let Record::Rename {
            src_dir, src_name, dst_dir, dst_name, ino, replaced, exchange, whiteout, ..
        } = r
        else {
            unreachable!("replay_rename of {r:?}");
        };
        let (Ok(sd), Ok(dd)) = (self.dir_mnode(*src_dir), self.dir_mnode(*dst_dir)) else { return };
        let (sm, dm) = (sd.dir().expect("dir"), dd.dir().expect("dir"));
        let Some(se) = sm.map.lookup(src_name).filter(|e| e.ino == *ino) else { return };
        let de = dm.map.lookup(dst_name);
        let Ok(src) = self.mnode(*ino) else { return };
        if *exchange {
            let Some(de) = de.filter(|e| e.ino == *replaced) else { return };
            sm.map.update(src_name, |_| (Some((de.ino, de.file_type)), ()));
            dm.map.update(dst_name, |_| (Some((se.ino, se.file_type)), ()));
            if let Ok(other) = self.mnode(*replaced) {
                // Every inode keeps the directory of its latest name (`Fs::name_of`).
                other.parent.store(*src_dir, Ordering::Relaxed);
                if other.is_dir() && src_dir != dst_dir {
                    dd.add_nlink(-1);
                    sd.add_nlink(1);
                }
                self.mem.mark_dirty(&other);
            }
        } else {
            if let Some(de) = de {
                if let Ok(old) = self.mnode(de.ino) {
                    self.unlinked(&dd, &old);
                }
            }
            sm.map.remove(src_name);
            dm.map.update(dst_name, |_| (Some((se.ino, se.file_type)), ()));
            if let Some(w) = whiteout {
                // The rename made it: the source name is free again just now.
                self.replay_new_inode(&sd, src_name, w.ino, &w.attr, &[]);
            }
        }
        src.parent.store(*dst_dir, Ordering::Relaxed);
        if src.is_dir() && src_dir != dst_dir {
            sd.add_nlink(-1);
            dd.add_nlink(1);
        }
        // The destination names the inode moved (unless a whiteout took the very same name);
        // an exchange leaves the other one at the source.
        debug_assert!(
            (src_dir == dst_dir && src_name == dst_name && whiteout.is_some())
                || dm.map.lookup(dst_name).map(|e| e.ino) == Some(*ino),
            "rename of {ino}: destination not updated"
        );
        debug_assert!(
            !*exchange || sm.map.lookup(src_name).map(|e| e.ino) == Some(*replaced),
            "exchange of {ino}: source not updated"
        );
        self.replayed(&sd, r);
        if src_dir != dst_dir {
            self.replayed(&dd, r);
        }
        self.mem.mark_dirty(&src);
    }

    /// A setattr: the attributes as the fsync saw them (the file type bits stay; a directory's
    /// size is its own).
    fn replay_setattr(&self, ino: u32, attr: &InodeAttr) {
        let Ok(m) = self.mnode(ino) else { return };
        // The attributes go to the inode the record names, nobody else's.
        debug_assert_eq!(m.ino, ino, "setattr of {ino}: the cell of another inode");
        {
            let mut meta = m.meta.lock();
            // A setattr never changes what an inode is: the type bits kept are the cell's.
            debug_assert_eq!(
                meta.mode & crate::format::node::S_IFMT,
                m.file_type,
                "inode {ino}: mode and cell disagree"
            );
            meta.mode = (meta.mode & crate::format::node::S_IFMT) | (attr.mode & 0o7777);
            meta.uid = attr.uid;
            meta.gid = attr.gid;
            meta.crtime = attr.crtime;
            meta.rdev = attr.rdev;
            meta.generation = attr.generation;
        }
        m.atime.store(ts_to_ns(attr.atime), Ordering::Relaxed);
        m.flags.store(attr.flags, Ordering::Release);
        if !m.is_dir() {
            m.size.store(attr.size, Ordering::Release);
        }
        m.mtime.store(ts_to_ns(attr.mtime), Ordering::Relaxed);
        m.ctime.store(ts_to_ns(attr.ctime), Ordering::Relaxed);
        self.mem.mark_dirty(&m);
    }

    /// A map: blocks `first..` of `ino` now at `entries`' addresses (0 a hole, `NEW_ADDR`
    /// preallocated); each block installed becomes valid in the segment table.
    fn replay_map(&self, ino: u32, first: u64, entries: &[(u32, u32)]) -> Result<()> {
        // `validate` bounds the run: its indexes fit the node tree, and it is short.
        debug_assert!(
            !entries.is_empty()
                && entries.len() <= crate::journal::record::MAP_RUN_MAX
                && first + entries.len() as u64 <= crate::journal::record::MAX_FILE_BLOCKS,
            "map of {ino} at {first}, {} entries",
            entries.len()
        );
        let Ok(m) = self.mnode(ino) else { return Ok(()) };
        let pages = m.pages().map(|(p, _)| p);
        let mut disk = m.disk.lock();
        for (i, &(addr, _)) in entries.iter().enumerate() {
            let idx = first + i as u64;
            // Newer than a page an earlier record logged inline: the block wins.
            if let Some(p) = pages {
                p.truncate_one(idx);
            }
            if addr == 0 {
                disk.remap(idx, 0);
            } else if addr == NEW_ADDR {
                // Through remap, so the block it replaces is let go like any other.
                disk.remap(idx, NEW_ADDR);
            } else {
                if disk.cur_map.get(&idx) == Some(&addr) {
                    continue;
                }
                // The chain walk and the region's reader checked every address against the
                // geometry (`Transaction::validate_geometry`) before it got here.
                debug_assert!(self.disk.g.in_main(addr as u64), "map of {ino} to block {addr}");
                // Installed: live from now on (its segment was kept out of the free map).
                self.disk.table.claim_valid(addr as u64, 0)?;
                disk.remap(idx, addr);
            }
        }
        m.note_reserved(&disk);
        drop(disk);
        self.mem.mark_dirty(&m);
        Ok(())
    }

    /// A truncate: blocks from `from_block` on are let go, on the device and in the cache.
    fn replay_truncate(&self, ino: u32, from_block: u64) {
        debug_assert!(
            from_block <= crate::journal::record::MAX_FILE_BLOCKS,
            "truncate of {ino} at {from_block}"
        );
        let Ok(m) = self.mnode(ino) else { return };
        debug_assert_eq!(m.ino, ino, "truncate of {ino}: the cell of another inode");
        {
            let mut disk = m.disk.lock();
            disk.truncate(from_block);
            m.note_reserved(&disk);
        }
        if let Some((p, _)) = m.pages() {
            p.truncate(from_block);
        }
        self.mem.mark_dirty(&m);
    }

    /// A whole xattr set (the record older images wrote): replaces the inode's set.
    fn replay_xattrs(&self, ino: u32, attrs: &[(Vec<u8>, Vec<u8>)]) {
        let Ok(m) = self.mnode(ino) else { return };
        debug_assert_eq!(m.ino, ino, "xattrs of {ino}: the cell of another inode");
        let mut meta = m.meta.lock();
        let x = &mut meta.xattrs;
        let old: Vec<Vec<u8>> = x.set.names().map(<[u8]>::to_vec).collect();
        x.set = Arc::new(XattrSet::from_entries(attrs.to_vec()));
        // `validate` rules out a name twice, so the set holds every attribute of the record.
        debug_assert_eq!(x.set.names().len(), attrs.len(), "xattr set of {ino}");
        for n in old.iter().chain(attrs.iter().map(|(n, _)| n)) {
            self.mem.xattr_changed(x, n);
        }
        drop(meta);
        self.mem.mark_dirty(&m);
    }

    /// One xattr set to `value`, or removed (`None`).
    ///
    /// Not checked against the per-inode limit: within one transaction the records come in
    /// name order, not in the order the changes were made, so a set may pass through a larger
    /// size than it ever had; after the whole transaction it is the set the fsync saw.
    fn replay_xattr(&self, ino: u32, name: &[u8], value: Option<&Vec<u8>>) {
        debug_assert!(
            !name.is_empty() && name.len() <= u8::MAX as usize,
            "xattr name of {} bytes",
            name.len()
        );
        let Ok(m) = self.mnode(ino) else { return };
        let mut meta = m.meta.lock();
        let x = &mut meta.xattrs;
        match value {
            Some(v) => {
                Arc::make_mut(&mut x.set).set(name, v.clone());
            }
            None => {
                Arc::make_mut(&mut x.set).remove(name);
            }
        }
        // The set holds exactly what the record says of this name.
        debug_assert_eq!(x.set.get(name), value.map(Vec::as_slice), "xattr of {ino} after replay");
        self.mem.xattr_changed(x, name);
        drop(meta);
        self.mem.mark_dirty(&m);
    }

    /// A page logged inline: a dirty page, which the checkpoint that ends recovery writes to
    /// the device. Written over a preallocated block, it draws on the reservation.
    fn replay_data(&self, ino: u32, idx: u64, data: &[u8; BLOCK_SIZE]) {
        debug_assert!(idx < crate::journal::record::MAX_FILE_BLOCKS, "data of {ino} at block {idx}");
        let Ok(m) = self.mnode(ino) else { return };
        let Some((p, _)) = m.pages() else { return };
        m.disk.lock().draw(idx);
        let whole = p.write(idx, 0, &data[..], None);
        debug_assert!(whole, "a logged page is a whole page");
        self.mem.mark_dirty(&m);
    }

    /// A new inode `ino` named `name` in directory `d` (a create, or a rename's whiteout), with
    /// link count 1 (2 for a directory). False, and nothing done, when the name is taken or the
    /// inode exists already (the record was superseded).
    fn replay_new_inode(&self, d: &MNode, name: &[u8], ino: u32, attr: &InodeAttr, symlink: &[u8]) -> bool {
        // A node id the NAT can hold (`validate_geometry` ran on the record).
        debug_assert!(ino != 0 && ino <= self.disk.g.max_nid, "new inode {ino} in {}", d.ino);
        let dm = d.dir().expect("dir");
        if dm.map.lookup(name).is_some() || self.mem.cells.get(ino as u64).is_some() {
            return false;
        }
        if self.disk.nat.reserve(ino).is_err() {
            return false;
        }
        let is_dir = attr.mode & crate::format::node::S_IFMT == S_IFDIR;
        let meta = Meta {
            mode: attr.mode,
            uid: attr.uid,
            gid: attr.gid,
            nlink: if is_dir { 2 } else { 1 },
            crtime: attr.crtime,
            rdev: attr.rdev,
            generation: attr.generation,
            xattrs: Default::default(),
            symlink: symlink.to_vec(),
        };
        let stamps = crate::mem::mnode::Stamps {
            atime: attr.atime,
            mtime: attr.mtime,
            ctime: attr.ctime,
            flags: attr.flags,
        };
        let m = MNode::new(ino, meta, attr.size, stamps, &self.mem.cache);
        m.parent.store(d.ino, Ordering::Relaxed);
        if is_dir {
            m.disk.lock().dentries = Some(Default::default());
            d.add_nlink(1);
        }
        let (m, _) = self.mem.cells.insert_if_absent(ino as u64, || m);
        let _ = dm.map.insert(name, ino, crate::format::dentry::dtype_of(attr.mode));
        // Single-threaded: the name and the number checked free above are this inode's now.
        debug_assert!(m.ino == ino && dm.map.lookup(name).map(|e| e.ino) == Some(ino), "new inode {ino}");
        self.mem.mark_dirty(&m);
        true
    }

    /// A name of `m` in `d` went away during replay.
    fn unlinked(&self, d: &Arc<MNode>, m: &Arc<MNode>) {
        // Names live in directories (`dir_mnode`): the link count dropped below is a child's.
        debug_assert!(d.is_dir(), "{} unlinked from non-directory {}", m.ino, d.ino);
        // One inode's meta at a time (sync::rank: `Meta` does not nest).
        let mut meta = m.meta.lock();
        let was_dir = m.is_dir();
        if was_dir {
            meta.nlink = 0;
        } else {
            meta.nlink = meta.nlink.saturating_sub(1);
        }
        drop(meta);
        if was_dir {
            d.add_nlink(-1);
        }
        self.mem.mark_dirty(m);
    }

    /// Logs a replayed operation in `d` (journaled already) so the checkpoint rewrites its names.
    fn replayed(&self, d: &Arc<MNode>, r: &Record) {
        // `dir_mnode` gave it: a directory, whose log the checkpoint rewrites names from.
        debug_assert!(d.is_dir(), "{r:?} logged in non-directory {}", d.ino);
        // Only namespace records are logged in a directory, and only after the checkpoint's.
        debug_assert!(
            matches!(
                r,
                Record::Create { .. } | Record::Link { .. } | Record::Unlink { .. } | Record::Rename { .. }
            ),
            "{r:?} logged in directory {}",
            d.ino
        );
        let op = LoggedOp::new(r.clone());
        op.journaled.store(true, Ordering::Relaxed);
        d.dir().expect("dir").log.push(op);
        self.mem.mark_dirty(d);
    }
}
