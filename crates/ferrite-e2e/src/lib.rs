//! Ferrite's e2e test tooling: the native test modules of upstream's
//! generated e2e suites (matmul, conv2d, attention), which give programs
//! pseudo-random inputs and check results against a reference computation
//! done on the host, and the [`runner`] behind `ferrite e2e-*-test`.
//!
//! The generated "calls" programs import a module (`matmul_test`,
//! `conv2d_test`, `attention_test`) whose functions make input buffer views from a seed and
//! compare an actual result with a reference one. This part holds what the
//! modules share: the seeded generator (values match upstream's runners for
//! the same seed), reading buffers back from a device, and the rules for
//! when a result element agrees with its reference ([`E2eOptions`], the
//! runners' `--require_exact_results`, `--acceptable_fp_delta`,
//! `--max_elements_to_check` flags).

#![deny(missing_docs)]

pub mod attention;
pub mod conv2d;
pub mod matmul;
pub mod runner;

use ferrite_base::printf_float::format_g;
use ferrite_base::{bail, status, Result};
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::device::DeviceRef;
use ferrite_hal::numerics;
use ferrite_hal::{BufferUsage, BufferView, ElementType, EncodingType, MemoryAccess, MemoryType};
use ferrite_vm::native::ArgReader;
use ferrite_vm::refs::{Ref, RefObject};
use ferrite_vm::stack::{NativeCall, NativePoll};
use ferrite_vm::Variant;

/// How strictly results are compared (the runners' flags).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct E2eOptions {
    /// Floating-point results must match their reference bit for bit
    /// (`--require_exact_results`, default true).
    pub require_exact_results: bool,
    /// Largest absolute difference accepted for inexact floating-point
    /// results (`--acceptable_fp_delta`, default 1e-5).
    pub acceptable_fp_delta: f32,
    /// Check only about this many result elements of large results, 0 for
    /// all (`--max_elements_to_check`, default 10000).
    pub max_elements_to_check: i32,
}

impl Default for E2eOptions {
    fn default() -> E2eOptions {
        E2eOptions {
            require_exact_results: true,
            acceptable_fp_delta: 1e-5,
            max_elements_to_check: 10000,
        }
    }
}

impl E2eOptions {
    /// The stride of checked elements for a result of `total` elements:
    /// about `total / max_elements_to_check`, moved up until it does not
    /// divide `no_div_of` (the inner dimension) so the checked elements do
    /// not all fall in the same columns.
    pub fn check_every(&self, total: u64, no_div_of: u64) -> u64 {
        if self.max_elements_to_check <= 0 {
            return 1;
        }
        let max = self.max_elements_to_check as u64;
        let mut every = total.div_ceil(max).max(1);
        if every > 1 {
            while no_div_of.is_multiple_of(every) {
                every += 1;
            }
        }
        every
    }

    /// Fails for a negative tolerance (which would reject everything).
    fn validate(&self) -> Result<()> {
        if self.acceptable_fp_delta.is_nan() || self.acceptable_fp_delta < 0.0 {
            bail!(
                InvalidArgument,
                "negative tolerance (acceptable_fp_delta={})",
                format_g(self.acceptable_fp_delta as f64, 8)
            );
        }
        Ok(())
    }
}

/// The seeded pseudo-random generator of the runners: a Lehmer generator
/// with multiplier 48271 modulo 2^31-1 (as `std::minstd_rand`).
#[derive(Clone, Copy, Debug)]
pub struct Lcg(u32);

impl Lcg {
    /// A generator whose state starts at `seed`.
    pub fn new(seed: u32) -> Lcg {
        Lcg(seed)
    }

    /// The next state.
    pub fn next_u32(&mut self) -> u32 {
        self.0 = ((self.0 as u64 * 48271) % 2_147_483_647) as u32;
        self.0
    }

    /// The next value in `0..range`.
    pub fn next_below(&mut self, range: u32) -> u32 {
        self.next_u32() % range
    }
}

