//! IREE status codes and Ferrite's single error type.
//!
//! A [`Status`] carries a code, a primary message, a chain of annotations
//! added as the error propagates ("parsing input `4xf32=...`", "invoking
//! function 'f'"), and for VM failures a backtrace of frames. Its `Display`
//! form follows upstream's shape: `CODE; message; annotation; ...`.

use std::fmt;

/// The IREE status codes (values match upstream's `iree_status_code_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum StatusCode {
    /// Success.
    Ok = 0,
    /// The operation was cancelled.
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// The caller passed an invalid argument.
    InvalidArgument = 3,
    /// A deadline expired before the operation completed.
    DeadlineExceeded = 4,
    /// A requested entity was not found.
    NotFound = 5,
    /// An entity already exists.
    AlreadyExists = 6,
    /// The caller lacks permission (e.g. writing a read-only buffer).
    PermissionDenied = 7,
    /// A resource (memory, stack) is exhausted.
    ResourceExhausted = 8,
    /// The system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// The operation was aborted.
    Aborted = 10,
    /// An index or range was out of bounds.
    OutOfRange = 11,
    /// The operation is not implemented.
    Unimplemented = 12,
    /// An internal invariant was broken.
    Internal = 13,
    /// The service is unavailable.
    Unavailable = 14,
    /// Unrecoverable data loss or corruption.
    DataLoss = 15,
    /// Missing authentication.
    Unauthenticated = 16,
    /// The operation yielded and must be resumed later (coroutines).
    Deferred = 17,
    /// Incompatible versions or formats.
    Incompatible = 18,
}

impl StatusCode {
    /// Maps a raw code (e.g. from `vm.fail`) to a status code; values outside
    /// the known range map to `Unknown` as upstream's code mask would not.
    pub fn from_u32(code: u32) -> StatusCode {
        use StatusCode::*;
        match code & 0x1F {
            0 => Ok,
            1 => Cancelled,
            2 => Unknown,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            17 => Deferred,
            18 => Incompatible,
            _ => Unknown,
        }
    }

    /// Upstream's canonical upper-case name (`INVALID_ARGUMENT`, ...).
    pub fn name(self) -> &'static str {
        use StatusCode::*;
        match self {
            Ok => "OK",
            Cancelled => "CANCELLED",
            Unknown => "UNKNOWN",
            InvalidArgument => "INVALID_ARGUMENT",
            DeadlineExceeded => "DEADLINE_EXCEEDED",
            NotFound => "NOT_FOUND",
            AlreadyExists => "ALREADY_EXISTS",
            PermissionDenied => "PERMISSION_DENIED",
            ResourceExhausted => "RESOURCE_EXHAUSTED",
            FailedPrecondition => "FAILED_PRECONDITION",
            Aborted => "ABORTED",
            OutOfRange => "OUT_OF_RANGE",
            Unimplemented => "UNIMPLEMENTED",
            Internal => "INTERNAL",
            Unavailable => "UNAVAILABLE",
            DataLoss => "DATA_LOSS",
            Unauthenticated => "UNAUTHENTICATED",
            Deferred => "DEFERRED",
            Incompatible => "INCOMPATIBLE",
        }
    }
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One frame of a VM backtrace: `module.function@offset` plus an optional
/// source location taken from the module's debug database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BacktraceFrame {
    /// `module.function` of the frame.
    pub function: String,
    /// Bytecode offset (or native marker) of the failing instruction.
    pub offset: u32,
    /// `file:line:col` when the module carries debug info.
    pub location: Option<String>,
}

impl fmt::Display for BacktraceFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.function, self.offset)?;
        if let Some(loc) = &self.location {
            write!(f, " ({loc})")?;
        }
        Ok(())
    }
}

