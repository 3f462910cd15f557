//! The HAL conformance suite (`ferrite-hal-cts`) on `cuda` (device 0),
//! with executables compiled for sm_80. Without a GPU each test prints
//! `SKIPPED <test>: no CUDA device (...)` and passes; with
//! `FERRITE_REQUIRE_GPU=1` (scripts/test-gpu.sh) a missing GPU fails it.
//! Where the compiler is absent (the GPU machine) the modules come from
//! `FERRITE_CTS_MODULES` (see `cts-modules`).

use ferrite_hal::device::Device;
use std::sync::Arc;

fn device(test: &str) -> Option<Arc<dyn Device>> {
    if !ferrite_hal_cuda::available() {
        let why = match ferrite_hal_cuda::ffi::api() {
            Err(e) => e.to_string(),
            Ok(_) => "the CUDA driver reports no GPU".to_string(),
        };
        if std::env::var("FERRITE_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("FERRITE_REQUIRE_GPU=1 but no CUDA device for {test}: {why}");
        }
        println!("SKIPPED {test}: no CUDA device ({why})");
        return None;
    }
    Some(ferrite_hal_cuda::CudaDevice::open(0).expect("opening CUDA device 0"))
}

ferrite_hal_cts::instantiate!(device, ferrite_hal_cts::Target::Cuda);
