//! Element types of buffer views, encoded as upstream's `iree_hal_element_type_t`.
//!
//! An element type is a 32-bit value: the numerical type in the top byte and
//! the bit width in the low byte (`numerical << 24 | bits`). The constants
//! here carry upstream's exact values, so they can be passed through the VM
//! (`hal.buffer_view.create` takes the raw `i32`) unchanged.

use std::fmt;

use ferrite_base::{bail, Result};

/// The numerical interpretation of an element (the top byte of an
/// [`ElementType`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NumericalType(pub u8);

impl NumericalType {
    /// Unknown / opaque data.
    pub const UNKNOWN: NumericalType = NumericalType(0x00);
    /// Integer of unspecified signedness (MLIR's signless integers).
    pub const INTEGER: NumericalType = NumericalType(0x10);
    /// Signed integer.
    pub const INTEGER_SIGNED: NumericalType = NumericalType(0x11);
    /// Unsigned integer.
    pub const INTEGER_UNSIGNED: NumericalType = NumericalType(0x12);
    /// Boolean (stored as an integer).
    pub const BOOLEAN: NumericalType = NumericalType(0x13);
    /// Floating point of unspecified format (the family bit).
    pub const FLOAT: NumericalType = NumericalType(0x20);
    /// IEEE-754 binary floating point.
    pub const FLOAT_IEEE: NumericalType = NumericalType(0x21);
    /// bfloat16 ("brain" float).
    pub const FLOAT_BRAIN: NumericalType = NumericalType(0x22);
    /// Complex number made of two floats (real, imaginary).
    pub const FLOAT_COMPLEX: NumericalType = NumericalType(0x23);
    /// 8-bit float, 5 exponent bits, 2 mantissa bits (IEEE-like, has inf).
    pub const FLOAT_8_E5M2: NumericalType = NumericalType(0x24);
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, finite, one NaN.
    pub const FLOAT_8_E4M3FN: NumericalType = NumericalType(0x25);
    /// 8-bit float E5M2, finite, unsigned zero, NaN encoded as -0.
    pub const FLOAT_8_E5M2_FNUZ: NumericalType = NumericalType(0x26);
    /// 8-bit float E4M3, finite, unsigned zero, NaN encoded as -0.
    pub const FLOAT_8_E4M3_FNUZ: NumericalType = NumericalType(0x27);
    /// 8-bit power-of-two scale (8 exponent bits, no mantissa, no sign).
    pub const FLOAT_8_E8M0_FNU: NumericalType = NumericalType(0x28);
}

/// The element type of a buffer view (upstream's `iree_hal_element_type_t`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ElementType(pub u32);

const fn et(numerical: NumericalType, bits: u32) -> ElementType {
    ElementType(((numerical.0 as u32) << 24) | bits)
}

