//! Every flag of upstream's `iree-run-module`, `iree-benchmark-module` and
//! `iree-dump-module` (3.13 `--help`), and what Ferrite does with it:
//! implemented, ignored with a warning (and why), or rejected with a
//! message naming the flag. `docs/flags.md` is this table as text (a test
//! keeps the two equal, and another runs every row against the tools).
//!
//! [`screen`] applies the table to a command line before the tool parses
//! it: ignored flags are dropped with a warning on stderr, rejected ones
//! are errors; implemented flags are left to the tool.

use ferrite_base::{bail, Result};
use std::ffi::OsString;

/// What Ferrite does with an upstream flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagStatus {
    /// The tool takes the flag (see its note for differences).
    Implemented,
    /// Accepted and dropped, with a warning saying why.
    Ignored,
    /// An error naming the flag and why.
    Rejected,
}

impl FlagStatus {
    /// The word the table uses.
    pub fn as_str(self) -> &'static str {
        match self {
            FlagStatus::Implemented => "implemented",
            FlagStatus::Ignored => "ignored (warning)",
            FlagStatus::Rejected => "rejected",
        }
    }
}

/// One row: a flag as one or more tools know it.
#[derive(Clone, Copy, Debug)]
pub struct FlagInfo {
    /// The name without `--`.
    pub name: &'static str,
    /// The tools the row is about: `R` run-module, `B` benchmark-module,
    /// `D` dump-module.
    pub tools: &'static str,
    /// What Ferrite does with it.
    pub status: FlagStatus,
    /// A use of the flag (what the table's test passes).
    pub example: &'static str,
    /// What the flag means upstream (in short).
    pub meaning: &'static str,
    /// Ferrite's difference, or why it is ignored or rejected.
    pub note: &'static str,
}

use FlagStatus::{Ignored, Implemented, Rejected};

const fn flag(
    name: &'static str,
    tools: &'static str,
    status: FlagStatus,
    example: &'static str,
    meaning: &'static str,
    note: &'static str,
) -> FlagInfo {
    FlagInfo {
        name,
        tools,
        status,
        example,
        meaning,
        note,
    }
}

