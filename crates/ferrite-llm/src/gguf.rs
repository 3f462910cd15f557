//! The metadata and tensor table of a `.gguf` file (versions 2 and 3):
//! what the generate loop needs besides the weights (architecture numbers,
//! the tokenizer, the chat template) and the tensor types and shapes the
//! program is checked against. The weights themselves are read by the
//! program through `io_parameters`.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use ferrite::{Result, Status, StatusCode};

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// Any integer type (u8..i64, bool as 0/1).
    Int(i64),
    /// f32 or f64.
    Float(f64),
    /// A string.
    Str(String),
    /// An array of values.
    Array(Vec<MetaValue>),
}

/// One tensor's entry in the table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// GGML type number (0 F32, 3 Q4_1, 8 Q8_0, ...).
    pub ggml_type: u32,
    /// Dimensions as GGUF lists them (innermost first).
    pub dims: Vec<u64>,
}

/// The parsed header of a `.gguf` file.
#[derive(Debug)]
pub struct GgufFile {
    /// Metadata by key.
    pub meta: HashMap<String, MetaValue>,
    /// Tensors by name.
    pub tensors: HashMap<String, TensorInfo>,
}

/// The name of a GGML type number.
pub fn ggml_type_name(t: u32) -> String {
    match t {
        0 => "F32".into(),
        1 => "F16".into(),
        2 => "Q4_0".into(),
        3 => "Q4_1".into(),
        6 => "Q5_0".into(),
        7 => "Q5_1".into(),
        8 => "Q8_0".into(),
        n => format!("type {n}"),
    }
}

fn bad(path: &Path, what: impl std::fmt::Display) -> Status {
    Status::new(
        StatusCode::InvalidArgument,
        format!("gguf '{}': {what}", path.display()),
    )
}

/// Reads the header front to back from `r`, which holds `len` bytes in
/// all: only the header is read, never the tensor data after it (a model
/// file is mostly tensor data; reading it whole cost its size in memory
/// while loading).
struct Reader<'a, R: Read> {
    r: R,
    at: u64,
    len: u64,
    path: &'a Path,
}

