//! Parameter providers: serve `load`, `gather` and `scatter` requests for
//! one scope from a parameter index, as work on a HAL device queue.
//!
//! `load` makes one buffer per parameter. When the bytes sit in read-only
//! host memory (a memory-mapped file), the program promised not to write
//! the buffer (`SHARING_IMMUTABLE` usage) and the bytes are aligned as
//! kernels expect, the device's allocator imports them without a copy.
//! When they sit misaligned in a mapped file (safetensors tensors usually
//! do), an aligned copy filled from the file on first access is imported
//! instead ([`super::demand_paged`], at least [`DEMAND_PAGED_MIN`] bytes),
//! so the parts a program never reads are never resident. Otherwise a
//! buffer is allocated and the bytes are copied into it on the queue. `gather` copies parameters into one existing buffer; `scatter`
//! writes ranges of a buffer back into writable parameter storage.

use std::sync::Arc;

use ferrite_base::{bail, Result};
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::{Buffer, HostMemory};
use ferrite_hal::device::Device;
use ferrite_hal::{BufferUsage, Fence};

use super::file_handle::{FileHandle, SharedBytes};
use super::index::{Entry, ParameterIndex, Storage};

/// Alignment the bytes of an imported parameter must have: CPU kernels
/// assume their bindings are 64-byte aligned.
pub const IMPORT_ALIGNMENT: usize = 64;

/// Misaligned immutable parameters of at least this many bytes are
/// demand-paged copies; smaller ones are copied at load (a fault costs more
/// than copying a few pages).
pub const DEMAND_PAGED_MIN: u64 = 64 * 1024;

/// One parameter range of a request: `length` bytes at `parameter_offset`
/// within parameter `key`, to or from `buffer_offset` of a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// The parameter's key within the scope.
    pub key: String,
    /// Byte offset within the parameter.
    pub parameter_offset: u64,
    /// Byte offset within the buffer.
    pub buffer_offset: u64,
    /// Bytes to transfer.
    pub length: u64,
}

/// Serves the parameters of one scope from an index. Clones share the index.
#[derive(Clone, Debug)]
pub struct ParameterProvider {
    scope: String,
    index: Arc<ParameterIndex>,
}

/// A sub-range of shared read-only bytes, itself shareable as host memory.
struct SharedRange {
    bytes: SharedBytes,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for SharedRange {
    fn as_ref(&self) -> &[u8] {
        &(*self.bytes).as_ref()[self.start..self.end]
    }
}

/// One queued transfer of a request.
enum Transfer {
    Fill {
        target: Buffer,
        offset: u64,
        length: u64,
        pattern: Vec<u8>,
    },
    Read {
        entry: Entry,
        from: u64,
        target: Buffer,
        offset: u64,
        length: u64,
    },
    Write {
        source: Buffer,
        offset: u64,
        entry: Entry,
        to: u64,
        length: u64,
    },
}

impl Transfer {
    fn run(self) -> Result<()> {
        match self {
            Transfer::Fill {
                target,
                offset,
                length,
                pattern,
            } => fill(&target, offset, length, &pattern),
            Transfer::Read {
                entry,
                from,
                target,
                offset,
                length,
            } => {
                let (handle, base) = file_storage(&entry, "read")?;
                // Queue work: written as device work (`device_write`), never
                // through a host mapping, which device work submitted after
                // this load (and waiting for it) would refuse. Read through a
                // bounded host buffer rather than staging the whole range, so
                // a model's weights never sit in host memory all at once.
                const CHUNK: u64 = 8 << 20;
                let mut chunk = vec![0u8; length.min(CHUNK) as usize];
                let mut done = 0u64;
                while done < length {
                    let n = (length - done).min(CHUNK) as usize;
                    handle.read_into(base + from + done, &mut chunk[..n])?;
                    target.device_write(offset + done, &chunk[..n])?;
                    done += n as u64;
                }
                Ok(())
            }
            Transfer::Write {
                source,
                offset,
                entry,
                to,
                length,
            } => {
                let (handle, base) = file_storage(&entry, "write")?;
                let mut data = vec![0u8; length as usize];
                source.device_read(offset, &mut data)?;
                handle.write(base + to, &data)
            }
        }
    }
}

/// The file and offset holding `entry`'s bytes, for a transfer that must
/// `verb` (read, write) them there: FAILED_PRECONDITION for a splat.
fn file_storage<'e>(entry: &'e Entry, verb: &str) -> Result<(&'e FileHandle, u64)> {
    match &entry.storage {
        Storage::File { handle, offset } => Ok((handle, *offset)),
        _ => bail!(
            FailedPrecondition,
            "parameter '{}' has no file storage to {verb}",
            entry.key
        ),
    }
}

