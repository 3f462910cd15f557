//! The hand-written encoders against the `tokenizers` crate: tokenizers
//! trained here on this repository's own sources, many random strings
//! (ASCII, Unicode, added tokens, odd whitespace), every option.

use ferrite_tokenizer::Tokenizer;
use serde_json::{json, Value};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainerBuilder};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

/// Training text: this crate's sources.
fn corpus() -> Vec<String> {
    [
        include_str!("../src/tokenizer.rs"),
        include_str!("../src/stream.rs"),
        include_str!("../src/tiktoken.rs"),
        include_str!("../src/fast/mod.rs"),
    ]
    .iter()
    .flat_map(|s| s.lines().map(str::to_string))
    .collect()
}

fn trained_bpe() -> Value {
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let mut trainer = TrainerWrapper::BpeTrainer(
        BpeTrainerBuilder::new()
            .vocab_size(1500)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build(),
    );
    tok.train(&mut trainer, corpus().into_iter()).unwrap();
    serde_json::from_str(&tok.to_string(false).unwrap()).unwrap()
}

fn trained_wordpiece(lowercase: bool) -> Value {
    let mut tok = tokenizers::Tokenizer::new(WordPiece::default());
    tok.with_normalizer(Some(BertNormalizer::new(true, true, None, lowercase)));
    tok.with_pre_tokenizer(Some(BertPreTokenizer));
    let mut trainer = TrainerWrapper::WordPieceTrainer(
        WordPieceTrainerBuilder::new()
            .vocab_size(800)
            .show_progress(false)
            .special_tokens(
                ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                    .iter()
                    .map(|s| tokenizers::AddedToken::from(s.to_string(), true))
                    .collect(),
            )
            .build(),
    );
    tok.train(&mut trainer, corpus().into_iter()).unwrap();
    let mut doc: Value = serde_json::from_str(&tok.to_string(false).unwrap()).unwrap();
    let id = |t: &str| doc["model"]["vocab"][t].as_u64().unwrap();
    let (cls, sep) = (id("[CLS]"), id("[SEP]"));
    doc["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [cls], "tokens": ["[CLS]"]},
                           "[SEP]": {"id": "[SEP]", "ids": [sep], "tokens": ["[SEP]"]}},
    });
    // Saved as sentence-transformers does: ignored, as upstream.
    doc["padding"] = json!({"strategy": {"Fixed": 128}, "direction": "Right", "pad_to_multiple_of": null,
                            "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"});
    doc["truncation"] = json!({"max_length": 128, "strategy": "LongestFirst", "stride": 0});
    doc
}

/// Adds special (and, if `plain`, non-special) added tokens after the
/// vocabulary.
fn with_added(mut doc: Value, plain: bool, normalized: bool) -> Value {
    let n = doc["model"]["vocab"].as_object().unwrap().len() as u64;
    let mut added = doc["added_tokens"].as_array().cloned().unwrap_or_default();
    let mut next = n;
    let mut add = |content: &str, special: bool| {
        added.push(
            json!({"id": next, "content": content, "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": normalized, "special": special}),
        );
        next += 1;
    };
    add("<|endoftext|>", true);
    add("<|end|>", true);
    if plain {
        add("hello world", false);
    }
    doc["added_tokens"] = json!(added);
    doc
}

/// A xorshift generator: fixed seed, reproducible strings.
struct Rng(u32);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.next() as usize % items.len()]
    }
}

/// Random strings: words from the corpus, punctuation, digits, odd
/// whitespace, Unicode (accents, CJK, emoji, combining marks, controls),
/// added tokens and pieces of them.
fn strings(count: usize) -> Vec<String> {
    let words: Vec<String> = corpus()
        .join(" ")
        .split_whitespace()
        .take(3000)
        .map(str::to_string)
        .collect();
    let odd = [
        " ",
        "  ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        " \t ",
        "\u{0B}",
        "\u{0}",
        "\u{7F}",
        "\u{1F}",
        "'s",
        "'ll",
        "'",
        "é",
        "É",
        "ß",
        "日本語",
        "中文",
        "😀",
        "e\u{0301}",
        "\u{00A0}",
        "\u{3000}",
        "\u{2028}",
        "½",
        "²",
        "Ⅻ",
        "\u{200B}",
        "\u{FFFD}",
        "«»",
        "—",
        "Ωmega",
        "<|endoftext|>",
        "<|end|>",
        "<|end",
        "hello world",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "[UNK",
        "12345",
        "3.14",
        "don't",
        "WE'LL",
        "...",
        "==>",
        "#[derive]",
        "##ing",
    ];
    let mut rng = Rng(0x9E37_79B9);
    (0..count)
        .map(|_| {
            let len = rng.next() as usize % 24;
            let mut s = String::new();
            for _ in 0..len {
                match rng.next() % 4 {
                    0 => {
                        let piece: &&str = rng.pick(&odd[..]);
                        s.push_str(piece)
                    }
                    1 => s.push(' '),
                    _ => s.push_str(rng.pick(&words[..]).as_str()),
                }
            }
            s
        })
        .collect()
}

fn check(name: &str, doc: &Value, expect_fast: bool) {
    let tok = Tokenizer::from_json(&doc.to_string()).unwrap();
    assert_eq!(tok.has_fast_path(), expect_fast, "{name}: fast path");
    let texts = strings(400);
    let whole = texts.join(" ");
    for text in texts.iter().chain([&whole]) {
        for add in [false, true] {
            for literal in [false, true] {
                let fast = tok.encode(text, add, literal).unwrap();
                let reference = tok.encode_reference(text, add, literal).unwrap();
                assert_eq!(
                    fast, reference,
                    "{name}: {text:?} add={add} literal={literal}"
                );
            }
        }
    }
}

#[test]
fn byte_level_bpe_matches_the_crate() {
    let doc = trained_bpe();
    check("bpe", &doc, true);
    check("bpe+added", &with_added(doc.clone(), true, false), true);
    check(
        "bpe+normalized added",
        &with_added(doc.clone(), false, true),
        true,
    );
    let mut template = with_added(doc.clone(), false, false);
    template["post_processor"] = json!({"type": "ByteLevel", "add_prefix_space": false,
                                        "trim_offsets": true, "use_regex": true});
    check("bpe+bytelevel post", &template, true);
    let mut ignore = doc.clone();
    ignore["model"]["ignore_merges"] = json!(true);
    check("bpe ignore_merges", &ignore, true);
    let mut prefix = doc;
    prefix["pre_tokenizer"]["add_prefix_space"] = json!(true);
    check("bpe prefix space (crate)", &prefix, false);
}

#[test]
fn wordpiece_matches_the_crate() {
    check("wordpiece", &trained_wordpiece(true), true);
    check("wordpiece cased", &trained_wordpiece(false), true);
    check(
        "wordpiece+added",
        &with_added(trained_wordpiece(true), true, false),
        true,
    );
    // Normalized added tokens under a normalizer: left to the crate.
    check(
        "wordpiece+normalized added",
        &with_added(trained_wordpiece(true), false, true),
        false,
    );
}

#[test]
fn long_words_and_empty_text() {
    let tok = Tokenizer::from_json(&trained_bpe().to_string()).unwrap();
    for text in [
        "",
        " ",
        &"=".repeat(5000),
        &"ab".repeat(3000),
        &" ".repeat(1000),
    ] {
        assert_eq!(
            tok.encode(text, false, false).unwrap(),
            tok.encode_reference(text, false, false).unwrap()
        );
    }
}
