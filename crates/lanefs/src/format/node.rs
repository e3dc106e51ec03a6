//! Node blocks: inodes, direct nodes (data block addresses), indirect nodes (node ids) and
//! xattr nodes, each a 4 KiB block with a 64-byte footer at its end.
//!
//! The footer names the node (nid, owning inode, position in the inode's tree) and carries what
//! roll-forward recovery needs: the checkpoint version it was written under, a per-lane sequence
//! number, the address of the next block in its lane's chain, and the fsync / dentry marks. An
//! inode also records its parent and its name, so an fsync of a newly created file makes its
//! name durable without a directory write (as F2FS does).

use super::codec::{seal, verify_seal, Dec, Enc};
use super::layout::{Geometry, BLOCK_SIZE};
use super::xattr::XattrNode;
use crate::error::{Error, Result, Structure};

/// Magic of a node block ("LNND").
pub const NODE_MAGIC: u32 = u32::from_le_bytes(*b"LNND");
/// Bytes of the footer at the end of every node block.
pub const FOOTER_LEN: usize = 64;
/// Where the footer starts.
pub const FOOTER_AT: usize = BLOCK_SIZE - FOOTER_LEN;
/// Bytes before the footer: the body.
pub const BODY_LEN: usize = FOOTER_AT;
/// Block addresses held in an inode (after its 512-byte attribute area and five node ids).
pub const INODE_ADDRS: usize = (BODY_LEN - INODE_ATTR_LEN - 4 * INODE_NIDS) / 4;
/// Addresses in a direct node, node ids in an indirect node.
pub const ADDRS_PER_NODE: usize = BODY_LEN / 4;
/// Node ids in an inode: two direct, two indirect, one double indirect.
pub const INODE_NIDS: usize = 5;
const INODE_ATTR_LEN: usize = 512;
const _: () = assert!(INODE_ATTR_LEN + 4 * INODE_NIDS + 4 * INODE_ADDRS <= BODY_LEN);
const _: () = assert!(FOOTER_AT + FOOTER_LEN == BLOCK_SIZE);
/// Longest name a directory entry (and an inode's name record) holds.
pub const MAX_NAME_LEN: usize = 255;
/// Address of a block allocated but never written (fallocate): reads as zeros.
pub const NEW_ADDR: u32 = u32::MAX;

/// Footer flag: written by fsync; roll-forward recovers it.
pub const FLAG_FSYNC: u16 = 1;
/// Footer flag: the inode's name record must be linked into its parent on roll-forward.
pub const FLAG_DENTRY: u16 = 2;

/// File type bits of `mode` (as in `S_IFMT`).
pub const S_IFMT: u32 = 0o170000;
const VALID_TYPES: [u32; 7] = [0o100000, 0o040000, 0o120000, 0o020000, 0o060000, 0o010000, 0o140000];

/// Seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord)]
pub struct Timespec {
    /// Seconds since the epoch (negative before it).
    pub sec: i64,
    /// Nanoseconds, below 1,000,000,000.
    pub nsec: u32,
}

impl From<std::time::SystemTime> for Timespec {
    /// Seconds and nanoseconds since the epoch; before it, `sec` is negative and `nsec` counts
    /// forward from it, as in a `struct timespec`.
    fn from(t: std::time::SystemTime) -> Timespec {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
            Err(e) => {
                let d = e.duration();
                if d.subsec_nanos() == 0 {
                    Timespec { sec: -(d.as_secs() as i64), nsec: 0 }
                } else {
                    Timespec { sec: -(d.as_secs() as i64) - 1, nsec: 1_000_000_000 - d.subsec_nanos() }
                }
            }
        }
    }
}

/// Node identity and recovery metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeFooter {
    /// The node's id.
    pub nid: u32,
    /// The inode the node belongs to (its own id for an inode).
    pub ino: u32,
    /// Position of this node in its inode's tree; 0 for the inode itself.
    pub node_ofs: u32,
    /// Node flags (none defined yet: written as 0).
    pub flags: u16,
    /// Version of the checkpoint that wrote it.
    pub cp_ver: u64,
    /// Next block of a chain through the node log (F2FS's roll-forward link; lanefs writes 0 and
    /// recovers from the journal instead).
    pub next_blkaddr: u32,
    /// The lane whose log wrote it.
    pub lane: u16,
    /// Sequence number in a node-log chain (written as 0, as `next_blkaddr`).
    pub seq: u64,
}

