//! Ferrite's HAL conformance suite (CTS): every test is written once
//! against a [`Harness`] (an `Arc<dyn Device>` and the executable target it
//! loads) and every driver instantiates all of them with
//! [`instantiate!`]: `local-sync` and `local-task` in
//! `ferrite-hal-cpu/tests/cts_*.rs`, `cuda` in
//! `ferrite-hal-cuda/tests/cts.rs`. A test-tooling crate: a
//! dev-dependency of driver tests, never a runtime dependency.
//!
//! Covered ([`tests`]): buffers (allocation, subspans, ranges,
//! read/write/fill/copy, mappings); the mapping rules (host access refused
//! while submitted device work may write a buffer, device work refused
//! while the host maps it); semaphores and failure propagation (a failed
//! semaphore stays failed and every waiter, present and future, sees it);
//! command buffers (recorded once, replayed with different binding tables,
//! fills and copies after dispatches); queue ordering (waits, signals,
//! chains, deadlines, many submissions in flight); external buffers
//! (host and device allocations imported in place, released once after
//! their last use); dispatches of real
//! executables compiled from `tests/hal/*.mlir` by the pinned compiler
//! for the driver's target.
//!
//! Executables: compiled at test time into `target/tmp/ferrite-hal-cts/`,
//! or, where `FERRITE_CTS_MODULES` names a folder (a machine without the
//! compiler, such as the GPU machine), read from
//! `<folder>/<name>.<target>.vmfb` with the dispatch's workgroup count in
//! `<name>.<target>.workgroups` (written by `cts-modules <folder>`).

mod harness;
pub mod tests;

pub use harness::{
    compile_into, executable, module_path, static_workgroup_count, Exe, Harness, Target, MODULES,
};

/// Instantiates every CTS test as a `#[test]` of the calling test crate:
/// `$device` is a `fn(&str) -> Option<Arc<dyn Device>>` given the test's
/// name (None: it printed `SKIPPED <test>: ...`, or panicked where skips
/// are forbidden), `$target` the [`Target`].
#[macro_export]
macro_rules! instantiate {
    ($device:path, $target:expr) => {
        $crate::instantiate!(@each $device, $target;
            allocation_and_host_access,
            queue_chain_ordered_by_fences,
            queue_alloca_dealloca,
            command_buffer_direct_transfers,
            command_buffer_binding_tables,
            command_buffer_misuse_errors,
            dispatch_executable_binding_table,
            dispatch_executable_direct_bindings,
            host_access_refused_while_kernel_in_flight,
            device_work_refused_while_host_maps,
            failed_semaphore_propagates_two_levels,
            failed_work_propagates_to_dependents,
            fence_wait_deadline,
            queue_work_pending_past_deadline,
            many_dispatches_in_flight,
            external_host_allocation_import,
            external_device_allocation_import,
        );
    };
    (@each $device:path, $target:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if let Some(device) = $device(stringify!($name)) {
                    $crate::tests::$name(&$crate::Harness::new(device, $target));
                }
            }
        )*
    };
}
