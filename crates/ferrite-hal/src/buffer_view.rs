//! Buffer views: a buffer plus shape, element type and encoding
//! (the `hal.buffer_view` ref type), with upstream's text form.
//!
//! The text form is what `iree-run-module` prints and what `--input=`
//! accepts: `SHAPExTYPE=VALUES`, e.g. `4xf32=1 2 3 4`,
//! `2x3xi32=[1 2 3][4 5 6]`, scalars `f32=1`. Integers print in decimal,
//! floats as C's `%G` (`1E+07`, `INF`, `-NAN`), and every other type
//! (booleans included) as upper-case hex bytes per element (`4xi1=01 00`).
//! Printing stops after a maximum element count, marking cut rows with `...`.

use std::fmt;

use ferrite_base::status::ResultExt;
use ferrite_base::RefObject;
use ferrite_base::{bail, status, Result};

use crate::allocator::{Allocator, BufferParams};
use crate::buffer::{Buffer, WHOLE_BUFFER};
use crate::element_type::{ElementType, EncodingType};
use crate::memory::{BufferUsage, MemoryType};
use crate::numerics::*;

/// The default element limit `iree-run-module` prints
/// (`--output_max_element_count`).
pub const DEFAULT_MAX_ELEMENT_COUNT: usize = 1024;

/// Highest rank the text parser accepts (as upstream).
pub const MAX_PARSED_RANK: usize = 128;

/// A shaped, typed view of a buffer (the `hal.buffer_view` ref type).
#[derive(Clone)]
pub struct BufferView {
    buffer: HeldBuffer,
    /// The buffer as a shared object made on first request (the VM's
    /// `hal.buffer_view.buffer`) when none was handed in.
    shared_buffer: std::sync::OnceLock<std::sync::Arc<Buffer>>,
    /// Dimensions; views of rank 4 or less need no allocation.
    shape: smallvec::SmallVec<[u64; 4]>,
    element_type: ElementType,
    encoding_type: EncodingType,
    byte_length: u64,
}

/// How a view holds its buffer.
#[derive(Clone)]
enum HeldBuffer {
    /// Its own handle ([`BufferView::new`]).
    Own(Buffer),
    /// The shared object handed in at creation ([`BufferView::over_shared`]),
    /// so that every request returns the same object (refs compare by
    /// identity). Held alone, not beside a copy of the handle: a copy
    /// costs an atomic reference-count update at creation and at drop, on
    /// the path of every invocation that returns a view.
    Shared(std::sync::Arc<Buffer>),
}

impl RefObject for BufferView {
    fn type_name(&self) -> &'static str {
        "hal.buffer_view"
    }
}

/// Bytes a dense row-major view of `shape` and `element_type` occupies
/// (sub-byte types packed). `INVALID_ARGUMENT` for zero-bit (opaque NONE)
/// types, `UNIMPLEMENTED` for other encodings, `OUT_OF_RANGE` on overflow.
pub fn compute_view_size(
    shape: &[u64],
    element_type: ElementType,
    encoding: EncodingType,
) -> Result<u64> {
    if encoding != EncodingType::DENSE_ROW_MAJOR {
        bail!(
            Unimplemented,
            "unimplemented encoding type size calculation"
        );
    }
    if element_type.bit_count() == 0 {
        bail!(InvalidArgument, "opaque element types cannot be indexed");
    }
    let count = element_count(shape)?;
    element_type.dense_byte_count(count)
}

fn element_count(shape: &[u64]) -> Result<u64> {
    shape.iter().try_fold(1u64, |acc, &d| {
        acc.checked_mul(d).ok_or_else(|| {
            status!(
                OutOfRange,
                "element count of shape {} overflows 64 bits",
                format_shape(shape)
            )
        })
    })
}

/// `2x3x4` (empty for rank 0).
pub fn format_shape(shape: &[u64]) -> String {
    shape
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join("x")
}

