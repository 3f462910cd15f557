//! Parameter files: each format indexes correctly, malformed files give
//! errors naming the file offset, irpa archives round-trip through the
//! writer, and on the CPU a loaded parameter is the mapped file's memory
//! (no copy) when the program promises not to write it.

use std::sync::Arc;

use ferrite_base::StatusCode;
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::device::Device;
use ferrite_hal::{BufferUsage, Fence, MemoryType};
use ferrite_hal_cpu::CpuDevice;
use ferrite_modules::io_parameters::formats::{self, irpa};
use ferrite_modules::io_parameters::{
    FileHandle, ParameterIndex, ParameterProvider, Span, Storage,
};
use ferrite_testkit::f32_bytes;
use ferrite_testkit::parameter_files::{gguf, safetensors};

fn memory(bytes: Vec<u8>, name: &str) -> FileHandle {
    FileHandle::from_shared(Arc::new(bytes), name)
}

fn parse(bytes: Vec<u8>, format: &str) -> ferrite_base::Result<ParameterIndex> {
    let mut index = ParameterIndex::new();
    formats::parse_into(&mut index, &memory(bytes, &format!("test.{format}")), None)?;
    Ok(index)
}

fn entry_bytes(index: &ParameterIndex, key: &str) -> Vec<u8> {
    let e = index.lookup(key).unwrap();
    match &e.storage {
        Storage::File { handle, offset } => handle
            .with_range(*offset, e.length, |b| b.to_vec())
            .unwrap(),
        Storage::Splat { pattern } => pattern
            .iter()
            .copied()
            .cycle()
            .take(e.length as usize)
            .collect(),
    }
}

fn sample_index() -> ParameterIndex {
    let mut index = ParameterIndex::new();
    let h = memory(f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0]), "host");
    index.add_file("a", &h, 4, 12, b"meta".to_vec()).unwrap();
    index.add_splat("s", &[0xAA, 0xBB], 10, Vec::new()).unwrap();
    index.add_file("b", &h, 0, 20, Vec::new()).unwrap();
    index
}

fn archive(index: &ParameterIndex) -> Vec<u8> {
    let mut out = Vec::new();
    irpa::write_archive(index, &mut out).unwrap();
    out
}

#[test]
fn irpa_round_trip() {
    let index = sample_index();
    let bytes = archive(&index);
    let back = parse(bytes, "irpa").unwrap();
    assert_eq!(back.len(), 3);
    assert_eq!(entry_bytes(&back, "a"), f32_bytes(&[2.0, 3.0, 4.0]));
    assert_eq!(
        entry_bytes(&back, "b"),
        f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0])
    );
    assert_eq!(back.lookup("a").unwrap().metadata, b"meta");
    let s = back.lookup("s").unwrap();
    assert!(matches!(&s.storage, Storage::Splat { pattern } if pattern == &[0xAA, 0xBB]));
    assert_eq!(s.length, 10);
    // Data is aligned so that maps import without a copy.
    for key in ["a", "b"] {
        let Storage::File { offset, .. } = back.lookup(key).unwrap().storage else {
            panic!()
        };
        assert_eq!(offset % irpa::DATA_ALIGNMENT, 0, "{key} at {offset}");
    }
}

fn error_of(bytes: Vec<u8>, format: &str) -> (StatusCode, String) {
    let e = parse(bytes, format).expect_err("malformed file must be rejected");
    (e.code(), e.to_string())
}

