//! The `hal` VM module and the VM <-> HAL glue (as upstream's
//! `modules/hal`): the one crate that knows both the VM and the HAL, so
//! that the HAL core and the drivers know nothing of the VM.
//!
//! - [`register_types`]: the HAL's ref types (`hal.buffer`, `hal.fence`,
//!   ...) in a VM type registry.
//! - [`create_hal_module`]: the 60 functions compiled programs import
//!   (`hal.buffer_view.create`, `hal.command_buffer.dispatch`,
//!   `hal.fence.await`, ...), with upstream's names, module version (0.7)
//!   and calling conventions.
//!
//! Functions are grouped by the object they act on: [`buffers`] (allocator,
//! buffer, buffer view), [`commands`] (command buffers, executables),
//! [`queues`] (devices and their queues, files, collective channels),
//! [`fences`]. Channels are created by the device
//! ([`ferrite_hal::device::Device::create_channel`]) with the module's
//! [`HalModuleOptions::channel_provider`] answering environment defaults.

#![deny(missing_docs)]

pub mod args;
mod buffers;
mod commands;
mod fences;
mod queues;
mod state;

/// The element-type rule `hal.buffer_view.assert` applies, for hosts that
/// check arguments before a call (the Python function invoker).
pub use buffers::element_types_compatible;

pub use state::{stderr_trace_sink, HalModuleOptions, TraceSink};

use ferrite_base::Result;
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::device::DeviceRef;
use ferrite_vm::native::{NativeModule, NativeModuleBuilder};
use state::ModuleState;
use std::sync::Arc;

/// The module version compiled programs require (`hal, version >= 7`).
pub const HAL_MODULE_VERSION: u32 = 7;

/// Builds the `hal` module over `devices` (what `hal.devices.get` returns).
pub fn create_hal_module(
    devices: Vec<DeviceRef>,
    options: HalModuleOptions,
) -> Result<Arc<NativeModule>> {
    let shared = Arc::new(ModuleState::new(devices, options));
    let b = NativeModuleBuilder::new("hal", HAL_MODULE_VERSION);
    let b = buffers::register(b, &shared)?;
    let b = commands::register(b, &shared)?;
    let b = queues::register(b, &shared)?;
    let b = fences::register(b, &shared)?;
    Ok(b.build())
}

