//! The `.vmfb` archive reader against valid modules, targeted corruptions with
//! exact error checks, and thousands of deterministic random corruptions that
//! must each give `Ok` or `Err` but never a panic.
//!
//! Modules come from the fixture build (`$FERRITE_FIXTURES` or
//! `<workspace>/build/fixtures/vm/<name>.vmfb`) when present there, else they
//! are built from the sources embedded below with the pinned tools in
//! `<workspace>/.venv/bin` (or `$VENV/bin`). With neither, the tests fail.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use ferrite_base::StatusCode;
use ferrite_testkit::{compile_source, venv_tool_path, workspace_root, GENERIC_CPU};
use ferrite_vm::bytecode::archive::{Archive, Location};
use ferrite_vm::bytes::ModuleBytes;

// ---------------------------------------------------------------------------
// Test modules
// ---------------------------------------------------------------------------

/// Imports (required + optional, with cconv), embedded rodata, three
/// functions, two exports, a non-zero module version.
const IMPORTS_VMASM: &str = r#"
vm.module @fa_imports version 3
vm.type i32
vm.type !vm.buffer
vm.rodata[0] = 68656c6c6f
vm.rodata[1] = 0102030405060708
vm.import @other.add cconv "0ii_i"
vm.import optional @other.maybe cconv "0i_i"

vm.func @helper(%i0: i32) -> (i32) {
^bb0:
  %i1 = vm.const.i32 7
  %i0 = vm.add.i32 %i0, %i1
  vm.return %i0
}

vm.export @main
vm.func @main() -> () {
^bb0:
  %i0 = vm.const.i32 1
  %i1 = vm.const.i32 2
  %i2 = vm.call @other.add(%i0, %i1)
  %i3 = vm.call @fa_imports:0(%i2)
  vm.return
}

vm.export @second
vm.func @second() -> () {
^bb0:
  vm.return
}
"#;

/// Globals (module state), a ref type and a branchy function.
const GLOBALS_VMASM: &str = r#"
vm.module @fa_globals version 0
vm.type i32
vm.type !vm.buffer

vm.export @store_load
vm.func @store_load() -> () {
^bb0:
  %i0 = vm.const.i32 42
  vm.global.store.i32 %i0, .rwdata[0]
  %i1 = vm.global.load.i32 .rwdata[0]
  %i2 = vm.cmp.ne.i32 %i1, %i0
  vm.cond_br %i2, ^bb2(), ^bb1()
^bb1:
  vm.return
^bb2:
  %i3 = vm.const.i32 9
  vm.fail %i3, "mismatch"
}
"#;

/// Module state with primitive and ref globals, module and function
/// requirements (an f32 op) and a function of two blocks: the fields the
/// loader limits and strictness tests patch.
const STATE_VMASM: &str = r#"
vm.module @fa_state version 0
vm.type i32
vm.type !vm.buffer
vm.rodata[0] = 0102

vm.export @main
vm.func @main() -> () {
^bb0:
  %i0 = vm.const.i32 5
  vm.global.store.i32 %i0, .rwdata[0]
  %r0 = vm.const.ref.rodata 0
  vm.global.store.ref %r0, .refs[0] : !vm.buffer
  %i1 = vm.const.f32 1.5
  %i2 = vm.add.f32 %i1, %i1
  vm.br ^bb1()
^bb1:
  vm.return
}
"#;

/// An i64 add: its register operands are patched to odd ordinals.
const I64_VMASM: &str = r#"
vm.module @fa_i64 version 0
vm.type i32

vm.export @main
vm.func @main() -> () {
^bb0:
  %i0:1 = vm.const.i64 5
  %i2:3 = vm.add.i64 %i0:1, %i0:1
  vm.return
}
"#;

/// A tensor program: ZIP header, external rodata (the CPU executable), a
/// debug database, `hal` imports with cconv and reflection attributes.
const TENSOR_MLIR: &str = r#"
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %c = arith.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %0 = arith.addf %a, %b : tensor<4xf32>
  %1 = arith.mulf %0, %c : tensor<4xf32>
  return %1 : tensor<4xf32>
}
"#;

fn fixture_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("FERRITE_FIXTURES") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(workspace_root().join("build/fixtures/vm"));
    dirs
}

fn scratch_dir() -> PathBuf {
    ferrite_testkit::target_tmpdir!("archive_malformed")
}

fn run_tool(tool: &str, args: &[&str], what: &str) -> Vec<u8> {
    let path = venv_tool_path(tool);
    let out = Command::new(&path).args(args).output().unwrap_or_else(|e| {
        panic!(
            "cannot build test module {what}: no fixture found in {:?} and running {} failed: {e}. \
             Run scripts/build-fixtures.sh or set up the venv (or set FERRITE_FIXTURES / VENV).",
            fixture_dirs(),
            path.display()
        )
    });
    assert!(
        out.status.success(),
        "{} failed building {what}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The module `name`: from the fixture dirs, else built from `source`.
fn module(name: &str, source: &str, mlir: bool) -> Vec<u8> {
    static CACHE: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(b) = cache.get(name) {
        return b.clone();
    }
    let bytes = fixture_dirs()
        .iter()
        .map(|d| d.join(format!("{name}.vmfb")))
        .find_map(|p| std::fs::read(p).ok())
        .unwrap_or_else(|| {
            let dir = scratch_dir();
            let out = dir.join(format!("{name}.vmfb"));
            let out_s = out.to_str().expect("utf-8 path").to_owned();
            if mlir {
                compile_source(source, &out, GENERIC_CPU);
            } else {
                let src = dir.join(format!("{name}.vmasm"));
                std::fs::write(&src, source).unwrap();
                run_tool(
                    "iree-as-module",
                    &[&format!("--output={out_s}"), src.to_str().unwrap()],
                    name,
                );
            }
            std::fs::read(&out).unwrap_or_else(|e| panic!("reading {}: {e}", out.display()))
        });
    cache.insert(name.to_owned(), bytes.clone());
    bytes
}

fn imports_module() -> Vec<u8> {
    module("fa_imports", IMPORTS_VMASM, false)
}
fn globals_module() -> Vec<u8> {
    module("fa_globals", GLOBALS_VMASM, false)
}
fn state_module() -> Vec<u8> {
    module("fa_state", STATE_VMASM, false)
}
fn i64_module() -> Vec<u8> {
    module("fa_i64", I64_VMASM, false)
}
fn tensor_module() -> Vec<u8> {
    module("fa_tensor", TENSOR_MLIR, true)
}

fn all_modules() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("fa_imports", imports_module()),
        ("fa_globals", globals_module()),
        ("fa_tensor", tensor_module()),
    ]
}