#[test]
fn irpa_malformed_files_name_the_offset() {
    let good = archive(&sample_index());
    let (code, msg) = error_of(good[..20].to_vec(), "irpa");
    assert_eq!(code, StatusCode::InvalidArgument);
    assert!(
        msg.contains("offset 0") && msg.contains("20 bytes"),
        "{msg}"
    );

    let mut bad = good.clone();
    bad[0] = b'X';
    let (_, msg) = error_of(bad, "irpa");
    assert!(
        msg.contains("magic at offset 0") && msg.contains("41505249"),
        "{msg}"
    );

    let mut bad = good.clone();
    bad[4] = 1; // major version 1
    let (code, msg) = error_of(bad, "irpa");
    assert_eq!(code, StatusCode::Unimplemented);
    assert!(msg.contains("version 1.0"), "{msg}");

    // Storage segment longer than the file.
    let mut bad = good.clone();
    bad[80..88].copy_from_slice(&u64::MAX.to_le_bytes());
    let (code, msg) = error_of(bad, "irpa");
    assert_eq!(code, StatusCode::OutOfRange);
    assert!(
        msg.contains("storage segment") && msg.contains(&format!("{} bytes", good.len())),
        "{msg}"
    );

    // First entry's name outside the metadata segment; the entry table
    // starts at offset 96.
    let mut bad = good.clone();
    bad[96 + 20..96 + 28].copy_from_slice(&1_000_000u64.to_le_bytes());
    let (code, msg) = error_of(bad, "irpa");
    assert_eq!(code, StatusCode::OutOfRange);
    assert!(
        msg.contains("entry at offset 96") && msg.contains("metadata segment"),
        "{msg}"
    );

    // File truncated inside the storage segment.
    let (code, msg) = error_of(good[..good.len() - 4].to_vec(), "irpa");
    assert_eq!(code, StatusCode::OutOfRange);
    assert!(msg.contains("storage segment"), "{msg}");

    // A next-header link past the end of the file.
    let mut bad = good;
    bad[16..24].copy_from_slice(&4096u64.to_le_bytes());
    let (_, msg) = error_of(bad, "irpa");
    assert!(msg.contains("next header at offset 4096"), "{msg}");
}

#[test]
fn gguf_tensors_index_at_their_aligned_offsets() {
    let w = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let q = vec![7u8; 18]; // one Q4_0 block of 32 elements
    let bytes = gguf(
        64,
        &[("w", &[3, 2], 0, w.clone()), ("q", &[32], 2, q.clone())],
    );
    let index = parse(bytes, "gguf").unwrap();
    assert_eq!(index.len(), 2);
    assert_eq!(entry_bytes(&index, "w"), w);
    assert_eq!(entry_bytes(&index, "q"), q);
    for key in ["w", "q"] {
        let Storage::File { offset, .. } = index.lookup(key).unwrap().storage else {
            panic!()
        };
        assert_eq!(offset % 64, 0);
    }
}

#[test]
fn gguf_malformed_files_name_the_offset() {
    let good = gguf(32, &[("w", &[4], 0, f32_bytes(&[1.0, 2.0, 3.0, 4.0]))]);
    let (code, msg) = error_of(good[..10].to_vec(), "gguf");
    assert_eq!(code, StatusCode::OutOfRange);
    assert!(
        msg.contains("tensor count needs 8 bytes at offset 8"),
        "{msg}"
    );

    let mut bad = good.clone();
    bad[4] = 9;
    let (code, msg) = error_of(bad, "gguf");
    assert_eq!(code, StatusCode::Unimplemented);
    assert!(msg.contains("version 9 at offset 4"), "{msg}");

    // Data cut short: the tensor's bytes run past the file.
    let (code, msg) = error_of(good[..good.len() - 1].to_vec(), "gguf");
    assert_eq!(code, StatusCode::OutOfRange);
    assert!(
        msg.contains("tensor 'w' at offset") && msg.contains("data section"),
        "{msg}"
    );

    // Unknown GGML type 4 (a gap in the type list).
    let bad = gguf(32, &[("w", &[4], 4, vec![0; 16])]);
    let (code, msg) = error_of(bad, "gguf");
    assert_eq!(code, StatusCode::Unimplemented);
    assert!(msg.contains("GGML type 4"), "{msg}");

    // A string length far past the end.
    let mut bad = good;
    bad[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    let (_, msg) = error_of(bad, "gguf");
    assert!(
        msg.contains("metadata key needs") && msg.contains("at offset 32"),
        "{msg}"
    );
}

#[test]
fn safetensors_index_in_data_order() {
    let a = f32_bytes(&[1.0, 2.0]);
    let b = f32_bytes(&[3.0, 4.0, 5.0]);
    let index = parse(
        safetensors(&[("b", &[3], b.clone()), ("a", &[2], a.clone())]),
        "safetensors",
    )
    .unwrap();
    let keys: Vec<_> = index.entries().iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["b", "a"]);
    assert_eq!(entry_bytes(&index, "a"), a);
    assert_eq!(entry_bytes(&index, "b"), b);
}

#[test]
fn safetensors_malformed_files_are_rejected() {
    let good = safetensors(&[("a", &[2], f32_bytes(&[1.0, 2.0]))]);
    let (code, msg) = error_of(good[..good.len() - 2].to_vec(), "safetensors");
    assert_eq!(code, StatusCode::InvalidArgument);
    assert!(msg.contains("header at offset 0"), "{msg}");
    let mut bad = good;
    bad[0..8].copy_from_slice(&1_000_000u64.to_le_bytes());
    let (_, msg) = error_of(bad, "safetensors");
    assert!(msg.contains("declared JSON length 1000000"), "{msg}");
}

