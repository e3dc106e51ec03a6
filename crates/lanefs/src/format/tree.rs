//! The shape of a file's block tree: which node, and which slot in it, holds logical block `i`.
//!
//! ```text
//! inode            slots 0..875                  blocks [0, 875)
//! nids[0], nids[1] direct nodes                  1008 blocks each
//! nids[2], nids[3] indirect -> 1008 direct       1008^2 blocks each
//! nids[4]          double indirect -> indirect -> direct   1008^3 blocks
//! ```
//!
//! Every node has a fixed position number (`node_ofs`, stored in its footer) so that fsck can
//! check that a node sits where its footer says and the cleaner can find a node's parent:
//! inode 0; `nids[0]` 1, `nids[1]` 2; `nids[2]` 3 and its children 4..1012; `nids[3]` 1012 and
//! its children 1013..2021; `nids[4]` 2021, its i-th indirect child 2022 + i*1009 and that child's
//! j-th direct child 2022 + i*1009 + 1 + j.

use super::node::{ADDRS_PER_NODE, INODE_ADDRS, INODE_NIDS};

const N: u64 = ADDRS_PER_NODE as u64;
const I: u64 = INODE_ADDRS as u64;

/// Position number of an inode's xattr node (outside the data tree).
pub const XATTR_NODE_OFS: u32 = u32::MAX;

/// Blocks a file can have.
pub const MAX_FILE_BLOCKS: u64 = I + 2 * N + 2 * N * N + N * N * N;

/// Position of a node in an inode's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodePos {
    /// Which of the inode's five node ids the path starts at.
    pub root: u8,
    /// Index in the root node (roots 2..=4), if the node is below the root.
    pub child: Option<u32>,
    /// Index in the child (root 4 only), if the node is two levels below the root.
    pub grandchild: Option<u32>,
}

impl NodePos {
    /// The root slot `root` itself.
    pub const fn root(root: u8) -> NodePos {
        NodePos { root, child: None, grandchild: None }
    }

    /// Whether the node at this position holds data block addresses (else node ids).
    pub fn is_direct(&self) -> bool {
        match self.root {
            0 | 1 => true,
            2 | 3 => self.child.is_some(),
            _ => self.grandchild.is_some(),
        }
    }

    /// The child position at slot `i` of this (indirect) node.
    pub fn child_at(&self, i: u32) -> NodePos {
        debug_assert!(!self.is_direct());
        match self.child {
            None => NodePos { root: self.root, child: Some(i), grandchild: None },
            Some(c) => NodePos { root: self.root, child: Some(c), grandchild: Some(i) },
        }
    }

    /// The node's position number (`node_ofs` in its footer).
    pub fn node_ofs(&self) -> u32 {
        let n = N as u32;
        match (self.root, self.child, self.grandchild) {
            (0, _, _) => 1,
            (1, _, _) => 2,
            (2, None, _) => 3,
            (2, Some(k), _) => 4 + k,
            (3, None, _) => 4 + n,
            (3, Some(k), _) => 5 + n + k,
            (_, None, _) => 5 + 2 * n,
            (_, Some(i), None) => 6 + 2 * n + i * (n + 1),
            (_, Some(i), Some(j)) => 6 + 2 * n + i * (n + 1) + 1 + j,
        }
    }

    /// First logical block covered by the node at this position.
    pub fn first_block(&self) -> u64 {
        match (self.root, self.child, self.grandchild) {
            (0, _, _) => I,
            (1, _, _) => I + N,
            (r @ (2 | 3), c, _) => I + 2 * N + (r as u64 - 2) * N * N + c.unwrap_or(0) as u64 * N,
            (_, c, g) => I + 2 * N + 2 * N * N + c.unwrap_or(0) as u64 * N * N + g.unwrap_or(0) as u64 * N,
        }
    }
}

/// Where logical block `idx` is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockLoc {
    /// In the inode's own address slots.
    Inode {
        /// Index in the inode's address slots.
        slot: u32,
    },
    /// In a direct node at `pos`, at `slot`.
    Node {
        /// Which node of the tree.
        pos: NodePos,
        /// Index in that node's addresses.
        slot: u32,
    },
}

/// Locates logical block `idx`, or None past the largest file.
pub fn locate(idx: u64) -> Option<BlockLoc> {
    if idx < I {
        return Some(BlockLoc::Inode { slot: idx as u32 });
    }
    let mut r = idx - I;
    if r < 2 * N {
        return Some(BlockLoc::Node { pos: NodePos::root((r / N) as u8), slot: (r % N) as u32 });
    }
    r -= 2 * N;
    if r < 2 * N * N {
        let root = 2 + (r / (N * N)) as u8;
        let r = r % (N * N);
        let pos = NodePos { root, child: Some((r / N) as u32), grandchild: None };
        return Some(BlockLoc::Node { pos, slot: (r % N) as u32 });
    }
    r -= 2 * N * N;
    if r < N * N * N {
        let pos =
            NodePos { root: 4, child: Some((r / (N * N)) as u32), grandchild: Some((r / N % N) as u32) };
        return Some(BlockLoc::Node { pos, slot: (r % N) as u32 });
    }
    None
}

const _: () = assert!(INODE_NIDS == 5);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn locate_and_first_block_agree_at_every_boundary() {
        let edges = [
            0,
            I - 1,
            I,
            I + N - 1,
            I + N,
            I + 2 * N,
            I + 2 * N + N * N - 1,
            I + 2 * N + N * N,
            I + 2 * N + 2 * N * N,
            MAX_FILE_BLOCKS - 1,
        ];
        for &idx in &edges {
            match locate(idx).unwrap() {
                BlockLoc::Inode { slot } => assert_eq!(slot as u64, idx),
                BlockLoc::Node { pos, slot } => {
                    assert!(pos.is_direct());
                    assert_eq!(pos.first_block() + slot as u64, idx, "{pos:?}");
                }
            }
        }
        assert_eq!(locate(MAX_FILE_BLOCKS), None);
    }

    #[test]
    fn node_offsets_are_unique() {
        let mut seen = HashSet::from([0u32]);
        let mut all =
            vec![NodePos::root(0), NodePos::root(1), NodePos::root(2), NodePos::root(3), NodePos::root(4)];
        for r in [2u8, 3] {
            for k in [0, 1, 500, N as u32 - 1] {
                all.push(NodePos::root(r).child_at(k));
            }
        }
        for i in [0, 1, N as u32 - 1] {
            let ind = NodePos::root(4).child_at(i);
            all.push(ind);
            for j in [0, 7, N as u32 - 1] {
                all.push(ind.child_at(j));
            }
        }
        for p in all {
            assert!(seen.insert(p.node_ofs()), "{p:?} repeats node_ofs {}", p.node_ofs());
        }
    }
}