/// Ferrite's error type: an IREE status code with a message chain.
///
/// Boxed so that `Result<T>` stays one pointer wide on the happy path.
#[derive(Clone, PartialEq, Eq)]
pub struct Status(Box<Inner>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Inner {
    code: StatusCode,
    message: String,
    annotations: Vec<String>,
    backtrace: Vec<BacktraceFrame>,
}

/// Result alias used across Ferrite.
pub type Result<T, E = Status> = std::result::Result<T, E>;

impl Status {
    /// Creates a status with `code` and a primary message.
    pub fn new(code: StatusCode, message: impl Into<String>) -> Status {
        Status(Box::new(Inner {
            code,
            message: message.into(),
            annotations: Vec::new(),
            backtrace: Vec::new(),
        }))
    }

    /// The status code.
    pub fn code(&self) -> StatusCode {
        self.0.code
    }

    /// The primary message (without annotations).
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// Annotations in the order they were added (innermost first).
    pub fn annotations(&self) -> &[String] {
        &self.0.annotations
    }

    /// The VM backtrace, innermost frame first; empty for non-VM errors.
    pub fn backtrace(&self) -> &[BacktraceFrame] {
        &self.0.backtrace
    }

    /// Adds context as the error propagates outward.
    pub fn annotate(mut self, context: impl Into<String>) -> Status {
        self.0.annotations.push(context.into());
        self
    }

    /// Appends a backtrace frame (callers push innermost first).
    pub fn push_frame(&mut self, frame: BacktraceFrame) {
        self.0.backtrace.push(frame);
    }

    /// True for the `DEFERRED` code that coroutines use to yield.
    pub fn is_deferred(&self) -> bool {
        self.0.code == StatusCode::Deferred
    }
}

/// Backtrace frames printed before and after the elided middle of a long
/// backtrace.
const BACKTRACE_HEAD: usize = 32;
const BACKTRACE_TAIL: usize = 16;

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.0.code, self.0.message)?;
        for a in &self.0.annotations {
            write!(f, "; {a}")?;
        }
        if !self.0.backtrace.is_empty() {
            f.write_str("\nbacktrace:")?;
            // A deep recursion's backtrace has tens of thousands of frames:
            // the innermost and outermost ones say where; the middle is
            // counted, not printed ([`Status::backtrace`] keeps them all).
            let bt = &self.0.backtrace;
            let (head, tail) = (BACKTRACE_HEAD, BACKTRACE_TAIL);
            for (i, fr) in bt.iter().enumerate() {
                if bt.len() > head + tail && i == head {
                    write!(f, "\n  ... {} frames elided", bt.len() - head - tail)?;
                }
                if bt.len() <= head + tail || i < head || i >= bt.len() - tail {
                    write!(f, "\n  [{i}] {fr}")?;
                }
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Status {}

impl From<std::io::Error> for Status {
    fn from(e: std::io::Error) -> Status {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => StatusCode::NotFound,
            std::io::ErrorKind::PermissionDenied => StatusCode::PermissionDenied,
            std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
                StatusCode::InvalidArgument
            }
            std::io::ErrorKind::UnexpectedEof => StatusCode::OutOfRange,
            _ => StatusCode::Unknown,
        };
        Status::new(code, e.to_string())
    }
}

/// Builds a [`Status`] with a formatted message: `status!(InvalidArgument, "bad {x}")`.
#[macro_export]
macro_rules! status {
    ($code:ident, $($arg:tt)+) => {
        $crate::status::Status::new($crate::status::StatusCode::$code, format!($($arg)+))
    };
}

/// Returns early with a formatted [`Status`]: `bail!(OutOfRange, "index {i}")`.
#[macro_export]
macro_rules! bail {
    ($code:ident, $($arg:tt)+) => {
        return Err($crate::status!($code, $($arg)+))
    };
}

/// Extension for annotating errors in a `Result` chain.
pub trait ResultExt<T> {
    /// Adds a context annotation to the error, if any.
    fn annotate(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn annotate(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| e.annotate(context()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_upstream_shape() {
        let s = Status::new(StatusCode::InvalidArgument, "bad shape")
            .annotate("parsing input `4xf32=1`");
        assert_eq!(
            s.to_string(),
            "INVALID_ARGUMENT; bad shape; parsing input `4xf32=1`"
        );
    }

    #[test]
    fn codes_round_trip() {
        for c in 0..=18u32 {
            assert_eq!(StatusCode::from_u32(c) as u32, c);
        }
        assert_eq!(StatusCode::from_u32(31), StatusCode::Unknown);
    }
}
