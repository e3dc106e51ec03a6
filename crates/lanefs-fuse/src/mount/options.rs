//! `lanefs mount`'s arguments and `-o` options: which go to the kernel, which
//! are lanefs's own, and their defaults.

use crate::adapter::Ttl;
use crate::proto::{MountOption, SessionACL};
use lanefs::{AtimeMode, AtimePolicy};
use std::path::PathBuf;
use std::time::Duration;

/// Whether the kernel caches writes when no `writeback_cache` option says (see the crate docs
/// for what it changes).
pub const WRITEBACK_CACHE_DEFAULT: bool = true;

/// Default of `stuck_request_secs`.
pub const STUCK_REQUEST: Duration = Duration::from_secs(30);

/// What `lanefs mount` was asked for.
#[derive(Debug, Clone, Default)]
pub struct MountArgs {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    /// Persistent-memory region holding the NAT and the lane journals (`--nvm FILE`; also
    /// `-o nvm=FILE`): created on the first mount with it, required from then on.
    pub nvm: Option<PathBuf>,
    /// Size of a region this mount creates (`--nvm-size`; default: the image's NAT plus 32 MiB
    /// per lane of journal, at most 256 MiB of journals).
    pub nvm_size: Option<u64>,
    /// Worker threads; default one per core.
    pub threads: Option<usize>,
    /// `-o` option lists, each comma-separated.
    pub options: Vec<String>,
    pub foreground: bool,
}

/// Mount options after parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub fuse: Vec<MountOption>,
    pub acl: SessionACL,
    pub threads: Option<usize>,
    pub nvm: Option<PathBuf>,
    pub writeback_cache: bool,
    /// `checkpoint_secs=N`: the checkpoint timer (None: the engine's default; Some(None): no
    /// timer, checkpoints only when a bound is passed and at unmount).
    pub checkpoint_interval: Option<Option<Duration>>,
    /// `stuck_request_secs=N`: requests in flight this long are logged (None: never).
    pub stuck_request: Option<Duration>,
    /// `norecovery` (read-only mounts only): the last checkpoint alone, the journals not
    /// replayed.
    pub no_recovery: bool,
    /// The access-time options (`relatime` by default; `noatime`, `strictatime`, `nodiratime`,
    /// `lazytime` and their opposites, the last word winning), which the daemon applies: the
    /// kernel keeps no atime for FUSE.
    pub atime: AtimePolicy,
    /// How long the kernel caches names and attributes (`cache_timeout=S`) and names that do
    /// not exist (`negative_timeout=S`); see [`Ttl`].
    pub ttl: Ttl,
    /// `cooperative=on|off`: lanefs's `FsOptions::cooperative` (on by default): cooperative
    /// checkpoint installs and cooperative commit.
    pub cooperative: bool,
    /// `transport=uring|dev`: FUSE over io_uring where the kernel offers it (the default), or
    /// /dev/fuse always.
    pub uring: bool,
    /// `dirty_limit=shared|strict`: the kernel's dirty pages of the mount share the whole dirty
    /// budget, as a kernel file system's do (the default), or keep the kernel's strict 1% for
    /// FUSE (see `mount::dirty`).
    pub share_dirty_limit: bool,
    /// `idle_poll=on|off`: while requests arrive, idle CPUs poll instead of sleeping (on by
    /// default; see `mount::idle_poll`).
    pub idle_poll: bool,
}

