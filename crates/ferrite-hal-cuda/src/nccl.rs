//! NCCL, loaded at run time as libcuda is.
//!
//! The library is searched, in order: the path in `FERRITE_NCCL_LIBRARY`;
//! `libnccl.so.2` and `libnccl.so` on the dynamic loader's path
//! (`LD_LIBRARY_PATH`, the system's directories); and the copy a Python
//! virtual environment holds (`$VIRTUAL_ENV/lib/python3.*/site-packages/
//! nvidia/nccl/lib/libnccl.so.2`, where PyTorch's wheels put it, or
//! `nvidia/cu*/lib`). A machine
//! without NCCL gets an UNAVAILABLE error listing what was searched; nothing
//! else of the driver needs NCCL.
//!
//! NCCL 2.10 or newer is required (`ncclAvg` and `ncclBfloat16` appeared
//! then); `ncclCommSplit` (2.18) and `ncclCommFinalize` (2.14) are used
//! when present.

#![allow(non_camel_case_types, non_snake_case)]

use ferrite_base::{status, Result, Status, StatusCode};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
/// `ncclComm_t`.
pub type ncclComm_t = *mut c_void;
/// `ncclDataType_t`.
pub type ncclDataType_t = c_int;
/// `ncclRedOp_t`.
pub type ncclRedOp_t = c_int;
/// `cudaStream_t` (the same handle as a driver API `CUstream`).
pub type cudaStream_t = *mut c_void;

/// `ncclSuccess`.
pub const NCCL_SUCCESS: ncclResult_t = 0;
/// `ncclInProgress` (a non-blocking call still running).
pub const NCCL_IN_PROGRESS: ncclResult_t = 7;
/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// Bytes of `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// The identifier's bytes.
    pub internal: [u8; UNIQUE_ID_BYTES],
}

/// NCCL data types (`nccl.h`).
pub mod dtype {
    use super::ncclDataType_t;
    /// `ncclInt8`.
    pub const INT8: ncclDataType_t = 0;
    /// `ncclUint8`.
    pub const UINT8: ncclDataType_t = 1;
    /// `ncclInt32`.
    pub const INT32: ncclDataType_t = 2;
    /// `ncclUint32`.
    pub const UINT32: ncclDataType_t = 3;
    /// `ncclInt64`.
    pub const INT64: ncclDataType_t = 4;
    /// `ncclUint64`.
    pub const UINT64: ncclDataType_t = 5;
    /// `ncclFloat16`.
    pub const FLOAT16: ncclDataType_t = 6;
    /// `ncclFloat32`.
    pub const FLOAT32: ncclDataType_t = 7;
    /// `ncclFloat64`.
    pub const FLOAT64: ncclDataType_t = 8;
    /// `ncclBfloat16` (2.10+).
    pub const BFLOAT16: ncclDataType_t = 9;
}

/// NCCL reduction operators (`nccl.h`).
pub mod redop {
    use super::ncclRedOp_t;
    /// `ncclSum`.
    pub const SUM: ncclRedOp_t = 0;
    /// `ncclProd`.
    pub const PROD: ncclRedOp_t = 1;
    /// `ncclMax`.
    pub const MAX: ncclRedOp_t = 2;
    /// `ncclMin`.
    pub const MIN: ncclRedOp_t = 3;
    /// `ncclAvg` (2.10+).
    pub const AVG: ncclRedOp_t = 4;
}

type R = ncclResult_t;

