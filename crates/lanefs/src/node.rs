//! One inode's node tree: reading it whole, and rewriting only the nodes whose content changed.
//!
//! Job. A file's block map (logical block -> data block address) is held by its inode node and
//! up to five subtrees of direct and indirect nodes (shape in [`crate::format::tree`]).
//! [`read_inode`] loads the inode and its whole tree level by level, one batched read per level;
//! [`write_inode`] turns a new block map into node blocks, allocating node ids and log blocks
//! only for nodes that are new or whose content changed, and hands the encoded blocks back so
//! that the caller submits them in one scatter-gather batch with its data blocks.
//!
//! Invariants:
//! - Indirect nodes hold node *ids*, not addresses, so rewriting a child never forces its
//!   parent to be rewritten (that is what the NAT is for). A parent changes only when a child
//!   appears or disappears.
//! - Every node block written carries a footer naming its nid, its inode and its position
//!   (`node_ofs`), and is summarised in the SSA as `(Node, nid, node_ofs)`; the NAT maps each
//!   written nid to its new block, and the block it replaced is invalid in the SIT.
//! - A node that is no longer needed is invalidated in the SIT, its NAT entry is freed, and its
//!   id is freed (reusable after the next checkpoint).
//! - Nothing read from disk can make this module panic: every child is checked for kind,
//!   owner, id and position before it is used, and a bad node is a `Corrupt` error naming it.
//! - `write_inode` is all or nothing for the in-memory tables: everything that can fail (input
//!   checks, id and block allocation) happens before anything is invalidated or remapped, and
//!   a failed allocation gives back what it took.
//!
//! Callers serialize `write_inode` / `drop_inode` per inode, and write the returned blocks
//! before the next checkpoint takes the NAT (the checkpoint drains in-flight operations).

use crate::device::{BlockDevice, ReadReq, BLOCK_SIZE};
use crate::error::{Error, Result, Structure};
use crate::format::layout::{Geometry, LogType};
use crate::format::node::{ADDRS_PER_NODE, INODE_ADDRS, INODE_NIDS, MAX_NAME_LEN, NEW_ADDR, S_IFMT};
use crate::format::tree::{locate, BlockLoc, NodePos, MAX_FILE_BLOCKS};
use crate::format::{Inode, NatEntry, Node, NodeBody, NodeFooter, SummaryEntry, SummaryKind};
use crate::nat::NatTable;
use crate::seg::LaneSet;
use std::collections::{BTreeMap, HashSet};

/// Logical block index -> data block address. Only non-zero entries; [`NEW_ADDR`] means
/// allocated but never written (reads as zeros).
pub type BlockMap = BTreeMap<u64, u32>;

/// Encoded node blocks for the caller to write: (block address, 4 KiB block).
pub type NodeBlocks = Vec<(u64, Vec<u8>)>;

/// Node blocks read per device submission (bounds one request list, 16 MiB of buffers).
const READ_CHUNK: usize = 4096;

/// File types an inode may have (mirrors the decoder's check, so that nothing written here
/// fails to decode).
const VALID_TYPES: [u32; 7] = [0o100000, 0o040000, 0o120000, 0o020000, 0o060000, 0o010000, 0o140000];

/// A direct or indirect node of a tree as last read or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeNode {
    /// The node's id.
    pub nid: u32,
    /// Block the node was written to.
    pub addr: u32,
    /// The `ADDRS_PER_NODE` entries it holds: data addresses (direct) or child ids (indirect).
    pub slots: Box<[u32]>,
}

/// The nodes of one inode's tree (the inode itself excluded) and where they live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeTree {
    /// The inode's number (its node id).
    pub ino: u32,
    /// Block of the inode node; 0 if the inode was never written.
    pub inode_addr: u32,
    nodes: BTreeMap<NodePos, TreeNode>,
    /// Nodes the next [`write_inode`] rewrites even if their content is unchanged: the
    /// cleaner moves them out of a victim segment this way.
    relocate: std::collections::BTreeSet<NodePos>,
}

impl InodeTree {
    /// The tree of an inode not yet written (its id freshly allocated).
    pub fn empty(ino: u32) -> InodeTree {
        InodeTree { ino, inode_addr: 0, nodes: BTreeMap::new(), relocate: Default::default() }
    }

