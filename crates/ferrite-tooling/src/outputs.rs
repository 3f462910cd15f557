//! Handling a function's results as upstream's `iree-run-module` does
//! (`iree/tooling/process_results.c`, `function_io.c`, `comparison.cc`):
//! print them (`result[i]: ...`), route each to `--output=` targets
//! (`-` stdout, empty: dropped, `@f.npy`/`+f.npy` numpy create/append,
//! `@f.bin`/`+f.bin` raw bytes), or compare them with `--expected_output=`
//! values and report `[SUCCESS]`/`[FAILED]` lines.

use crate::format::format_result;
use crate::inputs::parse_variants;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
use ferrite_hal::allocator::HeapAllocator;
use ferrite_hal::numerics::{bf16_to_f32, f16_to_f32};
use ferrite_hal::{Buffer, BufferView, ElementType, WHOLE_BUFFER};
use ferrite_vm::cconv::CconvType;
use ferrite_vm::Variant;
use std::fs::OpenOptions;
use std::io::Write;

/// Comparison settings (upstream's flag names and defaults).
#[derive(clap::Args, Debug, Clone)]
pub struct CompareArgs {
    /// Absolute tolerance for f16 in approximate mode.
    #[arg(long = "expected_f16_threshold", default_value_t = 0.001)]
    pub f16_atol: f32,
    /// Absolute tolerance for f32 in approximate mode.
    #[arg(long = "expected_f32_threshold", default_value_t = 0.0001)]
    pub f32_atol: f32,
    /// Absolute tolerance for f64 in approximate mode.
    #[arg(long = "expected_f64_threshold", default_value_t = 0.0001)]
    pub f64_atol: f64,
    /// Absolute tolerance for bf16 in approximate mode.
    #[arg(long = "expected_bf16_threshold", default_value_t = 0.01)]
    pub bf16_atol: f32,
    /// Relative tolerance shared across float types in approximate mode.
    #[arg(long = "expected_rtol", default_value_t = 1e-5)]
    pub rtol: f64,
    /// `approximate` (`|actual - expected| <= atol + rtol * |expected|`, NaN
    /// equals NaN) or `exact` (byte equality).
    #[arg(long = "equality_mode", default_value = "approximate")]
    pub equality_mode: String,
}

/// Prints, writes or checks `results`; returns whether the process should
/// exit successfully (false only when an expected output did not match).
pub fn process_results(
    results: &[Variant],
    result_types: &[CconvType],
    outputs: &[String],
    expected: &[String],
    compare: &CompareArgs,
    max_elements: usize,
) -> Result<bool> {
    if expected.is_empty() {
        if outputs.is_empty() {
            let mut out = String::new();
            for (i, r) in results.iter().enumerate() {
                out.push_str(&format!(
                    "result[{i}]: {}\n",
                    format_result(r, max_elements)
                ));
            }
            print_flush(&out);
        } else {
            write_variants(results, outputs, max_elements)
                .annotate(|| "outputting results".to_string())?;
        }
        return Ok(true);
    }
    let heap = HeapAllocator::new();
    let expected_list = parse_variants(result_types, expected, Some(&heap), "results")
        .annotate(|| "parsing expected function outputs".to_string())?;
    let (matched, report) = compare_lists(&expected_list, results, compare)?;
    let mut out = report;
    if matched {
        out.push_str("[SUCCESS] all function outputs matched their expected values.\n");
    }
    print_flush(&out);
    Ok(matched)
}

pub(crate) fn print_flush(s: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(s.as_bytes());
    let _ = stdout.flush();
}

fn write_variants(results: &[Variant], specs: &[String], max_elements: usize) -> Result<()> {
    if results.len() != specs.len() {
        bail!(
            OutOfRange,
            "{} outputs specified but the provided variant list only has {} elements",
            specs.len(),
            results.len()
        );
    }
    for (i, (v, spec)) in results.iter().zip(specs).enumerate() {
        if spec.is_empty() {
            continue;
        }
        if spec == "-" {
            print_flush(&format!("{}\n", format_result(v, max_elements)));
            continue;
        }
        write_to_file(v, spec).annotate(|| format!("writing result {i} to `{spec}`"))?;
    }
    Ok(())
}

