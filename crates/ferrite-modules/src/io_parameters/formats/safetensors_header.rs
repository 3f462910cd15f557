//! The JSON header of a safetensors file, read in one streaming pass.
//!
//! Each tensor is checked as it is read (known dtype, element count times
//! dtype size equal to its byte range, range inside the data section) and
//! kept as a name borrowed from the header (copied only when the JSON
//! escapes it) and its byte range: about 40 bytes per tensor. Building the
//! `safetensors` crate's maps (a `HashMap` of owned names, shape vectors,
//! then a vector of its entries) took 175 MB of RSS for a 13 MB header of
//! 200,000 entries before its error.

use serde::de::{self, DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// One tensor of the header: its name and its byte range within the data
/// section (after the header).
pub(crate) struct TensorRange<'a> {
    pub(crate) name: Cow<'a, str>,
    pub(crate) begin: u64,
    pub(crate) end: u64,
}

/// Reads the header JSON `json` of a file whose data section holds
/// `data_len` bytes: the tensors in header order, or the first problem
/// found (with serde_json's line and column).
pub(crate) fn read(json: &[u8], data_len: u64) -> Result<Vec<TensorRange<'_>>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let tensors = HeaderSeed { data_len }.deserialize(&mut de)?;
    de.end()?;
    Ok(tensors)
}

/// Bits per element of a safetensors dtype name.
fn dtype_bits(name: &str) -> Option<u64> {
    Some(match name {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" | "E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        _ => return None,
    })
}

/// A string, borrowed from the JSON when it has no escapes.
struct StrSeed;

impl<'de> DeserializeSeed<'de> for StrSeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(StrSeed)
    }
}

impl<'de> Visitor<'de> for StrSeed {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// The whole header: an object of tensors and an optional `__metadata__`.
struct HeaderSeed {
    data_len: u64,
}

impl<'de> DeserializeSeed<'de> for HeaderSeed {
    type Value = Vec<TensorRange<'de>>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed {
    type Value = Vec<TensorRange<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of tensors")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut tensors = Vec::new();
        let mut metadata_seen = false;
        while let Some(name) = map.next_key_seed(StrSeed)? {
            if name == "__metadata__" {
                if std::mem::replace(&mut metadata_seen, true) {
                    return Err(A::Error::custom("'__metadata__' appears twice"));
                }
                map.next_value_seed(MetadataSeed)?;
                continue;
            }
            let t = map.next_value_seed(TensorSeed)?;
            let bytes = t
                .elements
                .checked_mul(t.bits)
                .filter(|bits| bits % 8 == 0)
                .map(|bits| bits / 8);
            if t.end < t.begin {
                return Err(A::Error::custom(format!(
                    "tensor '{name}': data_offsets [{}, {}] end before they begin",
                    t.begin, t.end
                )));
            }
            if bytes != Some(t.end - t.begin) {
                return Err(A::Error::custom(format!(
                    "tensor '{name}': {} elements of {} bits do not fill its {} bytes (data_offsets [{}, {}])",
                    t.elements,
                    t.bits,
                    t.end - t.begin,
                    t.begin,
                    t.end
                )));
            }
            if t.end > self.data_len {
                return Err(A::Error::custom(format!(
                    "tensor '{name}': bytes [{}, {}) are outside the data section of {} bytes after the header",
                    t.begin, t.end, self.data_len
                )));
            }
            tensors.push(TensorRange {
                name,
                begin: t.begin,
                end: t.end,
            });
        }
        Ok(tensors)
    }
}

/// `__metadata__`: null, or an object of strings (checked, not kept).
struct MetadataSeed;

impl<'de> DeserializeSeed<'de> for MetadataSeed {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("'__metadata__' as an object of strings")
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(StrSeed)?.is_some() {
            map.next_value_seed(StrSeed)?;
        }
        Ok(())
    }
}

/// What one tensor's object says.
struct TensorFields {
    bits: u64,
    /// The product of the shape (saturated: checked against the range).
    elements: u64,
    begin: u64,
    end: u64,
}

struct TensorSeed;