    /// Asks the next [`write_inode`] to move node `nid` (at position `node_ofs`) to a new
    /// block. Returns false if the tree holds no such node there. (The inode node itself moves
    /// on every write.)
    pub fn relocate(&mut self, nid: u32, node_ofs: u32) -> bool {
        let pos = self.nodes.iter().find(|(p, n)| n.nid == nid && p.node_ofs() == node_ofs).map(|(p, _)| *p);
        match pos {
            Some(p) => self.relocate.insert(p),
            None => false,
        }
    }

    /// Direct and indirect nodes in the tree.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The node at `pos`, if the tree has one.
    pub fn node(&self, pos: NodePos) -> Option<&TreeNode> {
        self.nodes.get(&pos)
    }

    /// Every direct and indirect node, in position order.
    pub fn nodes(&self) -> impl Iterator<Item = (NodePos, &TreeNode)> + '_ {
        self.nodes.iter().map(|(p, n)| (*p, n))
    }
}

/// What `write_inode` and `drop_inode` need: the tables they update and where new node blocks
/// go. (No device: nothing here writes; the caller submits the returned blocks.)
pub struct NodeWriter<'a> {
    /// The image's geometry.
    pub g: &'a Geometry,
    /// The NAT the writes update.
    pub nat: &'a NatTable,
    /// The lanes whose node logs the blocks go to.
    pub lanes: &'a LaneSet,
    /// Lane whose node log receives the blocks (also recorded in each footer).
    pub lane: u32,
    /// CPU index for the node id caches.
    pub cpu: usize,
    /// Checkpoint version the blocks are written under (footer `cp_ver`).
    pub cp_ver: u64,
    /// Segment modification time for the SIT (seconds of file-system lifetime).
    pub mtime: u64,
}

/// The parent of a non-root position and the slot that names it there.
fn parent_of(pos: NodePos) -> Option<(NodePos, usize)> {
    match (pos.child, pos.grandchild) {
        (Some(c), Some(g)) => {
            Some((NodePos { root: pos.root, child: Some(c), grandchild: None }, g as usize))
        }
        (Some(c), None) => Some((NodePos::root(pos.root), c as usize)),
        _ => None,
    }
}

/// A corruption error naming node `nid` of inode `ino` at `pos`.
fn node_corrupt(ino: u32, nid: u32, pos: NodePos, addr: Option<u64>, why: impl std::fmt::Display) -> Error {
    Error::corrupt(
        Structure::Node,
        addr,
        format!("inode {ino}: node {nid} at position {} (root {}): {why}", pos.node_ofs(), pos.root),
    )
}

/// Reads inode `ino` and its whole node tree: its attributes (with `addrs` and `nids` as on
/// disk), its block map, and the tree for a later [`write_inode`].
pub fn read_inode(
    dev: &dyn BlockDevice,
    g: &Geometry,
    nat: &NatTable,
    ino: u32,
) -> Result<(Inode, BlockMap, InodeTree)> {
    if ino == 0 || ino > g.max_nid {
        return Err(Error::InvalidArgument(format!("inode number {ino} out of 1..={}", g.max_nid)));
    }
    let e = nat.get(ino);
    if e.is_free() || e.ino != ino {
        return Err(Error::corrupt(
            Structure::Nat,
            None,
            format!("inode {ino} has no NAT entry of its own (entry {e:?})"),
        ));
    }
    let addr = e.block_addr as u64;
    let mut buf = vec![0u8; BLOCK_SIZE];
    dev.read_block(addr, &mut buf)?;
    let ctx = |why: String| Error::corrupt(Structure::Node, Some(addr), format!("inode {ino}: {why}"));
    let node = Node::decode(&buf, g, Some(addr)).map_err(|e| ctx(reason(e)))?;
    if node.footer.nid != ino || node.footer.ino != ino || node.footer.node_ofs != 0 {
        return Err(ctx(format!(
            "block holds node {} of inode {} at position {}",
            node.footer.nid, node.footer.ino, node.footer.node_ofs
        )));
    }
    let NodeBody::Inode(inode) = node.body else {
        return Err(ctx("block does not hold an inode".into()));
    };
    let inode = *inode;
    let mut map: BlockMap = BlockMap::new();
    for (slot, &a) in inode.addrs.iter().enumerate() {
        if a != 0 {
            map.insert(slot as u64, a);
        }
    }
    let mut tree =
        InodeTree { ino, inode_addr: e.block_addr, nodes: BTreeMap::new(), relocate: Default::default() };
    let mut level: Vec<(NodePos, u32)> = (0..INODE_NIDS as u8)
        .filter(|&r| inode.nids[r as usize] != 0)
        .map(|r| (NodePos::root(r), inode.nids[r as usize]))
        .collect();
    let mut seen: HashSet<u32> = HashSet::from([ino]);
    // Bounded: a tree is at most three levels below the inode.
    for _depth in 0..3 {
        if level.is_empty() {
            break;
        }
        level = read_level(dev, g, nat, ino, &level, &mut seen, &mut tree, &mut map)?;
    }
    if !level.is_empty() {
        return Err(ctx("node tree is deeper than three levels".into()));
    }
    debug_assert!(map.keys().all(|&i| i < MAX_FILE_BLOCKS));
    Ok((inode, map, tree))
}

