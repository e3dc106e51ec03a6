//! Corrupt and truncated images (ARCHITECTURE.md, contract 5).
//!
//! Two reference images are built — one cleanly unmounted, one left by a crash with journal
//! records to roll forward — and every metadata block is classified by its magic: superblock,
//! checkpoint pack, NAT, SIT, SSA, node (live ones: those the NAT names), dentry, journal and
//! xattr blocks. A deterministic sweep then damages chosen blocks of each kind: zeroed, filled with
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
use super::states::panic_text;
use super::workload::{record, Bases, Knobs, Setup, Workload};
use lanefs::device::{BlockDevice, BLOCK_SIZE};
use lanefs::format::codec::crc_skipping;
use lanefs::format::node::FOOTER_AT;
use lanefs::rng::{derive, Rng};
use lanefs::testing::checkpoint;
use lanefs::FsckOptions;
use lanefs::{Fs, FsOptions};
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long one damaged image may take (mount, walk, unmount, fsck).
pub const CASE_TIMEOUT: Duration = Duration::from_secs(30);
/// Peak resident memory a case may add.
pub const MEMORY_BOUND: u64 = 1 << 30;

/// The kinds of blocks the sweep damages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// Both superblock copies.
    Superblock,
    /// Checkpoint pack blocks.
    Checkpoint,
    /// NAT blocks.
    Nat,
    /// SIT blocks.
    Sit,
    /// SSA (segment summary) blocks.
    Ssa,
    /// Node blocks.
    Node,
    /// Dentry blocks.
    Dentry,
    /// Journal blocks.
    Journal,
    /// Xattr blocks.
    Xattr,
}

impl Target {
    /// Every target, in order.
    pub const ALL: [Target; 9] = [
        Target::Superblock,
        Target::Checkpoint,
        Target::Nat,
        Target::Sit,
        Target::Ssa,
        Target::Node,
        Target::Dentry,
        Target::Journal,
        Target::Xattr,
    ];
    /// The target's name in reports.
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
            Target::Xattr => "xattr",
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
    /// The workload that built the image.
    pub name: &'static str,
    /// The undamaged image.
    pub image: Arc<Vec<u8>>,
    /// Its metadata blocks, by kind: (kind, address).
    pub blocks: Vec<(Target, u64)>,
    /// Size of the image in blocks.
    pub total_blocks: u64,
    /// First block of the main area.
    pub main_blkaddr: u64,
}

