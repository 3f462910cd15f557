//! Ferrite's tokenizer: text to token ids and back for HuggingFace
//! `tokenizer.json` files and tiktoken vocabularies, with the semantics of
//! upstream IREE's `iree.runtime.Tokenizer` (3.13).
//!
//! Pure Rust (the Python class in `ferrite-python` is a thin binding), so
//! tests and fuzz targets call it directly. The `tokenizers` crate is the
//! engine and the reference; [`fast`] holds hand-written encoders for the
//! common configurations (byte-level BPE, WordPiece), used only where they
//! reproduce the crate's ids exactly and tested against it.
#![deny(missing_docs)]

mod byte_level;
pub mod fast;
mod stream;
pub mod tiktoken;
mod tokenizer;

pub use stream::{DecodeStream, EncodeStream};
pub use tokenizer::{Encoding, Tokenizer};
