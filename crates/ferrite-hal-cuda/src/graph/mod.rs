//! Command buffers as CUDA graphs.
//!
//! A command buffer recorded once and executed many times (the compiler
//! records such buffers in initializers and executes them on every call)
//! is turned into a CUDA graph at its first execution on a device: one
//! kernel node per dispatch and one memset node per fill, each depending on
//! every node of the previous barrier-separated stage (through an empty
//! join node when both stages hold several), so commands the recording
//! left unordered may run concurrently on the GPU. The graph is
//! instantiated once and launched with one `cuGraphLaunch` per execution.
//!
//! Binding tables change between executions (transient buffers come from
//! queue allocations): each execution resolves the table-dependent
//! bindings again (with the same range checks as a stream replay) and
//! updates in place, with `cuGraphExec*SetParams`, only the nodes whose
//! parameters changed. Updates affect only later launches, so a launch
//! still in flight keeps the parameters it was launched with.
//!
//! One-shot command buffers: the pinned compiler records a function's
//! command buffer anew, one-shot, at every call (an LLM's decode step: ~515
//! dispatches), so there is no buffer to hang a graph on. Instead each
//! device remembers the last few [`Shape`]s of one-shot command buffers
//! it ran (the sequence of commands with their executables, exports,
//! binding and constant counts, barriers, fills; not their buffers,
//! constants or workgroup counts). The first of a shape is replayed on the
//! stream; the second builds and instantiates the shape's graph; from then
//! on a command buffer of that shape launches a graph of the shape whose
//! parameters (addresses, push constants, workgroup counts, fill ranges)
//! all equal its own, unchanged; failing that, a second graph is built
//! (up to [`GRAPHS_PER_SHAPE`]: transient buffers alternate between two
//! addresses from call to call) or the least recently launched one is
//! updated where its nodes differ. Everything is resolved and range
//! checked at submission as a replay does; a failure on the graph path
//! (a bad range, a driver refusal) falls back to the replay, which reports
//! it as before. By default a shape most of whose first [`AUTO_WINDOW`]
//! graph executions had to update more than a quarter of the nodes goes
//! back to stream replay (see [`oneshot_graphs_default`]);
//! `FERRITE_CUDA_ONESHOT_GRAPHS=1` keeps every shape a graph, `=0` turns
//! this off.
//!
//! Command buffers holding anything else (updates of host bytes, copies,
//! collectives, indirect dispatches) and ones of a single command are
//! replayed on the stream instead; so is every command buffer when
//! `FERRITE_CUDA_GRAPHS=0`, kernels are timed ([`crate::kernel_times`]) or
//! a trace is recorded (kernels timed one by one, [`crate::profile`]),
//! and one whose graph the driver refused to build (remembered, so the
//! refusal is paid once).

use crate::context::CudaContext;
use crate::ffi::{CUdeviceptr, CUgraph, CUgraphExec, CUgraphNode};
use ferrite_hal::command_buffer::{Command, CommandBuffer};
use ferrite_hal::executable::Executable;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

mod launch;

/// Whether graphs are enabled (`FERRITE_CUDA_GRAPHS=0` turns them off).
fn graphs_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRITE_CUDA_GRAPHS").map_or(true, |v| v != "0"))
}

/// True when `commands` can become a graph (see the module docs).
pub(crate) fn eligible(cb: &CommandBuffer, commands: &[Command]) -> bool {
    if !graphs_enabled()
        || crate::kernel_times::enabled()
        // A graph's kernels cannot be timed one by one (`crate::profile`).
        || ferrite_base::trace::enabled()
        || cb.mode() & ferrite_hal::command_buffer::mode::ONE_SHOT != 0
    {
        return false;
    }
    let mut work = 0;
    for c in commands {
        match c {
            Command::Barrier => {}
            Command::Dispatch { indirect: None, .. } => work += 1,
            Command::Fill { pattern, .. } if matches!(pattern.len(), 1 | 2 | 4) => work += 1,
            _ => return false,
        }
    }
    work >= 2
}

/// What a graph node was last set with; compared at each execution so
/// that only nodes whose parameters changed are updated.
#[derive(PartialEq, Eq)]
struct NodeState {
    /// Device addresses: one per kernel binding, or the fill target.
    addresses: Vec<CUdeviceptr>,
    /// A dispatch's push constants then its three workgroup counts; a
    /// fill's element size, element count (low and high word) and pattern
    /// value.
    words: Vec<u32>,
}