impl BufferView {
    /// A view of `buffer` with `shape` and `element_type`. Fails with
    /// `INVALID_ARGUMENT` naming expected and actual bytes when the shape
    /// needs more bytes than the buffer has.
    pub fn new(
        buffer: Buffer,
        shape: &[u64],
        element_type: ElementType,
        encoding_type: EncodingType,
    ) -> Result<BufferView> {
        BufferView::holding(HeldBuffer::Own(buffer), shape, element_type, encoding_type)
    }

    /// [`BufferView::new`] of a buffer held either way.
    fn holding(
        held: HeldBuffer,
        shape: &[u64],
        element_type: ElementType,
        encoding_type: EncodingType,
    ) -> Result<BufferView> {
        let buffer = match &held {
            HeldBuffer::Own(b) => b,
            HeldBuffer::Shared(b) => &**b,
        };
        let count = element_count(shape)?;
        let byte_length = element_type.dense_byte_count(count)?;
        if byte_length > buffer.byte_length() {
            bail!(
                OutOfRange,
                "buffer view byte length {} exceeds backing buffer byte length {} (shape {}x{})",
                byte_length,
                buffer.byte_length(),
                format_shape(shape),
                element_type
            );
        }
        Ok(BufferView {
            buffer: held,
            shared_buffer: std::sync::OnceLock::new(),
            shape: shape.into(),
            element_type,
            encoding_type,
            byte_length,
        })
    }

    /// The viewed buffer.
    pub fn buffer(&self) -> &Buffer {
        match &self.buffer {
            HeldBuffer::Own(b) => b,
            HeldBuffer::Shared(b) => b,
        }
    }

    /// The viewed buffer as one shared object per view (what the `hal`
    /// VM module hands out as the view's `!hal.buffer` ref).
    pub fn shared_buffer(&self) -> std::sync::Arc<Buffer> {
        match &self.buffer {
            HeldBuffer::Shared(b) => b.clone(),
            HeldBuffer::Own(b) => self
                .shared_buffer
                .get_or_init(|| std::sync::Arc::new(b.clone()))
                .clone(),
        }
    }

    /// A view like [`BufferView::new`] of the shared `buffer`, which
    /// [`BufferView::shared_buffer`] then returns.
    pub fn over_shared(
        buffer: std::sync::Arc<Buffer>,
        shape: &[u64],
        element_type: ElementType,
        encoding_type: EncodingType,
    ) -> Result<BufferView> {
        BufferView::holding(
            HeldBuffer::Shared(buffer),
            shape,
            element_type,
            encoding_type,
        )
    }

    /// The dimensions.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Dimension `index`, if in range.
    pub fn dim(&self, index: usize) -> Option<u64> {
        self.shape.get(index).copied()
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// The encoding type.
    pub fn encoding_type(&self) -> EncodingType {
        self.encoding_type
    }

    /// The product of the dimensions (1 for scalars).
    pub fn element_count(&self) -> u64 {
        // Checked when the view was created.
        self.shape.iter().product()
    }

    /// Bytes the view's elements occupy (packed for sub-byte types).
    pub fn byte_length(&self) -> u64 {
        self.byte_length
    }

    /// Upstream's text form with at most `max_element_count` elements
    /// printed (`None`: all of them).
    pub fn format(&self, max_element_count: Option<usize>) -> Result<String> {
        let mut out = String::new();
        if !self.shape.is_empty() {
            out.push_str(&format_shape(&self.shape));
            out.push('x');
        }
        out.push_str(&self.element_type.name());
        out.push('=');
        let map = self.buffer().map_read(0, WHOLE_BUFFER)?;
        format_elements_into(
            &mut out,
            &map,
            &self.shape,
            self.element_type,
            &mut max_element_count.unwrap_or(usize::MAX),
        )?;
        Ok(out)
    }

    /// Parses upstream's `--input` text (`2x3xf32=1,2,3,4,5,6`, splat
    /// `4xi8=1`, brackets and spaces as separators, empty data zero-fills)
    /// into a new device-local buffer from `allocator`.
    pub fn parse(text: &str, allocator: &dyn Allocator) -> Result<BufferView> {
        let (shape, element_type, data) = split_spec(text)?;
        let size = compute_view_size(&shape, element_type, EncodingType::DENSE_ROW_MAJOR)?;
        let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
        let buffer = allocator.allocate(&params, size)?;
        {
            let mut map = buffer.map_write(0, WHOLE_BUFFER)?;
            parse_elements(data, element_type, &mut map)?;
        }
        BufferView::new(buffer, &shape, element_type, EncodingType::DENSE_ROW_MAJOR)
    }
}

impl fmt::Display for BufferView {
    /// The full text form (no element limit); errors (an unmappable buffer)
    /// print as `(error: ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.format(None) {
            Ok(s) => f.write_str(&s),
            Err(e) => write!(f, "(error: {e})"),
        }
    }
}