/// An inode's attributes and block map roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    /// Type and permission bits.
    pub mode: u32,
    /// Owner's user id.
    pub uid: u32,
    /// Owner's group id.
    pub gid: u32,
    /// Number of names.
    pub nlink: u32,
    /// Size in bytes.
    pub size: u64,
    /// Data blocks allocated to the file.
    pub blocks: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last data change.
    pub mtime: Timespec,
    /// Last inode change.
    pub ctime: Timespec,
    /// Creation time.
    pub crtime: Timespec,
    /// Device number of a device node.
    pub rdev: u64,
    /// Generation: with the number, names the inode for file handles.
    pub generation: u32,
    /// Inode flags (`FS_*_FL`, as `lsattr` shows).
    pub flags: u32,
    /// Node id of the xattr node; 0 if none.
    pub xattr_nid: u32,
    /// Parent directory's inode number when the inode was last written.
    pub parent: u32,
    /// Its name in that directory then.
    pub name: Vec<u8>,
    /// Roots of the block map: direct, indirect and double-indirect node ids.
    pub nids: [u32; INODE_NIDS],
    /// Data block addresses held in the inode itself.
    pub addrs: Vec<u32>,
}

impl Inode {
    /// A fresh inode with no blocks.
    pub fn new(mode: u32, uid: u32, gid: u32, now: Timespec) -> Inode {
        Inode {
            mode,
            uid,
            gid,
            nlink: 1,
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            rdev: 0,
            generation: 0,
            flags: 0,
            xattr_nid: 0,
            parent: 0,
            name: Vec::new(),
            nids: [0; INODE_NIDS],
            addrs: vec![0; INODE_ADDRS],
        }
    }
    /// Whether the inode is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == 0o040000
    }
}

/// What a node block holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeBody {
    /// An inode.
    Inode(Box<Inode>),
    /// `ADDRS_PER_NODE` data block addresses.
    Direct(Vec<u32>),
    /// `ADDRS_PER_NODE` child node ids.
    Indirect(Vec<u32>),
    /// Extended attributes of one inode: the set itself, or where its stream lives
    /// (`format::xattr`).
    Xattr(XattrNode),
}

impl NodeBody {
    fn kind(&self) -> u8 {
        match self {
            NodeBody::Inode(_) => 1,
            NodeBody::Direct(_) => 2,
            NodeBody::Indirect(_) => 3,
            NodeBody::Xattr(_) => 4,
        }
    }
}

/// A node block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Identity and recovery metadata.
    pub footer: NodeFooter,
    /// What the node holds.
    pub body: NodeBody,
}

fn put_time(e: &mut Enc, t: Timespec) {
    e.i64(t.sec);
    e.u32(t.nsec);
}

fn get_time(d: &mut Dec) -> Result<Timespec> {
    let t = Timespec { sec: d.i64()?, nsec: d.u32()? };
    if t.nsec >= 1_000_000_000 {
        return Err(d.err(format!("timestamp nanoseconds {} out of range", t.nsec)));
    }
    Ok(t)
}

