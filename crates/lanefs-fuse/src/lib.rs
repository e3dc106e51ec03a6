//! FUSE adapter for lanefs.
//!
//! Translates FUSE requests into calls on `lanefs::Fs`; it decides nothing itself. It is wired
//! once the engine (issue 3) exposes its POSIX-shaped API; until then the crate only exists so
//! that the workspace has its final shape.
