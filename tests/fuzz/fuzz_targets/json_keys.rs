#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ankusa_fuzz::json_keys(data));
