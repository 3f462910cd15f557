//! Table-driven `decode` for tokenizers whose decoder is `ByteLevel` alone
//! (GPT-2 style byte-level BPE, the common case).
//!
//! The `tokenizers` crate decodes by turning each id into its token string,
//! mapping every character of the concatenation back to a byte through a
//! hash map and only then making the text. The result depends on nothing but
//! the ids, so each id's bytes can be worked out once: decoding becomes
//! appending byte strings. The table follows the crate exactly: an id names
//! the added token with that id, else the model's token; a token whose every
//! character is in the byte-level alphabet stands for those bytes, any other
//! for its own UTF-8; unknown ids are skipped, special tokens too when asked;
//! invalid UTF-8 in the result becomes U+FFFD.

use std::collections::HashMap;
use tokenizers::DecoderWrapper;

/// Each id's bytes, and whether it is a special token.
pub struct ByteLevelTable {
    /// `spans[id]`: `(start, end)` in `bytes`; `start > end` for no token.
    spans: Vec<(u32, u32)>,
    bytes: Vec<u8>,
    special: Vec<bool>,
}

/// GPT-2's stand-in character for each byte, inverted.
fn char_bytes() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            extra += 1;
            // 256 + n for n < 68: always a valid scalar value.
            char::from_u32(255 + extra).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        out.insert(c, b);
    }
    out
}

impl ByteLevelTable {
    /// The table for `tokenizer`, or None when its decoder is not exactly
    /// `ByteLevel` (other decoders go through the crate).
    pub fn build(tokenizer: &tokenizers::Tokenizer) -> Option<ByteLevelTable> {
        if !matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let max_id = tokenizer.get_vocab(true).values().copied().max()?;
        let to_byte = char_bytes();
        let added = tokenizer.get_added_vocabulary();
        let n = max_id as usize + 1;
        let mut table = ByteLevelTable {
            spans: Vec::with_capacity(n),
            bytes: Vec::new(),
            special: Vec::with_capacity(n),
        };
        for id in 0..=max_id {
            let Some(token) = tokenizer.id_to_token(id) else {
                table.spans.push((1, 0));
                table.special.push(false);
                continue;
            };
            let start = table.bytes.len();
            let mapped: Option<Vec<u8>> = token.chars().map(|c| to_byte.get(&c).copied()).collect();
            match mapped {
                Some(b) => table.bytes.extend_from_slice(&b),
                None => table.bytes.extend_from_slice(token.as_bytes()),
            }
            let (Ok(start), Ok(end)) = (u32::try_from(start), u32::try_from(table.bytes.len()))
            else {
                return None;
            };
            table.spans.push((start, end));
            table.special.push(added.is_special_token(&token));
        }
        // Slack after the last token: `decode` copies CHUNK bytes from any
        // token's start.
        table.bytes.resize(table.bytes.len() + CHUNK, 0);
        Some(table)
    }

    /// The text of `ids`, as the crate's `Tokenizer::decode` gives it.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        let out = if ids.len() >= CHUNKED_FROM {
            self.bytes_chunked(ids, skip_special_tokens)
        } else {
            // A handful of ids (a decode stream's window, two decodes per
            // id fed): the plain loop, small and inlined.
            let mut out = Vec::with_capacity(ids.len() * 4);
            for &id in ids {
                let Some(&(start, end)) = self.spans.get(id as usize) else {
                    continue;
                };
                if start > end || (skip_special_tokens && self.special[id as usize]) {
                    continue;
                }
                out.extend_from_slice(&self.bytes[start as usize..end as usize]);
            }
            out
        };
        match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// The bytes of many `ids`. Most tokens are a few bytes: copying a
    /// fixed CHUNK from the token's start (the table and the output have
    /// slack for it) and advancing by the token's length compiles to a
    /// couple of vector moves, where an exact-length copy is a `memcpy`
    /// call per id, most of the time of a long decode.
    #[inline(never)]
    fn bytes_chunked(&self, ids: &[u32], skip_special_tokens: bool) -> Vec<u8> {
        let span = |id: u32| -> Option<(usize, usize)> {
            let &(start, end) = self.spans.get(id as usize)?;
            if start > end || (skip_special_tokens && self.special[id as usize]) {
                return None;
            }
            Some((start as usize, end as usize))
        };
        let total: usize = ids
            .iter()
            .filter_map(|&id| span(id).map(|(s, e)| e - s))
            .sum();
        let mut out = vec![0u8; total + CHUNK];
        let mut at = 0;
        for (start, end) in ids.iter().filter_map(|&id| span(id)) {
            let len = end - start;
            if len <= CHUNK {
                out[at..at + CHUNK].copy_from_slice(&self.bytes[start..start + CHUNK]);
            } else {
                out[at..at + len].copy_from_slice(&self.bytes[start..end]);
            }
            at += len;
        }
        out.truncate(at);
        out
    }
}

