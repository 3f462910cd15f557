//! Devices: what a driver implements, and the queue operations.
//!
//! A driver provides allocation, executable loading, command execution and a
//! queue primitive, [`Device::submit`]: run some host work once a wait fence
//! is reached, then signal a signal fence.
//!
//! # Queue operations
//!
//! Every queue operation (alloca, dealloca, fill, update, copy, execute,
//! barrier, flush; the hal module's read and write are built on update and
//! submit) is a [`Device`] method (`queue_*`) that a driver may implement
//! itself. The default of each is the host path in [`queue::host`], built
//! on [`Device::submit`]: CPU devices use it unchanged. A device that runs
//! apart from the host (CUDA) implements them on its own streams instead and
//! orders them by semaphores the device waits on and signals itself (see
//! [`crate::semaphore`]'s device timelines). Callers use the functions in
//! [`queue`], which check arguments and dispatch to the device.
//!
//! The contract is the same for every implementation: the operation runs
//! after every timepoint of `wait` is reached; then every timepoint of
//! `signal` is reached; a failed wait fails `signal` (with the wait's
//! status) instead of running the operation, and a failed operation fails
//! `signal` with its status. Errors returned by the call itself are
//! argument errors found before anything was enqueued.

use crate::allocator::{Allocator, BufferParams};
use crate::buffer::Buffer;
use crate::channel::{ChannelParams, ChannelProvider, ChannelRef};
use crate::command_buffer::CommandBuffer;
use crate::command_buffer::{Binding, BindingTable, Command};
use crate::executable::Executable;
use crate::fence::Fence;
use crate::inflight::SubmissionUses;
use crate::semaphore::Semaphore;
use ferrite_base::RefObject;
use ferrite_base::Result;
use std::any::Any;
use std::sync::Arc;

/// Work a queue runs once its wait fence is reached.
pub type Work = Box<dyn FnOnce() -> Result<()> + Send>;

/// What a submission's [`Work`] does, for a driver that picks how to run
/// it by its size ([`Device::submit_hinted`]).
#[derive(Clone, Copy, Debug)]
pub enum WorkHint<'a> {
    /// Queue bookkeeping that reads and writes no buffer contents
    /// (`alloca`'s and `barrier`'s empty work, `dealloca`'s release).
    Bookkeeping,
    /// Executes these commands (a command buffer's).
    Commands(&'a [Command]),
}

