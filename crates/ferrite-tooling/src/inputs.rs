//! Parsing `--input=` values in upstream's syntax.

use ferrite_base::{bail, Result};
use ferrite_hal::numerics::{parse_c_f64, parse_c_i64, parse_c_u64};
use ferrite_vm::cconv::CconvType;
use ferrite_vm::Variant;

/// Parses one scalar `--input` for an argument of type `ty`.
///
/// Upstream reads scalars by the function's argument type: `--input=42`
/// for i32, `--input=10000000000` for i64, `--input=1.5` for f32.
pub fn parse_scalar(text: &str, ty: &CconvType, index: usize) -> Result<Variant> {
    let t = text.trim();
    // Messages follow upstream's: "parsing value `x` as i32; parsing input `x`".
    let bad = |what: &str| {
        ferrite_base::status!(InvalidArgument, "parsing value `{t}` as {what}")
            .annotate(format!("parsing input {index} `{text}`"))
    };
    Ok(match ty {
        CconvType::I32 => Variant::I32(parse_int(t).ok_or_else(|| bad("i32"))? as i32),
        CconvType::I64 => Variant::I64(parse_int(t).ok_or_else(|| bad("i64"))?),
        CconvType::F32 => Variant::F32(parse_float(t).ok_or_else(|| bad("f32"))? as f32),
        CconvType::F64 => Variant::F64(parse_float(t).ok_or_else(|| bad("f64"))?),
        CconvType::Ref => bail!(
            InvalidArgument,
            "parsing input {index} `{text}`: ref arguments (buffers, tensors) need the HAL, which this build of run-module does not provide"
        ),
        CconvType::Span(_) => bail!(InvalidArgument, "input {index}: variadic functions cannot be called from the command line"),
    })
}

/// An integer as upstream reads one (C `strtoll` rules, unsigned values
/// wrapping: `4294967295` is `-1` as i32, `4.5` is 4).
pub(crate) fn parse_int(t: &str) -> Option<i64> {
    if is_tensor(t) {
        return None;
    }
    parse_c_i64(t).or_else(|| parse_c_u64(t).map(|v| v as i64))
}

/// A float as upstream reads one (C `strtod` rules: `nan`, `inf`, hex floats).
pub(crate) fn parse_float(t: &str) -> Option<f64> {
    if is_tensor(t) {
        return None;
    }
    parse_c_f64(t)
}

/// A tensor (`5xf32=1`) where a scalar is expected is an error, not the
/// number its leading digits spell (upstream's strtol would read 5).
fn is_tensor(t: &str) -> bool {
    t.contains('=')
}

// ---------------------------------------------------------------------------
// Whole input/expected-output lists (`iree/tooling/function_io.c` semantics).

use ferrite_base::status::ResultExt;
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::buffer_view::{compute_view_size, split_spec};
use ferrite_hal::{BufferUsage, BufferView, EncodingType, MemoryType, WHOLE_BUFFER};
use ferrite_vm::Ref;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, SeekFrom};

/// Files opened while parsing one list: `@path` (re)starts at the file's
/// beginning, `+path` and `*path` continue where the previous argument
/// naming the same path stopped, so several arguments can read one file.
#[derive(Default)]
pub struct InputFiles {
    files: HashMap<String, File>,
}

impl InputFiles {
    fn open(&mut self, path: &str, append: bool) -> Result<&mut File> {
        if !self.files.contains_key(path) {
            let f = File::open(path).map_err(|e| {
                ferrite_base::status!(NotFound, "unable to open file `{path}` for reading: {e}")
            })?;
            self.files.insert(path.to_string(), f);
        } else if !append {
            let f = self.files.get_mut(path).expect("present");
            f.seek(SeekFrom::Start(0))
                .map_err(|e| ferrite_base::status!(Unknown, "seeking `{path}`: {e}"))?;
        }
        Ok(self.files.get_mut(path).expect("present"))
    }
}

fn at_eof(f: &mut File) -> Result<bool> {
    let pos = f.stream_position()?;
    let len = f.metadata()?.len();
    Ok(pos >= len)
}