/// The resolved entry points.
pub struct Nccl {
    /// The library's version code (`ncclGetVersion`, e.g. 22703 for 2.27.3).
    pub version: c_int,
    /// Where it was loaded from.
    pub path: String,
    /// `ncclGetErrorString`.
    pub ncclGetErrorString: unsafe extern "C" fn(R) -> *const c_char,
    /// `ncclGetLastError` (2.13+; absent in older libraries).
    pub ncclGetLastError: Option<unsafe extern "C" fn(ncclComm_t) -> *const c_char>,
    /// `ncclGetUniqueId`.
    pub ncclGetUniqueId: unsafe extern "C" fn(*mut ncclUniqueId) -> R,
    /// `ncclCommInitRank`.
    pub ncclCommInitRank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> R,
    /// `ncclCommSplit` (2.18+); the config may be null (inherit the parent's).
    pub ncclCommSplit:
        Option<unsafe extern "C" fn(ncclComm_t, c_int, c_int, *mut ncclComm_t, *mut c_void) -> R>,
    /// `ncclCommFinalize` (2.14+).
    pub ncclCommFinalize: Option<unsafe extern "C" fn(ncclComm_t) -> R>,
    /// `ncclCommDestroy`.
    pub ncclCommDestroy: unsafe extern "C" fn(ncclComm_t) -> R,
    /// `ncclCommAbort`.
    pub ncclCommAbort: unsafe extern "C" fn(ncclComm_t) -> R,
    /// `ncclCommGetAsyncError`.
    pub ncclCommGetAsyncError: unsafe extern "C" fn(ncclComm_t, *mut R) -> R,
    /// `ncclCommCount`.
    pub ncclCommCount: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> R,
    /// `ncclCommUserRank`.
    pub ncclCommUserRank: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> R,
    /// `ncclAllReduce`.
    pub ncclAllReduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudaStream_t,
    ) -> R,
    /// `ncclAllGather`.
    pub ncclAllGather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclComm_t,
        cudaStream_t,
    ) -> R,
    /// `ncclReduceScatter`.
    pub ncclReduceScatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudaStream_t,
    ) -> R,
    /// `ncclBroadcast`.
    pub ncclBroadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> R,
    /// `ncclReduce`.
    pub ncclReduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> R,
    /// `ncclSend`.
    pub ncclSend: unsafe extern "C" fn(
        *const c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> R,
    /// `ncclRecv`.
    pub ncclRecv: unsafe extern "C" fn(
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> R,
    /// `ncclGroupStart`.
    pub ncclGroupStart: unsafe extern "C" fn() -> R,
    /// `ncclGroupEnd`.
    pub ncclGroupEnd: unsafe extern "C" fn() -> R,
    _lib: libloading::Library,
}

/// The oldest NCCL accepted (2.10.0, as `ncclGetVersion` encodes it).
pub const MIN_VERSION: c_int = 21000;

/// `major.minor.patch` of an `ncclGetVersion` code (codes below 20000
/// use the pre-2.9 encoding).
pub fn version_string(code: c_int) -> String {
    let (major, minor) = if code < 20000 {
        (code / 1000, (code % 1000) / 100)
    } else {
        (code / 10000, (code % 10000) / 100)
    };
    format!("{major}.{minor}.{}", code % 100)
}

impl Nccl {
    fn load(lib: libloading::Library, path: String) -> std::result::Result<Nccl, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is looked up under the name of the NCCL
                // function whose C signature the destination field's type
                // states (nccl.h); the library stays loaded while `Nccl`
                // lives (it owns it).
                unsafe {
                    *lib.get(concat!($name, "\0").as_bytes())
                        .map_err(|e| format!("{path} lacks {}: {e}", $name))?
                }
            };
            (? $name:literal) => {
                // SAFETY: as above; absent symbols are `None`.
                unsafe { lib.get(concat!($name, "\0").as_bytes()).ok().map(|s| *s) }
            };
        }
        let get_version: unsafe extern "C" fn(*mut c_int) -> R = sym!("ncclGetVersion");
        let mut version = 0;
        // SAFETY: a valid out-pointer; ncclGetVersion has no preconditions.
        let r = unsafe { get_version(&mut version) };
        if r != NCCL_SUCCESS {
            return Err(format!("{path}: ncclGetVersion failed ({r})"));
        }
        if !(MIN_VERSION..30000).contains(&version) {
            return Err(format!(
                "{path} is NCCL {}, but 2.x at least 2.10 is required",
                version_string(version)
            ));
        }
        Ok(Nccl {
            version,
            ncclGetErrorString: sym!("ncclGetErrorString"),
            ncclGetLastError: sym!(? "ncclGetLastError"),
            ncclGetUniqueId: sym!("ncclGetUniqueId"),
            ncclCommInitRank: sym!("ncclCommInitRank"),
            ncclCommSplit: sym!(? "ncclCommSplit"),
            ncclCommFinalize: sym!(? "ncclCommFinalize"),
            ncclCommDestroy: sym!("ncclCommDestroy"),
            ncclCommAbort: sym!("ncclCommAbort"),
            ncclCommGetAsyncError: sym!("ncclCommGetAsyncError"),
            ncclCommCount: sym!("ncclCommCount"),
            ncclCommUserRank: sym!("ncclCommUserRank"),
            ncclAllReduce: sym!("ncclAllReduce"),
            ncclAllGather: sym!("ncclAllGather"),
            ncclReduceScatter: sym!("ncclReduceScatter"),
            ncclBroadcast: sym!("ncclBroadcast"),
            ncclReduce: sym!("ncclReduce"),
            ncclSend: sym!("ncclSend"),
            ncclRecv: sym!("ncclRecv"),
            ncclGroupStart: sym!("ncclGroupStart"),
            ncclGroupEnd: sym!("ncclGroupEnd"),
            path,
            _lib: lib,
        })
    }

    /// The status for a failed NCCL call: NCCL's text for the code, and the
    /// communicator's last error message when there is one.
    pub(crate) fn to_status(&self, r: ncclResult_t, comm: ncclComm_t, what: &str) -> Status {
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let text = unsafe { cstr((self.ncclGetErrorString)(r)) };
        let last = match self.ncclGetLastError {
            // SAFETY: a null or live communicator; the string is NCCL's
            // thread-local buffer, copied at once.
            Some(f) => unsafe { cstr(f(comm)) },
            None => String::new(),
        };
        let code = match r {
            4 | 5 => StatusCode::InvalidArgument,
            1 => StatusCode::Internal,
            2 | 6 => StatusCode::Unavailable,
            _ => StatusCode::Internal,
        };
        let detail = if last.is_empty() || last == text {
            String::new()
        } else {
            format!(" ({last})")
        };
        Status::new(code, format!("{what}: NCCL error {r}: {text}{detail}"))
    }

    /// `Ok` for ncclSuccess, else the error naming `what`.
    pub(crate) fn check(&self, r: ncclResult_t, comm: ncclComm_t, what: &str) -> Result<()> {
        if r == NCCL_SUCCESS {
            Ok(())
        } else {
            Err(self.to_status(r, comm, what))
        }
    }
}