/// Fills with a pattern of any of the splat sizes (buffers fill with at
/// most 8 bytes; 16-byte patterns are written as repeated chunks).
fn fill(target: &Buffer, offset: u64, length: u64, pattern: &[u8]) -> Result<()> {
    if pattern.len() <= 8 {
        return target.device_fill(offset, length, pattern);
    }
    const CHUNK: usize = 64 * 1024;
    let chunk: Vec<u8> = pattern
        .iter()
        .copied()
        .cycle()
        .take(CHUNK.min(length as usize))
        .collect();
    let mut done = 0u64;
    while done < length {
        let n = (length - done).min(chunk.len() as u64);
        target.device_write(offset + done, &chunk[..n as usize])?;
        done += n;
    }
    Ok(())
}

impl ParameterProvider {
    /// A provider answering for `scope` (may be empty) from `index`.
    pub fn new(scope: &str, index: ParameterIndex) -> ParameterProvider {
        ParameterProvider {
            scope: scope.to_string(),
            index: Arc::new(index),
        }
    }

    /// The scope this provider answers for.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The index it serves.
    pub fn index(&self) -> &ParameterIndex {
        &self.index
    }

    /// True when requests for `scope` go to this provider.
    pub fn supports(&self, scope: &str) -> bool {
        self.scope == scope
    }

    /// Looks up a span's parameter and checks the range and access.
    fn resolve(&self, span: &Span, write: bool) -> Result<&Entry> {
        let entry = self.index.lookup(&span.key)?;
        let writable =
            matches!(&entry.storage, Storage::File { handle, .. } if handle.is_writable());
        if write && !writable {
            bail!(
                PermissionDenied,
                "parameter `{}` storage does not support the requested access type; parameter allows READ, operation requires WRITE",
                span.key
            );
        }
        if span
            .parameter_offset
            .checked_add(span.length)
            .is_none_or(|e| e > entry.length)
        {
            bail!(
                OutOfRange,
                "parameter `{}` range out of bounds (offset={}, length={}, size={})",
                span.key,
                span.parameter_offset,
                span.length,
                entry.length
            );
        }
        Ok(entry)
    }

    fn read_transfer(entry: &Entry, span: &Span, target: Buffer) -> Result<Transfer> {
        target.resolve_range(span.buffer_offset, span.length)?;
        Ok(match &entry.storage {
            Storage::Splat { pattern } => Transfer::Fill {
                target,
                offset: span.buffer_offset,
                length: span.length,
                pattern: pattern.clone(),
            },
            Storage::File { .. } => Transfer::Read {
                entry: entry.clone(),
                from: span.parameter_offset,
                target,
                offset: span.buffer_offset,
                length: span.length,
            },
        })
    }