/// The reason text of an error (the whole message for errors that are not corruption).
fn reason(e: Error) -> String {
    match e {
        Error::Corrupt { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// Reads and checks the nodes of one tree level; returns the next level's (position, nid).
#[allow(clippy::too_many_arguments)]
fn read_level(
    dev: &dyn BlockDevice,
    g: &Geometry,
    nat: &NatTable,
    ino: u32,
    level: &[(NodePos, u32)],
    seen: &mut HashSet<u32>,
    tree: &mut InodeTree,
    map: &mut BlockMap,
) -> Result<Vec<(NodePos, u32)>> {
    // Resolve every id first: a corrupt image cannot make the level larger than the number of
    // distinct ids the NAT maps to this inode.
    let mut located: Vec<(NodePos, u32, u32)> = Vec::with_capacity(level.len());
    for &(pos, nid) in level {
        if !seen.insert(nid) {
            return Err(node_corrupt(ino, nid, pos, None, "referenced twice in the tree"));
        }
        let e = nat.get(nid);
        if e.is_free() {
            return Err(node_corrupt(ino, nid, pos, None, "the NAT does not map it"));
        }
        if e.ino != ino {
            return Err(node_corrupt(ino, nid, pos, None, format!("the NAT says inode {} owns it", e.ino)));
        }
        located.push((pos, nid, e.block_addr));
    }
    let mut next = Vec::new();
    let mut buf = vec![0u8; READ_CHUNK.min(located.len()) * BLOCK_SIZE];
    for chunk in located.chunks(READ_CHUNK) {
        let mut reqs: Vec<ReadReq> = chunk
            .iter()
            .zip(buf.chunks_mut(BLOCK_SIZE))
            .map(|(&(_, _, addr), b)| ReadReq { addr: addr as u64, buf: b })
            .collect();
        dev.read_batch(&mut reqs)?;
        drop(reqs);
        for (&(pos, nid, addr), b) in chunk.iter().zip(buf.chunks(BLOCK_SIZE)) {
            let at = Some(addr as u64);
            let node = Node::decode(b, g, at).map_err(|e| node_corrupt(ino, nid, pos, at, reason(e)))?;
            let f = node.footer;
            if f.nid != nid || f.ino != ino || f.node_ofs != pos.node_ofs() {
                return Err(node_corrupt(
                    ino,
                    nid,
                    pos,
                    at,
                    format!("footer names node {} of inode {} at position {}", f.nid, f.ino, f.node_ofs),
                ));
            }
            let slots = match (node.body, pos.is_direct()) {
                (NodeBody::Direct(v), true) => {
                    let first = pos.first_block();
                    for (i, &a) in v.iter().enumerate() {
                        if a != 0 {
                            map.insert(first + i as u64, a);
                        }
                    }
                    v
                }
                (NodeBody::Indirect(v), false) => {
                    for (i, &c) in v.iter().enumerate() {
                        if c != 0 {
                            next.push((pos.child_at(i as u32), c));
                        }
                    }
                    v
                }
                (_, direct) => {
                    let want = if direct { "direct" } else { "indirect" };
                    return Err(node_corrupt(ino, nid, pos, at, format!("is not a {want} node")));
                }
            };
            // Decode produced exactly ADDRS_PER_NODE entries.
            debug_assert_eq!(slots.len(), ADDRS_PER_NODE);
            tree.nodes.insert(pos, TreeNode { nid, addr, slots: slots.into_boxed_slice() });
        }
    }
    Ok(next)
}

/// Checks what `write_inode` is about to encode, so that every block it writes decodes.
fn check_inode(g: &Geometry, ino: u32, inode: &Inode) -> Result<()> {
    let bad = |why: String| Err(Error::InvalidArgument(format!("inode {ino}: {why}")));
    if !VALID_TYPES.contains(&(inode.mode & S_IFMT)) {
        return bad(format!("mode {:o} has no valid file type", inode.mode));
    }
    if inode.name.len() > MAX_NAME_LEN {
        return bad(format!("name of {} bytes", inode.name.len()));
    }
    if inode.xattr_nid > g.max_nid || inode.parent > g.max_nid {
        return bad(format!("xattr node {} / parent {} out of range", inode.xattr_nid, inode.parent));
    }
    if [inode.atime, inode.mtime, inode.ctime, inode.crtime].iter().any(|t| t.nsec >= 1_000_000_000) {
        return bad("timestamp nanoseconds out of range".into());
    }
    Ok(())
}

/// Writes inode `inode` (attributes; its `addrs`, `nids` and `blocks` are recomputed from
/// `map`) over the tree `old`, into `log` of the writer's lane. Returns the new tree and the
/// encoded node blocks, which the caller must write. Only new and changed nodes get new
/// blocks; the inode node always does.
///
/// The steps run in this order so that the call is all or nothing for the tables: steps 1 to
/// 5 only check, take ids and blocks (given back on failure); step 6 changes the NAT and SIT.
pub fn write_inode(
    w: &NodeWriter,
    inode: &Inode,
    map: &BlockMap,
    old: &InodeTree,
    log: LogType,
) -> Result<(InodeTree, NodeBlocks)> {
    let ino = old.ino;
    check_write(w, ino, inode, log)?;
    // 1. What the nodes must hold.
    let mut shape = shape_of(w.g, ino, map)?;
    // 2. The tree being replaced must be the current one: a stale tree would invalidate
    //    blocks that belong to someone else now. Checked before anything changes.
    check_current(w, old)?;
    // 3. Node ids.
    let (nids, fresh) = assign_nids(w, old, &mut shape)?;
    // 4. Encode what changed.
    let encoded = match encode_changed(w, ino, inode, old, &mut shape, &nids) {
        Ok(e) => e,
        Err(e) => {
            give_back_nids(w.nat, &fresh);
            return Err(e);
        }
    };
    let changed = encoded.nodes.len();
    // 5. Blocks: children first, the inode last (it names them all).
    let Placed { out, placed, inode_addr } = place(w, log, ino, encoded, &nids, &fresh)?;
    debug_assert!(out.iter().all(|(a, _)| w.g.in_main(*a)));
    debug_assert!(out.iter().all(|(a, b)| Node::decode(b, w.g, Some(*a)).is_ok()));
    // 6. Commit to the tables: nothing below can fail except on a broken invariant.
    commit_tables(w, old, &shape.contents, &placed, &nids, inode_addr)?;

    // 7. The new tree: changed nodes at their new blocks, the rest where they were.
    let placed: BTreeMap<NodePos, u32> = placed.into_iter().collect();
    let nodes: BTreeMap<NodePos, TreeNode> = shape
        .contents
        .into_iter()
        .map(|(pos, slots)| {
            let addr = placed.get(&pos).copied().unwrap_or_else(|| old.nodes[&pos].addr);
            (pos, TreeNode { nid: nids[&pos], addr, slots })
        })
        .collect();
    let tree = InodeTree { ino, inode_addr: inode_addr as u32, nodes, relocate: Default::default() };
    debug_assert_eq!(out.len(), changed + 1);
    debug_assert!(tree.nodes.values().all(|n| w.nat.get(n.nid) == NatEntry { block_addr: n.addr, ino }));
    Ok((tree, out))
}

/// What a tree must hold for a block map: the inode's own slots and ids, each node's slots.
struct Shape {
    inode_addrs: Vec<u32>,
    inode_nids: [u32; INODE_NIDS],
    /// Every node the map needs, with its slots (indirect nodes' ids filled by `assign_nids`).
    contents: BTreeMap<NodePos, Box<[u32]>>,
    /// Mapped blocks (holes excluded).
    blocks: u64,
}

/// `write_inode`'s arguments, checked before anything is computed.
fn check_write(w: &NodeWriter, ino: u32, inode: &Inode, log: LogType) -> Result<()> {
    let g = w.g;
    debug_assert_eq!(g, w.lanes.table().geometry(), "writer geometry differs from the lanes'");
    if ino == 0 || ino > g.max_nid {
        return Err(Error::InvalidArgument(format!("inode number {ino} out of 1..={}", g.max_nid)));
    }
    if !log.is_node() {
        return Err(Error::InvalidArgument(format!("{} is not a node log", log.name())));
    }
    if w.lane >= g.lanes || w.lane > u16::MAX as u32 {
        return Err(Error::InvalidArgument(format!("lane {} does not exist", w.lane)));
    }
    check_inode(g, ino, inode)
}

/// Step 1 of `write_inode`: what the nodes must hold for `map`. Zero entries are holes; every
/// ancestor of a direct node is needed too. Changes nothing.
fn shape_of(g: &Geometry, ino: u32, map: &BlockMap) -> Result<Shape> {
    let mut inode_addrs = vec![0u32; INODE_ADDRS];
    let mut contents: BTreeMap<NodePos, Box<[u32]>> = BTreeMap::new();
    let mut blocks = 0u64;
    for (&idx, &addr) in map {
        if addr == 0 {
            continue;
        }
        if addr != NEW_ADDR && !g.in_main(addr as u64) {
            return Err(Error::InvalidArgument(format!(
                "inode {ino}: block {idx} maps to {addr}, outside the main area"
            )));
        }
        match locate(idx) {
            Some(BlockLoc::Inode { slot }) => inode_addrs[slot as usize] = addr,
            Some(BlockLoc::Node { pos, slot }) => {
                contents.entry(pos).or_insert_with(|| vec![0; ADDRS_PER_NODE].into_boxed_slice())
                    [slot as usize] = addr
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "inode {ino}: block {idx} is past the largest file ({MAX_FILE_BLOCKS} blocks)"
                )))
            }
        }
        blocks += 1;
    }
    // Every ancestor of a direct node is needed too (indirect contents are filled later).
    let directs: Vec<NodePos> = contents.keys().copied().collect();
    for pos in directs {
        let mut p = pos;
        // Bounded: at most two ancestors below the inode.
        for _ in 0..2 {
            let Some((parent, _)) = parent_of(p) else { break };
            contents.entry(parent).or_insert_with(|| vec![0; ADDRS_PER_NODE].into_boxed_slice());
            p = parent;
        }
    }
    debug_assert!(blocks as usize <= map.len());
    Ok(Shape { inode_addrs, inode_nids: [0; INODE_NIDS], contents, blocks })
}

