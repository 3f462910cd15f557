//! Streaming encode and decode.
//!
//! Streaming follows one rule: what a stream returns, concatenated, equals
//! the batch result for the whole text. The encode stream re-encodes its
//! text as it grows and hands out only the tokens that more text can no
//! longer change (see [`EncodeStream::feed`]); the decode stream keeps a
//! short window of ids so that decoders which look at neighbouring tokens
//! (spaces, byte fallback, incomplete UTF-8) see them.

use ferrite_base::{Result, Status, StatusCode};
use std::collections::HashMap;
use std::sync::Arc;

use crate::tokenizer::Tokenizer;

/// An incremental encoder: [`feed`](Self::feed) text, get the ids that are
/// final; [`finalize`](Self::finalize) for the rest.
pub struct EncodeStream {
    tokenizer: Arc<Tokenizer>,
    add_special_tokens: bool,
    no_special_token_matching: bool,
    /// All text fed so far (less what word-local tokenizers dropped).
    text: String,
    /// Ids handed out so far (a prefix of the encoding of `text`).
    emitted: Vec<u32>,
}

impl EncodeStream {
    /// A stream over `tokenizer` with `encode`'s options.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        add_special_tokens: bool,
        no_special_token_matching: bool,
    ) -> EncodeStream {
        EncodeStream {
            tokenizer,
            add_special_tokens,
            no_special_token_matching,
            text: String::new(),
            emitted: Vec::new(),
        }
    }

    /// Appends `chunk` and returns the ids that no further text can change.
    ///
    /// The pending text is encoded whole; a word's tokens are final when
    /// the word lies before the last two pre-tokenizer words (the last word
    /// may grow, and a run of whitespace before it may split differently)
    /// and ends before the last `longest_added` bytes (where a partly fed
    /// added token could still match). Tokens the post-processor adds (no
    /// word) go out with the first final word after them, so a trailing EOS
    /// waits for finalize. For word-local tokenizers the text of handed-out
    /// tokens is then dropped, so a long stream costs linear time.
    pub fn feed(&mut self, chunk: &str) -> Result<Vec<u32>> {
        self.text.push_str(chunk);
        let enc = self.tokenizer.encode_detailed(
            &self.text,
            self.add_special_tokens,
            self.no_special_token_matching,
        )?;
        let Some(last_word) = enc.words.iter().flatten().max().copied() else {
            return Ok(Vec::new());
        };
        let limit = self
            .text
            .len()
            .saturating_sub(self.tokenizer.longest_added());
        // The end of each word's text, to hold back any word that reaches
        // into the last `longest_added` bytes.
        let mut word_end: HashMap<u32, usize> = HashMap::new();
        for (w, o) in enc.words.iter().zip(&enc.offsets) {
            if let Some(w) = w {
                let e = word_end.entry(*w).or_default();
                *e = (*e).max(o.1);
            }
        }
        let mut end = self.emitted.len();
        for (i, word) in enc.words.iter().enumerate().skip(self.emitted.len()) {
            match word {
                Some(w) if w + 2 <= last_word && word_end[w] <= limit => end = i + 1,
                Some(_) => break,
                None => {}
            }
        }
        let fresh = enc.ids[self.emitted.len()..end].to_vec();
        self.emitted.extend_from_slice(&fresh);
        if self.tokenizer.is_word_local() && end > 0 && end < enc.ids.len() {
            // Restart after the last handed-out word.
            let cut = enc.offsets[end - 1].1;
            if self.text.is_char_boundary(cut) {
                self.text.drain(..cut);
                self.emitted.clear();
            }
        }
        Ok(fresh)
    }

    /// The ids not yet handed out, checked to extend what was handed out.
    pub fn finalize(self) -> Result<Vec<u32>> {
        let ids = self.tokenizer.encode(
            &self.text,
            self.add_special_tokens,
            self.no_special_token_matching,
        )?;
        if !ids.starts_with(&self.emitted) {
            return Err(Status::new(
                StatusCode::Internal,
                "streaming encode diverged from encoding the whole text (a tokenizer whose \
                 pre-tokenizer looks further ahead than two words); use encode() instead",
            ));
        }
        Ok(ids[self.emitted.len()..].to_vec())
    }
}

/// An incremental decoder: [`push`](Self::push) ids, get the text that is
/// final; [`finalize`](Self::finalize) for the rest.
pub struct DecodeStream {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// Recent ids: the first `prefix_len` were already turned into text
    /// (`prefix`) and stay as context for the decoder.
    window: Vec<u32>,
    prefix_len: usize,
    prefix: String,
}

impl DecodeStream {
    /// A stream over `tokenizer` with `decode`'s option.
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> DecodeStream {
        DecodeStream {
            tokenizer,
            skip_special_tokens,
            window: Vec::new(),
            prefix_len: 0,
            prefix: String::new(),
        }
    }

    /// Appends `ids` and returns the text they complete.
    pub fn push(&mut self, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            self.window.push(id);
            let text = self
                .tokenizer
                .decode(&self.window, self.skip_special_tokens)?;
            // Wait while the text ends in an incomplete UTF-8 sequence or
            // has not grown past what was already handed out.
            if text.len() <= self.prefix.len() || text.ends_with('\u{FFFD}') {
                continue;
            }
            let Some(fresh) = text.strip_prefix(self.prefix.as_str()) else {
                // The decoder rewrote earlier text (rare); hand out the
                // part after the common prefix.
                let common = common_prefix(&text, &self.prefix);
                out.push_str(&text[common..]);
                self.advance()?;
                continue;
            };
            out.push_str(fresh);
            self.advance()?;
        }
        Ok(out)
    }

    /// Drops the ids already covered, keeping the ones just decoded as
    /// context for the next.
    fn advance(&mut self) -> Result<()> {
        self.window.drain(..self.prefix_len);
        self.prefix_len = self.window.len();
        self.prefix = self
            .tokenizer
            .decode(&self.window, self.skip_special_tokens)?;
        Ok(())
    }

    /// The text not yet handed out.
    pub fn finalize(self) -> Result<String> {
        let text = self
            .tokenizer
            .decode(&self.window, self.skip_special_tokens)?;
        let common = common_prefix(&text, &self.prefix);
        Ok(text[common..].to_string())
    }
}

/// Byte length of the longest common prefix of `a` and `b`, on a char
/// boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}
