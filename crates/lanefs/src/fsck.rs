//! fsck: check every invariant of an image, and repair what can be rebuilt from the rest.
//!
//! The check reads the image the way mount does (superblock, newest valid checkpoint, NAT, SIT)
//! and then verifies, in order:
//!
//! 1. every NAT entry points at a node block that decodes and names the same node and inode;
//! 2. every node is reachable exactly once from its inode's tree, with the right kind; a large
//!    xattr set's blocks decode, belong to the inode at their index, and join into the stream
//!    its xattr node describes (length, crc32c), which decodes to a valid set;
//! 3. no block is owned twice (nodes and data), and every owned block lies in the main area;
//! 4. the SIT (valid counts and bitmaps) equals the set of owned blocks, and no block past an
//!    active log's write cursor is owned;
//! 5. the SSA names the owner found by the walk for every owned block;
//! 6. the directory tree is reachable from the root, directories have one name and a correct
//!    parent, entries point at inodes of the type they claim, and link counts are exact;
//! 7. orphan inodes are unlinked (nlink 0, no entry) and every unreachable inode is an orphan;
//! 8. the checkpoint's block, node, inode and reserved (preallocated, unwritten) block counts
//!    are exact.
//!
//! `--repair` rewrites what is derived data: a bad superblock copy from the good one, and the
//! SIT, SSA and checkpoint counters from the walk, committed as a new checkpoint. Anything else
//! is reported and left alone (exit 4), never guessed at.

use crate::checkpoint::{self, commit, read_blocks, CommitSet};
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::{Error, RegionFault, Result, Structure};
use crate::format::checkpoint::CP_FLAG_NVM_NAT;
use crate::format::dentry::{dtype_of, DentryBlock};
use crate::format::layout::{Geometry, NAT_ENTRIES_PER_BLOCK, ROOT_INO};
use crate::format::node::{NEW_ADDR, S_IFMT};
use crate::format::sit::SitEntry;
use crate::format::superblock::SB_ADDRS;
use crate::format::tree::{NodePos, XATTR_NODE_OFS};
use crate::format::xattr::{self, XattrNode};
use crate::format::{Checkpoint, Superblock};
use crate::format::{Node, NodeBody, SegmentSummary, SitBlock, SummaryEntry, SummaryKind};
use crate::pmem::journal::NvmJournal;
use crate::pmem::nat::NvmNat;
use crate::pmem::{PmemRegion, RegionOptions};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// What to do.
#[derive(Debug, Clone, Default)]
pub struct FsckOptions {
    /// Rewrite derived structures (superblock copy, SIT, SSA, counters) that are wrong.
    pub repair: bool,
    /// The persistent-memory region of an image that keeps its NAT and lane journals in one
    /// (`--nvm FILE`): checked with the image (NAT entries, lane journals), never written
    /// except by a repair's checkpoint.
    pub nvm: Option<std::path::PathBuf>,
}

/// One thing found wrong.
#[derive(Debug, Clone)]
pub struct Problem {
    pub structure: Structure,
    pub message: String,
    /// Whether `--repair` can rebuild it from the rest of the image.
    pub repairable: bool,
    pub repaired: bool,
}

/// Sizes seen by the walk.
#[derive(Debug, Clone, Default)]
pub struct FsckStats {
    pub checkpoint_version: u64,
    pub checkpoint_pack: u32,
    pub inodes: u64,
    pub directories: u64,
    pub nodes: u64,
    pub data_blocks: u64,
    /// Xattr blocks (the streams of xattr sets too large for their node).
    pub xattr_blocks: u64,
}

/// The outcome of a check.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    pub problems: Vec<Problem>,
    /// Observations that are not errors (an older or torn checkpoint pack, for instance).
    pub notes: Vec<String>,
    pub stats: FsckStats,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
    /// Exit code as fsck(8): 0 clean, 1 every error corrected, 4 errors left.
    pub fn exit_code(&self) -> i32 {
        if self.problems.is_empty() {
            0
        } else if self.problems.iter().all(|p| p.repaired) {
            1
        } else {
            4
        }
    }
}