/// The cconv character upstream names types by.
pub fn cconv_char(ty: &CconvType) -> char {
    match ty {
        CconvType::I32 => 'i',
        CconvType::I64 => 'I',
        CconvType::F32 => 'f',
        CconvType::F64 => 'F',
        CconvType::Ref => 'r',
        CconvType::Span(_) => 'C',
    }
}

struct Cursor<'a> {
    types: &'a [CconvType],
    next: usize,
    /// Values given (at least; `*f.npy` may hold more).
    given: usize,
    /// What the values are: `arguments` or `results`.
    noun: &'static str,
}

impl<'a> Cursor<'a> {
    fn take_any(&mut self) -> Result<&'a CconvType> {
        let Some(t) = self.types.get(self.next) else {
            bail!(
                InvalidArgument,
                "function expected fewer input values; expected {} {} but passed {}",
                self.types.len(),
                self.noun,
                self.given.max(self.types.len() + 1)
            );
        };
        self.next += 1;
        Ok(t)
    }
    fn take_ref(&mut self) -> Result<()> {
        let t = self.take_any()?;
        if !matches!(t, CconvType::Ref) {
            bail!(
                InvalidArgument,
                "function signature mismatch: expected cconv type `r` but provided type `{}` (value {} of the function is a scalar, not a tensor)",
                cconv_char(t),
                self.next - 1
            );
        }
        Ok(())
    }
}

/// Parses `specs` (upstream's `--input` syntax) against the cconv `types`
/// (a function's arguments, or its results for `--expected_output`).
/// Tensors are allocated from `allocator` (`None`: the program uses no HAL
/// device). Errors are annotated `parsing input `SPEC``.
pub fn parse_variants(
    types: &[CconvType],
    specs: &[String],
    allocator: Option<&dyn Allocator>,
    noun: &'static str,
) -> Result<Vec<Variant>> {
    let mut files = InputFiles::default();
    let mut cursor = Cursor {
        types,
        next: 0,
        given: specs.len(),
        noun,
    };
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        let s = spec.trim();
        parse_variant_into(&mut cursor, s, allocator, &mut files, &mut out)
            .annotate(|| format!("parsing input `{s}`"))?;
    }
    Ok(out)
}

fn need_allocator(allocator: Option<&dyn Allocator>) -> Result<&dyn Allocator> {
    match allocator {
        Some(a) => Ok(a),
        None => bail!(
            InvalidArgument,
            "the value is a tensor but the program uses no HAL device"
        ),
    }
}

fn parse_variant_into(
    cursor: &mut Cursor<'_>,
    s: &str,
    allocator: Option<&dyn Allocator>,
    files: &mut InputFiles,
    out: &mut Vec<Variant>,
) -> Result<()> {
    if s.is_empty() {
        bail!(InvalidArgument, "no value specified for input");
    }
    if s == "(null)" || s == "(ignored)" {
        out.push(match cursor.take_any()? {
            CconvType::I32 => Variant::I32(0),
            CconvType::I64 => Variant::I64(0),
            CconvType::F32 => Variant::F32(0.0),
            CconvType::F64 => Variant::F64(0.0),
            CconvType::Ref => Variant::Null,
            t => bail!(
                Unimplemented,
                "unimplemented cconv type `{}`",
                cconv_char(t)
            ),
        });
        return Ok(());
    }
    if let Some(first) = s.chars().next().filter(|c| matches!(c, '@' | '+' | '*')) {
        let path = &s[1..];
        if !path.ends_with(".npy") {
            bail!(
                Unimplemented,
                "only numpy (.npy) files are supported for metadata-less variant I/O (raw files need a shape and type: `2x3xf32=@{path}`)"
            );
        }
        let f = files.open(path, first != '@')?;
        if first != '*' {
            cursor.take_ref()?;
            out.push(read_npy(f, path, need_allocator(allocator)?)?);
        } else {
            while !at_eof(f)? {
                cursor.take_ref()?;
                out.push(read_npy(f, path, need_allocator(allocator)?)?);
            }
        }
        return Ok(());
    }
    if let Some(rest) = s.strip_prefix('&') {
        cursor.take_ref()?;
        let view = parse_tensor(rest, need_allocator(allocator)?, files)?;
        out.push(Variant::Ref(Ref::new(view.buffer().clone())));
        return Ok(());
    }
    match cursor.types.get(cursor.next) {
        Some(CconvType::Ref) => {}
        _ => {
            let ty = cursor.take_any()?;
            let bad = |what: &str| {
                ferrite_base::status!(InvalidArgument, "parsing value `{s}` as {what}")
            };
            out.push(match ty {
                CconvType::I32 => Variant::I32(parse_int(s).ok_or_else(|| bad("i32"))? as i32),
                CconvType::I64 => Variant::I64(parse_int(s).ok_or_else(|| bad("i64"))?),
                CconvType::F32 => Variant::F32(parse_float(s).ok_or_else(|| bad("f32"))? as f32),
                CconvType::F64 => Variant::F64(parse_float(s).ok_or_else(|| bad("f64"))?),
                t => bail!(
                    Unimplemented,
                    "unimplemented cconv type `{}`",
                    cconv_char(t)
                ),
            });
            return Ok(());
        }
    }
    cursor.take_ref()?;
    if !s.contains('=') && !s.contains('x') {
        bail!(
            InvalidArgument,
            "invalid tensor specification, requires at least a shape/type (`4x2xf32=...`)"
        );
    }
    let view = parse_tensor(s, need_allocator(allocator)?, files)?;
    out.push(Variant::Ref(Ref::new(view)));
    Ok(())
}

