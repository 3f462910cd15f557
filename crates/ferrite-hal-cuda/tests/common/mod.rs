//! Shared helpers of the GPU tests: the device (or a printed skip) and a
//! hand-built `cuda-nvptx-fb` executable around a PTX kernel.

#![allow(dead_code)]

use ferrite_hal::device::Device;
use ferrite_hal_cuda::CudaDevice;
use std::sync::Arc;

/// The CUDA device 0, or None after printing SKIPPED (failing instead when
/// `FERRITE_REQUIRE_GPU=1`, as scripts/test-gpu.sh sets).
pub fn gpu() -> Option<Arc<dyn Device>> {
    if !ferrite_hal_cuda::available() {
        let why = match ferrite_hal_cuda::ffi::api() {
            Err(e) => e.to_string(),
            Ok(_) => "the CUDA driver reports no GPU".to_string(),
        };
        if std::env::var("FERRITE_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("FERRITE_REQUIRE_GPU=1 but no GPU: {why}");
        }
        println!("SKIPPED: {why}");
        return None;
    }
    Some(CudaDevice::open(0).expect("opening CUDA device 0"))
}

/// A `CDA1` executable with one PTX module and one export `kernel` (block
/// dims 1x1x1, `bindings` bindings, `constants` push constants), built
/// byte by byte as the schema lays it out.
pub fn cda1(ptx: &str, kernel: &str, bindings: u32, constants: u32) -> Vec<u8> {
    let mut b: Vec<u8> = vec![0; 8];
    b[4..8].copy_from_slice(b"CDA1");
    let put32 =
        |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let push32 = |b: &mut Vec<u8>, v: u32| b.extend_from_slice(&v.to_le_bytes());
    let push16 = |b: &mut Vec<u8>, v: u16| b.extend_from_slice(&v.to_le_bytes());
    // ExecutableDef vtable + table.
    let vt = b.len();
    push16(&mut b, 8);
    push16(&mut b, 12);
    push16(&mut b, 4);
    push16(&mut b, 8);
    let root = b.len();
    push32(&mut b, (root - vt) as u32);
    let f_exports = b.len();
    push32(&mut b, 0);
    let f_modules = b.len();
    push32(&mut b, 0);
    put32(&mut b, 0, root as u32);
    // exports vector.
    let v = b.len();
    put32(&mut b, f_exports, (v - f_exports) as u32);
    push32(&mut b, 1);
    let e_ref = b.len();
    push32(&mut b, 0);
    // ExportDef vtable + table.
    let evt = b.len();
    for x in [16u16, 36, 4, 8, 12, 24, 28, 32] {
        push16(&mut b, x);
    }
    let e = b.len();
    put32(&mut b, e_ref, (e - e_ref) as u32);
    push32(&mut b, (e - evt) as u32);
    push32(&mut b, 0); // module_ordinal
    let f_name = b.len();
    push32(&mut b, 0);
    for d in [1u32, 1, 1] {
        push32(&mut b, d);
    }
    push32(&mut b, 0); // shared memory
    push32(&mut b, constants);
    let f_flags = b.len();
    push32(&mut b, 0);
    let s = b.len();
    put32(&mut b, f_name, (s - f_name) as u32);
    push32(&mut b, kernel.len() as u32);
    b.extend_from_slice(kernel.as_bytes());
    b.push(0);
    while !b.len().is_multiple_of(4) {
        b.push(0);
    }
    let fl = b.len();
    put32(&mut b, f_flags, (fl - f_flags) as u32);
    push32(&mut b, bindings);
    for _ in 0..bindings {
        b.extend_from_slice(&0u64.to_le_bytes());
    }
    // modules vector -> ModuleDef.
    let mv = b.len();
    put32(&mut b, f_modules, (mv - f_modules) as u32);
    push32(&mut b, 1);
    let m_ref = b.len();
    push32(&mut b, 0);
    let mvt = b.len();
    push16(&mut b, 6);
    push16(&mut b, 8);
    push16(&mut b, 4);
    push16(&mut b, 0);
    let m = b.len();
    put32(&mut b, m_ref, (m - m_ref) as u32);
    push32(&mut b, (m - mvt) as u32);
    let f_ptx = b.len();
    push32(&mut b, 0);
    let ps = b.len();
    put32(&mut b, f_ptx, (ps - f_ptx) as u32);
    push32(&mut b, ptx.len() as u32);
    b.extend_from_slice(ptx.as_bytes());
    b.push(0);
    while !b.len().is_multiple_of(8) {
        b.push(0);
    }
    let mut out = Vec::new();
    out.extend_from_slice(b"CDA1");
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.resize(64, 0);
    out.extend_from_slice(&b);
    out
}

/// A kernel `k(u32* out, u32 value)` that stores `value + 1` to out[0].
pub const STORE_PTX: &str = r#".version 7.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 out, .param .u32 value) {
  .reg .u64 %rd<3>;
  .reg .b32 %r<3>;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd2, %rd1;
  ld.param.u32 %r1, [value];
  add.u32 %r2, %r1, 1;
  st.global.u32 [%rd2], %r2;
  ret;
}
"#;

/// A kernel `k(u32* out)` that counts its blocks into `out[0]` (atomic add
/// per block) and stores its grid size into `out[1..4]`.
pub const GRID_PTX: &str = r#".version 7.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 out) {
  .reg .u64 %rd<3>;
  .reg .b32 %r<5>;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd2, %rd1;
  atom.global.add.u32 %r1, [%rd2], 1;
  mov.u32 %r2, %nctaid.x;
  mov.u32 %r3, %nctaid.y;
  mov.u32 %r4, %nctaid.z;
  st.global.u32 [%rd2+4], %r2;
  st.global.u32 [%rd2+8], %r3;
  st.global.u32 [%rd2+12], %r4;
  ret;
}
"#;

/// A kernel `k(u32* unused)` that stores to address 8 (an illegal address).
pub const FAULT_PTX: &str = r#".version 7.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 out) {
  .reg .u64 %rd<2>;
  .reg .b32 %r<2>;
  mov.u64 %rd1, 8;
  mov.u32 %r1, 7;
  st.global.u32 [%rd1], %r1;
  ret;
}
"#;