#[test]
fn unknown_formats_are_named() {
    let e = parse(vec![1, 2, 3], "bin").unwrap_err();
    assert_eq!(e.code(), StatusCode::Unimplemented);
    assert!(e.to_string().contains("'bin'") && e.to_string().contains("irpa, gguf, safetensors"));
}

fn cpu() -> Arc<dyn Device> {
    CpuDevice::local_sync()
}

fn load(
    provider: &ParameterProvider,
    usage: BufferUsage,
    spans: &[Span],
) -> ferrite_base::Result<Vec<ferrite_hal::buffer::Buffer>> {
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, usage);
    let signal = Fence::new();
    let out = provider.load(&cpu(), &Fence::new(), &signal, &params, spans)?;
    Ok(out)
}

fn span(key: &str, length: u64) -> Span {
    Span {
        key: key.to_string(),
        parameter_offset: 0,
        buffer_offset: 0,
        length,
    }
}

#[test]
fn cpu_loads_of_immutable_parameters_are_the_mapped_file() {
    let dir = std::env::temp_dir().join(format!("ferrite-params-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("zero_copy.irpa");
    irpa::save_archive_file(&sample_index(), &path).unwrap();
    let handle = FileHandle::open(&path).unwrap();
    let mut index = ParameterIndex::new();
    formats::parse_into(&mut index, &handle, None).unwrap();
    let Storage::File { offset, .. } = index.lookup("b").unwrap().storage else {
        panic!()
    };
    let file_ptr = handle.with_bytes(|b| b.as_ptr() as usize) + offset as usize;
    let provider = ParameterProvider::new("model", index);

    // Read-only file memory backs buffers no dispatch may write.
    let immutable = BufferUsage::TRANSFER
        | BufferUsage::MAPPING
        | BufferUsage::DISPATCH_STORAGE_READ
        | BufferUsage::SHARING_IMMUTABLE;
    let b = load(&provider, immutable, &[span("b", 20)])
        .unwrap()
        .remove(0);
    let mapped = b.map_read(0, 20).unwrap();
    assert_eq!(&mapped[..], &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0])[..]);
    assert_eq!(
        mapped.as_ptr() as usize,
        file_ptr,
        "immutable parameter was copied"
    );
    drop(mapped);

    // A buffer the program may write gets its own copy.
    let b = load(&provider, BufferUsage::DEFAULT, &[span("b", 20)])
        .unwrap()
        .remove(0);
    let mapped = b.map_read(0, 20).unwrap();
    assert_eq!(&mapped[..], &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0])[..]);
    assert_ne!(
        mapped.as_ptr() as usize,
        file_ptr,
        "a writable parameter was mapped"
    );
    drop(mapped);
    // An immutable one that dispatches bind (DISPATCH_STORAGE, as the
    // compiler asks for constants) is a program constant: mapped in place,
    // and its host view stays read-only.
    let usage = BufferUsage::DEFAULT | BufferUsage::SHARING_IMMUTABLE;
    let b = load(&provider, usage, &[span("b", 20)]).unwrap().remove(0);
    let mapped = b.map_read(0, 20).unwrap();
    assert_eq!(mapped.as_ptr() as usize, file_ptr, "{usage}");
    drop(mapped);
    assert!(
        b.write(0, &[0u8; 4]).is_err(),
        "a mapped constant was writable"
    );

    // Splats are filled; parts of a parameter load at an offset.
    let got = load(
        &provider,
        immutable,
        &[
            span("s", 10),
            Span {
                key: "b".into(),
                parameter_offset: 8,
                buffer_offset: 0,
                length: 8,
            },
        ],
    )
    .unwrap();
    assert_eq!(got[0].to_vec().unwrap(), [0xAA, 0xBB].repeat(5));
    assert_eq!(got[1].to_vec().unwrap(), f32_bytes(&[3.0, 4.0]));
    drop(provider);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn provider_errors_name_the_parameter() {
    let provider = ParameterProvider::new("", sample_index());
    let e = load(&provider, BufferUsage::DEFAULT, &[span("missing", 4)]).unwrap_err();
    assert_eq!(e.code(), StatusCode::NotFound);
    assert!(e.to_string().contains("key 'missing'"), "{e}");
    let e = load(&provider, BufferUsage::DEFAULT, &[span("a", 13)]).unwrap_err();
    assert_eq!(e.code(), StatusCode::OutOfRange);
    assert!(
        e.to_string()
            .contains("parameter `a` range out of bounds (offset=0, length=13, size=12)"),
        "{e}"
    );
    // Read-only storage cannot be scattered into.
    let src = cpu()
        .allocator()
        .allocate(
            &BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT),
            12,
        )
        .unwrap();
    let e = provider
        .scatter(&cpu(), &Fence::new(), &Fence::new(), &src, &[span("a", 12)])
        .unwrap_err();
    assert_eq!(e.code(), StatusCode::PermissionDenied);
}