/// The inclusive range of random values for `et`: small integers, so that
/// float products and sums stay exact.
pub fn value_range(et: ElementType) -> Result<(i32, i32)> {
    Ok(match et {
        ElementType::INT_8 | ElementType::SINT_8 => (-2, 2),
        // Random bytes: fills sub-byte (MX) data with all representable values.
        ElementType::UINT_8 => (0, 255),
        ElementType::INT_16 | ElementType::SINT_16 | ElementType::FLOAT_16 => (-4, 4),
        ElementType::BFLOAT_16
        | ElementType::FLOAT_8_E5M2
        | ElementType::FLOAT_8_E4M3_FN
        | ElementType::FLOAT_8_E5M2_FNUZ
        | ElementType::FLOAT_8_E4M3_FNUZ => (-2, 2),
        ElementType::UINT_16 => (0, 4),
        ElementType::INT_32 | ElementType::SINT_32 | ElementType::FLOAT_32 => (-8, 8),
        ElementType::UINT_32 => (0, 8),
        ElementType::INT_64 | ElementType::SINT_64 | ElementType::FLOAT_64 => (-16, 16),
        ElementType::UINT_64 => (0, 16),
        ElementType::FLOAT_8_E8M0_FNU => (1, 8),
        other => bail!(
            InvalidArgument,
            "cannot generate random values of element type {other}"
        ),
    })
}

/// Stores `value` as one element of type `et` at the start of `dst`
/// (integers truncate as a C cast does, floats round to nearest).
fn write_element(et: ElementType, value: i32, dst: &mut [u8]) {
    let n = et.element_byte_count();
    let bytes: [u8; 8] = match et {
        ElementType::FLOAT_16 => widen(&numerics::f32_to_f16(value as f32).to_le_bytes()),
        ElementType::BFLOAT_16 => widen(&numerics::f32_to_bf16(value as f32).to_le_bytes()),
        ElementType::FLOAT_8_E5M2 => [numerics::f32_to_f8e5m2(value as f32), 0, 0, 0, 0, 0, 0, 0],
        ElementType::FLOAT_8_E4M3_FN => {
            [numerics::f32_to_f8e4m3fn(value as f32), 0, 0, 0, 0, 0, 0, 0]
        }
        ElementType::FLOAT_8_E5M2_FNUZ => [
            numerics::f32_to_f8e5m2fnuz(value as f32),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ],
        ElementType::FLOAT_8_E4M3_FNUZ => [
            numerics::f32_to_f8e4m3fnuz(value as f32),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ],
        ElementType::FLOAT_8_E8M0_FNU => [
            numerics::f32_to_f8e8m0fnu(value as f32),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ],
        ElementType::FLOAT_32 => widen(&(value as f32).to_le_bytes()),
        ElementType::FLOAT_64 => (value as f64).to_le_bytes(),
        // Integers of every width: the low bytes of the sign-extended value.
        _ => (value as i64).to_le_bytes(),
    };
    dst[..n].copy_from_slice(&bytes[..n]);
}

fn widen(b: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..b.len()].copy_from_slice(b);
    out
}

/// Fills `bytes` (whole elements of `et`) with values drawn from a
/// generator seeded with `seed`, in memory order.
pub fn fill_random(et: ElementType, seed: u32, bytes: &mut [u8]) -> Result<()> {
    let (min, max) = value_range(et)?;
    let n = et.element_byte_count();
    if !et.is_byte_aligned() || n == 0 {
        bail!(
            InvalidArgument,
            "cannot generate random values of element type {et}"
        );
    }
    let range = (max - min + 1) as u32;
    let mut rng = Lcg::new(seed);
    for chunk in bytes.chunks_exact_mut(n) {
        let value = rng.next_below(range) as i32 + min;
        write_element(et, value, chunk);
    }
    Ok(())
}

/// The body of the test modules' `generate_random_*` functions: a device,
/// `N` dimensions (`dim0`, `dim1`, ...), an element type and a seed in;
/// a new [`generate_random_view`] out.
pub(crate) fn generate_random_call<const N: usize>(c: &mut NativeCall<'_>) -> Result<NativePoll> {
    let mut a = ArgReader::new(c);
    let device = downcast::<DeviceRef>(&a.a_ref()?, "device")?;
    let mut shape = [0u64; N];
    for (i, d) in shape.iter_mut().enumerate() {
        *d = dim_arg(a.i64()?, &format!("dim{i}"))?;
    }
    let et = element_type_arg(a.i32()?, "element_type")?;
    let seed = a.i32()? as u32;
    let view = generate_random_view(&device, &shape, et, seed)?;
    Ok(NativePoll::Ready(vec![Variant::Ref(Ref::new(view))]))
}

