//! File handles: the bytes a parameter index points into.
//!
//! A handle is either read-only shared bytes (a memory map of a file opened
//! for reading, or host memory such as a Python `bytes`) or writable memory
//! that `scatter` may store into. Read-only handles hand out stable slices,
//! so devices that can use host memory import parameters from them without
//! copying.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use ferrite_base::{bail, status, Result};
use parking_lot::RwLock;

/// Read-only bytes whose address never changes while they live.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Bytes a handle owns and `scatter` may store into: host memory, a shared
/// writable map of a file, or memory lent by another language.
pub trait WritableBytes: Send + Sync {
    /// All the bytes.
    fn bytes(&self) -> &[u8];
    /// All the bytes, for writing.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl WritableBytes for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// A whole file mapped shared and writable: stores reach the file.
struct MappedFileMut(Option<memmap2::MmapMut>);

impl WritableBytes for MappedFileMut {
    fn bytes(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or(&mut [])
    }
}

enum Contents {
    ReadOnly(SharedBytes),
    Writable(RwLock<Box<dyn WritableBytes>>),
}

/// A file (or host memory treated as one) that parameters are stored in.
/// Clones share the same bytes.
#[derive(Clone)]
pub struct FileHandle {
    contents: Arc<Contents>,
    /// The file behind a read-only map: copies read it rather than the map
    /// (see [`FileHandle::copy_out`]).
    file: Option<Arc<File>>,
    name: Arc<str>,
}

impl std::fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileHandle({}, {} bytes)", self.name, self.len())
    }
}

