//! `--compare`: the reference file systems, set up and torn down by the harness itself.
//!
//! ARCHITECTURE.md ("Measuring") asks for every claim as a ratio against references measured in the
//! same run: ext4, xfs and btrfs on loop devices over RAM-backed files in /dev/shm (so software,
//! not the medium, is the bottleneck, as in the papers' RAM-disk runs), tmpfs as the in-memory
//! upper bound, and bindfs over tmpfs as the ceiling for any FUSE file system.
//!
//! `--images-in DIR` puts the loop devices' image files and the lanefs rows' images in DIR
//! instead (a directory on a disk: the same comparison where the medium costs something).
//!
//! Everything this module creates (a base directory under /tmp, image files, loop devices,
//! mounts) is recorded in a [`Setup`] the moment it exists and undone in reverse order by its
//! exact path: on success, on error, on panic (Drop) and after Ctrl-C/SIGTERM (the runner turns
//! those into an orderly stop). Nothing is ever unmounted, detached or removed by name or
//! pattern, and nothing this process did not create.

use crate::progress::say;
use crate::target::{DirTarget, Target};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Size of each RAM-backed image (sparse: only written blocks take memory) and tmpfs mount.
const IMAGE_BYTES: u64 = 2 << 30;
const TMPFS_SIZE: &str = "size=2g,mode=0755";

/// A reference file system that `--compare` sets up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    Ext4,
    Xfs,
    Btrfs,
    Tmpfs,
    Bindfs,
}

impl Reference {
    pub const ALL: [Reference; 5] =
        [Reference::Ext4, Reference::Xfs, Reference::Btrfs, Reference::Tmpfs, Reference::Bindfs];

    pub fn name(self) -> &'static str {
        match self {
            Reference::Ext4 => "ext4",
            Reference::Xfs => "xfs",
            Reference::Btrfs => "btrfs",
            Reference::Tmpfs => "tmpfs",
            Reference::Bindfs => "bindfs",
        }
    }

    /// The mkfs program and its quiet/force arguments, for the loop-device references.
    fn mkfs(self) -> Option<(&'static str, &'static [&'static str])> {
        match self {
            // Initialise inode tables and journal now, not in a background thread during the
            // runs (ext4lazyinit would otherwise write behind the benchmark's back).
            Reference::Ext4 => {
                Some(("mkfs.ext4", &["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]))
            }
            Reference::Xfs => Some(("mkfs.xfs", &["-q", "-f"])),
            Reference::Btrfs => Some(("mkfs.btrfs", &["-q", "-f"])),
            Reference::Tmpfs | Reference::Bindfs => None,
        }
    }

    /// Programs this reference needs.
    fn tools(self) -> Vec<&'static str> {
        let mut v = vec!["mount", "umount"];
        if let Some((mkfs, _)) = self.mkfs() {
            v.extend(["losetup", mkfs]);
        }
        if self == Reference::Bindfs {
            v.push("bindfs");
        }
        v
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Reference {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Reference::ALL
            .into_iter()
            .find(|r| r.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown reference {s:?}; known: ext4, xfs, btrfs, tmpfs, bindfs"))
    }
}

/// A lanefs subject that `--compare` measures against the references, each on a fresh image of
/// the default geometry beside the references' images (/dev/shm unless `--images-in`), removed
/// afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanefs {
    /// The library API, in process (`lib:`).
    Lib,
    /// Through FUSE, mounted with the `lanefs mount` executable (`mount:`).
    Mount,
}

impl Lanefs {
    pub const ALL: [Lanefs; 2] = [Lanefs::Lib, Lanefs::Mount];

    /// Its row label in the tables.
    pub fn label(self) -> &'static str {
        match self {
            Lanefs::Lib => "lanefs-lib",
            Lanefs::Mount => "lanefs-mount",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Lanefs::Lib => "lib",
            Lanefs::Mount => "mount",
        }
    }

    /// Why it cannot run here with its image in `images_in`, if it cannot.
    pub fn unavailable(self, images_in: &Path) -> Option<String> {
        if !images_in.is_dir() {
            return Some(format!("{}: skipped (no {})", self.label(), images_in.display()));
        }
        if self == Lanefs::Mount {
            if let Some(why) =
                crate::target::mount::unavailable().or_else(|| crate::target::mount::lanefs_bin().err())
            {
                return Some(format!("{}: skipped ({why})", self.label()));
            }
        }
        None
    }
}

/// The `--lanefs` list: `lib`, `mount`, both (the default) or `none`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LanefsList(pub Vec<Lanefs>);

impl std::str::FromStr for LanefsList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let k = match part.to_ascii_lowercase().as_str() {
                "none" => continue,
                "lib" | "lanefs-lib" => Lanefs::Lib,
                "mount" | "lanefs-mount" => Lanefs::Mount,
                _ => return Err(format!("unknown lanefs target {part:?}; known: lib, mount, none")),
            };
            if !out.contains(&k) {
                out.push(k);
            }
        }
        Ok(LanefsList(out))
    }
}

