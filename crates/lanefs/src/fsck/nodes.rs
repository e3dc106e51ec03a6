//! Phases 1 and 2 of the check: the nodes the NAT names, and every inode's tree (its nodes,
//! data blocks, and the blocks of a large xattr set). What they find owned goes into
//! [`Owners`], which the space phases compare with the SIT and SSA.

use super::{Fsck, InodeInfo, NodeInfo, Trees};
use crate::checkpoint::read_blocks;
use crate::device::BLOCK_SIZE;
use crate::error::{Result, Structure};
use crate::format::layout::{Geometry, NAT_ENTRIES_PER_BLOCK};
use crate::format::nat::NatBlock;
use crate::format::node::{NEW_ADDR, S_IFMT};
use crate::format::tree::{NodePos, XATTR_NODE_OFS};
use crate::format::xattr::{self, XattrNode};
use crate::format::{Node, NodeBody, SummaryEntry, SummaryKind};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Blocks the walk found owned, by address, with their owner.
pub(super) type Owners = HashMap<u32, SummaryEntry>;

impl Fsck<'_> {
    /// Phase 1: every NAT entry points at a node block that decodes and names the same node
    /// and inode. Returns what was learned of each node; node blocks go into `owners`.
    pub(super) fn check_nat_nodes(
        &mut self,
        g: &Geometry,
        nat: &BTreeMap<u32, NatBlock>,
        owners: &mut Owners,
    ) -> Result<BTreeMap<u32, NodeInfo>> {
        let (dev, g) = (self.dev, *g);
        let entries: Vec<(u32, u32, u32)> = nat
            .iter()
            .flat_map(|(&bi, nb)| {
                nb.entries
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| !e.is_free())
                    .map(move |(slot, e)| (bi * NAT_ENTRIES_PER_BLOCK + slot as u32, e.block_addr, e.ino))
            })
            .collect();
        let mut nodes: BTreeMap<u32, NodeInfo> = BTreeMap::new();
        let total = entries.len() as u64;
        for (ci, chunk) in entries.chunks(256).enumerate() {
            (self.progress)("nodes", (ci * 256) as u64, total);
            let bufs = read_blocks(dev, &chunk.iter().map(|e| e.1 as u64).collect::<Vec<_>>())?;
            for (&(nid, addr, ino), b) in chunk.iter().zip(bufs.chunks(BLOCK_SIZE)) {
                let node = match Node::decode(b, &g, Some(addr as u64)) {
                    Ok(n) => n,
                    Err(e) => {
                        self.problem(Structure::Node, format!("node {nid} (inode {ino}): {e}"), false);
                        continue;
                    }
                };
                if node.footer.nid != nid || node.footer.ino != ino {
                    self.problem(
                        Structure::Node,
                        format!(
                            "NAT maps node {nid} (inode {ino}) to block {addr}, which holds node {} of inode {}",
                            node.footer.nid, node.footer.ino
                        ),
                        false,
                    );
                    continue;
                }
                let ofs = node.footer.node_ofs;
                self.own(owners, addr, SummaryEntry { kind: SummaryKind::Node, nid, ofs });
                nodes.insert(nid, self.node_info(node));
            }
        }
        Ok(nodes)
    }

    /// Phase 2: every node is reachable exactly once from its inode's tree, and an inode's
    /// block count is what its tree maps; data and xattr blocks go into `owners`.
    pub(super) fn check_trees(
        &mut self,
        nodes: &BTreeMap<u32, NodeInfo>,
        owners: &mut Owners,
    ) -> Result<Trees> {
        let mut reached: HashSet<u32> = HashSet::new();
        let inos: Vec<u32> = nodes.iter().filter(|(_, n)| n.kind == 1).map(|(&k, _)| k).collect();
        let mut dir_blocks: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut xattr_sets = Vec::new();
        // Preallocated, unwritten blocks (`NEW_ADDR`): what the checkpoint's reserved count
        // must equal (`mem::reserve`).
        let mut unwritten = 0u64;
        for &ino in &inos {
            reached.insert(ino);
            let mut data: Vec<(u64, u32)> = Vec::new();
            self.walk_tree(ino, nodes, &mut reached, &mut data);
            let info = nodes[&ino].inode.as_ref().expect("inode");
            let counted = data.len() as u64;
            if counted != info.blocks {
                self.problem(
                    Structure::Node,
                    format!("inode {ino} records {} blocks but maps {counted}", info.blocks),
                    false,
                );
            }
            let is_dir = info.mode & S_IFMT == 0o040000;
            unwritten += data.iter().filter(|d| d.1 == NEW_ADDR).count() as u64;
            for &(idx, addr) in &data {
                if addr != NEW_ADDR {
                    self.own(
                        owners,
                        addr,
                        SummaryEntry { kind: SummaryKind::Data, nid: ino, ofs: idx as u32 },
                    );
                }
            }
            if is_dir {
                data.sort_unstable();
                dir_blocks.insert(ino, data.iter().map(|d| d.1).collect());
            }
            let x = info.xattr_nid;
            if let Some((len, crc, addrs)) =
                nodes.get(&x).filter(|n| n.ino == ino).and_then(|n| n.xattr_blocks.clone())
            {
                for (i, &a) in addrs.iter().enumerate() {
                    self.own(owners, a, SummaryEntry { kind: SummaryKind::Xattr, nid: ino, ofs: i as u32 });
                }
                self.report.stats.xattr_blocks += addrs.len() as u64;
                xattr_sets.push((ino, x, len, crc, addrs));
            }
        }
        self.check_xattr_blocks(&xattr_sets)?;
        for (&nid, n) in nodes {
            if !reached.contains(&nid) {
                self.problem(
                    Structure::Nat,
                    format!("node {nid} of inode {} is not reachable from its inode", n.ino),
                    false,
                );
            }
        }
        self.report.stats.inodes = inos.len() as u64;
        self.report.stats.data_blocks =
            owners.values().filter(|o| o.kind == SummaryKind::Data).count() as u64;
        self.report.stats.nodes = nodes.len() as u64;
        Ok(Trees { inos, dir_blocks, unwritten })
    }

    pub(super) fn node_info(&self, node: Node) -> NodeInfo {
        let nz = |v: &[u32]| -> Vec<(u16, u32)> {
            v.iter().enumerate().filter(|(_, &a)| a != 0).map(|(i, &a)| (i as u16, a)).collect()
        };
        match node.body {
            NodeBody::Inode(i) => NodeInfo {
                kind: 1,
                ino: node.footer.ino,
                node_ofs: node.footer.node_ofs,
                children: Vec::new(),
                data: nz(&i.addrs),
                inode: Some(InodeInfo {
                    mode: i.mode,
                    nlink: i.nlink,
                    blocks: i.blocks,
                    parent: i.parent,
                    nids: i.nids,
                    xattr_nid: i.xattr_nid,
                    generation: i.generation,
                }),
                xattr_blocks: None,
            },
            NodeBody::Direct(v) => NodeInfo {
                kind: 2,
                ino: node.footer.ino,
                node_ofs: node.footer.node_ofs,
                children: Vec::new(),
                data: nz(&v),
                inode: None,
                xattr_blocks: None,
            },
            NodeBody::Indirect(v) => NodeInfo {
                kind: 3,
                ino: node.footer.ino,
                node_ofs: node.footer.node_ofs,
                children: v,
                data: Vec::new(),
                inode: None,
                xattr_blocks: None,
            },
            NodeBody::Xattr(x) => NodeInfo {
                kind: 4,
                ino: node.footer.ino,
                node_ofs: node.footer.node_ofs,
                children: Vec::new(),
                data: Vec::new(),
                inode: None,
                xattr_blocks: match x {
                    XattrNode::Inline(_) => None,
                    XattrNode::Blocks { stream_len, stream_crc, addrs } => {
                        Some((stream_len, stream_crc, addrs))
                    }
                },
            },
        }
    }

    /// Walks inode `ino`'s node tree, checking each node's kind, owner and position; collects
    /// (logical block index, address) of its data blocks.
    pub(super) fn walk_tree(
        &mut self,
        ino: u32,
        nodes: &BTreeMap<u32, NodeInfo>,
        reached: &mut HashSet<u32>,
        data: &mut Vec<(u64, u32)>,
    ) {
        let info = &nodes[&ino];
        let inode = info.inode.as_ref().expect("inode");
        data.extend(info.data.iter().map(|&(s, a)| (s as u64, a)));
        let mut stack: Vec<(u32, NodePos)> = (0..5u8)
            .rev()
            .filter(|&r| inode.nids[r as usize] != 0)
            .map(|r| (inode.nids[r as usize], NodePos::root(r)))
            .collect();
        // Bound: a tree cannot hold more nodes than the NAT maps; anything beyond is a loop.
        let mut budget = nodes.len() + 1;
        while let Some((nid, pos)) = stack.pop() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                self.problem(Structure::Node, format!("inode {ino}: node tree does not terminate"), false);
                return;
            }
            let Some(n) = nodes.get(&nid) else {
                self.problem(
                    Structure::Node,
                    format!("inode {ino} refers to node {nid}, which the NAT does not map"),
                    false,
                );
                continue;
            };
            let want_kind = if pos.is_direct() { 2 } else { 3 };
            if n.kind != want_kind || n.ino != ino {
                self.problem(
                    Structure::Node,
                    format!(
                        "inode {ino}: node {nid} is of kind {} and inode {}, expected kind {want_kind}",
                        n.kind, n.ino
                    ),
                    false,
                );
                continue;
            }
            if n.node_ofs != pos.node_ofs() {
                self.problem(
                    Structure::Node,
                    format!(
                        "inode {ino}: node {nid} sits at position {} but its footer says {}",
                        pos.node_ofs(),
                        n.node_ofs
                    ),
                    false,
                );
            }
            if !reached.insert(nid) {
                self.problem(Structure::Node, format!("node {nid} is referenced twice"), false);
                continue;
            }
            if pos.is_direct() {
                data.extend(n.data.iter().map(|&(s, a)| (pos.first_block() + s as u64, a)));
            } else {
                stack.extend(
                    n.children
                        .iter()
                        .enumerate()
                        .rev()
                        .filter(|(_, &c)| c != 0)
                        .map(|(i, &c)| (c, pos.child_at(i as u32))),
                );
            }
        }
        if inode.xattr_nid != 0 {
            match nodes.get(&inode.xattr_nid) {
                Some(n) if n.kind == 4 && n.ino == ino && n.node_ofs == XATTR_NODE_OFS => {
                    reached.insert(inode.xattr_nid);
                }
                _ => self.problem(
                    Structure::Node,
                    format!("inode {ino}: xattr node {} is missing or not its own", inode.xattr_nid),
                    false,
                ),
            }
        }
    }

    /// Reads the blocks of each xattr set in the blocks form, (inode, xattr node, stream
    /// length, stream crc, blocks), and checks that they make a valid set.
    pub(super) fn check_xattr_blocks(&mut self, sets: &[(u32, u32, u32, u32, Vec<u32>)]) -> Result<()> {
        for (k, (ino, nid, len, crc, addrs)) in sets.iter().enumerate() {
            (self.progress)("xattrs", k as u64, sets.len() as u64);
            let bufs = read_blocks(self.dev, &addrs.iter().map(|&a| a as u64).collect::<Vec<_>>())?;
            let checked = (|| {
                let mut payloads = Vec::with_capacity(addrs.len());
                for (i, (&a, b)) in addrs.iter().zip(bufs.chunks(BLOCK_SIZE)).enumerate() {
                    payloads.push(xattr::decode_block(b, *ino, i as u32, Some(a as u64))?);
                }
                let stream = xattr::join_stream(payloads, *len, *crc, None)?;
                xattr::decode_stream(&stream, None)
            })();
            if let Err(e) = checked {
                self.problem(Structure::Xattr, format!("inode {ino}: xattr node {nid}: {e}"), false);
            }
        }
        Ok(())
    }
}