#[test]
fn gather_and_scatter_move_bytes() {
    let target_file = FileHandle::from_writable(vec![0; 16], "scratch");
    let mut index = sample_index();
    index
        .add_file("out", &target_file, 4, 8, Vec::new())
        .unwrap();
    let provider = ParameterProvider::new("", index);
    let device = cpu();
    let buffer = device
        .allocator()
        .allocate(
            &BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT),
            24,
        )
        .unwrap();
    let signal = Fence::new();
    provider
        .gather(
            &device,
            &Fence::new(),
            &signal,
            &buffer,
            &[
                Span {
                    key: "a".into(),
                    parameter_offset: 0,
                    buffer_offset: 0,
                    length: 12,
                },
                Span {
                    key: "s".into(),
                    parameter_offset: 0,
                    buffer_offset: 12,
                    length: 10,
                },
            ],
        )
        .unwrap();
    assert!(signal.wait(ferrite_base::Timeout::INFINITE).unwrap());
    let got = buffer.to_vec().unwrap();
    assert_eq!(&got[..12], &f32_bytes(&[2.0, 3.0, 4.0])[..]);
    assert_eq!(&got[12..22], &[0xAA, 0xBB].repeat(5)[..]);
    provider
        .scatter(
            &device,
            &Fence::new(),
            &Fence::new(),
            &buffer,
            &[Span {
                key: "out".into(),
                parameter_offset: 0,
                buffer_offset: 4,
                length: 8,
            }],
        )
        .unwrap();
    target_file.with_bytes(|b| {
        assert_eq!(&b[..4], &[0; 4]);
        assert_eq!(&b[4..12], &f32_bytes(&[3.0, 4.0])[..]);
    });
}

