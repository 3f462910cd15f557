//! Memory types, buffer usages and memory access bits, with upstream's values
//! and upstream's printed forms.
//!
//! Printing follows upstream's bitfield formatter: a table of names is walked
//! in order (combined aliases first), each entry whose bits are all still set
//! is printed and its bits cleared, names are joined with `|`, and leftover
//! unnamed bits print as hexadecimal with an `h` suffix (`40h`). An empty
//! value prints as the empty string. Parsing accepts `|`-separated names
//! (case-insensitive) and decimal numbers.

use std::fmt;

use bitflags::bitflags;
use ferrite_base::{bail, Result};

bitflags! {
    /// Where memory lives and how the host may see it
    /// (upstream's `iree_hal_memory_type_t`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct MemoryType: u32 {
        /// Let the allocator pick the best type for the usage.
        const OPTIMAL = 1 << 0;
        /// Host can map the memory.
        const HOST_VISIBLE = 1 << 1;
        /// Host mappings need no flush/invalidate.
        const HOST_COHERENT = 1 << 2;
        /// Host mappings are cached.
        const HOST_CACHED = 1 << 3;
        /// Host-local memory (visible, coherent, and the host-local bit).
        const HOST_LOCAL = (1 << 1) | (1 << 2) | (1 << 6);
        /// Optimal memory for host access.
        const OPTIMAL_FOR_HOST = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 6);
        /// Device can access the memory.
        const DEVICE_VISIBLE = 1 << 4;
        /// Device-local memory (visible plus the device-local bit).
        const DEVICE_LOCAL = (1 << 4) | (1 << 5);
        /// Optimal memory for device access.
        const OPTIMAL_FOR_DEVICE = (1 << 0) | (1 << 4) | (1 << 5);
        /// Keep unknown bits when round-tripping raw values.
        const _ = !0;
    }
}

bitflags! {
    /// What a buffer may be used for (upstream's `iree_hal_buffer_usage_t`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct BufferUsage: u32 {
        /// Source of transfer operations (copy, read).
        const TRANSFER_SOURCE = 1 << 0;
        /// Target of transfer operations (copy, fill, update, write).
        const TRANSFER_TARGET = 1 << 1;
        /// Both transfer directions.
        const TRANSFER = (1 << 0) | (1 << 1);
        /// Indirect dispatch parameters.
        const DISPATCH_INDIRECT_PARAMETERS = 1 << 8;
        /// Uniform (read-only, small) dispatch binding.
        const DISPATCH_UNIFORM_READ = 1 << 9;
        /// Storage binding read by dispatches.
        const DISPATCH_STORAGE_READ = 1 << 10;
        /// Storage binding written by dispatches.
        const DISPATCH_STORAGE_WRITE = 1 << 11;
        /// Storage binding read and written by dispatches.
        const DISPATCH_STORAGE = (1 << 10) | (1 << 11);
        /// Image read by dispatches.
        const DISPATCH_IMAGE_READ = 1 << 12;
        /// Image written by dispatches.
        const DISPATCH_IMAGE_WRITE = 1 << 13;
        /// Image read and written by dispatches.
        const DISPATCH_IMAGE = (1 << 12) | (1 << 13);
        /// Every dispatch usage.
        const DISPATCH = (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12) | (1 << 13);
        /// May be exported to other APIs.
        const SHARING_EXPORT = 1 << 16;
        /// May be replicated across devices.
        const SHARING_REPLICATE = 1 << 17;
        /// May be used concurrently by several queues.
        const SHARING_CONCURRENT = 1 << 18;
        /// Contents never change after initialization.
        const SHARING_IMMUTABLE = 1 << 19;
        /// May be mapped for the duration of a scoped operation.
        const MAPPING_SCOPED = 1 << 24;
        /// May be mapped persistently.
        const MAPPING_PERSISTENT = 1 << 25;
        /// Mapping is requested if cheap, not required.
        const MAPPING_OPTIONAL = 1 << 26;
        /// Mapped access may be random.
        const MAPPING_ACCESS_RANDOM = 1 << 27;
        /// Mapped access is sequential writes only.
        const MAPPING_ACCESS_SEQUENTIAL_WRITE = 1 << 28;
        /// Scoped random-access mapping.
        const MAPPING = (1 << 24) | (1 << 27);
        /// Upstream's default usage: transfer plus dispatch storage.
        const DEFAULT = (1 << 0) | (1 << 1) | (1 << 10) | (1 << 11);
        /// Keep unknown bits when round-tripping raw values.
        const _ = !0;
    }
}