/// Registers every ref type the `hal` module passes to programs.
pub fn register_types(registry: &ferrite_vm::types::TypeRegistry) {
    registry.register_type::<ferrite_hal::Buffer>("hal.buffer");
    registry.register_type::<BufferView>("hal.buffer_view");
    registry.register_type::<ferrite_hal::Fence>("hal.fence");
    registry.register_type::<ferrite_hal::Semaphore>("hal.semaphore");
    registry.register_type::<DeviceRef>("hal.device");
    registry.register_type::<ferrite_hal::device::AllocatorRef>("hal.allocator");
    registry.register_type::<ferrite_hal::command_buffer::CommandBuffer>("hal.command_buffer");
    registry.register_type::<ferrite_hal::executable::ExecutableRef>("hal.executable");
    registry.register_type::<queues::File>("hal.file");
    registry.register_type::<ferrite_hal::channel::ChannelRef>("hal.channel");
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_vm::{Module, Ref};

    #[test]
    fn registers_the_hal_ref_types() {
        let r = ferrite_vm::types::TypeRegistry::default();
        register_types(&r);
        for n in [
            "hal.buffer",
            "hal.buffer_view",
            "hal.fence",
            "hal.semaphore",
            "hal.device",
            "hal.allocator",
            "hal.command_buffer",
            "hal.executable",
            "hal.file",
            "hal.channel",
        ] {
            assert!(r.lookup(n).is_some(), "{n}");
        }
        let f = Ref::new(ferrite_hal::Fence::new());
        assert!(r.lookup("hal.fence").unwrap().matches(&f));
        assert!(!r.lookup("hal.buffer").unwrap().matches(&f));
        let s = Ref::from_arc(ferrite_hal::Semaphore::new(0));
        assert_eq!(s.type_name(), "hal.semaphore");
    }

    #[test]
    fn a_view_over_a_whole_buffer_hands_back_the_same_object() {
        use ferrite_hal::allocator::{Allocator, BufferParams};
        use ferrite_hal::{BufferUsage, ElementType, EncodingType, MemoryType};
        let allocator = ferrite_hal::HeapAllocator::new();
        let params = BufferParams::new(MemoryType::HOST_LOCAL, BufferUsage::DEFAULT);
        let buffer = allocator.allocate(&params, 16).unwrap();
        let shared = Arc::new(buffer);
        let view = BufferView::over_shared(
            shared.clone(),
            &[4],
            ElementType::FLOAT_32,
            EncodingType::DENSE_ROW_MAJOR,
        )
        .unwrap();
        assert!(Arc::ptr_eq(&view.shared_buffer(), &shared));
        let r = Ref::from_arc(view.shared_buffer());
        assert!(r.ptr_eq(&Ref::from_arc(shared)));
        assert!(r.into_arc::<ferrite_hal::Fence>().is_none());
    }

    #[test]
    fn exports_match_upstream_names_and_signatures() {
        let m = create_hal_module(Vec::new(), HalModuleOptions::default()).unwrap();
        // (name, cconv) of all 60 exports of the pinned runtime's hal module.
        let expected: &[(&str, &str)] = &[
            ("allocator.allocate", "0rIiiI_r"),
            ("allocator.import", "0riIiirII_r"),
            ("allocator.select", "0iiICrID_rI"),
            ("buffer.allocation.discard", "0r_i"),
            ("buffer.allocation.is_terminal", "0r_i"),
            ("buffer.allocation.preserve", "0r_v"),
            ("buffer.assert", "0rrrIii_v"),
            ("buffer.length", "0r_I"),
            ("buffer.load", "0rIi_i"),
            ("buffer.store", "0irIi_v"),
            ("buffer.subspan", "0rII_r"),
            ("buffer_view.assert", "0rriiCID_v"),
            ("buffer_view.buffer", "0r_r"),
            ("buffer_view.create", "0rIIiiCID_r"),
            ("buffer_view.dim", "0ri_I"),
            ("buffer_view.element_type", "0r_i"),
            ("buffer_view.encoding_type", "0r_i"),
            ("buffer_view.rank", "0r_i"),
            ("buffer_view.trace", "0rCrD_v"),
            ("channel.create", "0rIIrrii_r"),
            ("channel.rank_and_count", "0r_ii"),
            ("channel.split", "0riiI_r"),
            ("command_buffer.advise_buffer", "0rrIIIi_v"),
            ("command_buffer.begin_debug_group", "0rr_v"),
            ("command_buffer.collective", "0rriiiirrIIIII_v"),
            ("command_buffer.copy_buffer", "0riirIrIII_v"),
            ("command_buffer.create", "0riiIi_r"),
            ("command_buffer.dispatch", "0rrIiiiICiDCiirIID_v"),
            ("command_buffer.dispatch.indirect", "0rrIirIICiDCiirIID_v"),
            ("command_buffer.end_debug_group", "0r_v"),
            ("command_buffer.execution_barrier", "0riiI_v"),
            ("command_buffer.fill_buffer", "0rrIIiIiI_v"),
            ("command_buffer.finalize", "0r_v"),
            ("command_buffer.flush_buffer", "0rirII_v"),
            ("command_buffer.invalidate_buffer", "0rirII_v"),
            ("command_buffer.update_buffer", "0rrIrIIiI_v"),
            ("device.allocator", "0r_r"),
            ("device.query.i64", "0rrr_iI"),
            ("device.queue.alloca", "0rIrrIiiII_r"),
            ("device.queue.barrier", "0rIrrI_v"),
            ("device.queue.copy", "0rIrrrIrIII_v"),
            ("device.queue.dealloca", "0rIrrrI_v"),
            ("device.queue.execute", "0rIrrrI_v"),
            ("device.queue.execute.indirect", "0rIrrrICrIID_v"),
            ("device.queue.fill", "0rIrrrIIIiI_v"),
            ("device.queue.flush", "0rI_v"),
            ("device.queue.read", "0rIrrrIrIII_v"),
            ("device.queue.update", "0rIrrrIrIII_v"),
            ("device.queue.write", "0rIrrrIrIII_v"),
            ("devices.count", "0v_i"),
            ("devices.get", "0i_r"),
            ("ex.file.from_memory", "0rIirIIi_r"),
            ("executable.create", "0rIrrr_r"),
            ("executable.lookup.function", "0rr_I"),
            ("fence.await", "0iICrD_i"),
            ("fence.create", "0rI_r"),
            ("fence.fail", "0ri_v"),
            ("fence.join", "0ICrD_r"),
            ("fence.query", "0r_i"),
            ("fence.signal", "0r_v"),
        ];
        let mut got: Vec<(String, String)> = m
            .exports()
            .iter()
            .map(|e| (e.name.clone(), e.signature.cconv.clone()))
            .collect();
        got.sort();
        let want: Vec<(String, String)> = expected
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(want.len(), 60);
        assert_eq!(m.version(), 7);
    }
}