impl ElementType {
    /// No element type (opaque, zero bits).
    pub const NONE: ElementType = et(NumericalType::UNKNOWN, 0);
    /// Opaque 8-bit data.
    pub const OPAQUE_8: ElementType = et(NumericalType::UNKNOWN, 8);
    /// Opaque 16-bit data.
    pub const OPAQUE_16: ElementType = et(NumericalType::UNKNOWN, 16);
    /// Opaque 32-bit data.
    pub const OPAQUE_32: ElementType = et(NumericalType::UNKNOWN, 32);
    /// Opaque 64-bit data.
    pub const OPAQUE_64: ElementType = et(NumericalType::UNKNOWN, 64);
    /// Boolean stored in one byte (MLIR `i1` tensors).
    pub const BOOL_8: ElementType = et(NumericalType::BOOLEAN, 8);
    /// Signless 4-bit integer.
    pub const INT_4: ElementType = et(NumericalType::INTEGER, 4);
    /// Signed 4-bit integer.
    pub const SINT_4: ElementType = et(NumericalType::INTEGER_SIGNED, 4);
    /// Unsigned 4-bit integer.
    pub const UINT_4: ElementType = et(NumericalType::INTEGER_UNSIGNED, 4);
    /// Signless 8-bit integer.
    pub const INT_8: ElementType = et(NumericalType::INTEGER, 8);
    /// Signed 8-bit integer.
    pub const SINT_8: ElementType = et(NumericalType::INTEGER_SIGNED, 8);
    /// Unsigned 8-bit integer.
    pub const UINT_8: ElementType = et(NumericalType::INTEGER_UNSIGNED, 8);
    /// Signless 16-bit integer.
    pub const INT_16: ElementType = et(NumericalType::INTEGER, 16);
    /// Signed 16-bit integer.
    pub const SINT_16: ElementType = et(NumericalType::INTEGER_SIGNED, 16);
    /// Unsigned 16-bit integer.
    pub const UINT_16: ElementType = et(NumericalType::INTEGER_UNSIGNED, 16);
    /// Signless 32-bit integer.
    pub const INT_32: ElementType = et(NumericalType::INTEGER, 32);
    /// Signed 32-bit integer.
    pub const SINT_32: ElementType = et(NumericalType::INTEGER_SIGNED, 32);
    /// Unsigned 32-bit integer.
    pub const UINT_32: ElementType = et(NumericalType::INTEGER_UNSIGNED, 32);
    /// Signless 64-bit integer.
    pub const INT_64: ElementType = et(NumericalType::INTEGER, 64);
    /// Signed 64-bit integer.
    pub const SINT_64: ElementType = et(NumericalType::INTEGER_SIGNED, 64);
    /// Unsigned 64-bit integer.
    pub const UINT_64: ElementType = et(NumericalType::INTEGER_UNSIGNED, 64);
    /// IEEE half precision.
    pub const FLOAT_16: ElementType = et(NumericalType::FLOAT_IEEE, 16);
    /// IEEE single precision.
    pub const FLOAT_32: ElementType = et(NumericalType::FLOAT_IEEE, 32);
    /// IEEE double precision.
    pub const FLOAT_64: ElementType = et(NumericalType::FLOAT_IEEE, 64);
    /// bfloat16.
    pub const BFLOAT_16: ElementType = et(NumericalType::FLOAT_BRAIN, 16);
    /// Complex of two f32 (64 bits in all).
    pub const COMPLEX_FLOAT_64: ElementType = et(NumericalType::FLOAT_COMPLEX, 64);
    /// Complex of two f64 (128 bits in all).
    pub const COMPLEX_FLOAT_128: ElementType = et(NumericalType::FLOAT_COMPLEX, 128);
    /// f8E5M2.
    pub const FLOAT_8_E5M2: ElementType = et(NumericalType::FLOAT_8_E5M2, 8);
    /// f8E4M3FN.
    pub const FLOAT_8_E4M3_FN: ElementType = et(NumericalType::FLOAT_8_E4M3FN, 8);
    /// f8E5M2FNUZ.
    pub const FLOAT_8_E5M2_FNUZ: ElementType = et(NumericalType::FLOAT_8_E5M2_FNUZ, 8);
    /// f8E4M3FNUZ.
    pub const FLOAT_8_E4M3_FNUZ: ElementType = et(NumericalType::FLOAT_8_E4M3_FNUZ, 8);
    /// f8E8M0FNU.
    pub const FLOAT_8_E8M0_FNU: ElementType = et(NumericalType::FLOAT_8_E8M0_FNU, 8);