impl fmt::Debug for BufferView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shape = format_shape(&self.shape);
        let sep = if shape.is_empty() { "" } else { "x" };
        write!(
            f,
            "BufferView({shape}{sep}{}, {:?})",
            self.element_type,
            self.buffer()
        )
    }
}

/// Splits `SHAPExTYPE=DATA` (surrounding whitespace and double quotes
/// stripped) into shape, element type and the data text.
pub fn split_spec(text: &str) -> Result<(Vec<u64>, ElementType, &str)> {
    let value = text.trim();
    let value = value.strip_prefix('"').unwrap_or(value);
    let value = value.strip_suffix('"').unwrap_or(value);
    if value.is_empty() {
        bail!(InvalidArgument, "empty string input");
    }
    let (meta, data) = value.split_once('=').unwrap_or((value, ""));
    let (shape_str, type_str) = match meta.rfind('x') {
        Some(i) => (&meta[..i], &meta[i + 1..]),
        None => ("", meta),
    };
    let shape = parse_shape(shape_str)?;
    let element_type = ElementType::parse(type_str)?;
    Ok((shape, element_type, data))
}

/// Parses `AxBxC` (empty: rank 0). Dimensions are non-negative integers in
/// C `strtoll` syntax.
pub fn parse_shape(s: &str) -> Result<Vec<u64>> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = s.split('x').collect();
    if parts.len() > MAX_PARSED_RANK {
        bail!(
            ResourceExhausted,
            "a shape rank of {} is more than the {MAX_PARSED_RANK} supported",
            parts.len()
        );
    }
    let mut shape = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() {
            bail!(InvalidArgument, "invalid shape specification: '{s}'");
        }
        match parse_c_i64(p) {
            Some(d) if d >= 0 => shape.push(d as u64),
            _ => bail!(InvalidArgument, "shape[{i}] invalid value '{p}' of '{s}'"),
        }
    }
    Ok(shape)
}