/// Progress callback: (phase, done, total).
pub type Progress<'a> = &'a dyn Fn(&str, u64, u64);

/// Checks `dev`. `Err` means the check could not run (I/O error, not a lanefs image);
/// everything found wrong with a lanefs image is in the report.
pub fn check(dev: &dyn BlockDevice, opts: &FsckOptions) -> Result<FsckReport> {
    check_with_progress(dev, opts, &|_, _, _| {})
}

/// As [`check`], reporting progress.
pub fn check_with_progress(
    dev: &dyn BlockDevice,
    opts: &FsckOptions,
    progress: Progress,
) -> Result<FsckReport> {
    let mut f = Fsck { dev, report: FsckReport::default(), progress };
    match f.run(opts) {
        Ok(()) => Ok(f.report),
        // Corruption that stops the walk (both superblocks, both packs) is a finding.
        Err(e @ Error::Corrupt { .. }) => {
            let structure = match &e {
                Error::Corrupt { structure, .. } => *structure,
                _ => unreachable!(),
            };
            f.problem(structure, e.to_string(), false);
            Ok(f.report)
        }
        // So is a region that does not hold what the image needs (its NAT): the walk cannot
        // start without it. (A missing, locked or wrong region is the caller's to fix.)
        Err(e @ Error::Region { fault: RegionFault::Corrupt | RegionFault::Stale, .. }) => {
            f.problem(Structure::Region, e.to_string(), false);
            Ok(f.report)
        }
        Err(e) => Err(e),
    }
}

struct Fsck<'a> {
    dev: &'a dyn BlockDevice,
    report: FsckReport,
    progress: Progress<'a>,
}

/// What the walk learned about one node.
struct NodeInfo {
    kind: u8,
    ino: u32,
    node_ofs: u32,
    /// Child node ids (indirect) or non-null data addresses with their slot (inode, direct).
    children: Vec<u32>,
    data: Vec<(u16, u32)>,
    inode: Option<InodeInfo>,
    /// An xattr node in the blocks form: (stream length, stream crc, block addresses).
    xattr_blocks: Option<(u32, u32, Vec<u32>)>,
}

struct InodeInfo {
    mode: u32,
    nlink: u32,
    blocks: u64,
    parent: u32,
    nids: [u32; 5],
    xattr_nid: u32,
    generation: u32,
}

impl<'a> Fsck<'a> {
    fn problem(&mut self, structure: Structure, message: impl Into<String>, repairable: bool) {
        self.report.problems.push(Problem {
            structure,
            message: message.into(),
            repairable,
            repaired: false,
        });
    }