bitflags! {
    /// How memory may be accessed (upstream's `iree_hal_memory_access_t`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct MemoryAccess: u16 {
        /// Read access.
        const READ = 1 << 0;
        /// Write access.
        const WRITE = 1 << 1;
        /// Previous contents may be discarded.
        const DISCARD = 1 << 2;
        /// Write with discard.
        const DISCARD_WRITE = (1 << 1) | (1 << 2);
        /// The range may alias others.
        const MAY_ALIAS = 1 << 3;
        /// Unaligned access is allowed.
        const UNALIGNED = 1 << 4;
        /// Any access is allowed (skips validation).
        const ANY = 1 << 5;
        /// Read, write and discard.
        const ALL = (1 << 0) | (1 << 1) | (1 << 2);
        /// Keep unknown bits when round-tripping raw values.
        const _ = !0;
    }
}

/// Upstream's printing table for memory types (combined names first).
const MEMORY_TYPE_NAMES: &[(u32, &str)] = &[
    (MemoryType::HOST_LOCAL.bits(), "HOST_LOCAL"),
    (MemoryType::DEVICE_LOCAL.bits(), "DEVICE_LOCAL"),
    (MemoryType::OPTIMAL.bits(), "OPTIMAL"),
    (MemoryType::HOST_VISIBLE.bits(), "HOST_VISIBLE"),
    (MemoryType::HOST_COHERENT.bits(), "HOST_COHERENT"),
    (MemoryType::HOST_CACHED.bits(), "HOST_CACHED"),
    (MemoryType::DEVICE_VISIBLE.bits(), "DEVICE_VISIBLE"),
];

/// Upstream's printing table for memory access bits.
const MEMORY_ACCESS_NAMES: &[(u32, &str)] = &[
    (MemoryAccess::ALL.bits() as u32, "ALL"),
    (MemoryAccess::DISCARD_WRITE.bits() as u32, "DISCARD_WRITE"),
    (MemoryAccess::READ.bits() as u32, "READ"),
    (MemoryAccess::WRITE.bits() as u32, "WRITE"),
    (MemoryAccess::DISCARD.bits() as u32, "DISCARD"),
    (MemoryAccess::MAY_ALIAS.bits() as u32, "MAY_ALIAS"),
    (MemoryAccess::ANY.bits() as u32, "ANY"),
];

