//! Fuzzes the `.vmfb` loader: the archive reader, type resolution and the
//! bytecode verifier/decoder. Any input must load or fail with an error,
//! never panic, and everything a parsed archive exposes must be readable. Seed the corpus with real modules, e.g.
//! `cp build/fixtures/vm/*.vmfb fuzz/corpus/load_module/`, then
//! `cargo +nightly fuzz run load_module`.
#![no_main]

use ferrite_vm::bytecode::archive::Archive;
use ferrite_vm::bytes::ModuleBytes;
use ferrite_vm::{BytecodeModule, Instance};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(archive) = Archive::parse(ModuleBytes::from_vec(data.to_vec())) else {
        return;
    };
    // Touch every range the archive claims is valid.
    let mut sum = 0usize;
    for i in 0..archive.function_descriptors().len() {
        sum = sum.wrapping_add(archive.function_bytecode(i).len());
    }
    for i in 0..archive.rodata_segments().len() {
        sum = sum.wrapping_add(
            archive
                .rodata(i)
                .map_or(0, |d| d.iter().map(|&b| b as usize).sum()),
        );
    }
    if let Some(db) = archive.debug_database() {
        for (f, map) in db.functions.iter().enumerate() {
            for e in &map.locations {
                if let Some(loc) = db.resolve_location(f, e.bytecode_offset as u32) {
                    sum = sum.wrapping_add(loc.len());
                }
            }
        }
    }
    // The full load: types, signatures and verification of every function.
    if let Ok(module) = BytecodeModule::load(&Instance::default(), archive.bytes().clone()) {
        for f in module.functions() {
            sum = sum.wrapping_add(f.insns.len());
        }
    }
    std::hint::black_box(sum);
});
