//! Hand-written encoders for the common tokenizer configurations.
//!
//! [`FastEncoder::build`] looks at a `tokenizer.json` and returns an
//! encoder only for configurations it reproduces exactly; everything else
//! goes through the `tokenizers` crate, which stays the reference: the
//! tests compare both on many random strings. Supported:
//! - GPT-2 style byte-level BPE: no normalizer, the `ByteLevel`
//!   pre-tokenizer with its regex and no prefix space ([`gpt2`], [`bpe`]);
//! - BERT: `BertNormalizer`, `BertPreTokenizer`, WordPiece ([`wordpiece`]);
//!
//! each with added tokens that strip no whitespace ([`added`]) and a
//! post-processor that only adds tokens around the sequence.

pub mod added;
pub mod bpe;
pub mod gpt2;
pub mod wordpiece;

use added::{AddedSplitter, Piece};
use bpe::ByteLevelBpe;
use wordpiece::BertWordPiece;

/// The model-specific part.
enum Pipeline {
    Gpt2(Box<ByteLevelBpe>),
    Bert(BertWordPiece),
}

/// An encoder for one supported configuration.
pub struct FastEncoder {
    added: AddedSplitter,
    pipeline: Pipeline,
    /// Ids the post-processor puts before and after a single sequence.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    /// Whether some added token is not special: with special-token
    /// matching off the crate's results then depend on how a skipped match
    /// hides others, which only the crate reproduces.
    has_plain_added: bool,
}

/// The `(prefix, suffix)` ids a post-processor adds around one sequence,
/// or None for post-processors that do more.
fn post_ids(post: Option<&serde_json::Value>) -> Option<(Vec<u32>, Vec<u32>)> {
    let Some(post) = post.filter(|p| !p.is_null()) else {
        return Some((Vec::new(), Vec::new()));
    };
    let pair_id =
        |v: &serde_json::Value| -> Option<u32> { u32::try_from(v.get(1)?.as_u64()?).ok() };
    match post.get("type")?.as_str()? {
        "ByteLevel" => Some((Vec::new(), Vec::new())),
        "BertProcessing" | "RobertaProcessing" => Some((
            vec![pair_id(post.get("cls")?)?],
            vec![pair_id(post.get("sep")?)?],
        )),
        "TemplateProcessing" => {
            let specials = post.get("special_tokens")?;
            let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
            let mut seen_sequence = false;
            for piece in post.get("single")?.as_array()? {
                if let Some(seq) = piece.get("Sequence") {
                    if seen_sequence || seq.get("id")?.as_str()? != "A" {
                        return None;
                    }
                    seen_sequence = true;
                } else {
                    let name = piece.get("SpecialToken")?.get("id")?.as_str()?;
                    let ids = specials.get(name)?.get("ids")?.as_array()?;
                    let side = if seen_sequence {
                        &mut suffix
                    } else {
                        &mut prefix
                    };
                    for id in ids {
                        side.push(u32::try_from(id.as_u64()?).ok()?);
                    }
                }
            }
            seen_sequence.then_some((prefix, suffix))
        }
        _ => None,
    }
}

impl FastEncoder {
    /// The fast encoder for `doc` (the parsed `tokenizer.json` that
    /// `tokenizer` was loaded from), if its configuration is supported.
    pub fn build(
        doc: &serde_json::Value,
        tokenizer: &tokenizers::Tokenizer,
    ) -> Option<FastEncoder> {
        use tokenizers::Model;
        let vocab = tokenizer.get_model().get_vocab();
        let kind = |k: &str| {
            doc.get(k)
                .and_then(|v| v.get("type"))
                .and_then(|t| t.as_str())
        };
        let pipeline = if kind("model") == Some("BPE") {
            let normalizer_absent = doc.get("normalizer").is_none_or(|n| n.is_null());
            let pre = doc.get("pre_tokenizer")?;
            if !normalizer_absent
                || kind("pre_tokenizer") != Some("ByteLevel")
                || pre.get("add_prefix_space")?.as_bool()?
                || !pre
                    .get("use_regex")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(true)
            {
                return None;
            }
            Pipeline::Gpt2(Box::new(ByteLevelBpe::build(doc.get("model")?, &vocab)?))
        } else if kind("model") == Some("WordPiece") {
            Pipeline::Bert(BertWordPiece::build(doc, &vocab)?)
        } else {
            return None;
        };
        let (prefix, suffix) = post_ids(doc.get("post_processor"))?;
        let has_plain_added = tokenizer
            .get_added_tokens_decoder()
            .values()
            .any(|t| !t.special);
        Some(FastEncoder {
            added: AddedSplitter::build(tokenizer)?,
            pipeline,
            prefix,
            suffix,
            has_plain_added,
        })
    }

    /// Ids of `text`, or None to leave it to the crate. `reference` encodes
    /// a piece of text (no added tokens in it, no post-processing) through
    /// the crate, for the parts this encoder does not handle itself.
    pub fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
        no_special_token_matching: bool,
        reference: &dyn Fn(&str) -> Option<Vec<u32>>,
    ) -> Option<Vec<u32>> {
        if no_special_token_matching && self.has_plain_added {
            return None;
        }
        let mut pieces = Vec::new();
        self.added
            .split(text, no_special_token_matching, &mut pieces);
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        if add_special_tokens {
            out.extend_from_slice(&self.prefix);
        }
        for piece in pieces {
            match piece {
                Piece::Token(id) => out.push(id),
                Piece::Text(t) => self.encode_text(t, &mut out, reference)?,
            }
        }
        if add_special_tokens {
            out.extend_from_slice(&self.suffix);
        }
        Some(out)
    }

    /// Appends the ids of text that holds no added token.
    fn encode_text(
        &self,
        text: &str,
        out: &mut Vec<u32>,
        reference: &dyn Fn(&str) -> Option<Vec<u32>>,
    ) -> Option<()> {
        match &self.pipeline {
            Pipeline::Gpt2(bpe) => {
                let mut long = None;
                gpt2::for_each_piece(text, |word| {
                    if word.len() <= bpe::LONG_WORD_BYTES {
                        bpe.encode_word(word.as_bytes(), out);
                    } else if long.is_none() {
                        // One word is the whole of its piece: the crate
                        // encodes it alone the same way.
                        match reference(word) {
                            Some(ids) => out.extend(ids),
                            None => long = Some(()),
                        }
                    }
                });
                if long.is_some() {
                    return None;
                }
            }
            Pipeline::Bert(wp) => {
                let mut word = Vec::new();
                for chunk in text.split([' ', '\t', '\n', '\r']) {
                    if chunk.is_empty() {
                        continue;
                    }
                    if chunk.is_ascii() {
                        wp.encode_chunk(chunk.as_bytes(), &mut word, out);
                    } else {
                        out.extend(reference(chunk)?);
                    }
                }
            }
        }
        Some(())
    }
}
