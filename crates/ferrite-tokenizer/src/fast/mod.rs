//! Hand-written encoders for the common tokenizer configurations.
//!
//! [`FastEncoder::build`] looks at a `tokenizer.json` and returns an
//! encoder only for configurations it reproduces exactly; everything else
//! goes through the `tokenizers` crate.

/// An encoder for one supported configuration.
pub struct FastEncoder {}

impl FastEncoder {
    /// The fast encoder for `doc`, if its configuration is supported.
    pub fn build(
        _doc: &serde_json::Value,
        _tokenizer: &tokenizers::Tokenizer,
    ) -> Option<FastEncoder> {
        None
    }

    /// Ids of `text`, or None to fall back to the crate.
    pub fn encode(
        &self,
        _text: &str,
        _add_special_tokens: bool,
        _no_special_token_matching: bool,
    ) -> Option<Vec<u32>> {
        None
    }
}