/// The table, in upstream's `--help` order by area.
pub static FLAGS: &[FlagInfo] = &[
    flag("help", "RBD", Implemented, "--help", "Prints usage and exits.", "clap's usage text (not upstream's flag-file format)."),
    flag("flagfile", "RBD", Implemented, "--flagfile=FILE", "Reads flags from a file, one per line, in place.", "Same rules: `#`/`//` comments, later flags override, nested files; see `ferrite_tooling::flagfile`."),
    flag("module", "RB", Implemented, "--module=m.vmfb", "A module to load; repeat for several.", "`-` reads stdin."),
    flag("module_mode", "RB", Implemented, "--module_mode=mmap", "`preload` reads the module into memory, `mmap` maps it.", "Both honoured; Ferrite's default is `mmap` (upstream's is `preload`)."),
    flag("function", "RB", Implemented, "--function=f", "Function to run (benchmark-module: without it, every export without arguments).", ""),
    flag("function", "D", Implemented, "--function=sum_i32", "Disassembles only this function.", ""),
    flag("input", "RB", Implemented, "--input=4xf32=1,2,3,4", "An input value, tensor, raw file or `.npy` file.", "Same syntax (`@`, `+`, `*` for `.npy`)."),
    flag("output", "R", Implemented, "--output=-", "Where each result goes (`-`, `@f.npy`, `+f.npy`, `@f.bin`).", ""),
    flag("output", "D", Implemented, "--output=metadata", "`all`, `metadata`, `disassembly`, `flatbuffer-binary`, `flatbuffer-json`.", "The flatbuffer modes are refused with a message naming `iree-dump-module`."),
    flag("output", "B", Rejected, "--output=-", "Result handling, with `--enable_output_processing`.", "benchmark-module does not process outputs."),
    flag("expected_output", "R", Implemented, "--expected_output=1", "Compares results with expected values; non-zero exit on mismatch.", ""),
    flag("expected_output", "B", Rejected, "--expected_output=1", "As run-module, with `--enable_output_processing`.", "benchmark-module does not process outputs."),
    flag("output_max_element_count", "R", Implemented, "--output_max_element_count=8", "Elements printed before eliding.", "Also spelled `--print_max_element_count`."),
    flag("output_max_element_count", "B", Ignored, "--output_max_element_count=8", "As run-module.", "benchmark-module prints no outputs."),
    flag("expected_f16_threshold", "R", Implemented, "--expected_f16_threshold=0.01", "Absolute tolerance for f16 in approximate mode.", ""),
    flag("expected_f32_threshold", "R", Implemented, "--expected_f32_threshold=0.01", "Absolute tolerance for f32.", ""),
    flag("expected_f64_threshold", "R", Implemented, "--expected_f64_threshold=0.01", "Absolute tolerance for f64.", ""),
    flag("expected_bf16_threshold", "R", Implemented, "--expected_bf16_threshold=0.01", "Absolute tolerance for bf16.", ""),
    flag("expected_rtol", "R", Implemented, "--expected_rtol=0.001", "Relative tolerance for floats.", ""),
    flag("equality_mode", "R", Implemented, "--equality_mode=exact", "`approximate` or `exact` comparison.", ""),
    flag("expected_f16_threshold", "B", Ignored, "--expected_f16_threshold=0.01", "As run-module.", "benchmark-module compares no outputs."),
    flag("expected_f32_threshold", "B", Ignored, "--expected_f32_threshold=0.01", "As run-module.", "benchmark-module compares no outputs."),
    flag("expected_f64_threshold", "B", Ignored, "--expected_f64_threshold=0.01", "As run-module.", "benchmark-module compares no outputs."),
    flag("expected_bf16_threshold", "B", Ignored, "--expected_bf16_threshold=0.01", "As run-module.", "benchmark-module compares no outputs."),
    flag("expected_rtol", "B", Ignored, "--expected_rtol=0.001", "As run-module.", "benchmark-module compares no outputs."),
    flag("equality_mode", "B", Ignored, "--equality_mode=exact", "As run-module.", "benchmark-module compares no outputs."),
    flag("parameters", "RB", Implemented, "--parameters=p.irpa", "A parameter file (`.irpa`, `.gguf`, `.safetensors`), optionally `scope=file`.", ""),
    flag("parameter_mode", "RB", Implemented, "--parameter_mode=preload", "`file` or `preload`.", ""),
    flag("device", "RB", Implemented, "--device=local-sync", "HAL device(s) by URI.", "Through the driver registry (`ferrite::driver`)."),
    flag("list_drivers", "RB", Implemented, "--list_drivers", "Lists the drivers and exits.", "Upstream's layout."),
    flag("list_devices", "RB", Implemented, "--list_devices", "Lists device URIs (all drivers or one) and exits.", "Upstream's layout."),
    flag("dump_devices", "RB", Implemented, "--dump_devices", "Prints the devices of each driver and exits.", "Upstream's layout."),
    flag("device_allocator", "RB", Ignored, "--device_allocator=caching", "Allocator wrappers for the device.", "The CPU devices pool queue allocations already."),
    flag("device_lead_allocator", "RB", Ignored, "--device_lead_allocator=0", "Lead device for allocations across devices.", "Allocations go to the first device."),
    flag("task_topology_group_count", "RB", Implemented, "--task_topology_group_count=2", "Worker count of local-task (0: by the mode).", "Clamped to 256, as upstream."),
    flag("task_topology_max_group_count", "RB", Implemented, "--task_topology_max_group_count=2", "Cap on the automatic worker count.", ""),
    flag("task_worker_stack_size", "RB", Implemented, "--task_worker_stack_size=262144", "Stack bytes per worker.", ""),
    flag("task_topology_cpu_ids", "RB", Implemented, "--task_topology_cpu_ids=0,1", "Logical CPU ids of one topology; repeat for several.", "One worker pinned to each listed CPU (takes precedence over the group count, as upstream); repeating the flag (one executor per list upstream) is rejected when the device is created."),
    flag("task_topology_mode", "RB", Implemented, "--task_topology_mode=physical_cores", "Topology mode.", "Parsed and checked into the driver options."),
    flag("task_topology_nodes", "RB", Implemented, "--task_topology_nodes=current", "NUMA nodes to use.", "`current`; `all`, `numa` or ids only when they name the host's one node, else rejected when the device is created."),
    flag("task_topology_snapshot", "RB", Implemented, "--task_topology_snapshot=", "A captured topology (testing).", "A non-empty value is rejected when the device is created."),
    flag("task_topology_performance_level", "RB", Implemented, "--task_topology_performance_level=any", "Core performance level to use.", "Only `any`; other values are rejected when the device is created (cores are not selected by performance level)."),
    flag("task_topology_distribution", "RB", Implemented, "--task_topology_distribution=scatter", "Core distribution across cache domains.", "Only `scatter`; `compact` is rejected when the device is created (workers are placed only by --task_topology_cpu_ids)."),
    flag("task_topology_favor", "RB", Implemented, "--task_topology_favor=latency", "Preset for distribution and performance level.", "Presets are rejected when the device is created (see the two flags above)."),
    flag("task_worker_spin_us", "RB", Implemented, "--task_worker_spin_us=0", "Microseconds workers spin for work.", "N > 0 sets how long an idle worker polls before sleeping; 0 keeps Ferrite's bounded default (50 us)."),
    flag("task_worker_local_memory", "RB", Implemented, "--task_worker_local_memory=0", "Per-worker local memory for dispatches.", "Non-zero values are rejected when the device is created (each dispatch gets the local memory its executable declares)."),
    flag("task_abort_on_failure", "RB", Implemented, "--task_abort_on_failure=false", "Aborts on the first task failure.", "A failure of local-task queue work aborts the process after printing its status."),
    flag("dump_task_topologies", "RB", Ignored, "--dump_task_topologies", "Prints the task topology.", "No topology printer yet."),
    flag("executable_plugin", "RB", Rejected, "--executable_plugin=p.so", "Loads an executable plugin resolving imports.", "Executable plugins are not supported."),
    flag("trace_execution", "RB", Implemented, "--trace_execution=true", "Traces VM execution to stderr.", "One line per executed op, `[module.function+OFFSET]    op`; the op text is the disassembly's, without upstream's inline register values. Compiled functions are interpreted while tracing."),
    flag("print_statistics", "RB", Implemented, "--print_statistics=true", "Prints runtime statistics on exit.", "Each device's allocator statistics, upstream's layout."),
    flag("instrument_file", "R", Rejected, "--instrument_file=i.bin", "File for the program's instrument data.", "Instrumented programs are not supported."),
    flag("agents_md", "RB", Rejected, "--agents_md", "Prints replay-capture guidance and exits.", "HAL replay capture is not supported."),
    flag("device_replay_output", "RB", Rejected, "--device_replay_output=r.ireereplay", "Records a HAL replay stream.", "HAL replay capture is not supported."),
    flag("device_replay_file_policy", "RB", Rejected, "--device_replay_file_policy=reference", "Replay handling of fd-backed files.", "HAL replay capture is not supported."),
    flag("device_replay_file_validation", "RB", Rejected, "--device_replay_file_validation=identity", "Replay validation of referenced files.", "HAL replay capture is not supported."),
    flag("device_profiling_mode", "RB", Implemented, "--device_profiling_mode=queue-events", "HAL profiling data families.", "`queue-events`, `host-execution`, `device-queue-events` (queue operations on the device's clock: GPU timestamps on cuda; on CPU devices, which upstream refuses, the host clock, theirs), `dispatch-events` (per-dispatch times on CPU devices, which upstream refuses), `memory-events`; device metrics, traces and counters are refused. Needs `--device_profiling_output`."),
    flag("device_profiling_output", "RB", Implemented, "--device_profiling_output=p.ireeprof", "HAL profiling bundle path.", "An `.ireeprof` bundle in upstream 3.13's format (file format 1.6), written when the tool ends."),
    flag("device_profiling_filter_function", "RB", Rejected, "--device_profiling_filter_function=f", "Profiling filter.", "HAL profiling is not supported."),
    flag("device_profiling_filter_command_buffer", "RB", Rejected, "--device_profiling_filter_command_buffer=1", "Profiling filter.", "HAL profiling is not supported."),
    flag("device_profiling_filter_command_index", "RB", Rejected, "--device_profiling_filter_command_index=1", "Profiling filter.", "HAL profiling is not supported."),
    flag("device_profiling_filter_physical_device", "RB", Rejected, "--device_profiling_filter_physical_device=0", "Profiling filter.", "HAL profiling is not supported."),
    flag("device_profiling_filter_queue", "RB", Rejected, "--device_profiling_filter_queue=0", "Profiling filter.", "HAL profiling is not supported."),
    flag("device_profiling_counter", "RB", Rejected, "--device_profiling_counter=c", "Hardware counter to capture.", "HAL profiling is not supported."),
    flag("device_profiling_flush_interval_ms", "RB", Rejected, "--device_profiling_flush_interval_ms=10", "Periodic profiling flush.", "HAL profiling is not supported."),
    flag("print_device_statistics", "RB", Implemented, "--print_device_statistics=true", "Prints device statistics at shutdown.", "Upstream's heading; per device, each queue operation's and dispatch export's count, total and mean time (local-task: tiles and time in tiles), from the recorder `--trace` uses; CPU devices only time host execution."),
    flag("device_capture_tool", "RB", Rejected, "--device_capture_tool=renderdoc", "External capture provider.", "External captures are not supported."),
    flag("device_capture_file", "RB", Rejected, "--device_capture_file=c.rdc", "External capture output.", "External captures are not supported."),
    flag("device_capture_label", "RB", Rejected, "--device_capture_label=l", "External capture label.", "External captures are not supported."),
    flag("cuda_use_streams", "RB", Ignored, "--cuda_use_streams=true", "CUDA: streams instead of graphs.", "Ferrite's cuda driver runs reusable command buffers as CUDA graphs, and one-shot ones whose shape repeats as graphs too unless most of their executions would update many nodes, which are replayed on its stream (`FERRITE_CUDA_ONESHOT_GRAPHS=1`/`0`: always graphs / always the stream; `FERRITE_CUDA_GRAPHS=0`: all on the stream)."),
    flag("cuda_allow_inline_execution", "RB", Ignored, "--cuda_allow_inline_execution=false", "CUDA: inline execution.", "Ferrite's cuda driver has no inline mode: command buffers always go on the stream."),
    flag("cuda_async_allocations", "RB", Ignored, "--cuda_async_allocations=true", "CUDA: stream-ordered allocations.", "Queue alloca/dealloca always use stream-ordered pools (cuMemAllocAsync/cuMemFreeAsync)."),
    flag("cuda_tracing", "RB", Ignored, "--cuda_tracing=2", "CUDA: Tracy verbosity.", "Ferrite has no Tracy integration."),
    flag("cuda_default_index", "RB", Rejected, "--cuda_default_index=1", "CUDA: default device index.", "`--device=cuda` is ordinal 0 (`=0` is accepted); name another GPU as `--device=cuda://N`."),
    flag("cuda_default_index_from_mpi", "RB", Rejected, "--cuda_default_index_from_mpi=true", "CUDA: device index from MPI rank.", "Not supported (`=false` is accepted); name the GPU as `--device=cuda://N`."),
    flag("hip_dylib_path", "RB", Ignored, "--hip_dylib_path=/x", "HIP: runtime library search path.", "No HIP driver."),
    flag("hip_use_streams", "RB", Ignored, "--hip_use_streams=true", "HIP: streams instead of graphs.", "No HIP driver."),
    flag("hip_allow_inline_execution", "RB", Ignored, "--hip_allow_inline_execution=false", "HIP: inline execution.", "No HIP driver."),
    flag("hip_async_allocations", "RB", Ignored, "--hip_async_allocations=true", "HIP: stream-ordered allocations.", "No HIP driver."),
    flag("hip_async_caching", "RB", Ignored, "--hip_async_caching=true", "HIP: allocation caching.", "No HIP driver."),
    flag("hip_tracing", "RB", Ignored, "--hip_tracing=2", "HIP: Tracy verbosity.", "No HIP driver."),
    flag("hip_default_index", "RB", Ignored, "--hip_default_index=0", "HIP: default device index.", "No HIP driver."),
    flag("vulkan_libvulkan_search_path", "RB", Ignored, "--vulkan_libvulkan_search_path=/x", "Vulkan: loader search path.", "No Vulkan driver."),
    flag("vulkan_validation_layers", "RB", Ignored, "--vulkan_validation_layers=false", "Vulkan: validation layers.", "No Vulkan driver."),
    flag("vulkan_debug_utils", "RB", Ignored, "--vulkan_debug_utils=false", "Vulkan: debug utils.", "No Vulkan driver."),
    flag("vulkan_debug_verbosity", "RB", Ignored, "--vulkan_debug_verbosity=2", "Vulkan: debug output cutoff.", "No Vulkan driver."),
    flag("vulkan_tracing", "RB", Ignored, "--vulkan_tracing=true", "Vulkan: profiling events.", "No Vulkan driver."),
    flag("vulkan_robust_buffer_access", "RB", Ignored, "--vulkan_robust_buffer_access=false", "Vulkan: robust buffer access.", "No Vulkan driver."),
    flag("vulkan_sparse_binding", "RB", Ignored, "--vulkan_sparse_binding=false", "Vulkan: sparse binding.", "No Vulkan driver."),
    flag("vulkan_sparse_residency", "RB", Ignored, "--vulkan_sparse_residency=false", "Vulkan: sparse residency.", "No Vulkan driver."),
    flag("vulkan_buffer_device_addresses", "RB", Ignored, "--vulkan_buffer_device_addresses=true", "Vulkan: buffer device addresses.", "No Vulkan driver."),
    flag("vulkan_dispatch_abi", "RB", Ignored, "--vulkan_dispatch_abi=all", "Vulkan: dispatch ABI policy.", "No Vulkan driver."),
    flag("vulkan_cached_bda_replay_instances", "RB", Ignored, "--vulkan_cached_bda_replay_instances=16", "Vulkan: replay cache size.", "No Vulkan driver."),
    flag("vulkan_cached_bda_replay_publication_bytes", "RB", Ignored, "--vulkan_cached_bda_replay_publication_bytes=1024", "Vulkan: replay publication bytes.", "No Vulkan driver."),
    flag("vulkan_retained_cached_bda_replay_instances", "RB", Ignored, "--vulkan_retained_cached_bda_replay_instances=1", "Vulkan: retained replay instances.", "No Vulkan driver."),
    flag("vulkan_dedicated_compute_queue", "RB", Ignored, "--vulkan_dedicated_compute_queue=true", "Vulkan: dedicated compute queue.", "No Vulkan driver."),
    flag("batch_size", "B", Rejected, "--batch_size=4", "Invocations per iteration.", "Only 1 (the default) is accepted."),
    flag("batch_concurrency", "B", Rejected, "--batch_concurrency=2", "Concurrent invocations within a batch.", "Only 1 (the default) is accepted."),
    flag("dispatch_statistics", "B", Rejected, "--dispatch_statistics=true", "Per-dispatch time rows.", "HAL profiling is not supported."),
    flag("enable_output_processing", "B", Rejected, "--enable_output_processing=true", "Keeps and processes the last outputs.", "benchmark-module does not process outputs."),
    flag("benchmark_list_tests", "B", Implemented, "--benchmark_list_tests=true", "Lists the benchmarks and exits.", ""),
    flag("benchmark_filter", "B", Rejected, "--benchmark_filter=add", "Runs benchmarks matching a regex.", "Use `--function`."),
    flag("benchmark_min_time", "B", Implemented, "--benchmark_min_time=10x", "Minimum time (`0.5s`) or iterations (`10x`) per repetition.", ""),
    flag("benchmark_min_warmup_time", "B", Ignored, "--benchmark_min_warmup_time=0.1", "Warm-up time before timing.", "One untimed call warms up."),
    flag("benchmark_repetitions", "B", Implemented, "--benchmark_repetitions=3", "Timed repetitions, with aggregates.", ""),
    flag("benchmark_dry_run", "B", Rejected, "--benchmark_dry_run=true", "Runs each benchmark once without timing.", "Use `--benchmark_min_time=1x`."),
    flag("benchmark_enable_random_interleaving", "B", Ignored, "--benchmark_enable_random_interleaving=true", "Interleaves repetitions randomly.", "Repetitions run in order."),
    flag("benchmark_report_aggregates_only", "B", Implemented, "--benchmark_report_aggregates_only=true", "Reports only the aggregates.", ""),
    flag("benchmark_display_aggregates_only", "B", Implemented, "--benchmark_display_aggregates_only=true", "Displays only the aggregates.", ""),
    flag("benchmark_format", "B", Implemented, "--benchmark_format=json", "`console`, `json` or `csv` on stdout.", "`csv` is refused with a message."),
    flag("benchmark_out", "B", Implemented, "--benchmark_out=FILE", "Also writes the report to a file.", ""),
    flag("benchmark_out_format", "B", Implemented, "--benchmark_out_format=json", "Format of `--benchmark_out`.", "`csv` is refused with a message."),
    flag("benchmark_color", "B", Ignored, "--benchmark_color=false", "Colours the console report.", "The report is never coloured."),
    flag("benchmark_counters_tabular", "B", Ignored, "--benchmark_counters_tabular=true", "Counters as table columns.", "Counters stay inline."),
    flag("benchmark_context", "B", Ignored, "--benchmark_context=k=v", "Extra context in the report.", "Not added to the report."),
    flag("benchmark_time_unit", "B", Ignored, "--benchmark_time_unit=us", "Time unit of the report.", "Console picks a unit per value; JSON is in ms, as upstream's default."),
    flag("v", "B", Ignored, "--v=1", "Verbosity of the benchmark library.", "No verbose output."),
    flag("pretty", "D", Ignored, "--pretty=true", "Indents `flatbuffer-json` output.", "`flatbuffer-json` is not supported."),
    flag("bytecode_offsets", "D", Implemented, "--bytecode_offsets", "Bytecode offsets in disassembly.", ""),
];

