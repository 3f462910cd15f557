//! The `attention_test` module imported by upstream's generated attention
//! e2e programs (`tests/e2e/attention`).
//!
//! | function                            | cconv           | arguments |
//! |-------------------------------------|-----------------|-----------|
//! | `generate_random_tensor`            | `0rIIIii_r`     | device, dim0..dim2, element type, seed |
//! | `check_attention_results`           | `0rIIIIIrrrr_v` | device, b, m, k1, k2, n, query, key, value, result |
//! | `check_attention_results_with_mask` | `0rIIIIIrrrrr_v`| device, b, m, k1, k2, n, query, key, value, mask, result |
//!
//! The generated programs widen everything to f32 before checking, and
//! their kernels use a scale (passed to the program) that the check is not
//! told, so upstream's runner computes a reference without comparing it.
//! This module checks what holds for any scale instead: each output
//! element is a softmax-weighted mean of the unmasked `value` entries of
//! its column, so it must be finite and lie within their minimum and
//! maximum (widened by `acceptable_fp_delta` plus 1e-3 of the magnitude
//! for the kernel's f16 rounding). Rows whose keys are all masked are not
//! checked. A failure (`ABORTED`) names the element, its value and bounds.

use std::sync::Arc;

use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result, Status, StatusCode};
use ferrite_hal::device::DeviceRef;
use ferrite_hal::{BufferView, ElementType};
use ferrite_vm::native::{ArgReader, NativeModule, NativeModuleBuilder};
use ferrite_vm::stack::{NativeCall, NativePoll};

use super::{dim_arg, downcast, expect_len, generate_random_call, read_view, E2eOptions};

/// The module's name, as the generated programs import it.
pub const ATTENTION_TEST_MODULE_NAME: &str = "attention_test";

/// Builds the `attention_test` module checking results under `opts`.
pub fn create_attention_test_module(opts: E2eOptions) -> Result<Arc<NativeModule>> {
    let b = NativeModuleBuilder::new(ATTENTION_TEST_MODULE_NAME, 0);
    let b = b.function(
        "generate_random_tensor",
        "0rIIIii_r",
        generate_random_call::<3>,
    )?;
    let b = b.function("check_attention_results", "0rIIIIIrrrr_v", move |c| {
        check_call(c, &opts, false)
    })?;
    let b = b.function(
        "check_attention_results_with_mask",
        "0rIIIIIrrrrr_v",
        move |c| check_call(c, &opts, true),
    )?;
    Ok(b.build())
}

fn check_call(c: &NativeCall, opts: &E2eOptions, with_mask: bool) -> Result<NativePoll> {
    let mut a = ArgReader::new(c);
    let device = downcast::<DeviceRef>(&a.a_ref()?, "device")?;
    let mut d = [0u64; 5];
    for (v, name) in d.iter_mut().zip(["b", "m", "k1", "k2", "n"]) {
        *v = dim_arg(a.i64()?, name)?;
    }
    let [b, m, k1, k2, n] = d;
    let mut names = vec!["query", "key", "value"];
    if with_mask {
        names.push("mask");
    }
    names.push("result");
    let mut views = Vec::new();
    for what in names {
        let r = a.a_ref().annotate(|| what.to_string())?;
        views.push((what, downcast::<BufferView>(&r, what)?));
    }
    let mut data = Vec::new();
    for (what, v) in &views {
        let et = v.element_type();
        let is_mask = *what == "mask";
        if !is_mask && et != ElementType::FLOAT_32 {
            bail!(
                InvalidArgument,
                "unhandled combination of element types in attention: {what} is {et} (f32 expected)"
            );
        }
        if is_mask && et.element_byte_count() != 1 {
            bail!(
                InvalidArgument,
                "mask: expected an 8-bit element type, received {et}"
            );
        }
        data.push(read_view(Some(&device), v)?);
    }
    let f32_count = |what: &str| match what {
        "query" => b * m * k1,
        "key" => b * k2 * k1,
        "value" => b * k2 * n,
        "mask" => b * m * k2,
        _ => b * m * n,
    };
    for ((what, v), bytes) in views.iter().zip(&data) {
        expect_len(bytes, f32_count(what), v.element_type(), what)?;
    }
    let value = &data[2];
    let mask = with_mask.then(|| data[3].as_slice());
    let result = data.last().map(Vec::as_slice).unwrap_or(&[]);
    check_bounds(opts, [b, m, k2, n], value, mask, result)?;
    Ok(NativePoll::Ready(Vec::new()))
}

fn f32_at(d: &[u8], i: u64) -> f32 {
    let i = i as usize * 4;
    f32::from_le_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]])
}

/// Checks each result element lies within the range of the unmasked
/// `value` entries of its column.
fn check_bounds(
    opts: &E2eOptions,
    [b, m, k2, n]: [u64; 4],
    value: &[u8],
    mask: Option<&[u8]>,
    result: &[u8],
) -> Result<()> {
    for bi in 0..b {
        for mi in 0..m {
            let kept = |k: u64| mask.is_none_or(|mk| mk[((bi * m + mi) * k2 + k) as usize] != 0);
            if !(0..k2).any(kept) {
                continue;
            }
            for ni in 0..n {
                let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
                for k in (0..k2).filter(|&k| kept(k)) {
                    let v = f32_at(value, (bi * k2 + k) * n + ni);
                    lo = lo.min(v);
                    hi = hi.max(v);
                }
                let slack = opts.acceptable_fp_delta + 1e-3 * lo.abs().max(hi.abs());
                let out = f32_at(result, (bi * m + mi) * n + ni);
                if !out.is_finite() || out < lo - slack || out > hi + slack {
                    return Err(Status::new(
                        StatusCode::Aborted,
                        format!(
                            "attention result at batch {bi}, row {mi}, column {ni} is {out}, outside the range [{lo}, {hi}] of the value entries it averages"
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}
