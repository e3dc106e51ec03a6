//! The event clock the crash recorders share: a persistent-memory region opened with a clock
//! (`RegionOptions::clock`) and the crash-recording block device of the `lanefs-crashtest`
//! crate number their events from one, so the two logs merge into one timeline.
//!
//! It stays in the engine, unlike the recording device, because the region's recorder is
//! engine code (the region's store and persist paths call it) and takes its numbers here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A counter of events shared by the recorders of one run (`lanefs-crashtest`'s `CrashDevice` and
/// a region's recorder): its value is the number of events recorded so far, in all logs together, and
/// each event takes the next number. Clones share the counter.
#[derive(Debug, Clone, Default)]
pub struct EventClock(Arc<AtomicU64>);

impl EventClock {
    /// A clock at sequence 0.
    pub fn new() -> EventClock {
        EventClock::default()
    }

    /// Takes the next number. Callers take it while holding their log's lock, so numbers are
    /// increasing within each log.
    pub fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }

    /// Events recorded so far.
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Two clocks are equal when they share the counter.
impl PartialEq for EventClock {
    fn eq(&self, other: &EventClock) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for EventClock {}
