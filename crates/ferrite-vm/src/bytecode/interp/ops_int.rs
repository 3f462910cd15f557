//! The i32 and i64 arithmetic, bitwise, shift and comparison ops, as one
//! table: each row names the i32 op and the i64 op and gives their meaning
//! once, over the row's integer type `T` (signed or unsigned as the op
//! reads its operands; see [`numeric`](super::numeric) for the shapes).

/// Hands the integer op table to `$cb!` (after the tokens `$acc`), one row
/// per op: `shape [type] Op |operands| value;`.
macro_rules! with_int_ops {
    ($cb:ident! { $($acc:tt)* }) => {
        $crate::bytecode::interp::ops_int::int_pairs! { $cb { $($acc)* }
            [i32, i64] binary AddI32 AddI64 |a, b| a.wrapping_add(b);
            [i32, i64] binary SubI32 SubI64 |a, b| a.wrapping_sub(b);
            [i32, i64] binary MulI32 MulI64 |a, b| a.wrapping_mul(b);
            [i32, i64] ternary FMAI32 FMAI64 |a, b, c| a.wrapping_mul(b).wrapping_add(c);
            // Division by zero fails the invocation; MIN / -1 wraps.
            [i32, i64] checked DivI32S DivI64S |a, b| (b != 0).then(|| a.wrapping_div(b));
            [u32, u64] checked DivI32U DivI64U |a, b| a.checked_div(b);
            [i32, i64] checked RemI32S RemI64S |a, b| (b != 0).then(|| a.wrapping_rem(b));
            [u32, u64] checked RemI32U RemI64U |a, b| a.checked_rem(b);
            [i32, i64] unary AbsI32 AbsI64 |x| x.wrapping_abs();
            [i32, i64] binary MinI32S MinI64S |a, b| a.min(b);
            [u32, u64] binary MinI32U MinI64U |a, b| a.min(b);
            [i32, i64] binary MaxI32S MaxI64S |a, b| a.max(b);
            [u32, u64] binary MaxI32U MaxI64U |a, b| a.max(b);
            [u32, u64] unary NotI32 NotI64 |x| !x;
            [u32, u64] binary AndI32 AndI64 |a, b| a & b;
            [u32, u64] binary OrI32 OrI64 |a, b| a | b;
            [u32, u64] binary XorI32 XorI64 |a, b| a ^ b;
            [u32, u64] unary CtlzI32 CtlzI64 |x| x.leading_zeros() as T;
            // The shift amount is an i32 register, taken modulo the width.
            [u32, u64] shift ShlI32 ShlI64 |a, s| a << (s & (T::BITS - 1));
            [i32, i64] shift ShrI32S ShrI64S |a, s| a >> (s & (T::BITS - 1));
            [u32, u64] shift ShrI32U ShrI64U |a, s| a >> (s & (T::BITS - 1));
            [u32, u64] compare CmpEQI32 CmpEQI64 |a, b| a == b;
            [u32, u64] compare CmpNEI32 CmpNEI64 |a, b| a != b;
            [i32, i64] compare CmpLTI32S CmpLTI64S |a, b| a < b;
            [u32, u64] compare CmpLTI32U CmpLTI64U |a, b| a < b;
            [u32, u64] test CmpNZI32 CmpNZI64 |x| x != 0;
        }
    };
}
pub(super) use with_int_ops;

/// Expands each `[narrow, wide] shape I32Op I64Op |..| value;` row of
/// [`with_int_ops`] into a 32-bit row and a 64-bit row for `$cb!`.
macro_rules! int_pairs {
    ($cb:ident { $($acc:tt)* }
     $( [$n:ty, $w:ty] $shape:ident $a:ident $b:ident |$($x:ident),*| $e:expr; )*) => {
        $cb! { $($acc)*
            $(
                $shape [$n] $a |$($x),*| $e;
                $shape [$w] $b |$($x),*| $e;
            )*
        }
    };
}
pub(super) use int_pairs;

/// The error of an integer division or remainder by zero.
pub(crate) fn div_zero(op: super::super::isa::Op) -> ferrite_base::Status {
    ferrite_base::status!(
        InvalidArgument,
        "{}: integer division by zero",
        op.mnemonic()
    )
}
