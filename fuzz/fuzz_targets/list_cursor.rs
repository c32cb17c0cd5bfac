#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| orderd::fuzzing::list_cursor(data));
