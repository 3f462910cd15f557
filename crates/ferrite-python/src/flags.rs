//! Process-wide runtime flags, set by `ferrite.runtime.flags.parse_flags`.
//!
//! Upstream keeps its runtime flags in process globals that the tools and
//! the Python bindings share; `parse_flags` sets them, and devices created
//! afterwards read them. We keep the same model: one table of the flags
//! upstream's runtime library registers (names and value kinds), values in
//! a process-wide store, and the local-task device reading its worker count
//! from it. Flags for drivers this build does not have (CUDA, HIP, Vulkan)
//! are recognized and stored so that code written for upstream keeps
//! parsing, but nothing here reads them.

use ferrite_base::{bail, status, Result};
use parking_lot::RwLock;
use pyo3::prelude::*;
use std::collections::HashMap;

use crate::status::PyContext;

/// The kind of value a flag takes (how its text is checked).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Bool,
    Int,
    Text,
}

/// A flag upstream's runtime library registers.
struct FlagDef {
    name: &'static str,
    kind: Kind,
    help: &'static str,
}

const fn def(name: &'static str, kind: Kind, help: &'static str) -> FlagDef {
    FlagDef { name, kind, help }
}

/// Flags read by this build (the first group) and flags of upstream's
/// runtime that are accepted and kept without effect here.
const FLAGS: &[FlagDef] = &[
    def(
        "task_topology_group_count",
        Kind::Int,
        "Worker threads of local-task devices created afterwards (0: one per core, at most --task_topology_max_group_count).",
    ),
    def(
        "task_topology_max_group_count",
        Kind::Int,
        "Upper bound on the default local-task worker count.",
    ),
    def(
        "task_worker_stack_size",
        Kind::Int,
        "Stack bytes of each local-task worker thread created afterwards (0: the platform default).",
    ),
    // Accepted for compatibility; this build has no use for them.
    def("task_abort_on_failure", Kind::Bool, "(accepted; no effect)"),
    def("task_worker_spin_us", Kind::Int, "(accepted; no effect)"),
    def("task_worker_local_memory", Kind::Int, "(accepted; no effect)"),
    def("task_topology_mode", Kind::Text, "(accepted; no effect)"),
    def("task_topology_cpu_ids", Kind::Text, "(accepted; no effect)"),
    def("task_topology_nodes", Kind::Text, "(accepted; no effect)"),
    def("task_topology_snapshot", Kind::Text, "(accepted; no effect)"),
    def("task_topology_performance_level", Kind::Text, "(accepted; no effect)"),
    def("task_topology_distribution", Kind::Text, "(accepted; no effect)"),
    def("task_topology_favor", Kind::Text, "(accepted; no effect)"),
    def("dump_task_topologies", Kind::Bool, "(accepted; no effect)"),
    def("executable_plugin", Kind::Text, "(accepted; no effect)"),
    def("list_drivers", Kind::Bool, "(accepted; no effect)"),
    def("list_devices", Kind::Bool, "(accepted; no effect)"),
    def("dump_devices", Kind::Bool, "(accepted; no effect)"),
    def("device_allocator", Kind::Text, "(accepted; no effect)"),
    def("device", Kind::Text, "(accepted; no effect: devices are named in the API)"),
    def("device_profiling_mode", Kind::Text, "(accepted; no effect)"),
    def("device_profiling_output", Kind::Text, "(accepted; no effect)"),
    def("device_profiling_filter_function", Kind::Text, "(accepted; no effect)"),
    def("device_profiling_filter_command_buffer", Kind::Int, "(accepted; no effect)"),
    def("device_profiling_filter_command_index", Kind::Int, "(accepted; no effect)"),
    def("device_profiling_filter_physical_device", Kind::Int, "(accepted; no effect)"),
    def("device_profiling_filter_queue", Kind::Int, "(accepted; no effect)"),
    def("device_profiling_counter", Kind::Text, "(accepted; no effect)"),
    def("device_profiling_flush_interval_ms", Kind::Int, "(accepted; no effect)"),
    def("print_device_statistics", Kind::Bool, "(accepted; no effect)"),
    def("device_capture_tool", Kind::Text, "(accepted; no effect)"),
    def("device_capture_file", Kind::Text, "(accepted; no effect)"),
    def("device_capture_label", Kind::Text, "(accepted; no effect)"),
    def("cuda_use_streams", Kind::Bool, "(accepted; no effect on the cuda driver)"),
    def("cuda_allow_inline_execution", Kind::Bool, "(accepted; no effect on the cuda driver)"),
    def("cuda_async_allocations", Kind::Bool, "(accepted; no effect on the cuda driver)"),
    def("cuda_tracing", Kind::Int, "(accepted; no effect on the cuda driver)"),
    def("cuda_default_index", Kind::Int, "(accepted; no effect on the cuda driver)"),
    def("cuda_default_index_from_mpi", Kind::Bool, "(accepted; no effect on the cuda driver)"),
    def("hip_dylib_path", Kind::Text, "(accepted; no HIP driver in this build)"),
    def("hip_use_streams", Kind::Bool, "(accepted; no HIP driver in this build)"),
    def("hip_allow_inline_execution", Kind::Bool, "(accepted; no HIP driver in this build)"),
    def("hip_async_allocations", Kind::Bool, "(accepted; no HIP driver in this build)"),
    def("hip_async_caching", Kind::Bool, "(accepted; no HIP driver in this build)"),
    def("hip_tracing", Kind::Int, "(accepted; no HIP driver in this build)"),
    def("hip_default_index", Kind::Int, "(accepted; no HIP driver in this build)"),
    def("vulkan_libvulkan_search_path", Kind::Text, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_validation_layers", Kind::Bool, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_debug_utils", Kind::Bool, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_debug_verbosity", Kind::Int, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_tracing", Kind::Bool, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_robust_buffer_access", Kind::Bool, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_sparse_binding", Kind::Bool, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_sparse_residency", Kind::Bool, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_buffer_device_addresses", Kind::Bool, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_dispatch_abi", Kind::Text, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_cached_bda_replay_instances", Kind::Int, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_cached_bda_replay_publication_bytes", Kind::Int, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_retained_cached_bda_replay_instances", Kind::Int, "(accepted; no Vulkan driver in this build)"),
    def("vulkan_dedicated_compute_queue", Kind::Bool, "(accepted; no Vulkan driver in this build)"),
];

