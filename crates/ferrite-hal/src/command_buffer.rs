//! Command buffers: recorded sequences of transfers and dispatches that a
//! queue executes later, possibly many times (reusable mode) and with
//! buffers supplied at submission (binding tables).
//!
//! Recording validates ranges and usage up front so that errors name the
//! command that was wrong; execution is the device's job
//! ([`crate::device::Device::execute_commands`]).

use crate::buffer::Buffer;
use crate::channel::{ChannelRef, CollectiveOp};
use crate::executable::ExecutableRef;
use crate::memory::BufferUsage;
use ferrite_base::RefObject;
use ferrite_base::{bail, Result};
use parking_lot::Mutex;
use std::any::Any;
use std::sync::{Arc, OnceLock};

/// Command buffer mode bits (upstream's values).
pub mod mode {
    /// Submitted once, then discarded.
    pub const ONE_SHOT: u32 = 1 << 0;
    /// Validation may be skipped.
    pub const UNVALIDATED: u32 = 1 << 1;
    /// Executes inline during recording (not used by Ferrite's drivers).
    pub const ALLOW_INLINE_EXECUTION: u32 = 1 << 4;
}

/// A buffer range a command reads or writes: a buffer recorded directly or
/// a slot of the binding table supplied at submission.
#[derive(Clone, Debug)]
pub enum BufferRef {
    /// A buffer fixed at recording.
    Direct {
        /// The buffer.
        buffer: Buffer,
        /// Byte offset within it.
        offset: u64,
        /// Byte length (`u64::MAX` = to the end).
        length: u64,
    },
    /// A binding table slot resolved at submission.
    Slot {
        /// Binding table ordinal.
        slot: u32,
        /// Byte offset within the bound range.
        offset: u64,
        /// Byte length (`u64::MAX` = to the end).
        length: u64,
    },
}

/// One entry of a submission's binding table.
/// The bindings a command buffer executes with (slot `i` is entry `i`).
/// Programs bind a handful of buffers per execution, which then need no
/// allocation.
pub type BindingTable = smallvec::SmallVec<[Binding; 4]>;

/// One binding table entry.
#[derive(Clone, Debug)]
pub struct Binding {
    /// The bound buffer.
    pub buffer: Buffer,
    /// Byte offset of the bound range.
    pub offset: u64,
    /// Byte length of the bound range (`u64::MAX` = to the end).
    pub length: u64,
}

impl BufferRef {
    /// Resolves to a concrete buffer subrange against `table`.
    pub fn resolve<'a>(&'a self, table: &'a [Binding]) -> Result<(&'a Buffer, u64, u64)> {
        match self {
            BufferRef::Direct {
                buffer,
                offset,
                length,
            } => {
                let (o, l) = buffer.resolve_range(*offset, *length)?;
                Ok((buffer, o, l))
            }
            BufferRef::Slot {
                slot,
                offset,
                length,
            } => {
                let Some(b) = table.get(*slot as usize) else {
                    bail!(
                        OutOfRange,
                        "binding table slot {slot} out of range (table has {} entries)",
                        table.len()
                    );
                };
                let (bo, bl) = b.buffer.resolve_range(b.offset, b.length)?;
                let len = if *length == u64::MAX {
                    bl.saturating_sub(*offset)
                } else {
                    *length
                };
                if offset.checked_add(len).is_none_or(|e| e > bl) {
                    bail!(
                        OutOfRange,
                        "binding table slot {slot}: range {offset}+{len} exceeds the bound length {bl}"
                    );
                }
                Ok((&b.buffer, bo + offset, len))
            }
        }
    }
}

