//! The `conv2d_test` module imported by upstream's generated convolution
//! e2e programs (`tests/e2e/convolution`): random 4-D input tensors and a
//! host reference convolution to check results against.
//!
//! | function                 | cconv                 | arguments |
//! |--------------------------|-----------------------|-----------|
//! | `generate_random_tensor` | `0rIIIIii_r`          | device, dim0..dim3, element type, seed |
//! | `check_conv2d_results`   | `0rIIIIIIIIIIIrrrr_v` | device, n, c, h, w, f, kh, kw, sh, sw, dh, dw, input, kernel, acc (may be null), actual |
//!
//! Layouts are NCHW input, FCHW kernel and NFHW output. The reference
//! accumulates in f32 (f32 and f16 tensors) over input channels, then
//! kernel rows, then kernel columns, and rounds to the result type at the
//! end. Every output element is checked; the first disagreeing one fails
//! the call (`ABORTED`) naming its position and both values.

use std::sync::Arc;

use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result, Status, StatusCode};
use ferrite_hal::device::DeviceRef;
use ferrite_hal::numerics;
use ferrite_hal::{BufferView, ElementType};
use ferrite_vm::native::{ArgReader, NativeModule, NativeModuleBuilder};
use ferrite_vm::stack::NativePoll;

use super::{
    agree, dim_arg, downcast, expect_len, generate_random_call, read_view, E2eOptions, Value,
};

/// The module's name, as the generated programs import it.
pub const CONV2D_TEST_MODULE_NAME: &str = "conv2d_test";

/// Builds the `conv2d_test` module comparing results under `opts`.
pub fn create_conv2d_test_module(opts: E2eOptions) -> Result<Arc<NativeModule>> {
    let b = NativeModuleBuilder::new(CONV2D_TEST_MODULE_NAME, 0);
    let b = b.function(
        "generate_random_tensor",
        "0rIIIIii_r",
        generate_random_call::<4>,
    )?;
    let b = b.function("check_conv2d_results", "0rIIIIIIIIIIIrrrr_v", move |c| {
        let mut a = ArgReader::new(c);
        let device = downcast::<DeviceRef>(&a.a_ref()?, "device")?;
        let mut d = [0u64; 11];
        for (v, name) in d
            .iter_mut()
            .zip(["n", "c", "h", "w", "f", "kh", "kw", "sh", "sw", "dh", "dw"])
        {
            *v = dim_arg(a.i64()?, name)?;
        }
        let mut view = |what: &str| -> Result<BufferView> {
            let r = a.a_ref().annotate(|| what.to_string())?;
            downcast::<BufferView>(&r, what)
        };
        let input = view("input")?;
        let kernel = view("kernel")?;
        let acc = match a.opt_ref()? {
            None => None,
            Some(r) => Some(downcast::<BufferView>(&r, "acc")?),
        };
        let actual = downcast::<BufferView>(
            &a.a_ref().annotate(|| "actual_result".to_string())?,
            "actual_result",
        )?;
        let p = Conv2dProblem::new(d, &input, &kernel, acc.as_ref(), &actual)?;
        let input = read_view(Some(&device), &input)?;
        let kernel = read_view(Some(&device), &kernel)?;
        let acc = match &acc {
            Some(v) => Some(read_view(Some(&device), v)?),
            None => None,
        };
        let actual = read_view(Some(&device), &actual)?;
        expect_len(&input, p.n * p.c * p.h * p.w, p.et, "input")?;
        expect_len(&kernel, p.f * p.c * p.kh * p.kw, p.et, "kernel")?;
        let out_count = p.n * p.f * p.oh * p.ow;
        if let Some(acc) = &acc {
            expect_len(acc, out_count, p.et, "acc")?;
        }
        expect_len(&actual, out_count, p.et, "actual_result")?;
        p.check(&opts, &input, &kernel, acc.as_deref(), &actual)?;
        Ok(NativePoll::Ready(Vec::new()))
    })?;
    Ok(b.build())
}

/// Output size along one spatial dimension of a valid (unpadded)
/// convolution; an error when the dilated kernel does not fit.
fn out_size(what: &str, input: u64, kernel: u64, stride: u64, dilation: u64) -> Result<u64> {
    if kernel == 0 || stride == 0 || dilation == 0 {
        bail!(
            InvalidArgument,
            "{what}: kernel size, stride and dilation must be >= 1 (received {kernel}, {stride}, {dilation})"
        );
    }
    let span = (kernel - 1)
        .checked_mul(dilation)
        .and_then(|s| s.checked_add(1))
        .ok_or_else(|| status!(InvalidArgument, "{what}: dilated kernel size overflows"))?;
    if span > input {
        bail!(
            InvalidArgument,
            "{what}: the dilated kernel ({span}) is larger than the input ({input})"
        );
    }
    Ok((input - span) / stride + 1)
}