impl Node {
    /// Encodes the node. Fails only for values no valid node holds (an oversized name or
    /// inline xattr set, a block list that does not match its stream), which callers check
    /// before they get here.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut b = vec![0u8; BLOCK_SIZE];
        let mut e = Enc::new(&mut b);
        match &self.body {
            NodeBody::Inode(i) => {
                if i.name.len() > MAX_NAME_LEN || i.addrs.len() != INODE_ADDRS {
                    return Err(Error::InvalidArgument("inode name or address map too long".into()));
                }
                e.u32(i.mode);
                e.u32(i.uid);
                e.u32(i.gid);
                e.u32(i.nlink);
                e.u64(i.size);
                e.u64(i.blocks);
                for t in [i.atime, i.mtime, i.ctime, i.crtime] {
                    put_time(&mut e, t);
                }
                e.u64(i.rdev);
                e.u32(i.generation);
                e.u32(i.flags);
                e.u32(i.xattr_nid);
                e.u32(i.parent);
                e.u16(i.name.len() as u16);
                e.bytes(&i.name);
                e.pad_to(INODE_ATTR_LEN);
                for &n in &i.nids {
                    e.u32(n);
                }
                for &a in &i.addrs {
                    e.u32(a);
                }
            }
            NodeBody::Direct(v) | NodeBody::Indirect(v) => {
                if v.len() != ADDRS_PER_NODE {
                    return Err(Error::InvalidArgument("node address array has the wrong length".into()));
                }
                for &a in v {
                    e.u32(a);
                }
            }
            NodeBody::Xattr(x) => x.encode(&mut e)?,
        }
        e.pad_to(FOOTER_AT);
        let f = &self.footer;
        e.u32(NODE_MAGIC);
        e.u32(0);
        e.u32(f.nid);
        e.u32(f.ino);
        e.u32(f.node_ofs);
        e.u8(self.body.kind());
        e.u8(0);
        e.u16(f.flags);
        e.u64(f.cp_ver);
        e.u32(f.next_blkaddr);
        e.u16(f.lane);
        e.u16(0);
        e.u64(f.seq);
        seal(&mut b, FOOTER_AT + 4);
        Ok(b)
    }

    /// Decodes just the footer after verifying magic and checksum (cheap roll-forward scans).
    pub fn decode_footer(b: &[u8], g: &Geometry, addr: Option<u64>) -> Result<(NodeFooter, u8)> {
        let s = Structure::Node;
        if b.len() != BLOCK_SIZE {
            return Err(Error::corrupt(s, addr, "short block"));
        }
        verify_seal(b, FOOTER_AT, NODE_MAGIC, FOOTER_AT + 4, s, addr)?;
        let mut d = Dec::at(b, FOOTER_AT + 8, s, addr);
        let nid = d.u32()?;
        let ino = d.u32()?;
        let node_ofs = d.u32()?;
        let kind = d.u8()?;
        let _ = d.u8()?;
        let flags = d.u16()?;
        let cp_ver = d.u64()?;
        let next_blkaddr = d.u32()?;
        let lane = d.u16()?;
        let _ = d.u16()?;
        let seq = d.u64()?;
        let f = NodeFooter { nid, ino, node_ofs, flags, cp_ver, next_blkaddr, lane, seq };
        if nid == 0 || nid > g.max_nid || ino == 0 || ino > g.max_nid {
            return Err(d.err(format!("node id {nid} / inode {ino} out of range")));
        }
        if !(1..=4).contains(&kind) {
            return Err(d.err(format!("unknown node kind {kind}")));
        }
        if (kind == 1) != (node_ofs == 0) || (kind == 1 && nid != ino) {
            return Err(d.err("node kind disagrees with its position"));
        }
        if next_blkaddr != 0 && !g.in_main(next_blkaddr as u64) {
            return Err(d.err(format!("next block {next_blkaddr} outside the main area")));
        }
        if lane as u32 >= g.lanes {
            return Err(d.err(format!("lane {lane} does not exist")));
        }
        Ok((f, kind))
    }

    /// Decodes and validates a node block against geometry `g`.
    pub fn decode(b: &[u8], g: &Geometry, addr: Option<u64>) -> Result<Node> {
        let (footer, kind) = Self::decode_footer(b, g, addr)?;
        let s = Structure::Node;
        let mut d = Dec::new(&b[..BODY_LEN], s, addr);
        let read_addr = |d: &mut Dec| -> Result<u32> {
            let a = d.u32()?;
            if a != 0 && a != NEW_ADDR && !g.in_main(a as u64) {
                return Err(d.err(format!("data address {a} outside the main area")));
            }
            Ok(a)
        };
        let read_nid = |d: &mut Dec| -> Result<u32> {
            let n = d.u32()?;
            if n > g.max_nid {
                return Err(d.err(format!("child node id {n} out of range")));
            }
            Ok(n)
        };
        let body = match kind {
            1 => {
                let mode = d.u32()?;
                if !VALID_TYPES.contains(&(mode & S_IFMT)) {
                    return Err(d.err(format!("mode {mode:o} has no valid file type")));
                }
                let (uid, gid, nlink) = (d.u32()?, d.u32()?, d.u32()?);
                let (size, blocks) = (d.u64()?, d.u64()?);
                let (atime, mtime, ctime, crtime) =
                    (get_time(&mut d)?, get_time(&mut d)?, get_time(&mut d)?, get_time(&mut d)?);
                let rdev = d.u64()?;
                let (generation, flags) = (d.u32()?, d.u32()?);
                let xattr_nid = read_nid(&mut d)?;
                let parent = read_nid(&mut d)?;
                let name_len = d.u16()? as usize;
                if name_len > MAX_NAME_LEN {
                    return Err(d.err(format!("name length {name_len} over {MAX_NAME_LEN}")));
                }
                let name = d.bytes(name_len)?.to_vec();
                d.skip_to(INODE_ATTR_LEN)?;
                let mut nids = [0u32; INODE_NIDS];
                for n in nids.iter_mut() {
                    *n = read_nid(&mut d)?;
                }
                let mut addrs = Vec::with_capacity(INODE_ADDRS);
                for _ in 0..INODE_ADDRS {
                    addrs.push(read_addr(&mut d)?);
                }
                NodeBody::Inode(Box::new(Inode {
                    mode,
                    uid,
                    gid,
                    nlink,
                    size,
                    blocks,
                    atime,
                    mtime,
                    ctime,
                    crtime,
                    rdev,
                    generation,
                    flags,
                    xattr_nid,
                    parent,
                    name,
                    nids,
                    addrs,
                }))
            }
            2 | 3 => {
                let mut v = Vec::with_capacity(ADDRS_PER_NODE);
                for _ in 0..ADDRS_PER_NODE {
                    v.push(if kind == 2 { read_addr(&mut d)? } else { read_nid(&mut d)? });
                }
                if kind == 2 {
                    NodeBody::Direct(v)
                } else {
                    NodeBody::Indirect(v)
                }
            }
            _ => NodeBody::Xattr(XattrNode::decode(&mut d, g)?),
        };
        Ok(Node { footer, body })
    }
}
