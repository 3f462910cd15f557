//! A bounds-checked reader for the few flatbuffer shapes the CUDA
//! executable format uses (tables, strings, vectors of tables and of
//! scalars, inline structs). Every offset is checked against the buffer:
//! malformed input is an error naming the field, never a panic.

use ferrite_base::{bail, Result};

/// A flatbuffer (without the file header).
#[derive(Clone, Copy)]
pub struct Fb<'a> {
    buf: &'a [u8],
}

/// A table: its position and its vtable's.
#[derive(Clone, Copy)]
pub struct Table {
    pos: usize,
    vtable: usize,
    vtable_len: usize,
}

impl<'a> Fb<'a> {
    /// Wraps `buf`.
    pub fn new(buf: &'a [u8]) -> Fb<'a> {
        Fb { buf }
    }

    fn bytes(&self, pos: usize, n: usize, what: &str) -> Result<&'a [u8]> {
        match pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => Ok(&self.buf[pos..end]),
            _ => bail!(
                InvalidArgument,
                "executable flatbuffer: {what} at offset {pos} (+{n}) is outside its {} bytes",
                self.buf.len()
            ),
        }
    }

    /// The u32 at `pos`.
    pub fn u32_at(&self, pos: usize, what: &str) -> Result<u32> {
        let b = self.bytes(pos, 4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u16_at(&self, pos: usize, what: &str) -> Result<u16> {
        let b = self.bytes(pos, 2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    /// The root table (uoffset at 0).
    pub fn root(&self) -> Result<Table> {
        let off = self.u32_at(0, "root offset")? as usize;
        self.table_at(off, "root table")
    }

    /// The table at `pos`.
    pub fn table_at(&self, pos: usize, what: &str) -> Result<Table> {
        let soff = self.u32_at(pos, what)? as i32 as i64;
        let vtable = pos as i64 - soff;
        if vtable < 0 {
            bail!(
                InvalidArgument,
                "executable flatbuffer: {what} has a vtable before the buffer"
            );
        }
        let vtable = vtable as usize;
        let vtable_len = self.u16_at(vtable, what)? as usize;
        self.bytes(vtable, vtable_len, what)?;
        Ok(Table {
            pos,
            vtable,
            vtable_len,
        })
    }

    /// The absolute position of field `id` of `t`, if present.
    pub fn field(&self, t: &Table, id: usize, what: &str) -> Result<Option<usize>> {
        let slot = 4 + 2 * id;
        if slot + 2 > t.vtable_len {
            return Ok(None);
        }
        let off = self.u16_at(t.vtable + slot, what)? as usize;
        Ok((off != 0).then_some(t.pos + off))
    }

    /// Follows the uoffset stored at `pos`.
    fn deref(&self, pos: usize, what: &str) -> Result<usize> {
        let off = self.u32_at(pos, what)? as usize;
        match pos.checked_add(off) {
            Some(p) if p < self.buf.len() => Ok(p),
            _ => bail!(
                InvalidArgument,
                "executable flatbuffer: {what} points outside the buffer"
            ),
        }
    }

    /// A table field (which must be present).
    pub fn table_field(&self, t: &Table, id: usize, what: &str) -> Result<Table> {
        let Some(p) = self.field(t, id, what)? else {
            bail!(InvalidArgument, "executable flatbuffer: {what} is missing");
        };
        let pos = self.deref(p, what)?;
        self.table_at(pos, what)
    }

    /// A u32 field (default when absent).
    pub fn u32_field(&self, t: &Table, id: usize, what: &str, default: u32) -> Result<u32> {
        match self.field(t, id, what)? {
            Some(p) => self.u32_at(p, what),
            None => Ok(default),
        }
    }

    /// A string field.
    pub fn str_field(&self, t: &Table, id: usize, what: &str) -> Result<Option<&'a [u8]>> {
        let Some(p) = self.field(t, id, what)? else {
            return Ok(None);
        };
        let s = self.deref(p, what)?;
        let len = self.u32_at(s, what)? as usize;
        Ok(Some(self.bytes(s + 4, len, what)?))
    }

    /// A vector field: (first element position, count).
    pub fn vec_field(
        &self,
        t: &Table,
        id: usize,
        elem: usize,
        what: &str,
    ) -> Result<(usize, usize)> {
        let Some(p) = self.field(t, id, what)? else {
            return Ok((0, 0));
        };
        let v = self.deref(p, what)?;
        let n = self.u32_at(v, what)? as usize;
        let bytes = n.saturating_mul(elem);
        self.bytes(v + 4, bytes, what)?;
        Ok((v + 4, n))
    }

    /// Element `i` of a vector of tables starting at `start`.
    pub fn table_elem(&self, start: usize, i: usize, what: &str) -> Result<Table> {
        let p = start + 4 * i;
        let t = self.deref(p, what)?;
        self.table_at(t, what)
    }

    /// The inline struct field's bytes.
    pub fn struct_field(
        &self,
        t: &Table,
        id: usize,
        size: usize,
        what: &str,
    ) -> Result<Option<&'a [u8]>> {
        match self.field(t, id, what)? {
            Some(p) => Ok(Some(self.bytes(p, size, what)?)),
            None => Ok(None),
        }
    }
}