impl<R: Read> Reader<'_, R> {
    /// Checks that `n` more bytes lie within the input.
    fn check(&self, n: u64, what: &str) -> Result<()> {
        if self.at.checked_add(n).is_none_or(|e| e > self.len) {
            return Err(bad(
                self.path,
                format!("truncated at offset {} reading {what} ({n} bytes)", self.at),
            ));
        }
        Ok(())
    }
    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        self.check(buf.len() as u64, what)?;
        self.r.read_exact(buf).map_err(|e| {
            bad(
                self.path,
                format!("reading {what} at offset {}: {e}", self.at),
            )
        })?;
        self.at += buf.len() as u64;
        Ok(())
    }
    fn take(&mut self, n: u64, what: &str) -> Result<Vec<u8>> {
        // Checked against the input's length before allocating: a corrupt
        // length is an error, not a huge allocation.
        self.check(n, what)?;
        let n =
            usize::try_from(n).map_err(|_| bad(self.path, format!("{what}: size overflows")))?;
        let mut v = vec![0; n];
        self.fill(&mut v, what)?;
        Ok(v)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let mut b = [0; 4];
        self.fill(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let mut b = [0; 8];
        self.fill(&mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        let s = self.take(n, what)?;
        Ok(String::from_utf8(s)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<MetaValue> {
        let mut fixed = |n: usize| -> Result<[u8; 8]> {
            let mut b = [0u8; 8];
            self.fill(&mut b[..n], key)?;
            Ok(b)
        };
        Ok(match ty {
            0 | 7 => MetaValue::Int(i64::from(fixed(1)?[0])),
            1 => MetaValue::Int(i64::from(fixed(1)?[0] as i8)),
            2 => MetaValue::Int(i64::from(u16::from_le_bytes(
                fixed(2)?[..2].try_into().unwrap_or_default(),
            ))),
            3 => MetaValue::Int(i64::from(i16::from_le_bytes(
                fixed(2)?[..2].try_into().unwrap_or_default(),
            ))),
            4 => MetaValue::Int(i64::from(u32::from_le_bytes(
                fixed(4)?[..4].try_into().unwrap_or_default(),
            ))),
            5 => MetaValue::Int(i64::from(i32::from_le_bytes(
                fixed(4)?[..4].try_into().unwrap_or_default(),
            ))),
            6 => MetaValue::Float(f64::from(f32::from_le_bytes(
                fixed(4)?[..4].try_into().unwrap_or_default(),
            ))),
            10 | 11 => MetaValue::Int(i64::from_le_bytes(fixed(8)?)),
            12 => MetaValue::Float(f64::from_le_bytes(fixed(8)?)),
            8 => MetaValue::Str(self.string(key)?),
            9 => {
                if depth > 0 {
                    return Err(bad(
                        self.path,
                        format!("metadata '{key}': nested arrays are not supported"),
                    ));
                }
                let elem = self.u32(key)?;
                let count = self.u64(key)?;
                // Every element takes at least one byte: a count past the
                // file's end is corrupt, not a reason to allocate.
                if count > self.len - self.at {
                    return Err(bad(self.path, format!("metadata '{key}': array of {count} elements passes the end of the file")));
                }
                let mut v = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                MetaValue::Array(v)
            }
            other => {
                return Err(bad(
                    self.path,
                    format!("metadata '{key}': unknown value type {other}"),
                ))
            }
        })
    }
}

impl GgufFile {
    /// Reads the header of the file at `path` (metadata and tensor table;
    /// the tensor data is not read).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let cannot = |e: std::io::Error| {
            Status::new(
                if e.kind() == std::io::ErrorKind::NotFound {
                    StatusCode::NotFound
                } else {
                    StatusCode::Unavailable
                },
                format!("gguf '{}': cannot read: {e}", path.display()),
            )
        };
        let file = std::fs::File::open(path).map_err(cannot)?;
        let meta = file.metadata().map_err(cannot)?;
        if meta.is_dir() {
            return Err(cannot(std::io::Error::other("it is a directory")));
        }
        let len = meta.len();
        Self::read_from(std::io::BufReader::with_capacity(1 << 16, file), len, path)
    }

    /// Parses a header from bytes (`path` only names it in errors).
    pub fn parse(bytes: &[u8], path: &Path) -> Result<GgufFile> {
        Self::read_from(bytes, bytes.len() as u64, path)
    }

    /// Parses the header from `input`, `len` bytes in all.
    fn read_from(input: impl Read, len: u64, path: &Path) -> Result<GgufFile> {
        let mut r = Reader {
            r: input,
            at: 0,
            len,
            path,
        };
        let mut magic = [0; 4];
        if len < 4 || r.fill(&mut magic, "magic").is_err() || &magic != b"GGUF" {
            return Err(bad(path, "not a GGUF file (the magic 'GGUF' is missing)"));
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(bad(
                path,
                format!("GGUF version {version} is not supported (2 or 3)"),
            ));
        }
        let tensors = r.u64("tensor count")?;
        let kvs = r.u64("metadata count")?;
        let mut meta = HashMap::new();
        for _ in 0..kvs {
            let key = r.string("metadata key")?;
            let ty = r.u32("metadata type")?;
            let v = r.value(ty, &key, 0)?;
            meta.insert(key, v);
        }
        let mut table = HashMap::new();
        for _ in 0..tensors {
            let name = r.string("tensor name")?;
            let n = r.u32("tensor dimension count")?;
            if n > 8 {
                return Err(bad(path, format!("tensor '{name}' has {n} dimensions")));
            }
            let dims = (0..n)
                .map(|_| r.u64("tensor dimension"))
                .collect::<Result<Vec<_>>>()?;
            let ggml_type = r.u32("tensor type")?;
            r.u64("tensor offset")?;
            table.insert(name, TensorInfo { ggml_type, dims });
        }
        Ok(GgufFile {
            meta,
            tensors: table,
        })
    }

    fn get(&self, key: &str) -> Result<&MetaValue> {
        self.meta.get(key).ok_or_else(|| {
            Status::new(
                StatusCode::InvalidArgument,
                format!("gguf metadata '{key}' is missing"),
            )
        })
    }

    /// An integer metadata value.
    pub fn int(&self, key: &str) -> Result<i64> {
        match self.get(key)? {
            MetaValue::Int(v) => Ok(*v),
            other => Err(Status::new(
                StatusCode::InvalidArgument,
                format!("gguf metadata '{key}' is {other:?}, expected an integer"),
            )),
        }
    }

    /// A float metadata value.
    pub fn float(&self, key: &str) -> Result<f64> {
        match self.get(key)? {
            MetaValue::Float(v) => Ok(*v),
            MetaValue::Int(v) => Ok(*v as f64),
            other => Err(Status::new(
                StatusCode::InvalidArgument,
                format!("gguf metadata '{key}' is {other:?}, expected a number"),
            )),
        }
    }

    /// A string metadata value.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.get(key)? {
            MetaValue::Str(v) => Ok(v),
            _ => Err(Status::new(
                StatusCode::InvalidArgument,
                format!("gguf metadata '{key}' is not a string"),
            )),
        }
    }

    /// An array metadata value.
    pub fn array(&self, key: &str) -> Result<&[MetaValue]> {
        match self.get(key)? {
            MetaValue::Array(v) => Ok(v),
            _ => Err(Status::new(
                StatusCode::InvalidArgument,
                format!("gguf metadata '{key}' is not an array"),
            )),
        }
    }

    /// Checks that tensor `name` exists with GGML type `ty` and dims.
    pub fn expect_tensor(&self, name: &str, ty: u32, dims: &[u64]) -> Result<()> {
        let t = self.tensors.get(name).ok_or_else(|| {
            Status::new(
                StatusCode::NotFound,
                format!("gguf tensor '{name}' is missing (the program reads it)"),
            )
        })?;
        if t.ggml_type != ty {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!(
                    "gguf tensor '{name}' is {}, the program expects {}",
                    ggml_type_name(t.ggml_type),
                    ggml_type_name(ty)
                ),
            ));
        }
        if t.dims != dims {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!(
                    "gguf tensor '{name}' has dims {:?}, the program expects {dims:?}",
                    t.dims
                ),
            ));
        }
        Ok(())
    }
}
