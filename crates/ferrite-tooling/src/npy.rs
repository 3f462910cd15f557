//! NumPy `.npy` files as upstream's tools read and write them
//! (`iree/tooling/numpy_io.c`): versions 1-3 read, little-endian dtypes of
//! kinds `b i u f c V`, C order only; written files use version 1 (2 when
//! the header needs it) with the header padded to 64 bytes, byte for byte as
//! upstream writes them.
//!
//! The one `.npy` codec of the workspace: the tools' `--input=@x.npy` and
//! `--output=@x.npy` use [`read_header`] and [`write_array`], Rust programs
//! read and write [`Tensor`]s with [`read_tensor`] and [`write_tensor`].

use ferrite::Tensor;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
use ferrite_hal::{ElementType, NumericalType};
use std::io::{Read, Write};
use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Shape and element type from an `.npy` header; the data follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Dimensions (empty for a 0-d array).
    pub shape: Vec<u64>,
    /// The element type the dtype maps to (`<i4` is `si32`, `|b1` is `i1`).
    pub element_type: ElementType,
}

/// Reads one array header from `r` (positioned at the magic bytes).
/// `source` names the file in errors.
pub fn read_header(r: &mut dyn Read, source: &str) -> Result<NpyHeader> {
    let mut prefix = [0u8; 8];
    r.read_exact(&mut prefix).map_err(|e| {
        status!(
            InvalidArgument,
            "`{source}`: unable to read entire npy header prefix (8 bytes): {e}"
        )
    })?;
    if &prefix[..6] != MAGIC {
        bail!(
            InvalidArgument,
            "`{source}`: npy header magic mismatch: expected bytes 93 4E 55 4D 50 59 (\\x93NUMPY) but the file starts with {}",
            prefix[..6]
                .iter()
                .map(|b| format!("{b:02X}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let (major, minor) = (prefix[6], prefix[7]);
    if major == 0 || major > 3 {
        bail!(
            Unimplemented,
            "`{source}`: npy version {major}.{minor} not supported (1.x, 2.x and 3.x are)"
        );
    }
    let header_len = if major == 1 {
        let mut b = [0u8; 2];
        r.read_exact(&mut b).map_err(|e| {
            status!(
                InvalidArgument,
                "`{source}`: failed to read version {major}.{minor} 2-byte header length: {e}"
            )
        })?;
        u16::from_le_bytes(b) as usize
    } else {
        let mut b = [0u8; 4];
        r.read_exact(&mut b).map_err(|e| {
            status!(
                InvalidArgument,
                "`{source}`: failed to read version {major}.{minor} 4-byte header length: {e}"
            )
        })?;
        u32::from_le_bytes(b) as usize
    };
    // Bounded by the file: read in chunks rather than trusting the length.
    let mut header = Vec::new();
    r.take(header_len as u64)
        .read_to_end(&mut header)
        .map_err(|e| status!(InvalidArgument, "`{source}`: reading npy header: {e}"))?;
    if header.len() != header_len {
        bail!(
            InvalidArgument,
            "`{source}`: failed to read header string of {header_len} bytes (the file ends after {})",
            header.len()
        );
    }
    // The header is a Python literal (numpy reads it with
    // `ast.literal_eval`, which refuses NUL and other control bytes): a
    // NUL inside is a corrupt or truncated file, not padding.
    if let Some(at) = header
        .iter()
        .position(|&b| b < 0x20 && !matches!(b, b'\n' | b'\r' | b'\t'))
    {
        bail!(
            InvalidArgument,
            "`{source}`: npy header has control byte {:#04x} at header offset {at} (a corrupt file?)",
            header[at]
        );
    }
    let text = String::from_utf8_lossy(&header);
    parse_header_dict(&text)
        .map_err(|e| e.annotate(format!("parsing npy header of `{source}`: {}", text.trim())))
}

/// Parses `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`
/// (keys in any order, unknown keys ignored, as upstream).
fn parse_header_dict(text: &str) -> Result<NpyHeader> {
    let mut dict = text.trim();
    dict = dict.strip_prefix('{').unwrap_or(dict);
    dict = dict.strip_suffix('}').unwrap_or(dict);
    let mut dict = dict.trim();
    let mut shape = None;
    let mut element_type = None;
    while !dict.is_empty() {
        let Some((key, rest)) = dict.split_once(':') else {
            bail!(
                InvalidArgument,
                "malformed header dict: no `:` after `{dict}`"
            );
        };
        let key = key.trim().trim_matches('\'');
        let rest = rest.trim_start();
        let (value, rest) = if let Some(r) = rest.strip_prefix("True") {
            ("True", r)
        } else if let Some(r) = rest.strip_prefix("False") {
            ("False", r)
        } else if let Some(r) = rest.strip_prefix('\'') {
            r.split_once('\'').unwrap_or((r, ""))
        } else if let Some(r) = rest.strip_prefix('(') {
            r.split_once(')').unwrap_or((r, ""))
        } else {
            bail!(
                InvalidArgument,
                "malformed header dict: unexpected value for '{key}': `{rest}`"
            );
        };
        let Some(rest) = rest.trim_start().strip_prefix(',') else {
            bail!(
                InvalidArgument,
                "malformed header dict: expected `,` after the value of '{key}'"
            );
        };
        dict = rest.trim();
        match key {
            "descr" => element_type = Some(descr_to_element_type(value)?),
            "fortran_order" if value != "False" => {
                bail!(Unimplemented, "fortran order arrays not supported");
            }
            "shape" => shape = Some(parse_shape(value)?),
            _ => {}
        }
    }
    let Some(element_type) = element_type else {
        bail!(InvalidArgument, "npy header has no 'descr' (element type)");
    };
    Ok(NpyHeader {
        shape: shape.unwrap_or_default(),
        element_type,
    })
}

/// Maps a numpy dtype string (`<f4`, `|b1`, `<c8`, `|V4`) to an element type.
pub fn descr_to_element_type(descr: &str) -> Result<ElementType> {
    let d = match descr.as_bytes().first() {
        Some(b'|' | b'=' | b'<') => &descr[1..],
        Some(b'>') => bail!(Unimplemented, "big-endian data type '{descr}' unsupported"),
        _ => descr,
    };
    let Some(kind) = d.chars().next() else {
        bail!(InvalidArgument, "descr '{descr}' is missing the kind");
    };
    let numerical = match kind {
        'b' => NumericalType::BOOLEAN,
        'i' => NumericalType::INTEGER_SIGNED,
        'u' => NumericalType::INTEGER_UNSIGNED,
        'f' => NumericalType::FLOAT_IEEE,
        'c' => NumericalType::FLOAT_COMPLEX,
        'V' => NumericalType::UNKNOWN,
        _ => bail!(
            Unimplemented,
            "unsupported data type {kind} (dtype '{descr}'; supported kinds: b i u f c V)"
        ),
    };
    let width = &d[kind.len_utf8()..];
    match width.parse::<u32>() {
        Ok(bytes) if bytes >= 1 && bytes * 8 <= 255 => {
            Ok(ElementType::new(numerical, (bytes * 8) as u8))
        }
        _ => bail!(
            InvalidArgument,
            "invalid descr byte width '{width}' in dtype '{descr}'"
        ),
    }
}

fn parse_shape(value: &str) -> Result<Vec<u64>> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(Vec::new());
    }
    let v = v.strip_suffix(',').unwrap_or(v);
    let dims: Vec<&str> = v.split(',').collect();
    if dims.len() > 128 {
        bail!(
            InvalidArgument,
            "shape rank {} too large; be reasonable please",
            dims.len()
        );
    }
    dims.iter()
        .enumerate()
        .map(|(i, d)| {
            d.trim()
                .parse::<u64>()
                .map_err(|_| status!(InvalidArgument, "invalid dimension {i} value {}", d.trim()))
        })
        .collect()
}

/// The dtype upstream writes for `element_type` (`<f4`, `|b1`, `<i4` for
/// signless and signed ints alike).
pub fn element_type_to_descr(element_type: ElementType) -> Result<String> {
    let bytes = element_type.element_byte_count();
    let order = if bytes == 1 { '|' } else { '<' };
    let kind = match element_type.numerical_type() {
        NumericalType::UNKNOWN => 'V',
        NumericalType::BOOLEAN => 'b',
        NumericalType::INTEGER | NumericalType::INTEGER_SIGNED => 'i',
        NumericalType::INTEGER_UNSIGNED => 'u',
        NumericalType::FLOAT_IEEE => 'f',
        NumericalType::FLOAT_COMPLEX => 'c',
        _ => bail!(
            Unimplemented,
            "unsupported data encoding: element type {element_type} has no numpy dtype"
        ),
    };
    Ok(format!("{order}{kind}{bytes}"))
}

/// Writes one array (header and `data`) as upstream's
/// `iree_numpy_npy_save_ndarray` does.
pub fn write_array(
    w: &mut dyn Write,
    shape: &[u64],
    element_type: ElementType,
    data: &[u8],
) -> Result<()> {
    let mut dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': (",
        element_type_to_descr(element_type)?
    );
    dict.push_str(
        &shape
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    );
    if shape.len() == 1 {
        dict.push(',');
    }
    dict.push_str("), }");
    let v2 = dict.len() > 65535;
    let current = 8 + if v2 { 4 } else { 2 } + dict.len() + 1;
    let padding = current.next_multiple_of(64) - current;
    let header_len = dict.len() + padding + 1;
    let mut out = Vec::with_capacity(current + padding);
    out.extend_from_slice(MAGIC);
    out.push(if v2 { 2 } else { 1 });
    out.push(0);
    if v2 {
        out.extend_from_slice(&(header_len as u32).to_le_bytes());
    } else {
        out.extend_from_slice(&(header_len as u16).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + padding, b' ');
    out.push(b'\n');
    w.write_all(&out)
        .map_err(|e| status!(Unknown, "failed to write npy header: {e}"))?;
    w.write_all(data)
        .map_err(|e| status!(Unknown, "failed to write buffer contents: {e}"))?;
    Ok(())
}

/// Parses the bytes of one `.npy` array into a tensor (trailing bytes
/// after the array's data are ignored, as when reading the first array of
/// a file holding several).
pub fn tensor_from_bytes(bytes: &[u8]) -> Result<Tensor> {
    let mut r = bytes;
    let header = read_header(&mut r, "npy bytes")?;
    let count = header
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| status!(InvalidArgument, "npy shape {:?} overflows", header.shape))?;
    let need = header.element_type.dense_byte_count(count)?;
    let data = usize::try_from(need)
        .ok()
        .and_then(|n| r.get(..n))
        .ok_or_else(|| {
            status!(
                InvalidArgument,
                "npy data holds {} bytes but shape {:?} of {} needs {need}",
                r.len(),
                header.shape,
                header.element_type
            )
        })?;
    Tensor::new(&header.shape, header.element_type, data.to_vec())
}

/// Reads a `.npy` file (its first array) as a tensor.
pub fn read_tensor(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| {
        status!(
            NotFound,
            "unable to open file `{}` for reading: {e}",
            path.display()
        )
    })?;
    tensor_from_bytes(&bytes).annotate(|| format!("parsing '{}'", path.display()))
}