/// Step 3 of `write_inode`: kept positions keep their node ids, new positions get fresh ones
/// (returned too, to give back if a later step fails); each id is then written into its
/// parent's slot (or the inode's). On failure the fresh ids are given back.
fn assign_nids(
    w: &NodeWriter,
    old: &InodeTree,
    shape: &mut Shape,
) -> Result<(BTreeMap<NodePos, u32>, Vec<u32>)> {
    let mut nids: BTreeMap<NodePos, u32> = BTreeMap::new();
    let mut fresh: Vec<u32> = Vec::new();
    for &pos in shape.contents.keys() {
        let nid = match old.nodes.get(&pos) {
            Some(n) => n.nid,
            None => match w.nat.alloc_nid(w.cpu) {
                Ok(n) => {
                    fresh.push(n);
                    n
                }
                Err(e) => {
                    give_back_nids(w.nat, &fresh);
                    return Err(e);
                }
            },
        };
        nids.insert(pos, nid);
    }
    for (&pos, &nid) in &nids {
        match parent_of(pos) {
            Some((parent, slot)) => {
                shape.contents.get_mut(&parent).expect("ancestors were added above")[slot] = nid;
            }
            None => shape.inode_nids[pos.root as usize] = nid,
        }
    }
    debug_assert_eq!(nids.len(), shape.contents.len());
    Ok((nids, fresh))
}