/// A HAL device: one driver instance with its queues.
pub trait Device: Send + Sync + 'static {
    /// Device identifier, as `hal.device.id` queries match it (`local-sync`).
    fn id(&self) -> &str;
    /// The device's allocator.
    fn allocator(&self) -> Arc<dyn Allocator>;
    /// The allocator queue-ordered `alloca` draws from. Programs allocate
    /// and release transients of the same sizes on every call, so drivers
    /// give it a pool in front of [`Device::allocator`]; the default is the
    /// device allocator itself.
    fn queue_allocator(&self) -> Arc<dyn Allocator> {
        self.allocator()
    }
    /// `queue_allocator().allocate(params, size)`, the allocation behind a
    /// queue `alloca`: a driver that owns its pool overrides it to allocate
    /// without handing out (and dropping) a reference per call.
    fn queue_allocate(&self, params: &BufferParams, size: u64) -> Result<Buffer> {
        self.queue_allocator().allocate(params, size)
    }
    /// Answers `hal.device.query.i64(category, key)`; None when unknown.
    fn query_i64(&self, category: &str, key: &str) -> Result<Option<i64>>;
    /// Loads an executable of `format` (e.g. `embedded-elf-x86_64`).
    fn create_executable(
        &self,
        format: &str,
        data: &[u8],
        constants: &[u32],
    ) -> Result<Arc<dyn Executable>>;
    /// Runs `work` once `wait` is reached, then signals `signal`. Drivers may
    /// run it inline (synchronous devices) or later on their own threads.
    fn submit(&self, wait: &Fence, signal: &Fence, work: Work) -> Result<()>;
    /// [`Device::submit`] with what `work` does: a driver may run small
    /// work whose `wait` is already reached on the calling thread (the
    /// `local-task` device does, see `ferrite-hal-cpu`). Default: `submit`.
    fn submit_hinted(
        &self,
        wait: &Fence,
        signal: &Fence,
        hint: WorkHint<'_>,
        work: Work,
    ) -> Result<()> {
        let _ = hint;
        self.submit(wait, signal, work)
    }
    /// Executes recorded commands with `bindings` as the binding table. Called
    /// from within submitted work.
    fn execute_commands(&self, commands: &[Command], bindings: &[Binding]) -> Result<()>;
    /// For drivers and tests: downcast to the concrete type.
    fn as_any(&self) -> &dyn Any;
    /// The device's queue as its own API sees it (streams foreign code can
    /// order against, see [`crate::external`]); None (the default) for
    /// devices without such an API (the CPU drivers).
    fn native_queue(&self) -> Option<Arc<dyn crate::external::NativeQueue>> {
        None
    }

    /// Queue-ordered allocation (see the module docs); `this` is `self`.
    fn queue_alloca(
        &self,
        this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        params: &BufferParams,
        size: u64,
    ) -> Result<Buffer> {
        queue::host::alloca(this, wait, signal, params, size)
    }
    /// Queue-ordered release of `buffer`.
    fn queue_dealloca(
        &self,
        this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        buffer: Buffer,
    ) -> Result<()> {
        queue::host::dealloca(this, wait, signal, buffer)
    }
    /// Queue-ordered fill; the range is checked by the caller.
    #[allow(clippy::too_many_arguments)]
    fn queue_fill(
        &self,
        this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        target: Buffer,
        offset: u64,
        length: u64,
        pattern: Vec<u8>,
    ) -> Result<()> {
        queue::host::fill(this, wait, signal, target, offset, length, pattern)
    }
    /// Queue-ordered write of host bytes; the range is checked by the caller.
    fn queue_update(
        &self,
        this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        data: Vec<u8>,
        target: Buffer,
        offset: u64,
    ) -> Result<()> {
        queue::host::update(this, wait, signal, data, target, offset)
    }
    /// Queue-ordered copy; the ranges are checked by the caller.
    #[allow(clippy::too_many_arguments)]
    fn queue_copy(
        &self,
        this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        source: Buffer,
        source_offset: u64,
        target: Buffer,
        target_offset: u64,
        length: u64,
    ) -> Result<()> {
        queue::host::copy(
            this,
            wait,
            signal,
            source,
            source_offset,
            target,
            target_offset,
            length,
        )
    }
    /// Queue-ordered barrier: `signal` is reached after `wait`.
    fn queue_barrier(&self, this: &Arc<dyn Device>, wait: &Fence, signal: &Fence) -> Result<()> {
        queue::host::barrier(this, wait, signal)
    }
    /// Queue-ordered execution of a finalized command buffer.
    fn queue_execute(
        &self,
        this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        command_buffer: &CommandBuffer,
        bindings: BindingTable,
    ) -> Result<()> {
        queue::host::execute(this, wait, signal, command_buffer, bindings)
    }
    /// [`Device::queue_execute`] with a borrowed binding table, called by
    /// [`queue::execute_borrowed`] only on devices that run work inline
    /// ([`Device::runs_inline`]) and only once `wait` is reached: the work
    /// has finished when this returns, so nothing needs to own the table.
    /// The default copies the table and calls [`Device::queue_execute`]
    /// (devices that wrap another keep their own `queue_execute` in the
    /// path); the host path runs the commands on the borrowed table.
    fn queue_execute_borrowed(
        &self,
        this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        command_buffer: &CommandBuffer,
        bindings: &[Binding],
    ) -> Result<()> {
        self.queue_execute(
            this,
            wait,
            signal,
            command_buffer,
            bindings.iter().cloned().collect(),
        )
    }
    /// Starts work enqueued so far (a no-op where enqueued work starts by
    /// itself, as on the host path and on CUDA streams).
    fn queue_flush(&self) -> Result<()> {
        Ok(())
    }
    /// True when [`Device::submit`] always runs work inline, as
    /// [`run_inline`] does: queue operations then call it themselves and
    /// skip boxing their work. Such a device's queue operations have
    /// finished when they return, and its dispatches and transfers count
    /// their own device uses while they run, so `queue::execute` does not
    /// register the submission's buffers for it.
    fn runs_inline(&self) -> bool {
        false
    }
    /// Creates this device's participant of a collective group for the
    /// queues in `queue_affinity`. Defaults left in `params` (rank, count,
    /// identifier) are asked of `provider`; without one they are an error
    /// naming the missing value. Drivers without collectives keep this
    /// default, which answers `UNIMPLEMENTED`.
    fn create_channel(
        &self,
        queue_affinity: u64,
        params: ChannelParams,
        provider: Option<&Arc<dyn ChannelProvider>>,
    ) -> Result<ChannelRef> {
        let _ = (queue_affinity, params, provider);
        ferrite_base::bail!(
            Unimplemented,
            "device '{}' does not support collective channels",
            self.id()
        )
    }
}