/// Parsed values, keyed by flag name (absent: the flag's default).
static VALUES: RwLock<Option<HashMap<&'static str, Value>>> = RwLock::new(None);

#[derive(Clone, Debug, PartialEq)]
enum Value {
    Bool(bool),
    Int(i64),
    Text(String),
}

fn parse_value(flag: &FlagDef, text: Option<&str>) -> Result<Value> {
    let name = flag.name;
    match (flag.kind, text) {
        (Kind::Bool, None) => Ok(Value::Bool(true)),
        (Kind::Bool, Some(t)) => match t {
            "true" | "1" => Ok(Value::Bool(true)),
            "false" | "0" => Ok(Value::Bool(false)),
            _ => bail!(
                InvalidArgument,
                "flag '{name}': expected true, false, 1 or 0, received '{t}'"
            ),
        },
        (Kind::Int, Some(t)) => t.trim().parse::<i64>().map(Value::Int).map_err(|_| {
            status!(
                InvalidArgument,
                "flag '{name}': expected an integer, received '{t}'"
            )
        }),
        (Kind::Text, Some(t)) => Ok(Value::Text(t.trim_matches('"').to_string())),
        (_, None) => bail!(
            InvalidArgument,
            "flag '{name}' needs a value (--{name}=...)"
        ),
    }
}

/// What one command-line argument asks for.
enum Parsed {
    Set(&'static str, Value),
    FlagFile(String),
    Help,
    /// Not a flag (upstream leaves positional arguments alone).
    Positional,
}

fn parse_one(arg: &str) -> Result<Parsed> {
    let Some(body) = arg.strip_prefix("--") else {
        return Ok(Parsed::Positional);
    };
    let (name, value) = match body.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (body, None),
    };
    match name {
        "help" => return Ok(Parsed::Help),
        "flagfile" => {
            let path = value.ok_or_else(|| {
                status!(
                    InvalidArgument,
                    "flag 'flagfile' needs a path (--flagfile=PATH)"
                )
            })?;
            return Ok(Parsed::FlagFile(path.to_string()));
        }
        _ => {}
    }
    let Some(flag) = FLAGS.iter().find(|f| f.name == name) else {
        bail!(InvalidArgument, "flag '{name}' not recognized");
    };
    Ok(Parsed::Set(flag.name, parse_value(flag, value)?))
}

