//! Parameter file formats: each parser adds a file's parameters to an
//! index, pointing into the file (no bytes are copied).
//!
//! - [`irpa`]: IREE parameter archives (reader and writer).
//! - [`gguf`]: GGUF v2/v3 files (llama.cpp's format).
//! - [`safetensors`]: Hugging Face safetensors files.
//!
//! Every read of a header field is bounds-checked; malformed files give an
//! error naming the format, what was being read and its file offset.

pub mod gguf;
pub mod irpa;
mod reader;
pub mod safetensors;
mod safetensors_header;

use ferrite_base::{bail, Result};

use super::file_handle::FileHandle;
use super::index::ParameterIndex;

/// The formats [`parse_into`] understands, by their usual file extension.
pub const FORMATS: [&str; 3] = ["irpa", "gguf", "safetensors"];

/// Adds the parameters of `handle` to `index`. `format` is a file extension
/// (`irpa`, `gguf`, `safetensors`, with or without a leading dot); when
/// None it is taken from the handle's name.
pub fn parse_into(
    index: &mut ParameterIndex,
    handle: &FileHandle,
    format: Option<&str>,
) -> Result<()> {
    let format = match format {
        Some(f) => f.trim_start_matches('.').to_ascii_lowercase(),
        None => match std::path::Path::new(handle.name()).extension() {
            Some(e) => e.to_string_lossy().to_ascii_lowercase(),
            None => bail!(
                InvalidArgument,
                "cannot tell the parameter file format of '{}' without an extension; expected one of {}",
                handle.name(),
                FORMATS.join(", ")
            ),
        },
    };
    let start = ferrite_base::trace::start_span();
    let result = match format.as_str() {
        "irpa" => irpa::parse_into(index, handle),
        "gguf" => gguf::parse_into(index, handle),
        "safetensors" => safetensors::parse_into(index, handle),
        other => bail!(
            Unimplemented,
            "no parser for parameter file format '{other}' ('{}'); expected one of {}",
            handle.name(),
            FORMATS.join(", ")
        ),
    };
    ferrite_base::trace::end_span("load", start, || {
        (
            format!("index parameter file {}", handle.name()),
            vec![("entries", ferrite_base::trace::Arg::U64(index.len() as u64))],
        )
    });
    result.map_err(|e| e.annotate(format!("parsing {format} file '{}'", handle.name())))
}
