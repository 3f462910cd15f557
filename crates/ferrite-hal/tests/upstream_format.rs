//! Differential check of buffer-view parsing and printing against upstream.
//!
//! `data/upstream_format_cases.tsv` holds, per line, an `--input` spec (random
//! floats of every float type, f8 included, and random i16/i64) and the line
//! upstream's `iree-run-module` 3.13 printed when that input was passed
//! through an identity function compiled by the pinned `iree-compile`
//! (`@f32(%a: tensor<64xf32>) -> tensor<64xf32>`, etc.). Parsing the input and
//! printing it again must give exactly upstream's line.

use ferrite_hal::{BufferView, HeapAllocator};

#[test]
fn parse_and_print_match_upstream() {
    let cases = include_str!("data/upstream_format_cases.tsv");
    let allocator = HeapAllocator::new();
    let mut n = 0;
    for line in cases.lines().filter(|l| !l.is_empty()) {
        let (input, expected) = line.split_once('\t').expect("tab-separated case");
        let view = BufferView::parse(input, &allocator).unwrap();
        assert_eq!(view.format(Some(1024)).unwrap(), expected, "input: {input}");
        n += 1;
    }
    assert!(n >= 38);
}