/// Shape, element type and bytes of a result as upstream writes it: views
/// as they are, buffers as `Nxi8`, scalars as 0-d arrays, null as `0xi8`.
fn variant_contents(v: &Variant) -> Result<(Vec<u64>, ElementType, Vec<u8>)> {
    let whole = |b: &Buffer, len: u64| -> Result<Vec<u8>> {
        let map = b.map_read(0, WHOLE_BUFFER)?;
        Ok(map[..len as usize].to_vec())
    };
    Ok(match v {
        Variant::Null => (vec![0], ElementType::INT_8, Vec::new()),
        Variant::I32(x) => (vec![], ElementType::INT_32, x.to_le_bytes().to_vec()),
        Variant::I64(x) => (vec![], ElementType::INT_64, x.to_le_bytes().to_vec()),
        Variant::F32(x) => (vec![], ElementType::FLOAT_32, x.to_le_bytes().to_vec()),
        Variant::F64(x) => (vec![], ElementType::FLOAT_64, x.to_le_bytes().to_vec()),
        Variant::Ref(r) => {
            if let Some(view) = r.downcast::<BufferView>() {
                let data = whole(view.buffer(), view.byte_length())?;
                (view.shape().to_vec(), view.element_type(), data)
            } else if let Some(b) = r.downcast::<Buffer>() {
                let len = b.byte_length();
                (vec![len], ElementType::INT_8, whole(b, len)?)
            } else if let Some(b) = r.downcast::<ferrite_vm::buffer::VmBuffer>() {
                let data = b.to_vec()?;
                (vec![data.len() as u64], ElementType::INT_8, data)
            } else {
                bail!(
                    InvalidArgument,
                    "unsupported output source type {}; expected: !hal.buffer, !hal.buffer_view, !vm.buffer",
                    r.type_name()
                );
            }
        }
    })
}