    /// Every named element type with the name upstream's Python binding gives
    /// it (`iree.runtime.HalElementType.<NAME>`).
    pub const ALL: [(&'static str, ElementType); 32] = [
        ("NONE", Self::NONE),
        ("OPAQUE_8", Self::OPAQUE_8),
        ("OPAQUE_16", Self::OPAQUE_16),
        ("OPAQUE_32", Self::OPAQUE_32),
        ("OPAQUE_64", Self::OPAQUE_64),
        ("BOOL_8", Self::BOOL_8),
        ("INT_4", Self::INT_4),
        ("INT_8", Self::INT_8),
        ("INT_16", Self::INT_16),
        ("INT_32", Self::INT_32),
        ("INT_64", Self::INT_64),
        ("SINT_4", Self::SINT_4),
        ("SINT_8", Self::SINT_8),
        ("SINT_16", Self::SINT_16),
        ("SINT_32", Self::SINT_32),
        ("SINT_64", Self::SINT_64),
        ("UINT_4", Self::UINT_4),
        ("UINT_8", Self::UINT_8),
        ("UINT_16", Self::UINT_16),
        ("UINT_32", Self::UINT_32),
        ("UINT_64", Self::UINT_64),
        ("FLOAT_16", Self::FLOAT_16),
        ("FLOAT_32", Self::FLOAT_32),
        ("FLOAT_64", Self::FLOAT_64),
        ("BFLOAT_16", Self::BFLOAT_16),
        ("COMPLEX_64", Self::COMPLEX_FLOAT_64),
        ("COMPLEX_128", Self::COMPLEX_FLOAT_128),
        ("FLOAT_8_E4M3_FN", Self::FLOAT_8_E4M3_FN),
        ("FLOAT_8_E4M3_FNUZ", Self::FLOAT_8_E4M3_FNUZ),
        ("FLOAT_8_E5M2", Self::FLOAT_8_E5M2),
        ("FLOAT_8_E5M2_FNUZ", Self::FLOAT_8_E5M2_FNUZ),
        ("FLOAT_8_E8M0_FNU", Self::FLOAT_8_E8M0_FNU),
    ];

    /// Composes an element type from a numerical type and a bit width.
    pub const fn new(numerical: NumericalType, bit_count: u8) -> ElementType {
        et(numerical, bit_count as u32)
    }

    /// The raw 32-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The numerical type (top byte).
    pub const fn numerical_type(self) -> NumericalType {
        NumericalType((self.0 >> 24) as u8)
    }

    /// Bits per element (low byte).
    pub const fn bit_count(self) -> u32 {
        self.0 & 0xFF
    }

    /// True when elements fill whole bytes (`bit_count % 8 == 0`).
    pub const fn is_byte_aligned(self) -> bool {
        self.bit_count().is_multiple_of(8)
    }

    /// Bytes one element occupies when stored unpacked: `ceil(bits / 8)`
    /// (upstream's per-element `dense_byte_count`, used when formatting and
    /// parsing element strings).
    pub const fn element_byte_count(self) -> usize {
        self.bit_count().div_ceil(8) as usize
    }

    /// Bytes `element_count` densely packed elements occupy: sub-byte types
    /// share bytes (`ceil(count * bits / 8)`, e.g. 8 `i4` take 4 bytes).
    /// Fails with `OUT_OF_RANGE` on overflow.
    pub fn dense_byte_count(self, element_count: u64) -> Result<u64> {
        match element_count.checked_mul(self.bit_count() as u64) {
            Some(bits) => Ok(bits.div_ceil(8)),
            None => bail!(
                OutOfRange,
                "byte size of {element_count} elements of {self} overflows 64 bits"
            ),
        }
    }

    /// True for opaque types (numerical type unknown).
    pub const fn is_opaque(self) -> bool {
        self.numerical_type().0 == NumericalType::UNKNOWN.0
    }

    /// True for integer types, booleans included (as upstream's test).
    pub const fn is_integer(self) -> bool {
        let n = self.numerical_type().0;
        n & NumericalType::INTEGER.0 == NumericalType::INTEGER.0
    }

    /// True for booleans.
    pub const fn is_boolean(self) -> bool {
        let n = self.numerical_type().0;
        n & NumericalType::BOOLEAN.0 == NumericalType::BOOLEAN.0
    }

    /// True for float types (complex and f8 types included).
    pub const fn is_float(self) -> bool {
        let n = self.numerical_type().0;
        n & NumericalType::FLOAT.0 == NumericalType::FLOAT.0
    }

    /// True for complex floats.
    pub const fn is_complex(self) -> bool {
        self.numerical_type().0 == NumericalType::FLOAT_COMPLEX.0
    }

    /// The name upstream prints in buffer views and accepts in `--input`:
    /// `f32`, `i8`, `si32`, `ui8`, `bf16`, `cf64`, `i1` (booleans),
    /// `f8E4M3FN`, `*8` (opaque).
    pub fn name(self) -> String {
        if let Some(special) = self.special_name() {
            return special.to_string();
        }
        let bits = self.bit_count();
        let (prefix, bits) = match self.numerical_type() {
            NumericalType::BOOLEAN => ("i", 1),
            NumericalType::INTEGER => ("i", bits),
            NumericalType::INTEGER_SIGNED => ("si", bits),
            NumericalType::INTEGER_UNSIGNED => ("ui", bits),
            NumericalType::FLOAT_IEEE => ("f", bits),
            NumericalType::FLOAT_BRAIN => ("bf", bits),
            NumericalType::FLOAT_COMPLEX => ("cf", bits),
            _ => ("*", bits),
        };
        format!("{prefix}{bits}")
    }

    fn special_name(self) -> Option<&'static str> {
        Some(match self {
            Self::FLOAT_8_E5M2 => "f8E5M2",
            Self::FLOAT_8_E4M3_FN => "f8E4M3FN",
            Self::FLOAT_8_E5M2_FNUZ => "f8E5M2FNUZ",
            Self::FLOAT_8_E4M3_FNUZ => "f8E4M3FNUZ",
            Self::FLOAT_8_E8M0_FNU => "f8E8M0FNU",
            _ => return None,
        })
    }

