//! Dispatch-level differential runs: `ferrite run-module --device=A
//! --compare_device=B` runs the function on each device in turn, each
//! behind a [`trace::TraceDevice`] that executes every command of every
//! command buffer alone, waits for it, and records what each dispatch
//! wrote into its bindings; [`compare`] then matches the two traces
//! dispatch by dispatch (export name and occurrence) and reports the first
//! dispatch whose output differs beyond the threshold.
//!
//! The two runs may load different modules (`--compare_module`: e.g. the
//! program compiled for cuda and for the CPU); dispatches are matched by
//! export name, which the compiler gives before target code generation,
//! so the same program compiled for two targets has the same names.
//! Diagnostic only: everything runs serialized, with two readbacks of
//! every binding around every dispatch.

pub mod compare;
pub mod run;
pub mod trace;

use ferrite_hal::device::DeviceRef;
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    static RECORDER: RefCell<Option<Arc<trace::Recorder>>> = const { RefCell::new(None) };
}

/// Devices created while `recorder` is set (on this thread) are wrapped in
/// a [`trace::TraceDevice`] recording into it; `None` stops wrapping.
pub fn set_recorder(recorder: Option<Arc<trace::Recorder>>) {
    RECORDER.with(|r| *r.borrow_mut() = recorder);
}

/// `devices`, each wrapped in a recording device when a recorder is set.
pub fn wrap_devices(devices: Vec<DeviceRef>) -> Vec<DeviceRef> {
    let Some(rec) = RECORDER.with(|r| r.borrow().clone()) else {
        return devices;
    };
    devices
        .into_iter()
        .map(|d| DeviceRef(Arc::new(trace::TraceDevice::new(d.0, rec.clone()))))
        .collect()
}
