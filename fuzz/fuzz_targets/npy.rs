//! Fuzzes the `.npy` reader (ferrite-tooling's `tensor_from_bytes`): header
//! dictionary, dtype, shape and data length. Any input must parse or fail
//! with an error, never panic or allocate more than the input implies.
//! `cargo +nightly fuzz run npy fuzz/seeds/npy`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(tensor) = ferrite_tooling::npy::tensor_from_bytes(data) {
        // What was parsed must write back.
        let _ = ferrite_tooling::npy::tensor_to_bytes(&tensor);
    }
});
