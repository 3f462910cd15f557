//! Loads CPU executables compiled by the pinned IREE compiler and runs their
//! dispatch functions directly on host memory.

#[path = "executable_support/mod.rs"]
mod support;

use ferrite_base::StatusCode;
use ferrite_hal_cpu::executable::{abi, container};
use ferrite_hal_cpu::{DispatchConfig, ExecutableLibrary, ImportTable, LoadOptions};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use support::{binding, fixture, static_workgroup_count, values};

/// Loads a library compiled from this crate's test sources by the pinned
/// compiler: trusted code, which `ExecutableLibrary::load` requires.
fn load_lib(data: &[u8], options: &LoadOptions<'_>) -> ferrite_base::Result<ExecutableLibrary> {
    // SAFETY: every executable these tests load is compiled from this
    // crate's own MLIR sources by the pinned IREE compiler (or a container
    // wrapping such an executable): trusted native code.
    unsafe { ExecutableLibrary::load(data, options) }
}

fn load(fx: &support::Fixture) -> ExecutableLibrary {
    let options = LoadOptions {
        format: Some(&fx.format),
        ..Default::default()
    };
    load_lib(&fx.executable, &options).expect("load executable")
}

#[test]
fn add_4xf32() {
    let fx = fixture("add");
    assert_eq!(fx.format, "embedded-elf-x86_64");
    assert_eq!(container::infer_format(&fx.executable).unwrap(), fx.format);
    let lib = load(&fx);
    assert_eq!(lib.header().version, abi::LIBRARY_VERSION_0_6);
    assert_eq!(lib.exports().len(), 1);
    let e = &lib.exports()[0];
    assert_eq!(e.binding_count, 3);
    assert_eq!(e.constant_count, 0);
    assert_eq!(e.local_memory_size, 0);
    assert_eq!(e.workgroup_size, [1, 1, 1]);
    assert!(lib.imports().is_empty());
    assert_eq!(lib.lookup_export(&e.name), Some(0));
    assert_eq!(lib.lookup_export("nope"), None);

    let count = static_workgroup_count(&fx.vmfb);
    let mut a = vec![1.0f32, 2.0, 3.0, 4.0];
    let mut b = vec![10.0f32, 20.0, 30.0, 40.5];
    let mut out = vec![0.0f32; 4];
    // SAFETY: three distinct live 4xf32 buffers, as the export was compiled for.
    unsafe {
        lib.dispatch(
            0,
            &DispatchConfig::new(count),
            &[],
            &[binding(&mut a), binding(&mut b), binding(&mut out)],
        )
    }
    .expect("dispatch");
    assert_eq!(out, vec![11.0, 22.0, 33.0, 44.5]);
}

#[test]
fn exports_match_module_rodata() {
    for name in ["add", "matmul", "reduce", "math"] {
        let fx = fixture(name);
        let lib = load(&fx);
        assert!(!lib.name().is_empty());
        assert!(!lib.exports().is_empty(), "{name}: no exports");
        for e in lib.exports() {
            assert!(
                fx.rodata.iter().any(|r| r == e.name.as_bytes()),
                "{name}: export '{}' not among the module's rodata strings",
                e.name
            );
            let (path, line) = e.source_location.clone().expect("source location");
            assert!(path.ends_with(".mlir"), "{path}");
            assert!(line > 0);
        }
    }
}

#[test]
fn matmul_64x64() {
    let fx = fixture("matmul");
    let lib = load(&fx);
    let count = static_workgroup_count(&fx.vmfb);
    let n = 64;
    let mut a = values(n * n, 1);
    let mut b = values(n * n, 2);
    let mut c = vec![f32::NAN; n * n];
    let e = &lib.exports()[0];
    assert_eq!(e.binding_count, 3, "{e:?}");
    // SAFETY: live 64x64 f32 buffers matching the compiled shapes.
    unsafe {
        lib.dispatch(
            0,
            &DispatchConfig::new(count),
            &[],
            &[binding(&mut a), binding(&mut b), binding(&mut c)],
        )
    }
    .expect("dispatch");
    for i in 0..n {
        for j in 0..n {
            let want: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
            let got = c[i * n + j];
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "c[{i}][{j}] = {got}, want {want}"
            );
        }
    }
}

