//! Native modules used by tests and the CLI's conformance runs.

use crate::native::{ArgReader, NativeModule, NativeModuleBuilder};
use crate::stack::{NativePoll, Wait};
use crate::value::Variant;
use ferrite_base::Result;
use std::sync::Arc;

/// Per-call progress saved across yields: (remaining yields, accumulator).
type Progress = (i32, i32);

fn step_progress(
    call: &mut crate::stack::NativeCall,
    start: impl FnOnce(&crate::stack::NativeCall) -> Result<Progress>,
) -> Result<NativePoll> {
    let (mut left, mut acc) = match call.saved.take() {
        Some(b) => *b
            .downcast::<Progress>()
            .map_err(|_| ferrite_base::status!(Internal, "bad saved state"))?,
        None => start(call)?,
    };
    if left > 0 {
        left -= 1;
        acc += 1;
        call.saved = Some(Box::new((left, acc)));
        return Ok(NativePoll::Pending(Wait::yield_now()));
    }
    Ok(NativePoll::Ready(vec![Variant::I32(acc)]))
}

/// The `yieldable_test` module that upstream's `async_ops` test program
/// imports: `yield_n(arg, n)` yields `n` times and returns `arg + n`;
/// `yield_variadic_sum(args..., n)` yields `n` times and returns
/// `sum(args) + n`.
pub fn yieldable_test_module() -> Result<Arc<NativeModule>> {
    let b = NativeModuleBuilder::new("yieldable_test", 0);
    let b = b
        .function("yield_n", "0ii_i", |call| {
            step_progress(call, |c| {
                let mut a = ArgReader::new(c);
                let (arg, n) = (a.i32()?, a.i32()?);
                Ok((n, arg))
            })
        })
        .and_then(|b| {
            b.function("yield_variadic_sum", "0CiDi_i", |call| {
                step_progress(call, |c| {
                    let mut a = ArgReader::new(c);
                    let count = a.i32()?;
                    let mut sum = 0i32;
                    for _ in 0..count {
                        sum = sum.wrapping_add(a.i32()?);
                    }
                    let n = a.i32()?;
                    Ok((n, sum))
                })
            })
        });
    Ok(b?.build())
}

/// Whether internal function `i` of a verified module surely terminates:
/// every branch in it and in the internal functions it reaches goes
/// forward, and their calls form no cycle (imports aside). Differential
/// runs of mutated bytecode (the `jit_diff` fuzz target, the mutants test)
/// run only such functions, so a mutation that makes a loop cannot hang
/// them.
pub fn terminates(functions: &[crate::bytecode::verifier::DecodedFunction], i: usize) -> bool {
    terminates_from(functions, i, &mut Vec::new())
}

fn terminates_from(
    functions: &[crate::bytecode::verifier::DecodedFunction],
    i: usize,
    visiting: &mut Vec<usize>,
) -> bool {
    use crate::bytecode::isa::Op;
    use crate::bytecode::verifier::{branch_targets, IMPORT_BIT};
    if visiting.contains(&i) || visiting.len() > 16 {
        return false;
    }
    let Some(f) = functions.get(i) else {
        return false;
    };
    let forward = f.insns.iter().enumerate().all(|(pc, insn)| {
        branch_targets(&f.pool, insn).is_some_and(|targets| targets.iter().all(|&t| t > pc))
    });
    if !forward {
        return false;
    }
    visiting.push(i);
    let ok = f.insns.iter().all(|insn| {
        !matches!(insn.op(), Op::Call | Op::CallYieldable)
            || insn.a & IMPORT_BIT != 0
            || terminates_from(functions, insn.a as usize, visiting)
    });
    visiting.pop();
    ok
}