impl<'de> DeserializeSeed<'de> for TensorSeed {
    type Value = TensorFields;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TensorSeed {
    type Value = TensorFields;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tensor object with dtype, shape and data_offsets")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut bits, mut elements, mut offsets) = (None, None, None);
        while let Some(field) = map.next_key_seed(StrSeed)? {
            match &*field {
                "dtype" if bits.is_none() => {
                    let name = map.next_value_seed(StrSeed)?;
                    bits = Some(
                        dtype_bits(&name)
                            .ok_or_else(|| A::Error::custom(format!("unknown dtype '{name}'")))?,
                    );
                }
                "shape" if elements.is_none() => {
                    elements = Some(map.next_value_seed(ShapeSeed)?);
                }
                "data_offsets" if offsets.is_none() => {
                    offsets = Some(map.next_value_seed(OffsetsSeed)?);
                }
                "dtype" | "shape" | "data_offsets" => {
                    return Err(A::Error::custom(format!("field '{field}' appears twice")));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let bits = bits.ok_or_else(|| A::Error::missing_field("dtype"))?;
        let elements = elements.ok_or_else(|| A::Error::missing_field("shape"))?;
        let (begin, end) = offsets.ok_or_else(|| A::Error::missing_field("data_offsets"))?;
        Ok(TensorFields {
            bits,
            elements,
            begin,
            end,
        })
    }
}

/// A shape: the product of its dimensions (u64::MAX when it overflows).
struct ShapeSeed;

impl<'de> DeserializeSeed<'de> for ShapeSeed {
    type Value = u64;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ShapeSeed {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a shape (an array of non-negative integers)")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let mut n: u64 = 1;
        while let Some(d) = seq.next_element::<u64>()? {
            n = n.saturating_mul(d);
        }
        Ok(n)
    }
}

/// `data_offsets`: exactly two integers.
struct OffsetsSeed;

impl<'de> DeserializeSeed<'de> for OffsetsSeed {
    type Value = (u64, u64);
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(u64, u64), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for OffsetsSeed {
    type Value = (u64, u64);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("data_offsets as [begin, end]")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(u64, u64), A::Error> {
        let begin = seq
            .next_element::<u64>()?
            .ok_or_else(|| A::Error::invalid_length(0, &self))?;
        let end = seq
            .next_element::<u64>()?
            .ok_or_else(|| A::Error::invalid_length(1, &self))?;
        if seq.next_element::<IgnoredAny>()?.is_some() {
            return Err(A::Error::invalid_length(3, &self));
        }
        Ok((begin, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(json: &str, data_len: u64) -> Result<Vec<(String, u64, u64)>, String> {
        read(json.as_bytes(), data_len)
            .map(|v| {
                v.into_iter()
                    .map(|t| (t.name.into_owned(), t.begin, t.end))
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn tensors_metadata_and_escapes() {
        let got = names(
            r#"{"__metadata__":{"format":"pt"},"a\u00e9":{"dtype":"F16","shape":[2,3],"data_offsets":[8,20]},"b":{"dtype":"BOOL","shape":[],"data_offsets":[0,1],"extra":[1]}}"#,
            20,
        )
        .unwrap();
        assert_eq!(
            got,
            [("a\u{e9}".to_string(), 8, 20), ("b".to_string(), 0, 1)]
        );
        assert!(names(r#"{"__metadata__":null}"#, 0).unwrap().is_empty());
    }

    #[test]
    fn bad_headers_name_the_problem() {
        let cases = [
            (
                r#"{"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}"#,
                "unknown dtype 'F33'",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
                "2 elements of 32 bits",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#,
                "end before",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#,
                "outside the data section of 8",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1]}}"#,
                "missing field `data_offsets`",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
                "invalid length 3",
            ),
            (
                r#"{"a":{"dtype":"F32","dtype":"F32"}}"#,
                "'dtype' appears twice",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
                "invalid value",
            ),
            (
                r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#,
                "3 elements of 4 bits",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}}"#,
                "elements of 32 bits",
            ),
            (r#"{"__metadata__":{"k":1}}"#, "expected a string"),
            (r#"[1]"#, "expected an object of tensors"),
            (r#"{} x"#, "trailing characters"),
        ];
        for (json, want) in cases {
            let e = names(json, 8).unwrap_err();
            assert!(e.contains(want), "{json}: {e}");
        }
    }
}
