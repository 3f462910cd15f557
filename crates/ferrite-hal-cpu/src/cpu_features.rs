//! The host CPU's feature bits in IREE's processor-data layout
//! (`cpu_data.h`: word 0 on x86-64), read with `cpuid` as upstream reads
//! them, and the feature names programs query them by
//! (`hal.device.query key("hal.cpu" :: "avx2")`, LLVM's feature names).
//!
//! The same words are handed to executables as their processor data, so a
//! dispatch and a query see the same answer. As upstream, whose process-wide
//! CPU data is filled when the first executable is loaded, queries answer 0
//! for every feature until an executable has been loaded in the process
//! ([`mark_loaded`]); a program that loads none sees no features.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static LOADED: AtomicBool = AtomicBool::new(false);

/// Records that an executable was loaded: from now on [`query_data`] gives
/// the host's words.
pub fn mark_loaded() {
    LOADED.store(true, Ordering::Release);
}

/// The words device queries answer from: the host's once an executable
/// was loaded in this process, zeros before.
pub fn query_data() -> [u64; 8] {
    if LOADED.load(Ordering::Acquire) {
        host_cpu_data()
    } else {
        [0; 8]
    }
}

/// The x86-64 features of processor-data word 0: LLVM name and bit.
pub const X86_64_FEATURE_BITS: [(&str, u32); 27] = [
    ("sse3", 0),
    ("ssse3", 1),
    ("sse4.1", 2),
    ("sse4.2", 3),
    ("sse4a", 4),
    ("avx", 10),
    ("fma", 11),
    ("fma4", 12),
    ("xop", 13),
    ("f16c", 14),
    ("avx2", 15),
    ("avx512f", 20),
    ("avx512cd", 21),
    ("avx512vl", 22),
    ("avx512dq", 23),
    ("avx512bw", 24),
    ("avx512ifma", 25),
    ("avx512vbmi", 26),
    ("avx512vpopcntdq", 27),
    ("avx512vnni", 28),
    ("avx512vbmi2", 29),
    ("avx512bitalg", 30),
    ("avx512bf16", 31),
    ("avx512fp16", 32),
    ("amx-tile", 50),
    ("amx-int8", 51),
    ("amx-bf16", 52),
];

/// The host's processor-data words (computed once).
pub fn host_cpu_data() -> [u64; 8] {
    static DATA: OnceLock<[u64; 8]> = OnceLock::new();
    *DATA.get_or_init(read_host)
}

/// The value of feature `key` (an LLVM feature name) in `data`: 0 or 1;
/// None for a name that is not a feature of this architecture.
pub fn lookup_feature(data: &[u64; 8], key: &str) -> Option<i64> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    X86_64_FEATURE_BITS
        .iter()
        .find(|(name, _)| *name == key)
        .map(|&(_, bit)| ((data[0] >> bit) & 1) as i64)
}

#[cfg(target_arch = "x86_64")]
fn read_host() -> [u64; 8] {
    use std::arch::x86_64::{__cpuid_count, CpuidResult};
    let max_base = __cpuid_count(0, 0).eax;
    let max_ext = __cpuid_count(0x8000_0000, 0).eax;
    let max_ext = if max_ext < 0x8000_0000 { 0 } else { max_ext };
    // Leaves (and sub-leaves) beyond what the CPU reports read as zero.
    let leaf = |eax: u32, ecx: u32| -> CpuidResult {
        let in_range = if eax < 0x8000_0000 {
            eax <= max_base
        } else {
            eax <= max_ext
        };
        if !in_range || (ecx != 0 && ecx > __cpuid_count(eax, 0).eax) {
            return CpuidResult {
                eax: 0,
                ebx: 0,
                ecx: 0,
                edx: 0,
            };
        }
        __cpuid_count(eax, ecx)
    };
    let l1 = leaf(1, 0);
    let l7 = leaf(7, 0);
    let l7_1 = leaf(7, 1);
    let ld = leaf(0xD, 0);
    let le1 = leaf(0x8000_0001, 0);
    let mut w = 0u64;
    let mut copy = |bit: u32, reg: u32, reg_bit: u32| {
        if reg & (1 << reg_bit) != 0 {
            w |= 1 << bit;
        }
    };
    copy(0, l1.ecx, 0);
    copy(1, l1.ecx, 9);
    copy(2, l1.ecx, 19);
    copy(3, l1.ecx, 20);
    copy(4, le1.ecx, 6);
    // YMM state supported (x87, SSE, AVX state components).
    if ld.eax & 0x7 == 0x7 {
        copy(10, l1.ecx, 28);
        copy(11, l1.ecx, 12);
        copy(12, le1.ecx, 16);
        copy(13, le1.ecx, 11);
        copy(14, l1.ecx, 29);
        copy(15, l7.ebx, 5);
    }
    // ZMM state supported (opmask and the two ZMM components as well).
    if ld.eax & 0xE7 == 0xE7 {
        copy(20, l7.ebx, 16);
        copy(21, l7.ebx, 28);
        copy(22, l7.ebx, 31);
        copy(23, l7.ebx, 17);
        copy(24, l7.ebx, 30);
        copy(25, l7.ebx, 21);
        copy(26, l7.ecx, 1);
        copy(27, l7.ecx, 14);
        copy(28, l7.ecx, 11);
        copy(29, l7.ecx, 6);
        copy(30, l7.ecx, 12);
        copy(31, l7_1.eax, 5);
        copy(32, l7.edx, 23);
    }
    // AMX tile state supported.
    if ld.eax & 0x6_0000 == 0x6_0000 {
        copy(50, l7.edx, 24);
        copy(51, l7.edx, 25);
        copy(52, l7.edx, 22);
    }
    [w, 0, 0, 0, 0, 0, 0, 0]
}

#[cfg(not(target_arch = "x86_64"))]
fn read_host() -> [u64; 8] {
    [0; 8]
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn host_bits_agree_with_std_detection() {
        let data = host_cpu_data();
        let std_says = [
            ("sse3", std::arch::is_x86_feature_detected!("sse3")),
            ("ssse3", std::arch::is_x86_feature_detected!("ssse3")),
            ("sse4.1", std::arch::is_x86_feature_detected!("sse4.1")),
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
            (
                "avx512vnni",
                std::arch::is_x86_feature_detected!("avx512vnni"),
            ),
        ];
        for (name, detected) in std_says {
            assert_eq!(lookup_feature(&data, name), Some(detected as i64), "{name}");
        }
        assert_eq!(data[1..], [0; 7]);
    }

    #[test]
    fn lookup_uses_upstream_bit_positions() {
        let mut data = [0u64; 8];
        data[0] = (1 << 15) | (1 << 32) | (1 << 51);
        assert_eq!(lookup_feature(&data, "avx2"), Some(1));
        assert_eq!(lookup_feature(&data, "avx512fp16"), Some(1));
        assert_eq!(lookup_feature(&data, "amx-int8"), Some(1));
        assert_eq!(lookup_feature(&data, "avx"), Some(0));
        assert_eq!(lookup_feature(&data, "neon"), None);
        assert_eq!(lookup_feature(&data, ""), None);
    }
}
