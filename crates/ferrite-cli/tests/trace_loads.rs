//! Loading in the `--trace=FILE.json` trace: opening the parameter file
//! (mapped, or read with `--parameter_mode=preload`) and indexing it,
//! loading the program (its verification and, with the compiling tier on,
//! its compilation inside), and registering each module, as `load` spans
//! on the host track before the first invocation.

use ferrite_testkit::parameter_files::safetensors;
use ferrite_testkit::{compile_file, f32_bytes, workspace_root, GENERIC_CPU};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// A `load` span read back: name, start, end (microseconds), args.
type LoadSpan = (String, f64, f64, Value);

fn out_dir() -> PathBuf {
    ferrite_testkit::target_tmpdir!("trace_loads")
}

/// Runs the parameterized program with `extra` flags and `--trace`;
/// returns the trace's `load` spans (name, start, end, args) and the
/// invocations (name, start).
fn loads(tag: &str, extra: &[&str]) -> (Vec<LoadSpan>, Vec<(String, f64)>) {
    let dir = out_dir();
    let module = compile_file(
        &workspace_root().join("tests/parameters/affine.mlir"),
        &dir.join("affine.vmfb"),
        GENERIC_CPU,
    );
    let params = dir.join("affine.safetensors");
    let tensors = [
        ("b", &[4u64][..], f32_bytes(&[1.0; 4])),
        ("w", &[4], f32_bytes(&[2.0; 4])),
    ];
    std::fs::write(&params, safetensors(&tensors)).unwrap();
    let trace = dir.join(format!("loads_{tag}.json"));
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .arg("run-module")
        .arg(format!("--module={}", module.display()))
        .arg(format!("--parameters=model={}", params.display()))
        .args([
            "--device=local-sync",
            "--function=main",
            "--input=4xf32=1,2,3,4",
        ])
        .arg(format!("--trace={}", trace.display()))
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&trace).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let spans = events
        .iter()
        .filter(|e| e["cat"] == "load")
        .map(|e| {
            assert_eq!(e["ph"], "X", "{e}");
            assert_eq!(e["pid"], 1, "load spans are on the host track: {e}");
            let ts = e["ts"].as_f64().unwrap();
            (
                e["name"].as_str().unwrap().to_string(),
                ts,
                ts + e["dur"].as_f64().unwrap(),
                e["args"].clone(),
            )
        })
        .collect();
    let calls = events
        .iter()
        .filter(|e| e["cat"] == "invocation")
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["ts"].as_f64().unwrap(),
            )
        })
        .collect();
    (spans, calls)
}

fn span<'a>(spans: &'a [(String, f64, f64, Value)], prefix: &str) -> &'a (String, f64, f64, Value) {
    let found: Vec<_> = spans.iter().filter(|s| s.0.starts_with(prefix)).collect();
    assert_eq!(found.len(), 1, "one '{prefix}' span in {spans:?}");
    found[0]
}

#[test]
fn loads_are_spans_before_the_first_call() {
    let (spans, calls) = loads("mapped", &[]);
    let params = out_dir().join("affine.safetensors");
    let map = span(&spans, "map parameter file ");
    assert!(map.0.ends_with(&params.display().to_string()), "{map:?}");
    let index = span(&spans, "index parameter file ");
    assert_eq!(index.3["entries"], 2, "{index:?}");
    let load = span(&spans, "load module ");
    let size = std::fs::metadata(out_dir().join("affine.vmfb"))
        .unwrap()
        .len();
    assert_eq!(load.3["bytes"], size, "{load:?}");
    // Verification and compilation happen inside the load.
    for inner in ["verify module ", "jit compile module "] {
        let s = span(&spans, inner);
        assert!(s.1 >= load.1 && s.2 <= load.2, "{s:?} inside {load:?}");
    }
    assert!(span(&spans, "verify module ").3["functions"].as_u64() >= Some(1));
    span(&spans, "register module hal");
    let module = load.0.trim_start_matches("load module ");
    let register = span(&spans, &format!("register module {module}"));
    assert!(register.1 >= load.2, "registered after loading: {spans:?}");
    // The module's initializer runs inside its registration; the call
    // asked for comes after every load.
    let at = |name: &str| {
        calls
            .iter()
            .find(|c| c.0 == name)
            .unwrap_or_else(|| panic!("no invocation {name} in {calls:?}"))
            .1
    };
    let init = at(&format!("{module}.__init"));
    assert!(
        init >= register.1 && init <= register.2,
        "{calls:?} {register:?}"
    );
    let main = at(&format!("{module}.main"));
    for s in &spans {
        assert!(s.2 <= main, "{s:?} ends before the call of main");
    }
}

#[test]
fn preloaded_parameters_and_the_interpreter_only() {
    let (spans, _) = loads("preload", &["--parameter_mode=preload", "--vm_jit=false"]);
    span(&spans, "read parameter file ");
    span(&spans, "index parameter file ");
    assert!(
        !spans.iter().any(|s| s.0.starts_with("map parameter file")),
        "{spans:?}"
    );
    assert!(
        !spans.iter().any(|s| s.0.starts_with("jit compile")),
        "no compilation with the tier off: {spans:?}"
    );
    span(&spans, "verify module ");
}