/// The tool letter (`R`, `B`, `D`) of a `ferrite` subcommand; the check
/// and e2e runners take run-module's flags.
pub fn tool_letter(subcommand: &str) -> Option<char> {
    match subcommand {
        "run-module" | "check-module" => Some('R'),
        "benchmark-module" => Some('B'),
        "dump-module" => Some('D'),
        s if s.starts_with("e2e-") => Some('R'),
        _ => None,
    }
}

/// The row for flag `name` of tool `tool`.
pub fn lookup(tool: char, name: &str) -> Option<&'static FlagInfo> {
    FLAGS
        .iter()
        .find(|f| f.name == name && f.tools.contains(tool))
}

/// Flags whose default value is accepted although other values are not.
const ACCEPTED_DEFAULTS: &[(&str, &str)] = &[
    ("batch_size", "1"),
    ("batch_concurrency", "1"),
    ("cuda_default_index", "0"),
    ("cuda_default_index_from_mpi", "false"),
];

/// Applies the table to `args` (program name, subcommand, flags...):
/// drops ignored flags with a warning on stderr and fails on rejected
/// ones, naming the flag. Other arguments pass through unchanged.
pub fn screen(args: Vec<OsString>) -> Result<Vec<OsString>> {
    let tool = args
        .iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .find(|a| !a.starts_with('-'))
        .and_then(tool_letter);
    let Some(tool) = tool else {
        return Ok(args);
    };
    let mut out = Vec::with_capacity(args.len());
    for arg in args {
        let Some(flag) = arg.to_str().and_then(|a| a.strip_prefix("--")) else {
            out.push(arg);
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (flag, None),
        };
        let Some(info) = lookup(tool, name) else {
            out.push(arg);
            continue;
        };
        match info.status {
            Implemented => out.push(arg),
            Ignored => eprintln!("warning: --{name} is ignored by ferrite: {}", info.note),
            Rejected => {
                if ACCEPTED_DEFAULTS.contains(&(name, value.unwrap_or(""))) {
                    continue;
                }
                bail!(
                    Unimplemented,
                    "--{name} is not supported by ferrite: {}",
                    info.note
                );
            }
        }
    }
    Ok(out)
}