    /// Parses an element type name as upstream does: `i1` is `BOOL_8`;
    /// prefixes `i`, `si`, `ui`, `f`, `bf`, `cf` and `x`/`*` (opaque) take a
    /// bit count up to 255; the f8 types by their MLIR names.
    pub fn parse(s: &str) -> Result<ElementType> {
        if s == "i1" {
            return Ok(Self::BOOL_8);
        }
        for special in [
            Self::FLOAT_8_E5M2,
            Self::FLOAT_8_E4M3_FN,
            Self::FLOAT_8_E5M2_FNUZ,
            Self::FLOAT_8_E4M3_FNUZ,
            Self::FLOAT_8_E8M0_FNU,
        ] {
            if special.special_name() == Some(s) {
                return Ok(special);
            }
        }
        let prefixes: [(&str, NumericalType); 8] = [
            ("i", NumericalType::INTEGER),
            ("si", NumericalType::INTEGER_SIGNED),
            ("ui", NumericalType::INTEGER_UNSIGNED),
            ("f", NumericalType::FLOAT_IEEE),
            ("bf", NumericalType::FLOAT_BRAIN),
            ("cf", NumericalType::FLOAT_COMPLEX),
            ("x", NumericalType::UNKNOWN),
            ("*", NumericalType::UNKNOWN),
        ];
        let Some((rest, numerical)) = prefixes
            .iter()
            .find_map(|(p, n)| s.strip_prefix(p).map(|r| (r, *n)))
        else {
            bail!(InvalidArgument, "unhandled element type prefix in '{s}'");
        };
        match parse_u32(rest) {
            Some(bits) if bits <= 0xFF => Ok(et(numerical, bits)),
            _ => bail!(InvalidArgument, "out of range bit count in '{s}'"),
        }
    }