/// Parses one element token into `out` (at least the element's byte count).
pub fn parse_element(token: &str, element_type: ElementType, out: &mut [u8]) -> Result<()> {
    let size = element_type.element_byte_count();
    if out.len() < size {
        bail!(
            InvalidArgument,
            "output data buffer overflow: data_length={} < element_size={size}",
            out.len()
        );
    }
    let bad = || {
        status!(
            InvalidArgument,
            "failed to parse '{token}' as {element_type}"
        )
    };
    let out = &mut out[..size];
    match element_type {
        ElementType::INT_8 => {
            let v = parse_c_i32(token)
                .filter(|v| (-128..=255).contains(v))
                .ok_or_else(bad)?;
            out[0] = v as u8;
        }
        ElementType::SINT_8 => {
            let v = parse_c_i32(token)
                .filter(|&v| v <= i8::MAX as i32)
                .ok_or_else(bad)?;
            out[0] = v as u8;
        }
        ElementType::UINT_8 => {
            let v = parse_c_u32(token)
                .filter(|&v| v <= u8::MAX as u32)
                .ok_or_else(bad)?;
            out[0] = v as u8;
        }
        ElementType::INT_16 => {
            let v = parse_c_i32(token)
                .filter(|v| (-32768..=65535).contains(v))
                .ok_or_else(bad)?;
            out.copy_from_slice(&(v as u16).to_ne_bytes());
        }
        ElementType::SINT_16 => {
            let v = parse_c_i32(token)
                .filter(|&v| v <= i16::MAX as i32)
                .ok_or_else(bad)?;
            out.copy_from_slice(&(v as u16).to_ne_bytes());
        }
        ElementType::UINT_16 => {
            let v = parse_c_u32(token)
                .filter(|&v| v <= u16::MAX as u32)
                .ok_or_else(bad)?;
            out.copy_from_slice(&(v as u16).to_ne_bytes());
        }
        ElementType::INT_32 | ElementType::SINT_32 => {
            out.copy_from_slice(&parse_c_i32(token).ok_or_else(bad)?.to_ne_bytes());
        }
        ElementType::UINT_32 => {
            out.copy_from_slice(&parse_c_u32(token).ok_or_else(bad)?.to_ne_bytes());
        }
        ElementType::INT_64 | ElementType::SINT_64 => {
            out.copy_from_slice(&parse_c_i64(token).ok_or_else(bad)?.to_ne_bytes());
        }
        ElementType::UINT_64 => {
            out.copy_from_slice(&parse_c_u64(token).ok_or_else(bad)?.to_ne_bytes());
        }
        ElementType::FLOAT_8_E5M2 => out[0] = f32_to_f8e5m2(parse_c_f32(token).ok_or_else(bad)?),
        ElementType::FLOAT_8_E4M3_FN => {
            out[0] = f32_to_f8e4m3fn(parse_c_f32(token).ok_or_else(bad)?)
        }
        ElementType::FLOAT_8_E5M2_FNUZ => {
            out[0] = f32_to_f8e5m2fnuz(parse_c_f32(token).ok_or_else(bad)?)
        }
        ElementType::FLOAT_8_E4M3_FNUZ => {
            out[0] = f32_to_f8e4m3fnuz(parse_c_f32(token).ok_or_else(bad)?)
        }
        ElementType::FLOAT_8_E8M0_FNU => {
            out[0] = f32_to_f8e8m0fnu(parse_c_f32(token).ok_or_else(bad)?)
        }
        ElementType::BFLOAT_16 => {
            out.copy_from_slice(&f32_to_bf16(parse_c_f32(token).ok_or_else(bad)?).to_ne_bytes());
        }
        ElementType::FLOAT_16 => {
            out.copy_from_slice(&f32_to_f16(parse_c_f32(token).ok_or_else(bad)?).to_ne_bytes());
        }
        ElementType::FLOAT_32 => {
            out.copy_from_slice(&parse_c_f32(token).ok_or_else(bad)?.to_ne_bytes());
        }
        ElementType::FLOAT_64 => {
            out.copy_from_slice(&parse_c_f64(token).ok_or_else(bad)?.to_ne_bytes());
        }
        _ => {
            // Everything else (booleans, sub-byte, complex, opaque) is raw
            // hex, two digits per byte.
            if token.len() != size * 2 {
                bail!(
                    InvalidArgument,
                    "binary hex element count mismatch: buffer length={} < expected={}",
                    token.len(),
                    size * 2
                );
            }
            let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            for (i, pair) in token.as_bytes().chunks_exact(2).enumerate() {
                out[i] = (hex(pair[0]) << 4) | hex(pair[1]);
            }
        }
    }
    Ok(())
}

/// Parses element text into `out` (sized for the whole view): tokens are
/// separated by whitespace, `,`, `[` and `]`; empty text zero-fills; a single
/// token splats to every element; otherwise the token count must equal the
/// element capacity (`OUT_OF_RANGE` naming both counts).
pub fn parse_elements(data: &str, element_type: ElementType, out: &mut [u8]) -> Result<()> {
    let size = element_type.element_byte_count();
    if size == 0 {
        bail!(InvalidArgument, "opaque element types cannot be parsed");
    }
    let capacity = out.len() / size;
    if data.is_empty() {
        out.fill(0);
        return Ok(());
    }
    let is_sep = |c: char| c.is_ascii_whitespace() || c == '\x0b' || matches!(c, ',' | '[' | ']');
    let mut count = 0usize;
    for token in data.split(is_sep).filter(|t| !t.is_empty()) {
        if count >= capacity {
            bail!(
                OutOfRange,
                "output data overflow: element_capacity={capacity} < dst_i={count}"
            );
        }
        parse_element(
            token,
            element_type,
            &mut out[count * size..(count + 1) * size],
        )?;
        count += 1;
    }
    if count == 1 && capacity > 1 {
        let (first, rest) = out.split_at_mut(size);
        for chunk in rest.chunks_exact_mut(size) {
            chunk.copy_from_slice(first);
        }
    } else if count < capacity {
        bail!(
            OutOfRange,
            "input data string underflow: dst_i={count} < element_capacity={capacity}"
        );
    }
    Ok(())
}

