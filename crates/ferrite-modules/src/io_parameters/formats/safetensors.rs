//! Hugging Face safetensors files: a u64 header length, a JSON header
//! naming each tensor's dtype, shape and byte range within the data that
//! follows the header. The `safetensors` crate validates the header (JSON,
//! ranges contiguous and inside the file, sizes matching dtype and shape).

use ferrite_base::{status, Result};
use safetensors::SafeTensors;

use crate::io_parameters::file_handle::FileHandle;
use crate::io_parameters::index::ParameterIndex;

/// Adds every tensor of the safetensors file in `handle` to `index`, in the
/// order of their data in the file.
pub fn parse_into(index: &mut ParameterIndex, handle: &FileHandle) -> Result<()> {
    handle.with_bytes(|bytes| {
        let (header_len, metadata) = SafeTensors::read_metadata(bytes).map_err(|e| {
            let declared = bytes
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])).to_string())
                .unwrap_or_else(|| "missing".to_string());
            status!(
                InvalidArgument,
                "safetensors header at offset 0 (declared JSON length {declared}, file {} bytes) is invalid: {e:?}",
                bytes.len()
            )
        })?;
        let data_start = 8 + header_len as u64;
        let mut tensors: Vec<_> = metadata.tensors().into_iter().collect();
        tensors.sort_by(|a, b| (a.1.data_offsets, &a.0).cmp(&(b.1.data_offsets, &b.0)));
        for (name, info) in tensors {
            let (begin, end) = info.data_offsets;
            index.add_file(
                &name,
                handle,
                data_start + begin as u64,
                end.saturating_sub(begin) as u64,
                Vec::new(),
            )?;
        }
        Ok(())
    })
}
