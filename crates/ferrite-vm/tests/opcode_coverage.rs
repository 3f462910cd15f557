//! The "every opcode is covered" gate: runs every exported function of every
//! fixture with coverage recording, unions the ops executed, and fails
//! listing each op of `ferrite_vm::bytecode::isa::ALL_OPS` that never ran.
//!
//! Functions taking arguments get representative inputs (see `args_for`);
//! functions may fail (`fail_*`): the ops they ran before failing count.

mod common;

use ferrite_vm::bytecode::isa::{Op, ALL_OPS};
use ferrite_vm::cconv::CconvType;
use ferrite_vm::{Module, Poll, Variant};
use std::collections::BTreeSet;

/// Argument lists to call `function` with: explicit ones for functions whose
/// behaviour depends on the value, else every argument set to one.
fn args_for(function: &str, types: &[CconvType]) -> Option<Vec<Vec<Variant>>> {
    use Variant::*;
    Some(match function {
        "switch_i64_wide" => vec![vec![I32(0)], vec![I32(1)], vec![I32(2)]],
        "collatz_steps" => vec![vec![I32(27)]],
        "divmod_i32" => vec![vec![I32(17)], vec![I32(-5)]]
            .into_iter()
            .map(|mut v| {
                v.push(I32(3));
                v
            })
            .collect(),
        _ => {
            let mut v = Vec::new();
            for t in types {
                v.push(match t {
                    CconvType::I32 => I32(1),
                    CconvType::I64 => I64(1),
                    CconvType::F32 => F32(1.0),
                    CconvType::F64 => F64(1.0),
                    CconvType::Ref => Null,
                    CconvType::Span(_) => return None,
                });
            }
            vec![v]
        }
    })
}

#[test]
fn every_opcode_executes() {
    let mut covered: BTreeSet<Op> = BTreeSet::new();
    let mut runs = 0usize;
    let mut not_run = Vec::new();
    let fixtures = common::fixtures();
    for (name, _) in &fixtures {
        let instance = common::fixture_instance();
        let module = common::load_fixture(&instance, name);
        for export in module.exports().to_vec() {
            // __init/__deinit run on register/drop outside recording; they are
            // exports too, so calling them here counts their ops.
            let ctx = common::context_for(&instance, module.clone())
                .unwrap_or_else(|e| panic!("{name}: cannot create context: {e}"));
            let f = ctx
                .lookup_function(&export.name)
                .unwrap_or_else(|e| panic!("{name}.{}: {e}", export.name));
            let Some(arg_lists) = args_for(&export.name, &f.cconv.args) else {
                not_run.push(format!("{name}.{} (variadic)", export.name));
                continue;
            };
            for args in arg_lists {
                let mut inv = match ctx.begin(&f, args) {
                    Ok(i) => i,
                    Err(e) => {
                        not_run.push(format!("{name}.{}: {e}", export.name));
                        continue;
                    }
                };
                inv.record_coverage();
                runs += 1;
                let mut steps = 0;
                loop {
                    match inv.step() {
                        Ok(Poll::Done(_)) | Err(_) => break,
                        Ok(Poll::Pending(w)) => {
                            if !w.sources.is_empty() {
                                let _ = ferrite_base::wait::wait_sources(
                                    &w.sources, w.mode, w.deadline,
                                );
                            }
                            steps += 1;
                            assert!(steps < 1_000_000, "{name}.{} never finishes", export.name);
                        }
                    }
                }
                covered.extend(inv.take_coverage());
            }
        }
    }
    let missing: Vec<&str> = ALL_OPS
        .iter()
        .filter(|op| !covered.contains(op))
        .map(|op| op.mnemonic())
        .collect();
    println!(
        "opcode_coverage: {} fixtures, {runs} invocations, {}/{} ops executed",
        fixtures.len(),
        ALL_OPS.len() - missing.len(),
        ALL_OPS.len()
    );
    if !not_run.is_empty() {
        println!("not run: {}", not_run.join("; "));
    }
    assert!(
        missing.is_empty(),
        "{} of {} ops never executed by any fixture function: {}",
        missing.len(),
        ALL_OPS.len(),
        missing.join(", ")
    );
}

/// Coverage is specific: one small function records its own ops only.
#[test]
fn coverage_records_only_executed_ops() {
    let instance = common::fixture_instance();
    let module = common::load_fixture(&instance, "globals");
    let ctx = common::context_for(&instance, module).unwrap();
    let f = ctx.lookup_function("counter_next").unwrap();
    let mut inv = ctx.begin(&f, Vec::new()).unwrap();
    inv.record_coverage();
    match inv.step().unwrap() {
        Poll::Done(v) => assert_eq!(v, vec![Variant::I32(1)]),
        Poll::Pending(w) => panic!("counter_next yielded: {w:?}"),
    }
    let ops: BTreeSet<&str> = inv.take_coverage().iter().map(|o| o.mnemonic()).collect();
    for want in ["global.load.i32", "global.store.i32", "add.i32", "return"] {
        assert!(ops.contains(want), "{want} missing from {ops:?}");
    }
    assert!(
        ops.len() <= 8,
        "too many ops recorded for counter_next: {ops:?}"
    );
    assert!(!ops.contains("buffer.alloc"), "{ops:?}");
    // take_coverage resets the record.
    assert!(inv.take_coverage().is_empty());
}
