//! GGUF files (versions 2 and 3), llama.cpp's format.
//!
//! Layout (little-endian): magic `GGUF`, version (u32), tensor count and
//! metadata key/value count (u64 each), the key/value pairs (string key,
//! u32 value type, value), then per tensor its name (u64 length + bytes),
//! dimension count (u32), dimensions (u64 each), GGML type (u32) and data
//! offset (u64, relative to the data section). The data section starts at
//! the end of the tensor infos rounded up to `general.alignment` (a u32
//! key/value, 32 when absent). A tensor's size follows from its GGML type:
//! plain types store one element per unit, quantized types store blocks of
//! 32 or 256 elements.

use ferrite_base::{bail, status, Result};

use super::reader::Reader;
use crate::io_parameters::file_handle::FileHandle;
use crate::io_parameters::index::ParameterIndex;

/// `GGUF` read as a little-endian u32.
pub const MAGIC: u32 = 0x4655_4747;
const MIN_VERSION: u32 = 2;
const MAX_VERSION: u32 = 3;
const DEFAULT_ALIGNMENT: u32 = 32;

const VALUE_STRING: u32 = 8;
const VALUE_ARRAY: u32 = 9;
const VALUE_UINT32: u32 = 4;

/// Byte size of a scalar metadata value type, None for strings, arrays and
/// unknown types.
fn scalar_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1), // u8, i8, bool
        2 | 3 => Some(2),     // u16, i16
        4..=6 => Some(4),     // u32, i32, f32
        10..=12 => Some(8),   // u64, i64, f64
        _ => None,
    }
}

/// (elements per block, bytes per block) of a GGML tensor type.
fn ggml_block(ty: u32) -> Option<(u64, u64)> {
    Some(match ty {
        0 => (1, 4),     // F32
        1 => (1, 2),     // F16
        2 => (32, 18),   // Q4_0
        3 => (32, 20),   // Q4_1
        6 => (32, 22),   // Q5_0
        7 => (32, 24),   // Q5_1
        8 => (32, 34),   // Q8_0
        9 => (32, 40),   // Q8_1
        10 => (256, 84), // Q2_K
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        15 => (256, 292),
        16 => (1, 1), // I8
        17 => (1, 2), // I16
        18 => (1, 4), // I32
        _ => return None,
    })
}

fn string<'a>(r: &mut Reader<'a>, what: &str) -> Result<&'a [u8]> {
    let len = r.u64(what)?;
    r.take(len, what)
}

fn skip_value(r: &mut Reader<'_>, ty: u32, key: &str, depth: u32) -> Result<()> {
    let at = r.offset();
    match ty {
        VALUE_STRING => {
            string(r, "metadata string value")?;
        }
        VALUE_ARRAY => {
            if depth > 0 {
                bail!(
                    InvalidArgument,
                    "gguf metadata '{key}' at offset {at}: nested arrays are not supported"
                );
            }
            let elem = r.u32("metadata array type")?;
            let count = r.u64("metadata array length")?;
            match scalar_size(elem) {
                Some(n) => {
                    let total = n.checked_mul(count).ok_or_else(|| {
                        status!(OutOfRange, "gguf metadata '{key}' at offset {at}: array of {count} elements overflows")
                    })?;
                    r.take(total, "metadata array")?;
                }
                None if elem == VALUE_STRING => {
                    for _ in 0..count {
                        string(r, "metadata array string")?;
                    }
                }
                None => skip_value(r, elem, key, depth + 1)?,
            }
        }
        other => match scalar_size(other) {
            Some(n) => {
                r.take(n, "metadata value")?;
            }
            None => bail!(
                InvalidArgument,
                "gguf metadata '{key}' at offset {at}: unknown value type {other}"
            ),
        },
    }
    Ok(())
}

struct TensorInfo {
    name: String,
    at: u64,
    elements: u64,
    ty: u32,
    offset: u64,
}

/// Adds every tensor of the GGUF file in `handle` to `index`.
pub fn parse_into(index: &mut ParameterIndex, handle: &FileHandle) -> Result<()> {
    handle.with_bytes(|bytes| {
        let mut r = Reader::new(bytes, 0, "gguf");
        let magic = r.u32("magic")?;
        if magic != MAGIC {
            bail!(InvalidArgument, "gguf magic at offset 0 is {magic:08X}; expected {MAGIC:08X} ('GGUF')");
        }
        let version = r.u32("version")?;
        if !(MIN_VERSION..=MAX_VERSION).contains(&version) {
            bail!(
                Unimplemented,
                "gguf version {version} at offset 4 is not supported; expected {MIN_VERSION} to {MAX_VERSION}"
            );
        }
        let tensor_count = r.u64("tensor count")?;
        let kv_count = r.u64("metadata count")?;
        let mut alignment = DEFAULT_ALIGNMENT;
        for _ in 0..kv_count {
            let key_at = r.offset();
            let key = String::from_utf8_lossy(string(&mut r, "metadata key")?).into_owned();
            let ty = r.u32("metadata value type")?;
            if key == "general.alignment" {
                if ty != VALUE_UINT32 {
                    bail!(
                        InvalidArgument,
                        "gguf metadata 'general.alignment' at offset {key_at} must be a uint32 (type 4), got type {ty}"
                    );
                }
                let at = r.offset();
                alignment = r.u32("general.alignment")?;
                if alignment == 0 || !alignment.is_power_of_two() {
                    bail!(InvalidArgument, "gguf general.alignment at offset {at} is {alignment}; expected a power of two");
                }
            } else {
                skip_value(&mut r, ty, &key, 0)?;
            }
        }
        let mut tensors = Vec::new();
        for i in 0..tensor_count {
            let at = r.offset();
            let name = std::str::from_utf8(string(&mut r, "tensor name")?)
                .map_err(|_| status!(InvalidArgument, "gguf tensor {i} at offset {at}: name is not UTF-8"))?
                .to_string();
            let dims = r.u32("tensor dimension count")?;
            let mut elements = 1u64;
            for _ in 0..dims {
                let d = r.u64("tensor dimension")?;
                elements = elements.checked_mul(d).ok_or_else(|| {
                    status!(OutOfRange, "gguf tensor '{name}' at offset {at}: element count overflows")
                })?;
            }
            let ty = r.u32("tensor type")?;
            let offset = r.u64("tensor data offset")?;
            tensors.push(TensorInfo { name, at, elements, ty, offset });
        }
        let a = u64::from(alignment);
        let data_start = r.offset().div_ceil(a) * a;
        let data_size = (bytes.len() as u64).saturating_sub(data_start);
        for t in tensors {
            let Some((block, block_bytes)) = ggml_block(t.ty) else {
                bail!(Unimplemented, "gguf tensor '{}' at offset {}: GGML type {} is not supported", t.name, t.at, t.ty);
            };
            let length = t
                .elements
                .checked_mul(block_bytes)
                .map(|n| n / block)
                .ok_or_else(|| status!(OutOfRange, "gguf tensor '{}' at offset {}: size overflows", t.name, t.at))?;
            if t.offset.checked_add(length).is_none_or(|e| e > data_size) {
                bail!(
                    OutOfRange,
                    "gguf tensor '{}' at offset {}: data {}+{length} is outside the {data_size} byte data section at offset {data_start}",
                    t.name,
                    t.at,
                    t.offset
                );
            }
            index.add_file(&t.name, handle, data_start + t.offset, length, Vec::new())?;
        }
        Ok(())
    })
}
