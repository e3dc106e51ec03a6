//! Runs `lanefs_bench::device_bench::batch_bench` on a file or block device.
//!
//! Usage: batch_bench PATH [auto|uring|sync] [BATCH_BLOCKS=64] [ITERATIONS=2000]
//!
//! Destructive: overwrites the first 64 MiB or more of PATH. Create an image first, e.g.
//! `truncate -s 256M /dev/shm/bench.img`.

use std::path::PathBuf;
use std::process::ExitCode;

use lanefs::device::IoChoice;
use lanefs_bench::device_bench::batch_bench;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first().map(PathBuf::from) else {
        eprintln!("usage: batch_bench PATH [auto|uring|sync] [BATCH_BLOCKS=64] [ITERATIONS=2000]");
        return ExitCode::from(2);
    };
    let parsed = (|| -> Result<(IoChoice, usize, usize), String> {
        let io = args.get(1).map_or(Ok(IoChoice::Auto), |s| s.parse())?;
        let batch = args.get(2).map_or(Ok(64), |s| s.parse().map_err(|e| format!("{s}: {e}")))?;
        let iters = args.get(3).map_or(Ok(2000), |s| s.parse().map_err(|e| format!("{s}: {e}")))?;
        Ok((io, batch, iters))
    })();
    let (io, batch, iters) = match parsed {
        Ok(v) => v,
        Err(e) => {
            eprintln!("batch_bench: {e}");
            return ExitCode::from(2);
        }
    };
    match batch_bench(&path, io, batch, iters) {
        Ok(r) => {
            println!("{r}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("batch_bench: {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}
