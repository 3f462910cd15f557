//! Parsing `--input=` values in upstream's syntax.

use ferrite_base::{bail, Result};
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

fn parse_int(t: &str) -> Option<i64> {
    if let Ok(v) = t.parse::<i64>() {
        return Some(v);
    }
    if let Ok(v) = t.parse::<u64>() {
        return Some(v as i64);
    }
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok().map(|v| v as i64);
    }
    // Upstream accepts a float where an integer is expected (`4.5` -> 4).
    parse_float(t).map(|f| f as i64)
}

fn parse_float(t: &str) -> Option<f64> {
    match t.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "-nan" => Some(-f64::NAN),
        "inf" | "+inf" | "infinity" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        _ => t.parse::<f64>().ok(),
    }
}