/// The private (copy-on-write) memory map of a whole file; an empty file
/// maps to no bytes (mapping zero bytes is an error on most systems).
/// Private and writable because parameters are imported as program
/// constants, which a program's kernels may write in place
/// (`HostMemory::program_constant`): a written page becomes a private copy,
/// never a fault and never a change to the file.
struct MappedFile(Option<memmap2::MmapMut>);

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl FileHandle {
    /// Maps the file at `path` read-only. The bytes are not read until used.
    pub fn open(path: impl AsRef<Path>) -> Result<FileHandle> {
        let path = path.as_ref();
        let file = File::open(path)
            .map_err(|e| status!(NotFound, "opening parameter file '{}': {e}", path.display()))?;
        ferrite_base::trace::timed(
            "load",
            |_| (format!("map parameter file {}", path.display()), Vec::new()),
            || FileHandle::map(&file, &path.display().to_string()),
        )
    }

    /// Maps an open file read-only; `name` says what it is in messages.
    pub fn map(file: &File, name: &str) -> Result<FileHandle> {
        let map = map_nonempty(file, name, |file| {
            // SAFETY: the map is private to this process (copy-on-write). Like
            // every runtime that maps weights, we rely on the file not being
            // truncated or rewritten by another process while it is mapped
            // (the same contract upstream's mmap-backed file handles have).
            unsafe { memmap2::MmapOptions::new().map_copy(file) }
        })?;
        // A second descriptor of the same open file (for `copy_out`); when
        // the system has none to spare, copies read through the map.
        let file = file.try_clone().ok().map(Arc::new);
        Ok(FileHandle {
            contents: Arc::new(Contents::ReadOnly(Arc::new(MappedFile(map)))),
            file,
            name: name.into(),
        })
    }

    /// Opens the file at `path` for reading and writing and maps it shared:
    /// parameters scattered into the handle are stored in the file.
    pub fn open_writable(path: impl AsRef<Path>) -> Result<FileHandle> {
        let path = path.as_ref();
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| {
                status!(
                    NotFound,
                    "opening parameter file '{}' for writing: {e}",
                    path.display()
                )
            })?;
        FileHandle::map_writable(&file, &path.display().to_string())
    }

    /// Maps an open file shared and writable (it must be open for reading
    /// and writing); `name` says what it is in messages.
    pub fn map_writable(file: &File, name: &str) -> Result<FileHandle> {
        let map = map_nonempty(file, name, |file| {
            // SAFETY: a shared map of a file this process opened for writing.
            // As with read-only maps, we rely on no other process truncating
            // the file while it is mapped; reads and writes through the map
            // are serialized by the handle's lock.
            unsafe { memmap2::MmapMut::map_mut(file) }
        })?;
        Ok(FileHandle::from_writable_bytes(
            Box::new(MappedFileMut(map)),
            name,
        ))
    }

    /// Reads the whole file at `path` into memory (upstream's `preload`
    /// parameter mode): later accesses never touch the file.
    pub fn preload(path: impl AsRef<Path>) -> Result<FileHandle> {
        let path = path.as_ref();
        let bytes = ferrite_base::trace::timed(
            "load",
            |_| {
                (
                    format!("read parameter file {}", path.display()),
                    Vec::new(),
                )
            },
            || std::fs::read(path),
        )
        .map_err(|e| status!(NotFound, "reading parameter file '{}': {e}", path.display()))?;
        Ok(FileHandle::from_shared(
            Arc::new(bytes),
            &path.display().to_string(),
        ))
    }

    /// Wraps read-only host memory without copying it.
    pub fn from_shared(bytes: SharedBytes, name: &str) -> FileHandle {
        FileHandle {
            contents: Arc::new(Contents::ReadOnly(bytes)),
            file: None,
            name: name.into(),
        }
    }

    /// Takes ownership of writable host memory (a target for `scatter`).
    pub fn from_writable(bytes: Vec<u8>, name: &str) -> FileHandle {
        FileHandle::from_writable_bytes(Box::new(bytes.into_boxed_slice()), name)
    }

    /// Wraps writable bytes of any kind (a target for `scatter`).
    pub fn from_writable_bytes(bytes: Box<dyn WritableBytes>, name: &str) -> FileHandle {
        FileHandle {
            contents: Arc::new(Contents::Writable(RwLock::new(bytes))),
            file: None,
            name: name.into(),
        }
    }

    /// What the handle was made from (a path or a description), for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.with_bytes(|b| b.len() as u64)
    }

    /// True when the handle holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when `scatter` may write into the handle.
    pub fn is_writable(&self) -> bool {
        matches!(*self.contents, Contents::Writable(_))
    }

    /// The shared bytes of a read-only handle (None for writable ones, whose
    /// bytes may change and so cannot be imported without a copy).
    pub fn shared_bytes(&self) -> Option<SharedBytes> {
        match &*self.contents {
            Contents::ReadOnly(b) => Some(b.clone()),
            Contents::Writable(_) => None,
        }
    }

    /// Runs `f` over all the bytes.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match &*self.contents {
            Contents::ReadOnly(b) => f((**b).as_ref()),
            Contents::Writable(m) => f(m.read().bytes()),
        }
    }

    /// Runs `f` over `length` bytes at `offset`, after checking the range.
    pub fn with_range<R>(&self, offset: u64, length: u64, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        self.with_bytes(|b| {
            let r = checked_range(b.len(), offset, length, &self.name)?;
            Ok(f(&b[r]))
        })
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`, after checking the
    /// range. A handle that maps a file reads them from the file (`pread`)
    /// rather than through the map, so copying a file's parameters into
    /// device buffers does not also make the file resident in this process:
    /// peak memory is the copies, not the copies plus the map.
    pub fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let length = dst.len() as u64;
        self.with_range(offset, length, |_| ())?;
        match &self.file {
            Some(file) => {
                std::os::unix::fs::FileExt::read_exact_at(&**file, dst, offset).map_err(|e| {
                    status!(
                        Unavailable,
                        "reading {length} bytes at offset {offset} of '{}': {e}",
                        self.name
                    )
                })
            }
            None => self.with_range(offset, length, |b| dst.copy_from_slice(b)),
        }
    }

    /// A read-only copy of `length` bytes at `offset`, at a page-aligned
    /// address, that reads each chunk from the file on first access (see
    /// [`super::demand_paged`]): only the parts a program touches become
    /// resident. None for handles that do not map a file opened read-only,
    /// for ranges outside the file, and where the system offers no
    /// `userfaultfd` (callers then copy).
    pub fn demand_paged_copy(&self, offset: u64, length: u64) -> Option<SharedBytes> {
        #[cfg(target_os = "linux")]
        {
            let file = self.file.as_ref()?;
            self.with_range(offset, length, |_| ()).ok()?;
            let copy = super::demand_paged::DemandPaged::new(
                file,
                offset,
                usize::try_from(length).ok()?,
                &self.name,
            )?;
            Some(Arc::new(copy))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (offset, length);
            None
        }
    }

    /// Copies `data` into the handle at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        match &*self.contents {
            Contents::ReadOnly(_) => bail!(
                PermissionDenied,
                "file '{}' is read-only; parameters cannot be written to it",
                self.name
            ),
            Contents::Writable(m) => {
                let mut m = m.write();
                let bytes = m.bytes_mut();
                let r = checked_range(bytes.len(), offset, data.len() as u64, &self.name)?;
                bytes[r].copy_from_slice(data);
                Ok(())
            }
        }
    }
}

/// Maps `file` with `map`, or nothing for an empty file (mapping zero bytes
/// is an error on most systems); errors name the file.
fn map_nonempty<M>(
    file: &File,
    name: &str,
    map: impl FnOnce(&File) -> std::io::Result<M>,
) -> Result<Option<M>> {
    let len = file
        .metadata()
        .map_err(|e| status!(Unavailable, "reading '{name}' metadata: {e}"))?
        .len();
    if len == 0 {
        return Ok(None);
    }
    map(file)
        .map(Some)
        .map_err(|e| status!(Unavailable, "mapping '{name}': {e}"))
}

fn checked_range(
    size: usize,
    offset: u64,
    length: u64,
    name: &str,
) -> Result<std::ops::Range<usize>> {
    match offset.checked_add(length) {
        Some(end) if end <= size as u64 => Ok(offset as usize..end as usize),
        _ => bail!(
            OutOfRange,
            "range {offset}+{length} is outside file '{name}' of {size} bytes"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_into_reads_the_file_for_mapped_handles_and_the_bytes_otherwise() {
        let dir = std::env::temp_dir().join(format!("ferrite-fh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.bin");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let mapped = FileHandle::open(&path).unwrap();
        assert!(mapped.file.is_some());
        let memory = FileHandle::from_shared(Arc::new(data.clone()), "memory");
        for h in [&mapped, &memory] {
            let mut out = vec![0u8; 4099];
            h.read_into(13, &mut out).unwrap();
            assert_eq!(out, data[13..13 + 4099]);
            let err = h.read_into(9_000, &mut out).unwrap_err();
            assert!(err.to_string().contains("outside file"), "{err}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