fn write_to_file(v: &Variant, spec: &str) -> Result<()> {
    let (path, append) = if let Some(p) = spec.strip_prefix('@') {
        (p, false)
    } else if let Some(p) = spec.strip_prefix('+') {
        (p, true)
    } else {
        bail!(
            Unimplemented,
            "unsupported output mode specification '{spec}' (use `-`, `@file` to create or `+file` to append)"
        );
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .map_err(|e| status!(Unknown, "unable to open file `{path}` for writing: {e}"))?;
    let (shape, et, data) = variant_contents(v)?;
    if path.ends_with(".npy") {
        let mut bytes = Vec::with_capacity(data.len() + 128);
        crate::npy::write_array(&mut bytes, &shape, et, &data)?;
        f.write_all(&bytes)
    } else {
        f.write_all(&data)
    }
    .map_err(|e| status!(Unknown, "writing `{path}`: {e}"))
}

// ---------------------------------------------------------------------------
// Comparison.

fn type_string(v: &Variant) -> String {
    match v {
        Variant::Null => "empty".into(),
        Variant::I32(_) => "i32".into(),
        Variant::I64(_) => "i64".into(),
        Variant::F32(_) => "f32".into(),
        Variant::F64(_) => "f64".into(),
        Variant::Ref(r) => r.type_name().to_string(),
    }
}

/// `2x3xf32`, `i32` for 0-d.
fn shape_type(shape: &[u64], et: ElementType) -> String {
    if shape.is_empty() {
        et.to_string()
    } else {
        format!("{}x{et}", ferrite_hal::buffer_view::format_shape(shape))
    }
}

/// Compares like upstream's `iree_tooling_compare_variant_lists`; returns
/// whether all matched and the text upstream prints.
pub fn compare_lists(
    expected: &[Variant],
    actual: &[Variant],
    compare: &CompareArgs,
) -> Result<(bool, String)> {
    let mut out = String::new();
    if expected.len() != actual.len() {
        out.push_str(&format!(
            "[FAILED] expected {} list elements but {} provided\n",
            expected.len(),
            actual.len()
        ));
        return Ok((false, out));
    }
    let exact = match compare.equality_mode.as_str() {
        "approximate" => false,
        "exact" => true,
        other => bail!(
            InvalidArgument,
            "unknown --equality_mode '{other}'; expected `approximate` or `exact`"
        ),
    };
    let mut all = true;
    for (i, (e, a)) in expected.iter().zip(actual).enumerate() {
        if !compare_variant(i, e, a, exact, compare, &mut out)? {
            all = false;
        }
    }
    Ok((all, out))
}

fn compare_variant(
    i: usize,
    e: &Variant,
    a: &Variant,
    exact: bool,
    c: &CompareArgs,
    out: &mut String,
) -> Result<bool> {
    match (e, a) {
        // An expected null is upstream's `(ignored)`.
        (Variant::Null, _) => return Ok(true),
        (Variant::Ref(er), Variant::Ref(ar)) => {
            if let (Some(ev), Some(av)) = (er.downcast::<BufferView>(), ar.downcast::<BufferView>())
            {
                return compare_views(i, ev, av, exact, c, out);
            }
        }
        // Upstream 3.13 reports scalar results of the same type as a type
        // mismatch (comparison.cc only compares values whose types differ);
        // reproduced so exit codes agree.
        _ => {}
    }
    out.push_str(&format!(
        "[FAILED] result[{i}]: variant types mismatch; expected {} but got {}\n",
        type_string(e),
        type_string(a)
    ));
    Ok(false)
}

fn fuzzy(actual: f64, expected: f64, atol: f64, rtol: f64) -> bool {
    if actual == expected || (actual.is_nan() && expected.is_nan()) {
        return true;
    }
    if !expected.is_finite() {
        return false;
    }
    (actual - expected).abs() <= atol + rtol * expected.abs()
}

fn elements_match(et: ElementType, e: &[u8], a: &[u8], exact: bool, c: &CompareArgs) -> bool {
    if !exact {
        let h = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
        match et {
            ElementType::FLOAT_16 => {
                return fuzzy(
                    f16_to_f32(h(a)) as f64,
                    f16_to_f32(h(e)) as f64,
                    c.f16_atol as f64,
                    c.rtol,
                )
            }
            ElementType::BFLOAT_16 => {
                return fuzzy(
                    bf16_to_f32(h(a)) as f64,
                    bf16_to_f32(h(e)) as f64,
                    c.bf16_atol as f64,
                    c.rtol,
                )
            }
            ElementType::FLOAT_32 => {
                let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
                return fuzzy(f(a), f(e), c.f32_atol as f64, c.rtol);
            }
            ElementType::FLOAT_64 => {
                let f = |b: &[u8]| f64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
                return fuzzy(f(a), f(e), c.f64_atol, c.rtol);
            }
            _ => {}
        }
    }
    e == a
}

fn compare_views(
    i: usize,
    ev: &BufferView,
    av: &BufferView,
    exact: bool,
    c: &CompareArgs,
    out: &mut String,
) -> Result<bool> {
    let expected_desc = shape_type(ev.shape(), ev.element_type());
    let mut why = String::new();
    let metadata_ok = ev.shape() == av.shape()
        && (ev.element_type() == ElementType::NONE || ev.element_type() == av.element_type());
    if !metadata_ok {
        why = format!(
            "metadata is {}; expected that the view matches {expected_desc}",
            shape_type(av.shape(), av.element_type())
        );
    } else {
        let et = av.element_type();
        let size = et.element_byte_count();
        let count = av.element_count() as usize;
        let emap = ev.buffer().map_read(0, WHOLE_BUFFER)?;
        let amap = av.buffer().map_read(0, WHOLE_BUFFER)?;
        let mismatch = (0..count).find(|&k| {
            let r = k * size..(k + 1) * size;
            !elements_match(et, &emap[r.clone()], &amap[r], exact, c)
        });
        if let Some(k) = mismatch {
            let r = k * size..(k + 1) * size;
            let mut a_txt = String::new();
            let mut e_txt = String::new();
            ferrite_hal::buffer_view::format_element(&mut a_txt, &amap[r.clone()], et)?;
            ferrite_hal::buffer_view::format_element(&mut e_txt, &emap[r], et)?;
            why = format!("element at index {k} ({a_txt}) does not match the expected ({e_txt})");
        }
    }
    if why.is_empty() {
        return Ok(true);
    }
    out.push_str(&format!(
        "[FAILED] result[{i}]: {why}; expected that the view is equal to contents of a view of {expected_desc}\n  expected:\n{}\n  actual:\n{}\n",
        ev.format(Some(1024))?,
        av.format(Some(1024))?
    ));
    Ok(false)
}
