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
//! Phases 1-2 are in `nodes`, 3-5 in `space`, 6-7 in `namespace`, 8 and the repair in
//! `repair`; an image with a persistent-memory region opens it in `region`.
//!
//! `--repair` rewrites what is derived data: a bad superblock copy from the good one, and the
//! SIT, SSA and checkpoint counters from the walk, committed as a new checkpoint. Anything else
//! is reported and left alone (exit 4), never guessed at.

mod namespace;
mod nodes;
mod region;
mod repair;
mod space;

use crate::checkpoint;
use crate::device::BlockDevice;
use crate::error::{Error, RegionFault, Result, Structure};
use crate::format::nat::NatBlock;
use crate::format::sit::SitEntry;
use crate::format::{Checkpoint, Superblock};
use crate::pmem::journal::NvmJournal;
use crate::pmem::nat::NvmNat;
use nodes::Owners;
use std::collections::HashMap;

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
    /// The structure the problem is in.
    pub structure: Structure,
    /// What is wrong, in words.
    pub message: String,
    /// Whether `--repair` can rebuild it from the rest of the image.
    pub repairable: bool,
    /// Whether this run repaired it.
    pub repaired: bool,
}

/// Sizes seen by the walk.
#[derive(Debug, Clone, Default)]
pub struct FsckStats {
    /// Version of the checkpoint checked.
    pub checkpoint_version: u64,
    /// Which pack (0 or 1) holds it.
    pub checkpoint_pack: u32,
    /// Inodes found.
    pub inodes: u64,
    /// Of them, directories.
    pub directories: u64,
    /// Node blocks found (inodes included).
    pub nodes: u64,
    /// Blocks whose owner is file or directory data.
    pub data_blocks: u64,
    /// Xattr blocks (the streams of xattr sets too large for their node).
    pub xattr_blocks: u64,
}

/// The outcome of a check.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    /// What is wrong, each with whether it was repaired.
    pub problems: Vec<Problem>,
    /// Observations that are not errors (an older or torn checkpoint pack, for instance).
    pub notes: Vec<String>,
    /// What the check walked: inodes, blocks, entries.
    pub stats: FsckStats,
}

impl FsckReport {
    /// Whether the check found nothing wrong.
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

/// What the walk starts from (`Fsck::load`).
struct Loaded {
    sb: Superblock,
    /// A superblock copy that did not decode (0: A, 1: B).
    bad_sb_copy: Option<usize>,
    cp: Checkpoint,
    /// The pack `cp` came from.
    pack: u32,
    /// The image's persistent-memory region, when its NAT lives there.
    region: Option<(NvmNat, NvmJournal)>,
    nat: std::collections::BTreeMap<u32, NatBlock>,
    /// Transactions the region's lane journals hold since `cp` (0 without a region; None when
    /// they do not decode).
    journaled: Option<usize>,
    sit: Vec<SitEntry>,
}

/// What the tree walk (phase 2) found beside ownership.
struct Trees {
    inos: Vec<u32>,
    /// Each directory's dentry blocks, in index order.
    dir_blocks: HashMap<u32, Vec<u32>>,
    /// Preallocated, unwritten blocks (`NEW_ADDR`): what the checkpoint's reserved count must
    /// equal (`mem::reserve`).
    unwritten: u64,
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

    /// The whole check, phase by phase (the module comment lists them), then the repair.
    fn run(&mut self, opts: &FsckOptions) -> Result<()> {
        let l = self.load(opts)?;
        let g = l.sb.geometry;
        let mut owners = Owners::new();
        let nodes = self.check_nat_nodes(&g, &l.nat, &mut owners)?;
        let trees = self.check_trees(&nodes, &mut owners)?;
        let expected = space::by_segment(&g, &owners);
        let sit = self.check_sit(&g, &l.sit, &expected);
        self.check_active_logs(&l.cp, &expected);
        let ssa = self.check_ssa(&g, &expected);
        self.check_namespace(&g, &nodes, &trees.dir_blocks, &l.cp.orphans)?;
        let counters = self.check_counters(&l, &owners, &nodes, &trees);
        if opts.repair && !self.report.problems.is_empty() {
            self.repair(l, repair::Fixes { sit, ssa, counters })?;
        }
        Ok(())
    }

    /// Reads what the walk starts from, as mount does: the superblock (noting a bad copy), the
    /// newest valid checkpoint, the region if the image keeps one, the NAT and the SIT.
    fn load(&mut self, opts: &FsckOptions) -> Result<Loaded> {
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
        let cp = cpr.cp;
        self.report.stats.checkpoint_version = cp.version;
        self.report.stats.checkpoint_pack = cpr.pack;
        let region = self.open_region(&sbr.sb, &cp, opts)?;
        let (nat, journaled) = match &region {
            Some((nvm, log)) => (nvm.read(cp.version)?, self.check_region_journals(nvm, log, cp.version)),
            None => (checkpoint::read_nat(dev, &g, &cp)?, Some(0)),
        };
        let sit = checkpoint::read_sit(dev, &g, &cp)?;
        Ok(Loaded { sb: sbr.sb, bad_sb_copy, cp, pack: cpr.pack, region, nat, journaled, sit })
    }

    fn mark_repaired(&mut self, s: Structure) {
        for p in self.report.problems.iter_mut().filter(|p| p.structure == s && p.repairable) {
            p.repaired = true;
        }
    }

    fn own(&mut self, owners: &mut Owners, addr: u32, o: crate::format::SummaryEntry) {
        if let Some(prev) = owners.insert(addr, o) {
            self.problem(
                Structure::Node,
                format!("block {addr} is owned twice: by node {} and by node {}", prev.nid, o.nid),
                false,
            );
        }
    }
}