    /// Tries to wrap a parameter's mapped bytes as a buffer without a copy
    /// (or, when they are misaligned, a demand-paged copy of them).
    fn try_import(
        device: &Arc<dyn Device>,
        params: &BufferParams,
        entry: &Entry,
        span: &Span,
    ) -> Option<Buffer> {
        let Storage::File { handle, offset } = &entry.storage else {
            return None;
        };
        if span.buffer_offset != 0 || !params.usage.contains(BufferUsage::SHARING_IMMUTABLE) {
            return None;
        }
        if device.allocator().import_copies(params, span.length, false) {
            // The device would copy the mapped bytes (a GPU's device-local
            // memory): reading the file in bounded chunks instead keeps the
            // mapping untouched, so the weights never count in host RSS.
            return None;
        }
        let bytes = handle.shared_bytes()?;
        let start = usize::try_from(offset + span.parameter_offset).ok()?;
        let end = start.checked_add(usize::try_from(span.length).ok()?)?;
        let all = (*bytes).as_ref();
        if end > all.len() {
            return None;
        }
        let shared: SharedBytes =
            if (all.as_ptr() as usize + start).is_multiple_of(IMPORT_ALIGNMENT) {
                Arc::new(SharedRange { bytes, start, end })
            } else if span.length >= DEMAND_PAGED_MIN {
                handle.demand_paged_copy(start as u64, span.length)?
            } else {
                return None;
            };
        // SAFETY: only reached for SHARING_IMMUTABLE requests (checked
        // above): the program loads these parameters as constants, which the
        // compiler's dispatches never write.
        let memory = unsafe { HostMemory::program_constant(shared) };
        // An allocator that cannot import (or not with these parameters)
        // is not an error: the copy path serves the request instead.
        device.allocator().import_host(params, memory).ok()
    }

    /// Makes one buffer per span holding the span's bytes, ready once
    /// `signal` is reached (after `wait`).
    pub fn load(
        &self,
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        params: &BufferParams,
        spans: &[Span],
    ) -> Result<Vec<Buffer>> {
        demand_paging_intact()?;
        let mut buffers = Vec::with_capacity(spans.len());
        let mut transfers = Vec::new();
        for span in spans {
            let entry = self.resolve(span, false)?;
            if let Some(b) = Self::try_import(device, params, entry, span) {
                buffers.push(b);
                continue;
            }
            let target = device.allocator().allocate(params, span.length)?;
            transfers.push(Self::read_transfer(entry, span, target.clone())?);
            buffers.push(target);
        }
        submit(device, wait, signal, transfers)?;
        Ok(buffers)
    }

    /// Copies each span's parameter bytes into `target`.
    pub fn gather(
        &self,
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        target: &Buffer,
        spans: &[Span],
    ) -> Result<()> {
        demand_paging_intact()?;
        let transfers = spans
            .iter()
            .map(|span| Self::read_transfer(self.resolve(span, false)?, span, target.clone()))
            .collect::<Result<Vec<_>>>()?;
        submit(device, wait, signal, transfers)
    }

    /// Writes each span of `source` into its (writable) parameter.
    pub fn scatter(
        &self,
        device: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        source: &Buffer,
        spans: &[Span],
    ) -> Result<()> {
        demand_paging_intact()?;
        let transfers = spans
            .iter()
            .map(|span| {
                let entry = self.resolve(span, true)?;
                source.resolve_range(span.buffer_offset, span.length)?;
                Ok(Transfer::Write {
                    source: source.clone(),
                    offset: span.buffer_offset,
                    entry: entry.clone(),
                    to: span.parameter_offset,
                    length: span.length,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        submit(device, wait, signal, transfers)
    }
}

/// Fails with `DATA_LOSS` once a demand-paged parameter copy could not be
/// read from its file (it was truncated under the process): the chunks
/// concerned read as zeros, so results computed since are wrong
/// ([`super::demand_paged`]).
fn demand_paging_intact() -> Result<()> {
    if let Some(f) = super::demand_paged::failures().first() {
        bail!(
            DataLoss,
            "parameters read as zeros earlier because their file could not be read: {f}"
        );
    }
    Ok(())
}

/// Runs all `transfers` as one queue operation between `wait` and `signal`.
fn submit(
    device: &Arc<dyn Device>,
    wait: &Fence,
    signal: &Fence,
    transfers: Vec<Transfer>,
) -> Result<()> {
    device.submit(
        wait,
        signal,
        Box::new(move || transfers.into_iter().try_for_each(Transfer::run)),
    )
}