/// The encoded blocks of step 4: the nodes whose content changed, then the inode.
struct Encoded {
    nodes: Vec<(NodePos, Vec<u8>)>,
    inode: Vec<u8>,
}

/// Step 4 of `write_inode`: encodes the nodes that changed (or that the cleaner moves) and the
/// inode (infallible after `check_inode`, but not assumed). Changes no table; the inode's
/// slots move from `shape` into its encoding.
fn encode_changed(
    w: &NodeWriter,
    ino: u32,
    inode: &Inode,
    old: &InodeTree,
    shape: &mut Shape,
    nids: &BTreeMap<NodePos, u32>,
) -> Result<Encoded> {
    let changed: Vec<NodePos> = shape
        .contents
        .iter()
        .filter(|(pos, c)| old.relocate.contains(pos) || old.nodes.get(pos).is_none_or(|n| n.slots != **c))
        .map(|(p, _)| *p)
        .collect();
    let footer = |nid: u32, node_ofs: u32| NodeFooter {
        nid,
        ino,
        node_ofs,
        flags: 0,
        cp_ver: w.cp_ver,
        next_blkaddr: 0,
        lane: w.lane as u16,
        seq: 0,
    };
    let mut nodes: Vec<(NodePos, Vec<u8>)> = Vec::with_capacity(changed.len());
    for &pos in &changed {
        let slots = shape.contents[&pos].to_vec();
        let body = if pos.is_direct() { NodeBody::Direct(slots) } else { NodeBody::Indirect(slots) };
        nodes.push((pos, (Node { footer: footer(nids[&pos], pos.node_ofs()), body }).encode()?));
    }
    let mut new_inode = inode.clone();
    new_inode.addrs = std::mem::take(&mut shape.inode_addrs);
    new_inode.nids = shape.inode_nids;
    new_inode.blocks = shape.blocks;
    let inode = (Node { footer: footer(ino, 0), body: NodeBody::Inode(Box::new(new_inode)) }).encode()?;
    Ok(Encoded { nodes, inode })
}