/// Bytes `decode` copies at once for a token of at most that many bytes.
const CHUNK: usize = 16;

/// Fewest ids `decode` copies in chunks (the test decodes lengths on both
/// sides of it).
const CHUNKED_FROM: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level BPE with merges, special and non-special added tokens,
    /// and added tokens outside the byte alphabet.
    fn tokenizer() -> tokenizers::Tokenizer {
        let alphabet = char_bytes();
        let mut vocab: Vec<(String, u32)> = alphabet
            .iter()
            .map(|(c, b)| (c.to_string(), *b as u32))
            .collect();
        let merges = ["h e", "l l", "he ll", "Ġ w", "o r", "Ġw or"];
        for m in merges {
            let id = vocab.len() as u32;
            vocab.push((m.replace(' ', ""), id));
        }
        let n = vocab.len() as u32;
        let vocab: serde_json::Map<String, serde_json::Value> = vocab
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::from(v)))
            .collect();
        let added = |id: u32, content: &str, special: bool| {
            serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special})
        };
        let doc = serde_json::json!({
            "version": "1.0",
            "added_tokens": [added(n, "<|endoftext|>", true), added(n + 1, "héllo😀", false),
                             added(n + 2, "<|pad|>", true),
                             // 16 and 29 bytes: at and past what `decode`
                             // copies at once.
                             added(n + 3, "<|sixteenbytes|>", false),
                             added(n + 4, "<|a much longer added token|>", false)],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "vocab": vocab, "merges": merges},
        });
        tokenizers::Tokenizer::from_bytes(doc.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn decodes_exactly_as_the_crate() {
        let tok = tokenizer();
        let table = ByteLevelTable::build(&tok).expect("byte-level decoder");
        let max = tok.get_vocab_size(true) as u32 + 3;
        // A fixed pseudo-random walk over all ids, unknown ones included,
        // so that byte sequences split across tokens (invalid UTF-8 runs)
        // come up too.
        let mut x = 12345u32;
        for len in [0usize, 1, 2, 3, 7, 50, 400] {
            for _ in 0..40 {
                let ids: Vec<u32> = (0..len)
                    .map(|_| {
                        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                        (x >> 8) % max
                    })
                    .collect();
                for skip in [false, true] {
                    assert_eq!(
                        table.decode(&ids, skip),
                        tok.decode(&ids, skip).unwrap(),
                        "{ids:?} skip={skip}"
                    );
                }
            }
        }
        let text = " hello world<|endoftext|>héllo😀 ünïcode";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(table.decode(&ids, false), text);
    }

    #[test]
    fn other_decoders_are_left_to_the_crate() {
        let mut doc: serde_json::Value =
            serde_json::from_str(&tokenizer().to_string(false).unwrap()).unwrap();
        doc["decoder"] = serde_json::json!({"type": "Fuse"});
        let tok = tokenizers::Tokenizer::from_bytes(doc.to_string().as_bytes()).unwrap();
        assert!(ByteLevelTable::build(&tok).is_none());
    }
}