/// Appends one element as upstream prints it.
pub fn format_element(out: &mut String, data: &[u8], element_type: ElementType) -> Result<()> {
    use std::fmt::Write;
    let size = element_type.element_byte_count();
    if data.len() < size {
        bail!(
            OutOfRange,
            "data buffer underflow: data_length={} < element_size={size}",
            data.len()
        );
    }
    let b = &data[..size];
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    let u16v = || u16::from_ne_bytes([b[0], b[1]]);
    let u32v = || u32::from_ne_bytes(arr(4)[..4].try_into().unwrap_or([0; 4]));
    let u64v = || u64::from_ne_bytes(arr(8));
    let _ = match element_type {
        ElementType::INT_8 | ElementType::SINT_8 => write!(out, "{}", b[0] as i8),
        ElementType::UINT_8 => write!(out, "{}", b[0]),
        ElementType::INT_16 | ElementType::SINT_16 => write!(out, "{}", u16v() as i16),
        ElementType::UINT_16 => write!(out, "{}", u16v()),
        ElementType::INT_32 | ElementType::SINT_32 => write!(out, "{}", u32v() as i32),
        ElementType::UINT_32 => write!(out, "{}", u32v()),
        ElementType::INT_64 | ElementType::SINT_64 => write!(out, "{}", u64v() as i64),
        ElementType::UINT_64 => write!(out, "{}", u64v()),
        ElementType::FLOAT_8_E4M3_FN => {
            write!(out, "{}", format_upper_g(f8e4m3fn_to_f32(b[0]) as f64))
        }
        ElementType::FLOAT_8_E4M3_FNUZ => {
            write!(out, "{}", format_upper_g(f8e4m3fnuz_to_f32(b[0]) as f64))
        }
        ElementType::FLOAT_8_E5M2 => write!(out, "{}", format_upper_g(f8e5m2_to_f32(b[0]) as f64)),
        ElementType::FLOAT_8_E5M2_FNUZ => {
            write!(out, "{}", format_upper_g(f8e5m2fnuz_to_f32(b[0]) as f64))
        }
        ElementType::FLOAT_8_E8M0_FNU => {
            write!(out, "{}", format_upper_g(f8e8m0fnu_to_f32(b[0]) as f64))
        }
        ElementType::BFLOAT_16 => write!(out, "{}", format_upper_g(bf16_to_f32(u16v()) as f64)),
        ElementType::FLOAT_16 => write!(out, "{}", format_upper_g(f16_to_f32(u16v()) as f64)),
        ElementType::FLOAT_32 => write!(out, "{}", format_upper_g(f32::from_bits(u32v()) as f64)),
        ElementType::FLOAT_64 => write!(out, "{}", format_upper_g(f64::from_bits(u64v()))),
        _ => {
            for byte in b {
                let _ = write!(out, "{byte:02X}");
            }
            Ok(())
        }
    };
    Ok(())
}

/// Formats elements of `shape` from `data` (rows in brackets, elements
/// separated by spaces), printing at most `max_element_count` elements.
pub fn format_elements(
    data: &[u8],
    shape: &[u64],
    element_type: ElementType,
    max_element_count: usize,
) -> Result<String> {
    let mut out = String::new();
    format_elements_into(&mut out, data, shape, element_type, &mut {
        max_element_count
    })?;
    Ok(out)
}

