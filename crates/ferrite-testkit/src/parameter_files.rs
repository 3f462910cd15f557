//! Parameter files (GGUF, safetensors) written byte by byte, so tests can
//! feed the parameter readers and upstream's tools files of known layout.

/// A GGUF v3 file: one string and one `general.alignment` key/value, then
/// the tensors (name, dims, GGML type) with their data.
pub fn gguf(alignment: u32, tensors: &[(&str, &[u64], u32, Vec<u8>)]) -> Vec<u8> {
    let mut f = Vec::new();
    let string = |f: &mut Vec<u8>, s: &str| {
        f.extend_from_slice(&(s.len() as u64).to_le_bytes());
        f.extend_from_slice(s.as_bytes());
    };
    f.extend_from_slice(b"GGUF");
    f.extend_from_slice(&3u32.to_le_bytes());
    f.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    f.extend_from_slice(&2u64.to_le_bytes());
    string(&mut f, "general.name");
    f.extend_from_slice(&8u32.to_le_bytes());
    string(&mut f, "test");
    string(&mut f, "general.alignment");
    f.extend_from_slice(&4u32.to_le_bytes());
    f.extend_from_slice(&alignment.to_le_bytes());
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for (name, dims, ty, data) in tensors {
        string(&mut f, name);
        f.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in *dims {
            f.extend_from_slice(&d.to_le_bytes());
        }
        f.extend_from_slice(&ty.to_le_bytes());
        f.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + data.len() as u64).div_ceil(alignment as u64) * alignment as u64;
    }
    let start = (f.len() as u64).div_ceil(alignment as u64) * alignment as u64;
    for ((_, _, _, data), o) in tensors.iter().zip(offsets) {
        f.resize((start + o) as usize, 0);
        f.extend_from_slice(data);
    }
    f
}

/// A safetensors file with a JSON header describing `tensors` (all F32).
pub fn safetensors(tensors: &[(&str, &[u64], Vec<u8>)]) -> Vec<u8> {
    let mut header = String::from("{");
    let mut offset = 0;
    for (i, (name, shape, data)) in tensors.iter().enumerate() {
        let shape: Vec<String> = shape.iter().map(u64::to_string).collect();
        header += &format!(
            "{}\"{name}\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{offset},{}]}}",
            if i > 0 { "," } else { "" },
            shape.join(","),
            offset + data.len()
        );
        offset += data.len();
    }
    header += "}";
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    for (_, _, data) in tensors {
        f.extend_from_slice(data);
    }
    f
}