    /// The numpy dtype name upstream's Python binding maps this type to
    /// (`HalElementType.map_to_dtype`), or `None` when it has no mapping.
    pub fn numpy_dtype(self) -> Option<&'static str> {
        Some(match self {
            Self::BOOL_8 => "bool",
            Self::INT_8 | Self::SINT_8 => "int8",
            Self::UINT_8 => "uint8",
            Self::INT_16 | Self::SINT_16 => "int16",
            Self::UINT_16 => "uint16",
            Self::INT_32 | Self::SINT_32 => "int32",
            Self::UINT_32 => "uint32",
            Self::INT_64 | Self::SINT_64 => "int64",
            Self::UINT_64 => "uint64",
            Self::FLOAT_16 => "float16",
            Self::BFLOAT_16 => "bfloat16",
            Self::FLOAT_32 => "float32",
            Self::FLOAT_64 => "float64",
            Self::COMPLEX_FLOAT_64 => "complex64",
            Self::COMPLEX_FLOAT_128 => "complex128",
            Self::FLOAT_8_E5M2 => "float8_e5m2",
            Self::FLOAT_8_E4M3_FN => "float8_e4m3fn",
            Self::FLOAT_8_E5M2_FNUZ => "float8_e5m2fnuz",
            Self::FLOAT_8_E4M3_FNUZ => "float8_e4m3fnuz",
            Self::FLOAT_8_E8M0_FNU => "float8_e8m0fnu",
            _ => return None,
        })
    }

    /// The element type upstream's Python runtime uses for a numpy dtype name
    /// (`iree.runtime` dtypes table: signed numpy ints map to `SINT_*`).
    pub fn from_numpy_dtype(name: &str) -> Option<ElementType> {
        Some(match name {
            "bool" => Self::BOOL_8,
            "int8" => Self::SINT_8,
            "uint8" => Self::UINT_8,
            "int16" => Self::SINT_16,
            "uint16" => Self::UINT_16,
            "int32" => Self::SINT_32,
            "uint32" => Self::UINT_32,
            "int64" => Self::SINT_64,
            "uint64" => Self::UINT_64,
            "float16" => Self::FLOAT_16,
            "float32" => Self::FLOAT_32,
            "float64" => Self::FLOAT_64,
            "bfloat16" => Self::BFLOAT_16,
            "complex64" => Self::COMPLEX_FLOAT_64,
            "complex128" => Self::COMPLEX_FLOAT_128,
            "float8_e5m2" => Self::FLOAT_8_E5M2,
            "float8_e4m3fn" => Self::FLOAT_8_E4M3_FN,
            "float8_e5m2fnuz" => Self::FLOAT_8_E5M2_FNUZ,
            "float8_e4m3fnuz" => Self::FLOAT_8_E4M3_FNUZ,
            "float8_e8m0fnu" => Self::FLOAT_8_E8M0_FNU,
            _ => return None,
        })
    }

    /// The Python enum name (`HalElementType.FLOAT_32` -> `"FLOAT_32"`), if
    /// this is one of the named types.
    pub fn python_name(self) -> Option<&'static str> {
        Self::ALL.iter().find(|(_, t)| *t == self).map(|(n, _)| *n)
    }
}

/// Parses an unsigned decimal as upstream's `atoi_uint32` accepts it
/// (optional leading `+`, digits only, no overflow).
pub(crate) fn parse_u32(s: &str) -> Option<u32> {
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Debug for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.python_name() {
            Some(n) => write!(f, "ElementType::{n}"),
            None => write!(f, "ElementType({:#010x})", self.0),
        }
    }
}

/// The encoding of a buffer view's contents (upstream's
/// `iree_hal_encoding_type_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EncodingType(pub u32);

