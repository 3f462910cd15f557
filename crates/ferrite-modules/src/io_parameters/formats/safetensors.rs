//! Hugging Face safetensors files: a u64 header length, a JSON header
//! naming each tensor's dtype, shape and byte range within the data that
//! follows the header. The header is read in one streaming pass
//! ([`super::safetensors_header`]); then the ranges must tile the data
//! section exactly (from 0, contiguous, to its end), and names must be
//! unique, as the `safetensors` crate requires.

use ferrite_base::{status, Result};

use super::safetensors_header::{self, TensorRange};
use crate::io_parameters::file_handle::FileHandle;
use crate::io_parameters::index::ParameterIndex;

/// The largest header accepted (the `safetensors` crate's limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Adds every tensor of the safetensors file in `handle` to `index`, in the
/// order of their data in the file. Nothing is added from a file with any
/// problem.
pub fn parse_into(index: &mut ParameterIndex, handle: &FileHandle) -> Result<()> {
    handle.with_bytes(|bytes| {
        let declared = bytes
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
        let invalid = |why: String| {
            status!(
                InvalidArgument,
                "safetensors header at offset 0 (declared JSON length {}, file {} bytes) is invalid: {why}",
                declared.map_or_else(|| "missing".to_string(), |d| d.to_string()),
                bytes.len()
            )
        };
        let Some(header_len) = declared else {
            return Err(invalid("the file is shorter than the 8-byte header length".into()));
        };
        if header_len > MAX_HEADER_BYTES {
            return Err(invalid(format!(
                "the header is larger than {MAX_HEADER_BYTES} bytes"
            )));
        }
        let data_start = 8 + header_len;
        if data_start > bytes.len() as u64 {
            return Err(invalid("the header runs past the end of the file".into()));
        }
        let json = &bytes[8..data_start as usize];
        let data_len = bytes.len() as u64 - data_start;
        let mut tensors =
            safetensors_header::read(json, data_len).map_err(|e| invalid(e.to_string()))?;
        check_tiling(&mut tensors, data_len).map_err(invalid)?;
        check_unique_names(&tensors).map_err(invalid)?;
        for t in &tensors {
            index.add_file(
                &t.name,
                handle,
                data_start + t.begin,
                t.end - t.begin,
                Vec::new(),
            )?;
        }
        Ok(())
    })
}

/// Sorts `tensors` by data offset (then name) and checks that their
/// ranges cover `[0, data_len)` exactly, without gaps or overlaps.
fn check_tiling(tensors: &mut [TensorRange<'_>], data_len: u64) -> std::result::Result<(), String> {
    // In place: no second copy of the list.
    tensors.sort_unstable_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
    let mut at = 0;
    for t in tensors.iter() {
        if t.begin != at {
            return Err(format!(
                "tensor '{}' begins at data offset {} where {} was expected (tensor data must be contiguous from 0)",
                t.name, t.begin, at
            ));
        }
        at = t.end;
    }
    if at != data_len {
        return Err(format!(
            "the tensors cover {at} bytes of the {data_len}-byte data section after the header"
        ));
    }
    Ok(())
}

/// Fails when two tensors share a name (JSON objects may repeat keys).
fn check_unique_names(tensors: &[TensorRange<'_>]) -> std::result::Result<(), String> {
    let mut order: Vec<u32> = (0..tensors.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| tensors[a as usize].name.cmp(&tensors[b as usize].name));
    match order
        .windows(2)
        .find(|w| tensors[w[0] as usize].name == tensors[w[1] as usize].name)
    {
        Some(w) => Err(format!(
            "tensor name '{}' appears more than once",
            tensors[w[0] as usize].name
        )),
        None => Ok(()),
    }
}
