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
    /// dispatch bindings, whose executables may write any of them,
    /// collective results), a reader where it only reads. An allocation
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
        let mut add = |r: &'a BufferRef, write: bool| {
            if let Ok((buffer, _, _)) = r.resolve(table) {
                found.add(buffer, write);
            }
        };
        for c in commands {
            match c {
                Command::Barrier => {}
                Command::Fill { target, .. } | Command::Update { target, .. } => add(target, true),
                Command::Copy { source, target } => {
                    add(source, false);
                    add(target, true);
                }
                Command::Dispatch {
                    indirect, bindings, ..
                } => {
                    if let Some(r) = indirect {
                        add(r, false);
                    }
                    for r in bindings {
                        add(r, true);
                    }
                }
                Command::Collective { send, recv, .. } => {
                    if let Some(r) = send {
                        add(r, false);
                    }
                    if let Some(r) = recv {
                        add(r, true);
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
