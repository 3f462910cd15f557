//! The recording device: a wrapper that runs each command of a command
//! buffer alone on the wrapped device and records what dispatches write.

use ferrite_base::{bail, Result, Timeout};
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::buffer::Buffer;
use ferrite_hal::channel::{ChannelParams, ChannelProvider, ChannelRef};
use ferrite_hal::command_buffer::{Binding, BindingTable, BufferRef, Command, CommandBuffer};
use ferrite_hal::device::{Device, Work};
use ferrite_hal::executable::Executable;
use ferrite_hal::fence::Fence;
use ferrite_hal::semaphore::Semaphore;
use parking_lot::Mutex;
use std::any::Any;
use std::sync::Arc;

/// What one binding of a dispatch wrote: the span `[offset, offset +
/// bytes.len())` of the bound range between the first and the last byte
/// that changed (empty when nothing changed).
#[derive(Clone, Debug, Default)]
pub struct Written {
    /// Offset of the span within the bound range.
    pub offset: u64,
    /// The span's bytes after the dispatch.
    pub bytes: Vec<u8>,
}

/// One executed dispatch.
#[derive(Clone, Debug)]
pub struct DispatchRecord {
    /// The export's name.
    pub name: String,
    /// Per binding, what it wrote.
    pub bindings: Vec<Written>,
}

/// The dispatches of one run, in execution order.
#[derive(Default)]
pub struct Recorder {
    records: Mutex<Vec<DispatchRecord>>,
}

impl Recorder {
    /// The records so far.
    pub fn take(&self) -> Vec<DispatchRecord> {
        std::mem::take(&mut self.records.lock())
    }
}

/// The span between the first and last differing byte of `before` and
/// `after` (4-byte aligned, within `after`).
pub fn written_span(before: &[u8], after: &[u8]) -> Written {
    let n = before.len().min(after.len());
    let Some(first) = (0..n).find(|&i| before[i] != after[i]) else {
        return Written::default();
    };
    let last = (0..n)
        .rev()
        .find(|&i| before[i] != after[i])
        .unwrap_or(first);
    let lo = first & !3;
    let hi = ((last | 3) + 1).min(after.len());
    Written {
        offset: lo as u64,
        bytes: after[lo..hi].to_vec(),
    }
}

/// A device that runs every command of a submitted command buffer alone
/// (waiting for each) on `inner`, recording dispatches into a [`Recorder`].
pub struct TraceDevice {
    inner: Arc<dyn Device>,
    recorder: Arc<Recorder>,
}

impl TraceDevice {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Device>, recorder: Arc<Recorder>) -> TraceDevice {
        TraceDevice { inner, recorder }
    }

    fn snapshot(bindings: &[BufferRef], table: &[Binding]) -> Result<Vec<Vec<u8>>> {
        bindings
            .iter()
            .map(|r| {
                let (b, off, len) = r.resolve(table)?;
                let mut v = vec![0u8; len as usize];
                // A device read: the snapshot is taken inside the traced
                // submission, whose buffers count as in use by device work
                // (host reads are refused meanwhile).
                b.device_read(off, &mut v)?;
                Ok(v)
            })
            .collect()
    }

    fn run_one(&self, cb: &CommandBuffer, cmd: &Command, table: &BindingTable) -> Result<()> {
        let single = CommandBuffer::new(
            cb.mode(),
            cb.categories(),
            cb.queue_affinity(),
            cb.binding_capacity(),
        );
        let mut dispatch = None;
        match cmd.clone() {
            Command::Barrier => single.execution_barrier()?,
            Command::Fill { target, pattern } => {
                let mut p = [0u8; 8];
                p[..pattern.len()].copy_from_slice(&pattern);
                single.fill_buffer(target, u64::from_le_bytes(p), pattern.len() as u32)?
            }
            Command::Update { data, target } => single.update_buffer(data, target)?,
            Command::Copy { source, target } => single.copy_buffer(source, target)?,
            Command::Dispatch {
                executable,
                function,
                workgroups,
                indirect,
                constants,
                bindings,
            } => {
                let name = executable
                    .0
                    .exports()
                    .get(function as usize)
                    .map_or_else(|| format!("export {function}"), |e| e.name.clone());
                dispatch = Some((name, bindings.clone()));
                single.dispatch(
                    executable, function, workgroups, indirect, constants, bindings,
                )?
            }
            Command::Collective { .. } => {
                bail!(
                    Unimplemented,
                    "dispatch comparison does not run collectives"
                )
            }
        }
        single.finalize()?;
        let before = match &dispatch {
            Some((_, b)) => Some(Self::snapshot(b, table)?),
            None => None,
        };
        let done = Fence::create_at(Semaphore::new(0), 1);
        self.inner
            .queue_execute(&self.inner, Fence::empty(), &done, &single, table.clone())?;
        done.wait(Timeout::INFINITE)?;
        if let (Some((name, bindings)), Some(before)) = (dispatch, before) {
            let after = Self::snapshot(&bindings, table)?;
            let bindings = before
                .iter()
                .zip(&after)
                .map(|(b, a)| written_span(b, a))
                .collect();
            self.recorder
                .records
                .lock()
                .push(DispatchRecord { name, bindings });
        }
        Ok(())
    }
}