/// Upstream's printing table for buffer usages.
const BUFFER_USAGE_NAMES: &[(u32, &str)] = &[
    (BufferUsage::TRANSFER.bits(), "TRANSFER"),
    (BufferUsage::DISPATCH.bits(), "DISPATCH"),
    (BufferUsage::DISPATCH_STORAGE.bits(), "DISPATCH_STORAGE"),
    (BufferUsage::DISPATCH_IMAGE.bits(), "DISPATCH_IMAGE"),
    (BufferUsage::MAPPING.bits(), "MAPPING"),
    (BufferUsage::TRANSFER_SOURCE.bits(), "TRANSFER_SOURCE"),
    (BufferUsage::TRANSFER_TARGET.bits(), "TRANSFER_TARGET"),
    (
        BufferUsage::DISPATCH_INDIRECT_PARAMETERS.bits(),
        "DISPATCH_INDIRECT_PARAMETERS",
    ),
    (
        BufferUsage::DISPATCH_UNIFORM_READ.bits(),
        "DISPATCH_UNIFORM_READ",
    ),
    (
        BufferUsage::DISPATCH_STORAGE_READ.bits(),
        "DISPATCH_STORAGE_READ",
    ),
    (
        BufferUsage::DISPATCH_STORAGE_WRITE.bits(),
        "DISPATCH_STORAGE_WRITE",
    ),
    (
        BufferUsage::DISPATCH_IMAGE_READ.bits(),
        "DISPATCH_IMAGE_READ",
    ),
    (
        BufferUsage::DISPATCH_IMAGE_WRITE.bits(),
        "DISPATCH_IMAGE_WRITE",
    ),
    (BufferUsage::SHARING_EXPORT.bits(), "SHARING_EXPORT"),
    (BufferUsage::SHARING_REPLICATE.bits(), "SHARING_REPLICATE"),
    (BufferUsage::SHARING_CONCURRENT.bits(), "SHARING_CONCURRENT"),
    (BufferUsage::SHARING_IMMUTABLE.bits(), "SHARING_IMMUTABLE"),
    (BufferUsage::MAPPING_SCOPED.bits(), "MAPPING_SCOPED"),
    (BufferUsage::MAPPING_PERSISTENT.bits(), "MAPPING_PERSISTENT"),
    (BufferUsage::MAPPING_OPTIONAL.bits(), "MAPPING_OPTIONAL"),
    (
        BufferUsage::MAPPING_ACCESS_RANDOM.bits(),
        "MAPPING_ACCESS_RANDOM",
    ),
    (
        BufferUsage::MAPPING_ACCESS_SEQUENTIAL_WRITE.bits(),
        "MAPPING_ACCESS_SEQUENTIAL_WRITE",
    ),
];

fn format_bitfield(value: u32, table: &[(u32, &str)], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let mut remaining = value;
    let mut first = true;
    for &(bits, name) in table {
        if remaining & bits == bits {
            if !first {
                f.write_str("|")?;
            }
            f.write_str(name)?;
            remaining &= !bits;
            first = false;
        }
    }
    if remaining != 0 {
        if !first {
            f.write_str("|")?;
        }
        write!(f, "{remaining:X}h")?;
    }
    Ok(())
}

fn parse_bitfield(value: &str, table: &[(u32, &str)]) -> Result<u32> {
    let mut bits = 0u32;
    for part in value.split('|').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some(&(b, _)) = table.iter().find(|(_, n)| n.eq_ignore_ascii_case(part)) {
            bits |= b;
        } else if let Some(n) =
            crate::element_type::parse_u32(part).filter(|_| part.as_bytes()[0].is_ascii_digit())
        {
            bits |= n;
        } else {
            bail!(InvalidArgument, "unrecognized bitfield member '{part}'");
        }
    }
    Ok(bits)
}

impl fmt::Display for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        format_bitfield(self.bits(), MEMORY_TYPE_NAMES, f)
    }
}

impl fmt::Display for BufferUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        format_bitfield(self.bits(), BUFFER_USAGE_NAMES, f)
    }
}

impl fmt::Display for MemoryAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        format_bitfield(self.bits() as u32, MEMORY_ACCESS_NAMES, f)
    }
}

impl MemoryType {
    /// Parses upstream's textual form (`HOST_LOCAL|DEVICE_VISIBLE`, numbers).
    pub fn parse(s: &str) -> Result<MemoryType> {
        parse_bitfield(s, MEMORY_TYPE_NAMES).map(MemoryType::from_bits_retain)
    }
}

impl BufferUsage {
    /// Parses upstream's textual form (`TRANSFER|DISPATCH_STORAGE`, numbers).
    pub fn parse(s: &str) -> Result<BufferUsage> {
        parse_bitfield(s, BUFFER_USAGE_NAMES).map(BufferUsage::from_bits_retain)
    }
}

impl MemoryAccess {
    /// Parses upstream's textual form (`READ|WRITE`, numbers).
    pub fn parse(s: &str) -> Result<MemoryAccess> {
        let bits = parse_bitfield(s, MEMORY_ACCESS_NAMES)?;
        match u16::try_from(bits) {
            Ok(b) => Ok(MemoryAccess::from_bits_retain(b)),
            Err(_) => bail!(
                InvalidArgument,
                "memory access bits {bits:#x} exceed 16 bits"
            ),
        }
    }
}

