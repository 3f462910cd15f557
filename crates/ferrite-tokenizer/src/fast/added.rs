//! Splitting text around added tokens, as the `tokenizers` crate does.
//!
//! The crate matches added tokens leftmost-longest, tokens marked
//! `normalized: false` on the raw text first and the others within the
//! remaining pieces. With special-token matching off, a special token's
//! match is dropped (its text stays ordinary text) without searching that
//! span again. Only tokens that strip no whitespace and need not stand
//! alone (`lstrip`, `rstrip`, `single_word` all false) are supported here.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// One matching pass: the patterns and, per pattern, `(id, special)`.
struct Pass {
    matcher: Option<AhoCorasick>,
    tokens: Vec<(u32, bool)>,
}

impl Pass {
    fn build(tokens: &[(&str, u32, bool)]) -> Option<Pass> {
        if tokens.is_empty() {
            return Some(Pass {
                matcher: None,
                tokens: Vec::new(),
            });
        }
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|t| t.0))
            .ok()?;
        Some(Pass {
            matcher: Some(matcher),
            tokens: tokens.iter().map(|t| (t.1, t.2)).collect(),
        })
    }

    /// Calls `emit` for each piece of `s`, in order.
    fn split<'a>(&self, s: &'a str, skip_special: bool, emit: &mut dyn FnMut(Piece<'a>)) {
        let Some(matcher) = &self.matcher else {
            emit(Piece::Text(s));
            return;
        };
        let mut start = 0;
        for m in matcher.find_iter(s) {
            let (id, special) = self.tokens[m.pattern().as_usize()];
            if skip_special && special {
                continue;
            }
            if start < m.start() {
                emit(Piece::Text(&s[start..m.start()]));
            }
            emit(Piece::Token(id));
            start = m.end();
        }
        if start < s.len() {
            emit(Piece::Text(&s[start..]));
        }
    }
}

/// The added tokens of a tokenizer, in the crate's two passes.
pub struct AddedSplitter {
    raw: Pass,
    normalized: Pass,
}

/// A piece of split text.
pub enum Piece<'a> {
    /// Ordinary text for the normalizer, pre-tokenizer and model.
    Text(&'a str),
    /// An added token.
    Token(u32),
}

impl AddedSplitter {
    /// The splitter for `tokenizer`'s added tokens, or None when one of
    /// them uses an option this splitter does not reproduce, or when
    /// `normalized` tokens meet a normalizer that could change text (the
    /// second pass would then have to match on normalized text).
    pub fn build(tokenizer: &tokenizers::Tokenizer) -> Option<AddedSplitter> {
        let decoder = tokenizer.get_added_tokens_decoder();
        let mut ids: Vec<&u32> = decoder.keys().collect();
        ids.sort();
        let mut raw = Vec::new();
        let mut normalized = Vec::new();
        for id in ids {
            let t = &decoder[id];
            if t.lstrip || t.rstrip || t.single_word || t.content.is_empty() {
                return None;
            }
            let entry = (
                t.content.as_str(),
                tokenizer.token_to_id(&t.content)?,
                t.special,
            );
            if t.normalized {
                if tokenizer.get_normalizer().is_some() {
                    return None;
                }
                normalized.push(entry);
            } else {
                raw.push(entry);
            }
        }
        Some(AddedSplitter {
            raw: Pass::build(&raw)?,
            normalized: Pass::build(&normalized)?,
        })
    }

    /// The pieces of `s`, in order, appended to `out`.
    pub fn split<'a>(&self, s: &'a str, skip_special: bool, out: &mut Vec<Piece<'a>>) {
        if self.normalized.matcher.is_none() {
            self.raw.split(s, skip_special, &mut |p| out.push(p));
            return;
        }
        let mut first: Vec<Piece<'a>> = Vec::new();
        self.raw.split(s, skip_special, &mut |p| first.push(p));
        for p in first {
            match p {
                Piece::Text(t) => self.normalized.split(t, skip_special, &mut |p| out.push(p)),
                token => out.push(token),
            }
        }
    }
}