/// A recorded command.
#[derive(Clone, Debug)]
pub enum Command {
    /// Orders the commands before it before those after it.
    Barrier,
    /// Fills a range with a 1/2/4-byte pattern.
    Fill {
        /// Target range.
        target: BufferRef,
        /// Pattern bytes (1, 2 or 4 of them).
        pattern: Vec<u8>,
    },
    /// Writes bytes captured at recording.
    Update {
        /// Bytes to write.
        data: Vec<u8>,
        /// Target range.
        target: BufferRef,
    },
    /// Copies between ranges.
    Copy {
        /// Source range.
        source: BufferRef,
        /// Target range.
        target: BufferRef,
    },
    /// Runs an executable export over a workgroup grid.
    Dispatch {
        /// The executable.
        executable: ExecutableRef,
        /// Export ordinal.
        function: u32,
        /// Workgroup counts (x, y, z).
        workgroups: [u32; 3],
        /// Workgroup counts read from a buffer at execution (indirect).
        indirect: Option<BufferRef>,
        /// Push constants.
        constants: Vec<u32>,
        /// Buffer bindings in binding order.
        bindings: Vec<BufferRef>,
    },
    /// A collective operation over a channel's group.
    Collective {
        /// The channel (this device's participant of the group).
        channel: ChannelRef,
        /// What to do.
        op: CollectiveOp,
        /// The kind-specific parameter (root, peer or packed peers).
        param: u32,
        /// The range read (absent for `recv`).
        send: Option<BufferRef>,
        /// The range written (absent for `send`).
        recv: Option<BufferRef>,
        /// Element count (per rank; see [`crate::channel::CollectiveKind`]).
        element_count: u64,
    },
}

struct State {
    commands: Vec<Command>,
}

/// A command buffer (VM ref type `hal.command_buffer`).
pub struct CommandBuffer {
    /// Process-unique number, from 1 (profiles name command buffers by
    /// it); 0 until first asked for, so buffers of untraced runs never
    /// touch the shared counter.
    id: std::sync::atomic::AtomicU64,
    /// The trace recording this buffer was last described in
    /// ([`crate::command_trace`]).
    described: std::sync::atomic::AtomicU64,
    mode: u32,
    categories: u32,
    queue_affinity: u64,
    binding_capacity: u32,
    state: Mutex<State>,
    /// A device's own form of the finalized commands (e.g. a CUDA graph),
    /// made at the first execution by the device that asks first (see
    /// [`CommandBuffer::prepared`]). Declared before `finalized` so it is
    /// dropped first: it may refer to the commands' executables.
    prepared: OnceLock<Box<dyn Any + Send + Sync>>,
    /// Set once at finalize (under `state`'s lock): submissions share the
    /// commands without copying, and read them without locking.
    finalized: OnceLock<Arc<[Command]>>,
}

impl RefObject for CommandBuffer {
    fn type_name(&self) -> &'static str {
        "hal.command_buffer"
    }
}

impl std::fmt::Debug for CommandBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        write!(
            f,
            "hal.command_buffer(mode={:#x}, {} commands{})",
            self.mode,
            self.finalized.get().map_or(s.commands.len(), |c| c.len()),
            if self.finalized.get().is_some() {
                ", finalized"
            } else {
                ""
            }
        )
    }
}

impl CommandBuffer {
    /// Starts recording.
    pub fn new(
        mode: u32,
        categories: u32,
        queue_affinity: u64,
        binding_capacity: u32,
    ) -> CommandBuffer {
        CommandBuffer {
            id: std::sync::atomic::AtomicU64::new(0),
            described: std::sync::atomic::AtomicU64::new(0),
            mode,
            categories,
            queue_affinity,
            binding_capacity,
            state: Mutex::new(State {
                commands: Vec::new(),
            }),
            prepared: OnceLock::new(),
            finalized: OnceLock::new(),
        }
    }

