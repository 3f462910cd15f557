//! `system-elf-x86_64` executables: a program compiled with
//! `--iree-llvmcpu-link-embedded=false` (its executable is a regular shared
//! object, opened with `dlopen`) runs through the `hal` module on
//! `local-sync`, directly through `create_executable`, and through
//! `ferrite run-module` with the same stdout as upstream's `iree-run-module`.

mod common;

use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::device::{Device, DeviceRef};
use ferrite_hal::element_type::{ElementType, EncodingType};
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_hal_cpu::CpuDevice;
use ferrite_hal_module::HalModuleOptions;
use ferrite_testkit::{compile_source, GENERIC_CPU};
use ferrite_vm::bytecode::archive::Archive;
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes, Ref, Variant};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const FORMAT: &str = "system-elf-x86_64";

const PROGRAM: &str = "\
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
";

/// Compiles [`PROGRAM`] with a system shared-library executable (again only
/// when the program changes) and returns the `.vmfb` path.
fn compile_dylib() -> PathBuf {
    let flags = [GENERIC_CPU, &["--iree-llvmcpu-link-embedded=false"]].concat();
    let out = ferrite_testkit::target_tmpdir!("executable-dylib").join("add.vmfb");
    compile_source(PROGRAM, &out, &flags)
}

/// The module's executable format and bytes, from its rodata.
fn executable_of(vmfb: &Path) -> (String, Vec<u8>) {
    let archive =
        Archive::parse(ModuleBytes::read_file(vmfb).expect("read module")).expect("parse module");
    let rodata: Vec<Vec<u8>> = (0..archive.rodata_segments().len())
        .map(|i| archive.rodata(i).expect("rodata segment").to_vec())
        .collect();
    let format = rodata
        .iter()
        .filter_map(|r| std::str::from_utf8(r).ok())
        .find(|s| s.starts_with("system-elf-") || s.starts_with("embedded-elf-"))
        .expect("module names no executable format")
        .to_string();
    let data = rodata
        .iter()
        .find(|r| r.starts_with(b"\x7fELF"))
        .expect("module holds no ELF executable")
        .clone();
    (format, data)
}

fn f32_view(dev: &Arc<dyn Device>, v: &[f32]) -> Variant {
    let bytes = common::f32_bytes(v);
    let buffer = dev
        .allocator()
        .allocate(
            &BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT),
            bytes.len() as u64,
        )
        .expect("allocate");
    buffer.write(0, &bytes).expect("write");
    let view = BufferView::new(
        buffer,
        &[v.len() as u64],
        ElementType::FLOAT_32,
        EncodingType::DENSE_ROW_MAJOR,
    )
    .expect("buffer view");
    Variant::Ref(Ref::new(view))
}

fn result_f32(r: &Variant) -> Vec<f32> {
    let Variant::Ref(r) = r else {
        panic!("result is not a ref: {r:?}")
    };
    let view = r.downcast::<BufferView>().expect("result is a buffer view");
    assert_eq!(view.element_type(), ElementType::FLOAT_32);
    let bytes = view.buffer().to_vec().expect("read result");
    common::bytes_f32(&bytes[..view.byte_length() as usize])
}

#[test]
fn module_names_the_system_elf_format() {
    let (format, data) = executable_of(&compile_dylib());
    assert_eq!(format, FORMAT);
    let dev = CpuDevice::local_sync();
    let exe = dev
        .create_executable(&format, &data, &[])
        .expect("create system-elf executable");
    assert_eq!(exe.exports().len(), 1);
    assert!(exe.exports()[0].name.starts_with("add_dispatch_0"));
    assert_eq!(exe.exports()[0].binding_count, 3);
    // Garbage is refused, not dlopen'd blindly.
    let Err(err) = dev.create_executable(&format, b"not a shared object", &[]) else {
        panic!("garbage loaded as a system library")
    };
    assert!(err.to_string().contains("not an ELF"), "{err}");
}

#[test]
fn add_runs_through_the_vm_on_local_sync() {
    let dev: Arc<dyn Device> = CpuDevice::local_sync();
    let instance = Instance::default();
    ferrite_hal_module::register_types(instance.types());
    let hal = ferrite_hal_module::create_hal_module(
        vec![DeviceRef(dev.clone())],
        HalModuleOptions::default(),
    )
    .expect("create hal module");
    let module = BytecodeModule::load(
        &instance,
        ModuleBytes::read_file(compile_dylib()).expect("read module"),
    )
    .expect("load module");
    let mut ctx = Context::new(&instance);
    ctx.register(hal).expect("register hal");
    ctx.register(module as Arc<dyn Module>)
        .expect("register program");
    let f = ctx.lookup_function("add").expect("function add");
    for round in 0..2 {
        let a = [1.0f32, 2.5, -3.0, 4.0 + round as f32];
        let b = [10.0f32, 0.5, 3.0, -1.25];
        let out = ctx
            .invoke(&f, vec![f32_view(&dev, &a), f32_view(&dev, &b)])
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(out.len(), 1);
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(result_f32(&out[0]), want, "round {round}");
    }
}

#[test]
fn run_module_matches_upstream() {
    let module = compile_dylib();
    let ferrite = common::workspace_root().join("target/debug/ferrite");
    assert!(
        ferrite.is_file(),
        "{} not found: build it with `cargo build -p ferrite-cli`",
        ferrite.display()
    );
    let args = [
        format!("--module={}", module.display()),
        "--function=add".to_string(),
        "--device=local-sync".to_string(),
        "--input=4xf32=1 2.5 -3 4".to_string(),
        "--input=4xf32=10 0.5 3 -1.25".to_string(),
    ];
    let up = Command::new(common::tool("iree-run-module"))
        .args(&args)
        .output()
        .expect("run iree-run-module");
    assert!(
        up.status.success(),
        "iree-run-module failed:\n{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let fe = Command::new(&ferrite)
        .arg("run-module")
        .args(&args)
        .output()
        .expect("run ferrite");
    assert!(
        fe.status.success(),
        "ferrite run-module failed:\n{}{}",
        String::from_utf8_lossy(&fe.stdout),
        String::from_utf8_lossy(&fe.stderr)
    );
    let (up, fe) = (
        String::from_utf8_lossy(&up.stdout),
        String::from_utf8_lossy(&fe.stdout),
    );
    assert!(up.contains("11 3 0 2.75"), "upstream stdout:\n{up}");
    assert_eq!(fe, up, "stdout differs");
}
