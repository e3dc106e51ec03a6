//! The subcommands, one module each; what several share is here: opening an image, the
//! default lane count, and writing a command's output.

/// `writeln!` into a `String` (which cannot fail).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

pub mod crashtest;
pub mod devbench;
pub mod fsck;
pub mod inspect;
pub mod mkfs;

use lanefs::device::{self, DeviceOptions, IoChoice};
use std::path::Path;

pub fn open(path: &Path, io: IoChoice) -> Result<device::FileDevice, String> {
    device::FileDevice::open(path, DeviceOptions { io }).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn default_lanes() -> u32 {
    std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1).clamp(1, 64)
}

/// Writes a command's whole output to stdout. A reader that went away (`lanefs inspect | head`)
/// is not an error: the output was simply not wanted any more.
pub fn emit(out: &str) -> Result<(), String> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("writing to stdout: {e}")),
        _ => Ok(()),
    }
}

pub fn umount(mountpoint: &Path) -> Result<(), String> {
    if let Some(note) = lanefs_fuse::umount_command(mountpoint, std::time::Duration::from_secs(120))? {
        eprintln!("lanefs umount: {note}");
    }
    Ok(())
}

/// `lanefs bench`: the harness lives in the lanefs-bench crate.
pub fn bench(args: &lanefs_bench::BenchArgs) -> Result<(), String> {
    lanefs_bench::run(args)
}
