//! The config file: any text is a config or an error naming a key —
//! never a panic (R-SF3).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = sluice::config::Config::from_toml(text) {
        assert!(!e.key.is_empty(), "an error names a key: {e}");
    }
});