fn format_elements_into(
    out: &mut String,
    data: &[u8],
    shape: &[u64],
    element_type: ElementType,
    remaining: &mut usize,
) -> Result<()> {
    let stride = element_type.element_byte_count() as u64;
    match shape {
        [] => format_elements_into(out, data, &[1], element_type, remaining),
        [n] => {
            let count = (*remaining as u64).min(*n);
            let need = count.saturating_mul(stride);
            if (data.len() as u64) < need {
                bail!(
                    OutOfRange,
                    "input data underflow; data_length={} < expected={need}",
                    data.len()
                );
            }
            *remaining -= count as usize;
            for i in 0..count as usize {
                if i > 0 {
                    out.push(' ');
                }
                format_element(out, &data[i * stride as usize..], element_type)?;
            }
            if count < *n {
                out.push_str("...");
            }
            Ok(())
        }
        [n, inner @ ..] => {
            let inner_stride = inner
                .iter()
                .try_fold(stride, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    status!(
                        OutOfRange,
                        "shape {} is too large to format",
                        format_shape(shape)
                    )
                })?;
            let need = inner_stride.saturating_mul(*n);
            if (data.len() as u64) < need {
                bail!(
                    OutOfRange,
                    "input data underflow: data_length={} < expected={need}",
                    data.len()
                );
            }
            for i in 0..*n {
                out.push('[');
                let start = (i * inner_stride) as usize;
                let sub = &data[start..start + inner_stride as usize];
                format_elements_into(out, sub, inner, element_type, remaining)?;
                out.push(']');
            }
            Ok(())
        }
    }
}

