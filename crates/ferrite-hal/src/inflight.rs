//! Device uses held for the life of a submission: the HAL's half of the
//! rule "host access racing device work is refused", for every driver.
//!
//! [`crate::device::queue::execute`] counts a device use on every
//! allocation the command buffer reaches (direct references and the
//! resolved binding table) before the work is handed to the driver, and
//! hands the uses to the submission's signal semaphores
//! ([`crate::semaphore::Semaphore`] keeps them): they end, under the
//! semaphore's lock and before the reached value is published, once a
//! signal semaphore has reached its value or failed. So a host waiter that
//! sees the signal fence reached finds the buffers free, and host access
//! before that is refused with `FAILED_PRECONDITION` whether or not the
//! driver's kernels reach the memory through host pointers (a GPU writing
//! pinned memory does not). The CPU drivers additionally mark each stage
//! as it runs ([`crate::buffer::Buffer::binding_range`]).

use crate::buffer::{Buffer, DeviceUse};
use crate::command_buffer::{Binding, BufferRef, Command};
use crate::memory::MemoryAccess;
use ferrite_base::Result;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The distinct allocations a submission reaches, in first-reference
/// order, each with whether some reference may write it.
#[derive(Default)]
struct Distinct<'a> {
    list: SmallVec<[(&'a Buffer, bool); 8]>,
    /// Allocation id to position in `list`, built once `list` outgrows a
    /// linear scan.
    index: HashMap<u64, usize, BuildHasherDefault<IdHasher>>,
    /// The position of the allocation added last: consecutive references
    /// often reach the same one (a dispatch's activations).
    last: usize,
}

/// Past this many allocations a lookup goes through the map.
const LINEAR_MAX: usize = 16;

impl<'a> Distinct<'a> {
    fn add(&mut self, buffer: &'a Buffer, write: bool) {
        let id = buffer.allocation_id();
        if let Some((b, w)) = self.list.get_mut(self.last) {
            if b.allocation_id() == id {
                *w |= write;
                return;
            }
        }
        let at = if self.list.len() <= LINEAR_MAX {
            self.list.iter().position(|(b, _)| b.allocation_id() == id)
        } else {
            if self.index.is_empty() {
                self.index.reserve(4 * LINEAR_MAX);
                for (i, (b, _)) in self.list.iter().enumerate() {
                    self.index.insert(b.allocation_id(), i);
                }
            }
            self.index.get(&id).copied()
        };
        match at {
            Some(i) => {
                self.list[i].1 |= write;
                self.last = i;
            }
            None => {
                self.last = self.list.len();
                if !self.index.is_empty() {
                    self.index.insert(id, self.last);
                }
                self.list.push((buffer, write));
            }
        }
    }
}

/// Hashes an allocation's address: distinct live allocations have distinct
/// addresses, so a multiplicative mix of the address is a good enough hash
/// (its high half folded into the low bits, which pick the bucket: an
/// aligned address's product has its low bits zero).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 32);
    }
}

/// The device uses of one submission, ended when one of its signal
/// semaphores is reached or failed.
pub(crate) struct SubmissionUses {
    uses: SmallVec<[DeviceUse; 4]>,
}

