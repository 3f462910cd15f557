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

/// A bounds-checked little-endian reader over file bytes that knows its
/// absolute offset, so errors can say where the file went wrong.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    format: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], pos: u64, format: &'static str) -> Reader<'a> {
        Reader {
            bytes,
            pos: usize::try_from(pos).unwrap_or(usize::MAX),
            format,
        }
    }

    /// The absolute offset of the next read.
    pub(crate) fn offset(&self) -> u64 {
        self.pos as u64
    }

    /// The next `n` bytes, named `what` in errors.
    pub(crate) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let size = self.bytes.len() as u64;
        let start = self.pos as u64;
        match start.checked_add(n) {
            Some(end) if end <= size => {
                let s = &self.bytes[start as usize..end as usize];
                self.pos = end as usize;
                Ok(s)
            }
            _ => bail!(
                OutOfRange,
                "{} file truncated: {what} needs {n} bytes at offset {start} but the file has {size} bytes",
                self.format
            ),
        }
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &str) -> Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}
