//! The shapes of the numeric op tables ([`super::ops_int`],
//! [`super::ops_float`]): where a row's operands and result are, and in
//! which type each is read and written.
//!
//! | shape              | reads (registers)         | writes   |
//! |--------------------|---------------------------|----------|
//! | `unary`            | `T` r0                    | `T` r1   |
//! | `binary`           | `T` r0, r1                | `T` r2   |
//! | `ternary`          | `T` r0, r1, r2            | `T` r3   |
//! | `checked`          | `T` r0, r1 (value: `Option<T>`, `None` fails as division by zero) | `T` r2 |
//! | `shift`            | `T` r0, `u32` r1          | `T` r2   |
//! | `compare`          | `T` r0, r1 (value: bool)  | `i32` r2 |
//! | `test`             | `T` r0 (value: bool)      | `i32` r1 |
//! | `convert<F, U>`    | `F` r0                    | `U` r1   |
//!
//! Every shape reads one register per value operand and writes one result,
//! so a row's registers are its operand names then the result. These are
//! the operand layouts the ISA gives the ops of each shape; that each is
//! read with its bank is checked by the compiler, not trusted (see
//! [`super`]'s docs).

/// One table row as an expression of type `Result<()>`, over the op's
/// register operands, bound by [`op_match!`](super::dispatch) to the
/// row's operand names (`|a, b|`: the registers, shadowed by their values
/// once read) and `$out` (the result register), and the frame's
/// [`Registers`](super::registers::Registers) `$regs`.
///
/// Reads and writes go through [`Slot`](super::registers::Slot), whose
/// register type is the bank of the value type: each operand's type in the
/// decoded op is the bank the ISA gives it, so a row whose type disagrees
/// with the ISA does not compile.
macro_rules! numeric {
    (@read $regs:ident, $t:ty, $reg:expr) => {
        // SAFETY: `$reg` is an operand of the executing function's
        // instruction, and `$regs` is that function's window; its type
        // (`Reg` of `$t`'s bank) carries the verifier's width check, so
        // `Registers`' contract holds.
        unsafe { <$t as $crate::bytecode::interp::registers::Slot>::read($regs, $reg) }
    };
    (@write $regs:ident, $t:ty, $reg:expr, $v:expr) => {{
        let v: $t = $v;
        // SAFETY: as for `@read`: a verified result operand of `$t`'s bank.
        unsafe { <$t as $crate::bytecode::interp::registers::Slot>::write($regs, $reg, v) }
    }};
    ($regs:ident, $out:ident, $op:ident; unary [$t:ty] |$x:ident| $e:expr) => {{
        type T = $t;
        let $x = numeric!(@read $regs, T, $x);
        numeric!(@write $regs, T, $out, $e);
        Ok(())
    }};
    ($regs:ident, $out:ident, $op:ident; binary [$t:ty] |$a:ident, $b:ident| $e:expr) => {{
        type T = $t;
        let ($a, $b) = (numeric!(@read $regs, T, $a), numeric!(@read $regs, T, $b));
        numeric!(@write $regs, T, $out, $e);
        Ok(())
    }};
    ($regs:ident, $out:ident, $op:ident; ternary [$t:ty] |$a:ident, $b:ident, $c:ident| $e:expr) => {{
        type T = $t;
        let $a = numeric!(@read $regs, T, $a);
        let $b = numeric!(@read $regs, T, $b);
        let $c = numeric!(@read $regs, T, $c);
        numeric!(@write $regs, T, $out, $e);
        Ok(())
    }};
    ($regs:ident, $out:ident, $op:ident; checked [$t:ty] |$a:ident, $b:ident| $e:expr) => {{
        type T = $t;
        let ($a, $b) = (numeric!(@read $regs, T, $a), numeric!(@read $regs, T, $b));
        let v: Option<T> = $e;
        match v {
            Some(v) => {
                numeric!(@write $regs, T, $out, v);
                Ok(())
            }
            None => Err($crate::bytecode::interp::ops_int::div_zero(Op::$op)),
        }
    }};
    ($regs:ident, $out:ident, $op:ident; shift [$t:ty] |$a:ident, $s:ident| $e:expr) => {{
        type T = $t;
        let ($a, $s) = (numeric!(@read $regs, T, $a), numeric!(@read $regs, u32, $s));
        numeric!(@write $regs, T, $out, $e);
        Ok(())
    }};
    ($regs:ident, $out:ident, $op:ident; compare [$t:ty] |$a:ident, $b:ident| $e:expr) => {{
        type T = $t;
        let ($a, $b) = (numeric!(@read $regs, T, $a), numeric!(@read $regs, T, $b));
        let v: bool = $e;
        numeric!(@write $regs, u32, $out, v as u32);
        Ok(())
    }};
    ($regs:ident, $out:ident, $op:ident; test [$t:ty] |$x:ident| $e:expr) => {{
        type T = $t;
        let $x = numeric!(@read $regs, T, $x);
        let v: bool = $e;
        numeric!(@write $regs, u32, $out, v as u32);
        Ok(())
    }};
    ($regs:ident, $out:ident, $op:ident; convert <$from:ty, $to:ty> [$t:ty] |$x:ident| $e:expr) => {{
        type T = $t;
        let $x = numeric!(@read $regs, $from, $x);
        numeric!(@write $regs, $to, $out, $e);
        Ok(())
    }};
}
pub(super) use numeric;