/// The table as Markdown (the body of `docs/flags.md`).
pub fn markdown() -> String {
    let tools = |t: &str| {
        t.chars()
            .map(|c| match c {
                'R' => "run",
                'B' => "benchmark",
                _ => "dump",
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::from(
        "| flag | tools | upstream meaning | Ferrite | note |\n| --- | --- | --- | --- | --- |\n",
    );
    for f in FLAGS {
        out.push_str(&format!(
            "| `--{}` | {} | {} | {} | {} |\n",
            f.name,
            tools(f.tools),
            f.meaning,
            f.status.as_str(),
            f.note
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn rows_are_unique_per_tool_and_examples_name_their_flag() {
        for (i, a) in FLAGS.iter().enumerate() {
            assert!(
                a.example == format!("--{}", a.name)
                    || a.example.starts_with(&format!("--{}=", a.name)),
                "{}: example {}",
                a.name,
                a.example
            );
            assert!(!a.tools.is_empty() && a.tools.chars().all(|c| "RBD".contains(c)));
            for b in &FLAGS[i + 1..] {
                let shared = a.tools.chars().any(|c| b.tools.contains(c));
                assert!(!(a.name == b.name && shared), "--{} twice", a.name);
            }
        }
    }

    #[test]
    fn screening_drops_ignored_and_rejects_unsupported_flags() {
        let got = screen(args(&[
            "ferrite",
            "run-module",
            "--cuda_tracing=1",
            "--input=1",
        ]))
        .unwrap();
        assert_eq!(got, args(&["ferrite", "run-module", "--input=1"]));
        let e = screen(args(&["ferrite", "run-module", "--executable_plugin=p.so"])).unwrap_err();
        assert!(
            e.to_string()
                .contains("--executable_plugin is not supported"),
            "{e}"
        );
        let got = screen(args(&["ferrite", "benchmark-module", "--batch_size=1"])).unwrap();
        assert_eq!(got, args(&["ferrite", "benchmark-module"]));
        assert!(screen(args(&["ferrite", "benchmark-module", "--batch_size=4"])).is_err());
        // Per tool: --output is run-module's, benchmark-module refuses it.
        assert!(screen(args(&["ferrite", "run-module", "--output=-"])).is_ok());
        assert!(screen(args(&["ferrite", "benchmark-module", "--output=-"])).is_err());
        // Unknown subcommands and flags are left to the parser.
        let a = args(&["ferrite", "nope", "--trace_execution"]);
        assert_eq!(screen(a.clone()).unwrap(), a);
    }
}
