//! Fuzzes the embedded-ELF loader up to the point where code would run:
//! container selection, ELF parsing, mapping, relocation, protection and
//! the checked lookup of the query function. Nothing from the image is
//! executed. Any input must load or fail with an error, never panic.
//! `cargo +nightly fuzz run elf_load fuzz/seeds/elf_load`.
#![no_main]

use ferrite_hal_cpu::executable::abi::QUERY_SYMBOL;
use ferrite_hal_cpu::executable::container;
use ferrite_hal_cpu::executable::elf::ElfFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = container::infer_format(data);
    let Ok(elf) = container::select_elf(data) else {
        return;
    };
    let Ok(file) = ElfFile::parse(elf) else {
        return;
    };
    let Ok(loaded) = file.load() else {
        return;
    };
    if let Ok(query) = loaded.lookup_function(QUERY_SYMBOL) {
        assert!(loaded.is_executable(query));
    }
    std::hint::black_box(loaded.bytes().iter().map(|&b| b as usize).sum::<usize>());
});
