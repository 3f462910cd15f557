//! [`ModuleBytes`]: the immutable bytes of a module, shared without copying.
//!
//! A loaded module keeps its `.vmfb` bytes alive for as long as any part of it
//! (bytecode, rodata buffers, debug info) is in use. `ModuleBytes` is the one
//! holder for those bytes: it is cheap to clone (an `Arc` inside) and can be
//! backed by an owned vector, by static data compiled into the binary, or by a
//! private (copy-on-write) memory map of a file.
//!
//! Why copy-on-write: a program may bind its own rodata to a kernel that
//! writes it in place (the compiler imports `util.unfoldable_constant`
//! storage from rodata and dispatches write into it). A read-only mapping
//! would make that store fault; a private mapping keeps untouched pages
//! shared with the page cache (no copy, no extra memory) and gives a written
//! page a private copy, so the write never reaches the file and never
//! faults, exactly as when the module is read into memory (`preload`).

use std::fmt;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use ferrite_base::{Result, Status, StatusCode};
use memmap2::{MmapMut, MmapOptions};

/// Immutable, cheaply clonable bytes of a module.
///
/// Cloning shares the underlying storage; the bytes are never copied or
/// mutated by Ferrite.
#[derive(Clone)]
pub struct ModuleBytes {
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    Owned(Arc<[u8]>),
    Static(&'static [u8]),
    Mapped(Arc<MmapMut>),
}

impl ModuleBytes {
    /// Takes ownership of `bytes`.
    pub fn from_vec(bytes: Vec<u8>) -> ModuleBytes {
        ModuleBytes {
            repr: Repr::Owned(Arc::from(bytes)),
        }
    }

    /// Wraps static data (e.g. `include_bytes!`) without copying it.
    pub fn from_static(bytes: &'static [u8]) -> ModuleBytes {
        ModuleBytes {
            repr: Repr::Static(bytes),
        }
    }

    /// Reads the whole file at `path` into memory.
    pub fn read_file(path: impl AsRef<Path>) -> Result<ModuleBytes> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| io_status(path, &e))?;
        Ok(ModuleBytes::from_vec(bytes))
    }

    /// Memory-maps the file at `path` privately (copy-on-write; see the
    /// module documentation): Ferrite reads it, and only a program's own
    /// kernels may write the pages of constants it binds in place.
    ///
    /// The file must not be modified (or truncated) while any clone of the
    /// returned value is alive: as with upstream's mapped modules, changing a
    /// mapped module underneath a running program is the caller's
    /// responsibility and its effect is unspecified. An empty file yields an
    /// empty (unmapped) value.
    pub fn map_file(path: impl AsRef<Path>) -> Result<ModuleBytes> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| io_status(path, &e))?;
        let len = file.metadata().map_err(|e| io_status(path, &e))?.len();
        if len == 0 {
            return Ok(ModuleBytes::from_static(&[]));
        }
        // SAFETY: mapping a file is unsafe because another process could
        // modify or truncate it while it is mapped; Ferrite treats the file
        // as immutable for the lifetime of the mapping and documents (on this
        // function) that changing it underneath is the caller's problem,
        // exactly as upstream does for its mapped modules. The mapping is
        // private, so nothing written to it reaches the file.
        let map = unsafe { MmapOptions::new().map_copy(&file) }.map_err(|e| io_status(path, &e))?;
        Ok(ModuleBytes {
            repr: Repr::Mapped(Arc::new(map)),
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.repr {
            Repr::Owned(b) => b,
            Repr::Static(b) => b,
            Repr::Mapped(m) => m,
        }
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the bytes are a memory map of a file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.repr, Repr::Mapped(_))
    }
}

fn io_status(path: &Path, e: &std::io::Error) -> Status {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => StatusCode::NotFound,
        std::io::ErrorKind::PermissionDenied => StatusCode::PermissionDenied,
        _ => StatusCode::Unavailable,
    };
    Status::new(code, format!("reading module '{}': {e}", path.display()))
}

impl fmt::Debug for ModuleBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.repr {
            Repr::Owned(_) => "owned",
            Repr::Static(_) => "static",
            Repr::Mapped(_) => "mapped",
        };
        f.debug_struct("ModuleBytes")
            .field("kind", &kind)
            .field("len", &self.len())
            .finish()
    }
}

impl AsRef<[u8]> for ModuleBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::Deref for ModuleBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl From<Vec<u8>> for ModuleBytes {
    fn from(bytes: Vec<u8>) -> ModuleBytes {
        ModuleBytes::from_vec(bytes)
    }
}

impl From<&'static [u8]> for ModuleBytes {
    fn from(bytes: &'static [u8]) -> ModuleBytes {
        ModuleBytes::from_static(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_storage() {
        let a = ModuleBytes::from_vec(vec![1, 2, 3]);
        let b = a.clone();
        assert_eq!(a.as_slice().as_ptr(), b.as_slice().as_ptr());
        assert_eq!(b.len(), 3);
        assert!(format!("{a:?}").contains("owned"));
    }

    #[test]
    fn static_and_mapped() {
        static DATA: [u8; 4] = *b"IREE";
        let s = ModuleBytes::from_static(&DATA);
        assert_eq!(s.as_slice(), b"IREE");
        let dir = std::env::temp_dir().join(format!("ferrite-bytes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.bin");
        std::fs::write(&p, b"hello").unwrap();
        let m = ModuleBytes::map_file(&p).unwrap();
        assert!(m.is_mapped());
        assert_eq!(m.as_slice(), b"hello");
        let e = dir.join("empty.bin");
        std::fs::write(&e, b"").unwrap();
        assert!(ModuleBytes::map_file(&e).unwrap().is_empty());
        let err = ModuleBytes::map_file(dir.join("missing")).unwrap_err();
        assert_eq!(err.code(), StatusCode::NotFound);
        std::fs::remove_dir_all(&dir).ok();
    }
}
