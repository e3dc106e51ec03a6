//! Input as for `decode`; the damaged image is mounted, read whole, unmounted and checked by
//! fsck. Any error is fine; a panic (caught and reported by `fuzz_mount`) is not.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let violations = lanefs_crashtest::corrupt::fuzz_mount(data);
    assert!(violations.is_empty(), "{violations:?}");
});
