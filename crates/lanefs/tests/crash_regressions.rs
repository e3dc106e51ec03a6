//! Bugs the crash harness (`lanefs crashtest`) found, each as the shortest workload that shows
//! it, checked at every crash state the harness builds for it. Each failed before its fix.
//!
//! Scripts run on the ACE base image (directories /A, /B, /A/C; files /foo, /A/foo, /A/bar,
//! /B/bar with an xattr) or on an empty one; `lanefs crashtest --script "..."` runs the same
//! workload from the command line and prints every violating state.

use lanefs::crashtest::ops::parse_script;
use lanefs::crashtest::workload::{Knobs, Setup, Workload};
use lanefs::crashtest::{check_script, check_workload, gen};

fn assert_clean(v: Vec<String>) {
    assert!(v.is_empty(), "{}", v.join("\n"));
}

/// setxattr + fsync journals the xattrs and clears the inode's "xattrs changed" flag, so the
/// next checkpoint (here the sync) writes the inode with its old xattr node: the xattr that
/// fsync made durable is gone after the checkpoint (the journal record is older than the
/// checkpoint stamp and is not replayed).
#[test]
fn xattr_made_durable_by_fsync_survives_the_next_checkpoint() {
    assert_clean(check_script(Setup::Ace, "setxattr /A/foo user.x 16 1; fsync /A/foo; sync", true));
}

/// link then unlink of the old name (a rename by hand): fsync of /B journals the unlink, but
/// the link lives in the root directory's log and is not journaled, so after a crash the file
/// has no name and recovery deletes it — a file nobody deleted is lost.
#[test]
fn unlink_after_link_elsewhere_never_loses_the_file() {
    assert_clean(check_script(Setup::Ace, "link /B/bar /l2; unlink /B/bar; fsync /B", true));
}

/// After link /foo /B/l2 and rename /foo /A/f5, fsync of /B journals the link and clears the
/// file's name_dirty flag although its rename (in the logs of / and /A) is not journaled; the
/// later fsync of /A/f5 then flushes no directory, and /A/f5 is missing after a crash
/// (contract 1: a renamed file's name is durable after its fsync).
#[test]
fn renamed_file_name_durable_after_fsync_despite_earlier_link() {
    assert_clean(check_script(
        Setup::Ace,
        "link /foo /B/l2; rename /foo /A/f5; fsync /B; unlink /B/l2; fsync /A/f5",
        true,
    ));
}

/// The same flag, raced: thread 1's fsync of a new file in /A journals /A's log, which holds
/// an older rename of thread 0's file, and clears the file's name_dirty when it is done — after
/// thread 0 renamed the file again. Thread 0's fsync of the file then finds name_dirty clear,
/// flushes no directory, and the file's new name is lost in a crash. Interleaving-dependent:
/// the test runs the workload until it fails, at most 40 times.
#[test]
fn rename_then_fsync_racing_with_fsync_of_the_directory() {
    let mut t0 = String::from("create /B/r; write /B/r 0 3000 1; fsync /B/r");
    for _ in 0..30 {
        t0.push_str("; rename /B/r /A/r; fsync /A/r; rename /A/r /B/r; fsync /B/r");
    }
    let t1: Vec<String> = (0..60)
        .map(|i| format!("create /{d}/s{i}; fsync /{d}/s{i}", d = if i % 2 == 0 { "A" } else { "B" }))
        .collect();
    let w = Workload {
        id: "rename-race".into(),
        setup: Setup::Ace,
        threads: vec![parse_script(&t0).unwrap(), parse_script(&t1.join("; ")).unwrap()],
        knobs: Knobs::default(),
        fault: None,
    };
    for _ in 0..40 {
        assert_clean(check_workload(w.clone(), true));
    }
}

/// rmdir of a directory emptied by an unlink: fsync of /A follows the rename into /A to the
/// root directory and journals the root's operations, among them the rmdir of /B — but not
/// /B's own log, which holds the unlink of /B/bar. After a crash /B is gone and /B/bar's inode
/// still has a link count of 1 with no name: fsck reports "inode 8 is not reachable from the
/// root and is not an orphan" (contract 4).
#[test]
fn rmdir_is_journaled_with_the_unlinks_that_emptied_the_directory() {
    assert_clean(check_script(
        Setup::Ace,
        "create /f6; unlink /B/bar; rename /f6 /A/f1; rmdir /B; fsync /A",
        true,
    ));
}

