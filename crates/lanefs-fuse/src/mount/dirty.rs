//! How much dirty data the kernel may hold for the mount, and what keeps the daemon writing
//! while it does.
//!
//! The kernel gives every FUSE mount's writeback (its "bdi") a strict share of 1% of the dirty
//! memory: past that, a writer is throttled to the daemon's pace at once. The share exists
//! because an unprivileged server could otherwise pin dirty memory it never cleans. A lanefs
//! daemon is the image's one writer and cleans every page it is given, so by default the mount
//! takes the place a kernel file system's device has: no strict limit, and the whole dirty
//! budget to compete for (`strict_limit` 0, `max_ratio` 100 under /sys/class/bdi/MAJ:MIN).
//! `-o dirty_limit=strict` keeps the kernel's FUSE default.
//!
//! A daemon that cleans the kernel's dirty pages must not itself wait for them to be cleaned:
//! its own writes (to the image, which may sit on a file system with dirty pages of its own)
//! would otherwise be throttled against the global dirty count that this mount's pages make
//! up, and its allocations could enter reclaim that waits on this mount's writeback. The loop
//! driver's workers are marked for that; so is every thread of the daemon
//! (`PR_SET_IO_FLUSHER`: throttled on its own device's dirty pages only, and no I/O from its
//! allocations' reclaim), set before its threads start, which inherit it. The mark needs
//! CAP_SYS_RESOURCE, which root in a container may lack; without it the daemon still writes
//! on: its image writes are O_DIRECT (a block device, or a file on a disk file system) or go to
//! tmpfs, which has no writeback to throttle against, and the kernel's reclaim does not wait
//! on a FUSE mapping's writeback.

use std::path::PathBuf;

/// Marks the calling thread, and every thread it starts from now on, as one that writes back
/// for others (`PR_SET_IO_FLUSHER`; needs CAP_SYS_RESOURCE). An error says why not.
pub fn mark_io_flusher() -> Result<(), String> {
    rustix::process::configure_io_flusher_behavior(true)
        .map_err(|e| format!("cannot mark the daemon as an I/O flusher (PR_SET_IO_FLUSHER): {e}"))
}

/// The writeback settings of the mount whose device is `dev` ("MAJ:MIN", as
/// /proc/self/mountinfo gives it).
fn bdi_dir(dev: &str) -> Result<PathBuf, String> {
    let ok = dev.split_once(':').is_some_and(|(a, b)| {
        !a.is_empty() && !b.is_empty() && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
    });
    if !ok {
        return Err(format!("cannot set the dirty limit: {dev:?} is not a device number"));
    }
    Ok(PathBuf::from("/sys/class/bdi").join(dev))
}

/// Lifts the kernel's FUSE dirty limit for the mount on device `dev` (see the module doc).
/// An error says which setting could not be written; the mount works either way.
pub fn share_dirty_limit(dev: &str) -> Result<(), String> {
    let dir = bdi_dir(dev)?;
    for (name, value) in [("strict_limit", "0"), ("max_ratio", "100")] {
        let p = dir.join(name);
        std::fs::write(&p, value).map_err(|e| format!("cannot set the dirty limit: {}: {e}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_device_number_names_a_bdi() {
        assert_eq!(bdi_dir("0:39").unwrap(), PathBuf::from("/sys/class/bdi/0:39"));
        for bad in ["", "0", ":1", "1:", "0:39/../x", "a:b", "0:3 9"] {
            assert!(bdi_dir(bad).is_err(), "{bad:?}");
        }
    }

    /// Whether this process may use PR_SET_IO_FLUSHER (CAP_SYS_RESOURCE, which root in a
    /// container may lack).
    fn has_sys_resource() -> bool {
        const CAP_SYS_RESOURCE: u32 = 24;
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let eff =
            status.lines().find_map(|l| l.strip_prefix("CapEff:")).expect("CapEff in /proc/self/status");
        u64::from_str_radix(eff.trim(), 16).unwrap() & (1 << CAP_SYS_RESOURCE) != 0
    }

    /// With the capability, threads started after the mark carry it too; without it, the
    /// mark fails with a message that names what was refused.
    #[test]
    fn threads_started_after_the_mark_are_flushers_too() {
        // On a thread of its own, so the test harness's threads stay as they were.
        let t = std::thread::spawn(|| {
            let marked = mark_io_flusher();
            let inherited = std::thread::spawn(rustix::process::is_io_flusher).join().unwrap();
            (marked, inherited)
        });
        let (marked, inherited) = t.join().unwrap();
        if has_sys_resource() {
            assert_eq!(marked, Ok(()));
            assert!(inherited.unwrap(), "a thread started after the mark inherits it");
        } else {
            let e = marked.unwrap_err();
            assert!(e.contains("PR_SET_IO_FLUSHER"), "{e}");
        }
    }
}
