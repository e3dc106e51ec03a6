//! Each family's workloads, derived from the seed, and the id that names one.
//!
//! A workload is a pure function of its family and key, and its id prints both, so that
//! `--replay ID` rebuilds the very workload a run found a violation in; `seq1` enumerates a
//! fixed list instead of drawing, so its keys index that list.

use super::workload::{record, Bases, Fault, Workload};
use lanefs::rng::{derive, Rng};
use std::sync::OnceLock;

use super::{gen, ops, workload, Family};

fn seq1_all() -> &'static Vec<Vec<ops::Op>> {
    static ALL: OnceLock<Vec<Vec<ops::Op>>> = OnceLock::new();
    ALL.get_or_init(gen::ace_seq1_all)
}

/// The key of the `i`-th workload of a family (an index for seq1, a seed otherwise).
pub(super) fn family_key(f: Family, seed: u64, i: u64) -> u64 {
    match f {
        Family::Seq1 => {
            // A different order per seed, every workload once.
            let n = seq1_all().len() as u64;
            let mut order: Vec<u64> = (0..n).collect();
            Rng::new(seed).shuffle(&mut order);
            order.get(i as usize).copied().unwrap_or(u64::MAX)
        }
        _ => derive(seed, (f as u64) << 32 | i),
    }
}

pub(super) fn workload_id(f: Family, key: u64) -> String {
    match f {
        Family::Seq1 => format!("seq1:{key}"),
        _ => format!("{}:{key:#x}", f.name()),
    }
}

/// Parses `family:key` (as printed in violations).
pub fn parse_id(id: &str) -> Result<(Family, u64), String> {
    let (f, k) = id.split_once(':').ok_or_else(|| format!("{id}: expected FAMILY:KEY"))?;
    let fam = Family::parse(f).ok_or_else(|| format!("{id}: unknown family {f}"))?;
    let key = match k.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => k.parse(),
    }
    .map_err(|_| format!("{id}: bad key {k}"))?;
    Ok((fam, key))
}

/// The `--avoid` name that leaves out the small journal limits under which background
/// checkpoints overlap a workload.
pub const BG_CHECKPOINT: &str = "bg-checkpoint";

/// Generates the workload `key` of family `f` (None: past the end of a finite family), without
/// the operation kinds in `avoid`, with a persistent-memory region when `nvm`.
pub fn make_workload(
    f: Family,
    key: u64,
    bases: &Bases,
    avoid: &[String],
    nvm: bool,
) -> Result<Option<Workload>, String> {
    let Some(mut w) = generate(f, key, bases, nvm)? else { return Ok(None) };
    for t in &mut w.threads {
        t.retain(|op| !avoid.iter().any(|a| a == op.kind()));
    }
    if avoid.iter().any(|a| a == BG_CHECKPOINT) {
        w.knobs.journal_blocks_limit = workload::Knobs::default().journal_blocks_limit;
    }
    Ok(Some(w))
}

fn generate(f: Family, key: u64, bases: &Bases, nvm: bool) -> Result<Option<Workload>, String> {
    let id = workload_id(f, key);
    let mut rng = Rng::new(key);
    let mut w = match f {
        Family::Seq1 => match seq1_all().get(key as usize) {
            Some(ops) => gen::ace_workload(id, ops.clone()),
            None => return Ok(None),
        },
        Family::Seq2 => gen::ace_workload(id, gen::ace_seq(2, &mut rng)),
        Family::Random => gen::random_workload(id, &mut rng),
        Family::MtLanes => gen::mt_lanes_workload(id, &mut rng),
        Family::MtRename => gen::mt_rename_workload(id, &mut rng),
        Family::MtCheckpoint => gen::mt_checkpoint_workload(id, &mut rng),
        Family::Gc => gen::gc_workload(id, &mut rng),
        Family::Faults => {
            let mut w = gen::fault_base(id, &mut rng);
            w.knobs.nvm = nvm;
            // A dry run counts the device calls, so the fault lands inside the workload.
            let dry = record(&w, bases)?;
            let writes = dry.write_calls.max(1);
            let flushes = dry.flush_calls.max(1);
            let mut r = Rng::new(derive(key, 0xFA17));
            let n = 1 + r.below(writes);
            w.fault = Some(match r.below(4) {
                0 => Fault::FailWrite(n),
                1 => Fault::ShortWrite(n, r.index(4)),
                2 => Fault::TornWrite(n, r.index(3), *r.pick(&[1, 512, 2048, 4000])),
                _ => Fault::FailFlush(1 + r.below(flushes)),
            });
            w
        }
        Family::Corrupt => return Err("corrupt cases are not workloads".into()),
    };
    w.knobs.nvm = nvm;
    Ok(Some(w))
}