/// A new buffer view of `shape` and `et` on `device`, filled by
/// [`fill_random`] with `seed`.
pub fn generate_random_view(
    device: &DeviceRef,
    shape: &[u64],
    et: ElementType,
    seed: u32,
) -> Result<BufferView> {
    let count = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let count = count.ok_or_else(|| {
        status!(
            InvalidArgument,
            "shape {shape:?} has more elements than fit in 64 bits"
        )
    })?;
    let length = et.dense_byte_count(count)?;
    let params = BufferParams {
        usage: BufferUsage::DEFAULT | BufferUsage::MAPPING,
        access: MemoryAccess::ALL,
        memory_type: MemoryType::DEVICE_LOCAL | MemoryType::HOST_VISIBLE,
        queue_affinity: 0,
        min_alignment: 0,
    };
    let buffer = device.0.allocator().allocate(&params, length)?;
    {
        let mut map = buffer.map_write(0, length)?;
        fill_random(et, seed, &mut map)?;
    }
    BufferView::new(buffer, shape, et, EncodingType::DENSE_ROW_MAJOR)
}

/// The bytes of `view`, read back from `device` when the host cannot map
/// its buffer.
pub fn read_view(device: Option<&DeviceRef>, view: &BufferView) -> Result<Vec<u8>> {
    let host = ferrite_modules::check::host_view(device, view)?;
    ferrite_modules::check::contents(&host)
}

/// One element read from a result buffer, kept in its storage type so that
/// comparisons can be bit-exact.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// An 8-bit integer.
    I8(i8),
    /// A 16-bit integer.
    I16(i16),
    /// A 32-bit integer.
    I32(i32),
    /// An 8-bit float of the given type, as its bits.
    F8(ElementType, u8),
    /// An IEEE half, as its bits.
    F16(u16),
    /// A bfloat16, as its bits.
    Bf16(u16),
    /// An f32.
    F32(f32),
    /// An f64.
    F64(f64),
}

/// True for integer types (signless, signed or unsigned) of `bits` bits.
pub fn is_int(et: ElementType, bits: u32) -> bool {
    et.is_integer() && et.bit_count() == bits
}

fn le<const N: usize>(bytes: &[u8], index: usize) -> Result<[u8; N]> {
    bytes
        .get(index * N..index * N + N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| {
            status!(
                OutOfRange,
                "element {index} is beyond a buffer of {} bytes",
                bytes.len()
            )
        })
}

impl Value {
    /// Element `index` of `bytes` holding elements of type `et`.
    pub fn read(bytes: &[u8], index: usize, et: ElementType) -> Result<Value> {
        Ok(if is_int(et, 8) {
            Value::I8(i8::from_le_bytes(le::<1>(bytes, index)?))
        } else if is_int(et, 16) {
            Value::I16(i16::from_le_bytes(le::<2>(bytes, index)?))
        } else if is_int(et, 32) {
            Value::I32(i32::from_le_bytes(le::<4>(bytes, index)?))
        } else {
            match et {
                ElementType::FLOAT_8_E5M2
                | ElementType::FLOAT_8_E4M3_FN
                | ElementType::FLOAT_8_E5M2_FNUZ
                | ElementType::FLOAT_8_E4M3_FNUZ
                | ElementType::FLOAT_8_E8M0_FNU => Value::F8(et, le::<1>(bytes, index)?[0]),
                ElementType::FLOAT_16 => Value::F16(u16::from_le_bytes(le::<2>(bytes, index)?)),
                ElementType::BFLOAT_16 => Value::Bf16(u16::from_le_bytes(le::<2>(bytes, index)?)),
                ElementType::FLOAT_32 => Value::F32(f32::from_le_bytes(le::<4>(bytes, index)?)),
                ElementType::FLOAT_64 => Value::F64(f64::from_le_bytes(le::<8>(bytes, index)?)),
                other => bail!(InvalidArgument, "unhandled result element type {other}"),
            }
        })
    }