/// Parses `args` in order into `into`; returns true when `--help` was seen.
fn parse_into(
    args: &[String],
    into: &mut HashMap<&'static str, Value>,
    depth: usize,
) -> Result<bool> {
    let mut help = false;
    for arg in args {
        match parse_one(arg)? {
            Parsed::Set(name, value) => {
                into.insert(name, value);
            }
            Parsed::Help => help = true,
            Parsed::Positional => {}
            Parsed::FlagFile(path) => {
                if depth > 8 {
                    bail!(
                        InvalidArgument,
                        "flagfile '{path}': flag files nest too deeply"
                    );
                }
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| status!(NotFound, "flagfile '{path}': {e}"))?;
                let lines: Vec<String> = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(String::from)
                    .collect();
                help |= parse_into(&lines, into, depth + 1)?;
            }
        }
    }
    Ok(help)
}

/// Every flag with its current value, as a flag file.
fn help_text(values: &HashMap<&'static str, Value>) -> String {
    let mut out = String::from(
        "# Flags of Ferrite's runtime (a flag file: pass back with --flagfile=PATH).\n\n",
    );
    out.push_str("# Displays this text.\n# --help\n\n# Parses a newline-separated list of flags from a file.\n# --flagfile=[path]\n\n");
    for f in FLAGS {
        out.push_str(&format!("# {}\n", f.help));
        match values.get(f.name) {
            Some(Value::Bool(b)) => out.push_str(&format!("--{}={b}\n\n", f.name)),
            Some(Value::Int(i)) => out.push_str(&format!("--{}={i}\n\n", f.name)),
            Some(Value::Text(t)) => out.push_str(&format!("--{}=\"{t}\"\n\n", f.name)),
            None => out.push_str(&format!("# --{}=...\n\n", f.name)),
        }
    }
    out
}

/// `parse_flags(*flags)`: sets process-wide runtime flags. All flags are
/// checked before any takes effect, so a bad one leaves the others unset.
#[pyfunction]
#[pyo3(signature = (*flags))]
pub fn parse_flags(py: Python<'_>, flags: Vec<String>) -> PyResult<()> {
    let mut guard = VALUES.write();
    let mut values = guard.clone().unwrap_or_default();
    let help = parse_into(&flags, &mut values, 0).py_context("Error parsing flags")?;
    *guard = Some(values);
    if help {
        let text = help_text(guard.as_ref().expect("just set"));
        drop(guard);
        py.import("sys")?
            .getattr("stdout")?
            .call_method1("write", (text,))?;
        // As upstream 3.13's binding: print and go on (the command-line
        // tools exit after `--help`; the interpreter must not).
    }
    Ok(())
}

/// The driver flags for a device created now: the task flags set so far
/// (the `local-task` driver of the registry reads them), checked.
pub fn driver_options() -> Result<ferrite_hal::driver::DriverOptions> {
    let mut options = ferrite_hal::driver::DriverOptions::default();
    let values = VALUES.read();
    let Some(values) = values.as_ref() else {
        return Ok(options);
    };
    for name in ferrite_hal::driver::TASK_FLAGS {
        let text = match values.get(name) {
            None => continue,
            Some(Value::Bool(b)) => b.to_string(),
            // Negative counts mean "unset" here, as upstream clamps them.
            Some(Value::Int(i)) => (*i).max(0).to_string(),
            Some(Value::Text(t)) => t.clone(),
        };
        options.task.set(name, &text)?;
    }
    Ok(options)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parse_flags, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_flags_and_bad_values_are_rejected() {
        let mut v = HashMap::new();
        let e = parse_into(&["--nope=1".into()], &mut v, 0).unwrap_err();
        assert!(e.to_string().contains("flag 'nope' not recognized"), "{e}");
        let e = parse_into(&["--task_topology_group_count=abc".into()], &mut v, 0).unwrap_err();
        assert!(
            e.to_string()
                .contains("expected an integer, received 'abc'"),
            "{e}"
        );
        let e = parse_into(&["--task_abort_on_failure=maybe".into()], &mut v, 0).unwrap_err();
        assert!(e.to_string().contains("expected true, false"), "{e}");
    }

    #[test]
    fn values_bare_bools_and_positionals() {
        let mut v = HashMap::new();
        let help = parse_into(
            &[
                "positional".into(),
                "--task_topology_group_count=3".into(),
                "--task_abort_on_failure".into(),
                "--task_topology_mode=\"physical_cores\"".into(),
            ],
            &mut v,
            0,
        )
        .unwrap();
        assert!(!help);
        assert_eq!(v["task_topology_group_count"], Value::Int(3));
        assert_eq!(v["task_abort_on_failure"], Value::Bool(true));
        assert_eq!(
            v["task_topology_mode"],
            Value::Text("physical_cores".into())
        );
    }
}
