//! Corrupt and truncated images (DESIGN.md, contract 5).
//!
//! Two reference images are built — one cleanly unmounted, one left by a crash with journal
//! records to roll forward — and every metadata block is classified by its magic: superblock,
//! checkpoint pack, NAT, SIT, SSA, node (live ones: those the NAT names), dentry and journal
//! blocks. A deterministic sweep then damages chosen blocks of each kind: zeroed, filled with
//! garbage, one bit flipped (the checksum catches it), and single 32-bit fields set to extreme
//! values *with the checksum recomputed*, so that the decoders' bounds checks are what is
//! tested. Truncated images and (in full mode) random damage to random metadata blocks follow.
//!
//! Each damaged image is mounted in a thread of its own with a timeout. Mount may fail with an
//! error; if it succeeds, the whole tree is read (readdir, getattr, read, readlink, xattrs),
//! the file system is unmounted and fsck runs. Any outcome is fine except a panic, a hang, or
//! a peak memory growth beyond [`MEMORY_BOUND`].

use super::ops::parse_script;
use super::oracle::walk;
use super::overlay::Overlay;
use super::rng::{derive, Rng};
use super::states::panic_text;
use super::workload::{record, Bases, Knobs, Setup, Workload};
use crate::checkpoint;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::format::codec::crc_skipping;
use crate::format::node::FOOTER_AT;
use crate::fs::{Fs, FsOptions};
use crate::fsck::{self, FsckOptions};
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

/// How long one damaged image may take (mount, walk, unmount, fsck).
pub const CASE_TIMEOUT: Duration = Duration::from_secs(30);
/// Peak resident memory a case may add.
pub const MEMORY_BOUND: u64 = 1 << 30;

/// The kinds of blocks the sweep damages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Superblock,
    Checkpoint,
    Nat,
    Sit,
    Ssa,
    Node,
    Dentry,
    Journal,
}

impl Target {
    pub const ALL: [Target; 8] = [
        Target::Superblock,
        Target::Checkpoint,
        Target::Nat,
        Target::Sit,
        Target::Ssa,
        Target::Node,
        Target::Dentry,
        Target::Journal,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Target::Superblock => "superblock",
            Target::Checkpoint => "checkpoint",
            Target::Nat => "nat",
            Target::Sit => "sit",
            Target::Ssa => "ssa",
            Target::Node => "node",
            Target::Dentry => "dentry",
            Target::Journal => "journal",
        }
    }
}

fn magic(b: &[u8], at: usize) -> [u8; 4] {
    b[at..at + 4].try_into().expect("4 bytes")
}

/// Where the checksum of a sealed block is (None: not a sealed block).
fn seal_at(b: &[u8]) -> Option<usize> {
    let stored = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    if crc_skipping(b, 4) == stored(4) {
        Some(4)
    } else if crc_skipping(b, FOOTER_AT + 4) == stored(FOOTER_AT + 4) {
        Some(FOOTER_AT + 4)
    } else {
        None
    }
}

fn reseal(b: &mut [u8], at: usize) {
    let c = crc_skipping(b, at);
    b[at..at + 4].copy_from_slice(&c.to_le_bytes());
}

/// A reference image and its classified blocks.
pub struct Reference {
    pub name: &'static str,
    pub image: Arc<Vec<u8>>,
    pub blocks: Vec<(Target, u64)>,
    pub total_blocks: u64,
    pub main_blkaddr: u64,
}

/// The operations of the reference images: directories, files with data (one past the
/// inode's direct addresses, so it has a direct node), hard links, xattrs.
const REFERENCE_OPS: &str = "mkdir /A/D; create /A/D/x; write /A/D/x 0 9000 5; create /big; \
    write /big 0 4096 6; write /big 4194304 8192 7; link /A/foo /B/foo2; setxattr /A/foo user.q 40 8; \
    create /B/e; rename /B/e /A/e; sync; create /j1; write /j1 0 6000 9; fsync /j1; mkdir /J; \
    create /J/k; write /J/k 100 3000 10; fsync /J/k; rename /A/bar /J/bar; fsync /J; \
    truncate /foo 100; fsync /foo";

/// The classified blocks of an image, its size in blocks and its main area's start.
type Classified = (Vec<(Target, u64)>, u64, u64);

