//! The parameter index: named parameters and where their bytes live.

use std::collections::HashMap;

use ferrite_base::{bail, Result};

use super::file_handle::FileHandle;

/// Where a parameter's bytes come from.
#[derive(Clone, Debug)]
pub enum Storage {
    /// A repeating little-endian pattern of 1 to 16 bytes; nothing is stored.
    Splat {
        /// The pattern; its length divides the parameter length.
        pattern: Vec<u8>,
    },
    /// `length` bytes at `offset` of a file.
    File {
        /// The file holding the bytes.
        handle: FileHandle,
        /// Byte offset of the parameter in the file.
        offset: u64,
    },
}

/// One named parameter.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The parameter's name within its scope.
    pub key: String,
    /// Optional opaque metadata (archive formats may store it).
    pub metadata: Vec<u8>,
    /// Length in bytes.
    pub length: u64,
    /// Where the bytes are.
    pub storage: Storage,
}

/// An ordered set of parameters looked up by key. When two entries share a
/// key the first one added wins, as upstream.
#[derive(Clone, Debug, Default)]
pub struct ParameterIndex {
    entries: Vec<Entry>,
    by_key: HashMap<String, usize>,
}

impl ParameterIndex {
    /// An empty index.
    pub fn new() -> ParameterIndex {
        ParameterIndex::default()
    }

    /// Adds `entry` after checking that its storage can hold it.
    pub fn add(&mut self, entry: Entry) -> Result<()> {
        match &entry.storage {
            Storage::Splat { pattern } => {
                let p = pattern.len() as u64;
                if !matches!(p, 1 | 2 | 4 | 8 | 16) {
                    bail!(
                        InvalidArgument,
                        "parameter '{}': splat pattern must be 1, 2, 4, 8 or 16 bytes, got {p}",
                        entry.key
                    );
                }
                if !entry.length.is_multiple_of(p) {
                    bail!(
                        InvalidArgument,
                        "parameter '{}': length {} is not a multiple of its {p} byte splat pattern",
                        entry.key,
                        entry.length
                    );
                }
            }
            Storage::File { handle, offset } => {
                let size = handle.len();
                if offset.checked_add(entry.length).is_none_or(|e| e > size) {
                    bail!(
                        OutOfRange,
                        "parameter '{}': bytes {offset}+{} are outside file '{}' of {size} bytes",
                        entry.key,
                        entry.length,
                        handle.name()
                    );
                }
            }
        }
        self.by_key
            .entry(entry.key.clone())
            .or_insert(self.entries.len());
        self.entries.push(entry);
        Ok(())
    }

    /// Adds `length` bytes at `offset` of `handle` as parameter `key`.
    pub fn add_file(
        &mut self,
        key: &str,
        handle: &FileHandle,
        offset: u64,
        length: u64,
        metadata: Vec<u8>,
    ) -> Result<()> {
        self.add(Entry {
            key: key.to_string(),
            metadata,
            length,
            storage: Storage::File {
                handle: handle.clone(),
                offset,
            },
        })
    }

    /// Adds a splat parameter of `length` bytes repeating `pattern`.
    pub fn add_splat(
        &mut self,
        key: &str,
        pattern: &[u8],
        length: u64,
        metadata: Vec<u8>,
    ) -> Result<()> {
        self.add(Entry {
            key: key.to_string(),
            metadata,
            length,
            storage: Storage::Splat {
                pattern: pattern.to_vec(),
            },
        })
    }

    /// Reserves room for `additional` more entries.
    pub fn reserve(&mut self, additional: usize) {
        self.entries.reserve(additional);
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the index has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in the order they were added.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry named `key`.
    pub fn lookup(&self, key: &str) -> Result<&Entry> {
        match self.by_key.get(key) {
            Some(&i) => Ok(&self.entries[i]),
            None => bail!(NotFound, "no parameter found in index with key '{key}'"),
        }
    }
}
