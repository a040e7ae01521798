#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ankusa_fuzz::http(data));