fn classify(image: &[u8]) -> Result<Classified, String> {
    let dev = Overlay::new(Arc::new(image.to_vec()));
    let sb = checkpoint::read_superblock(&dev).map_err(|e| format!("reference superblock: {e}"))?.sb;
    let g = sb.geometry;
    let cp = checkpoint::read_checkpoint(&dev, &g).map_err(|e| format!("reference checkpoint: {e}"))?.cp;
    let nat = checkpoint::read_nat(&dev, &g, &cp).map_err(|e| format!("reference NAT: {e}"))?;
    let live_nodes: BTreeSet<u64> = nat
        .values()
        .flat_map(|b| b.entries.iter().filter(|e| !e.is_free()).map(|e| e.block_addr as u64))
        .collect();
    let mut out = Vec::new();
    for (a, b) in image.chunks(BLOCK_SIZE).enumerate() {
        let a = a as u64;
        let m = magic(b, 0);
        let t = match &m {
            b"LNFS" => Some(Target::Superblock),
            b"LNCP" | b"LNCF" | b"LNCD" => Some(Target::Checkpoint),
            b"LNNT" => Some(Target::Nat),
            b"LNST" => Some(Target::Sit),
            b"LNSS" => Some(Target::Ssa),
            b"LNDE" => Some(Target::Dentry),
            b"LNJR" => Some(Target::Journal),
            _ if &magic(b, FOOTER_AT) == b"LNND" && live_nodes.contains(&a) => Some(Target::Node),
            _ => None,
        };
        if let Some(t) = t {
            if seal_at(b).is_some() {
                out.push((t, a));
            }
        }
    }
    Ok((out, g.total_blocks, g.main_blkaddr))
}

/// Builds the two reference images.
pub fn references(bases: &Bases) -> Result<Vec<Reference>, String> {
    let ops = parse_script(REFERENCE_OPS).expect("reference script parses");
    let w = Workload {
        id: "corrupt-reference".into(),
        setup: Setup::Ace,
        threads: vec![ops],
        knobs: Knobs::default(),
        fault: None,
    };
    let rec = record(&w, bases)?;
    let mut out = Vec::new();
    // After the crash (journal records pending) and after the unmount (clean).
    for (name, upto) in [("crashed", rec.crash_at), ("clean", rec.log.len())] {
        let dev = Overlay::with_durable(rec.base.clone(), Default::default());
        dev.apply_log(&rec.log, &(0..upto).collect::<Vec<_>>());
        let image = dev.image();
        let (blocks, total_blocks, main_blkaddr) = classify(&image)?;
        out.push(Reference { name, image: Arc::new(image), blocks, total_blocks, main_blkaddr });
    }
    Ok(out)
}

/// One way to damage an image.
#[derive(Debug, Clone)]
pub enum Damage {
    Zero(u64),
    Garbage(u64, u64),
    FlipBit(u64, usize),
    /// Sets the little-endian u32 at a byte offset and recomputes the checksum.
    Field(u64, usize, u32),
    /// Random bytes at random offsets, resealed or not.
    Random(u64, u64),
    /// The device ends after this many blocks.
    Truncate(u64),
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Zero(a) => write!(f, "block {a} zeroed"),
            Damage::Garbage(a, s) => write!(f, "block {a} filled with garbage (seed {s})"),
            Damage::FlipBit(a, bit) => write!(f, "block {a} bit {bit} flipped"),
            Damage::Field(a, off, v) => {
                write!(f, "block {a} u32 at byte {off} set to {v:#x}, checksum fixed")
            }
            Damage::Random(a, s) => write!(f, "block {a} randomly damaged (seed {s})"),
            Damage::Truncate(n) => write!(f, "image truncated to {n} blocks"),
        }
    }
}

/// Applies `d` to a fresh overlay of `r`.
pub fn damaged(r: &Reference, d: &Damage) -> Overlay {
    let dev = match d {
        Damage::Truncate(n) => return Overlay::truncated(r.image.clone(), *n),
        _ => Overlay::new(r.image.clone()),
    };
    let addr = match d {
        Damage::Zero(a) | Damage::Garbage(a, _) | Damage::FlipBit(a, _) | Damage::Field(a, _, _) => *a,
        Damage::Random(a, _) => *a,
        Damage::Truncate(_) => unreachable!("handled above"),
    };
    let mut b = dev.block(addr);
    let sealed = seal_at(&b);
    match d {
        Damage::Zero(_) => b.fill(0),
        Damage::Garbage(_, s) => {
            let mut rng = Rng::new(*s);
            for chunk in b.chunks_mut(8) {
                chunk.copy_from_slice(&rng.next_u64().to_le_bytes()[..chunk.len()]);
            }
        }
        Damage::FlipBit(_, bit) => b[bit / 8] ^= 1 << (bit % 8),
        Damage::Field(_, off, v) => {
            b[*off..*off + 4].copy_from_slice(&v.to_le_bytes());
            if let Some(at) = sealed {
                reseal(&mut b, at);
            }
        }
        Damage::Random(_, s) => {
            let mut rng = Rng::new(*s);
            for _ in 0..1 + rng.below(8) {
                let at = rng.index(BLOCK_SIZE);
                b[at] = rng.next_u64() as u8;
            }
            if let (Some(at), true) = (sealed, rng.chance(3, 4)) {
                reseal(&mut b, at);
            }
        }
        Damage::Truncate(_) => {}
    }
    dev.put(addr, &b);
    dev
}

/// The offsets whose u32 the field sweep sets.
fn field_offsets(t: Target, quick: bool) -> Vec<usize> {
    let step = if quick { 8 } else { 4 };
    let mut v: Vec<usize> = (8..if quick { 160 } else { 512 }).step_by(step).collect();
    if t == Target::Node {
        // The footer (node id, inode, offset, checkpoint version, ...).
        v.extend((FOOTER_AT..BLOCK_SIZE - 4).step_by(4).filter(|&o| o != FOOTER_AT + 4));
    }
    if t == Target::Dentry || t == Target::Checkpoint || t == Target::Journal {
        v.extend((512..BLOCK_SIZE).step_by(if quick { 500 } else { 124 }));
    }
    v
}