/// A checkpoint snapshots an inode's size and pages in its exclusive phase, but
/// `write_inode_snap` reads mtime and ctime (and a directory's parent) from the live mnode when
/// it writes the inode, after operations resumed. A write in between lands its mtime, without
/// its size and data, in the checkpoint: after a crash /A/x has the fsynced contents with the
/// mtime of the later, never-durable write (found by the random family with a small journal
/// limit, where background checkpoints overlap the workload). Here the journal limit 0 kicks a
/// background checkpoint at the first fsync; 16 MB of dirty /foo (a lower inode number, written
/// first) keeps it busy while the next write to /A/x lands. Timing-dependent: the workload runs
/// until it fails, at most 10 times.
#[test]
#[ignore = "lanefs bug: checkpoint writes live mtime/ctime/parent with snapshotted size and data; see crashtest report"]
fn checkpoint_writes_attributes_from_its_snapshot() {
    let script = "journal-limit 0; write /foo 0 16000000 1; create /A/x; write /A/x 0 1000 2; fsync /A/x; \
                  sleep 2; write /A/x 1000 1000 3; fsync /A/x";
    for _ in 0..10 {
        assert_clean(check_script(Setup::Ace, script, true));
    }
}

/// A journal write that fails (EIO, nothing lands) leaves the lane's chain writer past a block
/// that was never written; the next fsync succeeds, but its transaction follows the hole and
/// recovery, which ends the chain at the first invalid block, never reaches it.
#[test]
fn fsync_after_a_failed_journal_write_is_durable() {
    assert_clean(check_script(
        Setup::Empty,
        "fault fail-write 1; create /f1; fsync /f1; create /f2; fsync /f2",
        true,
    ));
}

/// Punch a hole over blocks an fsync mapped, fallocate the range again, fsync: the journal's
/// Map record maps the pages to NEW_ADDR (allocated, unwritten). Replay handles NEW_ADDR with
/// `cur_map.insert` instead of `remap`, so the data blocks the first fsync's record mapped are
/// never invalidated: after recovery's checkpoint the SIT counts 2 blocks no tree owns (fsck:
/// "SIT says 6 valid blocks, the tree owns 4", checkpoint block counter off by 2).
#[test]
#[ignore = "lanefs bug: replay of a NEW_ADDR mapping leaks the block mapped before it (SIT count); see crashtest report"]
fn replayed_fallocate_over_a_punched_hole_leaks_no_blocks() {
    assert_clean(check_script(
        Setup::Empty,
        "create /f; write /f 0 24576 3; fsync /f; falloc /f punch 8192 8192; falloc /f alloc 8192 8192; fsync /f",
        true,
    ));
}

// What already works, kept as regression tests of the harness families.

#[test]
fn rename_across_directories_then_fsync() {
    assert_clean(check_script(
        Setup::Ace,
        "create /A/x; write /A/x 0 5000 3; fsync /A/x; rename /A/x /B/y; fsync /B/y; rename /B/y /A/C/z; fsync /A",
        true,
    ));
}

#[test]
fn data_operations_then_fsync() {
    assert_clean(check_script(
        Setup::Ace,
        "write /foo 3000 5000 2; fsync /foo; falloc /foo punch 1000 5000; fdatasync /foo; \
         truncate /A/foo 2500; falloc /A/foo alloc 8192 8192; fsync /A/foo; write /A/bar 4194304 100 4; \
         chmod /A/bar 600; fsync /A/bar",
        true,
    ));
}

#[test]
fn failed_flush_is_reported_and_later_fsyncs_hold() {
    assert_clean(check_script(
        Setup::Empty,
        "fault fail-flush 1; create /f1; write /f1 0 9000 1; fsync /f1; create /f2; fsync /f2",
        true,
    ));
}

#[test]
fn two_threads_rename_and_fsync() {
    let mut rng = lanefs::crashtest::rng::Rng::new(5);
    let w = gen::mt_rename_workload("mt-rename:test".into(), &mut rng);
    assert_clean(check_workload(w, true));
}
