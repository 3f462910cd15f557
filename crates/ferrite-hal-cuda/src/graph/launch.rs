//! Building, updating and launching a command buffer's graph on the
//! device's queue stream, and running one-shot command buffers as their
//! shape's graph (see the parent module for when each happens). Kept apart
//! from the graph and shape types so that the device, which holds a
//! [`super::ShapeCache`], names no module that names the device.

use super::{
    CommandGraph, KernelArgs, NodeState, OneShotGraphs, Prepared, Shape, UpdatableNode,
    AUTO_WINDOW, GRAPHS_PER_SHAPE,
};
use crate::completion::InFlightResources;
use crate::device::CudaDevice;
use crate::executable::dispatch_kernel;
use crate::ffi::{self, CUgraph, CUgraphExec, CUgraphNode};
use ferrite_base::{bail, Result};
use ferrite_hal::command_buffer::{Binding, BufferRef, Command, CommandBuffer};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl CudaDevice {
    /// What the graph node of `cmd` is set with under `table`, and whether
    /// that depends on the table; `None` for commands that make no node
    /// (barriers, empty dispatches). Checks ranges as a stream replay does.
    fn node_state(&self, cmd: &Command, table: &[Binding]) -> Result<Option<(NodeState, bool)>> {
        let mut state = NodeState {
            addresses: Vec::new(),
            words: Vec::new(),
        };
        Ok(self
            .node_state_into(cmd, table, &mut state)?
            .map(|slots| (state, slots)))
    }

    /// [`Self::node_state`] written into `state` (its vectors cleared and
    /// refilled, so a scratch state compared against each node at every
    /// execution allocates nothing): whether it depends on the table, or
    /// `None` for commands that make no node (`state` then unspecified).
    fn node_state_into(
        &self,
        cmd: &Command,
        table: &[Binding],
        state: &mut NodeState,
    ) -> Result<Option<bool>> {
        state.addresses.clear();
        state.words.clear();
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
                for r in refs {
                    state.addresses.push(self.resolve_address(r, table)?);
                }
                let cc = kernel.constant_count as usize;
                state.words.extend_from_slice(&constants[..cc]);
                state.words.extend_from_slice(workgroups);
                Ok(Some(
                    refs.iter().any(|r| matches!(r, BufferRef::Slot { .. })),
                ))
            }
            Command::Fill { target, pattern } => {
                let (size, count) = self.fill_geometry(target, table, pattern.len())?;
                let value = match pattern.len() {
                    1 => pattern[0] as u32,
                    2 => u16::from_le_bytes([pattern[0], pattern[1]]) as u32,
                    4 => u32::from_le_bytes([pattern[0], pattern[1], pattern[2], pattern[3]]),
                    n => bail!(
                        Unimplemented,
                        "CUDA fills take 1, 2 or 4-byte patterns (got {n})"
                    ),
                };
                let count = count as u64;
                state.addresses.push(self.resolve_address(target, table)?);
                state
                    .words
                    .extend_from_slice(&[size, count as u32, (count >> 32) as u32, value]);
                Ok(Some(matches!(target, BufferRef::Slot { .. })))
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

    /// The kernel node parameters of dispatch `cmd` set with `state`;
    /// `what` names the node in the launch log.
    fn kernel_params(
        &self,
        cmd: &Command,
        state: &NodeState,
        what: &str,
    ) -> Result<(ffi::CUDA_KERNEL_NODE_PARAMS, KernelArgs)> {
        let Command::Dispatch {
            executable,
            function,
            constants,
            bindings,
            ..
        } = cmd
        else {
            bail!(Internal, "not a dispatch");
        };
        let kernel = dispatch_kernel(executable, *function, bindings, constants)?;
        let cc = kernel.constant_count as usize;
        let (consts, grid) = state.words.split_at(cc);
        let workgroups = [grid[0], grid[1], grid[2]];
        let mut args = KernelArgs::new(state.addresses.clone(), consts.to_vec());
        let [bx, by, bz] = kernel.block_dims;
        if crate::diagnostics::log_launches() {
            crate::diagnostics::print_launch(
                what,
                &kernel.name,
                workgroups,
                kernel.block_dims,
                kernel.shared_memory,
                &state.addresses,
                consts,
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

    /// The memset node parameters of a fill set with `state`.
    fn memset_params(state: &NodeState) -> ffi::CUDA_MEMSET_NODE_PARAMS {
        let w = &state.words;
        ffi::CUDA_MEMSET_NODE_PARAMS {
            dst: state.addresses[0],
            pitch: 0,
            value: w[3],
            element_size: w[0],
            width: (w[1] as u64 | (w[2] as u64) << 32) as usize,
            height: 1,
        }
    }

    /// Builds and instantiates the graph of `commands` with `table`'s
    /// addresses. `update_all`: every node is re-checked at each execution
    /// (a one-shot shape's graph, whose commands change), else only those
    /// depending on the table.
    fn build_graph(
        &self,
        commands: &[Command],
        table: &[Binding],
        update_all: bool,
    ) -> Result<CommandGraph> {
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
            node_count: 0,
            nodes: Mutex::new(Vec::new()),
        };
        // Nodes of the last non-empty stage, and of the stage being built.
        let mut previous: Vec<CUgraphNode> = Vec::new();
        let mut current: Vec<CUgraphNode> = Vec::new();
        let mut join: Option<CUgraphNode> = None;
        let mut nodes = Vec::new();
        for (i, cmd) in commands.iter().enumerate() {
            if let Command::Barrier = cmd {
                if !current.is_empty() {
                    previous = std::mem::take(&mut current);
                    join = None;
                }
                continue;
            }
            let Some((state, from_table)) = self.node_state(cmd, table)? else {
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
                    let (p, _args) = self.kernel_params(cmd, &state, "graph node")?;
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
                    let p = Self::memset_params(&state);
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
            g.node_count += 1;
            if from_table || update_all {
                nodes.push(UpdatableNode {
                    node,
                    command: i,
                    state,
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
        *g.nodes.get_mut() = nodes;
        Ok(g)
    }

    /// Updates the nodes of `g` whose parameters differ under `commands`
    /// and `table` (checking every range again), then launches it on the
    /// queue stream. `commands` must have the structure `g` was built from.
    fn update_and_launch(
        &self,
        g: &CommandGraph,
        commands: &[Command],
        table: &[Binding],
        oneshot: bool,
    ) -> Result<u64> {
        let api = g.shared.api;
        let mut updated = 0u64;
        {
            let mut nodes = g.nodes.lock();
            // Each node's state is computed into this scratch state and
            // compared; a changed one is swapped in (the node's old vectors
            // become the scratch), so unchanged nodes allocate nothing.
            let mut state = NodeState {
                addresses: Vec::new(),
                words: Vec::new(),
            };
            for n in nodes.iter_mut() {
                let cmd = &commands[n.command];
                if self.node_state_into(cmd, table, &mut state)?.is_none() {
                    bail!(Internal, "a graph node's command no longer makes a node");
                }
                if state == n.state {
                    continue;
                }
                let r = match cmd {
                    Command::Dispatch { .. } => {
                        let (p, _args) = self.kernel_params(cmd, &state, "graph node update")?;
                        // SAFETY: a kernel node of this executable graph,
                        // with the same function; `p` as in `build_graph`
                        // (copied by the driver).
                        unsafe { (api.cuGraphExecKernelNodeSetParams)(g.exec, n.node, &p) }
                    }
                    _ => {
                        let p = Self::memset_params(&state);
                        // SAFETY: a memset node of this graph; a checked range
                        // of this context's memory.
                        unsafe {
                            (api.cuGraphExecMemsetNodeSetParams)(g.exec, n.node, &p, g.shared.ctx)
                        }
                    }
                };
                ffi::check(r, "updating a graph node's parameters")?;
                std::mem::swap(&mut n.state, &mut state);
                updated += 1;
            }
        }
        self.graph_node_updates
            .fetch_add(updated, Ordering::Relaxed);
        self.launch_as_set(g, oneshot, updated)?;
        Ok(updated)
    }

    /// Whether every node of `g` is set exactly as `commands` under `table`
    /// need (checking their ranges; an error for a bad one).
    fn set_as(&self, g: &CommandGraph, commands: &[Command], table: &[Binding]) -> Result<bool> {
        let nodes = g.nodes.lock();
        let mut state = NodeState {
            addresses: Vec::new(),
            words: Vec::new(),
        };
        for n in nodes.iter() {
            if self
                .node_state_into(&commands[n.command], table, &mut state)?
                .is_none()
                || state != n.state
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Launches `g`, every node of which [`Self::set_as`] found set as this
    /// execution needs.
    fn launch_unchanged(&self, g: &CommandGraph, oneshot: bool) -> Result<()> {
        self.launch_as_set(g, oneshot, 0)
    }

    /// Launches `g` as its nodes are set (`updated` of them just now) on the
    /// queue stream.
    fn launch_as_set(&self, g: &CommandGraph, oneshot: bool, updated: u64) -> Result<()> {
        let api = g.shared.api;
        ffi::check(
            // SAFETY: an instantiated graph of this context, launched on its
            // queue stream under the submission lock; every address it uses
            // was checked against this execution's commands and bindings
            // (by `update_and_launch` or `set_as`).
            unsafe { (api.cuGraphLaunch)(g.exec, g.shared.stream) },
            "launching a CUDA graph",
        )?;
        if crate::diagnostics::log_launches() {
            eprintln!(
                "cuda graph launch: {} nodes, {updated} updated{}",
                g.node_count,
                if oneshot { " (one-shot shape)" } else { "" }
            );
        }
        self.graph_launches.fetch_add(1, Ordering::Relaxed);
        if oneshot {
            self.oneshot_graph_launches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
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
        let prepared = cb.prepared(|| match self.build_graph(commands, table, false) {
            Ok(g) => Box::new(Prepared::Graph(g)),
            Err(_) => Box::new(Prepared::Refused),
        });
        let Some(Prepared::Graph(g)) = prepared.and_then(|p| p.downcast_ref::<Prepared>()) else {
            return Ok(false);
        };
        if !Arc::ptr_eq(&g.shared, self.shared()) {
            return Ok(false);
        }
        self.update_and_launch(g, commands, table, false)?;
        Ok(true)
    }

    /// Whether a one-shot command buffer of `shape` would be launched as a
    /// graph now (its shape was submitted before and not refused).
    pub(crate) fn shape_is_known(&self, shape: &Shape) -> bool {
        let auto = self.oneshot_graphs_mode() == OneShotGraphs::Auto;
        self.shapes
            .lock()
            .entries
            .iter()
            .any(|e| !e.refused && (!e.gave_up || !auto) && e.shape == *shape)
    }

    /// Enqueues the commands of a one-shot command buffer of `shape` (see
    /// [`oneshot_shape`]): replayed on the stream the first time its shape
    /// is seen (the shape is remembered), launched as the shape's graph
    /// (built at the second time, updated where the commands differ)
    /// afterwards. Anything the graph path cannot do (a range check that
    /// fails, a driver refusal) falls back to the stream replay, which
    /// reports failures as it always does.
    pub(crate) fn execute_oneshot(
        &self,
        shape: &Shape,
        commands: &Arc<[Command]>,
        table: &[Binding],
        keep: &mut InFlightResources,
    ) -> Result<()> {
        let mut cache = self.shapes.lock();
        let Some(i) = cache.entries.iter().position(|e| e.shape == *shape) else {
            cache.remember(shape.clone(), commands);
            drop(cache);
            return self.enqueue_commands(commands, table, keep);
        };
        // Most recently used last.
        let entry = cache.entries.remove(i);
        cache.entries.push(entry);
        let last = cache.entries.len() - 1;
        let entry = &mut cache.entries[last];
        let auto = self.oneshot_graphs_mode() == OneShotGraphs::Auto;
        if entry.refused || (entry.gave_up && auto) {
            drop(cache);
            return self.enqueue_commands(commands, table, keep);
        }
        // A graph set exactly as these commands need, least recently
        // launched first (with alternating transient addresses, the one
        // launched by the call before last).
        let mut same = None;
        for (i, g) in entry.graphs.iter().enumerate() {
            match self.set_as(g, commands, table) {
                Ok(true) => {
                    same = Some(i);
                    break;
                }
                Ok(false) => {}
                // A bad range: the replay reports it; the shape starts over.
                Err(_) => {
                    cache.entries.pop();
                    drop(cache);
                    return self.enqueue_commands(commands, table, keep);
                }
            }
        }
        if same.is_none() && entry.graphs.len() < GRAPHS_PER_SHAPE {
            // Range checks first: a bad submission is reported by the
            // replay and does not make the driver's refusal stick.
            let checked = commands
                .iter()
                .try_for_each(|c| self.node_state(c, table).map(|_| ()));
            if checked.is_err() {
                drop(cache);
                return self.enqueue_commands(commands, table, keep);
            }
            match self.build_graph(commands, table, true) {
                Ok(g) => {
                    entry.graphs.push(g);
                    same = Some(entry.graphs.len() - 1);
                }
                Err(_) if entry.graphs.is_empty() => {
                    entry.refused = true;
                    drop(cache);
                    return self.enqueue_commands(commands, table, keep);
                }
                // The shape has a graph already: update that one.
                Err(_) => {}
            }
        }
        // The graph to launch goes last (most recently launched); without
        // one set as needed, the least recently launched is updated.
        let i = same.unwrap_or(0);
        let g = entry.graphs.remove(i);
        entry.graphs.push(g);
        let Some(g) = entry.graphs.last() else {
            bail!(Internal, "a one-shot shape's graph vanished");
        };
        let node_count = g.node_count as u64;
        let launched = if same.is_some() {
            self.launch_unchanged(g, true).map(|()| 0)
        } else {
            self.update_and_launch(g, commands, table, true)
        };
        match launched {
            Ok(updated) => {
                if auto && entry.runs < AUTO_WINDOW {
                    entry.runs += 1;
                    if updated * 4 > node_count {
                        entry.heavy_runs += 1;
                    }
                    if entry.runs == AUTO_WINDOW && entry.heavy_runs * 2 > AUTO_WINDOW {
                        // Most executions updated many nodes before their
                        // launch: replay the shape from now on.
                        entry.gave_up = true;
                        entry.graphs.clear();
                    }
                }
                // The commands hold their direct buffers and executables
                // until the launch completes.
                for b in table {
                    keep.buffers.push(b.buffer.clone());
                }
                keep.commands.push(commands.clone());
                Ok(())
            }
            Err(_) => {
                // Possibly half updated: forget the shape's graphs.
                cache.entries.pop();
                drop(cache);
                self.enqueue_commands(commands, table, keep)
            }
        }
    }
}