#[test]
fn matmul_split_workgroup_ranges() {
    // The same dispatch run as separate workgroup ranges gives the same result.
    let fx = fixture("matmul");
    let lib = load(&fx);
    let count = static_workgroup_count(&fx.vmfb);
    let total = count.iter().map(|c| *c as u64).product::<u64>();
    let n = 64;
    let mut a = values(n * n, 3);
    let mut b = values(n * n, 4);
    let mut whole = vec![0.0f32; n * n];
    let mut split = vec![0.0f32; n * n];
    // SAFETY: live buffers matching the compiled shapes.
    unsafe {
        lib.dispatch(
            0,
            &DispatchConfig::new(count),
            &[],
            &[binding(&mut a), binding(&mut b), binding(&mut whole)],
        )
        .unwrap();
        for w in 0..total {
            let config = DispatchConfig {
                workgroups: Some(w..w + 1),
                processor_id: w as u32,
                ..DispatchConfig::new(count)
            };
            lib.dispatch(
                0,
                &config,
                &[],
                &[binding(&mut a), binding(&mut b), binding(&mut split)],
            )
            .unwrap();
        }
    }
    assert_eq!(whole, split);
    // A range past the grid is refused before anything runs.
    let config = DispatchConfig {
        workgroups: Some(0..total + 1),
        ..DispatchConfig::new(count)
    };
    // SAFETY: rejected before any code runs.
    let err = unsafe {
        lib.dispatch(
            0,
            &config,
            &[],
            &[binding(&mut a), binding(&mut b), binding(&mut split)],
        )
    }
    .unwrap_err();
    assert_eq!(err.code(), StatusCode::InvalidArgument);
}

#[test]
fn reduction_rows() {
    let fx = fixture("reduce");
    let lib = load(&fx);
    let count = static_workgroup_count(&fx.vmfb);
    let (rows, cols) = (32, 256);
    let mut a = values(rows * cols, 5);
    let mut out = vec![f32::NAN; rows];
    // SAFETY: live buffers matching the compiled shapes (32x256 in, 32 out).
    unsafe {
        lib.dispatch(
            0,
            &DispatchConfig::new(count),
            &[],
            &[binding(&mut a), binding(&mut out)],
        )
    }
    .expect("dispatch");
    for r in 0..rows {
        let want: f32 = a[r * cols..(r + 1) * cols].iter().sum();
        assert!(
            (out[r] - want).abs() <= 1e-3,
            "row {r}: {} vs {want}",
            out[r]
        );
    }
}

#[test]
fn math_functions() {
    let fx = fixture("math");
    let lib = load(&fx);
    let count = static_workgroup_count(&fx.vmfb);
    let n = 1024;
    let mut a: Vec<f32> = (0..n).map(|i| (i as f32) / 512.0 - 1.0).collect();
    let mut out = vec![f32::NAN; n];
    // SAFETY: live buffers matching the compiled shapes.
    unsafe {
        lib.dispatch(
            0,
            &DispatchConfig::new(count),
            &[],
            &[binding(&mut a), binding(&mut out)],
        )
    }
    .expect("dispatch");
    for i in 0..n {
        let x = a[i] as f64;
        let want = x.exp().sin().powf(x);
        let got = out[i] as f64;
        assert!(
            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "f({x}) = {got}, want {want}"
        );
    }
}