fn parse(bytes: &[u8]) -> ferrite_base::Result<Archive> {
    Archive::parse(ModuleBytes::from_vec(bytes.to_vec()))
}

/// Parses `bytes`, turning a panic into a test failure that names `what`.
/// Returns whether the parse succeeded.
fn must_not_panic(bytes: Vec<u8>, what: &dyn Fn() -> String) -> bool {
    match catch_unwind(AssertUnwindSafe(|| {
        let r = Archive::parse(ModuleBytes::from_vec(bytes));
        // Exercise the accessors of whatever parsed.
        if let Ok(a) = &r {
            for i in 0..a.function_descriptors().len() + 1 {
                let _ = a.function_bytecode(i);
            }
            for i in 0..a.rodata_segments().len() + 1 {
                let _ = a.rodata(i);
            }
            if let Some(db) = a.debug_database() {
                for f in 0..db.functions.len() {
                    for e in &db.functions[f].locations {
                        let _ = db.resolve_location(f, e.bytecode_offset as u32);
                    }
                }
                for i in 0..db.locations.len() {
                    let _ = db.file_line_col(i as i32);
                }
            }
        }
        r.is_ok()
    })) {
        Ok(ok) => ok,
        Err(_) => panic!("Archive::parse panicked on {}", what()),
    }
}

/// xorshift64* — deterministic, no dependencies.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

// ---------------------------------------------------------------------------
// A tiny navigator (test-side, independent of the reader under test) used to
// find fields to patch.
// ---------------------------------------------------------------------------

fn rd_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn rd_u16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}

/// File offset of the flatbuffer (after ZIP header and size prefix).
fn fb_start(b: &[u8]) -> usize {
    let mut s = 0;
    if rd_u32(b, 0) == 0x0403_4B50 {
        s = 30 + rd_u16(b, 26) as usize + rd_u16(b, 28) as usize;
    }
    s + 4
}

/// File offset of the root table.
fn root_table(b: &[u8]) -> usize {
    let fb = fb_start(b);
    fb + rd_u32(b, fb) as usize
}

/// File offset of field `id` of the table at `t`, if present.
fn field_pos(b: &[u8], t: usize, id: usize) -> Option<usize> {
    let vt = (t as i64 - rd_u32(b, t) as i32 as i64) as usize;
    let vt_len = rd_u16(b, vt) as usize;
    let e = 4 + 2 * id;
    if e + 2 > vt_len {
        return None;
    }
    match rd_u16(b, vt + e) as usize {
        0 => None,
        o => Some(t + o),
    }
}

/// Follows the uoffset at `p`.
fn deref(b: &[u8], p: usize) -> usize {
    p + rd_u32(b, p) as usize
}

const ROOT_REQUIREMENTS: usize = 2;
const ROOT_MODULE_STATE: usize = 11;
const ROOT_BYTECODE_VERSION: usize = 13;
const ROOT_NAME: usize = 0;
const ROOT_EXPORTS: usize = 7;
const ROOT_RODATA: usize = 9;
const ROOT_DESCRIPTORS: usize = 12;

fn patch_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn expect_err(bytes: &[u8], code: StatusCode, needles: &[&str]) -> String {
    let e = parse(bytes).expect_err("expected the parse to fail");
    assert_eq!(e.code(), code, "wrong code for error: {}", e.message());
    for n in needles {
        assert!(
            e.message().contains(n),
            "error {:?} does not mention {n:?}",
            e.message()
        );
    }
    e.message().to_owned()
}

// ---------------------------------------------------------------------------
// Valid modules
// ---------------------------------------------------------------------------

#[test]
fn parses_imports_module() {
    let bytes = imports_module();
    let a = parse(&bytes).expect("valid module");
    assert_eq!(a.name(), "fa_imports");
    assert_eq!(a.version(), 3);
    assert_eq!(a.bytecode_version(), (17, 0));
    assert_eq!(a.types(), ["i32", "!vm.buffer"]);
    assert_eq!(a.imports().len(), 2);
    assert_eq!(a.imports()[0].full_name, "other.add");
    assert_eq!(
        a.imports()[0].signature.calling_convention.as_deref(),
        Some("0ii_i")
    );
    assert!(!a.imports()[0].optional);
    assert_eq!(a.imports()[1].full_name, "other.maybe");
    assert!(a.imports()[1].optional);
    let exports: Vec<_> = a
        .exports()
        .iter()
        .map(|e| (e.local_name.as_str(), e.internal_ordinal))
        .collect();
    assert_eq!(exports, [("main", 1), ("second", 2)]);
    assert_eq!(a.function_signatures().len(), 3);
    assert_eq!(a.function_descriptors().len(), 3);
    assert_eq!(a.rodata(0), Some(&b"hello"[..]));
    assert_eq!(a.rodata(1), Some(&[1u8, 2, 3, 4, 5, 6, 7, 8][..]));
    assert!(a.rodata(2).is_none());
    assert!(!a.rodata_segments()[0].external);
    assert_eq!(a.rodata_segments()[1].data(&a), &[1, 2, 3, 4, 5, 6, 7, 8]);
    // Every function's bytecode starts with a block marker.
    for i in 0..3 {
        let code = a.function_bytecode(i);
        assert!(!code.is_empty());
        assert_eq!(code[0], 121, "function {i} does not start with vm.block");
    }
    assert!(a.function_bytecode(3).is_empty());
    assert_eq!(a.flatbuffer_len() + 4, bytes.len());
    // Zero-copy: the bytecode slice lies inside the module bytes.
    let base = a.bytes().as_slice().as_ptr_range();
    assert!(base.contains(&a.bytecode().as_ptr()));
}

#[test]
fn parses_globals_module() {
    let a = parse(&globals_module()).expect("valid module");
    assert_eq!(a.name(), "fa_globals");
    let st = a.module_state();
    assert!(st.global_bytes_capacity >= 4, "{st:?}");
    assert_eq!(a.function_descriptors()[0].block_count, 3);
}