/// Looks `name` up in PATH and the sbin directories (mkfs and losetup live there, and a
/// non-login root shell may not have them in PATH).
fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs a program to completion; its first stderr line becomes the error.
fn run(tool: &str, args: &[&OsStr]) -> Result<String, String> {
    let exe = find_tool(tool).ok_or_else(|| format!("{tool} not found"))?;
    let out = Command::new(&exe).args(args).output().map_err(|e| format!("{tool}: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
    Err(format!(
        "{tool} failed ({}){}",
        out.status,
        if first.is_empty() { String::new() } else { format!(": {first}") }
    ))
}

/// One thing to undo, by exact path.
#[derive(Debug)]
enum Undo {
    RemoveDir(PathBuf),
    RemoveFile(PathBuf),
    DetachLoop(PathBuf),
    Unmount(PathBuf),
}

fn undo(u: &Undo) -> Result<(), String> {
    match u {
        // remove_dir, never remove_dir_all: a directory that still holds anything (a mount
        // that did not go away) stays, and the error says so.
        Undo::RemoveDir(p) => fs::remove_dir(p).map_err(|e| format!("rmdir {}: {e}", p.display())),
        // Gone already is fine: a lanefs image whose creation failed was removed at once.
        Undo::RemoveFile(p) => match fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("rm {}: {e}", p.display())),
            _ => Ok(()),
        },
        Undo::DetachLoop(dev) => run("losetup", &[OsStr::new("-d"), dev.as_os_str()]).map(drop),
        Undo::Unmount(p) => {
            // A file system can stay busy for a moment after the last close (FUSE daemons,
            // btrfs workers): retry before reporting.
            let mut last = String::new();
            for _ in 0..20 {
                match run("umount", &[p.as_os_str()]) {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e,
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(format!("umount {}: {last}", p.display()))
        }
    }
}

/// Everything `--compare` created, in creation order.
pub struct Setup {
    base: PathBuf,
    /// Where image files go (/dev/shm unless `--images-in`).
    images_in: PathBuf,
    undo: Vec<Undo>,
    seq: u32,
}

impl Setup {
    /// Creates a fresh `/tmp/lanefs-bench-PID-XXXXXXXX` for the mount points; image files
    /// will go in `images_in`.
    pub fn new(images_in: &Path) -> Result<Setup, String> {
        let base = crate::target::mount::fresh_dir(Path::new("/tmp"), "lanefs-bench")?;
        Ok(Setup { undo: vec![Undo::RemoveDir(base.clone())], base, images_in: images_in.into(), seq: 0 })
    }

    /// Why `r` cannot be set up here with its image in `images_in`, if it cannot.
    pub fn unavailable(r: Reference, images_in: &Path) -> Option<String> {
        if !rustix::process::geteuid().is_root() {
            return Some(format!("{r}: skipped (mounting needs root)"));
        }
        if let Some(t) = r.tools().into_iter().find(|t| find_tool(t).is_none()) {
            return Some(format!("{r}: skipped ({t} not found)"));
        }
        if r.mkfs().is_some() && !images_in.is_dir() {
            return Some(format!("{r}: skipped (no {})", images_in.display()));
        }
        if r == Reference::Bindfs && !Path::new("/dev/fuse").exists() {
            return Some(format!("{r}: skipped (no /dev/fuse)"));
        }
        None
    }

    /// Sets `r` up and returns a target at its mount point. On failure whatever was created
    /// for it is undone at once.
    pub fn add(&mut self, r: Reference) -> Result<Box<dyn Target>, String> {
        let mut mine = Vec::new();
        let res = self.build(r, &mut mine);
        match res {
            Ok(dir) => {
                self.undo.extend(mine);
                let t = DirTarget::new(&dir)?;
                Ok(Box::new(t))
            }
            Err(e) => {
                for u in mine.iter().rev() {
                    if let Err(e2) = undo(u) {
                        say(&format!("lanefs bench: cleanup: {e2}"));
                    }
                }
                Err(format!("{r}: {e}"))
            }
        }
    }

    /// Sets up a lanefs subject on a fresh image (removed by [`Setup::cleanup`], which runs
    /// after the target is closed). On failure the image is removed at once.
    pub fn add_lanefs(&mut self, k: Lanefs) -> Result<Box<dyn Target>, String> {
        let img = self.image(&format!("lanefs-{}", k.short()));
        if img.exists() {
            return Err(format!("{}: {} exists already", k.label(), img.display()));
        }
        // Recorded before it exists, so that an interrupted creation is cleaned up too.
        let undo_img = Undo::RemoveFile(img.clone());
        let opened: Result<Box<dyn Target>, String> = match k {
            Lanefs::Lib => {
                crate::target::library::LibTarget::open(&img).map(|t| Box::new(t) as Box<dyn Target>)
            }
            Lanefs::Mount => {
                crate::target::mount::MountTarget::open(&img).map(|t| Box::new(t) as Box<dyn Target>)
            }
        };
        match opened {
            Ok(t) => {
                self.undo.push(undo_img);
                Ok(t)
            }
            Err(e) => {
                if let Err(e2) = undo(&undo_img) {
                    say(&format!("lanefs bench: cleanup: {e2}"));
                }
                Err(format!("{}: {e}", k.label()))
            }
        }
    }

    /// A fresh image path in the images directory, named after this setup.
    fn image(&mut self, what: &str) -> PathBuf {
        self.seq += 1;
        self.images_in.join(format!(
            "{}-{}-{what}.img",
            self.base.file_name().and_then(|s| s.to_str()).unwrap_or("lanefs-bench"),
            self.seq
        ))
    }

    fn mount_dir(&mut self, name: &str, mine: &mut Vec<Undo>) -> Result<PathBuf, String> {
        let p = self.base.join(name);
        fs::create_dir(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        mine.push(Undo::RemoveDir(p.clone()));
        Ok(p)
    }

    fn tmpfs(&mut self, name: &str, mine: &mut Vec<Undo>) -> Result<PathBuf, String> {
        let dir = self.mount_dir(name, mine)?;
        let o = [OsStr::new("-t"), OsStr::new("tmpfs"), OsStr::new("-o"), OsStr::new(TMPFS_SIZE)];
        let mut args: Vec<&OsStr> = o.to_vec();
        args.extend([OsStr::new("lanefs-bench"), dir.as_os_str()]);
        run("mount", &args)?;
        mine.push(Undo::Unmount(dir.clone()));
        Ok(dir)
    }

    fn build(&mut self, r: Reference, mine: &mut Vec<Undo>) -> Result<PathBuf, String> {
        if let Some((mkfs, mkfs_args)) = r.mkfs() {
            let img = self.image(r.name());
            let f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&img)
                .map_err(|e| format!("{}: {e}", img.display()))?;
            mine.push(Undo::RemoveFile(img.clone()));
            f.set_len(IMAGE_BYTES).map_err(|e| format!("truncate {}: {e}", img.display()))?;
            drop(f);
            let dev = run("losetup", &[OsStr::new("--find"), OsStr::new("--show"), img.as_os_str()])?;
            if !dev.starts_with("/dev/") {
                return Err(format!("losetup printed {dev:?}, not a device"));
            }
            let dev = PathBuf::from(dev);
            mine.push(Undo::DetachLoop(dev.clone()));
            let mut args: Vec<&OsStr> = mkfs_args.iter().map(OsStr::new).collect();
            args.push(dev.as_os_str());
            run(mkfs, &args)?;
            let dir = self.mount_dir(r.name(), mine)?;
            run("mount", &[OsStr::new("-t"), OsStr::new(r.name()), dev.as_os_str(), dir.as_os_str()])?;
            mine.push(Undo::Unmount(dir.clone()));
            return Ok(dir);
        }
        match r {
            Reference::Tmpfs => self.tmpfs("tmpfs", mine),
            _ => {
                let src = self.tmpfs("bindfs-src", mine)?;
                let dir = self.mount_dir("bindfs", mine)?;
                // Multithreaded like the lanefs mount; single-threaded bindfs would cap every
                // 2-thread run at one core.
                run("bindfs", &[OsStr::new("--multithreaded"), src.as_os_str(), dir.as_os_str()])?;
                mine.push(Undo::Unmount(dir.clone()));
                Ok(dir)
            }
        }
    }

    /// Undoes everything, newest first; returns what could not be undone.
    pub fn cleanup(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        while let Some(u) = self.undo.pop() {
            if let Err(e) = undo(&u) {
                errors.push(e);
            }
        }
        errors
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for e in self.cleanup() {
            say(&format!("lanefs bench: cleanup: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_names() {
        for r in Reference::ALL {
            assert_eq!(r.name().parse::<Reference>(), Ok(r));
        }
        assert!("zfs".parse::<Reference>().is_err());
        assert!(Reference::Ext4.tools().contains(&"losetup"));
        assert!(Reference::Bindfs.tools().contains(&"bindfs"));
    }

    #[test]
    fn lanefs_list() {
        assert_eq!("lib,mount".parse::<LanefsList>(), Ok(LanefsList(Lanefs::ALL.to_vec())));
        assert_eq!("none".parse::<LanefsList>(), Ok(LanefsList(vec![])));
        assert_eq!(
            " Mount ,lib,mount".parse::<LanefsList>(),
            Ok(LanefsList(vec![Lanefs::Mount, Lanefs::Lib]))
        );
        assert!("fuse".parse::<LanefsList>().is_err());
    }

    #[test]
    fn lanefs_lib_subject_image_is_removed() {
        if Lanefs::Lib.unavailable(Path::new("/dev/shm")).is_some() {
            eprintln!("skipped: no /dev/shm");
            return;
        }
        let mut s = Setup::new(Path::new("/dev/shm")).unwrap();
        let t = s.add_lanefs(Lanefs::Lib).unwrap();
        let img = PathBuf::from(format!(
            "/dev/shm/{}-1-lanefs-lib.img",
            s.base.file_name().unwrap().to_str().unwrap()
        ));
        assert!(img.is_file(), "{}", img.display());
        t.mkdir(Path::new("d")).unwrap();
        t.close().unwrap();
        drop(t);
        assert!(s.cleanup().is_empty());
        assert!(!img.exists() && !s.base.exists());
    }

    #[test]
    fn lanefs_subject_image_goes_in_the_images_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Setup::new(dir.path()).unwrap();
        let t = s.add_lanefs(Lanefs::Lib).unwrap();
        let imgs: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(imgs.len(), 1, "{imgs:?}");
        assert!(imgs[0].to_string_lossy().ends_with("-1-lanefs-lib.img"), "{imgs:?}");
        t.close().unwrap();
        drop(t);
        assert!(s.cleanup().is_empty());
        assert!(!imgs[0].exists());
        assert!(Lanefs::Lib.unavailable(&dir.path().join("missing")).is_some());
        assert!(Setup::unavailable(Reference::Ext4, &dir.path().join("missing")).is_some());
    }

    #[test]
    fn setup_removes_its_base_directory() {
        let mut s = Setup::new(Path::new("/dev/shm")).unwrap();
        let base = s.base.clone();
        assert!(base.is_dir() && base.starts_with("/tmp"));
        assert!(s.cleanup().is_empty());
        assert!(!base.exists());
    }

    #[test]
    fn failing_tool_is_one_line() {
        let e = run("sh", &[OsStr::new("-c"), OsStr::new("echo first >&2; echo second >&2; exit 3")])
            .unwrap_err();
        assert!(e.contains("first") && !e.contains("second") && !e.contains('\n'), "{e}");
    }
}
