//! Inodes loaded from disk on first use: the mnode of an inode not in the cells is built from
//! its node tree, its directory blocks and its xattr node.
//!
//! Loading races are settled by the cells: two threads may load the same inode, and the first
//! insert wins, so every user sees one mnode per inode.

use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::diskdir::DiskDir;
use crate::error::{Error, Result};
use crate::format::dentry::DentryBlock;
use crate::format::tree::XATTR_NODE_OFS;
use crate::format::xattr::{self, XattrNode};
use crate::mem::cowmap::CowMap;
use crate::mem::mnode::{DiskState, MNode, Meta, XattrDisk, S_IFDIR, S_IFLNK};
use crate::mem::xattr::{XattrSet, XattrState};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Engine;

impl Engine {
    /// Runs `f` on the mnode of `ino` without taking a reference (no shared store when it is
    /// cached: `Cells::with`); loads it first if it is not. `f` runs pinned: keep it short and
    /// lock-free. The caller holds the pass-through semaphore or the gate: an inode still
    /// owed to the checkpoint in progress is captured before `f` sees it
    /// (`Engine::capture_if_owed`).
    #[inline]
    pub(crate) fn with_mnode<R>(&self, ino: u32, f: impl FnOnce(&Arc<MNode>) -> R) -> Result<R> {
        let mut f = Some(f);
        let cached = self.mem.cells.with(ino as u64, |m| {
            self.capture_if_owed(m);
            (f.take().expect("called once"))(m)
        });
        if let Some(r) = cached {
            return Ok(r);
        }
        let m = self.mnode(ino)?;
        Ok((f.take().expect("not called"))(&m))
    }

    /// The mnode of `ino`, loading it from disk on first use; captured first if it is still
    /// owed to the checkpoint in progress (as [`Engine::with_mnode`]).
    pub(crate) fn mnode(&self, ino: u32) -> Result<Arc<MNode>> {
        if let Some(m) = self.mem.cells.get(ino as u64) {
            self.capture_if_owed(&m);
            return Ok(m);
        }
        let m = self.load_mnode(ino)?;
        let m = self.mem.cells.insert_if_absent(ino as u64, || m).0;
        // Another thread's load, or a create, may have won the insert.
        self.capture_if_owed(&m);
        Ok(m)
    }

    fn load_mnode(&self, ino: u32) -> Result<MNode> {
        let e = self.disk.nat.get(ino);
        if e.is_free() || e.ino != ino {
            return Err(Error::errno(libc::ENOENT, format!("inode {ino}")));
        }
        let (inode, map, tree) = crate::node::read_inode(&*self.disk.dev, &self.disk.g, &self.disk.nat, ino)?;
        let (xattrs, xattr_disk) = self.read_xattrs(ino, inode.xattr_nid)?;
        let meta = Meta {
            mode: inode.mode,
            uid: inode.uid,
            gid: inode.gid,
            nlink: inode.nlink,
            crtime: inode.crtime,
            rdev: inode.rdev,
            generation: inode.generation,
            xattrs: XattrState { set: Arc::new(xattrs), ..Default::default() },
            symlink: Vec::new(),
        };
        let mut disk = DiskState::new(self.mem.cache.clone());
        disk.tree = Some(tree);
        disk.cur_map = CowMap::from(&map);
        disk.tree_map = map;
        disk.xattr = xattr_disk;
        // Unwritten blocks of the checkpoint: its count holds them already.
        for (&idx, _) in disk.cur_map.iter().filter(|(_, &a)| a == crate::format::node::NEW_ADDR) {
            disk.reserved.adopt(idx);
        }
        let is_dir = inode.mode & crate::format::node::S_IFMT == S_IFDIR;
        let is_link = inode.mode & crate::format::node::S_IFMT == S_IFLNK;
        let addrs: Vec<(u64, u32)> = disk.cur_map.iter().map(|(&i, &a)| (i, a)).collect();
        let mut meta = meta;
        let m_size;
        let mut dir_entries = Vec::new();
        if is_dir {
            let bufs = crate::checkpoint::read_blocks(
                &*self.disk.dev,
                &addrs.iter().map(|a| a.1 as u64).collect::<Vec<_>>(),
            )?;
            let mut blocks = Vec::with_capacity(addrs.len());
            for ((_, addr), b) in addrs.iter().zip(bufs.chunks(BLOCK_SIZE)) {
                let db = DentryBlock::decode(b, ino, self.disk.g.max_nid, Some(*addr as u64))?;
                dir_entries.extend(db.entries.iter().cloned());
                blocks.push(db);
            }
            disk.dentries = Some(DiskDir::load(blocks));
            m_size = inode.size;
        } else if is_link {
            let len = inode.size as usize;
            if len == 0 || len > crate::journal::MAX_SYMLINK_LEN || addrs.first().map(|a| a.0) != Some(0) {
                return Err(Error::corrupt(
                    crate::error::Structure::Node,
                    None,
                    format!("symlink {ino} has no target"),
                ));
            }
            let mut b = vec![0u8; BLOCK_SIZE];
            self.disk.dev.read_block(addrs[0].1 as u64, &mut b)?;
            meta.symlink = b[..len].to_vec();
            m_size = inode.size;
        } else {
            m_size = inode.size;
        }
        let stamps = crate::mem::mnode::Stamps {
            atime: inode.atime,
            mtime: inode.mtime,
            ctime: inode.ctime,
            flags: inode.flags,
        };
        let m = MNode::new(ino, meta, m_size, stamps, &self.mem.cache);
        {
            let mut d = m.disk.lock();
            *d = disk;
            m.note_reserved(&d);
        }
        if let Some(d) = m.dir() {
            for e in dir_entries {
                // Entries were validated by the decoder; duplicates would be corruption.
                if d.map.insert_loaded(&e.name, e.ino, e.file_type).is_err() {
                    return Err(Error::corrupt(
                        crate::error::Structure::Dentry,
                        None,
                        format!("directory {ino} holds a name twice"),
                    ));
                }
            }
        }
        // A directory's "..", and for any inode the directory of its latest name
        // (`Fs::name_of`).
        m.parent.store(inode.parent, Ordering::Relaxed);
        Ok(m)
    }

