//! Reusable command buffers as CUDA graphs.
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
//! device addresses changed. Updates affect only later launches, so a
//! launch still in flight keeps the addresses it was launched with.
//!
//! Command buffers holding anything else (updates of host bytes, copies,
//! collectives, indirect dispatches), one-shot ones and ones of a single
//! command are replayed on the stream instead; so is every command buffer
//! when `FERRITE_CUDA_GRAPHS=0` or kernels are timed
//! ([`crate::kernel_times`]), and one whose graph the driver refused
//! to build (remembered, so the refusal is paid once).

use crate::device::{dispatch_kernel, CudaDevice, Shared};
use crate::ffi::{self, CUdeviceptr, CUgraph, CUgraphExec, CUgraphNode};
use ferrite_base::{bail, Result};
use ferrite_hal::command_buffer::{Binding, BufferRef, Command, CommandBuffer};
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// Whether graphs are enabled (`FERRITE_CUDA_GRAPHS=0` turns them off).
fn graphs_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRITE_CUDA_GRAPHS").map_or(true, |v| v != "0"))
}

/// True when `commands` can become a graph (see the module docs).
pub(crate) fn eligible(cb: &CommandBuffer, commands: &[Command]) -> bool {
    if !graphs_enabled()
        || crate::kernel_times::enabled()
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

/// A node whose parameters depend on the binding table.
struct TableNode {
    node: CUgraphNode,
    /// Index of its command.
    command: usize,
    /// The device addresses it was last set with (one per binding, or the
    /// fill target).
    addresses: Vec<CUdeviceptr>,
}

/// An instantiated graph of one command buffer on one device.
pub(crate) struct CommandGraph {
    shared: Arc<Shared>,
    graph: CUgraph,
    exec: CUgraphExec,
    /// Nodes to re-check at each execution, with their last addresses.
    table_nodes: Mutex<Vec<TableNode>>,
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

impl CudaDevice {
    /// Resolves the device addresses a graph node uses under `table`:
    /// `(addresses, depends on the table)`; `None` for commands that make
    /// no node (barriers, empty dispatches).
    fn node_addresses(
        &self,
        cmd: &Command,
        table: &[Binding],
    ) -> Result<Option<(Vec<CUdeviceptr>, bool)>> {
        match cmd {
            Command::Dispatch {
                executable,
                function,
                workgroups,
                bindings,
                constants,
                ..
            } => {
                let kernel = dispatch_kernel(executable, *function, bindings, constants)?;
                if workgroups.contains(&0) {
                    return Ok(None);
                }
                let refs = &bindings[..kernel.binding_count as usize];
                let mut out = Vec::with_capacity(refs.len());
                for r in refs {
                    out.push(self.resolve_address(r, table)?);
                }
                let slots = refs.iter().any(|r| matches!(r, BufferRef::Slot { .. }));
                Ok(Some((out, slots)))
            }
            Command::Fill { target, pattern } => {
                self.fill_geometry(target, table, pattern.len())?;
                Ok(Some((
                    vec![self.resolve_address(target, table)?],
                    matches!(target, BufferRef::Slot { .. }),
                )))
            }
            _ => Ok(None),
        }
    }

    /// Element size and count of a fill of `target` with an `n`-byte
    /// pattern.
    fn fill_geometry(
        &self,
        target: &BufferRef,
        table: &[Binding],
        n: usize,
    ) -> Result<(u32, usize)> {
        let (_, _, len) = target.resolve(table)?;
        if !len.is_multiple_of(n as u64) {
            bail!(
                InvalidArgument,
                "fill length {len} is not a multiple of the {n}-byte pattern"
            );
        }
        Ok((n as u32, (len / n as u64) as usize))
    }

    fn kernel_params(
        &self,
        cmd: &Command,
        addresses: &[CUdeviceptr],
    ) -> Result<(ffi::CUDA_KERNEL_NODE_PARAMS, KernelArgs)> {
        let Command::Dispatch {
            executable,
            function,
            workgroups,
            constants,
            bindings,
            ..
        } = cmd
        else {
            bail!(Internal, "not a dispatch");
        };
        let kernel = dispatch_kernel(executable, *function, bindings, constants)?;
        let mut args = KernelArgs::new(
            addresses.to_vec(),
            constants[..kernel.constant_count as usize].to_vec(),
        );
        let [bx, by, bz] = kernel.block_dims;
        if crate::diagnostics::log_launches() {
            crate::diagnostics::print_launch(
                &kernel.name,
                *workgroups,
                kernel.block_dims,
                kernel.shared_memory,
                addresses,
                &constants[..kernel.constant_count as usize],
            );
        }
        let p = ffi::CUDA_KERNEL_NODE_PARAMS {
            func: kernel.function,
            grid_dim_x: workgroups[0],
            grid_dim_y: workgroups[1],
            grid_dim_z: workgroups[2],
            block_dim_x: bx,
            block_dim_y: by,
            block_dim_z: bz,
            shared_mem_bytes: kernel.shared_memory,
            kernel_params: args.ptrs.as_mut_ptr(),
            extra: std::ptr::null_mut(),
        };
        Ok((p, args))
    }

    fn memset_params(
        &self,
        cmd: &Command,
        table: &[Binding],
        address: CUdeviceptr,
    ) -> Result<ffi::CUDA_MEMSET_NODE_PARAMS> {
        let Command::Fill { target, pattern } = cmd else {
            bail!(Internal, "not a fill");
        };
        let (size, count) = self.fill_geometry(target, table, pattern.len())?;
        let mut value = [0u8; 4];
        value[..pattern.len()].copy_from_slice(pattern);
        let value = match size {
            1 => pattern[0] as u32,
            2 => u16::from_le_bytes([pattern[0], pattern[1]]) as u32,
            _ => u32::from_le_bytes(value),
        };
        Ok(ffi::CUDA_MEMSET_NODE_PARAMS {
            dst: address,
            pitch: 0,
            value,
            element_size: size,
            width: count,
            height: 1,
        })
    }

    /// Builds and instantiates the graph of `commands` with `table`'s
    /// addresses.
    fn build_graph(&self, commands: &[Command], table: &[Binding]) -> Result<CommandGraph> {
        let shared = self.shared().clone();
        let api = shared.api;
        let mut graph: CUgraph = std::ptr::null_mut();
        ffi::check(
            // SAFETY: valid out-pointer; the context is current.
            unsafe { (api.cuGraphCreate)(&mut graph, 0) },
            "creating a CUDA graph",
        )?;
        let mut g = CommandGraph {
            shared: shared.clone(),
            graph,
            exec: std::ptr::null_mut(),
            table_nodes: Mutex::new(Vec::new()),
        };
        // Nodes of the last non-empty stage, and of the stage being built.
        let mut previous: Vec<CUgraphNode> = Vec::new();
        let mut current: Vec<CUgraphNode> = Vec::new();
        let mut join: Option<CUgraphNode> = None;
        let mut table_nodes = Vec::new();
        for (i, cmd) in commands.iter().enumerate() {
            if let Command::Barrier = cmd {
                if !current.is_empty() {
                    previous = std::mem::take(&mut current);
                    join = None;
                }
                continue;
            }
            let Some((addresses, from_table)) = self.node_addresses(cmd, table)? else {
                continue;
            };
            // Dependencies: the previous stage, through one empty join
            // node when it holds several (fewer edges).
            let deps: Vec<CUgraphNode> = if previous.len() > 1 {
                if join.is_none() {
                    let mut j: CUgraphNode = std::ptr::null_mut();
                    ffi::check(
                        // SAFETY: valid out-pointer; `previous` holds nodes
                        // of this graph.
                        unsafe {
                            (api.cuGraphAddEmptyNode)(
                                &mut j,
                                graph,
                                previous.as_ptr(),
                                previous.len(),
                            )
                        },
                        "adding a graph join node",
                    )?;
                    join = Some(j);
                }
                vec![join.unwrap_or(std::ptr::null_mut())]
            } else {
                previous.clone()
            };
            let mut node: CUgraphNode = std::ptr::null_mut();
            match cmd {
                Command::Dispatch { .. } => {
                    let (p, _args) = self.kernel_params(cmd, &addresses)?;
                    ffi::check(
                        // SAFETY: `p` points at `_args`' parameter pointers,
                        // laid out as the kernel expects; the driver copies
                        // them before returning; deps are nodes of `graph`.
                        unsafe {
                            (api.cuGraphAddKernelNode)(
                                &mut node,
                                graph,
                                deps.as_ptr(),
                                deps.len(),
                                &p,
                            )
                        },
                        "adding a kernel node",
                    )?;
                }
                Command::Fill { .. } => {
                    let p = self.memset_params(cmd, table, addresses[0])?;
                    ffi::check(
                        // SAFETY: a checked device range; deps are nodes of
                        // `graph`; the context is the device's.
                        unsafe {
                            (api.cuGraphAddMemsetNode)(
                                &mut node,
                                graph,
                                deps.as_ptr(),
                                deps.len(),
                                &p,
                                shared.ctx,
                            )
                        },
                        "adding a memset node",
                    )?;
                }
                _ => bail!(Internal, "command not eligible for a graph"),
            }
            current.push(node);
            if from_table {
                table_nodes.push(TableNode {
                    node,
                    command: i,
                    addresses,
                });
            }
        }
        let mut exec: CUgraphExec = std::ptr::null_mut();
        ffi::check(
            // SAFETY: a complete graph of this context; valid out-pointer.
            unsafe { (api.cuGraphInstantiateWithFlags)(&mut exec, graph, 0) },
            "instantiating a CUDA graph",
        )?;
        g.exec = exec;
        *g.table_nodes.get_mut() = table_nodes;
        Ok(g)
    }

    /// Enqueues `commands` (eligible, see [`eligible`]) as `cb`'s graph,
    /// building it at the first execution. `Ok(false)`: no graph (the
    /// driver refused, or another device owns `cb`'s graph slot); replay
    /// instead.
    pub(crate) fn launch_graph(
        &self,
        cb: &CommandBuffer,
        commands: &[Command],
        table: &[Binding],
    ) -> Result<bool> {
        let prepared = cb.prepared(|| match self.build_graph(commands, table) {
            Ok(g) => Box::new(Prepared::Graph(g)),
            Err(_) => Box::new(Prepared::Refused),
        });
        let Some(Prepared::Graph(g)) = prepared.and_then(|p| p.downcast_ref::<Prepared>()) else {
            return Ok(false);
        };
        if !Arc::ptr_eq(&g.shared, self.shared()) {
            return Ok(false);
        }
        let api = g.shared.api;
        {
            let mut nodes = g.table_nodes.lock();
            for n in nodes.iter_mut() {
                let cmd = &commands[n.command];
                let Some((addresses, _)) = self.node_addresses(cmd, table)? else {
                    continue;
                };
                if addresses == n.addresses {
                    continue;
                }
                let r = match cmd {
                    Command::Dispatch { .. } => {
                        let (p, _args) = self.kernel_params(cmd, &addresses)?;
                        // SAFETY: a node of this executable graph; `p` as in
                        // `build_graph` (copied by the driver).
                        unsafe { (api.cuGraphExecKernelNodeSetParams)(g.exec, n.node, &p) }
                    }
                    _ => {
                        let p = self.memset_params(cmd, table, addresses[0])?;
                        // SAFETY: a memset node of this graph; a checked range.
                        unsafe {
                            (api.cuGraphExecMemsetNodeSetParams)(g.exec, n.node, &p, g.shared.ctx)
                        }
                    }
                };
                ffi::check(r, "updating a graph node's bindings")?;
                n.addresses = addresses;
            }
        }
        ffi::check(
            // SAFETY: an instantiated graph of this context, launched on its
            // queue stream under the submission lock; every address it uses
            // was checked against this execution's bindings (or at build).
            unsafe { (api.cuGraphLaunch)(g.exec, g.shared.stream) },
            "launching a CUDA graph",
        )?;
        self.graph_launches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }
}
