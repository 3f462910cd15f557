//! A small bounds-checked FlatBuffer reader.
//!
//! Every read checks its range with checked arithmetic and returns an
//! `INVALID_ARGUMENT` status naming the schema path being decoded and the file
//! offset involved. Nothing here can panic or read out of bounds; scalars are
//! read with `from_le_bytes`, so alignment does not matter for safety.
//!
//! It is at least as strict as upstream's FlatBuffer verifier (flatcc) about
//! the structure it walks: tables, vectors and strings start 4-byte aligned
//! and vtables 2-byte aligned (as file offsets),
//! every field sits inside its table at its natural alignment, and every
//! vtable entry (including entries for fields this reader does not decode)
//! points inside its table.

use ferrite_base::{Result, Status, StatusCode};

/// Size of a `uoffset_t` / `soffset_t` / vector length prefix.
const WORD: usize = 4;

/// A decoded table header: where the table and its vtable are.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Table {
    /// Offset of the table (its soffset to the vtable) in the buffer.
    pub pos: usize,
    vtable: usize,
    vtable_len: usize,
    object_len: usize,
}

/// A decoded vector header.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Vector {
    /// Offset of the first element in the buffer.
    pub start: usize,
    /// Number of elements.
    pub len: usize,
    /// Size of one element in bytes.
    pub elem: usize,
}

impl Vector {
    /// Offset of element `i` (caller keeps `i < len`; checked anyway).
    fn elem_pos(&self, i: usize) -> Option<usize> {
        if i >= self.len {
            return None;
        }
        i.checked_mul(self.elem)?.checked_add(self.start)
    }

    /// Byte length of the element data.
    #[cfg(test)]
    pub fn byte_len(&self) -> usize {
        // Validated not to overflow when the vector was decoded.
        self.len.saturating_mul(self.elem)
    }
}

