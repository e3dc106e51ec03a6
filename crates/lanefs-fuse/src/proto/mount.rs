//! Mounting a FUSE file system: mount(2) with the /dev/fuse descriptor as root, or the setuid
//! `fusermount3` helper otherwise (and for `auto_unmount`, which only the helper does).
//!
//! The helper is given one end of a socket pair in `_FUSE_COMMFD`, mounts, and sends the
//! /dev/fuse descriptor back over it (SCM_RIGHTS). With `auto_unmount` it then stays, and
//! unmounts when its end of the socket closes, that is when this process exits.

use super::dev::DevFuse;
use rustix::mount::MountFlags;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A mount option: a flag of mount(2), or an option string the kernel (or the helper) reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MountOption {
    RO,
    RW,
    Dev,
    NoDev,
    Suid,
    NoSuid,
    Exec,
    NoExec,
    DirSync,
    Sync,
    Async,
    NoAtime,
    DefaultPermissions,
    AutoUnmount,
    /// The source shown in the mount table.
    FSName(String),
    /// Anything else, passed on as it is.
    CUSTOM(String),
}

/// Who may use the mount besides its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionACL {
    Owner,
    RootAndOwner,
    All,
}

impl MountOption {
    /// The mount(2) flag this option sets, if it is one.
    fn flag(&self) -> Option<MountFlags> {
        Some(match self {
            MountOption::RO => MountFlags::RDONLY,
            MountOption::NoDev => MountFlags::NODEV,
            MountOption::NoSuid => MountFlags::NOSUID,
            MountOption::NoExec => MountFlags::NOEXEC,
            MountOption::DirSync => MountFlags::DIRSYNC,
            MountOption::Sync => MountFlags::SYNCHRONOUS,
            MountOption::NoAtime => MountFlags::NOATIME,
            MountOption::RW
            | MountOption::Dev
            | MountOption::Suid
            | MountOption::Exec
            | MountOption::Async => MountFlags::empty(),
            _ => return None,
        })
    }

    /// The option as the helper (and mount(8)) spells it.
    fn word(&self) -> String {
        match self {
            MountOption::RO => "ro".into(),
            MountOption::RW => "rw".into(),
            MountOption::Dev => "dev".into(),
            MountOption::NoDev => "nodev".into(),
            MountOption::Suid => "suid".into(),
            MountOption::NoSuid => "nosuid".into(),
            MountOption::Exec => "exec".into(),
            MountOption::NoExec => "noexec".into(),
            MountOption::DirSync => "dirsync".into(),
            MountOption::Sync => "sync".into(),
            MountOption::Async => "async".into(),
            MountOption::NoAtime => "noatime".into(),
            MountOption::DefaultPermissions => "default_permissions".into(),
            MountOption::AutoUnmount => "auto_unmount".into(),
            MountOption::FSName(n) => format!("fsname={n}"),
            MountOption::CUSTOM(c) => c.clone(),
        }
    }
}

/// A mount made here; unmounted on drop unless [`Mounted::forget`] says it is gone already.
pub struct Mounted {
    mountpoint: PathBuf,
    by_helper: bool,
    /// The helper's socket, kept open while the helper watches it (`auto_unmount`).
    _helper: Option<OwnedFd>,
    live: bool,
}

