//! `lanefs fsck`: check (and repair) an image, with fsck(8)'s exit codes.

use super::open;
use lanefs::device::IoChoice;
use lanefs_bench::progress::Progress;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub fn fsck(image: &Path, repair: bool, nvm: Option<PathBuf>, io: IoChoice) -> ExitCode {
    let dev = match open(image, io) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("lanefs fsck: {e}");
            return ExitCode::from(8);
        }
    };
    let bar = Progress::new(0);
    let report =
        lanefs::fsck_with_progress(&dev, &lanefs::FsckOptions { repair, nvm }, &|phase, done, total| {
            bar.phase_at(phase, done, total)
        });
    bar.finish();
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lanefs fsck: {}: {e}", image.display());
            return ExitCode::from(8);
        }
    };
    for n in &report.notes {
        println!("note: {n}");
    }
    for p in &report.problems {
        let tag = if p.repaired { "repaired" } else { "error" };
        println!("{tag}: {}: {}", p.structure, p.message);
    }
    let s = &report.stats;
    println!(
        "{}: checkpoint {} (pack {}), {} inodes, {} directories, {} nodes, {} data blocks, {} xattr blocks: {}",
        image.display(),
        s.checkpoint_version,
        s.checkpoint_pack,
        s.inodes,
        s.directories,
        s.nodes,
        s.data_blocks,
        s.xattr_blocks,
        match report.exit_code() {
            0 => "clean".to_string(),
            1 => format!("{} errors corrected", report.problems.len()),
            _ =>
                format!("{} errors left uncorrected", report.problems.iter().filter(|p| !p.repaired).count()),
        }
    );
    ExitCode::from(report.exit_code() as u8)
}