impl EncodingType {
    /// Unknown encoding: contents cannot be interpreted generically.
    pub const OPAQUE: EncodingType = EncodingType(0);
    /// Dense, row-major (C/numpy order) contiguous elements.
    pub const DENSE_ROW_MAJOR: EncodingType = EncodingType(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_upstream() {
        assert_eq!(ElementType::FLOAT_32.0, 0x2100_0020);
        assert_eq!(ElementType::BFLOAT_16.0, 0x2200_0010);
        assert_eq!(ElementType::BOOL_8.0, 0x1300_0008);
        assert_eq!(ElementType::INT_4.0, 0x1000_0004);
        assert_eq!(ElementType::SINT_32.0, 0x1100_0020);
        assert_eq!(ElementType::UINT_64.0, 0x1200_0040);
        assert_eq!(ElementType::COMPLEX_FLOAT_128.0, 0x2300_0080);
        assert_eq!(ElementType::FLOAT_8_E5M2.0, 0x2400_0008);
        assert_eq!(ElementType::FLOAT_8_E4M3_FN.0, 0x2500_0008);
        assert_eq!(ElementType::FLOAT_8_E5M2_FNUZ.0, 0x2600_0008);
        assert_eq!(ElementType::FLOAT_8_E4M3_FNUZ.0, 0x2700_0008);
        assert_eq!(ElementType::FLOAT_8_E8M0_FNU.0, 0x2800_0008);
        assert_eq!(ElementType::OPAQUE_64.0, 0x40);
        assert_eq!(ElementType::NONE.0, 0);
    }

    #[test]
    fn names_round_trip() {
        let cases = [
            (ElementType::FLOAT_32, "f32"),
            (ElementType::FLOAT_16, "f16"),
            (ElementType::FLOAT_64, "f64"),
            (ElementType::BFLOAT_16, "bf16"),
            (ElementType::INT_8, "i8"),
            (ElementType::SINT_32, "si32"),
            (ElementType::UINT_8, "ui8"),
            (ElementType::INT_4, "i4"),
            (ElementType::COMPLEX_FLOAT_64, "cf64"),
            (ElementType::FLOAT_8_E4M3_FN, "f8E4M3FN"),
            (ElementType::FLOAT_8_E5M2, "f8E5M2"),
            (ElementType::FLOAT_8_E5M2_FNUZ, "f8E5M2FNUZ"),
            (ElementType::FLOAT_8_E4M3_FNUZ, "f8E4M3FNUZ"),
            (ElementType::FLOAT_8_E8M0_FNU, "f8E8M0FNU"),
            (ElementType::OPAQUE_32, "*32"),
        ];
        for (t, n) in cases {
            assert_eq!(t.name(), n);
            assert_eq!(ElementType::parse(n).unwrap(), t, "{n}");
        }
        // Booleans print as i1 and `i1` parses back to BOOL_8.
        assert_eq!(ElementType::BOOL_8.name(), "i1");
        assert_eq!(ElementType::parse("i1").unwrap(), ElementType::BOOL_8);
        assert_eq!(ElementType::parse("x16").unwrap(), ElementType::OPAQUE_16);
        assert_eq!(ElementType::parse("i7").unwrap().bit_count(), 7);
        for bad in ["", "q32", "i", "f256", "i-1", "f3 2"] {
            assert!(ElementType::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(ElementType::INT_4.element_byte_count(), 1);
        assert!(!ElementType::INT_4.is_byte_aligned());
        assert_eq!(ElementType::INT_4.dense_byte_count(8).unwrap(), 4);
        assert_eq!(ElementType::INT_4.dense_byte_count(7).unwrap(), 4);
        assert_eq!(ElementType::FLOAT_32.dense_byte_count(6).unwrap(), 24);
        assert_eq!(ElementType::COMPLEX_FLOAT_128.element_byte_count(), 16);
        assert!(ElementType::FLOAT_64.dense_byte_count(u64::MAX).is_err());
        assert!(ElementType::BOOL_8.is_integer() && ElementType::BOOL_8.is_boolean());
        assert!(ElementType::COMPLEX_FLOAT_64.is_float());
        assert!(ElementType::OPAQUE_8.is_opaque());
    }

    #[test]
    fn numpy_mapping() {
        assert_eq!(ElementType::FLOAT_32.numpy_dtype(), Some("float32"));
        assert_eq!(ElementType::INT_8.numpy_dtype(), Some("int8"));
        assert_eq!(ElementType::BOOL_8.numpy_dtype(), Some("bool"));
        assert_eq!(
            ElementType::COMPLEX_FLOAT_64.numpy_dtype(),
            Some("complex64")
        );
        assert_eq!(ElementType::INT_4.numpy_dtype(), None);
        assert_eq!(
            ElementType::from_numpy_dtype("int32"),
            Some(ElementType::SINT_32)
        );
        assert_eq!(
            ElementType::COMPLEX_FLOAT_128.python_name(),
            Some("COMPLEX_128")
        );
    }
}