/// Parses one `--input` tensor spec, annotating errors with the text as
/// upstream's tools do.
pub fn parse_input(text: &str, allocator: &dyn Allocator) -> Result<BufferView> {
    BufferView::parse(text, allocator).annotate(|| format!("parsing input `{text}`"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::HeapAllocator;
    use ferrite_base::StatusCode;

    fn view(text: &str) -> BufferView {
        BufferView::parse(text, &HeapAllocator::new()).unwrap()
    }

    fn round(input: &str) -> String {
        view(input).to_string()
    }

    // Expected strings are what upstream's iree-run-module 3.13 printed for
    // the same values (see the crate's test notes).
    #[test]
    fn matches_upstream_output() {
        assert_eq!(round("4xf32=2,4,6,8.5"), "4xf32=2 4 6 8.5");
        assert_eq!(
            round("2x3xi32=[2 4 6][8 10 -12]"),
            "2x3xi32=[2 4 6][8 10 -12]"
        );
        assert_eq!(round("4xi1=01,01,00,00"), "4xi1=01 01 00 00");
        assert_eq!(round("4xi1=01,00,ff,0A"), "4xi1=01 00 FF 0A");
        assert_eq!(
            round("2x2x2xi8=1,-2,3,4,5,6,7,-128"),
            "2x2x2xi8=[[1 -2][3 4]][[5 6][7 -128]]"
        );
        assert_eq!(round("3xf16=1.5,0.1,65504"), "3xf16=1.5 0.0999756 65504");
        assert_eq!(
            round("3xbf16=1.5,0.1,3e38"),
            "3xbf16=1.5 0.100098 3.00406E+38"
        );
        assert_eq!(round("f32=3.25"), "f32=3.25");
        assert_eq!(round("3x4xi64=1"), "3x4xi64=[1 1 1 1][1 1 1 1][1 1 1 1]");
        assert_eq!(round("0x3xf32="), "0x3xf32=");
        assert_eq!(
            round("5xi8=-128,255,0x10,010,12abc"),
            "5xi8=-128 -1 16 8 12"
        );
        assert_eq!(round("5xsi8=-1000,1,2,3,4"), "5xsi8=24 1 2 3 4");
        assert_eq!(
            round("6xi32=4294967295,-5,0x7fffffff,+3,1e3,077"),
            "6xi32=-1 -5 2147483647 3 1 63"
        );
        assert_eq!(
            round("8xf32=inf,-nan,0x10,1.5abc,3.4e39,1e-40,.5,-0"),
            "8xf32=INF -NAN 16 1.5 INF 9.99995E-41 0.5 -0"
        );
        assert_eq!(round("8xf32="), "8xf32=0 0 0 0 0 0 0 0");
        let v = view("6xf32=1,-1,0.333333333,1e7,100000,1e-5");
        assert_eq!(v.to_string(), "6xf32=1 -1 0.333333 1E+07 100000 1E-05");
    }

    #[test]
    fn truncation_matches_upstream() {
        let v = view("3x4xi64=1");
        assert_eq!(v.format(Some(5)).unwrap(), "3x4xi64=[1 1 1 1][1...][...]");
        let v = view("2x3xi32=[2 4 6][8 10 -12]");
        assert_eq!(v.format(Some(4)).unwrap(), "2x3xi32=[2 4 6][8...]");
        assert_eq!(v.format(Some(0)).unwrap(), "2x3xi32=[...][...]");
    }

    #[test]
    fn parse_errors_match_upstream() {
        let a = HeapAllocator::new();
        let e = BufferView::parse("2x3xi32=1,2", &a).unwrap_err();
        assert_eq!(e.code(), StatusCode::OutOfRange);
        assert_eq!(
            e.message(),
            "input data string underflow: dst_i=2 < element_capacity=6"
        );
        let e = BufferView::parse("2x3xi32=1,2,3,4,5,6,7", &a).unwrap_err();
        assert_eq!(
            e.message(),
            "output data overflow: element_capacity=6 < dst_i=6"
        );
        let e = BufferView::parse("4xi1=1", &a).unwrap_err();
        assert_eq!(
            e.message(),
            "binary hex element count mismatch: buffer length=1 < expected=2"
        );
        assert_eq!(
            BufferView::parse("2x3xi32=1,a", &a).unwrap_err().code(),
            StatusCode::InvalidArgument
        );
        assert_eq!(
            BufferView::parse("8xf32=1e-50", &a).unwrap_err().code(),
            StatusCode::InvalidArgument
        );
        assert!(BufferView::parse("", &a).is_err());
        assert!(BufferView::parse("2xax3xf32=1", &a).is_err());
        assert!(BufferView::parse("-2xf32=1", &a).is_err());
        assert!(BufferView::parse("4xq8=1", &a).is_err());
        let e = parse_input("2x3xi32=1,2", &a).unwrap_err();
        assert!(
            e.to_string().ends_with("; parsing input `2x3xi32=1,2`"),
            "{e}"
        );
    }

    #[test]
    fn view_validation() {
        let a = HeapAllocator::new();
        let b = a.allocate(&BufferParams::default(), 16).unwrap();
        let e = BufferView::new(
            b.clone(),
            &[2, 3],
            ElementType::FLOAT_32,
            EncodingType::DENSE_ROW_MAJOR,
        )
        .unwrap_err();
        assert_eq!(e.code(), ferrite_base::StatusCode::OutOfRange);
        assert!(
            e.message()
                .contains("buffer view byte length 24 exceeds backing buffer byte length 16"),
            "{e}"
        );
        let v = BufferView::new(
            b.clone(),
            &[2, 2],
            ElementType::FLOAT_32,
            EncodingType::DENSE_ROW_MAJOR,
        )
        .unwrap();
        assert_eq!((v.element_count(), v.byte_length(), v.rank()), (4, 16, 2));
        let v =
            BufferView::new(b, &[7], ElementType::INT_4, EncodingType::DENSE_ROW_MAJOR).unwrap();
        assert_eq!(v.byte_length(), 4);
        assert!(BufferView::new(
            a.allocate(&BufferParams::default(), 1).unwrap(),
            &[u64::MAX, 2],
            ElementType::INT_8,
            EncodingType::DENSE_ROW_MAJOR
        )
        .is_err());
        let v = view("  \"2xf32=[1][2]\"\n");
        assert_eq!(v.to_string(), "2xf32=1 2");
        let v = view("2xf64=0.1 2.5");
        assert_eq!(v.buffer().to_vec().unwrap()[..8], 0.1f64.to_ne_bytes());
        let v = view("3xui16=65535,0x10,7");
        assert_eq!(v.to_string(), "3xui16=65535 16 7");
        let v = view("2xcf64=0000803F00000040,0000000000000000");
        assert_eq!(v.to_string(), "2xcf64=0000803F00000040 0000000000000000");
        let v = view("2xf8E4M3FN=1.5,448");
        assert_eq!(v.to_string(), "2xf8E4M3FN=1.5 448");
    }
}
