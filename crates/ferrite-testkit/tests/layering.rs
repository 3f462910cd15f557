//! The crate graph keeps the shape docs/design.md's "Layout" draws: arrows
//! point down only, the VM knows nothing of the HAL, the HAL core and the
//! drivers know nothing of the VM (only `ferrite-hal-module` binds them),
//! and nothing below the tools depends on the tools. Each workspace crate's
//! dependencies on other `ferrite-*` crates are checked against the layer
//! table below, in every form a manifest can declare one: the
//! `[dependencies]` and `[build-dependencies]` tables, a
//! `[dependencies.NAME]` table, the same under `[target.'cfg(..)']`, and a
//! renamed dependency (`vm = { package = "ferrite-vm" }`); dev-dependencies
//! may point anywhere. A new crate must be given its layer here.

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

/// Drivers whose memory and queues other crates reach only through the HAL
/// (`ferrite_hal::external`, `Device::native_queue`) and whose devices come
/// from the facade's driver registry: only the facade names them.
const REGISTRY_ONLY_DRIVERS: &[&str] = &["ferrite-hal-cuda"];
const REGISTRY_OWNER: &str = "ferrite";

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

/// A dotted TOML key (`target.'cfg(unix)'.dependencies`) as its parts,
/// quotes removed; dots inside quotes do not split.
fn key_parts(key: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut quote = None;
    let mut chars = key.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            // A basic string's escape: the next character is literal.
            (Some('"'), '\\') => part.extend(chars.next()),
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '.') => parts.push(std::mem::take(&mut part)),
            (None, c) if c.is_whitespace() => {}
            (_, c) => part.push(c),
        }
    }
    parts.push(part);
    parts
}

/// The value of `package = "..."` inside an inline table, if any.
fn inline_package(value: &str) -> Option<String> {
    let inner = value.trim().strip_prefix('{')?.rsplit_once('}')?.0;
    inner.split(',').find_map(|field| {
        let (k, v) = field.split_once('=')?;
        (key_parts(k) == ["package"]).then(|| v.trim().trim_matches(['"', '\'']).to_string())
    })
}

/// For a full key path (table header plus dotted key), the rest after a
/// table of normal or build dependencies (`dependencies`,
/// `build-dependencies`, `target.X.dependencies`, ...); None elsewhere,
/// dev-dependencies included.
fn after_dependency_table(path: &[String]) -> Option<&[String]> {
    let is_deps = |s: &String| s == "dependencies" || s == "build-dependencies";
    match path {
        [t, rest @ ..] if is_deps(t) => Some(rest),
        [target, _, t, rest @ ..] if target == "target" && is_deps(t) => Some(rest),
        _ => None,
    }
}

/// The packages the manifest depends on outside dev-dependencies whose name
/// is `ferrite` or starts with `ferrite-`, in order of first mention.
fn normal_ferrite_dependencies(manifest: &str) -> Vec<String> {
    // (name in the manifest, package it names); `package =` renames.
    let mut deps: Vec<(String, String)> = Vec::new();
    let mut record =
        |name: &str, package: Option<String>| match deps.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => {
                if let Some(p) = package {
                    entry.1 = p;
                }
            }
            None => deps.push((
                name.to_string(),
                package.unwrap_or_else(|| name.to_string()),
            )),
        };
    let mut header: Vec<String> = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (path, value) = if let Some(h) = line.strip_prefix('[') {
            let h = h.trim_start_matches('[');
            let h = h.split(']').next().unwrap_or("");
            header = key_parts(h);
            (header.clone(), "")
        } else if let Some((key, value)) = line.split_once('=') {
            let mut path = header.clone();
            path.extend(key_parts(key));
            (path, value)
        } else {
            continue;
        };
        match after_dependency_table(&path) {
            Some([name]) => record(name, inline_package(value)),
            Some([name, field]) if field == "package" => {
                let package = value.trim().trim_matches(['"', '\'']).to_string();
                record(name, Some(package))
            }
            Some([name, ..]) => record(name, None),
            _ => {}
        }
    }
    let mut out: Vec<String> = Vec::new();
    for (_, package) in deps {
        if (package == "ferrite" || package.starts_with("ferrite-")) && !out.contains(&package) {
            out.push(package);
        }
    }
    out
}

