//! A safetensors header of 200,000 entries (about 13 MB of JSON) whose
//! last tensor repeats the first one's name is refused with a clean error
//! (found only after the whole header was read and the tensors' ranges
//! checked), and parsing it stays lean: the process's peak RSS grows by the mapped header plus a
//! bounded amount (the `safetensors` crate's serde maps took 175 MB for
//! this file; upstream's runtime 37 MB). Its own test binary, one test:
//! the peak is the process's.

use ferrite_base::StatusCode;
use ferrite_modules::io_parameters::formats;
use ferrite_modules::io_parameters::{FileHandle, ParameterIndex};
use std::io::Write;

/// The process's peak resident set (`VmHWM`) in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/self/status");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmHWM value");
    kb * 1024
}

/// Resets the peak to the current resident set (Linux `clear_refs` 5).
fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak RSS");
}

#[test]
fn big_header_error_is_clean_and_lean() {
    const ENTRIES: usize = 200_000;
    let dir = std::env::temp_dir().join(format!("ferrite-st-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.safetensors");
    {
        // 16 f32s each; the data section is a hole in the file (set_len),
        // so it costs neither disk nor memory.
        let mut json = String::with_capacity(ENTRIES * 70);
        json.push_str("{\"__metadata__\":{\"format\":\"pt\"}");
        for i in 0..ENTRIES {
            let begin = i * 64;
            // The last tensor takes the first one's name.
            let name = if i + 1 == ENTRIES { 0 } else { i };
            json.push_str(&format!(
                ",\"w{name}\":{{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[{begin},{}]}}",
                begin + 64
            ));
        }
        json.push('}');
        assert!(json.len() > 13_000_000, "{} bytes", json.len());
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&(json.len() as u64).to_le_bytes()).unwrap();
        f.write_all(json.as_bytes()).unwrap();
        f.set_len(8 + json.len() as u64 + 64 * ENTRIES as u64)
            .unwrap();
    }
    let header_bytes = std::fs::metadata(&path).unwrap().len() - 64 * ENTRIES as u64;
    reset_peak_rss();
    let before = peak_rss();
    let handle = FileHandle::open(&path).unwrap();
    let mut index = ParameterIndex::new();
    let err = formats::parse_into(&mut index, &handle, None).unwrap_err();
    let growth = peak_rss().saturating_sub(before);
    drop(handle);
    std::fs::remove_dir_all(&dir).ok();
    println!(
        "header of {header_bytes} bytes: peak RSS grew {:.1} MB; error: {err}",
        growth as f64 / 1e6
    );
    assert_eq!(err.code(), StatusCode::InvalidArgument, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("header at offset 0") && msg.contains("'w0' appears more than once"),
        "{msg}"
    );
    assert!(
        index.entries().is_empty(),
        "nothing is indexed from a bad file"
    );
    // The mapped header itself, plus a bounded parse (about 10 bytes per
    // entry beyond the JSON's own ~70).
    let bound = header_bytes + 24_000_000;
    assert!(
        growth <= bound,
        "peak RSS grew {growth} bytes for a {header_bytes}-byte header (bound {bound})"
    );
}