/// A node re-checked at each execution.
struct UpdatableNode {
    node: CUgraphNode,
    /// Index of its command.
    command: usize,
    /// What it is set with now.
    state: NodeState,
}

/// An instantiated graph of one command buffer on one device.
pub(crate) struct CommandGraph {
    shared: Arc<CudaContext>,
    graph: CUgraph,
    exec: CUgraphExec,
    /// Kernel and memset nodes in the graph (for the launch log).
    node_count: usize,
    /// Nodes to re-check at each execution, with what they are set with:
    /// those depending on the binding table for a reusable command
    /// buffer's graph, every node for a one-shot shape's.
    nodes: Mutex<Vec<UpdatableNode>>,
}

// SAFETY: the graph handles are used only with the device's context
// current, under the device's submission lock (launch and updates) or in
// `Drop` (after which nothing uses them).
unsafe impl Send for CommandGraph {}
// SAFETY: see above; the mutable part is behind a mutex.
unsafe impl Sync for CommandGraph {}

/// What a command buffer's graph slot holds: the graph, or the device's
/// refusal to build one (replay instead).
pub(crate) enum Prepared {
    Graph(CommandGraph),
    Refused,
}

impl Drop for CommandGraph {
    fn drop(&mut self) {
        if self.shared.make_current().is_ok() {
            // SAFETY: created by this device; an executable graph still in
            // flight is freed by the driver once it completes.
            unsafe {
                (self.shared.api.cuGraphExecDestroy)(self.exec);
                (self.shared.api.cuGraphDestroy)(self.graph);
            }
        }
    }
}

/// Kernel parameters as the driver takes them: pointers to one u64 per
/// binding, then one u32 per push constant.
struct KernelArgs {
    words: Vec<u64>,
    consts: Vec<u32>,
    ptrs: Vec<*mut c_void>,
}

impl KernelArgs {
    fn new(words: Vec<u64>, consts: Vec<u32>) -> KernelArgs {
        let mut a = KernelArgs {
            words,
            consts,
            ptrs: Vec::new(),
        };
        for w in a.words.iter_mut() {
            a.ptrs.push(w as *mut u64 as *mut c_void);
        }
        for c in a.consts.iter_mut() {
            a.ptrs.push(c as *mut u32 as *mut c_void);
        }
        a
    }
}

/// Whether a new device runs repeated one-shot command buffers as graphs:
/// automatic ([`OneShotGraphs::Auto`]) unless `FERRITE_CUDA_ONESHOT_GRAPHS`
/// says `1` (always) or `0` (never). Automatic, because a graph whose
/// nodes must be updated on the host before each launch serializes that
/// work with the GPU, where stream launches overlap it: a SmolLM2 decode
/// step whose position changed most kernels' parameters measured 5-6%
/// slower as a graph on an H200, while one whose parameters stay the same
/// (the cuda program's decode, which reads its position from device
/// memory) is faster as a graph (docs/figures.md).
/// `CudaDevice::set_oneshot_graphs` chooses per device.
pub(crate) fn oneshot_graphs_default() -> OneShotGraphs {
    static MODE: OnceLock<OneShotGraphs> = OnceLock::new();
    *MODE.get_or_init(
        || match std::env::var("FERRITE_CUDA_ONESHOT_GRAPHS").as_deref() {
            Ok("1") => OneShotGraphs::On,
            Ok("0") => OneShotGraphs::Off,
            _ => OneShotGraphs::Auto,
        },
    )
}

/// The structure of a one-shot command buffer's commands: per command its
/// kind, and for a dispatch the executable (by identity), export, binding
/// and constant counts and whether it is empty, for a fill the pattern
/// length. Two command buffers of one shape make the same graph nodes with
/// the same dependencies; only parameters (addresses, constants, workgroup
/// counts, fill ranges and values) differ.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Shape {
    hash: u64,
    words: Vec<u64>,
}

