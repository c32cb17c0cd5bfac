#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| orderd::fuzzing::citus_node_urls(data));