    /// The process-unique number of this command buffer (from 1), given
    /// at the first call.
    pub fn id(&self) -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        match self.id.load(Relaxed) {
            0 => {
                let new = NEXT_ID.fetch_add(1, Relaxed);
                // Two first callers race: one number wins, both return it.
                match self.id.compare_exchange(0, new, Relaxed, Relaxed) {
                    Ok(_) => new,
                    Err(won) => won,
                }
            }
            id => id,
        }
    }

    /// True the first time it is asked during trace recording `session`
    /// (so a recording describes each command buffer once).
    pub(crate) fn first_use_in(&self, session: u64) -> bool {
        self.described
            .swap(session, std::sync::atomic::Ordering::Relaxed)
            != session
    }

    /// Mode bits.
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// Command categories.
    pub fn categories(&self) -> u32 {
        self.categories
    }

    /// Queue affinity mask.
    pub fn queue_affinity(&self) -> u64 {
        self.queue_affinity
    }

    /// Binding table capacity declared at creation.
    pub fn binding_capacity(&self) -> u32 {
        self.binding_capacity
    }

    /// Reserves room for `additional` more commands: a recorder that
    /// expects about as many commands as last time (a program records the
    /// same command buffer every call) spares the copies of a growing
    /// list (an LLM decode step records ~900 commands of 136 bytes).
    pub fn reserve(&self, additional: usize) {
        self.state.lock().commands.reserve(additional);
    }

    /// The number of commands recorded so far (all of them once
    /// finalized).
    pub fn command_count(&self) -> usize {
        match self.finalized.get() {
            Some(c) => c.len(),
            None => self.state.lock().commands.len(),
        }
    }

    /// Checks a recorded range; `what` names it in errors only (a
    /// `format_args!` is formatted only on failure, so recording a
    /// dispatch allocates nothing for its bindings' names).
    fn check_ref(
        &self,
        r: &BufferRef,
        usage: BufferUsage,
        what: &dyn std::fmt::Display,
    ) -> Result<()> {
        match r {
            BufferRef::Direct {
                buffer,
                offset,
                length,
            } => {
                buffer
                    .validate_usage(usage)
                    .map_err(|e| e.annotate(format!("{what} buffer")))?;
                buffer
                    .resolve_range(*offset, *length)
                    .map_err(|e| e.annotate(format!("{what} range")))?;
            }
            BufferRef::Slot { slot, .. } => {
                if self.binding_capacity != 0 && *slot >= self.binding_capacity {
                    bail!(
                        OutOfRange,
                        "{what}: binding table slot {slot} exceeds the command buffer's capacity {}",
                        self.binding_capacity
                    );
                }
            }
        }
        Ok(())
    }

    fn push(&self, c: Command) -> Result<()> {
        let mut s = self.state.lock();
        if self.finalized.get().is_some() {
            bail!(
                FailedPrecondition,
                "command buffer is finalized; no more commands can be recorded"
            );
        }
        s.commands.push(c);
        Ok(())
    }

    /// Records an execution barrier.
    pub fn execution_barrier(&self) -> Result<()> {
        self.push(Command::Barrier)
    }

    /// Records a fill of `target` with the low `pattern_length` bytes of `pattern`.
    pub fn fill_buffer(&self, target: BufferRef, pattern: u64, pattern_length: u32) -> Result<()> {
        if !matches!(pattern_length, 1 | 2 | 4 | 8) {
            bail!(
                InvalidArgument,
                "fill pattern length must be 1, 2, 4 or 8 bytes, got {pattern_length}"
            );
        }
        self.check_ref(&target, BufferUsage::TRANSFER_TARGET, &"fill target")?;
        let pattern = pattern.to_le_bytes()[..pattern_length as usize].to_vec();
        self.push(Command::Fill { target, pattern })
    }

    /// Records a write of `data` into `target`.
    pub fn update_buffer(&self, data: Vec<u8>, target: BufferRef) -> Result<()> {
        self.check_ref(&target, BufferUsage::TRANSFER_TARGET, &"update target")?;
        self.push(Command::Update { data, target })
    }

    /// Records a copy.
    pub fn copy_buffer(&self, source: BufferRef, target: BufferRef) -> Result<()> {
        self.check_ref(&source, BufferUsage::TRANSFER_SOURCE, &"copy source")?;
        self.check_ref(&target, BufferUsage::TRANSFER_TARGET, &"copy target")?;
        self.push(Command::Copy { source, target })
    }

    /// Records a dispatch of export `function` of `executable`.
    pub fn dispatch(
        &self,
        executable: ExecutableRef,
        function: u32,
        workgroups: [u32; 3],
        indirect: Option<BufferRef>,
        constants: Vec<u32>,
        bindings: Vec<BufferRef>,
    ) -> Result<()> {
        let count = executable.0.exports().len();
        if function as usize >= count {
            bail!(
                OutOfRange,
                "dispatch: function ordinal {function} out of range (executable has {count} exports)"
            );
        }
        for (i, b) in bindings.iter().enumerate() {
            self.check_ref(
                b,
                BufferUsage::DISPATCH_STORAGE,
                &format_args!("dispatch binding {i}"),
            )?;
        }
        if let Some(r) = &indirect {
            self.check_ref(
                r,
                BufferUsage::DISPATCH_INDIRECT_PARAMETERS,
                &"dispatch workgroup count",
            )?;
        }
        self.push(Command::Dispatch {
            executable,
            function,
            workgroups,
            indirect,
            constants,
            bindings,
        })
    }

    /// Records a collective operation on `channel`'s group. The send and
    /// receive ranges are checked for the usage upstream asks (dispatch
    /// storage read / write) and for being present when the kind uses them.
    pub fn collective(
        &self,
        channel: ChannelRef,
        op: CollectiveOp,
        param: u32,
        send: Option<BufferRef>,
        recv: Option<BufferRef>,
        element_count: u64,
    ) -> Result<()> {
        let name = op.kind.name();
        match (&send, op.kind.uses_send()) {
            (Some(r), true) => self.check_ref(
                r,
                BufferUsage::DISPATCH_STORAGE_READ,
                &format_args!("{name} send"),
            )?,
            (None, true) => bail!(InvalidArgument, "collective {name} needs a send buffer"),
            _ => {}
        }
        match (&recv, op.kind.uses_recv()) {
            (Some(r), true) => self.check_ref(
                r,
                BufferUsage::DISPATCH_STORAGE_WRITE,
                &format_args!("{name} recv"),
            )?,
            (None, true) => bail!(InvalidArgument, "collective {name} needs a recv buffer"),
            _ => {}
        }
        self.push(Command::Collective {
            channel,
            op,
            param,
            send,
            recv,
            element_count,
        })
    }

    /// Ends recording.
    pub fn finalize(&self) -> Result<()> {
        let mut s = self.state.lock();
        if self.finalized.get().is_some() {
            bail!(FailedPrecondition, "command buffer already finalized");
        }
        let commands = std::mem::take(&mut s.commands);
        // Set under the lock, so no command can be recorded after it.
        let _ = self.finalized.set(commands.into());
        Ok(())
    }

    /// A device's prepared form of the finalized commands, made by `make`
    /// at the first call; later calls (from any device) get the same
    /// object, which the device downcasts and checks is its own. `None`
    /// before finalize. Drivers use it for state worth building once per
    /// reusable command buffer (the CUDA driver's graphs).
    pub fn prepared(
        &self,
        make: impl FnOnce() -> Box<dyn Any + Send + Sync>,
    ) -> Option<&(dyn Any + Send + Sync)> {
        self.finalized.get()?;
        Some(&**self.prepared.get_or_init(make))
    }

    /// The recorded commands, shared (the buffer must be finalized).
    pub fn commands(&self) -> Result<Arc<[Command]>> {
        self.finalized_commands().map(Arc::clone)
    }

    /// The recorded commands, borrowed without locking or reference
    /// counting (the buffer must be finalized).
    pub fn finalized_commands(&self) -> Result<&Arc<[Command]>> {
        match self.finalized.get() {
            Some(c) => Ok(c),
            None => bail!(
                FailedPrecondition,
                "command buffer must be finalized before submission"
            ),
        }
    }
}
