//! The compiling tier against the interpreter: every exported function of
//! every fixture program under `tests/vm` (those taking no arguments) runs
//! once with the tier on and once with it off, and must give the same
//! results, or fail with the same status, message and backtrace
//! (`module.function@offset` per frame). Also checks that the tier does
//! compile what it covers.
#![cfg(feature = "jit")]

mod common;

use ferrite_vm::instance::InstanceOptions;
use ferrite_vm::{BytecodeModule, Instance, Module, ModuleBytes, Variant};

fn instance(jit: bool) -> Instance {
    let i = Instance::new(InstanceOptions {
        jit,
        ..InstanceOptions::default()
    });
    i.types().register_type::<common::FakeFence>("hal.fence");
    i
}

fn show(r: &ferrite_base::Result<Vec<Variant>>) -> String {
    match r {
        Ok(v) => v
            .iter()
            .map(|x| match x {
                Variant::F32(f) => format!("f32:{:#x}", f.to_bits()),
                Variant::F64(f) => format!("f64:{:#x}", f.to_bits()),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>()
            .join(","),
        Err(e) => format!("error: {e}"),
    }
}

#[test]
fn both_tiers_agree_on_every_fixture_function() {
    let (on, off) = (instance(true), instance(false));
    let mut compared = 0usize;
    let mut compiled = 0usize;
    let mut problems = Vec::new();
    for (name, path) in common::fixtures() {
        let bytes = std::fs::read(&path).expect("read fixture");
        let mj = BytecodeModule::load(&on, ModuleBytes::from_vec(bytes.clone())).expect("load");
        let mi = BytecodeModule::load(&off, ModuleBytes::from_vec(bytes)).expect("load");
        assert!(mi.jit().is_none(), "the tier is off for {name}");
        compiled += mj.jit().map_or(0, |j| j.compiled_count());
        for e in mj.exports() {
            if !e.signature.cconv.starts_with("0v") {
                continue;
            }
            let (Ok(cj), Ok(ci)) = (
                common::context_for(&on, mj.clone()),
                common::context_for(&off, mi.clone()),
            ) else {
                continue;
            };
            let (fj, fi) = (
                cj.lookup_function(&e.name).expect("lookup"),
                ci.lookup_function(&e.name).expect("lookup"),
            );
            let (rj, ri) = (cj.invoke(&fj, Vec::new()), ci.invoke(&fi, Vec::new()));
            compared += 1;
            if show(&rj) != show(&ri) {
                problems.push(format!(
                    "{name}.{}:\n  compiled:    {}\n  interpreted: {}",
                    e.name,
                    show(&rj),
                    show(&ri)
                ));
            }
        }
    }
    println!("{compared} functions compared; {compiled} functions compiled");
    assert!(
        problems.is_empty(),
        "tiers differ:\n{}",
        problems.join("\n")
    );
    assert!(compared > 50, "only {compared} functions compared");
    assert!(compiled > 20, "only {compiled} functions compiled");
}

/// A division by zero three compiled frames deep fails as the interpreter
/// fails: same status, message and backtrace.
#[test]
fn traps_in_nested_compiled_calls_name_every_frame() {
    let (on, off) = (instance(true), instance(false));
    let src = common::fixture_path("traps");
    let bytes = std::fs::read(src).expect("read fixture");
    let mj = BytecodeModule::load(&on, ModuleBytes::from_vec(bytes.clone())).expect("load");
    let mi = BytecodeModule::load(&off, ModuleBytes::from_vec(bytes)).expect("load");
    let report = mj.tier_report();
    assert!(report.contains("compiled ("), "nothing compiled:\n{report}");
    let mut checked = 0;
    for e in mj.exports().iter().filter(|e| e.name.starts_with("fail_")) {
        let cj = common::context_for(&on, mj.clone()).expect("context");
        let ci = common::context_for(&off, mi.clone()).expect("context");
        let rj = cj.invoke(&cj.lookup_function(&e.name).unwrap(), Vec::new());
        let ri = ci.invoke(&ci.lookup_function(&e.name).unwrap(), Vec::new());
        let (ej, ei) = (rj.expect_err("must fail"), ri.expect_err("must fail"));
        assert_eq!(ej.code(), ei.code(), "{}", e.name);
        assert_eq!(ej.backtrace(), ei.backtrace(), "{}", e.name);
        assert_eq!(ej.to_string(), ei.to_string(), "{}", e.name);
        checked += 1;
    }
    assert!(checked > 0);
}
