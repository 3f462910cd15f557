//! The compiling tier's allow-list (`ferrite_vm::bytecode::jit::compiles`)
//! against what the tier does with the fixture programs under `tests/vm`:
//!
//! - every op on the list is translated (code emitted for it) in some
//!   compiled fixture function, so the list claims nothing the translator
//!   does not do;
//! - every function using an op off the list stays interpreted, naming that
//!   op, and never enters compiled code when its exports run; and every op
//!   off the list occurs in some fixture, so that half is exercised for each.
#![cfg(feature = "jit")]

mod common;

use ferrite_vm::bytecode::isa::{Op, ALL_OPS, FUSED_OPS};
use ferrite_vm::bytecode::jit::{compiles, FunctionTier};
use ferrite_vm::cconv::CconvType;
use ferrite_vm::{BytecodeModule, Module, ModuleBytes};
use std::collections::BTreeSet;
use std::sync::Arc;

fn every_op() -> impl Iterator<Item = Op> {
    FUSED_OPS.into_iter().chain(ALL_OPS)
}

/// Every fixture, loaded with the compiling tier on.
fn fixture_modules() -> Vec<(String, Arc<BytecodeModule>)> {
    let instance = common::fixture_instance();
    common::fixtures()
        .into_iter()
        .map(|(name, path)| {
            let bytes = std::fs::read(&path).expect("read fixture");
            let m = BytecodeModule::load(&instance, ModuleBytes::from_vec(bytes)).expect("load");
            assert!(m.jit().is_some(), "{name}: the tier is on by default");
            (name, m)
        })
        .collect()
}

#[test]
fn every_op_on_the_allow_list_is_translated() {
    let mut translated = BTreeSet::new();
    for (name, m) in fixture_modules() {
        let jit = m.jit().expect("tier on");
        for op in &jit.translated_ops {
            assert!(
                compiles(*op),
                "{name}: {} translated but not on the allow-list",
                op.mnemonic()
            );
        }
        translated.extend(jit.translated_ops.iter().copied());
    }
    let missing: Vec<String> = every_op()
        .filter(|op| compiles(*op) && !translated.contains(op))
        .map(|op| format!("{op:?} ({})", op.mnemonic()))
        .collect();
    assert!(
        missing.is_empty(),
        "on the allow-list but translated in no fixture function ({} of {}): {}",
        missing.len(),
        every_op().filter(|op| compiles(*op)).count(),
        missing.join(", ")
    );
}

#[test]
fn ops_off_the_allow_list_keep_their_function_interpreted() {
    let mut seen_off_list = BTreeSet::new();
    let mut entered_checked = 0usize;
    for (name, m) in fixture_modules() {
        let jit = m.jit().expect("tier on");
        let names = m.function_names();
        let mut off_list_functions = BTreeSet::new();
        for (i, f) in m.functions().iter().enumerate() {
            let Some(first) = f.insns.iter().map(|i| i.op()).find(|op| !compiles(*op)) else {
                continue;
            };
            seen_off_list.extend(f.insns.iter().map(|i| i.op()).filter(|op| !compiles(*op)));
            off_list_functions.insert(names[i].clone());
            let expected = format!("uses {} (not on the allow-list)", first.mnemonic());
            match &jit.tiers[i] {
                FunctionTier::Interpreted(why) => {
                    assert_eq!(why, &expected, "{name}.{}", names[i])
                }
                FunctionTier::Compiled { .. } => {
                    panic!("{name}.{} compiled although it {expected}", names[i])
                }
            }
        }
        // Run the exports that use such ops: they must run, and never in
        // compiled code.
        let instance = common::fixture_instance();
        let loaded = common::load_fixture(&instance, &name);
        let ljit = loaded.jit().expect("tier on");
        for e in loaded.exports().to_vec() {
            if !off_list_functions.contains(&e.name) {
                continue;
            }
            let Some(idx) = names.iter().position(|n| n == &e.name) else {
                continue;
            };
            let Ok(cconv) = ferrite_vm::cconv::Cconv::parse(&e.signature.cconv) else {
                continue;
            };
            if cconv.args.iter().any(|t| matches!(t, CconvType::Span(_))) {
                continue;
            }
            let Ok(ctx) = common::context_for(&instance, loaded.clone()) else {
                continue;
            };
            let args = cconv
                .args
                .iter()
                .map(|t| match t {
                    CconvType::I32 => ferrite_vm::Variant::I32(1),
                    CconvType::I64 => ferrite_vm::Variant::I64(1),
                    CconvType::F32 => ferrite_vm::Variant::F32(1.0),
                    CconvType::F64 => ferrite_vm::Variant::F64(1.0),
                    _ => ferrite_vm::Variant::Null,
                })
                .collect();
            let f = ctx.lookup_function(&e.name).expect("lookup");
            // The outcome may be a failure (fail_* exports); what matters is
            // which tier ran the body.
            let _ = ctx.invoke(&f, args);
            assert_eq!(
                ljit.entered(idx),
                0,
                "{name}.{} entered compiled code",
                e.name
            );
            entered_checked += 1;
        }
    }
    let never: Vec<String> = every_op()
        .filter(|op| !compiles(*op) && !seen_off_list.contains(op))
        .map(|op| format!("{op:?} ({})", op.mnemonic()))
        .collect();
    assert!(
        never.is_empty(),
        "ops off the allow-list no fixture function uses: {}",
        never.join(", ")
    );
    assert!(
        entered_checked > 0,
        "no export using an op off the list ran"
    );
}