#[test]
fn parses_tensor_module_with_external_rodata_and_debug_info() {
    let bytes = tensor_module();
    assert_eq!(&bytes[0..4], b"PK\x03\x04", "expected a ZIP-wrapped module");
    let a = parse(&bytes).expect("valid module");
    assert_eq!(a.dependencies().len(), 1);
    assert_eq!(a.dependencies()[0].name, "hal");
    assert!(!a.dependencies()[0].optional);
    assert!(a.types().iter().any(|t| t == "!hal.buffer"));
    assert!(a
        .imports()
        .iter()
        .any(|i| i.full_name == "hal.buffer_view.create"));
    assert!(a
        .imports()
        .iter()
        .all(|i| i.signature.calling_convention.is_some()));
    let add = a
        .exports()
        .iter()
        .find(|e| e.local_name == "add")
        .expect("export add");
    let sig = &a.function_signatures()[add.internal_ordinal as usize];
    assert_eq!(sig.calling_convention.as_deref(), Some("0rr_r"));
    assert!(sig
        .attrs
        .iter()
        .any(|(k, v)| k == "iree.abi.declaration" && v.contains("@add")));
    let ext: Vec<_> = a
        .rodata_segments()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.external)
        .collect();
    assert!(!ext.is_empty(), "expected external rodata");
    for (i, s) in &ext {
        assert!(s.offset >= a.flatbuffer_range().end);
        let data = a.rodata(*i).unwrap();
        assert_eq!(data.len(), s.len);
        assert_eq!(
            &data[..4],
            b"\x7fELF",
            "external segment {i} is the CPU executable"
        );
    }
    let db = a.debug_database().expect("debug database");
    assert!(!db.locations.is_empty());
    assert!(matches!(db.locations[0], Location::Unknown));
    assert!(db.functions.len() <= a.function_descriptors().len());
    // Some op of some function resolves to a position in the source file.
    let mut resolved = Vec::new();
    for (f, map) in db.functions.iter().enumerate() {
        for e in &map.locations {
            if let Some(loc) = a.resolve_location(f, e.bytecode_offset as u32) {
                resolved.push(loc);
            }
        }
    }
    assert!(
        resolved
            .iter()
            .any(|l| l.contains("fa_tensor.mlir:") && !l.ends_with(":0:0")),
        "no source location resolved: {resolved:?}"
    );
}

#[test]
fn mapped_and_static_bytes_parse() {
    let bytes = imports_module();
    let path = scratch_dir().join("mapped_copy.vmfb");
    std::fs::write(&path, &bytes).unwrap();
    let a = Archive::parse(ModuleBytes::map_file(&path).unwrap()).unwrap();
    assert_eq!(a.name(), "fa_imports");
    let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    let b = Archive::parse(ModuleBytes::from_static(leaked)).unwrap();
    assert_eq!(b.bytecode(), a.bytecode());
}

// ---------------------------------------------------------------------------
// Targeted corruptions with exact errors
// ---------------------------------------------------------------------------

#[test]
fn wrong_identifier() {
    for (name, bytes) in all_modules() {
        let mut b = bytes.clone();
        let at = fb_start(&b) + 4;
        b[at..at + 4].copy_from_slice(b"XXXX");
        let msg = expect_err(
            &b,
            StatusCode::InvalidArgument,
            &["'XXXX'", "expected 'IREE'"],
        );
        assert!(msg.contains(&format!("offset {at:#x}")), "{name}: {msg}");
    }
}

#[test]
fn bytecode_version_mismatch() {
    for (name, bytes) in all_modules() {
        let at =
            field_pos(&bytes, root_table(&bytes), ROOT_BYTECODE_VERSION).expect("bytecode_version");
        assert_eq!(rd_u32(&bytes, at), 17 << 16, "{name}");
        for (major, minor) in [(16u32, 0u32), (18, 0), (17, 1), (0, 0)] {
            let mut b = bytes.clone();
            patch_u32(&mut b, at, major << 16 | minor);
            let found = format!("{major}.{minor}");
            expect_err(&b, StatusCode::Incompatible, &[&found, "17.0"]);
        }
    }
}

#[test]
fn truncated_files() {
    let bytes = imports_module();
    let msg = expect_err(
        &bytes[..bytes.len() - 1],
        StatusCode::InvalidArgument,
        &["truncated"],
    );
    assert!(msg.contains("size prefix"), "{msg}");
    expect_err(
        &bytes[..10],
        StatusCode::InvalidArgument,
        &["truncated", "16 bytes"],
    );
    expect_err(&[], StatusCode::InvalidArgument, &["truncated"]);
    // A ZIP header that claims more name/extra bytes than the file has.
    let mut zip = tensor_module()[..40].to_vec();
    zip[28..30].copy_from_slice(&0xFFFFu16.to_le_bytes());
    expect_err(&zip, StatusCode::InvalidArgument, &["ZIP"]);
    // Cut inside external rodata.
    let t = tensor_module();
    let a = parse(&t).unwrap();
    let ext = a
        .rodata_segments()
        .iter()
        .find(|s| s.external)
        .unwrap()
        .clone();
    expect_err(
        &t[..ext.offset + ext.len - 1],
        StatusCode::InvalidArgument,
        &["external data", "exceeds"],
    );
}

fn descriptor_pos(b: &[u8], i: usize) -> usize {
    let v = deref(b, field_pos(b, root_table(b), ROOT_DESCRIPTORS).unwrap());
    v + 4 + 20 * i
}

#[test]
fn function_descriptor_out_of_range() {
    let bytes = imports_module();
    let a = parse(&bytes).unwrap();
    let len = a.bytecode().len();
    let p = descriptor_pos(&bytes, 2);
    // Length running past the end.
    let mut b = bytes.clone();
    patch_u32(&mut b, p + 4, len as u32);
    let msg = expect_err(
        &b,
        StatusCode::InvalidArgument,
        &[
            "BytecodeModuleDef.function_descriptors[2]",
            "exceeds bytecode_data length",
            &format!("{len:#x}"),
        ],
    );
    assert!(msg.starts_with("vmfb: "), "{msg}");
    // Negative offset.
    let mut b = bytes.clone();
    patch_u32(&mut b, p, (-4i32) as u32);
    expect_err(
        &b,
        StatusCode::InvalidArgument,
        &["function_descriptors[2]", "bytecode range"],
    );
    // Offset + length overflowing i32.
    let mut b = bytes.clone();
    patch_u32(&mut b, p, i32::MAX as u32);
    patch_u32(&mut b, p + 4, i32::MAX as u32);
    expect_err(
        &b,
        StatusCode::InvalidArgument,
        &["function_descriptors[2]", "bytecode range"],
    );
    // Zero blocks, zero length, negative register counts.
    let mut b = bytes.clone();
    b[p + 14..p + 16].copy_from_slice(&0i16.to_le_bytes());
    expect_err(&b, StatusCode::InvalidArgument, &["block_count is 0"]);
    let mut b = bytes.clone();
    patch_u32(&mut b, p + 4, 0);
    expect_err(&b, StatusCode::InvalidArgument, &["bytecode_length is 0"]);
    let mut b = bytes.clone();
    b[p + 18..p + 20].copy_from_slice(&(-1i16).to_le_bytes());
    expect_err(&b, StatusCode::InvalidArgument, &["ref_register_count -1"]);
}

