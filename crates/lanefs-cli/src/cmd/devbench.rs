//! `lanefs devbench`: the device's batched writes against one pwrite per block, or the
//! persistent-memory region's persist cost.

use lanefs::device::{self, IoChoice};
use lanefs_bench::device_bench::batch_bench;
use std::path::Path;

pub fn devbench(
    path: &Path,
    io: IoChoice,
    batch: usize,
    iterations: usize,
    size: u64,
    json: bool,
) -> Result<(), String> {
    if !path.exists() {
        device::create_image(path, size).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let r = batch_bench(path, io, batch, iterations).map_err(|e| format!("{}: {e}", path.display()))?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "path": path.display().to_string(), "io_mode": r.description, "batch_blocks": batch,
                "iterations": iterations, "batch_blocks_per_sec": r.batch_blocks_per_sec,
                "pwrite_blocks_per_sec": r.pwrite_blocks_per_sec, "ratio": r.ratio,
            })
        );
    } else {
        println!(
            "{}: {} batch {:.0} blocks/s, one pwrite per block {:.0} blocks/s, ratio {:.2}",
            path.display(),
            r.description,
            r.batch_blocks_per_sec,
            r.pwrite_blocks_per_sec,
            r.ratio
        );
    }
    Ok(())
}

pub fn pmem_bench(path: &Path, bytes: usize, iterations: usize, json: bool) -> Result<(), String> {
    let rs = lanefs::persist_bench(path, bytes, iterations, &[]).map_err(|e| e.to_string())?;
    if json {
        let rows: Vec<_> = rs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "method": r.method.to_string(), "region": r.description, "bytes": r.bytes,
                    "iterations": r.iterations, "persist_mean_ns": r.mean_ns, "persist_p50_ns": r.p50_ns,
                    "persist_p99_ns": r.p99_ns, "write_and_persist_ns": r.write_and_persist_ns,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "path": path.display().to_string(), "results": rows }));
    } else {
        if let Some(r) = rs.first() {
            println!("{}: {}", path.display(), r.description);
        }
        for r in &rs {
            println!("{r}");
        }
    }
    Ok(())
}
