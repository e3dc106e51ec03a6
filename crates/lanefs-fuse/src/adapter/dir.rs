//! Directory handles and READDIR / READDIRPLUS replies.

use super::convert::{errno, file_attr, generation, kind};
use super::LaneFuse;
use crate::proto::{FileHandle, INodeNo, ReplyDirectory, ReplyDirectoryPlus};
use lanefs::Fs;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

/// Entries asked of the engine per round of a readdir reply.
const DIR_BATCH: usize = 64;

/// Open directory handles and their listings.
///
/// A listing bounds what one pass over a directory returns to the entries that existed when it
/// started (`lanefs::Listing`), so that `readdir` ends even while the caller renames what it
/// reads (fstests generic/736). A pass starts at offset 0: after OPENDIR, and again after
/// `rewinddir`, which must then see the directory as it is. Handles are numbered from 1; the
/// table is sharded by handle so that parallel OPENDIRs rarely share a lock, and no lock of it
/// is held while the engine is called.
///
/// The kernel may keep a listing and serve later ones from it (OPENDIR answers
/// FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE): it drops it when its own requests change the directory,
/// and the daemon drops it when a rename gives the directory a new ".."
/// (`LaneFuse::drop_cached_listing`). Cookies are the directory's own, so a listing resumed on a
/// handle from the kernel's cache neither repeats nor skips an entry.
pub(super) struct DirHandles {
    next: std::sync::atomic::AtomicU64,
    shards: Box<[DirShard]>,
}

/// Open directory handles whose number is the shard's index modulo [`DIR_HANDLE_SHARDS`].
type DirShard = lanefs::sync::Mutex<HashMap<u64, Arc<lanefs::Listing>>>;

const DIR_HANDLE_SHARDS: u64 = 16;

impl DirHandles {
    pub(super) fn new() -> DirHandles {
        DirHandles {
            next: std::sync::atomic::AtomicU64::new(1),
            shards: (0..DIR_HANDLE_SHARDS)
                .map(|_| lanefs::sync::Mutex::new(lanefs::sync::Rank::DirHandles, HashMap::new()))
                .collect(),
        }
    }

    fn shard(&self, fh: u64) -> &DirShard {
        &self.shards[(fh % DIR_HANDLE_SHARDS) as usize]
    }

    pub(super) fn open(&self, listing: lanefs::Listing) -> u64 {
        let fh = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.shard(fh).lock().insert(fh, Arc::new(listing));
        fh
    }

    /// The listing of handle `fh` (none for a handle this table did not give out).
    pub(super) fn get(&self, fh: u64) -> Option<Arc<lanefs::Listing>> {
        self.shard(fh).lock().get(&fh).cloned()
    }

    pub(super) fn close(&self, fh: u64) {
        self.shard(fh).lock().remove(&fh);
    }

    /// The entries of handle `fh`'s listing after `offset`, starting a new pass at offset 0.
    pub(super) fn read(
        &self,
        fs: &Fs,
        ino: u64,
        fh: u64,
        offset: u64,
        max: usize,
    ) -> lanefs::Result<Vec<lanefs::DirEntry>> {
        let listing = match self.get(fh) {
            // A new pass over the directory: the listing starts again from now.
            Some(_) if offset == 0 => {
                let l = Arc::new(fs.listing(ino)?);
                self.shard(fh).lock().insert(fh, l.clone());
                Some(l)
            }
            l => l,
        };
        match listing {
            Some(l) => fs.readdir_listing(&l, offset, max),
            // Not opened through OPENDIR (the kernel always does; a handle of 0 otherwise).
            None => fs.readdir(ino, offset, max),
        }
    }
}

/// How long a RENAME's handler waits for the drop of a moved directory's cached listing
/// (`LaneFuse::drop_cached_listing`) before it replies anyway.
const LISTING_DROP_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

impl LaneFuse {
    /// Drops the kernel's cached listing of directory `ino` (its pages: offset 0, to the end),
    /// before the reply when it can (`Notifier::aside`, waiting at most `LISTING_DROP_WAIT`).
    /// The drop takes only the listing's page locks, which a reader holds under the directory's
    /// lock, but no lock the kernel holds for a request may ever keep its reply from going.
    pub(super) fn drop_cached_listing(&self, ino: u64) {
        let Some(n) = self.notifier.get() else { return };
        n.aside(Some(LISTING_DROP_WAIT), move |n| {
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
        });
    }
}

/// What filling a reply with one entry came to.
enum Added {
    /// The reply is full: send it.
    Full,
    /// Added, or left out (removed since the listing); go on.
    More,
}

impl LaneFuse {
    /// The entries of handle `fh`'s listing after `offset`, batch by batch, each given to `add`
    /// with the inode it names (".." of the root is the root itself) until `add` says the reply
    /// is full or the listing ends. `Ok(())` means send the reply; an error, send it instead.
    fn each_entry(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut add: impl FnMut(&lanefs::DirEntry, u64) -> Result<Added, lanefs::Error>,
    ) -> Result<(), lanefs::Error> {
        let mut cookie = offset;
        loop {
            let batch = self.dirs.read(&self.fs, ino.0, fh.0, cookie, DIR_BATCH)?;
            for e in &batch {
                let target = if e.ino == 0 { ino.0 } else { e.ino };
                if let Added::Full = add(e, target)? {
                    return Ok(());
                }
                cookie = e.cookie;
            }
            if batch.len() < DIR_BATCH {
                return Ok(());
            }
        }
    }

    /// READDIR: entries of handle `fh`'s listing after `offset`, as many as the reply holds.
    pub(super) fn fill_readdir(&self, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let r = self.each_entry(ino, fh, offset, |e, target| {
            let full = reply.add(INodeNo(target), e.cookie, kind(e.kind), OsStr::from_bytes(&e.name));
            Ok(if full { Added::Full } else { Added::More })
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// READDIRPLUS: as [`LaneFuse::fill_readdir`], with each entry's attributes.
    pub(super) fn fill_readdirplus(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.ttl.cache;
        // The kernel counts every entry it gets as a lookup but "." and ".." (`fuse_direntplus_link`
        // skips them), so the engine takes a reference for the others. It gives one back for an
        // entry the reply has no room for, and all of them (`taken`) if the reply is an error,
        // which counts nothing.
        let counted = |e: &lanefs::DirEntry| e.name != b"." && e.name != b"..";
        let mut taken = Vec::new();
        let r = self.each_entry(ino, fh, offset, |e, target| {
            let a = if counted(e) { self.fs.remember(target) } else { self.fs.getattr(target) };
            match a {
                Ok(a) => {
                    let name = OsStr::from_bytes(&e.name);
                    let full =
                        reply.add(INodeNo(target), e.cookie, name, &ttl, &file_attr(&a), generation(&a));
                    if counted(e) {
                        if full {
                            self.fs.forget(target, 1)?;
                        } else {
                            taken.push(target);
                        }
                    }
                    Ok(if full { Added::Full } else { Added::More })
                }
                // Removed since the listing: leave it out, as a later readdir would.
                Err(err) if err.to_errno() == libc::ENOENT => Ok(Added::More),
                Err(err) => Err(err),
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => {
                for t in taken {
                    // The error is the reply; a failed give-back is the engine's to report.
                    let _ = self.fs.forget(t, 1);
                }
                reply.error(errno(e))
            }
        }
    }
}