/// Parses `-o` lists. Standard options become `MountOption`s; `allow_other` / `allow_root` set the
/// access list; `threads=N`, `nvm=FILE`, `writeback_cache[=on|off]` (on by default;
/// `nowriteback_cache` is off too), `checkpoint_secs=N`,
/// `transport=uring|dev`, `stuck_request_secs=N`, `cache_timeout=S`, `negative_timeout=S`, `cooperative=on|off`,
/// `dirty_limit=shared|strict`, `idle_poll=on|off` and `norecovery` (read-only mounts only) are lanefs's own; anything else is passed to the kernel, which refuses
/// what it does not know.
pub fn parse_options(lists: &[String]) -> Result<Parsed, String> {
    let mut p = Parsed {
        fuse: Vec::new(),
        acl: SessionACL::Owner,
        threads: None,
        nvm: None,
        writeback_cache: WRITEBACK_CACHE_DEFAULT,
        checkpoint_interval: None,
        stuck_request: Some(STUCK_REQUEST),
        no_recovery: false,
        atime: AtimePolicy::default(),
        ttl: Ttl::default(),
        cooperative: true,
        uring: true,
        share_dirty_limit: true,
        idle_poll: true,
    };
    let mut default_permissions = true;
    for o in lists.iter().flat_map(|l| l.split(',')).map(str::trim).filter(|o| !o.is_empty()) {
        match o {
            "default_permissions" => default_permissions = true,
            "no_default_permissions" => default_permissions = false,
            o if p.take_atime(o) || p.take_own(o)? => {}
            o => {
                if let Some(opt) = kernel_option(o) {
                    if !p.fuse.contains(&opt) {
                        p.fuse.push(opt);
                    }
                }
            }
        }
    }
    if default_permissions {
        p.fuse.push(MountOption::DefaultPermissions);
    }
    // What the mount table shows. noatime is a mount(2) flag; lazytime a superblock flag the
    // kernel takes as a mount option from root's mount(2) (fusermount3 3.14, which mounts for a
    // user, refuses it). strictatime and nodiratime are not passed at mount: `show_atime_flags`
    // sets them once the mount is up.
    if p.atime.mode == AtimeMode::Never {
        p.fuse.push(MountOption::NoAtime);
    }
    if p.atime.lazy && rustix::process::geteuid().is_root() {
        p.fuse.push(MountOption::CUSTOM("lazytime".into()));
    }
    // The kernel's own subtype option: /proc/mounts shows the type as fuse.lanefs.
    p.fuse.push(MountOption::CUSTOM("subtype=lanefs".into()));
    Ok(p)
}

impl Parsed {
    /// Takes `o` if it is an access-time word (the daemon applies them, the last one winning).
    fn take_atime(&mut self, o: &str) -> bool {
        let atime = &mut self.atime;
        match o {
            "noatime" => atime.mode = AtimeMode::Never,
            // The kernel's default is relatime: "atime" and "norelatime" come back to it.
            "atime" | "relatime" | "norelatime" | "nostrictatime" => atime.mode = AtimeMode::Relative,
            "strictatime" => atime.mode = AtimeMode::Always,
            "lazytime" => atime.lazy = true,
            "nolazytime" => atime.lazy = false,
            "diratime" => atime.dirs = true,
            "nodiratime" => atime.dirs = false,
            _ => return false,
        }
        true
    }

