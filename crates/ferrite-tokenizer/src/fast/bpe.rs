//! Byte-level BPE (GPT-2 style): merges over a word's bytes by rank.
//!
//! The `tokenizers` crate spells each byte as a printable character,
//! merges over those characters with a priority queue, and caches words.
//! Here a word's symbols are the byte ids themselves; the pair of lowest
//! rank (leftmost on ties) merges first, which is the order the crate's
//! queue yields, so the ids are the same. Merged words are cached.

use rustc_hash::FxHashMap;
use std::sync::RwLock;

/// GPT-2's printable stand-in for each byte: the ByteLevel alphabet in
/// which HuggingFace vocabularies spell byte strings.
pub fn byte_alphabet() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut out = ['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b).unwrap_or('\0')
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or('\0')
        };
    }
    out
}

/// Words at most this long are cached (longer ones are rare and would
/// crowd the cache).
const CACHE_WORD_BYTES: usize = 64;
/// Entries the word cache holds before it stops growing.
const CACHE_ENTRIES: usize = 200_000;
/// Words longer than this go to the crate, whose queue merges in
/// O(n log n) where the loop here is O(n²).
pub const LONG_WORD_BYTES: usize = 256;

/// Merged words: a word's bytes to its ids.
type WordCache = FxHashMap<Box<[u8]>, Box<[u32]>>;

/// The model: byte ids, merges by pair, whole-word lookups.
pub struct ByteLevelBpe {
    byte_ids: [u32; 256],
    /// `(left, right)` → `(rank, merged id)`.
    merges: FxHashMap<(u32, u32), (u32, u32)>,
    /// Tokens by their bytes, for `ignore_merges`.
    whole: Option<FxHashMap<Box<[u8]>, u32>>,
    cache: RwLock<WordCache>,
}

impl ByteLevelBpe {
    /// The model of a `tokenizer.json` whose `model` is `model` (a BPE
    /// without dropout, affixes, byte fallback), with vocabulary `vocab`;
    /// None when it is not one this type reproduces.
    pub fn build(
        model: &serde_json::Value,
        vocab: &std::collections::HashMap<String, u32>,
    ) -> Option<ByteLevelBpe> {
        let null_or = |k: &str, ok: &dyn Fn(&serde_json::Value) -> bool| {
            model.get(k).is_none_or(|v| v.is_null() || ok(v))
        };
        if model.get("type")?.as_str()? != "BPE"
            || !null_or("dropout", &|v| v.as_f64() == Some(0.0))
            || !null_or("continuing_subword_prefix", &|v| v.as_str() == Some(""))
            || !null_or("end_of_word_suffix", &|v| v.as_str() == Some(""))
            || !null_or("byte_fallback", &|v| v.as_bool() == Some(false))
        {
            return None;
        }
        let ignore_merges = model
            .get("ignore_merges")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let alphabet = byte_alphabet();
        let mut byte_ids = [0u32; 256];
        for (b, c) in alphabet.iter().enumerate() {
            byte_ids[b] = *vocab.get(c.to_string().as_str())?;
        }
        let mut merges = FxHashMap::default();
        let mut rank = 0u32;
        for m in model.get("merges")?.as_array()? {
            let (a, b) = match m {
                serde_json::Value::String(s) => {
                    if s.starts_with("#version") {
                        continue;
                    }
                    let mut parts = s.split(' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(a), Some(b), None) => (a.to_string(), b.to_string()),
                        _ => return None,
                    }
                }
                serde_json::Value::Array(p) if p.len() == 2 => {
                    (p[0].as_str()?.to_string(), p[1].as_str()?.to_string())
                }
                _ => return None,
            };
            let ia = *vocab.get(&a)?;
            let ib = *vocab.get(&b)?;
            let merged = *vocab.get(&format!("{a}{b}"))?;
            merges.insert((ia, ib), (rank, merged));
            rank += 1;
        }
        let whole = ignore_merges.then(|| {
            let mut inverse = FxHashMap::default();
            for (b, c) in alphabet.iter().enumerate() {
                inverse.insert(*c, b as u8);
            }
            vocab
                .iter()
                .filter_map(|(token, id)| {
                    let bytes: Option<Vec<u8>> =
                        token.chars().map(|c| inverse.get(&c).copied()).collect();
                    Some((bytes?.into_boxed_slice(), *id))
                })
                .collect()
        });
        Some(ByteLevelBpe {
            byte_ids,
            merges,
            whole,
            cache: RwLock::new(FxHashMap::default()),
        })
    }

    /// Appends the ids of one pre-tokenizer word (`LONG_WORD_BYTES` bytes
    /// at most).
    pub fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if let Some(whole) = &self.whole {
            if let Some(&id) = whole.get(word) {
                out.push(id);
                return;
            }
        }
        if word.len() == 1 {
            out.push(self.byte_ids[word[0] as usize]);
            return;
        }
        let cacheable = word.len() <= CACHE_WORD_BYTES;
        if cacheable {
            if let Ok(cache) = self.cache.read() {
                if let Some(ids) = cache.get(word) {
                    out.extend_from_slice(ids);
                    return;
                }
            }
        }
        let start = out.len();
        out.extend(word.iter().map(|&b| self.byte_ids[b as usize]));
        self.merge(out, start);
        if cacheable {
            if let Ok(mut cache) = self.cache.write() {
                if cache.len() < CACHE_ENTRIES {
                    cache.insert(word.into(), out[start..].into());
                }
            }
        }
    }

    /// Merges `ids[start..]` in place: the lowest-ranked pair first,
    /// leftmost among equals, until no pair merges.
    fn merge(&self, ids: &mut Vec<u32>, start: usize) {
        loop {
            let sym = &ids[start..];
            let mut best: Option<(u32, usize, u32)> = None;
            for i in 0..sym.len().saturating_sub(1) {
                if let Some(&(rank, merged)) = self.merges.get(&(sym[i], sym[i + 1])) {
                    if best.is_none_or(|(r, _, _)| rank < r) {
                        best = Some((rank, i, merged));
                    }
                }
            }
            let Some((_, i, merged)) = best else {
                return;
            };
            ids[start + i] = merged;
            ids.remove(start + i + 1);
        }
    }
}