    /// Reads inode `ino`'s xattrs from its xattr node (and the blocks it lists).
    fn read_xattrs(&self, ino: u32, xattr_nid: u32) -> Result<(XattrSet, XattrDisk)> {
        if xattr_nid == 0 {
            return Ok(Default::default());
        }
        let e = self.disk.nat.get(xattr_nid);
        if e.is_free() || e.ino != ino {
            return Err(Error::corrupt(
                crate::error::Structure::Nat,
                None,
                format!("xattr node {xattr_nid} of inode {ino} missing"),
            ));
        }
        let at = Some(e.block_addr as u64);
        let mut b = vec![0u8; BLOCK_SIZE];
        self.disk.dev.read_block(e.block_addr as u64, &mut b)?;
        let node = crate::format::Node::decode(&b, &self.disk.g, at)?;
        let f = node.footer;
        if f.nid != xattr_nid || f.ino != ino || f.node_ofs != XATTR_NODE_OFS {
            return Err(Error::corrupt(
                crate::error::Structure::Node,
                at,
                format!(
                    "xattr node {xattr_nid} of inode {ino}: footer names node {} of inode {}",
                    f.nid, f.ino
                ),
            ));
        }
        let disk = XattrDisk { nid: xattr_nid, ..Default::default() };
        match node.body {
            crate::format::NodeBody::Xattr(XattrNode::Inline(a)) => Ok((XattrSet::from_entries(a), disk)),
            crate::format::NodeBody::Xattr(XattrNode::Blocks { stream_len, stream_crc, addrs }) => {
                let bufs = crate::checkpoint::read_blocks(
                    &*self.disk.dev,
                    &addrs.iter().map(|&a| a as u64).collect::<Vec<_>>(),
                )?;
                let mut payloads = Vec::with_capacity(addrs.len());
                for (i, (&a, blk)) in addrs.iter().zip(bufs.chunks(BLOCK_SIZE)).enumerate() {
                    payloads.push(xattr::decode_block(blk, ino, i as u32, Some(a as u64))?);
                }
                let stream = xattr::join_stream(payloads, stream_len, stream_crc, at)?;
                let set = XattrSet::from_entries(xattr::decode_stream(&stream, at)?);
                Ok((set, XattrDisk { blocks: addrs, stream, ..disk }))
            }
            _ => Err(Error::corrupt(crate::error::Structure::Node, at, "not an xattr node")),
        }
    }
}