impl SubmissionUses {
    /// Counts a device use on each allocation `commands` reach under
    /// `table`: a writer where a command may write (transfer targets,
    /// dispatch bindings, collective results), a reader where it only
    /// reads (including a dispatch binding its executable marks read-only,
    /// on device-only memory). An allocation
    /// reached several times gets one use, a writer's if any reference may
    /// write (a writer use refuses every host access a reader use does):
    /// a cuda decode step of an LLM makes about 1,300 references to a few
    /// hundred allocations (its ~275 weights have one each). References
    /// that do not resolve are skipped: the work fails on them when it
    /// runs.
    /// `FAILED_PRECONDITION` (and nothing counted) while the host maps one
    /// of them in a conflicting way.
    pub(crate) fn register<'a>(
        commands: &'a [Command],
        table: &'a [Binding],
    ) -> Result<SubmissionUses> {
        let mut found = Distinct::default();
        // `read_only`: a dispatch binding the executable marks read-only.
        // That is a reader use, but only on memory the host reaches through
        // driver copies (device-only): a host read beside the kernel cannot
        // race it there even if the kernel wrote after all. Mapped memory
        // keeps the writer use (a host slice must not see a kernel's
        // writes).
        let mut add = |r: &'a BufferRef, write: bool, read_only: bool| {
            if let Ok((buffer, _, _)) = r.resolve(table) {
                found.add(buffer, write && !(read_only && buffer.is_device_only()));
            }
        };
        for c in commands {
            match c {
                Command::Barrier => {}
                Command::Fill { target, .. } | Command::Update { target, .. } => {
                    add(target, true, false)
                }
                Command::Copy { source, target } => {
                    add(source, false, false);
                    add(target, true, false);
                }
                Command::Dispatch {
                    executable,
                    function,
                    indirect,
                    bindings,
                    ..
                } => {
                    if let Some(r) = indirect {
                        add(r, false, false);
                    }
                    for (i, r) in bindings.iter().enumerate() {
                        let read_only = !executable
                            .0
                            .binding_access(*function, i)
                            .contains(MemoryAccess::WRITE);
                        add(r, true, read_only);
                    }
                }
                Command::Collective { send, recv, .. } => {
                    if let Some(r) = send {
                        add(r, false, false);
                    }
                    if let Some(r) = recv {
                        add(r, true, false);
                    }
                }
            }
        }
        let mut uses: SmallVec<[DeviceUse; 4]> = SmallVec::with_capacity(found.list.len());
        for (buffer, write) in found.list {
            uses.push(buffer.begin_device_use(write)?);
        }
        Ok(SubmissionUses { uses })
    }

    /// True when no buffer is used.
    pub(crate) fn is_empty(&self) -> bool {
        self.uses.is_empty()
    }

    /// A signal semaphore of the submission was reached or failed: the
    /// work is over (drivers signal and fail a submission's semaphores only
    /// once it ended), so the uses end; later calls do nothing. Only
    /// atomics: called under the semaphore's lock.
    pub(crate) fn settled(&self) {
        for u in &self.uses {
            u.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{Allocator, BufferParams, HeapAllocator};
    use crate::command_buffer::BufferRef;
    use ferrite_base::StatusCode;

    fn direct(buffer: &Buffer, offset: u64, length: u64) -> BufferRef {
        BufferRef::Direct {
            buffer: buffer.clone(),
            offset,
            length,
        }
    }

    /// Many references to one allocation (subspans, a table slot, a
    /// read then a write) count one use, a writer's: the host may neither
    /// read nor write it until the submission settles; another allocation
    /// only read gets its own reader use.
    #[test]
    fn one_use_per_allocation_a_writers_if_any_reference_writes() {
        let heap = HeapAllocator::new();
        let a = heap.allocate(&BufferParams::default(), 256).unwrap();
        let b = heap.allocate(&BufferParams::default(), 64).unwrap();
        let low = a.subspan(0, 128).unwrap();
        let high = a.subspan(128, 128).unwrap();
        let table = [Binding {
            buffer: a.clone(),
            offset: 64,
            length: 64,
        }];
        let commands = [
            Command::Copy {
                source: direct(&low, 0, 16),
                target: direct(&b, 0, 16),
            },
            Command::Copy {
                source: direct(&b, 16, 16),
                target: BufferRef::Slot {
                    slot: 0,
                    offset: 0,
                    length: 16,
                },
            },
            Command::Fill {
                target: direct(&high, 0, 16),
                pattern: vec![1],
            },
        ];
        let uses = SubmissionUses::register(&commands, &table).unwrap();
        assert_eq!(uses.uses.len(), 2, "one use per allocation");
        // Both written somewhere: writer uses, which refuse host reads.
        for x in [&a, &b] {
            let e = x.map_read(0, 16).map(drop).unwrap_err();
            assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
        }
        uses.settled();
        a.map_read(0, 16).unwrap();
        a.write(0, &[0; 4]).unwrap();

        // Only read: a reader use, which leaves host reads allowed.
        let read_only = [Command::Copy {
            source: direct(&low, 0, 16),
            target: direct(&b, 0, 16),
        }];
        let uses = SubmissionUses::register(&read_only, &[]).unwrap();
        assert_eq!(uses.uses.len(), 2);
        a.map_read(0, 16).unwrap();
        let e = a.write(0, &[0; 4]).unwrap_err();
        assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
        drop(uses);
        a.write(0, &[0; 4]).unwrap();
    }

    /// Device memory with no host mapping (as a GPU's).
    struct Far(parking_lot::Mutex<Vec<u8>>);

    // SAFETY: no host mapping; the vector never changes size; read/write
    // check their ranges.
    unsafe impl crate::buffer::DeviceMemory for Far {
        fn len(&self) -> u64 {
            self.0.lock().len() as u64
        }
        fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
            None
        }
        fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
            crate::buffer::check_device_range(self.len(), offset, dst.len())?;
            let o = offset as usize;
            dst.copy_from_slice(&self.0.lock()[o..o + dst.len()]);
            Ok(())
        }
        fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
            crate::buffer::check_device_range(self.len(), offset, src.len())?;
            let o = offset as usize;
            self.0.lock()[o..o + src.len()].copy_from_slice(src);
            Ok(())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    /// An executable whose one export reads binding 0 only (as CUDA's
    /// `binding_flags` READ_ONLY says) and may write binding 1.
    struct ReadsFirst(Vec<crate::executable::ExportInfo>);

    impl crate::executable::Executable for ReadsFirst {
        fn exports(&self) -> &[crate::executable::ExportInfo] {
            &self.0
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn binding_access(&self, _export: u32, binding: usize) -> MemoryAccess {
            if binding == 0 {
                MemoryAccess::READ
            } else {
                MemoryAccess::READ | MemoryAccess::WRITE
            }
        }
    }

    fn dispatch(bindings: &[&Buffer]) -> Command {
        Command::Dispatch {
            executable: crate::executable::ExecutableRef(std::sync::Arc::new(ReadsFirst(vec![]))),
            function: 0,
            workgroups: [1, 1, 1],
            indirect: None,
            constants: vec![],
            bindings: bindings.iter().map(|b| direct(b, 0, 16)).collect(),
        }
    }

    /// A binding the executable marks read-only is a reader use on
    /// device-only memory (the host may read it beside the kernel: an LLM
    /// step's state read while the next step, which binds it, is queued)
    /// and stays a writer use on mapped memory (a host slice must not see
    /// a kernel's writes, whatever the executable claims); a binding it may
    /// write is a writer use everywhere.
    #[test]
    fn read_only_bindings_are_reader_uses_on_device_only_memory() {
        let far = || {
            Buffer::from_device_memory(
                Box::new(Far(parking_lot::Mutex::new(vec![0; 16]))),
                crate::MemoryType::DEVICE_LOCAL,
                crate::BufferUsage::DEFAULT,
                MemoryAccess::ALL,
            )
        };
        let (input, output) = (far(), far());
        let uses = SubmissionUses::register(&[dispatch(&[&input, &output])], &[]).unwrap();
        let mut got = [0u8; 4];
        input.read(0, &mut got).unwrap();
        let e = input.write(0, &[1; 4]).unwrap_err();
        assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
        let e = output.read(0, &mut got).unwrap_err();
        assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
        drop(uses);

        let heap = HeapAllocator::new();
        let mapped = heap.allocate(&BufferParams::default(), 16).unwrap();
        let uses = SubmissionUses::register(&[dispatch(&[&mapped, &output])], &[]).unwrap();
        let e = mapped.map_read(0, 16).map(drop).unwrap_err();
        assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
        drop(uses);
        mapped.map_read(0, 16).unwrap();
    }

    /// Past the linear scan's reach the map finds repeats too.
    #[test]
    fn many_allocations_each_counted_once() {
        let heap = HeapAllocator::new();
        let buffers: Vec<Buffer> = (0..100)
            .map(|_| heap.allocate(&BufferParams::default(), 16).unwrap())
            .collect();
        let commands: Vec<Command> = (0..3)
            .flat_map(|_| {
                buffers.iter().map(|b| Command::Fill {
                    target: direct(b, 0, 4),
                    pattern: vec![0],
                })
            })
            .collect();
        let uses = SubmissionUses::register(&commands, &[]).unwrap();
        assert_eq!(uses.uses.len(), 100);
        for b in &buffers {
            assert!(b.map_read(0, 4).is_err());
        }
        drop(uses);
        for b in &buffers {
            b.map_read(0, 4).unwrap();
        }
    }
}
