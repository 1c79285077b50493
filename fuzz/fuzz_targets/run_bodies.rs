//! The run API's JSON bodies (opening a run, a checkpoint commit, a gap
//! record) from arbitrary bytes: parsed, or refused with a 4xx naming the
//! field — never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::serve::bodies;

fuzz_target!(|data: &[u8]| {
    let named = |e: bodies::Invalid| {
        assert!(e.status.is_client_error() && !e.field.is_empty(), "{e:?}");
    };
    match bodies::object(data) {
        Err(e) => named(e),
        Ok(map) => {
            let _ = bodies::opening(&map).map_err(named);
            let _ = bodies::commit(&map).map_err(named);
            let _ = bodies::gap(&map).map_err(named);
        }
    }
});
