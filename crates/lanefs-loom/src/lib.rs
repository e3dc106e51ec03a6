//! The loom models of lanefs's concurrency primitives, run on their own.
//!
//! The models live beside the code they check (`#[cfg(all(test, loom))]` in
//! `lanefs/src/sync/pass_sem.rs`, `sync/seqlock.rs`, `sync/commit_queue.rs` and `mem/page_lock.rs`). Built as part of lanefs, a
//! loom run compiles the whole engine and all its dependencies with loom's cfg; this crate
//! compiles only the primitives' own files (and the lock ranks, per-CPU slots and census they
//! use), at the same module paths, so the models run in CI at the cost of a small build:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom cargo test -p lanefs-loom --release
//! ```
//!
//! Without `--cfg loom` the crate is empty.
#![cfg(loom)]
// The engine's own files, under the engine's rules: unsafe where they need it (per-CPU slots),
// each block with its SAFETY comment; their docs are the engine's.
#![allow(unsafe_code, missing_docs)]

/// `lanefs::sync`, the part the primitives use.
#[path = "../../lanefs/src/sync"]
pub mod sync {
    pub mod census;
    pub mod commit_queue;
    #[cfg(test)]
    pub mod loom_check;
    pub mod pass_sem;
    pub mod percpu;
    pub mod rank;
    pub mod seqlock;
}

/// `lanefs::mem`, the part with a loom model.
#[path = "../../lanefs/src/mem"]
pub mod mem {
    pub mod page_lock;
}