/// Checked reader over one FlatBuffer.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    /// File offset of `buf[0]`, for messages.
    base: usize,
    /// Schema path being decoded (e.g. `BytecodeModuleDef.types[3]`).
    pub path: String,
    /// Remaining decode budget (bytes of owned metadata we may still build).
    budget: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`, which starts at file offset `base`. `budget`
    /// bounds the owned metadata the caller will build (see [`Self::charge`]).
    pub fn new(buf: &'a [u8], base: usize, budget: usize) -> Reader<'a> {
        Reader {
            buf,
            base,
            path: String::new(),
            budget,
        }
    }

    /// File offset of buffer offset `off`.
    pub fn file_offset(&self, off: usize) -> usize {
        self.base.saturating_add(off)
    }

    /// An `INVALID_ARGUMENT` status prefixed with `vmfb: <path>: `.
    pub fn error(&self, msg: impl std::fmt::Display) -> Status {
        if self.path.is_empty() {
            Status::new(StatusCode::InvalidArgument, format!("vmfb: {msg}"))
        } else {
            Status::new(
                StatusCode::InvalidArgument,
                format!("vmfb: table {}: {msg}", self.path),
            )
        }
    }

    /// Runs `f` with `seg` appended to the path, restoring it afterwards.
    pub fn with<T>(&mut self, seg: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let old = self.path.len();
        self.path.push_str(seg);
        let r = f(self);
        self.path.truncate(old);
        r
    }

    /// Like [`Self::with`] with an `[i]` segment.
    pub fn with_index<T>(&mut self, i: usize, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        use std::fmt::Write;
        let old = self.path.len();
        let _ = write!(self.path, "[{i}]");
        let r = f(self);
        self.path.truncate(old);
        r
    }

    /// Consumes `n` units of the decode budget. Aliased offsets can make a
    /// small file describe a huge object graph; the budget turns that into an
    /// error instead of an out-of-memory abort.
    pub fn charge(&mut self, n: usize) -> Result<()> {
        match self.budget.checked_sub(n) {
            Some(rest) => {
                self.budget = rest;
                Ok(())
            }
            None => Err(self.error(
                "decoded metadata exceeds the size budget for this file \
                 (aliased or overlapping offsets?)",
            )),
        }
    }

    /// Checks that `n` bytes at `off` are inside the buffer.
    pub fn need(&self, off: usize, n: usize, what: &str) -> Result<()> {
        let ok = off.checked_add(n).is_some_and(|end| end <= self.buf.len());
        if ok {
            Ok(())
        } else {
            Err(self.error(format_args!(
                "truncated: {what} at offset {:#x} needs {n} bytes, flatbuffer has {}",
                self.file_offset(off),
                self.buf.len().saturating_sub(off)
            )))
        }
    }

    fn bytes<const N: usize>(&self, off: usize, what: &str) -> Result<[u8; N]> {
        self.need(off, N, what)?;
        let mut out = [0u8; N];
        // In range: checked by `need` above.
        out.copy_from_slice(self.buf.get(off..off + N).unwrap_or(&[0u8; N][..]));
        Ok(out)
    }

    /// Reads a `u8`.
    pub fn u8_at(&self, off: usize, what: &str) -> Result<u8> {
        Ok(self.bytes::<1>(off, what)?[0])
    }
    /// Reads a little-endian `u16`.
    pub fn u16_at(&self, off: usize, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.bytes(off, what)?))
    }
    /// Reads a little-endian `i16`.
    pub fn i16_at(&self, off: usize, what: &str) -> Result<i16> {
        Ok(i16::from_le_bytes(self.bytes(off, what)?))
    }
    /// Reads a little-endian `u32`.
    pub fn u32_at(&self, off: usize, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(off, what)?))
    }
    /// Reads a little-endian `i32`.
    pub fn i32_at(&self, off: usize, what: &str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.bytes(off, what)?))
    }
    /// Reads a little-endian `u64`.
    pub fn u64_at(&self, off: usize, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(off, what)?))
    }

    /// Follows the `uoffset_t` stored at `off`. Offsets point forward past
    /// themselves (a smaller one would make the target overlap the offset,
    /// which upstream's verifier rejects as out of range).
    pub fn deref(&self, off: usize, what: &str) -> Result<usize> {
        let rel = self.u32_at(off, what)? as usize;
        match off.checked_add(rel) {
            Some(t) if t < self.buf.len() && rel >= WORD => Ok(t),
            _ => Err(self.error(format_args!(
                "{what}: offset at {:#x} points to {:#x}, not past itself inside the \
                 flatbuffer ({} bytes)",
                self.file_offset(off),
                self.file_offset(off).saturating_add(rel),
                self.buf.len()
            ))),
        }
    }

    /// Fails unless `pos` is at a file offset that is a multiple of `align`
    /// (a power of two). Alignment is taken in the file, which is where the
    /// compiler aligns (the size prefix is 64-byte aligned), and where
    /// upstream checks it (the module is loaded at an aligned address).
    fn aligned(&self, pos: usize, align: usize, what: &str) -> Result<()> {
        if self.file_offset(pos) & (align - 1) == 0 {
            return Ok(());
        }
        Err(self.error(format_args!(
            "{what} at offset {:#x} is not {align}-byte aligned",
            self.file_offset(pos)
        )))
    }

    /// Decodes the table header at `pos`.
    pub fn table_at(&self, pos: usize) -> Result<Table> {
        self.aligned(pos, WORD, "table")?;
        let soff = self.i32_at(pos, "table")?;
        let vtable = (pos as i64)
            .checked_sub(i64::from(soff))
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v < self.buf.len())
            .ok_or_else(|| {
                self.error(format_args!(
                    "table at offset {:#x} has vtable offset {soff} pointing outside the flatbuffer",
                    self.file_offset(pos)
                ))
            })?;
        self.aligned(vtable, 2, "vtable")?;
        let vtable_len = self.u16_at(vtable, "vtable")? as usize;
        let object_len = self.u16_at(vtable.saturating_add(2), "vtable")? as usize;
        if vtable_len < 4 || vtable_len & 1 != 0 {
            return Err(self.error(format_args!(
                "vtable at offset {:#x} has invalid size {vtable_len}",
                self.file_offset(vtable)
            )));
        }
        if object_len < WORD {
            return Err(self.error(format_args!(
                "table at offset {:#x} has invalid size {object_len}",
                self.file_offset(pos)
            )));
        }
        self.need(vtable, vtable_len, "vtable")?;
        self.need(pos, object_len, "table")?;
        // Every field the vtable lists lies inside the table, after its
        // vtable offset: also those of fields this reader never decodes.
        for entry in (4..vtable_len).step_by(2) {
            let off = self.u16_at(vtable + entry, "vtable entry")? as usize;
            if off != 0 && (off < WORD || off >= object_len) {
                return Err(self.error(format_args!(
                    "vtable at offset {:#x}: field {} at table offset {off} is out of range \
                     (table at {:#x} has {object_len} bytes)",
                    self.file_offset(vtable),
                    (entry - 4) / 2,
                    self.file_offset(pos)
                )));
            }
        }
        Ok(Table {
            pos,
            vtable,
            vtable_len,
            object_len,
        })
    }

    /// Position of field `id` (of `size` bytes) in `t`, or `None` if absent.
    pub fn field(&self, t: &Table, id: usize, size: usize, name: &str) -> Result<Option<usize>> {
        let entry = match id.checked_mul(2).and_then(|e| e.checked_add(4)) {
            Some(e) if e.checked_add(2).is_some_and(|end| end <= t.vtable_len) => e,
            _ => return Ok(None),
        };
        let off = self.u16_at(t.vtable.saturating_add(entry), "vtable entry")? as usize;
        if off == 0 {
            return Ok(None);
        }
        if !matches!(off.checked_add(size), Some(end) if end <= t.object_len) {
            return Err(self.error(format_args!(
                "field '{name}' at offset {off} (+{size} bytes) exceeds the table's size {} \
                 (table at {:#x})",
                t.object_len,
                self.file_offset(t.pos)
            )));
        }
        // t.pos + object_len was checked in table_at. Scalars and offsets
        // sit at their natural alignment (structs at 4).
        let align = if size.is_power_of_two() {
            size.min(8)
        } else {
            WORD
        };
        self.aligned(t.pos + off, align, name)?;
        Ok(Some(t.pos + off))
    }

    /// Whether field `id` is present.
    pub fn has(&self, t: &Table, id: usize, size: usize, name: &str) -> Result<bool> {
        Ok(self.field(t, id, size, name)?.is_some())
    }

    /// Scalar `u8` field.
    pub fn u8_field(&self, t: &Table, id: usize, name: &str, default: u8) -> Result<u8> {
        match self.field(t, id, 1, name)? {
            Some(p) => self.u8_at(p, name),
            None => Ok(default),
        }
    }
    /// Scalar `u32` field.
    pub fn u32_field(&self, t: &Table, id: usize, name: &str, default: u32) -> Result<u32> {
        match self.field(t, id, 4, name)? {
            Some(p) => self.u32_at(p, name),
            None => Ok(default),
        }
    }
    /// Scalar `i32` field.
    pub fn i32_field(&self, t: &Table, id: usize, name: &str, default: i32) -> Result<i32> {
        match self.field(t, id, 4, name)? {
            Some(p) => self.i32_at(p, name),
            None => Ok(default),
        }
    }
    /// Scalar `u64` field.
    pub fn u64_field(&self, t: &Table, id: usize, name: &str, default: u64) -> Result<u64> {
        match self.field(t, id, 8, name)? {
            Some(p) => self.u64_at(p, name),
            None => Ok(default),
        }
    }

    /// Sub-table field.
    pub fn table_field(&self, t: &Table, id: usize, name: &str) -> Result<Option<Table>> {
        match self.field(t, id, WORD, name)? {
            Some(p) => {
                let target = self.deref(p, name)?;
                Ok(Some(self.table_at(target)?))
            }
            None => Ok(None),
        }
    }

    /// The string at `pos` (length prefix, UTF-8 bytes, NUL terminator).
    pub fn string_at(&self, pos: usize, what: &str) -> Result<&'a str> {
        self.aligned(pos, WORD, what)?;
        let len = self.u32_at(pos, what)? as usize;
        let start = pos.saturating_add(WORD);
        let with_nul = len.saturating_add(1);
        self.need(start, with_nul, what)?;
        // Both in range: checked by `need` above.
        let bytes = self.buf.get(start..start + len).unwrap_or_default();
        if self.buf.get(start + len) != Some(&0) {
            return Err(self.error(format_args!(
                "string '{what}' at offset {:#x} is not NUL-terminated",
                self.file_offset(pos)
            )));
        }
        std::str::from_utf8(bytes).map_err(|e| {
            self.error(format_args!(
                "string '{what}' at offset {:#x} is not valid UTF-8 (bad byte at offset {:#x})",
                self.file_offset(pos),
                self.file_offset(start.saturating_add(e.valid_up_to()))
            ))
        })
    }

    /// String field.
    pub fn string_field(&self, t: &Table, id: usize, name: &str) -> Result<Option<&'a str>> {
        match self.field(t, id, WORD, name)? {
            Some(p) => {
                let target = self.deref(p, name)?;
                Ok(Some(self.string_at(target, name)?))
            }
            None => Ok(None),
        }
    }

    /// String field decoded into an owned `String` (charged to the budget).
    pub fn owned_string_field(
        &mut self,
        t: &Table,
        id: usize,
        name: &str,
    ) -> Result<Option<String>> {
        match self.string_field(t, id, name)? {
            Some(s) => {
                self.charge(s.len().saturating_add(16))?;
                Ok(Some(s.to_owned()))
            }
            None => Ok(None),
        }
    }

    /// The vector at `pos` whose elements are `elem` bytes each.
    pub fn vector_at(&self, pos: usize, elem: usize, what: &str) -> Result<Vector> {
        // Elements of the vectors this schema has are at most 4-aligned,
        // which a 4-aligned header gives them.
        self.aligned(pos, WORD, what)?;
        let len = self.u32_at(pos, what)? as usize;
        let start = pos.saturating_add(WORD);
        let bytes = len.saturating_mul(elem);
        self.need(start, bytes, what)?;
        Ok(Vector { start, len, elem })
    }

    /// Vector field.
    pub fn vector_field(
        &self,
        t: &Table,
        id: usize,
        elem: usize,
        name: &str,
    ) -> Result<Option<Vector>> {
        match self.field(t, id, WORD, name)? {
            Some(p) => {
                let target = self.deref(p, name)?;
                Ok(Some(self.vector_at(target, elem, name)?))
            }
            None => Ok(None),
        }
    }

    /// Element `i` of a vector of scalars or structs: its position.
    pub fn elem(&self, v: &Vector, i: usize) -> Result<usize> {
        v.elem_pos(i)
            .ok_or_else(|| self.error(format_args!("vector index {i} out of range ({})", v.len)))
    }

    /// Element `i` of a vector of tables.
    pub fn table_elem(&self, v: &Vector, i: usize) -> Result<Table> {
        let p = self.elem(v, i)?;
        let target = self.deref(p, "vector element")?;
        self.table_at(target)
    }

    /// The bytes of a `[ubyte]` vector.
    #[cfg(test)]
    pub fn byte_slice(&self, v: &Vector) -> &'a [u8] {
        // In range: checked when the vector was decoded.
        self.buf
            .get(v.start..v.start.saturating_add(v.byte_len()))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built buffer: root table with a u32 field, a string and a vector.
    fn sample() -> Vec<u8> {
        let mut b = vec![0u8; 64];
        // root uoffset -> table at 16
        b[0..4].copy_from_slice(&16u32.to_le_bytes());
        // vtable at 4: len 10, obj 16, fields: 4, 8, 12
        b[4..6].copy_from_slice(&10u16.to_le_bytes());
        b[6..8].copy_from_slice(&16u16.to_le_bytes());
        b[8..10].copy_from_slice(&4u16.to_le_bytes());
        b[10..12].copy_from_slice(&8u16.to_le_bytes());
        b[12..14].copy_from_slice(&12u16.to_le_bytes());
        // table at 16: soffset = 16 - 4 = 12
        b[16..20].copy_from_slice(&12i32.to_le_bytes());
        b[20..24].copy_from_slice(&7u32.to_le_bytes());
        // string at 32: offset from 24 = 8
        b[24..28].copy_from_slice(&8u32.to_le_bytes());
        // vector at 40: offset from 28 = 12
        b[28..32].copy_from_slice(&12u32.to_le_bytes());
        b[32..36].copy_from_slice(&2u32.to_le_bytes());
        b[36..39].copy_from_slice(b"hi\0");
        b[40..44].copy_from_slice(&3u32.to_le_bytes());
        b[44..47].copy_from_slice(&[1, 2, 3]);
        b
    }

    #[test]
    fn reads_fields() {
        let b = sample();
        let r = Reader::new(&b, 0, 1 << 20);
        let root = r.deref(0, "root").unwrap();
        let t = r.table_at(root).unwrap();
        assert_eq!(r.u32_field(&t, 0, "x", 0).unwrap(), 7);
        assert_eq!(r.string_field(&t, 1, "s").unwrap(), Some("hi"));
        let v = r.vector_field(&t, 2, 1, "v").unwrap().unwrap();
        assert_eq!(r.byte_slice(&v), &[1, 2, 3]);
        assert_eq!(r.u32_field(&t, 9, "absent", 5).unwrap(), 5);
    }

    #[test]
    fn rejects_bad_ranges() {
        let mut b = sample();
        b[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
        let r = Reader::new(&b, 0, 1 << 20);
        let t = r.table_at(16).unwrap();
        let e = r.string_field(&t, 1, "s").unwrap_err();
        assert!(e.message().contains("truncated"), "{}", e.message());
        let mut b = sample();
        b[36] = 0xff;
        let r = Reader::new(&b, 0, 1 << 20);
        let t = r.table_at(16).unwrap();
        let e = r.string_field(&t, 1, "s").unwrap_err();
        assert!(e.message().contains("UTF-8"), "{}", e.message());
        let mut b = sample();
        b[16..20].copy_from_slice(&i32::MIN.to_le_bytes());
        let r = Reader::new(&b, 0, 1 << 20);
        assert!(r.table_at(16).is_err());
        b[60..64].copy_from_slice(&4u32.to_le_bytes());
        let r = Reader::new(&b, 0, 1 << 20);
        assert!(r.deref(60, "x").is_err());
        assert!(r.deref(62, "x").is_err());
    }

    #[test]
    fn budget() {
        let b = sample();
        let mut r = Reader::new(&b, 0, 10);
        assert!(r.charge(8).is_ok());
        assert!(r.charge(8).is_err());
    }
}