/// Runs `work` after waiting for `wait` on the calling thread, then signals
/// or fails `signal`: the synchronous form of [`Device::submit`].
pub fn run_inline(wait: &Fence, signal: &Fence, work: impl FnOnce() -> Result<()>) -> Result<()> {
    let outcome = match wait.wait(ferrite_base::Timeout::INFINITE) {
        Ok(_) => work(),
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => signal.signal(),
        Err(e) => {
            signal.fail(e);
            Ok(())
        }
    }
}

/// The VM ref type `hal.device`.
#[derive(Clone)]
pub struct DeviceRef(pub Arc<dyn Device>);

impl RefObject for DeviceRef {
    fn type_name(&self) -> &'static str {
        "hal.device"
    }
}

impl std::fmt::Debug for DeviceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hal.device({})", self.0.id())
    }
}

/// The VM ref type `hal.allocator`.
#[derive(Clone)]
pub struct AllocatorRef(pub Arc<dyn Allocator>);

impl RefObject for AllocatorRef {
    fn type_name(&self) -> &'static str {
        "hal.allocator"
    }
}

/// Queue operations: argument checks, then the device's `queue_*` method.
pub mod queue {
    use super::*;

    /// Allocates a buffer usable by work ordered after `signal`.
    pub fn alloca(
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        params: &BufferParams,
        size: u64,
    ) -> Result<Buffer> {
        device.queue_alloca(device, wait, signal, params, size)
    }

    /// Releases `buffer` once `wait` is reached.
    pub fn dealloca(
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        buffer: Buffer,
    ) -> Result<()> {
        device.queue_dealloca(device, wait, signal, buffer)
    }

    /// Fills `target[offset..offset+length]` with `pattern`.
    pub fn fill(
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        target: Buffer,
        offset: u64,
        length: u64,
        pattern: Vec<u8>,
    ) -> Result<()> {
        target.resolve_range(offset, length)?;
        device.queue_fill(device, wait, signal, target, offset, length, pattern)
    }

    /// Writes `data` at `offset` of `target`.
    pub fn update(
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        data: Vec<u8>,
        target: Buffer,
        offset: u64,
    ) -> Result<()> {
        target.resolve_range(offset, data.len() as u64)?;
        device.queue_update(device, wait, signal, data, target, offset)
    }