#[test]
fn export_ordinal_out_of_range() {
    let bytes = imports_module();
    let exports = deref(
        &bytes,
        field_pos(&bytes, root_table(&bytes), ROOT_EXPORTS).unwrap(),
    );
    // Export 1 ("second") stores internal_ordinal 2.
    let e1 = deref(&bytes, exports + 4 + 4);
    let at = field_pos(&bytes, e1, 1).expect("internal_ordinal present");
    assert_eq!(rd_u32(&bytes, at), 2);
    let mut b = bytes.clone();
    patch_u32(&mut b, at, 3);
    expect_err(
        &b,
        StatusCode::InvalidArgument,
        &[
            "exported_functions[1]",
            "'second'",
            "internal_ordinal 3 out of range",
            "3 functions",
        ],
    );
    let mut b = bytes.clone();
    patch_u32(&mut b, at, u32::MAX);
    expect_err(
        &b,
        StatusCode::InvalidArgument,
        &["exported_functions[1]", "negative"],
    );
}

#[test]
fn invalid_utf8_and_missing_name() {
    let bytes = imports_module();
    let name = deref(
        &bytes,
        field_pos(&bytes, root_table(&bytes), ROOT_NAME).unwrap(),
    );
    let mut b = bytes.clone();
    b[name + 4 + 2] = 0xFF;
    expect_err(
        &b,
        StatusCode::InvalidArgument,
        &["name", "UTF-8", &format!("{:#x}", name + 6)],
    );
    let mut b = bytes.clone();
    patch_u32(&mut b, name, 0);
    // Length 0 leaves a non-NUL byte after the empty string.
    let e = parse(&b).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument);
    // Missing name: zero the vtable entry.
    let t = root_table(&bytes);
    let vt = (t as i64 - rd_u32(&bytes, t) as i32 as i64) as usize;
    let mut b = bytes.clone();
    b[vt + 4..vt + 6].copy_from_slice(&0u16.to_le_bytes());
    expect_err(&b, StatusCode::InvalidArgument, &["'name' is missing"]);
}

#[test]
fn external_rodata_out_of_range() {
    let bytes = tensor_module();
    let a = parse(&bytes).unwrap();
    let (idx, _) = a
        .rodata_segments()
        .iter()
        .enumerate()
        .find(|(_, s)| s.external)
        .unwrap();
    let segs = deref(
        &bytes,
        field_pos(&bytes, root_table(&bytes), ROOT_RODATA).unwrap(),
    );
    let seg = deref(&bytes, segs + 4 + 4 * idx);
    let off_at = field_pos(&bytes, seg, 3).expect("external_data_offset");
    for v in [bytes.len() as u64, u64::MAX, u64::MAX - 8, 1 << 40] {
        let mut b = bytes.clone();
        b[off_at..off_at + 8].copy_from_slice(&v.to_le_bytes());
        expect_err(
            &b,
            StatusCode::InvalidArgument,
            &[
                &format!("rodata_segments[{idx}]"),
                "external data",
                "exceeds the file length",
            ],
        );
    }
}

// ---------------------------------------------------------------------------
// Randomized corruptions: Ok or Err, never a panic
// ---------------------------------------------------------------------------

#[test]
fn every_truncation() {
    for (name, bytes) in all_modules() {
        let fb_end = parse(&bytes).unwrap().flatbuffer_range().end;
        let mut oks = 0;
        for len in 0..bytes.len() {
            let ok = must_not_panic(bytes[..len].to_vec(), &|| {
                format!("{name} truncated to {len}")
            });
            if len < fb_end {
                assert!(!ok, "{name} truncated to {len} bytes parsed Ok");
            }
            oks += ok as usize;
        }
        // Only cuts after the last referenced byte (ZIP trailer) may parse.
        assert!(oks < bytes.len() - fb_end + 1, "{name}: {oks}");
    }
}

#[test]
fn single_bit_flips() {
    let mut total = 0;
    for (name, bytes) in all_modules() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ bytes.len() as u64);
        let flips = 4000.max(bytes.len() / 2);
        for _ in 0..flips {
            let bit = rng.below(bytes.len() * 8);
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            must_not_panic(b, &|| format!("{name} with bit {bit} flipped"));
            total += 1;
        }
    }
    assert!(total >= 12_000);
}

#[test]
fn every_bit_flip_in_small_module_flatbuffer() {
    let bytes = imports_module();
    for bit in 0..bytes.len() * 8 {
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        must_not_panic(b, &|| format!("fa_imports with bit {bit} flipped"));
    }
}

#[test]
fn random_byte_overwrites() {
    for (name, bytes) in all_modules() {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ bytes.len() as u64);
        for round in 0..3000 {
            let mut b = bytes.clone();
            let n = 1 + rng.below(8);
            for _ in 0..n {
                let at = rng.below(b.len());
                b[at] = match rng.below(4) {
                    0 => 0,
                    1 => 0xFF,
                    2 => 0x80,
                    _ => rng.next() as u8,
                };
            }
            must_not_panic(b, &|| format!("{name} overwrite round {round}"));
        }
    }
}

#[test]
fn corrupted_offsets() {
    const VALUES: [u32; 10] = [
        0,
        1,
        3,
        4,
        0x7FFF_FFFF,
        0x8000_0000,
        0xFFFF_FFFF,
        0xFFFF_FFFC,
        0x10000,
        0xFFFF,
    ];
    for (name, bytes) in all_modules() {
        let fb = fb_start(&bytes);
        let end = parse(&bytes).unwrap().flatbuffer_range().end;
        let mut rng = Rng(0xA076_1D64_78BD_642F ^ bytes.len() as u64);
        // Every aligned word of the flatbuffer (offsets, lengths, soffsets,
        // scalars) replaced by boundary values and by near-misses.
        let mut word = fb;
        while word + 4 <= end {
            let orig = rd_u32(&bytes, word);
            let extra = [
                orig.wrapping_add(4),
                orig.wrapping_sub(4),
                orig.wrapping_add(rng.below(64) as u32),
                (end - fb) as u32,
                (bytes.len() - word) as u32,
            ];
            for v in VALUES.iter().chain(extra.iter()) {
                let mut b = bytes.clone();
                patch_u32(&mut b, word, *v);
                must_not_panic(b, &|| format!("{name}: word at {word:#x} set to {v:#x}"));
            }
            // 16-bit halves too (vtable entries are u16).
            for half in [word, word + 2] {
                for v in [0u16, 0xFFFF, 0x8000, 2, 3] {
                    let mut b = bytes.clone();
                    b[half..half + 2].copy_from_slice(&v.to_le_bytes());
                    must_not_panic(b, &|| format!("{name}: u16 at {half:#x} set to {v:#x}"));
                }
            }
            word += 4;
        }
    }
}