impl Mounted {
    /// The kernel ended the connection (the file system was unmounted): nothing to undo.
    pub fn forget(mut self) {
        self.live = false;
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        if self.by_helper {
            unmount_by_helper(&self.mountpoint);
        } else {
            let _ = rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// `fusermount3 -u -z -- MOUNTPOINT`, quietly: the setuid helper lazily unmounts what this
/// user mounted (for those who cannot call umount2 themselves).
pub fn unmount_by_helper(mountpoint: &Path) {
    let _ = Command::new("fusermount3")
        .args(["-u", "-z", "--"])
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Mounts a FUSE file system on `mountpoint`; the descriptor to serve it and the mount.
pub fn mount(mountpoint: &Path, options: &[MountOption], acl: SessionACL) -> io::Result<(DevFuse, Mounted)> {
    let auto_unmount = options.contains(&MountOption::AutoUnmount);
    if !auto_unmount {
        match mount_directly(mountpoint, options, acl) {
            Ok(dev) => {
                let m =
                    Mounted { mountpoint: mountpoint.into(), by_helper: false, _helper: None, live: true };
                return Ok((dev, m));
            }
            // Not root (or not allowed here): the helper may.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            Err(e) => return Err(e),
        }
    }
    mount_by_helper(mountpoint, options, acl)
}

fn acl_option(acl: SessionACL) -> Option<&'static str> {
    match acl {
        SessionACL::Owner => None,
        // The kernel knows only allow_other; the session filters to root and the owner.
        SessionACL::RootAndOwner | SessionACL::All => Some("allow_other"),
    }
}

/// mount(2) of type "fuse" with the descriptor in the options (root only).
fn mount_directly(mountpoint: &Path, options: &[MountOption], acl: SessionACL) -> io::Result<DevFuse> {
    let mode = std::fs::metadata(mountpoint)?.permissions().mode();
    let dev = DevFuse::open()?;
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        dev.as_file().as_raw_fd(),
        // The root's type and permissions until the kernel's first GETATTR of it.
        mode & (libc::S_IFMT | 0o7777),
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw()
    );
    // nodev and nosuid unless asked otherwise, as libfuse and fusermount3 do.
    let mut flags = MountFlags::empty();
    if !options.contains(&MountOption::Dev) {
        flags |= MountFlags::NODEV;
    }
    if !options.contains(&MountOption::Suid) {
        flags |= MountFlags::NOSUID;
    }
    let mut source = "lanefs".to_string();
    for o in options {
        match (o, o.flag()) {
            (_, Some(f)) => flags |= f,
            (MountOption::FSName(n), None) => source = n.clone(),
            (o, None) => {
                data.push(',');
                data.push_str(&o.word());
            }
        }
    }
    if let Some(a) = acl_option(acl) {
        data.push(',');
        data.push_str(a);
    }
    let data =
        CString::new(data).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in an option"))?;
    rustix::mount::mount(source.as_str(), mountpoint, "fuse", flags, data.as_c_str())
        .map_err(io::Error::from)?;
    Ok(dev)
}

/// `fusermount3 -o OPTIONS -- MOUNTPOINT`, taking the descriptor it sends back.
fn mount_by_helper(
    mountpoint: &Path,
    options: &[MountOption],
    acl: SessionACL,
) -> io::Result<(DevFuse, Mounted)> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    let mut words: Vec<String> = options.iter().map(MountOption::word).collect();
    words.extend(acl_option(acl).map(String::from));
    // Ours is close-on-exec; the helper's end is inherited by the helper alone.
    let (ours, theirs) = socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty())?;
    let mut helper = Command::new("fusermount3")
        .arg("-o")
        .arg(words.join(","))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run fusermount3: {e}")))?;
    drop(theirs);
    let received = receive_fd(&ours);
    let auto_unmount = options.contains(&MountOption::AutoUnmount);
    let file = match received {
        Ok(fd) => File::from(fd),
        Err(e) => {
            let out = helper.wait_with_output()?;
            let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(io::Error::new(e.kind(), if said.is_empty() { e.to_string() } else { said }));
        }
    };
    if !auto_unmount {
        helper.wait()?;
    }
    // With auto_unmount the helper stays, watching `ours`; without, it has exited.
    let m = Mounted {
        mountpoint: mountpoint.into(),
        by_helper: true,
        _helper: auto_unmount.then_some(ours),
        live: true,
    };
    Ok((DevFuse::from_file(file), m))
}

fn receive_fd(sock: &OwnedFd) -> io::Result<OwnedFd> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    use std::mem::MaybeUninit;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let got = recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
    if got.bytes == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "fusermount3 sent no descriptor"));
    }
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = m {
            if let Some(fd) = fds.next() {
                return Ok(fd);
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "fusermount3 sent no descriptor"))
}