    fn run(&mut self, opts: &FsckOptions) -> Result<()> {
        let dev = self.dev;
        let sbr = checkpoint::read_superblock(dev)?;
        let g = sbr.sb.geometry;
        let mut bad_sb_copy = None;
        for (i, c) in sbr.copies.iter().enumerate() {
            if let Err(e) = c {
                self.problem(Structure::Superblock, format!("copy {}: {e}", ["A", "B"][i]), true);
                bad_sb_copy = Some(i);
            }
        }
        let cpr = checkpoint::read_checkpoint(dev, &g)?;
        match &cpr.other {
            Ok(v) => {
                self.report.notes.push(format!("checkpoint pack {} holds older version {v}", 1 - cpr.pack))
            }
            Err(e) => self.report.notes.push(format!(
                "checkpoint pack {} not usable ({e}); using pack {}",
                1 - cpr.pack,
                cpr.pack
            )),
        }
        let mut cp = cpr.cp;
        self.report.stats.checkpoint_version = cp.version;
        self.report.stats.checkpoint_pack = cpr.pack;
        let region = self.open_region(&sbr.sb, &cp, opts)?;
        let (nat, journaled) = match &region {
            Some((nvm, log)) => (nvm.read(cp.version)?, self.check_region_journals(nvm, log, cp.version)),
            None => (checkpoint::read_nat(dev, &g, &cp)?, Some(0)),
        };
        let sit = checkpoint::read_sit(dev, &g, &cp)?;

        // 1. Nodes named by the NAT.
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
        let mut owners: HashMap<u32, SummaryEntry> = HashMap::new();
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
                self.own(&mut owners, addr, SummaryEntry { kind: SummaryKind::Node, nid, ofs });
                nodes.insert(nid, self.node_info(node));
            }
        }
        self.report.stats.nodes = nodes.len() as u64;

        // 2. Trees of every inode; data ownership.
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
            self.walk_tree(ino, &nodes, &mut reached, &mut data);
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
                        &mut owners,
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
                    self.own(
                        &mut owners,
                        a,
                        SummaryEntry { kind: SummaryKind::Xattr, nid: ino, ofs: i as u32 },
                    );
                }
                self.report.stats.xattr_blocks += addrs.len() as u64;
                xattr_sets.push((ino, x, len, crc, addrs));
            }
        }
        self.check_xattr_blocks(&xattr_sets)?;
        for (&nid, n) in &nodes {
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

        // 3-5. Space: SIT and SSA against the owners found.
        let mut expected: BTreeMap<u32, Vec<(u32, SummaryEntry)>> = BTreeMap::new();
        for (&addr, &o) in &owners {
            if let Some((s, off)) = g.seg_of(addr as u64) {
                expected.entry(s).or_default().push((off, o));
            }
        }
        let mut sit_fix: BTreeMap<u32, SitEntry> = BTreeMap::new();
        for segno in 0..g.main_segments {
            if segno.is_multiple_of(1024) {
                (self.progress)("segments", segno as u64, g.main_segments as u64);
            }
            let mut want = sit[segno as usize].clone();
            want.bitmap = [0; 64];
            want.valid_blocks = 0;
            for &(off, _) in expected.get(&segno).map(Vec::as_slice).unwrap_or(&[]) {
                want.set_valid(off);
            }
            if want.bitmap != sit[segno as usize].bitmap
                || want.valid_blocks != sit[segno as usize].valid_blocks
            {
                self.problem(
                    Structure::Sit,
                    format!(
                        "segment {segno}: SIT says {} valid blocks, the tree owns {}",
                        sit[segno as usize].valid_blocks, want.valid_blocks
                    ),
                    true,
                );
                sit_fix.insert(segno, want);
            }
        }
        let mut active: HashMap<u32, (usize, u16)> = HashMap::new();
        for (l, lane) in cp.lanes.iter().enumerate() {
            for c in &lane.logs {
                if active.insert(c.segno, (l, c.next_off)).is_some() {
                    self.problem(
                        Structure::Checkpoint,
                        format!("segment {} is active in two logs", c.segno),
                        false,
                    );
                }
                if let Some(owned) = expected.get(&c.segno) {
                    if let Some(&(off, _)) = owned.iter().find(|(off, _)| *off >= c.next_off as u32) {
                        self.problem(
                            Structure::Checkpoint,
                            format!("lane {l}: block {off} of active segment {} is owned but past the write cursor {}", c.segno, c.next_off),
                            false,
                        );
                    }
                }
            }
        }
        let mut ssa_fix: Vec<SegmentSummary> = Vec::new();
        let check_segs: Vec<u32> = expected.keys().copied().collect();
        for segno in check_segs {
            let owned = &expected[&segno];
            let mut want = match checkpoint::read_summary(dev, &g, segno) {
                Ok(s) => s,
                Err(e) => {
                    self.problem(Structure::Ssa, format!("segment {segno}: {e}"), true);
                    let mut s = SegmentSummary::empty(segno);
                    for &(off, o) in owned {
                        s.entries[off as usize] = o;
                    }
                    ssa_fix.push(s);
                    continue;
                }
            };
            let mut bad = 0;
            for &(off, o) in owned {
                if want.entries[off as usize] != o {
                    bad += 1;
                    want.entries[off as usize] = o;
                }
            }
            if bad > 0 {
                self.problem(
                    Structure::Ssa,
                    format!("segment {segno}: {bad} blocks name the wrong owner"),
                    true,
                );
                ssa_fix.push(want);
            }
        }

        // 6-7. Namespace.
        self.check_namespace(&g, &nodes, &dir_blocks, &cp.orphans)?;

        // 8. Counters.
        let valid_blocks = owners.len() as u64;
        let counts = (valid_blocks, nodes.len() as u64, inos.len() as u64);
        let recorded = (cp.valid_blocks, cp.valid_nodes, cp.valid_inodes);
        let mut counters_bad = counts != recorded;
        if counters_bad {
            self.problem(
                Structure::Checkpoint,
                format!("counters (blocks, nodes, inodes) are {recorded:?}, the walk found {counts:?}"),
                true,
            );
        }
        if cp.reserved_blocks != unwritten {
            counters_bad = true;
            self.problem(
                Structure::Checkpoint,
                format!(
                    "the checkpoint counts {} reserved blocks, the trees hold {unwritten} unwritten ones",
                    cp.reserved_blocks
                ),
                true,
            );
        }
        // The generation counter is past every inode's generation, or a reused inode number
        // could get one a file handle still names. (0 before any inode has one; past 2^32 the
        // low bits have wrapped and nothing can be told.)
        let max_generation =
            nodes.values().filter_map(|n| n.inode.as_ref()).map(|i| i.generation as u64).max().unwrap_or(0);
        let generation_bad = max_generation != 0
            && cp.next_generation <= u32::MAX as u64
            && max_generation >= cp.next_generation;
        if generation_bad {
            self.problem(
                Structure::Checkpoint,
                format!(
                    "generation counter {} is not past inode generation {max_generation}",
                    cp.next_generation
                ),
                true,
            );
        }

        if opts.repair && !self.report.problems.is_empty() {
            if let Some(bad) = bad_sb_copy {
                dev.write_block(SB_ADDRS[bad], &sbr.sb.encode())?;
                dev.flush()?;
                self.mark_repaired(Structure::Superblock);
            }
            if !sit_fix.is_empty() || !ssa_fix.is_empty() || counters_bad || generation_bad {
                let mut sit_blocks: BTreeMap<u32, SitBlock> = BTreeMap::new();
                for (segno, e) in sit_fix {
                    let (bi, slot) = SitBlock::locate(segno);
                    sit_blocks.entry(bi).or_insert_with(|| sit_block_from(&sit, bi, &g)).entries[slot] = e;
                }
                (cp.valid_blocks, cp.valid_nodes, cp.valid_inodes) = counts;
                cp.reserved_blocks = unwritten;
                if generation_bad {
                    cp.next_generation = max_generation + 1;
                }
                if journaled != Some(0) {
                    // A new checkpoint would leave the region's journals behind (they follow
                    // the pack in force, and nothing of theirs is in this one).
                    self.report.notes.push(match journaled {
                        Some(n) => format!(
                            "not repaired: the region's lane journals hold {n} transactions since \
                             checkpoint {}; mount the image once (which replays them) and run fsck again",
                            cp.version
                        ),
                        None => "not repaired: the region's lane journals do not decode".to_string(),
                    });
                    return Ok(());
                }
                cp.version += 1;
                let set = CommitSet {
                    nat: Vec::new(),
                    sit: sit_blocks.into_values().collect(),
                    summaries: ssa_fix,
                };
                if let Some((nvm, _)) = &region {
                    // The region's side of a checkpoint that changes no NAT entry (protocol
                    // in `crate::pmem`): the last log in place, an empty log for the new one.
                    nvm.settle(cp.version - 1)?;
                    nvm.stage(cp.version, &[])?;
                }
                commit(dev, &g, &mut cp, cpr.pack, &set)?;
                if let Some((nvm, log)) = &region {
                    nvm.apply(cp.version)?;
                    log.reset(nvm.region(), cp.version)?;
                }
                for s in [Structure::Sit, Structure::Ssa, Structure::Checkpoint] {
                    self.mark_repaired(s);
                }
            }
        }
        Ok(())
    }

    /// The region of an image whose pack keeps its NAT in one (`CP_FLAG_NVM_NAT`), opened and
    /// checked against the image (UUID, size); `None` for an image that keeps it on the device.
    fn open_region(
        &mut self,
        sb: &Superblock,
        cp: &Checkpoint,
        opts: &FsckOptions,
    ) -> Result<Option<(NvmNat, NvmJournal)>> {
        let g = &sb.geometry;
        let flagged = cp.flags & CP_FLAG_NVM_NAT != 0;
        match (&opts.nvm, flagged) {
            (None, false) => Ok(None),
            (None, true) => Err(Error::InvalidArgument(format!(
                "checkpoint {} keeps the NAT and lane journals in a persistent-memory region: check it \
                 with --nvm FILE",
                cp.version
            ))),
            (Some(p), false) => {
                self.report.notes.push(format!(
                    "checkpoint {} keeps its NAT on the device: region {} is not in use (the next mount \
                     with it seeds it)",
                    cp.version,
                    p.display()
                ));
                Ok(None)
            }
            (Some(p), true) => {
                let region = PmemRegion::open(p, Some(sb.uuid), &RegionOptions::default())?;
                let nvm = NvmNat::new(region, g)?;
                let log = NvmJournal::new(nvm.region(), nvm.layout().end, g)?;
                self.report.notes.push(format!("region {}", nvm.describe()));
                Ok(Some((nvm, log)))
            }
        }
    }

    /// Decodes every transaction the region's lane journals hold under checkpoint `version`
    /// (each is replayed by the next mount); a journal that does not decode is a problem.
    /// Returns how many there are (`None`: they do not decode).
    fn check_region_journals(&mut self, nvm: &NvmNat, log: &NvmJournal, version: u64) -> Option<usize> {
        match log.read(nvm.region(), version) {
            Ok(lanes) => {
                let txns: usize = lanes.iter().map(Vec::len).sum();
                let records: usize = lanes.iter().flatten().map(|t| t.records.len()).sum();
                if txns > 0 {
                    self.report.notes.push(format!(
                        "region lane journals: {txns} transactions ({records} records) since checkpoint \
                         {version}, replayed by the next mount"
                    ));
                }
                Some(txns)
            }
            Err(e) => {
                self.problem(Structure::Region, e.to_string(), false);
                None
            }
        }
    }

    fn mark_repaired(&mut self, s: Structure) {
        for p in self.report.problems.iter_mut().filter(|p| p.structure == s && p.repairable) {
            p.repaired = true;
        }
    }

    fn own(&mut self, owners: &mut HashMap<u32, SummaryEntry>, addr: u32, o: SummaryEntry) {
        if let Some(prev) = owners.insert(addr, o) {
            self.problem(
                Structure::Node,
                format!("block {addr} is owned twice: by node {} and by node {}", prev.nid, o.nid),
                false,
            );
        }
    }

    fn node_info(&self, node: Node) -> NodeInfo {
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
    fn walk_tree(
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
    fn check_xattr_blocks(&mut self, sets: &[(u32, u32, u32, u32, Vec<u32>)]) -> Result<()> {
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

    fn check_namespace(
        &mut self,
        g: &Geometry,
        nodes: &BTreeMap<u32, NodeInfo>,
        dir_blocks: &HashMap<u32, Vec<u32>>,
        orphans: &[u32],
    ) -> Result<()> {
        let inode_of = |ino: u32| nodes.get(&ino).and_then(|n| n.inode.as_ref());
        match inode_of(ROOT_INO) {
            Some(i) if i.mode & S_IFMT == 0o040000 => {}
            _ => {
                self.problem(Structure::Node, "the root inode is missing or not a directory", false);
                return Ok(());
            }
        }
        let mut refs: HashMap<u32, u32> = HashMap::new();
        let mut subdirs: HashMap<u32, u32> = HashMap::new();
        let mut seen_dirs: HashSet<u32> = HashSet::from([ROOT_INO]);
        let mut queue: VecDeque<u32> = VecDeque::from([ROOT_INO]);
        let mut dirs = 0u64;
        while let Some(dir) = queue.pop_front() {
            dirs += 1;
            if dirs.is_multiple_of(256) {
                (self.progress)("directories", dirs, seen_dirs.len() as u64);
            }
            let blocks = dir_blocks.get(&dir).cloned().unwrap_or_default();
            if blocks.contains(&NEW_ADDR) {
                self.problem(Structure::Dentry, format!("directory {dir} has an unwritten block"), false);
                continue;
            }
            let bufs = read_blocks(self.dev, &blocks.iter().map(|&a| a as u64).collect::<Vec<_>>())?;
            let mut names: HashSet<Vec<u8>> = HashSet::new();
            for (&addr, b) in blocks.iter().zip(bufs.chunks(BLOCK_SIZE)) {
                let db = match DentryBlock::decode(b, dir, g.max_nid, Some(addr as u64)) {
                    Ok(d) => d,
                    Err(e) => {
                        self.problem(Structure::Dentry, format!("directory {dir}: {e}"), false);
                        continue;
                    }
                };
                for d in db.entries {
                    let shown = String::from_utf8_lossy(&d.name).into_owned();
                    if !names.insert(d.name.clone()) {
                        self.problem(
                            Structure::Dentry,
                            format!("directory {dir} holds '{shown}' twice"),
                            false,
                        );
                        continue;
                    }
                    let Some(child) = inode_of(d.ino) else {
                        self.problem(
                            Structure::Dentry,
                            format!(
                                "'{shown}' in directory {dir} points to inode {}, which does not exist",
                                d.ino
                            ),
                            false,
                        );
                        continue;
                    };
                    if dtype_of(child.mode) != d.file_type {
                        self.problem(
                            Structure::Dentry,
                            format!(
                                "'{shown}' in directory {dir} has type {} but inode {} is mode {:o}",
                                d.file_type, d.ino, child.mode
                            ),
                            false,
                        );
                    }
                    *refs.entry(d.ino).or_default() += 1;
                    if child.mode & S_IFMT == 0o040000 {
                        *subdirs.entry(dir).or_default() += 1;
                        if child.parent != dir {
                            self.problem(
                                Structure::Node,
                                format!(
                                    "directory {} is in directory {dir} but names {} as its parent",
                                    d.ino, child.parent
                                ),
                                false,
                            );
                        }
                        if !seen_dirs.insert(d.ino) {
                            self.problem(
                                Structure::Dentry,
                                format!("directory {} has more than one name (loop or hard link)", d.ino),
                                false,
                            );
                        } else {
                            queue.push_back(d.ino);
                        }
                    }
                }
            }
        }
        self.report.stats.directories = dirs;
        let orphan_set: HashSet<u32> = orphans.iter().copied().collect();
        for (&ino, n) in nodes {
            let Some(i) = &n.inode else { continue };
            let is_dir = i.mode & S_IFMT == 0o040000;
            let names = refs.get(&ino).copied().unwrap_or(0) + u32::from(ino == ROOT_INO);
            if orphan_set.contains(&ino) {
                if names != 0 || i.nlink != 0 {
                    self.problem(
                        Structure::Checkpoint,
                        format!("orphan inode {ino} still has {names} names and nlink {}", i.nlink),
                        false,
                    );
                }
                continue;
            }
            if names == 0 {
                self.problem(
                    Structure::Node,
                    format!("inode {ino} is not reachable from the root and is not an orphan"),
                    false,
                );
                continue;
            }
            let want = if is_dir { 2 + subdirs.get(&ino).copied().unwrap_or(0) } else { names };
            if i.nlink != want {
                self.problem(
                    Structure::Node,
                    format!("inode {ino} has link count {}, the tree gives {want}", i.nlink),
                    false,
                );
            }
        }
        for &o in orphans {
            if inode_of(o).is_none() {
                self.problem(
                    Structure::Checkpoint,
                    format!("orphan list names inode {o}, which does not exist"),
                    false,
                );
            }
        }
        Ok(())
    }
}

fn sit_block_from(sit: &[SitEntry], index: u32, g: &Geometry) -> SitBlock {
    let mut b = SitBlock::empty(index);
    for (slot, e) in b.entries.iter_mut().enumerate() {
        let segno = (index * crate::format::layout::SIT_ENTRIES_PER_BLOCK) as usize + slot;
        if segno < g.main_segments as usize {
            *e = sit[segno].clone();
        }
    }
    b
}