/// The tensor as the bytes of a `.npy` file.
pub fn tensor_to_bytes(tensor: &Tensor) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(128 + tensor.data().len());
    write_array(
        &mut out,
        tensor.shape(),
        tensor.element_type(),
        tensor.data(),
    )?;
    Ok(out)
}

/// Writes the tensor to a `.npy` file.
pub fn write_tensor(path: impl AsRef<Path>, tensor: &Tensor) -> Result<()> {
    let path = path.as_ref();
    std::fs::write(path, tensor_to_bytes(tensor)?)
        .map_err(|e| status!(PermissionDenied, "writing '{}': {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_header_bytes() {
        let mut out = Vec::new();
        let data: Vec<u8> = (0..24).collect();
        write_array(&mut out, &[2, 3], ElementType::FLOAT_32, &data).unwrap();
        assert_eq!(out.len(), 128 + 24);
        assert_eq!(&out[..10], b"\x93NUMPY\x01\x00\x76\x00");
        assert!(
            out[10..].starts_with(b"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }")
        );
        assert_eq!(out[127], b'\n');
        let h = read_header(&mut &out[..], "t.npy").unwrap();
        assert_eq!(h.shape, vec![2, 3]);
        assert_eq!(h.element_type, ElementType::FLOAT_32);
    }

    #[test]
    fn a_nul_byte_in_the_header_is_refused() {
        let mut out = Vec::new();
        write_array(&mut out, &[2], ElementType::FLOAT_32, &[0; 8]).unwrap();
        // Inside the dict, and in the padding.
        for at in [20, 100] {
            let mut bad = out.clone();
            bad[at] = 0;
            let e = read_header(&mut &bad[..], "t.npy").unwrap_err();
            assert!(e.to_string().contains("control byte 0x00"), "{e}");
        }
    }

    #[test]
    fn tensors_round_trip() {
        let t = Tensor::from_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let bytes = tensor_to_bytes(&t).unwrap();
        assert_eq!(bytes.len() % 64, 24);
        assert_eq!(tensor_from_bytes(&bytes).unwrap(), t);
        let t = Tensor::from_i32(&[3], &[-1, 0, 7]).unwrap();
        assert_eq!(tensor_from_bytes(&tensor_to_bytes(&t).unwrap()).unwrap(), t);
        let t = Tensor::from_slice::<f64>(&[], &[2.5]).unwrap();
        assert_eq!(tensor_from_bytes(&tensor_to_bytes(&t).unwrap()).unwrap(), t);
        let mut b = tensor_to_bytes(&Tensor::from_f32(&[4], &[1.0; 4]).unwrap()).unwrap();
        b.truncate(b.len() - 1);
        let e = tensor_from_bytes(&b).unwrap_err();
        assert!(e.to_string().contains("needs 16"), "{e}");
        assert!(tensor_from_bytes(b"hello").is_err());
    }

    #[test]
    fn dtypes() {
        assert_eq!(descr_to_element_type("|b1").unwrap(), ElementType::BOOL_8);
        assert_eq!(descr_to_element_type("<f2").unwrap(), ElementType::FLOAT_16);
        assert_eq!(
            descr_to_element_type("<c8").unwrap(),
            ElementType::COMPLEX_FLOAT_64
        );
        assert_eq!(descr_to_element_type("<i4").unwrap(), ElementType::SINT_32);
        assert_eq!(descr_to_element_type("|u1").unwrap(), ElementType::UINT_8);
        assert!(descr_to_element_type(">f4")
            .unwrap_err()
            .message()
            .contains("big-endian"));
        assert!(descr_to_element_type("<U3").is_err());
        assert_eq!(element_type_to_descr(ElementType::INT_32).unwrap(), "<i4");
        assert_eq!(element_type_to_descr(ElementType::BOOL_8).unwrap(), "|b1");
        assert!(element_type_to_descr(ElementType::BFLOAT_16).is_err());
    }

    #[test]
    fn bad_headers_say_what_is_wrong() {
        let e = read_header(&mut &b"PK\x03\x04 not npy"[..], "x.npy").unwrap_err();
        assert!(e.message().contains("magic mismatch"), "{e}");
        let e = read_header(&mut &b"\x93NUMPY\x04\x00"[..], "x.npy").unwrap_err();
        assert!(e.message().contains("version 4.0"), "{e}");
        let e = read_header(&mut &b"\x93NUMPY\x01\x00\x40\x00{'descr'"[..], "x.npy").unwrap_err();
        assert!(e.message().contains("64 bytes"), "{e}");
        let dict = b"{'shape': (), 'descr': '<f8',}";
        let mut h = b"\x93NUMPY\x03\x00".to_vec();
        h.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        h.extend_from_slice(dict);
        let got = read_header(&mut &h[..], "x.npy").unwrap();
        assert_eq!(got.shape, Vec::<u64>::new());
        assert_eq!(got.element_type, ElementType::FLOAT_64);
    }
}
