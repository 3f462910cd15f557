//! Mutated bytecode that the verifier accepts is run, not only loaded:
//! deterministic single-byte and multi-byte mutations of the fixture
//! programs' bytecode; for every mutant that loads, every export that
//! surely terminates (`ferrite_vm::testing::terminates`: forward branches
//! only, no call cycle) is called with the tier on and off. Neither may
//! panic or crash, and both must give the same results or the same error
//! (the hand-run `jit_diff` fuzz target does the same at scale).
#![cfg(feature = "jit")]

mod common;

use ferrite_vm::cconv::{Cconv, CconvType};
use ferrite_vm::instance::InstanceOptions;
use ferrite_vm::testing::terminates;
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes, Variant};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn load(bytes: &[u8], jit: bool) -> Option<(Instance, Arc<BytecodeModule>)> {
    let instance = Instance::new(InstanceOptions {
        jit,
        ..InstanceOptions::default()
    });
    instance
        .types()
        .register_type::<common::FakeFence>("hal.fence");
    let m = catch_unwind(AssertUnwindSafe(|| {
        BytecodeModule::load(&instance, ModuleBytes::from_vec(bytes.to_vec()))
    }))
    .expect("the loader panicked on a mutant")
    .ok()?;
    Some((instance, m))
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

fn args_for(cconv: &Cconv, rng: &mut Rng) -> Option<Vec<Variant>> {
    cconv
        .args
        .iter()
        .map(|t| {
            let v = rng.next();
            // Small values mostly, extremes sometimes.
            let x = if v.is_multiple_of(4) {
                v >> 3
            } else {
                (v >> 8) % 9
            };
            Some(match t {
                CconvType::I32 => Variant::I32(x as i32),
                CconvType::I64 => Variant::I64(x as i64),
                CconvType::F32 => Variant::F32(x as i32 as f32 / 7.0),
                CconvType::F64 => Variant::F64(x as i64 as f64 / 7.0),
                _ => return None,
            })
        })
        .collect()
}

/// Runs every terminating export of `bytes` in both tiers; returns the
/// calls compared, or a difference.
fn run_both(bytes: &[u8], rng: &mut Rng, what: &str) -> Result<usize, String> {
    let Some((ij, mj)) = load(bytes, true) else {
        return Ok(0);
    };
    let (ii, mi) =
        load(bytes, false).ok_or_else(|| format!("{what}: loads with the tier on only"))?;
    let (Ok(cj), Ok(ci)) = (
        Context::with_modules(&ij, &[mj.clone() as Arc<dyn Module>]),
        Context::with_modules(&ii, &[mi.clone() as Arc<dyn Module>]),
    ) else {
        return Ok(0);
    };
    let mut compared = 0;
    for e in mj.exports() {
        let Some(i) = mj.function_names().iter().position(|n| *n == e.name) else {
            continue;
        };
        if !terminates(mj.functions(), i) {
            continue;
        }
        let Ok(cconv) = Cconv::parse(&e.signature.cconv) else {
            continue;
        };
        let (Ok(fj), Ok(fi)) = (cj.lookup_function(&e.name), ci.lookup_function(&e.name)) else {
            continue;
        };
        let Some(args) = args_for(&cconv, rng) else {
            continue;
        };
        let run = |c: &Context, f| {
            catch_unwind(AssertUnwindSafe(|| c.invoke(f, args.clone())))
                .map_err(|_| format!("{what}: {} panicked", e.name))
        };
        let (rj, ri) = (run(&cj, &fj)?, run(&ci, &fi)?);
        compared += 1;
        if show(&rj) != show(&ri) {
            return Err(format!(
                "{what}: tiers differ on {}({args:?}):\n  compiled:    {}\n  interpreted: {}",
                e.name,
                show(&rj),
                show(&ri)
            ));
        }
    }
    Ok(compared)
}

#[test]
fn verified_mutants_run_alike_in_both_tiers() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let (mut mutants, mut loaded_runs, mut compared) = (0usize, 0usize, 0usize);
    let mut problems = Vec::new();
    for (name, path) in common::fixtures() {
        let bytes = std::fs::read(&path).expect("read fixture");
        let Some((_, module)) = load(&bytes, false) else {
            continue;
        };
        let code = module.archive().bytecode();
        let start = code.as_ptr() as usize - module.archive().bytes().as_slice().as_ptr() as usize;
        let len = code.len().max(1);
        drop(module);
        for k in 0..300 {
            let mut m = bytes.clone();
            for _ in 0..1 + rng.next() % 3 {
                let pos = start + (rng.next() as usize % len);
                m[pos] = if k % 2 == 0 {
                    m[pos] ^ (1 << (rng.next() % 8))
                } else {
                    rng.next() as u8
                };
            }
            mutants += 1;
            match run_both(&m, &mut rng, &format!("{name} mutant {k}")) {
                Ok(0) => {}
                Ok(n) => {
                    loaded_runs += 1;
                    compared += n;
                }
                Err(e) => problems.push(e),
            }
        }
    }
    println!(
        "{mutants} mutants; {loaded_runs} loaded and ran terminating exports; {compared} calls compared"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        compared > 500,
        "only {compared} calls of verified mutants compared: the test would prove little"
    );
}
