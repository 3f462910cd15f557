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
//! These are the operand layouts the ISA gives the ops of each shape, so
//! the verifier checked every register read here for the bank it is read
//! as (the interpreter's half of the contract in [`super`]'s docs).

/// One table row as an expression of type `Result<()>`, over the op's
/// verified operands `$r` and the frame's [`Registers`](super::registers::Registers) `$regs`.
macro_rules! numeric {
    (@read $regs:ident, $t:ty, $reg:expr) => {
        // SAFETY: `$reg` is an operand of the executing function's
        // instruction, read with the bank the ISA declares for it (this
        // shape's layout above), so `Registers`' contract holds.
        unsafe { <$t as $crate::bytecode::interp::registers::Slot>::read($regs, $reg) }
    };
    (@write $regs:ident, $t:ty, $reg:expr, $v:expr) => {{
        let v: $t = $v;
        // SAFETY: as for `@read`: a verified result operand of this bank.
        unsafe { <$t as $crate::bytecode::interp::registers::Slot>::write($regs, $reg, v) }
    }};
    ($regs:ident, $r:ident, $op:ident; unary [$t:ty] |$x:ident| $e:expr) => {{
        type T = $t;
        let $x = numeric!(@read $regs, T, $r[0]);
        numeric!(@write $regs, T, $r[1], $e);
        Ok(())
    }};
    ($regs:ident, $r:ident, $op:ident; binary [$t:ty] |$a:ident, $b:ident| $e:expr) => {{
        type T = $t;
        let ($a, $b) = (numeric!(@read $regs, T, $r[0]), numeric!(@read $regs, T, $r[1]));
        numeric!(@write $regs, T, $r[2], $e);
        Ok(())
    }};
    ($regs:ident, $r:ident, $op:ident; ternary [$t:ty] |$a:ident, $b:ident, $c:ident| $e:expr) => {{
        type T = $t;
        let $a = numeric!(@read $regs, T, $r[0]);
        let $b = numeric!(@read $regs, T, $r[1]);
        let $c = numeric!(@read $regs, T, $r[2]);
        numeric!(@write $regs, T, $r[3], $e);
        Ok(())
    }};
    ($regs:ident, $r:ident, $op:ident; checked [$t:ty] |$a:ident, $b:ident| $e:expr) => {{
        type T = $t;
        let ($a, $b) = (numeric!(@read $regs, T, $r[0]), numeric!(@read $regs, T, $r[1]));
        let v: Option<T> = $e;
        match v {
            Some(v) => {
                numeric!(@write $regs, T, $r[2], v);
                Ok(())
            }
            None => Err($crate::bytecode::interp::ops_int::div_zero(Op::$op)),
        }
    }};
    ($regs:ident, $r:ident, $op:ident; shift [$t:ty] |$a:ident, $s:ident| $e:expr) => {{
        type T = $t;
        let ($a, $s) = (numeric!(@read $regs, T, $r[0]), numeric!(@read $regs, u32, $r[1]));
        numeric!(@write $regs, T, $r[2], $e);
        Ok(())
    }};
    ($regs:ident, $r:ident, $op:ident; compare [$t:ty] |$a:ident, $b:ident| $e:expr) => {{
        type T = $t;
        let ($a, $b) = (numeric!(@read $regs, T, $r[0]), numeric!(@read $regs, T, $r[1]));
        let v: bool = $e;
        numeric!(@write $regs, u32, $r[2], v as u32);
        Ok(())
    }};
    ($regs:ident, $r:ident, $op:ident; test [$t:ty] |$x:ident| $e:expr) => {{
        type T = $t;
        let $x = numeric!(@read $regs, T, $r[0]);
        let v: bool = $e;
        numeric!(@write $regs, u32, $r[1], v as u32);
        Ok(())
    }};
    ($regs:ident, $r:ident, $op:ident; convert <$from:ty, $to:ty> [$t:ty] |$x:ident| $e:expr) => {{
        type T = $t;
        let $x = numeric!(@read $regs, $from, $r[0]);
        numeric!(@write $regs, $to, $r[1], $e);
        Ok(())
    }};
}
pub(super) use numeric;
