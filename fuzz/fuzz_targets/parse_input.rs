//! Fuzzes the `--input` parser (ferrite-tooling's `parse_variants` over
//! ferrite-hal's buffer-view text syntax). The first byte picks the
//! argument types; the rest is one spec per line. Specs naming files
//! (`@path`, `+path`, `*path`) are dropped: the fuzzer must not read the
//! machine's files. Any input must parse or fail with an error, never panic
//! Specs asking for tensors over 64 MiB (bare or `&`-prefixed) are dropped: a huge tensor is a
//! legitimate request that allocates what it asks for (as upstream), and
//! filling it would only measure the machine's memory.
//! `cargo +nightly fuzz run parse_input fuzz/seeds/parse_input`.
#![no_main]

use ferrite_hal::allocator::HeapAllocator;
use ferrite_vm::cconv::CconvType;
use libfuzzer_sys::fuzz_target;

const TYPES: [CconvType; 5] = [
    CconvType::I32,
    CconvType::I64,
    CconvType::F32,
    CconvType::F64,
    CconvType::Ref,
];

fn small_enough(spec: &str) -> bool {
    // Any long number may be a dimension (the tooling accepts spellings
    // `split_spec` does not, e.g. `&`-prefixed specs): drop specs with a run
    // of more than 7 digits (hex digits too, for `0x` dimensions).
    let long_number = spec
        .split(|c: char| !c.is_ascii_hexdigit())
        .any(|run| run.len() > 7 && run.bytes().any(|b| b.is_ascii_digit()));
    if long_number {
        return false;
    }
    // `&` (an output buffer) takes a tensor spec too.
    let tensor = spec.trim_start();
    let tensor = tensor.strip_prefix('&').unwrap_or(tensor);
    let Ok((shape, element_type, _)) = ferrite_hal::buffer_view::split_spec(tensor) else {
        return true;
    };
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| n.checked_mul(element_type.element_byte_count().max(1) as u64))
        .is_some_and(|bytes| bytes <= 64 << 20)
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let specs: Vec<String> = text
        .lines()
        .filter(|s| !s.trim_start().starts_with(['@', '+', '*']))
        .filter(|s| small_enough(s))
        .map(str::to_string)
        .collect();
    // Two bits per argument, up to four arguments, refs most likely.
    let types: Vec<CconvType> = (0..specs.len().min(4))
        .map(|i| match (selector >> (2 * i)) & 3 {
            0 => TYPES[4].clone(),
            1 => TYPES[(selector as usize >> 6) % 4].clone(),
            2 => CconvType::Ref,
            _ => CconvType::I64,
        })
        .collect();
    let allocator = HeapAllocator::new();
    let _ = ferrite_tooling::inputs::parse_variants(&types, &specs, Some(&allocator), "arguments");
    // The bare buffer-view syntax on its own, as the Python API parses it.
    for s in &specs {
        let _ = ferrite_hal::buffer_view::BufferView::parse(s, &allocator);
    }
});
