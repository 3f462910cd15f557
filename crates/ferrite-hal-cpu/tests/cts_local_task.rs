//! The HAL conformance suite (`ferrite-hal-cts`) on `local-task`.

use ferrite_hal::device::Device;
use std::sync::Arc;

fn device(_test: &str) -> Option<Arc<dyn Device>> {
    Some(ferrite_hal_cpu::CpuDevice::local_task(2).expect("local-task device"))
}

ferrite_hal_cts::instantiate!(device, ferrite_hal_cts::Target::Cpu);