/// What breaks the layering among the crates under `crates` (one directory
/// with a `Cargo.toml` each, named as the crate), and how many were read.
fn layering_problems(crates: &Path) -> (usize, Vec<String>) {
    let mut problems = Vec::new();
    let mut seen = 0;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(crates)
        .expect("reading crates/")
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    for dir in dirs {
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
            if REGISTRY_ONLY_DRIVERS.contains(&dep.as_str()) && name != REGISTRY_OWNER {
                problems.push(format!(
                    "{name} depends on {dep}: reach it through the HAL and the driver registry \
                     of {REGISTRY_OWNER}"
                ));
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
    (seen, problems)
}

#[test]
fn dependencies_point_down_the_layers() {
    let crates = workspace_root().join("crates");
    let (seen, problems) = layering_problems(&crates);
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

#[test]
fn the_manifest_reader_sees_every_form_of_dependency() {
    let m = r#"
[package]
name = "x"
[dependencies.ferrite-vm]
workspace = true
[target.'cfg(unix)'.dependencies]
ferrite-hal-module = { path = "../ferrite-hal-module" }
libc = "0.2"
[target."cfg(target_os = \"linux\")".dependencies.ferrite-tooling]
path = "../ferrite-tooling"
[build-dependencies]
ferrite-e2e.workspace = true
[dependencies]
vm2 = { package = "ferrite-cli", path = "../ferrite-cli" }
[dependencies.tools]
package = "ferrite-serve"
path = "../ferrite-serve"
[target.'cfg(unix)'.dev-dependencies]
ferrite-llm.workspace = true
[dev-dependencies.ferrite-python]
path = "../ferrite-python"
"#;
    assert_eq!(
        normal_ferrite_dependencies(m),
        [
            "ferrite-vm",
            "ferrite-hal-module",
            "ferrite-tooling",
            "ferrite-e2e",
            "ferrite-cli",
            "ferrite-serve"
        ]
    );
}

/// A workspace in a temporary directory whose crates declare upward
/// dependencies only in the table forms a `[dependencies]`-only reader
/// misses: the check must report each of them.
#[test]
fn upward_dependencies_in_table_forms_are_reported() {
    let root = std::env::temp_dir().join(format!("ferrite-layering-{}", std::process::id()));
    let crates = root.join("crates");
    let manifests = [
        (
            "ferrite-base",
            "[package]\nname = \"ferrite-base\"\n[dependencies.ferrite-vm]\npath = \"../ferrite-vm\"\n",
        ),
        (
            "ferrite-vm",
            "[package]\nname = \"ferrite-vm\"\n[target.'cfg(unix)'.dependencies]\nferrite-hal-module = { path = \"../ferrite-hal-module\" }\n",
        ),
        (
            "ferrite-hal-module",
            "[package]\nname = \"ferrite-hal-module\"\n[dependencies]\nferrite-vm.workspace = true\n",
        ),
    ];
    for (name, manifest) in manifests {
        std::fs::create_dir_all(crates.join(name)).unwrap();
        std::fs::write(crates.join(name).join("Cargo.toml"), manifest).unwrap();
    }
    let (seen, problems) = layering_problems(&crates);
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(seen, 3);
    assert_eq!(
        problems,
        [
            "ferrite-base (layer 0) depends on ferrite-vm (layer 1): arrows must point down",
            "ferrite-vm (layer 1) depends on ferrite-hal-module (layer 2): arrows must point down",
        ]
    );
}

#[test]
fn only_the_facade_names_the_cuda_driver() {
    let root = std::env::temp_dir().join(format!("ferrite-layering-cuda-{}", std::process::id()));
    let crates = root.join("crates");
    let manifests = [
        (
            "ferrite",
            "[package]\nname = \"ferrite\"\n[dependencies]\nferrite-hal-cuda.workspace = true\n",
        ),
        (
            "ferrite-python",
            "[package]\nname = \"ferrite-python\"\n[dependencies]\nferrite.workspace = true\nferrite-hal-cuda = { path = \"../ferrite-hal-cuda\" }\n",
        ),
    ];
    for (name, manifest) in manifests {
        std::fs::create_dir_all(crates.join(name)).unwrap();
        std::fs::write(crates.join(name).join("Cargo.toml"), manifest).unwrap();
    }
    let (seen, problems) = layering_problems(&crates);
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(seen, 2);
    assert_eq!(
        problems,
        [
            "ferrite-python depends on ferrite-hal-cuda: reach it through the HAL and the driver \
          registry of ferrite"
        ]
    );
}
