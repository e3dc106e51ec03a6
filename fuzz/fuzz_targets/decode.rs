//! Input: [kind, block selector, XOR pattern...] over a metadata block of the reference image,
//! checksums recomputed; the block's decoder must return Ok or Err, never panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    lanefs_crashtest::corrupt::fuzz_decoders(data);
});
