//! tiktoken vocabularies (`<base64 token> <rank>` lines) as HuggingFace
//! tokenizer descriptions, so that one engine serves both formats.
//!
//! A tiktoken encoding is byte-level BPE where a token's rank is both its id
//! and its merge priority, plus a split pattern and special tokens that the
//! file does not carry (they are fixed per named encoding, below). The
//! conversion writes the vocabulary in the ByteLevel alphabet, recovers each
//! token's merge (the two parts byte-pair merging by rank leaves just before
//! the token forms), and keeps whole-piece lookups first (`ignore_merges`),
//! which is how tiktoken encodes a piece that is itself a token.

use crate::fast::bpe::byte_alphabet;
use base64::Engine as _;
use ferrite_base::{bail, status, Result};
use serde_json::{json, Value};
use std::collections::HashMap;

/// Split pattern and special tokens of a named tiktoken encoding.
struct Encoding {
    pattern: &'static str,
    special: &'static [(&'static str, u32)],
}

const CL100K_PATTERN: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const O200K_PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The encodings tiktoken names, with their published special tokens.
fn encoding(name: &str) -> Option<Encoding> {
    let (pattern, special): (&str, &[(&str, u32)]) = match name {
        "cl100k_base" => (
            CL100K_PATTERN,
            &[
                ("<|endoftext|>", 100257),
                ("<|fim_prefix|>", 100258),
                ("<|fim_middle|>", 100259),
                ("<|fim_suffix|>", 100260),
                ("<|endofprompt|>", 100276),
            ],
        ),
        "o200k_base" => (
            O200K_PATTERN,
            &[("<|endoftext|>", 199999), ("<|endofprompt|>", 200018)],
        ),
        "o200k_harmony" => (
            O200K_PATTERN,
            &[
                ("<|startoftext|>", 199998),
                ("<|endoftext|>", 199999),
                ("<|return|>", 200002),
                ("<|constrain|>", 200003),
                ("<|channel|>", 200005),
                ("<|start|>", 200006),
                ("<|end|>", 200007),
                ("<|message|>", 200008),
                ("<|call|>", 200012),
                ("<|endofprompt|>", 200018),
            ],
        ),
        "r50k_base" | "gpt2" | "p50k_base" => (GPT2_PATTERN, &[("<|endoftext|>", 50256)]),
        "p50k_edit" => (
            GPT2_PATTERN,
            &[
                ("<|endoftext|>", 50256),
                ("<|fim_prefix|>", 50281),
                ("<|fim_middle|>", 50282),
                ("<|fim_suffix|>", 50283),
            ],
        ),
        _ => return None,
    };
    Some(Encoding { pattern, special })
}

/// True when `name` is a tiktoken encoding this build knows.
pub fn is_known_encoding(name: &str) -> bool {
    encoding(name).is_some()
}

/// Parses `<base64> <rank>` lines into (bytes, rank).
fn parse_ranks(data: &str) -> Result<Vec<(Vec<u8>, u32)>> {
    let engine = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::new();
    for (n, line) in data.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(token), Some(rank), None) = (parts.next(), parts.next(), parts.next()) else {
            bail!(
                InvalidArgument,
                "tiktoken line {}: expected `<base64 token> <rank>`, found '{line}'",
                n + 1
            );
        };
        let bytes = engine.decode(token).map_err(|e| {
            status!(
                InvalidArgument,
                "tiktoken line {}: token '{token}' is not base64: {e}",
                n + 1
            )
        })?;
        let rank: u32 = rank.parse().map_err(|_| {
            status!(
                InvalidArgument,
                "tiktoken line {}: rank '{rank}' is not an integer",
                n + 1
            )
        })?;
        out.push((bytes, rank));
    }
    if out.is_empty() {
        bail!(InvalidArgument, "tiktoken data has no tokens");
    }
    Ok(out)
}

/// The two tokens that byte-pair merging by rank joins last to form
/// `token` (ranks below `rank` only); None when merging never reaches two
/// parts (a token only reachable as a whole piece).
fn last_merge<'a>(
    token: &'a [u8],
    rank: u32,
    ranks: &HashMap<&[u8], u32>,
) -> Option<(&'a [u8], &'a [u8])> {
    let mut parts: Vec<&[u8]> = token.chunks(1).collect();
    while parts.len() > 2 {
        let best = (0..parts.len() - 1)
            .filter_map(|i| {
                let joined = &token
                    [offset(token, parts[i])..offset(token, parts[i + 1]) + parts[i + 1].len()];
                ranks.get(joined).filter(|&&r| r < rank).map(|&r| (r, i))
            })
            .min()?;
        let i = best.1;
        let start = offset(token, parts[i]);
        let end = offset(token, parts[i + 1]) + parts[i + 1].len();
        parts[i] = &token[start..end];
        parts.remove(i + 1);
    }
    (parts.len() == 2).then(|| (parts[0], parts[1]))
}