/// Where step 5 put the encoded blocks.
struct Placed {
    /// The blocks to write: (address, encoded node), the inode last.
    out: NodeBlocks,
    /// Each changed node's new block.
    placed: Vec<(NodePos, u32)>,
    inode_addr: u64,
}

/// Step 5 of `write_inode`: a block in `log` for each encoded node, children first, the inode
/// last. On failure every block and fresh id taken is given back.
fn place(
    w: &NodeWriter,
    log: LogType,
    ino: u32,
    encoded: Encoded,
    nids: &BTreeMap<NodePos, u32>,
    fresh: &[u32],
) -> Result<Placed> {
    let mut out: NodeBlocks = Vec::with_capacity(encoded.nodes.len() + 1);
    let mut placed: Vec<(NodePos, u32)> = Vec::with_capacity(encoded.nodes.len());
    for (pos, bytes) in encoded.nodes {
        let owner = SummaryEntry { kind: SummaryKind::Node, nid: nids[&pos], ofs: pos.node_ofs() };
        match w.lanes.alloc(w.lane, log, owner, w.mtime) {
            Ok(a) => {
                placed.push((pos, a as u32));
                out.push((a, bytes));
            }
            Err(e) => return Err(undo_alloc(w, &out, fresh, e)),
        }
    }
    let inode_owner = SummaryEntry { kind: SummaryKind::Node, nid: ino, ofs: 0 };
    let inode_addr = match w.lanes.alloc(w.lane, log, inode_owner, w.mtime) {
        Ok(a) => a,
        Err(e) => return Err(undo_alloc(w, &out, fresh, e)),
    };
    out.push((inode_addr, encoded.inode));
    debug_assert_eq!(out.len(), placed.len() + 1);
    Ok(Placed { out, placed, inode_addr })
}