/// The shape of `commands` when `cb` is one-shot and could run as a graph
/// (the commands [`eligible`] takes, graphs enabled), else `None`.
pub(crate) fn oneshot_shape(cb: &CommandBuffer, commands: &[Command]) -> Option<Shape> {
    if !graphs_enabled()
        || crate::kernel_times::enabled()
        // A graph's kernels cannot be timed one by one (`crate::profile`).
        || ferrite_base::trace::enabled()
        || cb.mode() & ferrite_hal::command_buffer::mode::ONE_SHOT == 0
    {
        return None;
    }
    let mut words = Vec::with_capacity(commands.len() * 4);
    let mut work = 0;
    for c in commands {
        match c {
            Command::Barrier => words.push(1),
            Command::Dispatch {
                executable,
                function,
                workgroups,
                indirect: None,
                constants,
                bindings,
            } => {
                work += 1;
                words.push(2);
                words.push(Arc::as_ptr(&executable.0) as *const () as usize as u64);
                words.push(*function as u64 | (workgroups.contains(&0) as u64) << 32);
                words.push(bindings.len() as u64 | (constants.len() as u64) << 32);
            }
            Command::Fill { pattern, .. } if matches!(pattern.len(), 1 | 2 | 4) => {
                work += 1;
                words.push(3 | (pattern.len() as u64) << 8);
            }
            _ => return None,
        }
    }
    if work < 2 {
        return None;
    }
    // FNV-1a over the words: compared first, so most mismatches cost one
    // comparison.
    let hash = words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
        (h ^ w).wrapping_mul(0x0100_0000_01b3)
    });
    Some(Shape { hash, words })
}

/// One-shot shapes remembered per device.
const SHAPES_KEPT: usize = 4;

/// Graphs kept per one-shot shape. A program's transient buffers come from
/// the stream-ordered pool, which hands consecutive calls alternating
/// addresses (the SmolLM2 decode step: every node's bindings differ from
/// one step to the next and equal those of the step before). With one
/// graph each step would update every node; with two, each call finds
/// the graph whose parameters it equals and launches it unchanged.
const GRAPHS_PER_SHAPE: usize = 2;

/// A one-shot shape seen on a device, and its graph once it was seen
/// twice.
struct ShapeEntry {
    shape: Shape,
    /// The shape's executables, kept alive so that no other executable
    /// can take one's address (the shape compares them by identity) while
    /// the graph holds their functions.
    _executables: Vec<Arc<dyn Executable>>,
    /// The shape's graphs, least recently launched first, at most
    /// [`GRAPHS_PER_SHAPE`].
    graphs: Vec<CommandGraph>,
    /// The driver refused to build the graph: always replay.
    refused: bool,
    /// Executions of the shape as a graph, and of those the ones that
    /// updated more than a quarter of a graph's nodes, counted up to
    /// [`AUTO_WINDOW`] executions while one-shot graphs are automatic.
    runs: u32,
    heavy_runs: u32,
    /// Automatic mode found the shape's parameters changing at most
    /// executions (more than half of the first [`AUTO_WINDOW`] were heavy):
    /// it is replayed on the stream, where launches overlap the GPU.
    gave_up: bool,
}

/// Graph executions of a one-shot shape after which automatic mode
/// decides whether the shape stays a graph.
pub(crate) const AUTO_WINDOW: u32 = 16;

/// Whether one-shot command buffers whose shape repeats run as graphs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum OneShotGraphs {
    /// Always replayed on the stream.
    Off = 0,
    /// Always graphs (updated where their parameters differ).
    On = 1,
    /// Graphs, except for a shape most of whose executions must update
    /// many nodes first (see [`ShapeEntry::gave_up`]).
    Auto = 2,
}

impl OneShotGraphs {
    pub(crate) fn from_u8(v: u8) -> OneShotGraphs {
        match v {
            0 => OneShotGraphs::Off,
            1 => OneShotGraphs::On,
            _ => OneShotGraphs::Auto,
        }
    }
}

/// The device's one-shot shapes, least recently used first, at most
/// [`SHAPES_KEPT`].
#[derive(Default)]
pub(crate) struct ShapeCache {
    entries: Vec<ShapeEntry>,
}

