//! What the `hal` module's functions share: the options it was created
//! with and its devices ([`ModuleState`]). A file of its own so that the
//! function groups (`buffers`, `commands`, `queues`, `fences`) name it
//! without naming the crate root that registers them.

use ferrite_base::Result;
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::device::DeviceRef;
use ferrite_vm::Ref;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// Receives `hal.buffer_view.trace` calls (upstream's debug sink).
pub type TraceSink = dyn Fn(&str, &[BufferView]) -> Result<()> + Send + Sync;

/// A trace sink that prints to stderr in upstream's stdio format: a
/// `=== key ===` line, each buffer view in full (`4xf32=1 2 3 4`) on its
/// own line, then an empty line. What `create_hal_module` without a debug
/// sink uses, as upstream's Python bindings do.
pub fn stderr_trace_sink() -> Arc<TraceSink> {
    Arc::new(|key: &str, views: &[BufferView]| {
        use std::io::Write;
        let mut out = format!("=== {key} ===\n");
        for v in views {
            out.push_str(&v.format(None)?);
            out.push('\n');
        }
        out.push('\n');
        // One write per trace keeps concurrent traces from interleaving;
        // a closed stderr is not the program's failure.
        let _ = std::io::stderr().lock().write_all(out.as_bytes());
        Ok(())
    })
}

/// How the module is created.
#[derive(Clone, Default)]
pub struct HalModuleOptions {
    /// `fence.await` blocks the calling thread instead of yielding the
    /// invocation (upstream's `IREE_HAL_MODULE_FLAG_SYNCHRONOUS`).
    pub synchronous: bool,
    /// Where `hal.buffer_view.trace` goes; ignored when None.
    pub trace_sink: Option<Arc<TraceSink>>,
    /// Answers the rank, count and group identifier that `hal.channel.create`
    /// leaves to the environment; without one such channels are an error.
    pub channel_provider: Option<Arc<dyn ferrite_hal::channel::ChannelProvider>>,
}

/// What every function of the `hal` module reads: its devices, options and
/// their allocator refs (one `Arc` shared by all registered closures).
pub(crate) struct ModuleState {
    pub devices: Vec<DeviceRef>,
    pub options: HalModuleOptions,
    /// `hal.allocator` refs of `devices`, in the same order: programs ask
    /// for a device's allocator on every call.
    allocator_refs: Vec<Ref>,
    /// The command count of the command buffer finalized last (at most
    /// [`COMMAND_RESERVE_MAX`]): a new command buffer reserves that much,
    /// as programs record the same command buffers call after call.
    pub command_hint: AtomicUsize,
}

/// The most commands a new command buffer reserves from the hint.
pub(crate) const COMMAND_RESERVE_MAX: usize = 4096;

impl ModuleState {
    pub(crate) fn new(devices: Vec<DeviceRef>, options: HalModuleOptions) -> ModuleState {
        let allocator_refs = devices
            .iter()
            .map(|d| Ref::new(ferrite_hal::device::AllocatorRef(d.0.allocator())))
            .collect();
        ModuleState {
            devices,
            options,
            allocator_refs,
            command_hint: AtomicUsize::new(0),
        }
    }

    /// The `hal.allocator` ref of `device` (shared for the module's own
    /// devices, fresh for others).
    pub fn allocator_ref(&self, device: &DeviceRef) -> Ref {
        match self
            .devices
            .iter()
            .position(|d| Arc::ptr_eq(&d.0, &device.0))
        {
            Some(i) => self.allocator_refs[i].clone(),
            None => Ref::new(ferrite_hal::device::AllocatorRef(device.0.allocator())),
        }
    }
}