    /// Copies `length` bytes between buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn copy(
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        source: Buffer,
        source_offset: u64,
        target: Buffer,
        target_offset: u64,
        length: u64,
    ) -> Result<()> {
        source.resolve_range(source_offset, length)?;
        target.resolve_range(target_offset, length)?;
        device.queue_copy(
            device,
            wait,
            signal,
            source,
            source_offset,
            target,
            target_offset,
            length,
        )
    }

    /// [`execute`] of a command buffer with a binding table the caller
    /// keeps: on a device that runs work inline, once `wait` is reached, the
    /// work runs on the table as it is (no copy of its buffers, whose
    /// reference counts are atomic); otherwise the table is copied and
    /// submitted as [`execute`] does.
    pub fn execute_borrowed(
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        command_buffer: &CommandBuffer,
        bindings: &[Binding],
    ) -> Result<()> {
        if device.runs_inline() && wait.query().unwrap_or(false) {
            // As in `execute`: the work runs to its end inside this call.
            return device.queue_execute_borrowed(device, wait, signal, command_buffer, bindings);
        }
        execute(
            device,
            wait,
            signal,
            Some(command_buffer),
            bindings.iter().cloned().collect::<BindingTable>(),
        )
    }

    /// Orders nothing but the fences: `signal` is reached after `wait`.
    pub fn barrier(device: &Arc<dyn Device>, wait: &Fence, signal: &Fence) -> Result<()> {
        device.queue_barrier(device, wait, signal)
    }

    /// Executes a finalized command buffer with an optional binding table
    /// (no command buffer: a barrier).
    pub fn execute(
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        command_buffer: Option<&CommandBuffer>,
        bindings: impl Into<BindingTable>,
    ) -> Result<()> {
        let Some(cb) = command_buffer else {
            return device.queue_barrier(device, wait, signal);
        };
        let bindings = bindings.into();
        if device.runs_inline() && wait.query().unwrap_or(false) {
            // Nothing to wait for: the work runs to its end inside this call
            // (`run_inline`), its dispatches and transfers counting their
            // own device uses while they run (a host mapping makes them
            // fail the signal fence). There is no later moment for host
            // access to race, and registering every buffer would only cost
            // each call. An inline submission that must first wait (on
            // another thread) registers, so the host is refused meanwhile.
            return device.queue_execute(device, wait, signal, cb, bindings);
        }
        // Every buffer the work reaches counts as in device use from now
        // until the signal fence is reached or failed, whatever the driver
        // (see `crate::inflight`).
        let uses = SubmissionUses::register(cb.finalized_commands()?, &bindings)?;
        if uses.is_empty() {
            return device.queue_execute(device, wait, signal, cb, bindings);
        }
        let mut timepoints = signal.timepoints();
        let private;
        let signal = if timepoints.is_empty() {
            // Nothing the caller could see says when the work ends: a
            // semaphore of our own does.
            let s = Semaphore::new(0);
            timepoints.push((s.clone(), 1));
            private = Fence::create_at(s, 1);
            &private
        } else {
            signal
        };
        device.queue_execute(device, wait, signal, cb, bindings)?;
        let uses = Arc::new(uses);
        for (semaphore, value) in timepoints {
            semaphore.hold_until(value, uses.clone());
        }
        Ok(())
    }

    /// The host path: every queue operation as host work through
    /// [`Device::submit`] (the default of the `queue_*` methods). As for
    /// those methods, ranges are checked by the caller (the entry points
    /// above); the buffer operations check them again when the work runs.
    pub mod host {
        use super::*;
        use ferrite_base::trace::Arg;

        /// Allocates a buffer whose contents are usable once `signal` is reached.
        /// Host memory is available at once; the returned buffer is usable by
        /// work ordered after `signal`.
        pub fn alloca(
            device: &Arc<dyn Device>,
            wait: &Fence,
            signal: &Fence,
            params: &BufferParams,
            size: u64,
        ) -> Result<Buffer> {
            let buffer = device.queue_allocate(params, size)?;
            if ferrite_base::trace::enabled() {
                ferrite_base::trace::instant(
                    "queue",
                    "alloca",
                    ferrite_base::trace::device_track(device.id()),
                    vec![
                        ("bytes", Arg::U64(size)),
                        ("allocation", Arg::U64(buffer.allocation_id())),
                    ],
                );
            }
            if device.runs_inline() {
                run_inline(wait, signal, || Ok(()))?;
            } else {
                device.submit_hinted(wait, signal, WorkHint::Bookkeeping, Box::new(|| Ok(())))?;
            }
            Ok(buffer)
        }

        /// Releases `buffer` once `wait` is reached.
        pub fn dealloca(
            device: &Arc<dyn Device>,
            wait: &Fence,
            signal: &Fence,
            buffer: Buffer,
        ) -> Result<()> {
            let work = traced(
                device,
                "dealloca",
                &[
                    ("bytes", buffer.byte_length()),
                    ("allocation", buffer.allocation_id()),
                ],
                move || {
                    drop(buffer);
                    Ok(())
                },
            );
            device.submit_hinted(wait, signal, WorkHint::Bookkeeping, work)
        }

        /// Fills `target[offset..offset+length]` with `pattern`.
        pub fn fill(
            device: &Arc<dyn Device>,
            wait: &Fence,
            signal: &Fence,
            target: Buffer,
            offset: u64,
            length: u64,
            pattern: Vec<u8>,
        ) -> Result<()> {
            let args = &[("bytes", length)];
            let work = traced(device, "fill", args, move || {
                target.device_fill(offset, length, &pattern)
            });
            device.submit(wait, signal, work)
        }

        /// Writes `data` at `offset` of `target`.
        pub fn update(
            device: &Arc<dyn Device>,
            wait: &Fence,
            signal: &Fence,
            data: Vec<u8>,
            target: Buffer,
            offset: u64,
        ) -> Result<()> {
            let args = &[("bytes", data.len() as u64)];
            let work = traced(device, "update", args, move || {
                target.device_write(offset, &data)
            });
            device.submit(wait, signal, work)
        }

        /// Copies `length` bytes between buffers.
        #[allow(clippy::too_many_arguments)]
        pub fn copy(
            device: &Arc<dyn Device>,
            wait: &Fence,
            signal: &Fence,
            source: Buffer,
            source_offset: u64,
            target: Buffer,
            target_offset: u64,
            length: u64,
        ) -> Result<()> {
            let args = &[("bytes", length)];
            let work = traced(device, "copy", args, move || {
                Buffer::device_copy(&source, source_offset, &target, target_offset, length)
            });
            device.submit(wait, signal, work)
        }

        /// Orders nothing but the fences: `signal` is reached after `wait`.
        pub fn barrier(device: &Arc<dyn Device>, wait: &Fence, signal: &Fence) -> Result<()> {
            let work = traced(device, "barrier", &[], || Ok(()));
            device.submit_hinted(wait, signal, WorkHint::Bookkeeping, work)
        }

        /// Executes a finalized command buffer with an optional binding table.
        pub fn execute(
            device: &Arc<dyn Device>,
            wait: &Fence,
            signal: &Fence,
            cb: &CommandBuffer,
            bindings: BindingTable,
        ) -> Result<()> {
            if device.runs_inline() {
                return execute_inline(device, wait, signal, cb, &bindings);
            }
            let commands = cb.commands()?;
            let d = device.clone();
            let args = &[(
                "command_buffer",
                crate::command_trace::describe(cb, device.id()),
            )];
            let work = traced(device, "execute", args, move || {
                d.execute_commands(&commands, &bindings)
            });
            let hint = WorkHint::Commands(cb.finalized_commands()?);
            device.submit_hinted(wait, signal, hint, work)
        }

        /// Runs a finalized command buffer inline (see [`run_inline`]) on a
        /// borrowed binding table: the inline half of [`execute`], and what
        /// inline devices' [`Device::queue_execute_borrowed`] calls.
        pub fn execute_inline(
            device: &Arc<dyn Device>,
            wait: &Fence,
            signal: &Fence,
            cb: &CommandBuffer,
            bindings: &[Binding],
        ) -> Result<()> {
            let commands = cb.finalized_commands()?;
            run_inline(wait, signal, || {
                if ferrite_base::trace::enabled() {
                    let id = crate::command_trace::describe(cb, device.id());
                    let args = &[("command_buffer", id)];
                    return traced(device, "execute", args, || {
                        device.execute_commands(commands, bindings)
                    })()
                    .map_err(|e| e.annotate(format!("on device '{}'", device.id())));
                }
                device
                    .execute_commands(commands, bindings)
                    .map_err(|e| e.annotate(format!("queue execute on device '{}'", device.id())))
            })
        }

        /// `work` as queue work; while a trace is recorded, a span named
        /// after the queue operation `op` on the device's track around it
        /// (its failure noted, `args` attached), and the thread noted as running `op`, so
        /// waiters its signals wake name it.
        pub(crate) fn traced<'a>(
            device: &Arc<dyn Device>,
            op: &'static str,
            args: &[(&'static str, u64)],
            work: impl FnOnce() -> Result<()> + Send + 'a,
        ) -> Box<dyn FnOnce() -> Result<()> + Send + 'a> {
            if !ferrite_base::trace::enabled() {
                // Every waiter on the failed semaphores sees the failure
                // with the queue operation it arose in (the driver adds
                // its device).
                return Box::new(move || work().map_err(|e| e.annotate(format!("queue {op}"))));
            }
            let track = ferrite_base::trace::device_track(device.id());
            let label = format!("{} queue {op}", device.id());
            let args = args.to_vec();
            Box::new(move || {
                // Running work is pending for the recording: stopping it
                // waits for this span. Work that begins once it is stopping
                // runs untraced.
                let Some(pending) = ferrite_base::trace::pending() else {
                    return work().map_err(|e| e.annotate(format!("queue {op}")));
                };
                let start = ferrite_base::trace::now_ns();
                let guard = ferrite_base::trace::set_doing(label);
                let outcome = work().map_err(|e| e.annotate(format!("queue {op}")));
                drop(guard);
                let mut args: Vec<(&'static str, Arg)> =
                    args.iter().map(|&(k, v)| (k, Arg::U64(v))).collect();
                if let Err(e) = &outcome {
                    args.push(("failed", Arg::Str(e.to_string())));
                }
                ferrite_base::trace::complete("queue", op, track, start, args);
                drop(pending);
                outcome
            })
        }
    }
}