/// Step 6 of `write_inode`: the replaced and dropped nodes' blocks become invalid, dropped
/// nodes' ids free, and the NAT maps every written node (and the inode) to its new block.
fn commit_tables(
    w: &NodeWriter,
    old: &InodeTree,
    contents: &BTreeMap<NodePos, Box<[u32]>>,
    placed: &[(NodePos, u32)],
    nids: &BTreeMap<NodePos, u32>,
    inode_addr: u64,
) -> Result<()> {
    let (ino, table) = (old.ino, w.lanes.table());
    for &(pos, _) in placed {
        if let Some(n) = old.nodes.get(&pos) {
            table.invalidate(n.addr as u64)?;
        }
    }
    if old.inode_addr != 0 {
        table.invalidate(old.inode_addr as u64)?;
    }
    for (pos, n) in &old.nodes {
        if !contents.contains_key(pos) {
            table.invalidate(n.addr as u64)?;
            w.nat.set(n.nid, NatEntry::default());
            w.nat.free_nid(n.nid)?;
        }
    }
    for &(pos, addr) in placed {
        w.nat.set(nids[&pos], NatEntry { block_addr: addr, ino });
    }
    w.nat.set(ino, NatEntry { block_addr: inode_addr as u32, ino });
    Ok(())
}

/// Checks that `old` is the inode's current tree: every node (and the inode, if written) is
/// mapped by the NAT to the block the tree names, owned by the inode, and live in the SIT. A
/// never-written inode's id must be reserved (handed out by the allocator).
fn check_current(w: &NodeWriter, old: &InodeTree) -> Result<()> {
    let (ino, table) = (old.ino, w.lanes.table());
    let stale = |nid: u32, addr: u32| {
        Err(Error::InvalidArgument(format!(
            "inode {ino}: tree is stale (node {nid} at block {addr}; NAT says {:?}, live: {})",
            w.nat.get(nid),
            table.is_valid(addr as u64)
        )))
    };
    if old.inode_addr == 0 {
        if !old.nodes.is_empty() || !w.nat.is_reserved(ino) {
            return Err(Error::InvalidArgument(format!(
                "inode {ino} was never written but its id is not reserved or its tree not empty"
            )));
        }
        return Ok(());
    }
    let current = |nid: u32, addr: u32| {
        w.nat.get(nid) == NatEntry { block_addr: addr, ino } && table.is_valid(addr as u64)
    };
    if !current(ino, old.inode_addr) {
        return stale(ino, old.inode_addr);
    }
    for n in old.nodes.values() {
        if !current(n.nid, n.addr) {
            return stale(n.nid, n.addr);
        }
    }
    Ok(())
}

/// Returns ids taken by a write that failed (they were never written).
fn give_back_nids(nat: &NatTable, fresh: &[u32]) {
    for &nid in fresh {
        // Reserved ids always free; an error here would be a broken allocator invariant.
        let freed = nat.free_nid(nid);
        debug_assert!(freed.is_ok(), "{freed:?}");
    }
}

/// Undoes the block and id allocations of a failed write; returns the error.
fn undo_alloc(w: &NodeWriter, out: &[(u64, Vec<u8>)], fresh: &[u32], e: Error) -> Error {
    for (a, _) in out {
        // Blocks this call just allocated are valid; unsummarised garbage is fine once dead.
        let dead = w.lanes.table().invalidate(*a);
        debug_assert!(dead.is_ok(), "{dead:?}");
    }
    give_back_nids(w.nat, fresh);
    e
}

/// Removes inode `old.ino` and its whole tree: every node block becomes invalid and every node
/// id, the inode's included, is freed. Data blocks are the caller's (it holds the block map).
pub fn drop_inode(w: &NodeWriter, old: &InodeTree) -> Result<()> {
    let (ino, table) = (old.ino, w.lanes.table());
    debug_assert_eq!(w.g, table.geometry(), "writer geometry differs from the lanes'");
    if ino == 0 || ino > w.g.max_nid {
        return Err(Error::InvalidArgument(format!("inode number {ino} out of 1..={}", w.g.max_nid)));
    }
    check_current(w, old)?;
    for n in old.nodes.values() {
        table.invalidate(n.addr as u64)?;
        w.nat.set(n.nid, NatEntry::default());
        w.nat.free_nid(n.nid)?;
    }
    if old.inode_addr != 0 {
        table.invalidate(old.inode_addr as u64)?;
    }
    w.nat.set(ino, NatEntry::default());
    w.nat.free_nid(ino)?;
    debug_assert!(w.nat.get(ino).is_free());
    Ok(())
}
