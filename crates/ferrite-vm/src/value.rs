//! Primitive values and variants (the VM's "any value" cell).

use crate::refs::Ref;
use std::fmt;

/// The primitive element types a value or list slot can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// 8-bit integer (list storage only; widened to i32 in registers).
    I8,
    /// 16-bit integer (list storage only; widened to i32 in registers).
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
}

impl ValueType {
    /// Size in bytes of one stored element.
    pub fn byte_size(self) -> usize {
        match self {
            ValueType::I8 => 1,
            ValueType::I16 => 2,
            ValueType::I32 | ValueType::F32 => 4,
            ValueType::I64 | ValueType::F64 => 8,
        }
    }

    /// The MLIR-style name (`i32`, `f64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::I8 => "i8",
            ValueType::I16 => "i16",
            ValueType::I32 => "i32",
            ValueType::I64 => "i64",
            ValueType::F32 => "f32",
            ValueType::F64 => "f64",
        }
    }

    /// Parses `i8`/`i16`/`i32`/`i64`/`f32`/`f64`.
    pub fn from_name(name: &str) -> Option<ValueType> {
        Some(match name {
            "i8" => ValueType::I8,
            "i16" => ValueType::I16,
            "i32" => ValueType::I32,
            "i64" => ValueType::I64,
            "f32" => ValueType::F32,
            "f64" => ValueType::F64,
            _ => return None,
        })
    }
}

/// One VM value of any kind: what lists of variants store, what function
/// arguments and results are marshalled as.
#[derive(Clone, Default, PartialEq)]
pub enum Variant {
    /// No value (an unset variant list slot) or a null ref.
    #[default]
    Null,
    /// A 32-bit integer (also carries i8/i16 values read from typed lists).
    I32(i32),
    /// A 64-bit integer.
    I64(i64),
    /// A 32-bit float.
    F32(f32),
    /// A 64-bit float.
    F64(f64),
    /// A non-null reference.
    Ref(Ref),
}

impl Variant {
    /// True for [`Variant::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Variant::Null)
    }

    /// Wraps an optional ref (None becomes [`Variant::Null`]).
    pub fn from_ref(r: Option<Ref>) -> Variant {
        r.map_or(Variant::Null, Variant::Ref)
    }

    /// The ref held, if any.
    pub fn as_ref(&self) -> Option<&Ref> {
        match self {
            Variant::Ref(r) => Some(r),
            _ => None,
        }
    }

    /// A short name of the variant's kind, for error messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Variant::Null => "null",
            Variant::I32(_) => "i32",
            Variant::I64(_) => "i64",
            Variant::F32(_) => "f32",
            Variant::F64(_) => "f64",
            Variant::Ref(_) => "ref",
        }
    }
}

impl fmt::Debug for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Variant::Null => f.write_str("null"),
            Variant::I32(v) => write!(f, "i32={v}"),
            Variant::I64(v) => write!(f, "i64={v}"),
            Variant::F32(v) => write!(f, "f32={v}"),
            Variant::F64(v) => write!(f, "f64={v}"),
            Variant::Ref(r) => write!(f, "{r:?}"),
        }
    }
}