#[test]
fn garbage_inputs() {
    let mut rng = Rng(12345);
    for len in [0usize, 1, 4, 8, 15, 16, 17, 31, 64, 200, 4096] {
        for _ in 0..200 {
            let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if len >= 12 && rng.below(2) == 0 {
                // Plausible header: sane size prefix and identifier.
                patch_u32(&mut b, 0, (len - 4) as u32);
                b[8..12].copy_from_slice(b"IREE");
                let root = 8 + 4 * rng.below((len - 8) / 4);
                patch_u32(&mut b, 4, root as u32);
            }
            must_not_panic(b, &|| format!("garbage of length {len}"));
        }
    }
}

// ---------------------------------------------------------------------------
// Cross-check against `iree-dump-module --output=flatbuffer-json`
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, k: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(kk, _)| kk == k).map(|(_, v)| v),
            _ => None,
        }
    }
    fn arr(&self, k: &str) -> &[Json] {
        match self.get(k) {
            Some(Json::Arr(a)) => a,
            _ => &[],
        }
    }
    fn num(&self, k: &str) -> f64 {
        match self.get(k) {
            Some(Json::Num(n)) => *n,
            _ => 0.0,
        }
    }
    fn str(&self, k: &str) -> Option<&str> {
        match self.get(k) {
            Some(Json::Str(s)) => Some(s),
            _ => None,
        }
    }
}

