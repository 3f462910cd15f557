//! Fuzzes tokenizer loading from Hugging Face `tokenizer.json` text
//! (ferrite-tokenizer's `Tokenizer::from_json`, the function the Python
//! binding calls), then encodes and decodes a short text with whatever
//! loaded. Any input must load or fail with an error, never panic.
//! `cargo +nightly fuzz run tokenizer_json fuzz/seeds/tokenizer_json`.
#![no_main]

use ferrite_tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(tok) = Tokenizer::from_json(json) else {
        return;
    };
    if let Ok(ids) = tok.encode("Hello, world! 123 <s>", true, false) {
        let _ = tok.decode(&ids, false);
    }
    let _ = tok.vocab_size();
});