    /// The value as text, floats with enough digits to see any difference.
    pub fn format(&self) -> String {
        match *self {
            Value::I8(v) => v.to_string(),
            Value::I16(v) => v.to_string(),
            Value::I32(v) => v.to_string(),
            Value::F8(et, b) => format_g(f8_to_f32(et, b) as f64, 3),
            Value::F16(b) => format_g(numerics::f16_to_f32(b) as f64, 5),
            Value::Bf16(b) => format_g(numerics::bf16_to_f32(b) as f64, 5),
            Value::F32(v) => format_g(v as f64, 8),
            Value::F64(v) => format_g(v, 16),
        }
    }
}

fn f8_to_f32(et: ElementType, b: u8) -> f32 {
    match et {
        ElementType::FLOAT_8_E5M2 => numerics::f8e5m2_to_f32(b),
        ElementType::FLOAT_8_E4M3_FN => numerics::f8e4m3fn_to_f32(b),
        ElementType::FLOAT_8_E5M2_FNUZ => numerics::f8e5m2fnuz_to_f32(b),
        ElementType::FLOAT_8_E4M3_FNUZ => numerics::f8e4m3fnuz_to_f32(b),
        _ => numerics::f8e8m0fnu_to_f32(b),
    }
}

/// Whether an actual result element agrees with its reference. Integers
/// must be equal; floats must be bit-equal unless inexact results are
/// allowed, then within `acceptable_fp_delta`. bf16 accumulators beyond
/// ±127 (where bf16 no longer holds every integer) may be off by < 10.
pub fn agree(opts: &E2eOptions, expected: Value, actual: Value) -> Result<bool> {
    opts.validate()?;
    let delta = opts.acceptable_fp_delta;
    Ok(match (expected, actual) {
        (Value::I32(e), Value::I32(a)) => a == e,
        (Value::F16(e), Value::F16(a)) => {
            if a == e {
                true
            } else if opts.max_elements_to_check != 0 {
                // Sampled checks of f16 results stay exact (as upstream).
                false
            } else {
                (numerics::f16_to_f32(a) - numerics::f16_to_f32(e)).abs() < delta
            }
        }
        (Value::Bf16(e), Value::Bf16(a)) => {
            if a == e {
                return Ok(true);
            }
            let (a, e) = (numerics::bf16_to_f32(a), numerics::bf16_to_f32(e));
            if (a.abs() > 127.0 || e.abs() > 127.0) && (a - e).abs() < 10.0 {
                return Ok(true);
            }
            !opts.require_exact_results && (a - e).abs() < delta
        }
        #[allow(clippy::float_cmp)]
        (Value::F32(e), Value::F32(a)) => {
            a == e || (!opts.require_exact_results && (a - e).abs() < delta)
        }
        #[allow(clippy::float_cmp)]
        (Value::F64(e), Value::F64(a)) => {
            a == e || (!opts.require_exact_results && (a - e).abs() < delta as f64)
        }
        (e, a) if std::mem::discriminant(&e) != std::mem::discriminant(&a) => {
            bail!(InvalidArgument, "mismatched types: {e:?} vs {a:?}")
        }
        (e, _) => bail!(
            InvalidArgument,
            "unhandled result value type for comparison: {e:?}"
        ),
    })
}

/// The marks put next to disagreeing elements in printed matrices: on the
/// expected matrix (`good`) and on the actual one.
pub fn highlight(good: bool) -> &'static str {
    if good {
        "🦄"
    } else {
        "🎃"
    }
}

/// The ref `r` as a `T`, or an error naming the argument.
pub(crate) fn downcast<T: RefObject + Clone>(r: &Ref, what: &str) -> Result<T> {
    r.downcast::<T>().cloned().ok_or_else(|| {
        status!(
            InvalidArgument,
            "{what}: expected a different ref type, received !{}",
            r.type_name()
        )
    })
}

