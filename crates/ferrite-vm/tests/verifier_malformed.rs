//! Corrupted bytecode must be rejected by the verifier (or load as a
//! different but valid program), never panic. The archive-level tests
//! (`archive_malformed.rs`) mostly break the FlatBuffer; these mutations
//! target the bytecode section, which passes the archive reader and
//! exercises the verifier and decoder.

mod common;

use ferrite_vm::{BytecodeModule, ModuleBytes};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// xorshift64*: deterministic mutations without extra dependencies.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// An instance that loads fixtures with the compiling tier off: these tests
/// are about the verifier, and compiling each of the thousands of mutants
/// would only add time (compiler failures cannot fail a load anyway; the
/// tier's own fuzz target covers it).
fn verifier_instance() -> ferrite_vm::Instance {
    let i = ferrite_vm::Instance::new(ferrite_vm::instance::InstanceOptions {
        jit: false,
        ..Default::default()
    });
    i.types().register_type::<common::FakeFence>("hal.fence");
    i
}

/// Loads `bytes`; returns whether it loaded. Panics become test failures
/// naming the mutation.
fn load(bytes: Vec<u8>, what: &str) -> bool {
    let instance = verifier_instance();
    match catch_unwind(AssertUnwindSafe(|| {
        BytecodeModule::load(&instance, ModuleBytes::from_vec(bytes))
    })) {
        Ok(r) => r.is_ok(),
        Err(_) => panic!("loader panicked on {what}"),
    }
}

#[test]
fn bytecode_mutations_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut total = 0usize;
    let mut rejected = 0usize;
    let mut modules = 0usize;
    for (name, path) in common::fixtures() {
        let bytes = std::fs::read(&path).expect("read fixture");
        let instance = verifier_instance();
        let Ok(module) = BytecodeModule::load(&instance, ModuleBytes::from_vec(bytes.clone()))
        else {
            continue;
        };
        modules += 1;
        // Locate the bytecode section inside the file.
        let code = module.archive().bytecode();
        let start = code.as_ptr() as usize - module.archive().bytes().as_slice().as_ptr() as usize;
        let range = start..start + code.len();
        drop(module);
        // Every byte of the bytecode set to interesting values, plus random
        // single-bit flips and multi-byte overwrites.
        let interesting = [0x00u8, 0x01, 0x79, 0x7F, 0x80, 0xE0, 0xE1, 0xFF];
        for pos in range.clone() {
            for &v in &interesting {
                if bytes[pos] == v {
                    continue;
                }
                let mut m = bytes.clone();
                m[pos] = v;
                total += 1;
                if !load(m, &format!("{name}: byte {pos:#x} := {v:#04x}")) {
                    rejected += 1;
                }
            }
        }
        for _ in 0..2000 {
            let mut m = bytes.clone();
            let n = 1 + (rng.next() % 4) as usize;
            for _ in 0..n {
                let pos = range.start + (rng.next() as usize % code_len(&range));
                if rng.next().is_multiple_of(2) {
                    m[pos] ^= 1 << (rng.next() % 8);
                } else {
                    m[pos] = rng.next() as u8;
                }
            }
            total += 1;
            if !load(m, &format!("{name}: random bytecode overwrite")) {
                rejected += 1;
            }
        }
    }
    assert!(
        modules >= 10,
        "expected at least 10 loadable fixtures, found {modules}"
    );
    println!(
        "{total} mutated modules: {rejected} rejected by the verifier, {} loaded",
        total - rejected
    );
    assert!(
        rejected > total / 4,
        "the verifier rejected suspiciously few mutations ({rejected}/{total})"
    );
}

fn code_len(r: &std::ops::Range<usize>) -> usize {
    r.len().max(1)
}

#[test]
fn rejection_messages_name_function_and_offset() {
    let (name, path) = common::fixtures()
        .into_iter()
        .find(|(n, _)| n == "arith_i32")
        .expect("arith_i32 fixture");
    let bytes = std::fs::read(&path).expect("read fixture");
    let instance = verifier_instance();
    let module =
        BytecodeModule::load(&instance, ModuleBytes::from_vec(bytes.clone())).expect("valid");
    let code = module.archive().bytecode();
    let start = code.as_ptr() as usize - module.archive().bytes().as_slice().as_ptr() as usize;
    let first_fn = module.archive().function_descriptors()[0];
    drop(module);
    // The byte after the first block marker is the first opcode: make it an
    // opcode that does not exist.
    let mut m = bytes.clone();
    m[start + first_fn.bytecode_offset as usize + 1] = 0xFE;
    let err = BytecodeModule::load(&instance, ModuleBytes::from_vec(m)).expect_err("must reject");
    let text = err.to_string();
    assert!(text.contains("unknown opcode 0xfe"), "{name}: {text}");
    assert!(text.contains("bytecode offset 1"), "{name}: {text}");
    assert!(text.contains("verifying function 0"), "{name}: {text}");
}