/// The damage list of one reference image.
pub fn sweep(r: &Reference, quick: bool, seed: u64) -> Vec<Damage> {
    let mut out = Vec::new();
    let per_kind = if quick { 2 } else { 6 };
    let values: &[u32] =
        if quick { &[0, u32::MAX, 0x8000_0000] } else { &[0, 1, u32::MAX, 0x8000_0000, 0x7FFF_FFFF, 4096] };
    for t in Target::ALL {
        let of_kind: Vec<u64> = r.blocks.iter().filter(|(k, _)| *k == t).map(|(_, a)| *a).collect();
        if of_kind.is_empty() {
            continue;
        }
        // Spread the chosen blocks over the ones found: first, last, and between.
        let n = of_kind.len().min(per_kind);
        let chosen: BTreeSet<u64> =
            (0..n).map(|i| of_kind[if n == 1 { 0 } else { i * (of_kind.len() - 1) / (n - 1) }]).collect();
        for a in chosen {
            out.push(Damage::Zero(a));
            out.push(Damage::Garbage(a, derive(seed, a)));
            for bit in [0usize, 37, 130, 4000, 32767] {
                out.push(Damage::FlipBit(a, bit));
            }
            for off in field_offsets(t, quick) {
                for &v in values {
                    out.push(Damage::Field(a, off, v));
                }
            }
        }
    }
    for n in [0, 1, 2, 8, r.main_blkaddr, r.main_blkaddr + 700, r.total_blocks / 2, r.total_blocks - 1] {
        out.push(Damage::Truncate(n));
    }
    out
}

/// Random damage to random classified blocks.
pub fn random_damage(r: &Reference, rng: &mut Rng, n: usize) -> Vec<Damage> {
    (0..n)
        .map(|_| {
            let (_, a) = r.blocks[rng.index(r.blocks.len())];
            Damage::Random(a, rng.next_u64())
        })
        .collect()
}

/// Peak resident set size of this process in bytes, if the kernel reports it.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets the peak to the current size (Linux 4.0+); false when not possible.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn current_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// What happened to one damaged image.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Panics, hangs, memory: the violations.
    pub violations: Vec<String>,
    /// The mount error, if mount refused the image.
    pub mount_error: Option<String>,
    /// Calls of the walk that returned an error (after a successful mount).
    pub walk_errors: usize,
    /// Problems fsck reported (or its error).
    pub fsck: String,
}

/// Mounts, walks, unmounts and fscks a damaged image.
fn exercise(dev: Arc<Overlay>) -> Outcome {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut out = Outcome::default();
        let opts = FsOptions { checkpoint_interval: None, ..Default::default() };
        match Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts) {
            Ok(fs) => {
                let fs = std::mem::ManuallyDrop::new(fs);
                out.walk_errors = walk(&fs).problems.len();
                let _ = std::mem::ManuallyDrop::into_inner(fs).unmount();
            }
            Err(e) => {
                let msg = e.to_string();
                if msg.trim().is_empty() {
                    out.violations.push("mount failed without a message".to_string());
                }
                out.mount_error = Some(msg);
            }
        }
        out.fsck = match fsck::check(&*dev, &FsckOptions::default()) {
            Ok(r) if r.is_clean() => "clean".into(),
            Ok(r) => format!("{} problem(s)", r.problems.len()),
            Err(e) => format!("error: {e}"),
        };
        out
    }));
    match r {
        Ok(o) => o,
        Err(p) => Outcome { violations: vec![format!("panic: {}", panic_text(&*p))], ..Default::default() },
    }
}

/// The outcome of one damaged image.
pub enum CaseResult {
    Done(Outcome),
    /// Did not finish in time (its thread is left behind).
    Hang,
}

/// Runs one damaged image in a thread of its own, with a timeout and a memory check.
pub fn run_case(dev: Overlay) -> CaseResult {
    let track = reset_peak_rss();
    let before = current_rss().unwrap_or(0);
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("crashtest-corrupt".into()).spawn(move || {
        let _ = tx.send(exercise(Arc::new(dev)));
    });
    let handle = match spawned {
        Ok(h) => h,
        Err(e) => {
            return CaseResult::Done(Outcome {
                violations: vec![format!("could not start a thread: {e}")],
                ..Default::default()
            })
        }
    };
    match rx.recv_timeout(CASE_TIMEOUT) {
        Ok(mut v) => {
            let _ = handle.join();
            if track {
                if let Some(peak) = peak_rss() {
                    if peak > before + MEMORY_BOUND {
                        v.violations.push(format!("peak memory grew by {} MiB", (peak - before) >> 20));
                    }
                }
            }
            CaseResult::Done(v)
        }
        Err(_) => CaseResult::Hang,
    }
}