impl ShapeCache {
    /// Remembers a shape seen for the first time (forgetting the least
    /// recently used one when full).
    fn remember(&mut self, shape: Shape, commands: &[Command]) {
        if self.entries.len() >= SHAPES_KEPT {
            self.entries.remove(0);
        }
        let mut executables: Vec<Arc<dyn Executable>> = Vec::new();
        for c in commands {
            if let Command::Dispatch { executable, .. } = c {
                if !executables.iter().any(|e| Arc::ptr_eq(e, &executable.0)) {
                    executables.push(executable.0.clone());
                }
            }
        }
        self.entries.push(ShapeEntry {
            shape,
            _executables: executables,
            graphs: Vec::new(),
            refused: false,
            runs: 0,
            heavy_runs: 0,
            gave_up: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_hal::command_buffer::mode::ONE_SHOT;
    use ferrite_hal::command_buffer::BufferRef;
    use ferrite_hal::executable::{ExecutableRef, ExportInfo};
    use std::any::Any;

    /// An executable with two exports, enough to record dispatches.
    struct Exports(Vec<ExportInfo>);
    impl Executable for Exports {
        fn exports(&self) -> &[ExportInfo] {
            &self.0
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }
    fn executable() -> Arc<dyn Executable> {
        let export = |name: &str| ExportInfo {
            name: name.to_string(),
            workgroup_size: [1, 1, 1],
            constant_count: 1,
            binding_count: 1,
        };
        Arc::new(Exports(vec![export("a"), export("b")]))
    }
    fn slot(slot: u32, offset: u64) -> BufferRef {
        BufferRef::Slot {
            slot,
            offset,
            length: 4,
        }
    }

    /// A finalized command buffer: a fill, a barrier, then one dispatch of
    /// `exe` per entry of `dispatches` (export, workgroups, constant,
    /// binding offset).
    fn record(
        mode: u32,
        exe: &Arc<dyn Executable>,
        dispatches: &[(u32, [u32; 3], u32, u64)],
    ) -> CommandBuffer {
        let cb = CommandBuffer::new(mode, 0, 0, 2);
        cb.fill_buffer(slot(1, 0), 9, 4).unwrap();
        cb.execution_barrier().unwrap();
        for &(export, grid, constant, offset) in dispatches {
            cb.dispatch(
                ExecutableRef(exe.clone()),
                export,
                grid,
                None,
                vec![constant],
                vec![slot(0, offset)],
            )
            .unwrap();
        }
        cb.finalize().unwrap();
        cb
    }
    fn shape(cb: &CommandBuffer) -> Option<Shape> {
        oneshot_shape(cb, cb.finalized_commands().unwrap())
    }

    #[test]
    fn shapes_ignore_parameters_and_see_structure() {
        let exe = executable();
        let base = shape(&record(
            ONE_SHOT,
            &exe,
            &[(0, [4, 1, 1], 1, 0), (1, [2, 1, 1], 2, 4)],
        ))
        .expect("a one-shot buffer of three commands has a shape");
        // Other constants, workgroup counts and binding offsets: same shape.
        let same = shape(&record(
            ONE_SHOT,
            &exe,
            &[(0, [8, 2, 1], 7, 8), (1, [1, 1, 1], 3, 0)],
        ));
        assert!(same.as_ref() == Some(&base));
        // Other exports, another executable, an empty grid, one more
        // dispatch: other shapes.
        for other in [
            shape(&record(
                ONE_SHOT,
                &exe,
                &[(1, [4, 1, 1], 1, 0), (1, [2, 1, 1], 2, 4)],
            )),
            shape(&record(
                ONE_SHOT,
                &executable(),
                &[(0, [4, 1, 1], 1, 0), (1, [2, 1, 1], 2, 4)],
            )),
            shape(&record(
                ONE_SHOT,
                &exe,
                &[(0, [0, 1, 1], 1, 0), (1, [2, 1, 1], 2, 4)],
            )),
            shape(&record(
                ONE_SHOT,
                &exe,
                &[
                    (0, [4, 1, 1], 1, 0),
                    (1, [2, 1, 1], 2, 4),
                    (0, [1, 1, 1], 1, 0),
                ],
            )),
        ] {
            assert!(other.is_some() && other.as_ref() != Some(&base));
        }
        // Reusable buffers have their own graphs; a lone command, an
        // update of host bytes or an indirect dispatch is replayed.
        assert!(shape(&record(0, &exe, &[(0, [4, 1, 1], 1, 0)])).is_none());
        let lone = CommandBuffer::new(ONE_SHOT, 0, 0, 1);
        lone.fill_buffer(slot(0, 0), 1, 4).unwrap();
        lone.finalize().unwrap();
        assert!(shape(&lone).is_none());
        let update = CommandBuffer::new(ONE_SHOT, 0, 0, 1);
        update.fill_buffer(slot(0, 0), 1, 4).unwrap();
        update.update_buffer(vec![1, 2, 3, 4], slot(0, 4)).unwrap();
        update.finalize().unwrap();
        assert!(shape(&update).is_none());
        let indirect = CommandBuffer::new(ONE_SHOT, 0, 0, 2);
        indirect.fill_buffer(slot(0, 0), 1, 4).unwrap();
        indirect
            .dispatch(
                ExecutableRef(exe.clone()),
                0,
                [0, 0, 0],
                Some(slot(1, 0)),
                vec![1],
                vec![slot(0, 0)],
            )
            .unwrap();
        indirect.finalize().unwrap();
        assert!(shape(&indirect).is_none());
    }
}
