//! Fuzzes the parameter archive parsers (irpa, gguf, safetensors). The
//! first byte picks the format; the rest is the file. Any input must parse
//! or fail with an error, and every entry a parsed index holds must be
//! readable from the file.
//! `cargo +nightly fuzz run parameters fuzz/seeds/parameters`.
#![no_main]

use ferrite_modules::io_parameters::{formats, FileHandle, ParameterIndex, Storage};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, file)) = data.split_first() else {
        return;
    };
    let format = formats::FORMATS[selector as usize % formats::FORMATS.len()];
    let handle = FileHandle::from_shared(Arc::new(file.to_vec()), "fuzz");
    let mut index = ParameterIndex::new();
    if formats::parse_into(&mut index, &handle, Some(format)).is_err() {
        return;
    }
    let mut sum = 0usize;
    for entry in index.entries() {
        if let Storage::File { handle, offset } = &entry.storage {
            let r = handle.with_range(*offset, entry.length, |b| {
                b.iter().map(|&x| x as usize).sum::<usize>()
            });
            sum = sum.wrapping_add(r.expect("an indexed entry lies inside its file"));
        }
    }
    std::hint::black_box(sum);
});