/// An element type passed as an i32 argument (`hal.element_type<...>`).
pub(crate) fn element_type_arg(raw: i32, what: &str) -> Result<ElementType> {
    let et = ElementType(raw as u32);
    if !et.is_byte_aligned() || et.element_byte_count() == 0 {
        bail!(
            InvalidArgument,
            "{what}: element type {et} (0x{raw:08X}) is not a whole-byte type"
        );
    }
    Ok(et)
}

/// A dimension passed as an i64 argument; negative ones are rejected.
pub(crate) fn dim_arg(raw: i64, what: &str) -> Result<u64> {
    u64::try_from(raw).map_err(|_| {
        status!(
            InvalidArgument,
            "{what}: expected a dimension >= 0, received {raw}"
        )
    })
}

/// Fails unless `bytes` holds at least `count` elements of `et`.
pub(crate) fn expect_len(bytes: &[u8], count: u64, et: ElementType, what: &str) -> Result<()> {
    let need = et.dense_byte_count(count)?;
    if (bytes.len() as u64) < need {
        bail!(
            InvalidArgument,
            "{what}: expected at least {count} elements of {et} ({need} bytes), the buffer view has {} bytes",
            bytes.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_minstd_rand() {
        // The C++ standard fixes minstd_rand's 10000th value from seed 1.
        let mut g = Lcg::new(1);
        assert_eq!(g.next_u32(), 48271);
        for _ in 1..9999 {
            g.next_u32();
        }
        assert_eq!(g.next_u32(), 399_268_537);
    }

    #[test]
    fn random_fill_uses_the_type_range() {
        let mut b = [0u8; 4 * 64];
        fill_random(ElementType::FLOAT_32, 1, &mut b).unwrap();
        let vals: Vec<f32> = b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        // 48271 % 17 - 8 = 0, 182605794 % 17 - 8 = -3.
        assert_eq!(vals[0], 0.0);
        assert_eq!(vals[1], -3.0);
        assert!(vals
            .iter()
            .all(|v| (-8.0..=8.0).contains(v) && v.fract() == 0.0));
        let mut h = [0u8; 2 * 3];
        fill_random(ElementType::FLOAT_16, 1, &mut h).unwrap();
        // 182605794 % 9 - 4 = 2.
        assert_eq!(numerics::f16_to_f32(u16::from_le_bytes([h[2], h[3]])), 2.0);
        assert!(fill_random(ElementType::INT_4, 1, &mut h).is_err());
    }

    #[test]
    fn check_every_avoids_divisors_of_the_inner_dimension() {
        let o = E2eOptions::default();
        assert_eq!(o.check_every(100, 10), 1);
        // 1000*1000 / 10000 = 100 divides 1000; 101 does not.
        assert_eq!(o.check_every(1_000_000, 1000), 101);
        let all = E2eOptions {
            max_elements_to_check: 0,
            ..o
        };
        assert_eq!(all.check_every(1_000_000, 1000), 1);
    }

    #[test]
    fn agreement_rules() {
        let exact = E2eOptions::default();
        let loose = E2eOptions {
            require_exact_results: false,
            acceptable_fp_delta: 0.1,
            ..exact
        };
        assert!(agree(&exact, Value::F32(1.0), Value::F32(1.0)).unwrap());
        assert!(!agree(&exact, Value::F32(1.0), Value::F32(1.05)).unwrap());
        assert!(agree(&loose, Value::F32(1.0), Value::F32(1.05)).unwrap());
        assert!(!agree(&loose, Value::F32(1.0), Value::F32(1.2)).unwrap());
        assert!(!agree(&exact, Value::I32(3), Value::I32(4)).unwrap());
        // bf16 beyond ±127 tolerates differences under 10.
        let bf = |v: f32| Value::Bf16(numerics::f32_to_bf16(v));
        assert!(agree(&exact, bf(256.0), bf(264.0)).unwrap());
        assert!(!agree(&exact, bf(256.0), bf(272.0)).unwrap());
        assert!(agree(&exact, Value::I32(1), Value::F32(1.0)).is_err());
        let negative = E2eOptions {
            acceptable_fp_delta: -1.0,
            ..exact
        };
        assert!(agree(&negative, Value::F32(1.0), Value::F32(1.0)).is_err());
    }
}
