//! How every loom model of the engine runs (test builds under `--cfg loom` only).
//!
//! One builder for all of them, so a model's cost is bounded the same way everywhere: at most
//! three preemptions per execution unless `LOOM_MAX_PREEMPTIONS` asks for another bound. The
//! bound keeps each model to seconds in CI (`crates/lanefs-loom`) while still covering the
//! interleavings the primitives' bugs have needed so far (two or fewer preemptions).

/// Runs `f` under loom with the engine's preemption bound.
pub(crate) fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}
