//! A compiled recursive function whose native frames are large (1,200 call
//! results live across the recursive call, spilled: about 10 KiB a frame,
//! more than the 4 KiB guard page) recursing on a thread whose stack is
//! smaller than the 1 MiB native budget the tier assumes (so its per-call
//! check does not stop it): each frame's pages are probed in order
//! (Cranelift inline stack probes), so the recursion hits the thread's
//! guard page and the process stops with Rust's stack-overflow report.
//! Without probes a prologue moved the stack pointer past the guard in one
//! step and the spills landed beyond it (a plain SIGSEGV, or writes into
//! whatever memory lay there). With room (64 MiB), the same recursion stops
//! at the budget with RESOURCE_EXHAUSTED, and a shallow one sums right.
//!
//! The overflowing run is a child process (this test binary, re-run with
//! `FERRITE_PROBE_CHILD=1`), since it must end the process.

use ferrite_testkit::{venv_tool, workspace_root};
use ferrite_vm::instance::InstanceOptions;
use ferrite_vm::{BytecodeModule, Context, Instance, ModuleBytes, Variant};
use std::process::Command;
use std::sync::Arc;

const VALUES: usize = 1_200;

/// `rec(n)`: for n > 0, VALUES results of `id(n)`, then `rec(n - 1)`, then
/// their sum plus its result; `rec(0) = 0`. So `rec(n) = VALUES * n(n+1)/2`.
fn vmasm() -> String {
    let mut s = String::from(
        "vm.module @frames version 0\n\
         vm.func @id(%i0: i32) -> (i32) {\n^bb0:\n  vm.return %i0\n}\n\
         vm.export @rec\nvm.func @rec(%i0: i32) -> (i32) {\n^bb0:\n",
    );
    let acc = VALUES + 1;
    s.push_str(&format!(
        "  %i{acc} = vm.const.i32 0\n  vm.cond_br %i0, ^bb1, ^bb2\n^bb2:\n  vm.return %i{acc}\n^bb1:\n"
    ));
    for k in 1..=VALUES {
        s.push_str(&format!("  %i{k} = vm.call @id(%i0)\n"));
    }
    let one = VALUES + 2;
    s.push_str(&format!(
        "  %i{one} = vm.const.i32 1\n  %i{one} = vm.sub.i32 %i0, %i{one}\n  %i{acc} = vm.call @rec(%i{one})\n"
    ));
    for k in 1..=VALUES {
        s.push_str(&format!("  %i{acc} = vm.add.i32 %i{acc}, %i{k}\n"));
    }
    s.push_str(&format!("  vm.return %i{acc}\n}}\n"));
    s
}

fn module_bytes() -> Vec<u8> {
    let dir = workspace_root().join("target/tmp/jit-stack-probes");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("frames.vmasm");
    let out = dir.join("frames.vmfb");
    let text = vmasm();
    if std::fs::read_to_string(&src).ok().as_deref() != Some(text.as_str()) || !out.exists() {
        std::fs::write(&src, &text).unwrap();
        let status = Command::new(venv_tool("iree-as-module"))
            .arg(format!("--output={}", out.display()))
            .arg(&src)
            .status()
            .expect("running iree-as-module");
        assert!(status.success(), "assembling {}", src.display());
    }
    std::fs::read(&out).unwrap()
}

/// Loads the module with the tier on and calls `rec(n)` on a thread with
/// `stack` bytes of stack.
fn call_rec(bytes: Vec<u8>, n: i32, stack: usize) -> ferrite_base::Result<Vec<Variant>> {
    std::thread::Builder::new()
        .name("deep-frames".into())
        .stack_size(stack)
        .spawn(move || {
            let instance = Instance::new(InstanceOptions {
                jit: true,
                ..InstanceOptions::default()
            });
            let module = BytecodeModule::load(&instance, ModuleBytes::from_vec(bytes))?;
            let report = module.tier_report();
            assert!(
                report.lines().any(|l| l.contains("] rec: compiled")),
                "rec must run compiled:\n{report}"
            );
            let mut ctx = Context::new(&instance);
            ctx.register(module as Arc<dyn ferrite_vm::Module>)?;
            let f = ctx.lookup_function("rec")?;
            ctx.invoke(&f, vec![Variant::I32(n)])
        })
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn large_compiled_frames_are_probed() {
    let bytes = module_bytes();
    if std::env::var("FERRITE_PROBE_CHILD").as_deref() == Ok("1") {
        // 256 KiB of stack, far less than the recursion needs and than the
        // tier's budget: must stop at the guard page.
        let r = call_rec(bytes, 100_000, 256 << 10);
        println!("child returned {r:?}");
        std::process::exit(0);
    }
    // With room: a shallow recursion sums right, a deep one stops cleanly
    // at the native budget.
    let r = call_rec(bytes.clone(), 5, 64 << 20).expect("rec(5)");
    assert_eq!(r, vec![Variant::I32(15 * VALUES as i32)]);
    let e = call_rec(bytes, 100_000, 64 << 20).unwrap_err();
    assert_eq!(e.code(), ferrite_base::StatusCode::ResourceExhausted, "{e}");

    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "large_compiled_frames_are_probed", "--nocapture"])
        .env("FERRITE_PROBE_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && stderr.contains("has overflowed its stack"),
        "deep large frames on a small stack must stop at the guard page with Rust's stack-overflow report; status {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
}
