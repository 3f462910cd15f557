//! The CUDA driver API, loaded from `libcuda` at run time.
//!
//! Only the entry points this driver uses are resolved, once per process
//! ([`api`]); a machine without the NVIDIA driver gets a clear error
//! ("no CUDA driver found") instead of a link failure, so the crate builds
//! and its tests run (skipping) everywhere.

#![allow(non_camel_case_types, non_snake_case)]

use ferrite_base::{status, Result, Status, StatusCode};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

/// `CUresult`.
pub type CUresult = c_int;
/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUdeviceptr`.
pub type CUdeviceptr = u64;
/// `CUcontext`.
pub type CUcontext = *mut c_void;
/// `CUstream`.
pub type CUstream = *mut c_void;
/// `CUmodule`.
pub type CUmodule = *mut c_void;
/// `CUfunction`.
pub type CUfunction = *mut c_void;
/// `CUmemoryPool`.
pub type CUmemoryPool = *mut c_void;
/// `CUevent`.
pub type CUevent = *mut c_void;
/// `CUgraph`.
pub type CUgraph = *mut c_void;
/// `CUgraphExec`.
pub type CUgraphExec = *mut c_void;
/// `CUgraphNode`.
pub type CUgraphNode = *mut c_void;

/// `CUDA_KERNEL_NODE_PARAMS` (the v1 layout `cuGraphAddKernelNode` and
/// `cuGraphExecKernelNodeSetParams` take); fields as in the C struct.
#[repr(C)]
#[allow(missing_docs)]
pub struct CUDA_KERNEL_NODE_PARAMS {
    pub func: CUfunction,
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `CUDA_MEMSET_NODE_PARAMS`; fields as in the C struct.
#[repr(C)]
#[allow(missing_docs)]
pub struct CUDA_MEMSET_NODE_PARAMS {
    pub dst: CUdeviceptr,
    pub pitch: usize,
    pub value: c_uint,
    pub element_size: c_uint,
    pub width: usize,
    pub height: usize,
}
/// `CUstreamCallback`.
pub type CUstreamCallback = unsafe extern "C" fn(CUstream, CUresult, *mut c_void);

/// `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING`: a host waiting on
/// the event sleeps instead of spinning; no timestamps.
pub const CU_EVENT_BLOCKING_SYNC_NO_TIMING: c_uint = 0x1 | 0x2;
/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CUresult = 0;
/// Device memory exhausted.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `cuEventQuery`: the event's work has not completed yet.
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
/// `CU_STREAM_NON_BLOCKING`.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`.
pub const CU_MEMHOSTALLOC_PORTABLE_DEVICEMAP: c_uint = 0x1 | 0x2;
/// `CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP`.
pub const CU_MEMHOSTREGISTER_PORTABLE_DEVICEMAP: c_uint = 0x1 | 0x2;
/// `CU_MEMHOSTREGISTER_READ_ONLY`.
pub const CU_MEMHOSTREGISTER_READ_ONLY: c_uint = 0x8;
/// `CU_STREAM_WAIT_VALUE_GEQ`.
pub const CU_STREAM_WAIT_VALUE_GEQ: c_uint = 0x0;
/// `CU_STREAM_WRITE_VALUE_DEFAULT`.
pub const CU_STREAM_WRITE_VALUE_DEFAULT: c_uint = 0x0;
/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
/// `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1` (legacy) is 92; the
/// 64-bit wait/write ops are reported by attribute 93 (`..._WAIT_VALUE_NOR`
/// is 96); drivers since CUDA 12 enable them unconditionally.
pub const CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: c_int = 93;
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
/// `CU_JIT_ERROR_LOG_BUFFER`.
pub const CU_JIT_ERROR_LOG_BUFFER: c_int = 5;
/// `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`.
pub const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_int = 6;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_EVENT_DEFAULT`: an event that records timing.
pub const CU_EVENT_DEFAULT: c_uint = 0;
/// `CU_STREAM_LEGACY`: the handle of the legacy default stream.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: the handle of the per-thread default stream.
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CU_POINTER_ATTRIBUTE_CONTEXT` (a `CUcontext`).
pub const CU_POINTER_ATTRIBUTE_CONTEXT: c_int = 1;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (an `unsigned int`, `CUmemorytype`).
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` (an `int`).
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` (a `CUdeviceptr`).
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE` (a `size_t`).
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_int = 12;
/// `CU_MEMORYTYPE_HOST`.
pub const CU_MEMORYTYPE_HOST: c_uint = 1;
/// `CU_MEMORYTYPE_DEVICE`.
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
/// `CU_MEMORYTYPE_UNIFIED` (managed memory).
pub const CU_MEMORYTYPE_UNIFIED: c_uint = 4;

macro_rules! cuda_api {
    ($($name:ident : fn($($arg:ty),*);)*) => {
        /// The resolved entry points.
        pub struct Api {
            $(
                #[doc = concat!("`", stringify!($name), "`.")]
                pub $name: unsafe extern "C" fn($($arg),*) -> CUresult,
            )*
            _lib: libloading::Library,
        }

        impl Api {
            fn load(lib: libloading::Library) -> std::result::Result<Api, String> {
                // SAFETY: each symbol is looked up under the name of the
                // driver API function whose C signature the field's type
                // states (cuda.h); the library stays loaded while `Api`
                // lives (it owns it).
                unsafe {
                    Ok(Api {
                        $(
                            $name: *lib
                                .get::<unsafe extern "C" fn($($arg),*) -> CUresult>(
                                    concat!(cuda_api!(@sym $name), "\0").as_bytes(),
                                )
                                .map_err(|e| format!("{}: {e}", stringify!($name)))?,
                        )*
                        _lib: lib,
                    })
                }
            }
        }
    };
    (@sym $name:ident) => { stringify!($name) };
}

cuda_api! {
    cuInit: fn(c_uint);
    cuDriverGetVersion: fn(*mut c_int);
    cuDeviceGetCount: fn(*mut c_int);
    cuDeviceGet: fn(*mut CUdevice, c_int);
    cuDeviceGetName: fn(*mut c_char, c_int, CUdevice);
    cuDeviceGetUuid_v2: fn(*mut [u8; 16], CUdevice);
    cuDeviceGetAttribute: fn(*mut c_int, c_int, CUdevice);
    cuDeviceTotalMem_v2: fn(*mut usize, CUdevice);
    cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice);
    cuDevicePrimaryCtxRelease_v2: fn(CUdevice);
    cuDeviceGetDefaultMemPool: fn(*mut CUmemoryPool, CUdevice);
    cuMemPoolSetAttribute: fn(CUmemoryPool, c_int, *mut c_void);
    cuCtxSetCurrent: fn(CUcontext);
    cuCtxGetCurrent: fn(*mut CUcontext);
    cuStreamCreate: fn(*mut CUstream, c_uint);
    cuStreamDestroy_v2: fn(CUstream);
    cuStreamSynchronize: fn(CUstream);
    cuStreamQuery: fn(CUstream);
    cuStreamAddCallback: fn(CUstream, CUstreamCallback, *mut c_void, c_uint);
    cuEventCreate: fn(*mut CUevent, c_uint);
    cuEventRecord: fn(CUevent, CUstream);
    cuEventSynchronize: fn(CUevent);
    cuEventQuery: fn(CUevent);
    cuEventDestroy_v2: fn(CUevent);
    cuEventElapsedTime: fn(*mut f32, CUevent, CUevent);
    cuStreamWaitEvent: fn(CUstream, CUevent, c_uint);
    cuPointerGetAttribute: fn(*mut c_void, c_int, CUdeviceptr);
    cuStreamWaitValue64_v2: fn(CUstream, CUdeviceptr, u64, c_uint);
    cuStreamWriteValue64_v2: fn(CUstream, CUdeviceptr, u64, c_uint);
    cuStreamBeginCapture_v2: fn(CUstream, c_int);
    cuStreamEndCapture: fn(CUstream, *mut CUgraph);
    cuGraphInstantiateWithFlags: fn(*mut CUgraphExec, CUgraph, u64);
    cuGraphCreate: fn(*mut CUgraph, c_uint);
    cuGraphAddKernelNode: fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *const CUDA_KERNEL_NODE_PARAMS);
    cuGraphAddMemsetNode: fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *const CUDA_MEMSET_NODE_PARAMS, CUcontext);
    cuGraphAddEmptyNode: fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize);
    cuGraphExecKernelNodeSetParams: fn(CUgraphExec, CUgraphNode, *const CUDA_KERNEL_NODE_PARAMS);
    cuGraphExecMemsetNodeSetParams: fn(CUgraphExec, CUgraphNode, *const CUDA_MEMSET_NODE_PARAMS, CUcontext);
    cuGraphLaunch: fn(CUgraphExec, CUstream);
    cuGraphExecDestroy: fn(CUgraphExec);
    cuGraphDestroy: fn(CUgraph);
    cuMemAlloc_v2: fn(*mut CUdeviceptr, usize);
    cuMemAllocAsync: fn(*mut CUdeviceptr, usize, CUstream);
    cuMemFreeAsync: fn(CUdeviceptr, CUstream);
    cuMemHostAlloc: fn(*mut *mut c_void, usize, c_uint);
    cuMemFreeHost: fn(*mut c_void);
    cuMemHostGetDevicePointer_v2: fn(*mut CUdeviceptr, *mut c_void, c_uint);
    cuMemHostRegister_v2: fn(*mut c_void, usize, c_uint);
    cuMemHostUnregister: fn(*mut c_void);
    cuMemcpyHtoD_v2: fn(CUdeviceptr, *const c_void, usize);
    cuMemcpyDtoH_v2: fn(*mut c_void, CUdeviceptr, usize);
    cuMemcpyAsync: fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemcpyHtoDAsync_v2: fn(CUdeviceptr, *const c_void, usize, CUstream);
    cuMemsetD8Async: fn(CUdeviceptr, u8, usize, CUstream);
    cuMemsetD16Async: fn(CUdeviceptr, u16, usize, CUstream);
    cuMemsetD32Async: fn(CUdeviceptr, c_uint, usize, CUstream);
    cuModuleLoadDataEx: fn(*mut CUmodule, *const c_void, c_uint, *mut c_int, *mut *mut c_void);
    cuModuleUnload: fn(CUmodule);
    cuModuleGetFunction: fn(*mut CUfunction, CUmodule, *const c_char);
    cuFuncSetAttribute: fn(CUfunction, c_int, c_int);
    cuLaunchKernel: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
}

/// The library names tried in order (`FERRITE_CUDA_LIBRARY` first).
fn candidates() -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(p) = std::env::var("FERRITE_CUDA_LIBRARY") {
        names.push(p);
    }
    names.extend(["libcuda.so.1".to_string(), "libcuda.so".to_string()]);
    names
}

static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();

/// The driver API, loaded and initialized (`cuInit`) on first use; an
/// UNAVAILABLE "no CUDA driver found" error when libcuda is missing or
/// fails to initialize (no GPU), with the reason.
pub fn api() -> Result<&'static Api> {
    let loaded = API.get_or_init(|| {
        let mut tried = Vec::new();
        for name in candidates() {
            // SAFETY: loading libcuda runs its initializers, which have no
            // preconditions on the calling process.
            match unsafe { libloading::Library::new(&name) } {
                Ok(lib) => {
                    let api = Api::load(lib).map_err(|e| {
                        format!("{name} lacks a driver API entry point ({e}); the NVIDIA driver is too old")
                    })?;
                    // SAFETY: cuInit takes flags 0 and may be called from
                    // any thread, any number of times.
                    let r = unsafe { (api.cuInit)(0) };
                    if r != CUDA_SUCCESS {
                        return Err(format!("cuInit failed: {}", error_name(r)));
                    }
                    return Ok(api);
                }
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(tried.join("; "))
    });
    loaded.as_ref().map_err(|why| {
        status!(
            Unavailable,
            "no CUDA driver found ({why}); set FERRITE_CUDA_LIBRARY to libcuda's path if it is installed elsewhere"
        )
    })
}

/// The CUDA error code's name and meaning (a fixed table: this is called
/// from stream callbacks, where no driver API call is allowed).
pub fn error_name(r: CUresult) -> String {
    let (name, text) = match r {
        1 => ("CUDA_ERROR_INVALID_VALUE", "invalid argument"),
        2 => ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
        3 => ("CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
        4 => ("CUDA_ERROR_DEINITIALIZED", "driver shutting down"),
        100 => ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
        101 => ("CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
        200 => ("CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"),
        201 => ("CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
        209 => (
            "CUDA_ERROR_NO_BINARY_FOR_GPU",
            "no kernel image is available for execution on the device",
        ),
        218 => ("CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"),
        222 => (
            "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
            "the provided PTX was compiled with an unsupported toolchain",
        ),
        400 => ("CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
        500 => ("CUDA_ERROR_NOT_FOUND", "named symbol not found"),
        600 => ("CUDA_ERROR_NOT_READY", "device not ready"),
        700 => (
            "CUDA_ERROR_ILLEGAL_ADDRESS",
            "an illegal memory access was encountered",
        ),
        701 => (
            "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
            "too many resources requested for launch",
        ),
        702 => (
            "CUDA_ERROR_LAUNCH_TIMEOUT",
            "the launch timed out and was terminated",
        ),
        710 => ("CUDA_ERROR_ASSERT", "device-side assert triggered"),
        712 => (
            "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
            "part or all of the requested memory range is already mapped",
        ),
        714 => ("CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"),
        715 => (
            "CUDA_ERROR_ILLEGAL_INSTRUCTION",
            "an illegal instruction was encountered",
        ),
        716 => ("CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"),
        719 => ("CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
        801 => ("CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
        900 => (
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            "operation not permitted when stream is capturing",
        ),
        999 => ("CUDA_ERROR_UNKNOWN", "unknown error"),
        _ => ("CUDA_ERROR", "unrecognized error code"),
    };
    format!("{name} ({r}): {text}")
}

/// The HAL status for a failed call: device faults are INTERNAL (the device
/// is lost), out of memory RESOURCE_EXHAUSTED, bad arguments
/// INVALID_ARGUMENT.
pub fn to_status(r: CUresult, what: &str) -> Status {
    let code = match r {
        2 => StatusCode::ResourceExhausted,
        1 | 400 => StatusCode::InvalidArgument,
        500 => StatusCode::NotFound,
        100 | 3 | 4 => StatusCode::Unavailable,
        _ => StatusCode::Internal,
    };
    Status::new(code, format!("{what}: {}", error_name(r)))
}

/// `Ok` for CUDA_SUCCESS, else the error naming `what`.
#[inline]
pub fn check(r: CUresult, what: &str) -> Result<()> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(to_status(r, what))
    }
}
