//! The f32 and f64 arithmetic, math, comparison and conversion ops, as one
//! table: each row names the f32 op and the f64 op and gives their meaning
//! once, over the row's float type `T` (see [`numeric`](super::numeric) for
//! the row shapes). Loads, stores, constants, selects and switches of floats
//! share their arms with the integer ops of the same width.

use crate::bytecode::cmath;

/// What the table's rows need of a float type beyond `std`'s methods.
pub(super) trait Float: Copy {
    /// C's `remainder` (IEEE remainder, quotient rounded to nearest even).
    fn ieee_rem(self, rhs: Self) -> Self;
    /// C's `erf`.
    fn erf(self) -> Self;
    /// The `cast.f*.ui64` result: upstream rounds an f32 to an unsigned
    /// 64-bit integer (`roundf`, then a cast to `uint64_t`), but an f64
    /// through `llround` (signed), so the two differ outside i64's range.
    fn round_to_ui64(self) -> i64;
}

impl Float for f32 {
    #[inline(always)]
    fn ieee_rem(self, rhs: f32) -> f32 {
        libm::remainderf(self, rhs)
    }
    #[inline(always)]
    fn erf(self) -> f32 {
        cmath::erff(self)
    }
    #[inline(always)]
    fn round_to_ui64(self) -> i64 {
        self.round() as u64 as i64
    }
}

impl Float for f64 {
    #[inline(always)]
    fn ieee_rem(self, rhs: f64) -> f64 {
        libm::remainder(self, rhs)
    }
    #[inline(always)]
    fn erf(self) -> f64 {
        cmath::erf(self)
    }
    #[inline(always)]
    fn round_to_ui64(self) -> i64 {
        self.round() as i64
    }
}

/// Hands the float op table to `$cb!` (after the tokens `$acc`), one row
/// per op: `shape [type] Op |operands| value;`. Each row below is written
/// once and expanded for f32 and f64.
macro_rules! with_float_ops {
    ($cb:ident! { $($acc:tt)* }) => {
        $crate::bytecode::interp::ops_float::float_pairs! { $cb { $($acc)* }
            binary AddF32 AddF64 |a, b| a + b;
            binary SubF32 SubF64 |a, b| a - b;
            binary MulF32 MulF64 |a, b| a * b;
            binary DivF32 DivF64 |a, b| a / b;
            binary RemF32 RemF64 |a, b| Float::ieee_rem(a, b);
            // Not `f*::min`/`max`: these return the first operand when
            // either is NaN and prefer it on ties, as C's comparisons do.
            binary MinF32 MinF64 |a, b| if b < a { b } else { a };
            binary MaxF32 MaxF64 |a, b| if a < b { b } else { a };
            binary Atan2F32 Atan2F64 |a, b| a.atan2(b);
            binary PowF32 PowF64 |a, b| a.powf(b);
            ternary FMAF32 FMAF64 |a, b, c| a * b + c;
            unary AbsF32 AbsF64 |x| x.abs();
            unary NegF32 NegF64 |x| -x;
            unary CeilF32 CeilF64 |x| x.ceil();
            unary FloorF32 FloorF64 |x| x.floor();
            unary RoundF32 RoundF64 |x| x.round();
            unary RoundF32Even RoundF64Even |x| x.round_ties_even();
            unary AtanF32 AtanF64 |x| x.atan();
            unary CosF32 CosF64 |x| x.cos();
            unary SinF32 SinF64 |x| x.sin();
            unary ExpF32 ExpF64 |x| x.exp();
            unary Exp2F32 Exp2F64 |x| x.exp2();
            unary ExpM1F32 ExpM1F64 |x| x.exp_m1();
            unary LogF32 LogF64 |x| x.ln();
            unary Log10F32 Log10F64 |x| x.log10();
            unary Log1pF32 Log1pF64 |x| x.ln_1p();
            unary Log2F32 Log2F64 |x| x.log2();
            unary RsqrtF32 RsqrtF64 |x| 1.0 / x.sqrt();
            unary SqrtF32 SqrtF64 |x| x.sqrt();
            unary TanhF32 TanhF64 |x| x.tanh();
            unary ErfF32 ErfF64 |x| Float::erf(x);
            // Ordered (`O`) compares are false for NaN operands, unordered
            // (`U`) ones true; C's `!=` is true for unordered operands.
            compare CmpEQF32O CmpEQF64O |a, b| a == b;
            compare CmpEQF32U CmpEQF64U |a, b| a.is_nan() || b.is_nan() || a == b;
            compare CmpNEF32O CmpNEF64O |a, b| a != b;
            compare CmpNEF32U CmpNEF64U |a, b| a.is_nan() || b.is_nan() || a != b;
            compare CmpLTF32O CmpLTF64O |a, b| a < b;
            compare CmpLTF32U CmpLTF64U |a, b| a.is_nan() || b.is_nan() || a < b;
            compare CmpLTEF32O CmpLTEF64O |a, b| a <= b;
            compare CmpLTEF32U CmpLTEF64U |a, b| a.is_nan() || b.is_nan() || a <= b;
            test CmpNaNF32 CmpNaNF64 |x| x.is_nan();
            convert<i32, T> CastSI32F32 CastSI32F64 |x| x as T;
            convert<u32, T> CastUI32F32 CastUI32F64 |x| x as T;
            convert<i64, T> CastSI64F32 CastSI64F64 |x| x as T;
            convert<u64, T> CastUI64F32 CastUI64F64 |x| x as T;
            // Upstream rounds these through f32 (`lroundf`) for both widths.
            convert<T, i32> CastF32SI32 CastF64SI32 |x| (x as f32).round() as i64 as i32;
            convert<T, u32> CastF32UI32 CastF64UI32 |x| (x as f32).round() as i64 as u32;
            convert<T, i64> CastF32SI64 CastF64SI64 |x| x.round() as i64;
            convert<T, i64> CastF32UI64 CastF64UI64 |x| Float::round_to_ui64(x);
        }
    };
}
pub(super) use with_float_ops;

/// Expands each `shape F32Op F64Op |..| value;` row of [`with_float_ops`]
/// into an f32 row and an f64 row for `$cb!`.
macro_rules! float_pairs {
    ($cb:ident { $($acc:tt)* }
     $( $shape:ident $(<$from:ty, $to:ty>)? $a:ident $b:ident |$($x:ident),*| $e:expr; )*) => {
        $cb! { $($acc)*
            $(
                $shape $(<$from, $to>)? [f32] $a |$($x),*| $e;
                $shape $(<$from, $to>)? [f64] $b |$($x),*| $e;
            )*
        }
    };
}
pub(super) use float_pairs;