bitflags! {
    /// How an allocator can provide a buffer with given parameters
    /// (upstream's `iree_hal_buffer_compatibility_t`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct BufferCompatibility: u32 {
        /// The allocator can allocate such a buffer.
        const ALLOCATABLE = 1 << 0;
        /// The allocator can import such memory.
        const IMPORTABLE = 1 << 1;
        /// The allocator can export such buffers.
        const EXPORTABLE = 1 << 2;
        /// The buffer can be used in queue transfer operations.
        const QUEUE_TRANSFER = 1 << 10;
        /// The buffer can be used in queue dispatches.
        const QUEUE_DISPATCH = 1 << 11;
        /// Usable, but slower than an alternative.
        const LOW_PERFORMANCE = 1 << 20;
        /// Keep unknown bits.
        const _ = !0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_upstream() {
        assert_eq!(MemoryType::HOST_LOCAL.bits(), 0x46);
        assert_eq!(MemoryType::DEVICE_LOCAL.bits(), 0x30);
        assert_eq!(MemoryType::OPTIMAL_FOR_DEVICE.bits(), 0x31);
        assert_eq!(BufferUsage::DEFAULT.bits(), 0xC03);
        assert_eq!(BufferUsage::DISPATCH.bits(), 0x3F00);
        assert_eq!(BufferUsage::MAPPING.bits(), 0x0900_0000);
        assert_eq!(MemoryAccess::ALL.bits(), 7);
    }

    #[test]
    fn formatting_matches_upstream() {
        let t = MemoryType::HOST_VISIBLE | MemoryType::HOST_COHERENT | MemoryType::DEVICE_LOCAL;
        assert_eq!(t.to_string(), "DEVICE_LOCAL|HOST_VISIBLE|HOST_COHERENT");
        assert_eq!(
            (MemoryType::HOST_LOCAL | MemoryType::DEVICE_LOCAL).to_string(),
            "HOST_LOCAL|DEVICE_LOCAL"
        );
        assert_eq!(
            MemoryType::OPTIMAL_FOR_DEVICE.to_string(),
            "DEVICE_LOCAL|OPTIMAL"
        );
        assert_eq!(MemoryType::empty().to_string(), "");
        assert_eq!(
            MemoryType::from_bits_retain(0x102).to_string(),
            "HOST_VISIBLE|100h"
        );
        let u = BufferUsage::TRANSFER | BufferUsage::DISPATCH_STORAGE | BufferUsage::MAPPING;
        assert_eq!(u.to_string(), "TRANSFER|DISPATCH_STORAGE|MAPPING");
        assert_eq!(
            BufferUsage::DEFAULT.to_string(),
            "TRANSFER|DISPATCH_STORAGE"
        );
        assert_eq!(
            (BufferUsage::TRANSFER_SOURCE | BufferUsage::MAPPING_SCOPED).to_string(),
            "TRANSFER_SOURCE|MAPPING_SCOPED"
        );
        assert_eq!(BufferUsage::DISPATCH.to_string(), "DISPATCH");
        assert_eq!(MemoryAccess::ALL.to_string(), "ALL");
        assert_eq!(MemoryAccess::DISCARD_WRITE.to_string(), "DISCARD_WRITE");
        assert_eq!(
            (MemoryAccess::READ | MemoryAccess::WRITE).to_string(),
            "READ|WRITE"
        );
        assert_eq!(
            (MemoryAccess::READ | MemoryAccess::UNALIGNED).to_string(),
            "READ|10h"
        );
    }

    #[test]
    fn parsing() {
        assert_eq!(
            MemoryType::parse("host_local | DEVICE_VISIBLE").unwrap(),
            MemoryType::HOST_LOCAL | MemoryType::DEVICE_VISIBLE
        );
        assert_eq!(
            BufferUsage::parse("TRANSFER|1024").unwrap(),
            BufferUsage::TRANSFER | BufferUsage::DISPATCH_STORAGE_READ
        );
        assert_eq!(
            MemoryAccess::parse("read|WRITE").unwrap(),
            MemoryAccess::READ | MemoryAccess::WRITE
        );
        let e = MemoryAccess::parse("READ|BOGUS").unwrap_err();
        assert!(e.message().contains("'BOGUS'"));
    }
}
