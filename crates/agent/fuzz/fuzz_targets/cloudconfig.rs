//! Feeds arbitrary bytes to the cloud-config parser: it must return steps or an error, never
//! panic, and every step it returns must describe itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        byoh_agent::cloudinit::check_input(text);
    }
});
