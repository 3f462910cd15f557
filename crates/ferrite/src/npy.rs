//! Reading and writing numpy `.npy` files as [`Tensor`]s.
//!
//! Supports what upstream's tools exchange: format versions 1.0 to 3.0,
//! C-order arrays of little-endian (or byte-sized) `f2`/`f4`/`f8`,
//! `i1`..`i8`, `u1`..`u8` and `b1`.

use std::path::Path;

use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
use ferrite_hal::ElementType;

use crate::value::Tensor;

const MAGIC: &[u8] = b"\x93NUMPY";

fn element_type_of(descr: &str) -> Result<ElementType> {
    let (order, code) = descr.split_at(descr.len().min(1));
    if !matches!(order, "<" | "|" | "=") {
        bail!(Unimplemented, "npy dtype '{descr}' is not little-endian");
    }
    Ok(match code {
        "f2" => ElementType::FLOAT_16,
        "f4" => ElementType::FLOAT_32,
        "f8" => ElementType::FLOAT_64,
        "i1" => ElementType::SINT_8,
        "i2" => ElementType::SINT_16,
        "i4" => ElementType::SINT_32,
        "i8" => ElementType::SINT_64,
        "u1" => ElementType::UINT_8,
        "u2" => ElementType::UINT_16,
        "u4" => ElementType::UINT_32,
        "u8" => ElementType::UINT_64,
        "b1" => ElementType::BOOL_8,
        _ => bail!(Unimplemented, "npy dtype '{descr}' is not supported"),
    })
}

fn descr_of(ty: ElementType) -> Result<&'static str> {
    Ok(match ty {
        ElementType::FLOAT_16 => "<f2",
        ElementType::FLOAT_32 => "<f4",
        ElementType::FLOAT_64 => "<f8",
        ElementType::SINT_8 | ElementType::INT_8 => "|i1",
        ElementType::SINT_16 | ElementType::INT_16 => "<i2",
        ElementType::SINT_32 | ElementType::INT_32 => "<i4",
        ElementType::SINT_64 | ElementType::INT_64 => "<i8",
        ElementType::UINT_8 => "|u1",
        ElementType::UINT_16 => "<u2",
        ElementType::UINT_32 => "<u4",
        ElementType::UINT_64 => "<u8",
        ElementType::BOOL_8 => "|b1",
        other => bail!(Unimplemented, "element type {other} has no npy dtype"),
    })
}

/// The value of `'key':` in a header dict, up to the next top-level comma.
fn header_field<'a>(header: &'a str, key: &str) -> Result<&'a str> {
    let needle = format!("'{key}'");
    let at = header
        .find(&needle)
        .ok_or_else(|| status!(InvalidArgument, "npy header has no '{key}': {header}"))?;
    let rest = header[at + needle.len()..].trim_start();
    let rest = rest
        .strip_prefix(':')
        .ok_or_else(|| status!(InvalidArgument, "npy header: no ':' after '{key}'"))?
        .trim_start();
    if let Some(r) = rest.strip_prefix('(') {
        let end = r
            .find(')')
            .ok_or_else(|| status!(InvalidArgument, "npy header: unterminated shape"))?;
        return Ok(&r[..end]);
    }
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Ok(rest[..end].trim().trim_matches(|c| c == '\'' || c == '"'))
}

impl Tensor {
    /// Parses the bytes of one `.npy` array.
    pub fn from_npy_bytes(bytes: &[u8]) -> Result<Tensor> {
        if bytes.len() < 10 || &bytes[..6] != MAGIC {
            bail!(InvalidArgument, "not an npy file (bad magic)");
        }
        let major = bytes[6];
        let (len, start): (usize, usize) = match major {
            1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
            2 | 3 => {
                if bytes.len() < 12 {
                    bail!(InvalidArgument, "npy file truncated in its header");
                }
                (
                    u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                    12,
                )
            }
            v => bail!(Unimplemented, "npy format version {v} is not supported"),
        };
        let header = bytes
            .get(start..start.saturating_add(len))
            .ok_or_else(|| status!(InvalidArgument, "npy file truncated in its header"))?;
        let header = std::str::from_utf8(header)
            .map_err(|_| status!(InvalidArgument, "npy header is not text"))?;
        let element_type = element_type_of(header_field(header, "descr")?)?;
        if header_field(header, "fortran_order")? != "False" {
            bail!(Unimplemented, "Fortran-order npy arrays are not supported");
        }
        let shape = header_field(header, "shape")?
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<u64>()
                    .map_err(|_| status!(InvalidArgument, "npy shape has a bad dimension '{s}'"))
            })
            .collect::<Result<Vec<_>>>()?;
        let data = &bytes[start + len..];
        let count: u64 = shape.iter().product();
        let need = element_type.dense_byte_count(count)? as usize;
        if data.len() < need {
            bail!(
                InvalidArgument,
                "npy data holds {} bytes but shape {shape:?} of {element_type} needs {need}",
                data.len()
            );
        }
        Tensor::new(&shape, element_type, data[..need].to_vec())
    }

    /// Reads a `.npy` file (its first array).
    pub fn read_npy(path: impl AsRef<Path>) -> Result<Tensor> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(ferrite_base::Status::from)
            .annotate(|| format!("reading '{}'", path.display()))?;
        Tensor::from_npy_bytes(&bytes).annotate(|| format!("parsing '{}'", path.display()))
    }

    /// The tensor as the bytes of a version 1.0 `.npy` file.
    pub fn to_npy_bytes(&self) -> Result<Vec<u8>> {
        let descr = descr_of(self.element_type())?;
        let dims: Vec<String> = self.shape().iter().map(u64::to_string).collect();
        let shape = match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.join(", ")),
        };
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        // Pad so the data starts on a 64-byte boundary; end with a newline.
        let unpadded = MAGIC.len() + 4 + header.len() + 1;
        header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
        header.push('\n');
        let len =
            u16::try_from(header.len()).map_err(|_| status!(OutOfRange, "npy header too long"))?;
        let mut out = Vec::with_capacity(64 + self.data().len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(self.data());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let t = Tensor::from_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let bytes = t.to_npy_bytes().unwrap();
        assert_eq!(bytes.len() % 64, 24);
        assert_eq!(Tensor::from_npy_bytes(&bytes).unwrap(), t);
        let t = Tensor::from_i32(&[3], &[-1, 0, 7]).unwrap();
        assert_eq!(
            Tensor::from_npy_bytes(&t.to_npy_bytes().unwrap()).unwrap(),
            t
        );
        let t = Tensor::from_slice::<f64>(&[], &[2.5]).unwrap();
        assert_eq!(
            Tensor::from_npy_bytes(&t.to_npy_bytes().unwrap()).unwrap(),
            t
        );
    }

    #[test]
    fn rejects_bad_files() {
        assert!(Tensor::from_npy_bytes(b"hello").is_err());
        let mut b = Tensor::from_f32(&[4], &[1.0; 4])
            .unwrap()
            .to_npy_bytes()
            .unwrap();
        b.truncate(b.len() - 1);
        let e = Tensor::from_npy_bytes(&b).unwrap_err();
        assert!(e.to_string().contains("needs 16"), "{e}");
    }
}