#[test]
fn dispatch_argument_checks() {
    let fx = fixture("add");
    let lib = load(&fx);
    let mut a = vec![0.0f32; 4];
    let mut b = vec![0.0f32; 4];
    let one = DispatchConfig::new([1, 1, 1]);
    // SAFETY: every call below is rejected before any code runs.
    unsafe {
        let err = lib.dispatch(1, &one, &[], &[]).unwrap_err();
        assert_eq!(err.code(), StatusCode::InvalidArgument);
        let err = lib
            .dispatch(0, &one, &[], &[binding(&mut a), binding(&mut b)])
            .unwrap_err();
        assert_eq!(err.code(), StatusCode::InvalidArgument, "{err}");
        let err = lib
            .dispatch(0, &DispatchConfig::new([1, 1, 70000]), &[], &[])
            .unwrap_err();
        assert_eq!(err.code(), StatusCode::InvalidArgument);
        // A grid whose workgroup count overflows 64 bits is refused, not
        // wrapped (or a panic in a debug build).
        let mut c = vec![0.0f32; 4];
        let err = lib
            .dispatch(
                0,
                &DispatchConfig::new([u32::MAX, u32::MAX, 65535]),
                &[],
                &[binding(&mut a), binding(&mut b), binding(&mut c)],
            )
            .unwrap_err();
        assert_eq!(err.code(), StatusCode::InvalidArgument, "{err}");
        assert!(err.message().contains("overflows"), "{err}");
        // An empty grid runs nothing.
        lib.dispatch(
            0,
            &DispatchConfig::new([0, 1, 1]),
            &[],
            &[binding(&mut a), binding(&mut b), binding(&mut b)],
        )
        .unwrap();
    }
    assert!(!container::supports_format("embedded-elf-arm_64"));
    let err = load_lib(
        &fx.executable,
        &LoadOptions {
            format: Some("embedded-elf-arm_64"),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.code(), StatusCode::Unimplemented);
    let err = load_lib(
        &fx.executable,
        &LoadOptions {
            constants: &[1],
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.code(), StatusCode::FailedPrecondition);
}

#[test]
fn processor_data_reaches_the_environment() {
    let fx = fixture("add");
    let lib = load(&fx);
    let host = ferrite_hal_cpu::executable::library::host_processor();
    assert_eq!(lib.processor(), &host);
    assert!(host.data[1..].iter().all(|w| *w == 0));
    if std::arch::is_x86_feature_detected!("sse3") {
        assert_ne!(host.data[0] & 1, 0);
    }
    let custom = abi::ProcessorV0 {
        data: [0x8000, 0, 0, 0, 0, 0, 0, 0],
    };
    let lib = load_lib(
        &fx.executable,
        &LoadOptions {
            processor: Some(custom),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(lib.environment().processor, custom);
}

/// Parameters the `import` fixture passes to `ferrite_host_scale`.
#[repr(C)]
struct ScaleParams {
    a: *const f32,
    a_offset: i64,
    out: *mut f32,
    out_offset: i64,
    n: i64,
    workgroup_id: i64,
    processor_id: u32,
}

static SCALE_CALLS: AtomicUsize = AtomicUsize::new(0);

/// out[i] = 2 * a[i] + 1 over workgroup `workgroup_id`'s 16 elements; fails
/// with 7 when the context is non-null.
unsafe extern "C" fn host_scale(
    params: *mut c_void,
    context: *mut c_void,
    _reserved: *mut c_void,
) -> c_int {
    SCALE_CALLS.fetch_add(1, Ordering::SeqCst);
    if !context.is_null() {
        return 7;
    }
    // SAFETY: the fixture passes a pointer to its ScaleParams-shaped struct.
    let p = unsafe { &*(params as *const ScaleParams) };
    let start = p.workgroup_id * 16;
    let end = (start + 16).min(p.n);
    for i in start..end {
        // SAFETY: i < n, the length of both bindings.
        unsafe {
            *p.out.offset((p.out_offset + i) as isize) =
                2.0 * *p.a.offset((p.a_offset + i) as isize) + 1.0;
        }
    }
    0
}

#[test]
fn imports_through_the_thunk() {
    let fx = fixture("import");
    // Without the host function the required import fails to resolve.
    let err = load_lib(&fx.executable, &LoadOptions::default()).unwrap_err();
    assert_eq!(err.code(), StatusCode::NotFound, "{err}");

    let mut table = ImportTable::new();
    table.register("ferrite_host_scale", host_scale);
    let lib = load_lib(
        &fx.executable,
        &LoadOptions {
            imports: Some(&table),
            ..Default::default()
        },
    )
    .expect("load");
    assert_eq!(lib.imports().len(), 1);
    assert_eq!(lib.imports()[0].name, "ferrite_host_scale");
    assert!(lib.imports()[0].resolved && !lib.imports()[0].optional);
    let e = lib.exports()[0].clone();
    assert_eq!((e.constant_count, e.binding_count), (2, 2), "{e:?}");

    let n = 100usize;
    let mut a = values(n, 9);
    let mut out = vec![0.0f32; n];
    let groups = n.div_ceil(16) as u32;
    let before = SCALE_CALLS.load(Ordering::SeqCst);
    // SAFETY: live buffers of n elements; constants carry n as a 64-bit index.
    unsafe {
        lib.dispatch(
            0,
            &DispatchConfig::new([groups, 1, 1]),
            &[n as u32, 0],
            &[binding(&mut a), binding(&mut out)],
        )
    }
    .expect("dispatch");
    assert_eq!(SCALE_CALLS.load(Ordering::SeqCst) - before, groups as usize);
    for i in 0..n {
        assert_eq!(out[i], 2.0 * a[i] + 1.0, "element {i}");
    }

    // A failing import fails the dispatch with the workgroup named.
    let mut failing = ImportTable::new();
    static MARKER: u8 = 0;
    // SAFETY: a static outlives everything; it is never dereferenced.
    unsafe {
        failing.register_with_context(
            "ferrite_host_scale",
            host_scale,
            (&MARKER as *const u8).cast(),
        )
    };
    let lib = load_lib(
        &fx.executable,
        &LoadOptions {
            imports: Some(&failing),
            ..Default::default()
        },
    )
    .unwrap();
    // SAFETY: as above.
    let err = unsafe {
        lib.dispatch(
            0,
            &DispatchConfig::new([groups, 1, 1]),
            &[n as u32, 0],
            &[binding(&mut a), binding(&mut out)],
        )
    }
    .unwrap_err();
    assert_eq!(err.code(), StatusCode::Internal);
    assert!(err.message().contains("returned error 7"), "{err}");
}

#[test]
fn fatelf_container_selects_the_host_elf() {
    let fx = fixture("add");
    let elf = &fx.executable;
    // Two records: an aarch64 decoy then x86-64, both pointing at valid ranges.
    let header = 8 + 2 * 24;
    let decoy = vec![0u8; 64];
    let mut fat = Vec::new();
    fat.extend_from_slice(&container::FATELF_MAGIC);
    fat.extend_from_slice(&1u16.to_le_bytes());
    fat.push(2);
    fat.push(0);
    let rec = |machine: u16, offset: usize, size: usize| {
        let mut r = Vec::new();
        r.extend_from_slice(&machine.to_le_bytes());
        r.extend_from_slice(&[0, 0, 2, 1, 0, 0]);
        r.extend_from_slice(&(offset as u64).to_le_bytes());
        r.extend_from_slice(&(size as u64).to_le_bytes());
        r
    };
    let elf_off = (header + decoy.len()).next_multiple_of(16);
    fat.extend(rec(container::EM_AARCH64, header, decoy.len()));
    fat.extend(rec(container::EM_X86_64, elf_off, elf.len()));
    fat.extend_from_slice(&decoy);
    fat.resize(elf_off, 0);
    fat.extend_from_slice(elf);
    assert_eq!(container::select_elf(&fat).unwrap(), &elf[..]);
    assert_eq!(
        container::infer_format(&fat).unwrap(),
        "embedded-elf-x86_64"
    );
    let lib = load_lib(&fat, &LoadOptions::default()).expect("load FatELF");
    let mut a = vec![1.0f32; 4];
    let mut b = vec![2.0f32; 4];
    let mut out = vec![0.0f32; 4];
    // SAFETY: live 4xf32 buffers.
    unsafe {
        lib.dispatch(
            0,
            &DispatchConfig::new([1, 1, 1]),
            &[],
            &[binding(&mut a), binding(&mut b), binding(&mut out)],
        )
    }
    .unwrap();
    assert_eq!(out, vec![3.0; 4]);
}