/// `SHAPExTYPE=values`, or `SHAPExTYPE=@file.bin` / `=+file.bin` (raw
/// bytes, read from the start or continuing in the file).
fn parse_tensor(s: &str, allocator: &dyn Allocator, files: &mut InputFiles) -> Result<BufferView> {
    if let Some((_, contents)) = s.split_once('=') {
        if let Some(first) = contents.chars().next().filter(|c| matches!(c, '@' | '+')) {
            let (shape, element_type, _) = split_spec(s)?;
            let path = &contents[1..];
            let f = files.open(path, first == '+')?;
            return read_raw(f, path, &shape, element_type, allocator);
        }
    }
    BufferView::parse(s, allocator)
}

fn params() -> BufferParams {
    BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT)
}

fn read_raw(
    f: &mut File,
    path: &str,
    shape: &[u64],
    element_type: ferrite_hal::ElementType,
    allocator: &dyn Allocator,
) -> Result<BufferView> {
    let size = compute_view_size(shape, element_type, EncodingType::DENSE_ROW_MAJOR)?;
    let start = f.stream_position()?;
    let file_len = f.metadata()?.len();
    let shape_text = ferrite_hal::buffer_view::format_shape(shape);
    let what = if shape.is_empty() {
        element_type.to_string()
    } else {
        format!("{shape_text}x{element_type}")
    };
    if file_len.saturating_sub(start) < size {
        bail!(
            OutOfRange,
            "`{path}` has {} bytes left at offset {start} but {what} needs {size}",
            file_len.saturating_sub(start)
        );
    }
    let buffer = allocator.allocate(&params(), size)?;
    {
        let mut map = buffer.map_write(0, WHOLE_BUFFER)?;
        std::io::Read::read_exact(f, &mut map[..size as usize]).map_err(|e| {
            ferrite_base::status!(Unknown, "reading {size} bytes from `{path}`: {e}")
        })?;
    }
    BufferView::new(buffer, shape, element_type, EncodingType::DENSE_ROW_MAJOR)
}

fn read_npy(f: &mut File, path: &str, allocator: &dyn Allocator) -> Result<Variant> {
    if at_eof(f)? {
        bail!(
            OutOfRange,
            "end-of-file: `{path}` holds no further array at offset {}",
            f.stream_position()?
        );
    }
    let header = crate::npy::read_header(f, path)?;
    let view = read_raw(f, path, &header.shape, header.element_type, allocator)
        .annotate(|| format!("reading the data of npy array in `{path}`"))?;
    Ok(Variant::Ref(Ref::new(view)))
}
