//! The crate graph keeps the shape docs/design.md's "Layout" draws: arrows
//! point down only, the VM knows nothing of the HAL, the HAL core and the
//! drivers know nothing of the VM (only `ferrite-hal-module` binds them),
//! and nothing below the tools depends on the tools. Each workspace crate's
//! normal `[dependencies]` on other `ferrite-*` crates are checked against
//! the layer table below; a new crate must be given its layer here.

use std::path::{Path, PathBuf};

/// Layers, lowest first: a crate may depend only on crates of lower layers.
const LAYERS: &[(&str, u32)] = &[
    ("ferrite-base", 0),
    ("ferrite-testkit", 0),
    ("ferrite-vm", 1),
    ("ferrite-hal", 1),
    ("ferrite-tokenizer", 1),
    ("ferrite-hal-module", 2),
    // Test tooling (the HAL conformance suite): a dev-dependency of the
    // drivers' tests, never of runtime crates.
    ("ferrite-hal-cts", 2),
    ("ferrite-launch", 2),
    ("ferrite-modules", 3),
    ("ferrite", 4),
    ("ferrite-tooling", 5),
    // Text generation (issue 27): above the facade, below the CLI and Python.
    ("ferrite-llm", 5),
    ("ferrite-e2e", 6),
    // The OpenAI-compatible server (issue 29): over ferrite-llm, under the CLI.
    ("ferrite-serve", 6),
    ("ferrite-cli", 7),
    // The Python package carries the CLI too (the pip `ferrite` command
    // runs `ferrite_cli::main_with_args`), so it sits above it.
    ("ferrite-python", 8),
];

/// Drivers (`ferrite-hal-<name>` other than the VM module) sit at layer 2
/// and may depend on these alone.
const DRIVER_DEPENDENCIES: &[&str] = &["ferrite-base", "ferrite-hal"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn is_driver(name: &str) -> bool {
    name.starts_with("ferrite-hal-") && name != "ferrite-hal-module" && name != "ferrite-hal-cts"
}

fn layer(name: &str) -> Option<u32> {
    if is_driver(name) {
        return Some(2);
    }
    LAYERS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
}

/// The `ferrite-*` names in the manifest's `[dependencies]` table (normal
/// dependencies; dev-dependencies may go anywhere).
fn normal_ferrite_dependencies(manifest: &str) -> Vec<String> {
    let mut in_deps = false;
    let mut deps = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if !in_deps || line.starts_with('#') {
            continue;
        }
        let name = line
            .split(['=', '.', ' '])
            .next()
            .unwrap_or("")
            .trim_matches('"');
        if name == "ferrite" || name.starts_with("ferrite-") {
            deps.push(name.to_string());
        }
    }
    deps
}

#[test]
fn dependencies_point_down_the_layers() {
    let crates = workspace_root().join("crates");
    let mut problems = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(&crates).expect("reading crates/") {
        let dir = entry.unwrap().path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        seen += 1;
        let Some(own) = layer(&name) else {
            problems.push(format!("{name}: no layer (add it to LAYERS in this test)"));
            continue;
        };
        for dep in normal_ferrite_dependencies(&manifest) {
            if is_driver(&name) && !DRIVER_DEPENDENCIES.contains(&dep.as_str()) {
                problems.push(format!("{name} is a driver but depends on {dep}"));
            }
            match layer(&dep) {
                Some(l) if l < own => {}
                Some(l) => problems.push(format!(
                    "{name} (layer {own}) depends on {dep} (layer {l}): arrows must point down"
                )),
                None => problems.push(format!("{name} depends on {dep}, which has no layer")),
            }
        }
    }
    assert!(
        seen >= 10,
        "only {seen} crates found under {}",
        crates.display()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_manifest_reader_sees_normal_dependencies_only() {
    let m = "[package]\nname = \"x\"\n[dependencies]\nferrite-hal.workspace = true\nferrite = { path = \"../ferrite\" }\n# ferrite-vm = no\nclap = \"4\"\n[dev-dependencies]\nferrite-vm.workspace = true\n";
    assert_eq!(normal_ferrite_dependencies(m), ["ferrite-hal", "ferrite"]);
}