impl Device for TraceDevice {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn allocator(&self) -> Arc<dyn Allocator> {
        self.inner.allocator()
    }
    fn queue_allocator(&self) -> Arc<dyn Allocator> {
        self.inner.queue_allocator()
    }
    fn query_i64(&self, category: &str, key: &str) -> Result<Option<i64>> {
        self.inner.query_i64(category, key)
    }
    fn create_executable(
        &self,
        format: &str,
        data: &[u8],
        constants: &[u32],
    ) -> Result<Arc<dyn Executable>> {
        self.inner.create_executable(format, data, constants)
    }
    fn submit(&self, wait: &Fence, signal: &Fence, work: Work) -> Result<()> {
        self.inner.submit(wait, signal, work)
    }
    fn execute_commands(&self, commands: &[Command], bindings: &[Binding]) -> Result<()> {
        self.inner.execute_commands(commands, bindings)
    }
    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }
    fn queue_alloca(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        params: &BufferParams,
        size: u64,
    ) -> Result<Buffer> {
        self.inner
            .queue_alloca(&self.inner, wait, signal, params, size)
    }
    fn queue_dealloca(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        buffer: Buffer,
    ) -> Result<()> {
        self.inner.queue_dealloca(&self.inner, wait, signal, buffer)
    }
    fn queue_fill(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        target: Buffer,
        offset: u64,
        length: u64,
        pattern: Vec<u8>,
    ) -> Result<()> {
        self.inner
            .queue_fill(&self.inner, wait, signal, target, offset, length, pattern)
    }
    fn queue_update(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        data: Vec<u8>,
        target: Buffer,
        offset: u64,
    ) -> Result<()> {
        self.inner
            .queue_update(&self.inner, wait, signal, data, target, offset)
    }
    fn queue_copy(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        source: Buffer,
        source_offset: u64,
        target: Buffer,
        target_offset: u64,
        length: u64,
    ) -> Result<()> {
        self.inner.queue_copy(
            &self.inner,
            wait,
            signal,
            source,
            source_offset,
            target,
            target_offset,
            length,
        )
    }
    fn queue_barrier(&self, _this: &Arc<dyn Device>, wait: &Fence, signal: &Fence) -> Result<()> {
        self.inner.queue_barrier(&self.inner, wait, signal)
    }
    fn queue_execute(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        command_buffer: &CommandBuffer,
        bindings: BindingTable,
    ) -> Result<()> {
        // FERRITE_DISPATCH_DIFF_SPLIT=0: whole command buffers, each
        // waited for (records nothing; tells ordering problems between
        // submissions from ones within a command buffer).
        if std::env::var("FERRITE_DISPATCH_DIFF_SPLIT").is_ok_and(|v| v == "0") {
            let outcome = wait.wait(Timeout::INFINITE).and_then(|_| {
                let done = Fence::create_at(Semaphore::new(0), 1);
                self.inner.queue_execute(
                    &self.inner,
                    Fence::empty(),
                    &done,
                    command_buffer,
                    bindings,
                )?;
                done.wait(Timeout::INFINITE).map(|_| ())
            });
            return match outcome {
                Ok(()) => signal.signal(),
                Err(e) => {
                    signal.fail(e);
                    Ok(())
                }
            };
        }
        // Serialized: the commands run one by one, on this thread, once
        // `wait` is reached.
        let outcome = wait.wait(Timeout::INFINITE).and_then(|_| {
            let commands = command_buffer.finalized_commands()?.clone();
            for cmd in commands.iter() {
                self.run_one(command_buffer, cmd, &bindings)?;
            }
            Ok(())
        });
        match outcome {
            Ok(()) => signal.signal(),
            Err(e) => {
                signal.fail(e);
                Ok(())
            }
        }
    }
    fn queue_flush(&self) -> Result<()> {
        self.inner.queue_flush()
    }
    fn runs_inline(&self) -> bool {
        self.inner.runs_inline()
    }
    fn create_channel(
        &self,
        queue_affinity: u64,
        params: ChannelParams,
        provider: Option<&Arc<dyn ChannelProvider>>,
    ) -> Result<ChannelRef> {
        self.inner.create_channel(queue_affinity, params, provider)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_changed_bytes() {
        let before = [0u8; 16];
        let mut after = before;
        assert!(written_span(&before, &after).bytes.is_empty());
        after[5] = 1;
        after[9] = 2;
        let w = written_span(&before, &after);
        assert_eq!(w.offset, 4);
        assert_eq!(w.bytes.len(), 8);
        assert_eq!(w.bytes[1], 1);
    }
}