#[test]
fn scatter_into_a_writable_file_map_reaches_the_file() {
    let dir = std::env::temp_dir().join(format!("ferrite-params-w-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("writable.irpa");
    irpa::save_archive_file(&sample_index(), &path).unwrap();

    // A read-only map refuses the scatter; a writable one takes it.
    let handle = FileHandle::open_writable(&path).unwrap();
    assert!(handle.is_writable());
    assert!(!FileHandle::open(&path).unwrap().is_writable());
    let mut index = ParameterIndex::new();
    formats::parse_into(&mut index, &handle, None).unwrap();
    let provider = ParameterProvider::new("", index);
    let device = cpu();
    let source = device
        .allocator()
        .allocate(
            &BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT),
            8,
        )
        .unwrap();
    source.write(0, &f32_bytes(&[-7.0, 9.5])).unwrap();
    let signal = Fence::new();
    provider
        .scatter(
            &device,
            &Fence::new(),
            &signal,
            &source,
            &[Span {
                key: "b".into(),
                parameter_offset: 8,
                buffer_offset: 0,
                length: 8,
            }],
        )
        .unwrap();
    assert!(signal.wait(ferrite_base::Timeout::INFINITE).unwrap());
    drop(provider);
    drop(handle);

    // The file on disk now holds the scattered values in parameter "b".
    let reread = FileHandle::open(&path).unwrap();
    let mut index = ParameterIndex::new();
    formats::parse_into(&mut index, &reread, None).unwrap();
    assert_eq!(
        entry_bytes(&index, "b"),
        f32_bytes(&[1.0, 2.0, -7.0, 9.5, 5.0])
    );
    // Out-of-range writes name the file and change nothing.
    let e = reread.write(0, &[1]).unwrap_err();
    assert_eq!(e.code(), StatusCode::PermissionDenied);
    let w = FileHandle::open_writable(&path).unwrap();
    let len = w.len();
    let e = w.write(len - 2, &[0; 4]).unwrap_err();
    assert_eq!(e.code(), StatusCode::OutOfRange);
    assert!(e.to_string().contains("writable.irpa"), "{e}");
    let missing = FileHandle::open_writable(dir.join("missing.irpa")).unwrap_err();
    assert_eq!(missing.code(), StatusCode::NotFound);
    std::fs::remove_dir_all(&dir).ok();
}

/// Residency of the pages under `bytes` (`mincore`).
fn resident_pages(bytes: &[u8]) -> Vec<bool> {
    let page = 4096usize;
    let start = bytes.as_ptr() as usize / page * page;
    let end = (bytes.as_ptr() as usize + bytes.len()).div_ceil(page) * page;
    let mut v = vec![0u8; (end - start) / page];
    // SAFETY: `start..end` covers the pages of a live slice; `v` has one
    // byte per page.
    let r = unsafe { libc::mincore(start as *mut libc::c_void, end - start, v.as_mut_ptr()) };
    assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
    v.into_iter().map(|b| b & 1 == 1).collect()
}

#[test]
fn misaligned_safetensors_tensors_load_with_their_bytes() {
    let dir = std::env::temp_dir().join(format!("ferrite-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("misaligned.safetensors");
    // `small` first (20 bytes) leaves `big` (160000 bytes, several 64 KiB
    // chunks) at an offset that is 4 mod 8: never 64-byte aligned.
    let small = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0]);
    let big_values: Vec<f32> = (0..40_000).map(|i| (i % 1009) as f32 - 500.0).collect();
    let big = f32_bytes(&big_values);
    std::fs::write(
        &path,
        safetensors(&[
            ("small", &[5], small.clone()),
            ("big", &[40_000], big.clone()),
        ]),
    )
    .unwrap();
    let handle = FileHandle::open(&path).unwrap();
    let mut index = ParameterIndex::new();
    formats::parse_into(&mut index, &handle, None).unwrap();
    let Storage::File { offset, .. } = index.lookup("big").unwrap().storage else {
        panic!()
    };
    let map = handle.with_bytes(|b| b.as_ptr() as usize..b.as_ptr() as usize + b.len());
    assert_ne!((map.start + offset as usize) % 64, 0, "big is aligned");
    let demand_paged = handle.demand_paged_copy(offset, 65536).is_some();
    let provider = ParameterProvider::new("model", index);
    let immutable = BufferUsage::DEFAULT | BufferUsage::SHARING_IMMUTABLE;

    let got = load(
        &provider,
        immutable,
        &[
            span("big", big.len() as u64),
            span("small", 20),
            // Part of `big` starting mid-chunk, at another misalignment.
            Span {
                key: "big".into(),
                parameter_offset: 70_002,
                buffer_offset: 0,
                length: 80_000,
            },
        ],
    )
    .unwrap();
    let whole = got[0].map_read(0, big.len() as u64).unwrap();
    assert_eq!(
        whole.as_ptr() as usize % 64,
        0,
        "kernels need 64-byte alignment"
    );
    assert!(
        !map.contains(&(whole.as_ptr() as usize)),
        "bound misaligned file bytes"
    );
    if demand_paged {
        // Nothing was read at load; one element brings in its chunk only.
        assert!(resident_pages(&whole).iter().all(|r| !r), "copied at load");
        let i = 100_000;
        assert_eq!(whole[i], big[i]);
        let resident = resident_pages(&whole).iter().filter(|r| **r).count();
        assert!(
            (1..=16).contains(&resident),
            "{resident} pages resident after one read"
        );
    } else {
        ferrite_testkit::skip_or_fail(
            "misaligned_safetensors_tensors_load_with_their_bytes (demand paging)",
            "userfaultfd is unavailable here; checked the copy path only",
        );
    }
    assert_eq!(&whole[..], &big[..]);
    drop(whole);
    assert_eq!(got[1].to_vec().unwrap(), small);
    assert_eq!(got[2].to_vec().unwrap(), &big[70_002..150_002]);
    assert!(
        got[0].write(0, &[0u8; 4]).is_err(),
        "a constant was writable"
    );

    // A buffer the program may write is an ordinary copy.
    let b = load(
        &provider,
        BufferUsage::DEFAULT,
        &[span("big", big.len() as u64)],
    )
    .unwrap()
    .remove(0);
    assert_eq!(b.to_vec().unwrap(), big);
    b.write(0, &[0u8; 4]).unwrap();
    drop((got, b, provider));
    std::fs::remove_dir_all(&dir).ok();
}
