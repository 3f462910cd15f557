//! The compiling tier against the interpreter: every exported function of
//! every fixture program under `tests/vm` (those taking no arguments, or only
//! scalars: then with several argument rows) runs once with the tier on and
//! once with it off, and must give the same results, or fail with the same
//! status, message and backtrace (`module.function@offset` per frame). Also
//! checks that the tier does compile what it covers, and that each compared
//! call of a compiled export really entered compiled code (the tier's
//! per-function entry counter), with arguments as well as without.
#![cfg(feature = "jit")]

mod common;

use ferrite_vm::cconv::{Cconv, CconvType};
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

/// Argument vectors for a function taking only scalars: small positive
/// integers (fixture functions take loop counts and recursion depths:
/// extremes would run for hours, collatz_steps(0) forever) and float
/// corners (negative zero, NaN, infinities), so a tier that mishandles a
/// width or a float corner shows up.
fn scalar_args(types: &[CconvType]) -> Option<Vec<Vec<Variant>>> {
    const ROWS: usize = 6;
    let column = |t: &CconvType| -> Option<[Variant; ROWS]> {
        Some(match t {
            CconvType::I32 => [1, 2, 7, 3, 12, 5].map(Variant::I32),
            CconvType::I64 => [1, 2, 7, 3, 12, 5].map(Variant::I64),
            CconvType::F32 => [0.0, 1.5, -2.25, f32::NAN, f32::INFINITY, -0.0].map(Variant::F32),
            CconvType::F64 => {
                [0.0, 1.5, -2.25, f64::NAN, f64::NEG_INFINITY, 1e300].map(Variant::F64)
            }
            _ => return None,
        })
    };
    let columns = types.iter().map(column).collect::<Option<Vec<_>>>()?;
    // Row r takes value (r + i) of column i: every value of every column
    // appears, in varied combinations, without a full cartesian product.
    Some(
        (0..ROWS)
            .map(|r| {
                columns
                    .iter()
                    .enumerate()
                    .map(|(i, c)| c[(r + i) % ROWS].clone())
                    .collect()
            })
            .collect(),
    )
}

/// Same results, or the same failure. A runaway recursion fails in both
/// tiers, at each tier's own depth (frames on the heap, compiled calls on
/// the native stack): there the status code and the innermost frames must
/// agree, not the frame count.
fn same_outcome(
    a: &ferrite_base::Result<Vec<Variant>>,
    b: &ferrite_base::Result<Vec<Variant>>,
) -> bool {
    match (a, b) {
        (Err(x), Err(y))
            if x.message().contains("stack overflow") && y.message().contains("stack overflow") =>
        {
            let (bx, by) = (x.backtrace(), y.backtrace());
            x.code() == y.code() && bx.len() > 5000 && by.len() > 5000 && bx[..8] == by[..8]
        }
        _ => show(a) == show(b),
    }
}

/// The names `tier_report` lists as compiled, with their function ordinals.
fn compiled_names(module: &BytecodeModule) -> std::collections::HashMap<String, usize> {
    module
        .tier_report()
        .lines()
        .filter_map(|l| {
            let (index, rest) = l.split_once("] ")?;
            let index = index.trim_start().strip_prefix('[')?.trim().parse().ok()?;
            let (name, tier) = rest.split_once(": ")?;
            tier.starts_with("compiled")
                .then(|| (name.to_string(), index))
        })
        .collect()
}

#[test]
fn both_tiers_agree_on_every_fixture_function() {
    let (on, off) = (instance(true), instance(false));
    let mut compared = 0usize;
    let mut compared_compiled = 0usize;
    let mut compared_compiled_with_args = 0usize;
    let mut with_args = 0usize;
    let mut compiled = 0usize;
    let mut interpreted_exports = Vec::new();
    let mut problems = Vec::new();
    for (name, path) in common::fixtures() {
        let bytes = std::fs::read(&path).expect("read fixture");
        let mj = BytecodeModule::load(&on, ModuleBytes::from_vec(bytes.clone())).expect("load");
        let mi = BytecodeModule::load(&off, ModuleBytes::from_vec(bytes)).expect("load");
        assert!(mi.jit().is_none(), "the tier is off for {name}");
        compiled += mj.jit().map_or(0, |j| j.compiled_count());
        let compiled_here = compiled_names(&mj);
        for e in mj.exports() {
            let Ok(cconv) = Cconv::parse(&e.signature.cconv) else {
                continue;
            };
            let calls = if cconv.args.is_empty() {
                vec![Vec::new()]
            } else {
                match scalar_args(&cconv.args) {
                    Some(rows) => rows,
                    None => continue,
                }
            };
            for args in calls {
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
                let shown_args = format!("{args:?}");
                let jit = mj.jit().expect("tier on");
                let ordinal = compiled_here.get(&e.name).copied();
                let before = ordinal.map_or(0, |f| jit.entered(f));
                let (rj, ri) = (cj.invoke(&fj, args.clone()), ci.invoke(&fi, args));
                compared += 1;
                with_args += usize::from(!cconv.args.is_empty());
                // The export's own body ran compiled (its callees may be
                // either tier), as the tier's entry counter shows: otherwise
                // this compared the interpreter with itself.
                match ordinal {
                    Some(f) if jit.entered(f) > before => {
                        compared_compiled += 1;
                        compared_compiled_with_args += usize::from(!cconv.args.is_empty());
                    }
                    Some(_) => problems.push(format!(
                        "{name}.{}: compiled, but the call did not enter compiled code",
                        e.name
                    )),
                    None => interpreted_exports.push(format!("{name}.{}", e.name)),
                }
                if !same_outcome(&rj, &ri) {
                    problems.push(format!(
                        "{name}.{}({shown_args}):\n  compiled:    {}\n  interpreted: {}",
                        e.name,
                        show(&rj),
                        show(&ri)
                    ));
                }
            }
        }
    }
    interpreted_exports.dedup();
    println!(
        "{compared} calls compared ({with_args} with arguments), {compared_compiled} of them \
         entered compiled code ({compared_compiled_with_args} with arguments); {compiled} \
         functions compiled; exports left interpreted: {}",
        interpreted_exports.join(", ")
    );
    assert!(
        problems.is_empty(),
        "tiers differ:\n{}",
        problems.join("\n")
    );
    assert!(compared > 50, "only {compared} calls compared");
    assert!(with_args > 50, "only {with_args} calls with arguments");
    assert!(
        compared_compiled_with_args > 50,
        "only {compared_compiled_with_args} calls with arguments entered compiled code"
    );
    assert!(compiled > 20, "only {compiled} functions compiled");
    // Most compared calls must exercise compiled code; the exports left
    // interpreted are listed above with the tier report's reasons.
    assert!(
        compared_compiled * 4 >= compared * 3,
        "only {compared_compiled} of {compared} compared calls ran compiled code; interpreted: {}",
        interpreted_exports.join(", ")
    );
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
        if ej.message().contains("stack overflow") {
            // How deep a runaway recursion gets is each tier's own limit
            // (frames on the heap, compiled calls on the native stack):
            // the frames where it happened must agree, not the count.
            let (bj, bi) = (ej.backtrace(), ei.backtrace());
            assert!(
                bj.len() > 5000 && bi.len() > 5000,
                "{}: {} / {}",
                e.name,
                bj.len(),
                bi.len()
            );
            assert_eq!(bj[..8], bi[..8], "{}", e.name);
        } else {
            assert_eq!(ej.backtrace(), ei.backtrace(), "{}", e.name);
            assert_eq!(ej.to_string(), ei.to_string(), "{}", e.name);
        }
        checked += 1;
    }
    assert!(checked > 0);
}