/// Byte offset of `part` (a sub-slice of `whole`) within `whole`.
fn offset(whole: &[u8], part: &[u8]) -> usize {
    part.as_ptr() as usize - whole.as_ptr() as usize
}

/// A HuggingFace `tokenizer.json` equivalent to tiktoken `data` under the
/// named `encoding`.
pub fn to_huggingface_json(data: &str, encoding_name: &str) -> Result<String> {
    let Some(enc) = encoding(encoding_name) else {
        bail!(
            InvalidArgument,
            "Unknown tiktoken encoding: {encoding_name} (known: cl100k_base, o200k_base, \
             o200k_harmony, r50k_base, gpt2, p50k_base, p50k_edit)"
        );
    };
    let tokens = parse_ranks(data)?;
    let alphabet = byte_alphabet();
    let spell = |b: &[u8]| b.iter().map(|&x| alphabet[x as usize]).collect::<String>();
    let ranks: HashMap<&[u8], u32> = tokens.iter().map(|(b, r)| (b.as_slice(), *r)).collect();
    for b in 0..=255u8 {
        if !ranks.contains_key([b].as_slice()) {
            bail!(
                InvalidArgument,
                "tiktoken data lacks the single-byte token {b:#04x}"
            );
        }
    }
    let mut vocab = serde_json::Map::new();
    for (bytes, rank) in &tokens {
        vocab.insert(spell(bytes), json!(rank));
    }
    // Special tokens also enter the model's vocabulary under their fixed
    // ids: the added-token table alone would renumber them past the ranks.
    // (Split patterns never leave one as a whole piece of ordinary text.)
    let used: std::collections::HashSet<u32> = tokens.iter().map(|(_, r)| *r).collect();
    for (content, id) in enc.special {
        if used.contains(id) {
            bail!(
                InvalidArgument,
                "tiktoken data uses rank {id}, which {encoding_name} reserves for {content}"
            );
        }
        vocab.insert(content.to_string(), json!(id));
    }
    let mut by_rank: Vec<&(Vec<u8>, u32)> = tokens.iter().filter(|(b, _)| b.len() > 1).collect();
    by_rank.sort_by_key(|(_, r)| *r);
    let merges: Vec<Value> = by_rank
        .iter()
        .filter_map(|(bytes, rank)| last_merge(bytes, *rank, &ranks))
        .map(|(a, b)| json!([spell(a), spell(b)]))
        .collect();
    let added: Vec<Value> = enc
        .special
        .iter()
        .map(|(content, id)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": enc.pattern}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": true, "vocab": vocab, "merges": merges},
    });
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(bytes: &[u8], rank: u32) -> String {
        format!(
            "{} {rank}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    }

    #[test]
    fn merges_follow_ranks() {
        let mut lines: Vec<String> = (0..=255u8).map(|b| line(&[b], b as u32)).collect();
        lines.push(line(b"ab", 256));
        lines.push(line(b"abc", 257));
        lines.push(line(b"bc", 258));
        let data = lines.join("\n");
        let tokens = parse_ranks(&data).unwrap();
        let ranks: HashMap<&[u8], u32> = tokens.iter().map(|(b, r)| (b.as_slice(), *r)).collect();
        // "ab" (256) forms before "bc" (258), so "abc" is "ab" + "c".
        assert_eq!(
            last_merge(b"abc", 257, &ranks),
            Some((&b"ab"[..], &b"c"[..]))
        );
        assert_eq!(last_merge(b"ab", 256, &ranks), Some((&b"a"[..], &b"b"[..])));
        assert!(to_huggingface_json(&data, "cl100k_base").is_ok());
    }

    #[test]
    fn bad_data_is_named() {
        let e = to_huggingface_json("AA== 0", "nope").unwrap_err();
        assert!(
            e.to_string().contains("Unknown tiktoken encoding: nope"),
            "{e}"
        );
        let e = to_huggingface_json("AA== x", "gpt2").unwrap_err();
        assert!(e.to_string().contains("rank 'x' is not an integer"), "{e}");
        let e = to_huggingface_json("AA== 0", "gpt2").unwrap_err();
        assert!(
            e.to_string().contains("lacks the single-byte token 0x01"),
            "{e}"
        );
    }
}