    /// Takes `o` if it is one of lanefs's own options; an error for one with a bad value.
    fn take_own(&mut self, o: &str) -> Result<bool, String> {
        let (key, value) = o.split_once('=').unwrap_or((o, ""));
        match (key, o) {
            (_, "allow_other") => self.acl = SessionACL::All,
            (_, "allow_root") => self.acl = SessionACL::RootAndOwner,
            (_, "writeback_cache" | "writeback_cache=on") => self.writeback_cache = true,
            (_, "writeback_cache=off" | "nowriteback_cache") => self.writeback_cache = false,
            (_, "norecovery") => self.no_recovery = true,
            (_, "transport=uring") => self.uring = true,
            (_, "transport=dev") => self.uring = false,
            ("transport", _) => return Err(format!("option {o}: give transport=uring or transport=dev")),
            (_, "cooperative=on") => self.cooperative = true,
            (_, "cooperative=off") => self.cooperative = false,
            ("cooperative", _) => return Err(format!("option {o}: give cooperative=on or cooperative=off")),
            (_, "dirty_limit=shared") => self.share_dirty_limit = true,
            (_, "dirty_limit=strict") => self.share_dirty_limit = false,
            ("dirty_limit", _) => {
                return Err(format!("option {o}: give dirty_limit=shared or dirty_limit=strict"))
            }
            (_, "idle_poll=on") => self.idle_poll = true,
            (_, "idle_poll=off") => self.idle_poll = false,
            ("idle_poll", _) => return Err(format!("option {o}: give idle_poll=on or idle_poll=off")),
            ("threads", _) => {
                let n = value
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| (1..=1024).contains(&n))
                    .ok_or_else(|| format!("option {o}: give a thread count from 1 to 1024"))?;
                self.threads = Some(n);
            }
            ("checkpoint_secs", _) => {
                let n = seconds(o, value, "no timer")?;
                self.checkpoint_interval = Some((n > 0).then(|| Duration::from_secs(n)));
            }
            ("stuck_request_secs", _) => {
                let n = seconds(o, value, "no log")?;
                self.stuck_request = (n > 0).then(|| Duration::from_secs(n));
            }
            ("cache_timeout", _) => self.ttl.cache = Duration::from_secs(seconds(o, value, "no caching")?),
            ("negative_timeout", _) => {
                self.ttl.negative = Duration::from_secs(seconds(o, value, "no caching")?)
            }
            ("nvm", _) if o.contains('=') => self.nvm = Some(PathBuf::from(value)),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// The value of option `o` as seconds from 0 (meaning `zero`) to a day.
fn seconds(o: &str, value: &str, zero: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .ok()
        .filter(|&n| n <= 86_400)
        .ok_or_else(|| format!("option {o}: give seconds from 0 ({zero}) to 86400"))
}

/// The `MountOption` form of a standard option, or anything else passed on for the kernel
/// to judge; None for the words mount(8) and fstab use that are no mount option, and for
/// `subtype=` (lanefs names its own: fuse.lanefs).
fn kernel_option(o: &str) -> Option<MountOption> {
    Some(match o {
        "ro" => MountOption::RO,
        "rw" => MountOption::RW,
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "dirsync" => MountOption::DirSync,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "auto_unmount" => MountOption::AutoUnmount,
        "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "nofail" | "_netdev" => return None,
        o if o.starts_with("x-") || o.starts_with("comment=") || o.starts_with("subtype=") => return None,
        o if o.starts_with("fsname=") => MountOption::FSName(o["fsname=".len()..].to_string()),
        o => MountOption::CUSTOM(o.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_map_to_the_kernel_and_lanefs() {
        let p = parse_options(&["ro,allow_other,threads=3".into(), "noatime,max_read=65536".into()]).unwrap();
        assert_eq!(p.acl, SessionACL::All);
        assert_eq!(p.threads, Some(3));
        assert!(p.fuse.contains(&MountOption::RO));
        assert!(p.fuse.contains(&MountOption::NoAtime));
        assert!(p.fuse.contains(&MountOption::DefaultPermissions));
        assert!(p.fuse.contains(&MountOption::CUSTOM("max_read=65536".into())));
        let p = parse_options(&["defaults,no_default_permissions,relatime".into()]).unwrap();
        assert!(!p.fuse.contains(&MountOption::DefaultPermissions));
        assert!(parse_options(&["threads=0".into()]).is_err());
        assert!(parse_options(&["threads=x".into()]).is_err());
        assert_eq!(p.checkpoint_interval, None);
        let p = parse_options(&["checkpoint_secs=2".into()]).unwrap();
        assert_eq!(p.checkpoint_interval, Some(Some(Duration::from_secs(2))));
        assert_eq!(parse_options(&["checkpoint_secs=0".into()]).unwrap().checkpoint_interval, Some(None));
        assert!(parse_options(&["checkpoint_secs=-1".into()]).is_err());
        assert!(!p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c.starts_with("checkpoint"))));
        let p = parse_options(&["ro,norecovery".into()]).unwrap();
        assert!(
            p.no_recovery && !p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c == "norecovery"))
        );
        assert!(!parse_options(&["ro".into()]).unwrap().no_recovery);
        // Without ro it is refused at mount, unless the image is write-protected (then ro).
        assert!(parse_options(&["norecovery".into()]).unwrap().no_recovery);
        assert!(parse_options(&[]).unwrap().cooperative, "cooperative checkpoints by default");
        assert!(!parse_options(&["cooperative=off".into()]).unwrap().cooperative);
        assert!(parse_options(&["cooperative=off,cooperative=on".into()]).unwrap().cooperative);
        assert!(parse_options(&["cooperative=maybe".into()]).is_err());
        assert!(parse_options(&[]).unwrap().uring, "io_uring where the kernel offers it, by default");
        assert!(!parse_options(&["transport=dev".into()]).unwrap().uring);
        assert!(parse_options(&["transport=dev,transport=uring".into()]).unwrap().uring);
        assert!(parse_options(&["transport=splice".into()]).is_err());
        assert!(parse_options(&[]).unwrap().share_dirty_limit, "the whole dirty budget by default");
        assert!(!parse_options(&["dirty_limit=strict".into()]).unwrap().share_dirty_limit);
        assert!(parse_options(&["dirty_limit=strict,dirty_limit=shared".into()]).unwrap().share_dirty_limit);
        assert!(parse_options(&["dirty_limit=1%".into()]).is_err());
        assert!(parse_options(&[]).unwrap().idle_poll, "idle CPUs poll while busy by default");
        assert!(!parse_options(&["idle_poll=off".into()]).unwrap().idle_poll);
        assert!(parse_options(&["idle_poll=off,idle_poll=on".into()]).unwrap().idle_poll);
        assert!(parse_options(&["idle_poll=yes".into()]).is_err());
    }

    #[test]
    fn atime_options_make_a_policy_the_last_word_winning() {
        let p = parse_options(&[]).unwrap();
        assert_eq!(p.atime, AtimePolicy::default());
        assert!(!p.fuse.contains(&MountOption::NoAtime));
        let p = parse_options(&["noatime,nodiratime".into()]).unwrap();
        assert_eq!(p.atime, AtimePolicy { mode: AtimeMode::Never, dirs: false, lazy: false });
        assert!(p.fuse.contains(&MountOption::NoAtime));
        let p =
            parse_options(&["noatime,strictatime,lazytime".into(), "nodiratime,diratime".into()]).unwrap();
        assert_eq!(p.atime, AtimePolicy { mode: AtimeMode::Always, dirs: true, lazy: true });
        assert!(!p.fuse.contains(&MountOption::NoAtime));
        for back in ["atime", "relatime", "norelatime", "nostrictatime"] {
            let p = parse_options(&[format!("strictatime,{back},lazytime,nolazytime")]).unwrap();
            assert_eq!(p.atime, AtimePolicy::default(), "{back}");
        }
        // None of them reaches the kernel as a FUSE option it would refuse.
        let p = parse_options(&["relatime,strictatime,nodiratime,norelatime,nostrictatime".into()]).unwrap();
        assert!(!p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c.contains("atime"))));
    }

    #[test]
    fn writeback_cache_on_and_off() {
        assert_eq!(parse_options(&[]).unwrap().writeback_cache, WRITEBACK_CACHE_DEFAULT);
        for (o, on) in [
            ("writeback_cache", true),
            ("writeback_cache=on", true),
            ("writeback_cache=off", false),
            ("nowriteback_cache", false),
            ("writeback_cache=off,writeback_cache", true),
        ] {
            let p = parse_options(&[o.into()]).unwrap();
            assert_eq!(p.writeback_cache, on, "{o}");
            assert!(!p.fuse.iter().any(|m| matches!(m, MountOption::CUSTOM(c) if c.contains("writeback"))));
        }
    }

    #[test]
    fn cache_timeouts_set_the_ttls_and_stay_out_of_the_kernel_options() {
        assert_eq!(parse_options(&[]).unwrap().ttl, Ttl::default());
        let p = parse_options(&["cache_timeout=1,negative_timeout=0".into()]).unwrap();
        assert_eq!(p.ttl, Ttl { cache: Duration::from_secs(1), negative: Duration::ZERO });
        assert!(!p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c.contains("timeout"))));
        for bad in ["cache_timeout=", "cache_timeout=-1", "negative_timeout=1.5", "cache_timeout=86401"] {
            let e = parse_options(&[bad.into()]).unwrap_err();
            assert!(e.starts_with(&format!("option {bad}: ")), "{e}");
        }
    }

    #[test]
    fn stuck_request_secs_sets_the_threshold_or_turns_the_log_off() {
        assert_eq!(parse_options(&[]).unwrap().stuck_request, Some(STUCK_REQUEST));
        let p = parse_options(&["rw,stuck_request_secs=1".into()]).unwrap();
        assert_eq!(p.stuck_request, Some(Duration::from_secs(1)));
        assert!(!p.fuse.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c.starts_with("stuck"))));
        assert_eq!(parse_options(&["stuck_request_secs=0".into()]).unwrap().stuck_request, None);
        for bad in [
            "stuck_request_secs=",
            "stuck_request_secs=-3",
            "stuck_request_secs=1.5",
            "stuck_request_secs=86401",
        ] {
            let e = parse_options(&[bad.into()]).unwrap_err();
            assert!(e.starts_with(&format!("option {bad}: ")) && e.contains("seconds"), "{e}");
        }
    }
}