/// A C string, copied (empty for null).
///
/// # Safety
/// `p` is null or points at a NUL-terminated string.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: per the function's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The places searched, in order (see the module docs).
pub fn candidates() -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(p) = std::env::var("FERRITE_NCCL_LIBRARY") {
        if !p.is_empty() {
            names.push(p);
        }
    }
    names.extend(["libnccl.so.2".to_string(), "libnccl.so".to_string()]);
    if let Ok(venv) = std::env::var("VIRTUAL_ENV") {
        let lib = std::path::Path::new(&venv).join("lib");
        if let Ok(entries) = std::fs::read_dir(&lib) {
            // nvidia-nccl-cu12 installs under nvidia/nccl; CUDA 13 wheels
            // may use nvidia/cu13.
            let mut found: Vec<String> = entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .flat_map(|e| {
                    let nvidia = e.path().join("site-packages/nvidia");
                    let mut dirs = vec![nvidia.join("nccl")];
                    if let Ok(more) = std::fs::read_dir(&nvidia) {
                        dirs.extend(
                            more.flatten()
                                .filter(|d| d.file_name().to_string_lossy().starts_with("cu"))
                                .map(|d| d.path()),
                        );
                    }
                    dirs.into_iter().map(|d| d.join("lib/libnccl.so.2"))
                })
                .filter(|p| p.exists())
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            found.sort();
            names.extend(found);
        }
    }
    names
}

static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();

/// NCCL, loaded on first use; an UNAVAILABLE error naming every place
/// searched and why each failed when no usable library is found.
pub fn nccl() -> Result<&'static Nccl> {
    let loaded = NCCL.get_or_init(|| {
        let mut tried = Vec::new();
        for name in candidates() {
            // SAFETY: loading libnccl runs its initializers, which have no
            // preconditions on the calling process.
            match unsafe { libloading::Library::new(&name) } {
                Ok(lib) => match Nccl::load(lib, name.clone()) {
                    Ok(n) => return Ok(n),
                    Err(e) => tried.push(e),
                },
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(tried.join("; "))
    });
    loaded.as_ref().map_err(|why| {
        status!(
            Unavailable,
            "NCCL not found ({why}); collectives on cuda need NCCL 2.10 or newer: set FERRITE_NCCL_LIBRARY to libnccl.so.2's path or add its directory to LD_LIBRARY_PATH (PyTorch's copy is site-packages/nvidia/nccl/lib)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes() {
        assert_eq!(version_string(22703), "2.27.3");
        assert_eq!(version_string(2804), "2.8.4");
    }

    #[test]
    fn a_present_library_resolves_every_entry_point() {
        let Ok(n) = nccl() else {
            println!("SKIPPED: no NCCL here (set FERRITE_NCCL_LIBRARY to check the loader)");
            return;
        };
        assert!(n.version >= MIN_VERSION, "{}", version_string(n.version));
        // Entry points that are optional by version are there when the
        // version has them.
        assert_eq!(
            n.ncclCommSplit.is_some(),
            n.version >= 21800,
            "ncclCommSplit"
        );
        assert_eq!(
            n.ncclCommFinalize.is_some(),
            n.version >= 21400,
            "ncclCommFinalize"
        );
        let e = n.to_status(4, std::ptr::null_mut(), "x").to_string();
        assert!(e.contains("NCCL error 4"), "{e}");
        assert!(e.contains("invalid argument"), "{e}");
        println!("loaded {} (NCCL {})", n.path, version_string(n.version));
    }

    #[test]
    fn missing_library_names_what_was_searched() {
        if nccl().is_ok() {
            println!("SKIPPED: NCCL is present (this checks the missing-library path)");
            return;
        }
        let e = nccl().err().unwrap().to_string();
        assert!(e.contains("libnccl.so.2"), "{e}");
        assert!(e.contains("FERRITE_NCCL_LIBRARY"), "{e}");
    }
}
