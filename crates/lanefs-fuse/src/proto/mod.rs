//! lanefs's own implementation of the FUSE kernel protocol, from the mount to the replies.
//!
//! Layers, bottom up: [`abi`] (the kernel's numbers and a bounds-checked byte reader),
//! [`request`] (a request decoded into an [`Op`]), [`reply`] (one type per answer, each sent
//! once through a transport's [`Sink`]), [`dev`] (the /dev/fuse descriptor), [`mod@mount`]
//! (mount(2) or fusermount3), [`uring`] (FUSE over io_uring: per-CPU queues of ring entries),
//! [`spares`] (workers that wait for the kernel, and spares for their queues) and
//! [`session`] (INIT, then the workers of the transport chosen, calling a [`Filesystem`]).
//!
//! Why not a crate: fuser 0.18 hides its request decoding behind its own /dev/fuse loop, so it
//! can serve no other transport (FUSE over io_uring), cannot pass on SETATTR's
//! FATTR_KILL_SUIDGID, and checks each request's uid against its session's owner, which
//! idmapped mounts break. The protocol is small and stable: owning it costs a few hundred lines.

pub mod abi;
pub mod dev;
pub mod mount;
pub mod reply;
pub mod request;
pub mod session;
pub mod spares;
pub mod uring;

pub use dev::DevFuse;
pub use mount::{mount, MountOption, Mounted, SessionACL};
pub use reply::*;
pub use request::{Op, Request, SetattrIn, TimeOrNow};
pub use session::{Filesystem, KernelConfig, Notifier, Session, Transport};