struct JsonParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn value(&mut self) -> Json {
        self.ws();
        match self.s[self.i] {
            b'{' => {
                self.i += 1;
                let mut m = Vec::new();
                loop {
                    self.ws();
                    if self.s[self.i] == b'}' {
                        self.i += 1;
                        return Json::Obj(m);
                    }
                    let Json::Str(k) = self.value() else {
                        panic!("key")
                    };
                    self.ws();
                    assert_eq!(self.s[self.i], b':');
                    self.i += 1;
                    let v = self.value();
                    m.push((k, v));
                    self.ws();
                    if self.s[self.i] == b',' {
                        self.i += 1;
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut a = Vec::new();
                loop {
                    self.ws();
                    if self.s[self.i] == b']' {
                        self.i += 1;
                        return Json::Arr(a);
                    }
                    a.push(self.value());
                    self.ws();
                    if self.s[self.i] == b',' {
                        self.i += 1;
                    }
                }
            }
            b'"' => {
                self.i += 1;
                let mut out = Vec::new();
                loop {
                    let c = self.s[self.i];
                    self.i += 1;
                    match c {
                        b'"' => return Json::Str(String::from_utf8(out).unwrap()),
                        b'\\' => {
                            let e = self.s[self.i];
                            self.i += 1;
                            let ch = match e {
                                b'n' => '\n',
                                b't' => '\t',
                                b'r' => '\r',
                                b'b' => '\u{8}',
                                b'f' => '\u{c}',
                                b'u' => {
                                    let h =
                                        std::str::from_utf8(&self.s[self.i..self.i + 4]).unwrap();
                                    self.i += 4;
                                    char::from_u32(u32::from_str_radix(h, 16).unwrap())
                                        .unwrap_or('?')
                                }
                                other => other as char,
                            };
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        _ => out.push(c),
                    }
                }
            }
            b't' => {
                self.i += 4;
                Json::Bool(true)
            }
            b'f' => {
                self.i += 5;
                Json::Bool(false)
            }
            b'n' => {
                self.i += 4;
                Json::Null
            }
            _ => {
                let st = self.i;
                while self.i < self.s.len()
                    && matches!(
                        self.s[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                Json::Num(
                    std::str::from_utf8(&self.s[st..self.i])
                        .unwrap()
                        .parse()
                        .unwrap(),
                )
            }
        }
    }
}

fn feature_bits(j: Option<&Json>) -> u32 {
    match j {
        None => 0,
        Some(Json::Num(n)) => *n as u32,
        Some(Json::Str(s)) => s
            .split_whitespace()
            .map(|w| match w {
                "EXT_F32" => 1,
                "EXT_F64" => 2,
                "YIELD" => 4,
                "UNWIND" => 8,
                other => panic!("unknown feature bit {other}"),
            })
            .sum(),
        Some(other) => panic!("unexpected feature bits {other:?}"),
    }
}

fn cross_check(name: &str, bytes: &[u8]) {
    let path = scratch_dir().join(format!("xcheck_{name}.vmfb"));
    std::fs::write(&path, bytes).unwrap();
    let out = run_tool(
        "iree-dump-module",
        &["--output=flatbuffer-json", path.to_str().unwrap()],
        "flatbuffer json",
    );
    let j = JsonParser { s: &out, i: 0 }.value();
    let a = parse(bytes).unwrap();
    assert_eq!(j.str("name"), Some(a.name()));
    assert_eq!(j.num("version") as u32, a.version());
    assert_eq!(feature_bits(j.get("requirements")), a.requirements());
    let types: Vec<_> = j
        .arr("types")
        .iter()
        .map(|t| t.str("full_name").unwrap())
        .collect();
    assert_eq!(types, a.types());
    let attrs: Vec<_> = j
        .arr("attrs")
        .iter()
        .map(|t| {
            (
                t.str("key").unwrap_or("").to_owned(),
                t.str("value").unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(attrs, a.attrs());
    assert_eq!(j.arr("dependencies").len(), a.dependencies().len());
    for (jd, d) in j.arr("dependencies").iter().zip(a.dependencies()) {
        assert_eq!(jd.str("name"), Some(d.name.as_str()));
        assert_eq!(jd.num("minimum_version") as u32, d.minimum_version);
        assert_eq!(
            jd.str("flags").is_some_and(|f| f.contains("OPTIONAL")),
            d.optional
        );
    }
    let sig_eq = |js: Option<&Json>, s: &ferrite_vm::bytecode::archive::SignatureDef| {
        let js = js.cloned().unwrap_or(Json::Obj(vec![]));
        assert_eq!(
            js.str("calling_convention"),
            s.calling_convention.as_deref()
        );
        let attrs: Vec<_> = js
            .arr("attrs")
            .iter()
            .map(|t| {
                (
                    t.str("key").unwrap_or("").to_owned(),
                    t.str("value").unwrap_or("").to_owned(),
                )
            })
            .collect();
        assert_eq!(attrs, s.attrs);
    };
    assert_eq!(j.arr("imported_functions").len(), a.imports().len());
    for (ji, i) in j.arr("imported_functions").iter().zip(a.imports()) {
        assert_eq!(ji.str("full_name"), Some(i.full_name.as_str()));
        assert_eq!(
            ji.str("flags").is_some_and(|f| f.contains("OPTIONAL")),
            i.optional
        );
        sig_eq(ji.get("signature"), &i.signature);
    }
    assert_eq!(j.arr("exported_functions").len(), a.exports().len());
    for (je, e) in j.arr("exported_functions").iter().zip(a.exports()) {
        assert_eq!(je.str("local_name"), Some(e.local_name.as_str()));
        assert_eq!(je.num("internal_ordinal") as u32, e.internal_ordinal);
    }
    assert_eq!(
        j.arr("function_signatures").len(),
        a.function_signatures().len()
    );
    for (js, s) in j
        .arr("function_signatures")
        .iter()
        .zip(a.function_signatures())
    {
        sig_eq(Some(js), s);
    }
    assert_eq!(j.arr("rodata_segments").len(), a.rodata_segments().len());
    for (idx, (jr, r)) in j
        .arr("rodata_segments")
        .iter()
        .zip(a.rodata_segments())
        .enumerate()
    {
        if let Some(Json::Arr(data)) = jr.get("embedded_data") {
            let want: Vec<u8> = data
                .iter()
                .map(|v| if let Json::Num(n) = v { *n as u8 } else { 0 })
                .collect();
            assert!(!r.external);
            assert_eq!(a.rodata(idx).unwrap(), want);
        } else {
            assert!(r.external);
            assert_eq!(jr.num("external_data_length") as usize, r.len);
            let base = a.flatbuffer_range().end.next_multiple_of(64);
            assert_eq!(base + jr.num("external_data_offset") as usize, r.offset);
        }
    }
    let rw: Vec<u32> = j
        .arr("rwdata_segments")
        .iter()
        .map(|r| r.num("byte_size") as u32)
        .collect();
    assert_eq!(rw, a.rwdata_segments());
    let st = j.get("module_state").cloned().unwrap_or(Json::Obj(vec![]));
    assert_eq!(
        st.num("global_bytes_capacity") as u32,
        a.module_state().global_bytes_capacity
    );
    assert_eq!(
        st.num("global_ref_count") as u32,
        a.module_state().global_ref_count
    );
    assert_eq!(
        j.arr("function_descriptors").len(),
        a.function_descriptors().len()
    );
    for (jd, d) in j
        .arr("function_descriptors")
        .iter()
        .zip(a.function_descriptors())
    {
        assert_eq!(jd.num("bytecode_offset") as u32, d.bytecode_offset);
        assert_eq!(jd.num("bytecode_length") as u32, d.bytecode_length);
        assert_eq!(feature_bits(jd.get("requirements")), d.requirements);
        assert_eq!(jd.num("block_count") as u16, d.block_count);
        assert_eq!(jd.num("i32_register_count") as u16, d.i32_register_count);
        assert_eq!(jd.num("ref_register_count") as u16, d.ref_register_count);
    }
    let (maj, min) = a.bytecode_version();
    assert_eq!(
        j.num("bytecode_version") as u32,
        (maj as u32) << 16 | min as u32
    );
    let code: Vec<u8> = j
        .arr("bytecode_data")
        .iter()
        .map(|v| if let Json::Num(n) = v { *n as u8 } else { 0 })
        .collect();
    assert_eq!(code, a.bytecode());
    match (j.get("debug_database"), a.debug_database()) {
        (None, None) => {}
        (Some(jdb), Some(db)) => {
            let kinds = jdb.arr("location_table_type");
            let vals = jdb.arr("location_table");
            assert_eq!(kinds.len(), db.locations.len());
            for ((k, v), loc) in kinds.iter().zip(vals).zip(&db.locations) {
                match (k, loc) {
                    (Json::Str(k), Location::Unknown) => assert_eq!(k, "NONE"),
                    (
                        Json::Str(k),
                        Location::FileLineCol {
                            filename,
                            line,
                            column,
                        },
                    ) => {
                        assert_eq!(k, "FileLineColLocDef");
                        assert_eq!(v.str("filename"), Some(filename.as_str()));
                        assert_eq!(v.num("line") as i32, *line);
                        assert_eq!(v.num("column") as i32, *column);
                    }
                    (Json::Str(k), Location::CallSite { callee, caller }) => {
                        assert_eq!(k, "CallSiteLocDef");
                        assert_eq!(v.num("callee") as i32, *callee);
                        assert_eq!(v.num("caller") as i32, *caller);
                    }
                    (Json::Str(k), Location::Fused { locations, .. }) => {
                        assert_eq!(k, "FusedLocDef");
                        assert_eq!(v.arr("locations").len(), locations.len());
                    }
                    (Json::Str(k), Location::Name { name, .. }) => {
                        assert_eq!(k, "NameLocDef");
                        assert_eq!(v.str("name"), Some(name.as_str()));
                    }
                    other => panic!("unexpected location {other:?}"),
                }
            }
            let jf = jdb.arr("functions");
            assert_eq!(jf.len(), db.functions.len());
            for (jf, f) in jf.iter().zip(&db.functions) {
                assert_eq!(jf.str("local_name").unwrap_or(""), f.local_name);
                let locs: Vec<(i32, i32)> = jf
                    .arr("locations")
                    .iter()
                    .map(|l| (l.num("bytecode_offset") as i32, l.num("location") as i32))
                    .collect();
                let mine: Vec<(i32, i32)> = f
                    .locations
                    .iter()
                    .map(|e| (e.bytecode_offset, e.location))
                    .collect();
                assert_eq!(locs, mine);
            }
        }
        (j, m) => panic!(
            "debug database presence differs: json {} vs ours {}",
            j.is_some(),
            m.is_some()
        ),
    }
}

#[test]
fn cross_check_with_iree_dump_module() {
    if !venv_tool_path("iree-dump-module").exists() {
        ferrite_testkit::skip_or_fail(
            "cross_check_with_iree_dump_module",
            &format!("{} not found", venv_tool_path("iree-dump-module").display()),
        );
        return;
    }
    for (name, bytes) in all_modules() {
        cross_check(name, &bytes);
    }
    // Any other fixtures the build produced.
    for dir in fixture_dirs() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "vmfb") {
                let bytes = std::fs::read(&p).unwrap();
                cross_check(p.file_stem().unwrap().to_str().unwrap(), &bytes);
            }
        }
    }
}

/// Many vector entries aliasing one table with a large string must hit the
/// decode budget instead of allocating `entries x string` bytes.
#[test]
fn aliased_offsets_hit_the_budget() {
    const ROOT_TYPES: usize = 4;
    const ENTRIES: usize = 40_000;
    const STRING_LEN: usize = 65_536;
    let mut b = imports_module();
    let fb = fb_start(&b);
    while b.len() & 3 != 0 {
        b.push(0);
    }
    // Appended after the flatbuffer (uoffsets only point forward):
    // [types vector of ENTRIES offsets][vtable][TypeDef table][string].
    let vec_pos = b.len();
    let vt = vec_pos + 4 + 4 * ENTRIES;
    let t = vt + 8;
    let field = t + 4;
    let s = field + 4;
    b.extend_from_slice(&(ENTRIES as u32).to_le_bytes());
    for i in 0..ENTRIES {
        let elem = vec_pos + 4 + 4 * i;
        b.extend_from_slice(&((t - elem) as u32).to_le_bytes());
    }
    // vtable: size 6, object size 8, field 0 at offset 4 (+2 padding).
    b.extend_from_slice(&[6, 0, 8, 0, 4, 0, 0, 0]);
    b.extend_from_slice(&((t - vt) as i32).to_le_bytes());
    b.extend_from_slice(&((s - field) as u32).to_le_bytes());
    b.extend_from_slice(&(STRING_LEN as u32).to_le_bytes());
    b.resize(b.len() + STRING_LEN, b'a');
    b.extend_from_slice(&[0, 0, 0, 0]);
    // Point the root's `types` field at the vector and fix the size prefix.
    let at = field_pos(&b, root_table(&b), ROOT_TYPES).expect("types field");
    patch_u32(&mut b, at, (vec_pos - at) as u32);
    let total = b.len();
    patch_u32(&mut b, fb - 4, (total - fb) as u32);
    expect_err(
        &b,
        StatusCode::InvalidArgument,
        &["BytecodeModuleDef.types[", "budget"],
    );
    // The same layout with a short string and few entries parses.
    let mut ok = b.clone();
    patch_u32(&mut ok, vec_pos, 3);
    patch_u32(&mut ok, s, 1);
    ok[s + 5] = 0;
    let a = parse(&ok).expect("aliased but small");
    assert_eq!(a.types(), ["a", "a", "a"]);
}

// ---------------------------------------------------------------------------
// Loader limits and strictness: counts from the file are bounded before
// anything is allocated, and what upstream's loader rejects is rejected.
// ---------------------------------------------------------------------------

/// Loads `bytes` as a bytecode module and creates a context for it.
fn load_and_instantiate(bytes: &[u8]) -> ferrite_base::Result<()> {
    let instance = ferrite_vm::Instance::default();
    let module =
        ferrite_vm::BytecodeModule::load(&instance, ModuleBytes::from_vec(bytes.to_vec()))?;
    let mut ctx = ferrite_vm::Context::new(&instance);
    ctx.register(module)?;
    Ok(())
}

/// File offset of field `id` of the `module_state` table.
fn module_state_field(b: &[u8], id: usize) -> usize {
    let root = root_table(b);
    let ms = deref(
        b,
        field_pos(b, root, ROOT_MODULE_STATE).expect("module_state"),
    );
    field_pos(b, ms, id).expect("module_state field present")
}

#[test]
fn state_module_loads_and_runs() {
    load_and_instantiate(&state_module()).expect("the unpatched module loads");
}

#[test]
fn huge_ref_global_count_is_resource_exhausted_not_an_abort() {
    // Before the limit, 0x7fffffff aborted the process ("memory allocation
    // of 51539607528 bytes failed") and 0x10000000 took gigabytes.
    for count in [
        0x7fff_ffff_u32,
        0x1000_0000,
        ferrite_vm::bytecode::module::MAX_REF_GLOBALS + 1,
    ] {
        let mut b = state_module();
        let at = module_state_field(&b, 1);
        patch_u32(&mut b, at, count);
        let e = load_and_instantiate(&b).expect_err("a huge ref global count must be refused");
        assert_eq!(e.code(), StatusCode::ResourceExhausted, "{e}");
        assert!(e.message().contains("ref globals"), "{e}");
        assert!(e.message().contains(&count.to_string()), "{e}");
    }
}

#[test]
fn huge_global_byte_count_is_resource_exhausted() {
    for bytes in [
        0x7fff_ffff_u32,
        ferrite_vm::bytecode::module::MAX_GLOBAL_BYTES + 1,
    ] {
        let mut b = state_module();
        let at = module_state_field(&b, 0);
        patch_u32(&mut b, at, bytes);
        let e = load_and_instantiate(&b).expect_err("a huge global byte count must be refused");
        assert_eq!(e.code(), StatusCode::ResourceExhausted, "{e}");
        assert!(e.message().contains("bytes of globals"), "{e}");
    }
}

#[test]
fn counts_at_the_limits_still_load() {
    let mut b = state_module();
    let (refs, bytes) = (module_state_field(&b, 1), module_state_field(&b, 0));
    patch_u32(&mut b, refs, 1000);
    patch_u32(&mut b, bytes, 4096);
    load_and_instantiate(&b).expect("modest counts are fine");
}

#[test]
fn unknown_module_requirement_bits_are_rejected() {
    let good = state_module();
    let at = field_pos(&good, root_table(&good), ROOT_REQUIREMENTS).expect("requirements");
    // YIELD and UNWIND are provided (upstream has them too); bit 4 and up
    // are not.
    let mut b = good.clone();
    patch_u32(&mut b, at, rd_u32(&good, at) | 0b1100);
    parse(&b).expect("YIELD|UNWIND are available");
    for bit in [4, 7, 31] {
        let mut b = good.clone();
        patch_u32(&mut b, at, rd_u32(&good, at) | 1 << bit);
        let m = expect_err(
            &b,
            StatusCode::InvalidArgument,
            &["requirements", "not available"],
        );
        assert!(m.contains(&format!("{:#x}", 1u32 << bit)), "{m}");
    }
}

#[test]
fn unknown_function_requirement_bits_are_rejected() {
    let good = state_module();
    let p = descriptor_pos(&good, 0);
    let mut b = good.clone();
    patch_u32(&mut b, p + 8, rd_u32(&good, p + 8) | 1 << 9);
    expect_err(
        &b,
        StatusCode::InvalidArgument,
        &["function_descriptors[0]", "requirements"],
    );
}

#[test]
fn extension_ops_need_the_functions_own_requirement() {
    // The function uses add.f32: without EXT_F32 in its descriptor it is
    // refused even though the module requires EXT_F32 (as upstream checks
    // the function's requirements).
    let good = state_module();
    let p = descriptor_pos(&good, 0);
    let mut b = good.clone();
    patch_u32(&mut b, p + 8, rd_u32(&good, p + 8) & !1);
    let e = load_and_instantiate(&b).expect_err("f32 op without the function requiring EXT_F32");
    assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
    assert!(e.message().contains("EXT_F32"), "{e}");
}

#[test]
fn block_count_must_match_the_blocks() {
    let good = state_module();
    let p = descriptor_pos(&good, 0);
    let declared = rd_u16(&good, p + 14);
    assert_eq!(declared, 2, "the fixture function has two blocks");
    for wrong in [declared + 1, declared + 100, declared - 1] {
        let mut b = good.clone();
        b[p + 14..p + 16].copy_from_slice(&wrong.to_le_bytes());
        let e = load_and_instantiate(&b).expect_err("a wrong block count must be refused");
        assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
        assert!(
            e.message()
                .contains(&format!("declares {wrong} blocks, bytecode has {declared}")),
            "{e}"
        );
    }
}

/// File offset of rodata segment `i`'s table and of its vtable.
fn rodata_segment_table(b: &[u8], i: usize) -> (usize, usize) {
    let v = deref(
        b,
        field_pos(b, root_table(b), ROOT_RODATA).expect("rodata_segments"),
    );
    let t = deref(b, v + 4 + 4 * i);
    let vt = (t as i64 - rd_u32(b, t) as i32 as i64) as usize;
    (t, vt)
}

#[test]
fn vtable_entries_of_fields_not_decoded_must_lie_inside_their_table() {
    // A RodataSegmentDef's vtable entry for `compression_type` (field 1, a
    // union value Ferrite does not otherwise read) pointing past the table:
    // upstream's FlatBuffer verifier rejects it ("table field out of range").
    let good = imports_module();
    let (_, vt) = rodata_segment_table(&good, 0);
    assert!(rd_u16(&good, vt) >= 8, "the vtable lists field 1");
    let object_len = rd_u16(&good, vt + 2);
    let mut b = good.clone();
    b[vt + 6..vt + 8].copy_from_slice(&(object_len + 8).to_le_bytes());
    expect_err(
        &b,
        StatusCode::InvalidArgument,
        &["vtable", "field 1", "out of range"],
    );
}

#[test]
fn union_value_without_a_type_is_rejected() {
    // `compression_type` given a value (the embedded_data offset field) while
    // its type stays NONE.
    let good = imports_module();
    let (_, vt) = rodata_segment_table(&good, 0);
    let data_entry = rd_u16(&good, vt + 8);
    assert_ne!(data_entry, 0, "segment 0 has embedded data");
    let mut b = good.clone();
    b[vt + 6..vt + 8].copy_from_slice(&data_entry.to_le_bytes());
    expect_err(&b, StatusCode::InvalidArgument, &["compression_type"]);
}

#[test]
fn misaligned_tables_are_rejected() {
    // The module_state offset moved by 2: a table must start 4-byte aligned
    // (upstream: "table header out of range or unaligned").
    let good = state_module();
    let at = field_pos(&good, root_table(&good), ROOT_MODULE_STATE).expect("module_state");
    let mut b = good.clone();
    patch_u32(&mut b, at, rd_u32(&good, at) + 2);
    expect_err(&b, StatusCode::InvalidArgument, &["not 4-byte aligned"]);
}

#[test]
fn odd_64_bit_registers_are_rejected() {
    // add.i64 (opcode 0x2A) %i2:3 = %i0:1, %i0:1, encoded as three u16
    // register ordinals; upstream requires 64-bit registers to be even.
    let good = i64_module();
    load_and_instantiate(&good).expect("the unpatched module loads");
    let pat = [0x2A, 0, 0, 0, 0, 2, 0];
    let at = good
        .windows(pat.len())
        .position(|w| w == pat)
        .expect("add.i64 %i2:3 = %i0:1, %i0:1 in the bytecode");
    for (operand, odd) in [(1, 1u16), (5, 1)] {
        let mut b = good.clone();
        b[at + operand..at + operand + 2].copy_from_slice(&odd.to_le_bytes());
        let e = load_and_instantiate(&b).expect_err("odd i64 register");
        assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
        assert!(e.message().contains("not 8-byte aligned"), "{e}");
    }
}

#[test]
fn location_with_type_none_but_a_value_is_rejected() {
    // Upstream's verifier: "union element present with type NONE".
    let good = tensor_module();
    let root = root_table(&good);
    let db = deref(&good, field_pos(&good, root, 15).expect("debug_database"));
    let types = deref(&good, field_pos(&good, db, 0).expect("location_table_type"));
    let n = rd_u32(&good, types) as usize;
    let i = (0..n)
        .find(|&i| good[types + 4 + i] != 0)
        .expect("a location with a type");
    let mut b = good.clone();
    b[types + 4 + i] = 0;
    expect_err(&b, StatusCode::InvalidArgument, &["type NONE"]);
}

#[test]
fn offsets_must_point_past_themselves() {
    // The `types` vector offset set to 0: its "vector" would be the offset
    // itself (upstream: "vector header out of range or unaligned").
    for (name, good) in all_modules() {
        let at = field_pos(&good, root_table(&good), 4).expect("types");
        for rel in [0u32, 1, 2, 3] {
            let mut b = good.clone();
            patch_u32(&mut b, at, rel);
            assert!(parse(&b).is_err(), "{name}: types offset {rel} accepted");
        }
    }
}

#[test]
fn location_with_a_type_but_no_value_is_rejected() {
    // Upstream's verifier: "union element absent without type NONE", also
    // for union types this runtime does not know.
    let good = tensor_module();
    let root = root_table(&good);
    let db = deref(&good, field_pos(&good, root, 15).expect("debug_database"));
    let types = deref(&good, field_pos(&good, db, 0).expect("location_table_type"));
    let values = deref(&good, field_pos(&good, db, 1).expect("location_table"));
    let i = (0..rd_u32(&good, types) as usize)
        .find(|&i| good[types + 4 + i] != 0)
        .expect("a location with a type");
    for kind in [good[types + 4 + i], 128] {
        let mut b = good.clone();
        b[types + 4 + i] = kind;
        patch_u32(&mut b, values + 4 + 4 * i, 0);
        expect_err(&b, StatusCode::InvalidArgument, &["has no value"]);
    }
}

/// An op after a terminator with no block marker between (the assembler
/// emits one for `vm.fail` then `vm.return`): upstream's verifier refuses
/// it ("op ... is not in a block"), and so does ours, naming the offset.
const OP_AFTER_TERMINATOR_VMASM: &str = r#"
vm.module @fa_after_terminator version 0
vm.type i32

vm.export @main
vm.func @main() -> () {
^bb0:
  %i0 = vm.const.i32 0
  vm.fail %i0, "status 0 falls through"
  vm.return
}
"#;

#[test]
fn op_after_a_terminator_outside_any_block_is_refused() {
    let bytes = module("fa_after_terminator", OP_AFTER_TERMINATOR_VMASM, false);
    let e = load_and_instantiate(&bytes).expect_err("an op outside any block");
    assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
    let text = e.to_string();
    assert!(text.contains("is not in a block"), "{text}");
    assert!(text.contains("bytecode offset"), "{text}");
}