/// The operations of the reference images: directories, files with data (one past the
/// inode's direct addresses, so it has a direct node), hard links, xattrs (a set too large for
/// its node, in xattr blocks, too).
pub(crate) const REFERENCE_OPS: &str = "mkdir /A/D; create /A/D/x; write /A/D/x 0 9000 5; create /big; \
    write /big 0 4096 6; write /big 4194304 8192 7; link /A/foo /B/foo2; setxattr /A/foo user.q 40 8; \
    create /B/e; rename /B/e /A/e; setxattr /A/e user.big 9000 3; setxattr /A/e user.big2 300 4; \
    sync; create /j1; write /j1 0 6000 9; fsync /j1; mkdir /J; create /J/k; write /J/k 100 3000 10; \
    setxattr /J/k user.j 20000 5; fsync /J/k; rename /A/bar /J/bar; fsync /J; \
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
            b"LNXA" => Some(Target::Xattr),
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
    /// The block at this address zeroed.
    Zero(u64),
    /// The block at this address filled with garbage from this seed.
    Garbage(u64, u64),
    /// One bit (the second number) of the block flipped.
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
    if t == Target::Dentry || t == Target::Checkpoint || t == Target::Journal || t == Target::Xattr {
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
        out.fsck = match lanefs::fsck(&*dev, &FsckOptions::default()) {
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
    /// Finished, with its outcome.
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

/// The clean reference image, built once (for the fuzz entry points).
fn fuzz_reference() -> Option<&'static Reference> {
    static REF: OnceLock<Option<Reference>> = OnceLock::new();
    REF.get_or_init(|| {
        references(&Bases::default()).ok().and_then(|v| v.into_iter().find(|r| r.name == "clean"))
    })
    .as_ref()
}

/// Byte offset of the payload checksum in a checkpoint pack's first and last blocks
/// (magic, crc, version, flags, pack blocks, payload length, payload crc).
const CP_PAYLOAD_CRC_AT: usize = 28;
const CP_PAYLOAD_LEN_AT: usize = 24;

/// Recomputes a checkpoint pack's payload checksum (so that decoding goes past it).
fn fix_checkpoint_payload(pack: &mut [u8]) {
    let n = pack.len() / BLOCK_SIZE;
    if n < 3 {
        return;
    }
    let len = u32::from_le_bytes(pack[CP_PAYLOAD_LEN_AT..CP_PAYLOAD_LEN_AT + 4].try_into().expect("4 bytes"))
        as usize;
    let payload: Vec<u8> = pack[BLOCK_SIZE..(n - 1) * BLOCK_SIZE]
        .chunks(BLOCK_SIZE)
        .flat_map(|b| b[lanefs::format::codec::HEADER_LEN..].iter().copied())
        .take(len)
        .collect();
    let crc = crc32c::crc32c(&payload).to_le_bytes();
    for idx in [0, n - 1] {
        pack[idx * BLOCK_SIZE + CP_PAYLOAD_CRC_AT..idx * BLOCK_SIZE + CP_PAYLOAD_CRC_AT + 4]
            .copy_from_slice(&crc);
    }
}

/// One structure-aware mutation: `data[0]` picks the kind of block, `data[1]` the block of that
/// kind in the reference image, the rest is XORed over it (a checkpoint: over its whole pack;
/// SSA: over both blocks of a summary); then every checksum is recomputed so that decoding
/// reaches the fields. Returns the kind, the first block's address and the mutated bytes.
fn fuzz_mutation(r: &Reference, g: &lanefs::format::Geometry, data: &[u8]) -> Option<(Target, u64, Vec<u8>)> {
    let (&k, rest) = data.split_first()?;
    let (&sel, pattern) = rest.split_first()?;
    let kind = Target::ALL[k as usize % Target::ALL.len()];
    let of_kind: Vec<u64> = r.blocks.iter().filter(|(t, _)| *t == kind).map(|(_, a)| *a).collect();
    if of_kind.is_empty() {
        return None;
    }
    let mut addr = of_kind[sel as usize % of_kind.len()];
    let blocks = match kind {
        Target::Checkpoint => {
            // The pack that holds the block.
            let pack = (addr - g.cp_blkaddr) / g.cp_pack_blocks as u64;
            addr = g.cp_pack_addr(pack.min(1) as u32);
            g.cp_pack_blocks as u64
        }
        Target::Ssa => {
            addr -= (addr - g.ssa_blkaddr) % lanefs::format::ssa::SSA_BLOCKS_PER_SEG as u64;
            lanefs::format::ssa::SSA_BLOCKS_PER_SEG as u64
        }
        _ => 1,
    };
    let start = addr as usize * BLOCK_SIZE;
    let mut bytes = r.image.get(start..start + blocks as usize * BLOCK_SIZE)?.to_vec();
    let seals: Vec<Option<usize>> = bytes.chunks(BLOCK_SIZE).map(seal_at).collect();
    let n = bytes.len();
    for (i, x) in pattern.iter().enumerate().take(1 << 16) {
        bytes[i % n] ^= x;
    }
    if kind == Target::Checkpoint {
        fix_checkpoint_payload(&mut bytes);
    }
    for (chunk, s) in bytes.chunks_mut(BLOCK_SIZE).zip(seals) {
        if let Some(at) = s {
            reseal(chunk, at);
        }
    }
    Some((kind, addr, bytes))
}

/// Fuzz entry point for the decoders (`fuzz/fuzz_targets/decode.rs`): a reference block of the
/// kind `data` picks, mutated and resealed, through its decoder. Must never panic.
pub fn fuzz_decoders(data: &[u8]) {
    let Some(r) = fuzz_reference() else { return };
    let Ok(g) = lanefs::format::Geometry::compute(r.total_blocks, super::workload::LANES) else { return };
    let Some((kind, addr, b)) = fuzz_mutation(r, &g, data) else { return };
    use lanefs::format::*;
    let at = Some(addr);
    let header_a = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    match kind {
        Target::Superblock => {
            let _ = Superblock::decode(&b, at);
        }
        Target::Checkpoint => {
            let _ = Checkpoint::decode(&b, &g, addr);
        }
        Target::Nat => {
            let _ = NatBlock::decode(&b, ((addr - g.nat_blkaddr) % g.nat_blocks as u64) as u32, &g, at);
        }
        Target::Sit => {
            let _ = SitBlock::decode(&b, ((addr - g.sit_blkaddr) % g.sit_blocks as u64) as u32, at);
        }
        Target::Ssa => {
            let segno = SegNo(((addr - g.ssa_blkaddr) / ssa::SSA_BLOCKS_PER_SEG as u64) as u32);
            let _ = SegmentSummary::decode(&b, segno, g.max_nid, at);
        }
        Target::Node => {
            let _ = Node::decode(&b, &g, at);
        }
        Target::Dentry => {
            let _ = DentryBlock::decode(&b, header_a, g.max_nid, at);
        }
        Target::Journal => {
            if let Ok(j) = JournalBlock::decode(&b, &g, at) {
                let _ = lanefs::testing::journal::Transaction::decode(j.payload.get(4..).unwrap_or(&[]));
            }
            let _ = lanefs::testing::journal::Transaction::decode(&data[2.min(data.len())..]);
        }
        Target::Xattr => {
            let index = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
            if let Ok(p) = xattr::decode_block(&b, header_a, index, at) {
                let _ = xattr::decode_stream(p, at);
            }
        }
    }
}

/// Fuzz entry point for mount (`fuzz/fuzz_targets/mount.rs`): the reference image with one
/// block mutated as in [`fuzz_decoders`], mounted, read whole, unmounted and checked by fsck.
/// Returns the violations (a panic, an empty error); a fuzz target asserts there are none.
pub fn fuzz_mount(data: &[u8]) -> Vec<String> {
    let Some(r) = fuzz_reference() else { return vec![] };
    let Ok(g) = lanefs::format::Geometry::compute(r.total_blocks, super::workload::LANES) else {
        return vec![];
    };
    let Some((_, addr, b)) = fuzz_mutation(r, &g, data) else { return vec![] };
    let dev = Overlay::new(r.image.clone());
    for (k, chunk) in b.chunks(BLOCK_SIZE).enumerate() {
        dev.put(addr + k as u64, chunk);
    }
    exercise(Arc::new(dev)).violations
}

/// Runs `n` pseudo-random decoder cases from `seed`; returns the panics.
pub fn decoder_cases(seed: u64, n: usize) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for i in 0..n {
        let len = 2 + rng.index(64);
        let mut data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        // Mostly sparse patterns: a few bytes changed at chosen offsets.
        if rng.chance(3, 4) {
            let mut sparse = vec![0u8; 3 + rng.index(BLOCK_SIZE)];
            sparse[0] = data[0];
            sparse[1] = data[1];
            for _ in 0..1 + rng.index(4) {
                let at = 2 + rng.index(sparse.len() - 2);
                sparse[at] = rng.next_u64() as u8 | 1;
            }
            data = sparse;
        }
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| fuzz_decoders(&data))) {
            out.push(format!(
                "decoder case {i} (seed {seed}, input {} bytes): panic: {}",
                data.len(),
                panic_text(&*p)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_entry_points_run() {
        assert!(decoder_cases(7, 300).is_empty());
        for k in 0..8u8 {
            assert!(fuzz_mount(&[k, 1, 0, 0, 0, 0, 0, 0, 0xFF]).is_empty());
        }
    }
}
