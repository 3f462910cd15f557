//! Differential fuzzing of the compiling tier: each input is a `.vmfb`
//! (seed the corpus with our VM test programs and benches, e.g. by
//! assembling `tests/vm/*.vmasm` into `fuzz/corpus/jit_diff/`); libFuzzer's
//! mutations of its bytecode that still verify give random verified
//! functions. Every export with primitive arguments runs twice, once with
//! the tier on and once interpreted, and the results, or the errors (status,
//! message and backtrace), must be identical.
//!
//! Only functions that must terminate are run: every branch in them and in
//! the internal functions they reach goes forward, and their calls form no
//! cycle.
//! `cargo +nightly fuzz run jit_diff`.
#![no_main]

use ferrite_vm::cconv::{Cconv, CconvType};
use ferrite_vm::instance::InstanceOptions;
use ferrite_vm::testing::terminates;
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes, Variant};
use libfuzzer_sys::fuzz_target;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Calls compared so far (reported every 1000, so a run's log says how
/// much of its input reached both tiers).
static COMPARED: AtomicUsize = AtomicUsize::new(0);
/// Compared calls whose function had run compiled.
static COMPILED_CALLS: AtomicUsize = AtomicUsize::new(0);

fn load(data: &[u8], jit: bool) -> Option<(Instance, Arc<BytecodeModule>)> {
    let instance = Instance::new(InstanceOptions {
        jit,
        ..InstanceOptions::default()
    });
    let m = BytecodeModule::load(&instance, ModuleBytes::from_vec(data.to_vec())).ok()?;
    Some((instance, m))
}

fn args_for(cconv: &Cconv, seed: &mut u64) -> Option<Vec<Variant>> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        // Small values are the interesting ones for most programs.
        match *seed % 4 {
            0 => (*seed >> 8) % 8,
            1 => (*seed >> 8) as u32 as u64,
            2 => u64::MAX - (*seed >> 8) % 4,
            _ => *seed >> 3,
        }
    };
    cconv
        .args
        .iter()
        .map(|t| {
            Some(match t {
                CconvType::I32 => Variant::I32(next() as i32),
                CconvType::I64 => Variant::I64(next() as i64),
                CconvType::F32 => Variant::F32(next() as i32 as f32 / 7.0),
                CconvType::F64 => Variant::F64(next() as i64 as f64 / 7.0),
                _ => return None,
            })
        })
        .collect()
}

fn show(r: &ferrite_base::Result<Vec<Variant>>) -> String {
    match r {
        Ok(v) => v
            .iter()
            .map(|x| match x {
                // Bits, so NaN payloads count too.
                Variant::F32(f) => format!("f32:{:#x}", f.to_bits()),
                Variant::F64(f) => format!("f64:{:#x}", f.to_bits()),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>()
            .join(","),
        Err(e) => format!("error: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((ij, mj)) = load(data, true) else {
        return;
    };
    if mj.jit().map_or(0, |j| j.compiled_count()) == 0 {
        return;
    }
    let (ii, mi) = load(data, false).expect("loads with the tier off too");
    let (Ok(cj), Ok(ci)) = (
        Context::with_modules(&ij, &[mj.clone() as Arc<dyn Module>]),
        Context::with_modules(&ii, &[mi.clone() as Arc<dyn Module>]),
    ) else {
        return;
    };
    let mut seed = data.iter().fold(0x9E37_79B9_7F4A_7C15u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
    }) | 1;
    let internal = |name: &str| mj.function_names().iter().position(|n| n == name);
    for e in mj.exports() {
        match internal(&e.name) {
            Some(i) if terminates(mj.functions(), i) => {}
            _ => continue,
        }
        let Ok(cconv) = Cconv::parse(&e.signature.cconv) else {
            continue;
        };
        let (Ok(fj), Ok(fi)) = (cj.lookup_function(&e.name), ci.lookup_function(&e.name)) else {
            continue;
        };
        for _ in 0..3 {
            let Some(args) = args_for(&cconv, &mut seed) else {
                break;
            };
            let rj = cj.invoke(&fj, args.clone());
            let ri = ci.invoke(&fi, args.clone());
            let (sj, si) = (show(&rj), show(&ri));
            let n = COMPARED.fetch_add(1, Ordering::Relaxed) + 1;
            let compiled = mj.jit().is_some_and(|j| {
                matches!(
                    internal(&e.name).and_then(|i| j.tiers.get(i)),
                    Some(ferrite_vm::bytecode::jit::FunctionTier::Compiled { .. })
                )
            });
            if compiled {
                COMPILED_CALLS.fetch_add(1, Ordering::Relaxed);
            }
            if n % 1000 == 0 {
                eprintln!(
                    "jit_diff: {n} calls compared, {} of them entering compiled code",
                    COMPILED_CALLS.load(Ordering::Relaxed)
                );
            }
            assert_eq!(
                sj, si,
                "tiers differ on {}({args:?}):\ncompiled:    {sj}\ninterpreted: {si}",
                e.name
            );
        }
    }
});