/// A convolution's sizes and element type.
struct Conv2dProblem {
    n: u64,
    c: u64,
    h: u64,
    w: u64,
    f: u64,
    kh: u64,
    kw: u64,
    sh: u64,
    sw: u64,
    dh: u64,
    dw: u64,
    oh: u64,
    ow: u64,
    et: ElementType,
}

impl Conv2dProblem {
    fn new(
        d: [u64; 11],
        input: &BufferView,
        kernel: &BufferView,
        acc: Option<&BufferView>,
        actual: &BufferView,
    ) -> Result<Conv2dProblem> {
        let [n, c, h, w, f, kh, kw, sh, sw, dh, dw] = d;
        let et = actual.element_type();
        let types = [
            input.element_type(),
            kernel.element_type(),
            acc.map_or(et, |a| a.element_type()),
        ];
        if !matches!(et, ElementType::FLOAT_32 | ElementType::FLOAT_16)
            || types.iter().any(|&t| t != et)
        {
            bail!(
                InvalidArgument,
                "unhandled combination of element types in conv2d: input {}, kernel {}, accumulator {}, result {et} (f32 or f16 throughout are handled)",
                types[0],
                types[1],
                types[2]
            );
        }
        let oh = out_size("height", h, kh, sh, dh)?;
        let ow = out_size("width", w, kw, sw, dw)?;
        Ok(Conv2dProblem {
            n,
            c,
            h,
            w,
            f,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
            oh,
            ow,
            et,
        })
    }

    fn load(&self, data: &[u8], i: u64) -> f32 {
        let i = i as usize;
        match self.et {
            ElementType::FLOAT_16 => {
                numerics::f16_to_f32(u16::from_le_bytes([data[2 * i], data[2 * i + 1]]))
            }
            _ => f32::from_le_bytes([
                data[4 * i],
                data[4 * i + 1],
                data[4 * i + 2],
                data[4 * i + 3],
            ]),
        }
    }

    fn store(&self, data: &mut [u8], i: u64, v: f32) {
        let i = i as usize;
        match self.et {
            ElementType::FLOAT_16 => {
                data[2 * i..2 * i + 2].copy_from_slice(&numerics::f32_to_f16(v).to_le_bytes())
            }
            _ => data[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        }
    }

    /// The flat index of (a, b, y, x) in a tensor of dims (_, nb, ny, nx).
    fn index(nb: u64, ny: u64, nx: u64, a: u64, b: u64, y: u64, x: u64) -> u64 {
        ((a * nb + b) * ny + y) * nx + x
    }

    fn check(
        &self,
        opts: &E2eOptions,
        input: &[u8],
        kernel: &[u8],
        acc: Option<&[u8]>,
        actual: &[u8],
    ) -> Result<()> {
        let mut expected = vec![0u8; actual.len()];
        for n in 0..self.n {
            for oc in 0..self.f {
                for oh in 0..self.oh {
                    for ow in 0..self.ow {
                        let out = Self::index(self.f, self.oh, self.ow, n, oc, oh, ow);
                        let mut sum = acc.map_or(0.0, |a| self.load(a, out));
                        for ic in 0..self.c {
                            for kh in 0..self.kh {
                                for kw in 0..self.kw {
                                    let y = oh * self.sh + kh * self.dh;
                                    let x = ow * self.sw + kw * self.dw;
                                    let i = Self::index(self.c, self.h, self.w, n, ic, y, x);
                                    let k = Self::index(self.c, self.kh, self.kw, oc, ic, kh, kw);
                                    sum += self.load(input, i) * self.load(kernel, k);
                                }
                            }
                        }
                        self.store(&mut expected, out, sum);
                        let a = Value::read(actual, out as usize, self.et)?;
                        let e = Value::read(&expected, out as usize, self.et)?;
                        if !agree(opts, e, a)? {
                            return Err(Status::new(
                                StatusCode::Aborted,
                                format!(
                                    "the actual and expected result tensors disagree at n {n}, oc {oc}, oh {oh}, ow {ow}.\nactual value: {}\nexpected value: {}",
                                    a.format(),
                                    e.format()
                                ),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
