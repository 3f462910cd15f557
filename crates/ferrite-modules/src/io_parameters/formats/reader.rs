//! The bounds-checked reader every binary format parser shares (its own
//! file so the parsers name it without naming the format dispatcher).

use ferrite_base::{bail, Result};

/// A bounds-checked little-endian reader over file bytes that knows its
/// absolute offset, so errors can say where the file went wrong.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    format: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], pos: u64, format: &'static str) -> Reader<'a> {
        Reader {
            bytes,
            pos: usize::try_from(pos).unwrap_or(usize::MAX),
            format,
        }
    }

    /// The absolute offset of the next read.
    pub(crate) fn offset(&self) -> u64 {
        self.pos as u64
    }

    /// The next `n` bytes, named `what` in errors.
    pub(crate) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let size = self.bytes.len() as u64;
        let start = self.pos as u64;
        match start.checked_add(n) {
            Some(end) if end <= size => {
                let s = &self.bytes[start as usize..end as usize];
                self.pos = end as usize;
                Ok(s)
            }
            _ => bail!(
                OutOfRange,
                "{} file truncated: {what} needs {n} bytes at offset {start} but the file has {size} bytes",
                self.format
            ),
        }
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &str) -> Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}
