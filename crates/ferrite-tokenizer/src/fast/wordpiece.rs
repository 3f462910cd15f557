//! BERT's pipeline (BertNormalizer, BertPreTokenizer, WordPiece) for ASCII
//! text.
//!
//! Every step of that pipeline acts on one character or one
//! whitespace-separated chunk at a time, so text splits at ASCII
//! whitespace into chunks that encode independently: ASCII chunks take the
//! path here, any chunk with another character goes to the `tokenizers`
//! crate whole (accents, CJK and Unicode punctuation stay its business).
//! On ASCII the normalizer drops control characters, lowercases if asked
//! (accent stripping changes nothing), and the pre-tokenizer isolates
//! ASCII punctuation; WordPiece then takes the longest vocabulary entry at
//! each position (with the continuing prefix after the first), or the
//! unknown token for the whole word if some position has none.

use rustc_hash::FxHashMap;

/// The WordPiece model and the normalizer's options.
pub struct BertWordPiece {
    lowercase: bool,
    /// Entries that may start a word, by bytes.
    first: FxHashMap<Box<[u8]>, u32>,
    /// Entries after the continuing prefix, by the bytes that follow it.
    rest: FxHashMap<Box<[u8]>, u32>,
    /// Longest key of each map, to bound the search.
    first_max: usize,
    rest_max: usize,
    unk: u32,
    max_chars: usize,
}

impl BertWordPiece {
    /// The pipeline of `doc` (a `tokenizer.json`) with vocabulary `vocab`,
    /// or None when it is not BertNormalizer (with `clean_text`),
    /// BertPreTokenizer and WordPiece.
    pub fn build(
        doc: &serde_json::Value,
        vocab: &std::collections::HashMap<String, u32>,
    ) -> Option<BertWordPiece> {
        fn kind(v: Option<&serde_json::Value>) -> Option<&str> {
            v.and_then(|v| v.get("type")).and_then(|t| t.as_str())
        }
        let normalizer = doc.get("normalizer")?;
        if kind(Some(normalizer)) != Some("BertNormalizer")
            || normalizer.get("clean_text")?.as_bool() != Some(true)
            || kind(doc.get("pre_tokenizer")) != Some("BertPreTokenizer")
        {
            return None;
        }
        let lowercase = normalizer.get("lowercase")?.as_bool()?;
        let model = doc.get("model")?;
        if kind(Some(model)) != Some("WordPiece") {
            return None;
        }
        let prefix = model.get("continuing_subword_prefix")?.as_str()?;
        let unk = *vocab.get(model.get("unk_token")?.as_str()?)?;
        let max_chars = usize::try_from(model.get("max_input_chars_per_word")?.as_u64()?).ok()?;
        let mut first = FxHashMap::default();
        let mut rest = FxHashMap::default();
        for (token, &id) in vocab {
            first.insert(token.as_bytes().into(), id);
            if let Some(tail) = token.strip_prefix(prefix) {
                rest.insert(tail.as_bytes().into(), id);
            }
        }
        let longest = |m: &FxHashMap<Box<[u8]>, u32>| m.keys().map(|k| k.len()).max().unwrap_or(0);
        Some(BertWordPiece {
            lowercase,
            first_max: longest(&first),
            rest_max: longest(&rest),
            first,
            rest,
            unk,
            max_chars,
        })
    }

    /// Appends the ids of an ASCII chunk with no whitespace.
    pub fn encode_chunk(&self, chunk: &[u8], word: &mut Vec<u8>, out: &mut Vec<u32>) {
        word.clear();
        for &b in chunk {
            if b < 0x20 || b == 0x7F {
                continue; // clean_text drops control characters
            }
            if b.is_ascii_punctuation() {
                self.encode_word(word, out);
                word.clear();
                self.encode_word(&[b], out);
            } else {
                word.push(if self.lowercase {
                    b.to_ascii_lowercase()
                } else {
                    b
                });
            }
        }
        self.encode_word(word, out);
    }

    /// Appends the ids of one ASCII word.
    fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if word.len() > self.max_chars {
            out.push(self.unk);
            return;
        }
        let mark = out.len();
        let mut start = 0;
        while start < word.len() {
            let (map, max) = if start == 0 {
                (&self.first, self.first_max)
            } else {
                (&self.rest, self.rest_max)
            };
            let mut end = word.len().min(start + max);
            let found = loop {
                if end <= start {
                    break None;
                }
                if let Some(&id) = map.get(&word[start..end]) {
                    break Some(id);
                }
                end -= 1;
            };
            match found {
                Some(id) => {
                    out.push(id);
                    start = end;
                }
                None => {
                    out.truncate(mark);
                    out.push(self.unk);
                    return;
                }
            }
        }
    }
}
