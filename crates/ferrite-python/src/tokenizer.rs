//! `Tokenizer`, `TokenizerEncodeStream`, `TokenizerDecodeStream`: text to
//! token ids and back for HuggingFace `tokenizer.json` files (and tiktoken
//! files, converted by [`crate::tiktoken`]), on the `tokenizers` crate
//! (pure-Rust regex backend; nothing is downloaded).
//!
//! Streaming follows one rule: what a stream returns, concatenated, equals
//! the batch result for the whole text. The encode stream re-encodes its
//! text as it grows and hands out only the tokens that more text can no
//! longer change (see [`EncodeState::feed`]); the decode stream keeps a
//! short window of ids so that decoders which look at neighbouring tokens
//! (spaces, byte fallback, incomplete UTF-8) see them.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use tokenizers::models::ModelWrapper;

use crate::byte_level::ByteLevelTable;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTokenizer>()?;
    m.add_class::<PyTokenizerEncodeStream>()?;
    m.add_class::<PyTokenizerDecodeStream>()?;
    Ok(())
}

/// The loaded tokenizer, shared by the Python object and its streams.
struct Loaded {
    tokenizer: tokenizers::Tokenizer,
    /// The same tokenizer with special-token matching off (special tokens
    /// in the text are split like ordinary text); built on first use.
    literal: OnceLock<tokenizers::Tokenizer>,
    model_type: &'static str,
    /// `unk` from the model's configuration.
    unk: Option<u32>,
    /// Bytes of the longest added token: a stream holds back that much
    /// text, since a partial added token may complete with the next chunk.
    longest_added: usize,
    /// True when each pre-tokenizer word encodes the same whatever text
    /// precedes it (see [`word_local`]): an encode stream may then drop the
    /// text of the tokens it handed out instead of re-encoding it.
    word_local: bool,
    /// Each id's bytes for the common byte-level decoder (None for other
    /// decoders); built on the first `decode`.
    byte_level: OnceLock<Option<ByteLevelTable>>,
}

impl Loaded {
    fn from_json(json: &str) -> PyResult<Loaded> {
        let tokenizer = tokenizers::Tokenizer::from_bytes(json.as_bytes())
            .map_err(|e| PyValueError::new_err(format!("Failed to parse tokenizer JSON: {e}")))?;
        let model_type = match tokenizer.get_model() {
            ModelWrapper::BPE(_) => "BPE",
            ModelWrapper::WordPiece(_) => "WordPiece",
            ModelWrapper::WordLevel(_) => "WordLevel",
            ModelWrapper::Unigram(_) => "Unigram",
        };
        let unk = unk_id(json, &tokenizer);
        let word_local = word_local(json);
        let longest_added = tokenizer
            .get_added_tokens_decoder()
            .values()
            .map(|t| t.content.len())
            .max()
            .unwrap_or(0);
        Ok(Loaded {
            tokenizer,
            literal: OnceLock::new(),
            model_type,
            unk,
            longest_added,
            word_local,
            byte_level: OnceLock::new(),
        })
    }

    fn pick(&self, no_special_token_matching: bool) -> &tokenizers::Tokenizer {
        if !no_special_token_matching {
            return &self.tokenizer;
        }
        self.literal.get_or_init(|| {
            let mut t = self.tokenizer.clone();
            t.set_encode_special_tokens(true);
            t
        })
    }

    fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
        no_special_token_matching: bool,
    ) -> PyResult<tokenizers::Encoding> {
        self.pick(no_special_token_matching)
            .encode(text, add_special_tokens)
            .map_err(|e| PyValueError::new_err(format!("Failed to encode text: {e}")))
    }

    /// Ids only: skips the offset bookkeeping that streams need.
    fn encode_ids(
        &self,
        text: &str,
        add_special_tokens: bool,
        no_special_token_matching: bool,
    ) -> PyResult<Vec<u32>> {
        let e = self
            .pick(no_special_token_matching)
            .encode_fast(text, add_special_tokens)
            .map_err(|e| PyValueError::new_err(format!("Failed to encode text: {e}")))?;
        Ok(e.get_ids().to_vec())
    }

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> PyResult<String> {
        let table = self
            .byte_level
            .get_or_init(|| ByteLevelTable::build(&self.tokenizer));
        if let Some(table) = table {
            return Ok(table.decode(ids, skip_special_tokens));
        }
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| PyValueError::new_err(format!("Failed to decode tokens: {e}")))
    }
}

/// The model's unknown-token id: `model.unk_token` (BPE, WordPiece,
/// WordLevel) or `model.unk_id` (Unigram) of the JSON.
fn unk_id(json: &str, tokenizer: &tokenizers::Tokenizer) -> Option<u32> {
    let value: serde_json::Value = serde_json::from_str(json).ok()?;
    let model = value.get("model")?;
    if let Some(id) = model.get("unk_id").and_then(|v| v.as_u64()) {
        return u32::try_from(id).ok();
    }
    let token = model.get("unk_token")?.as_str()?;
    tokenizer.token_to_id(token)
}

/// Whether the tokenizer described by `json` encodes each pre-tokenizer
/// word independently of the text before it. Only configurations known to
/// qualify count: no post-processor, character-local normalizers, splitters
/// whose patterns look neither behind nor at the start of the text, a
/// ByteLevel step that adds no prefix space, and added tokens that strip
/// no neighbouring whitespace.
fn word_local(json: &str) -> bool {
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(json) else {
        return false;
    };
    let absent = |v: Option<&serde_json::Value>| v.is_none_or(|v| v.is_null());
    fn kind(v: &serde_json::Value) -> &str {
        v.get("type").and_then(|t| t.as_str()).unwrap_or("")
    }
    fn normalizer_ok(v: &serde_json::Value) -> bool {
        match kind(v) {
            "NFC" | "NFD" | "NFKC" | "NFKD" | "Lowercase" | "BertNormalizer" => true,
            "Sequence" => v
                .get("normalizers")
                .and_then(|n| n.as_array())
                .is_some_and(|n| n.iter().all(normalizer_ok)),
            _ => false,
        }
    }
    fn pattern_ok(v: &serde_json::Value) -> bool {
        let pattern = v
            .get("pattern")
            .and_then(|p| p.get("Regex").or_else(|| p.get("String")))
            .and_then(|p| p.as_str());
        pattern.is_some_and(|p| {
            !["^", "$", "\\b", "\\B", "\\A", "\\z", "\\Z", "\\G", "(?<"]
                .iter()
                .any(|bad| p.contains(bad))
        })
    }
    fn pre_tokenizer_ok(v: &serde_json::Value) -> bool {
        match kind(v) {
            "ByteLevel" => v.get("add_prefix_space").and_then(|b| b.as_bool()) == Some(false),
            "Split" => pattern_ok(v),
            "BertPreTokenizer" | "Whitespace" | "WhitespaceSplit" | "Punctuation" | "Digits" => {
                true
            }
            "Sequence" => v
                .get("pretokenizers")
                .and_then(|n| n.as_array())
                .is_some_and(|n| n.iter().all(pre_tokenizer_ok)),
            _ => false,
        }
    }
    let normalizer = doc.get("normalizer");
    let pre = doc.get("pre_tokenizer");
    let added_ok = doc
        .get("added_tokens")
        .and_then(|a| a.as_array())
        .is_none_or(|tokens| {
            tokens.iter().all(|t| {
                ["lstrip", "rstrip", "single_word"]
                    .iter()
                    .all(|k| t.get(*k).and_then(|b| b.as_bool()) != Some(true))
            })
        });
    absent(doc.get("post_processor"))
        && (absent(normalizer) || normalizer.is_some_and(normalizer_ok))
        && pre.is_some_and(pre_tokenizer_ok)
        && added_ok
}

/// Token ids from Python ints, rejecting negatives and values past u32.
fn token_ids(ids: Vec<i64>) -> PyResult<Vec<u32>> {
    ids.into_iter()
        .map(|id| {
            u32::try_from(id)
                .map_err(|_| PyValueError::new_err(format!("token id {id} is out of range")))
        })
        .collect()
}

/// A text path from `str`, `bytes` or an `os.PathLike`.
fn path_of(path: &Bound<'_, PyAny>) -> PyResult<String> {
    let os = path.py().import("os")?;
    let is_path = path.is_instance_of::<pyo3::types::PyString>()
        || path.is_instance_of::<pyo3::types::PyBytes>()
        || path.hasattr("__fspath__")?;
    if !is_path {
        return Err(PyTypeError::new_err(format!(
            "path must be str, bytes or os.PathLike, not {}",
            path.get_type().qualname()?
        )));
    }
    os.call_method1("fsdecode", (path,))?.extract()
}

/// A tokenizer (HuggingFace `tokenizer.json`).
#[pyclass(name = "Tokenizer", module = "ferrite._ferrite", frozen)]
pub struct PyTokenizer {
    loaded: Arc<Loaded>,
}

#[pymethods]
impl PyTokenizer {
    /// Loads a HuggingFace `tokenizer.json` file.
    #[staticmethod]
    fn from_file(py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<Self> {
        let path = path_of(path)?;
        let text = std::fs::read_to_string(&path).map_err(|e| {
            PyValueError::new_err(format!("Failed to read tokenizer file '{path}': {e}"))
        })?;
        // `<encoding>.tiktoken` files are tiktoken ranks; all else is JSON.
        if let Some(stem) = path.strip_suffix(".tiktoken") {
            let name = std::path::Path::new(stem)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            if !crate::tiktoken::is_known_encoding(name) {
                return Err(PyValueError::new_err(format!(
                    "Unknown tiktoken encoding in filename: {path} (name the file \
                     <encoding>.tiktoken, e.g. cl100k_base.tiktoken)"
                )));
            }
            return Self::from_tiktoken(py, &text, name);
        }
        let loaded = py.allow_threads(|| Loaded::from_json(&text))?;
        Ok(PyTokenizer {
            loaded: Arc::new(loaded),
        })
    }

    /// Loads a tokenizer from the text of a HuggingFace `tokenizer.json`.
    #[staticmethod]
    fn from_huggingface_json(py: Python<'_>, json: &str) -> PyResult<Self> {
        let loaded = py.allow_threads(|| Loaded::from_json(json))?;
        Ok(PyTokenizer {
            loaded: Arc::new(loaded),
        })
    }

    /// Loads a tiktoken vocabulary (`<base64> <rank>` lines) under a named
    /// encoding (`cl100k_base`, `o200k_base`, `r50k_base`, ...), which
    /// supplies the split pattern and special tokens.
    #[staticmethod]
    fn from_tiktoken(py: Python<'_>, data: &str, encoding: &str) -> PyResult<Self> {
        let loaded = py.allow_threads(|| {
            let json = crate::tiktoken::to_huggingface_json(data, encoding)
                .map_err(|s| crate::status::to_py_err("Failed to parse tiktoken data", &s))?;
            Loaded::from_json(&json)
        })?;
        Ok(PyTokenizer {
            loaded: Arc::new(loaded),
        })
    }

    #[pyo3(signature = (text, add_special_tokens = false, no_special_token_matching = false))]
    fn encode(
        &self,
        py: Python<'_>,
        text: &str,
        add_special_tokens: bool,
        no_special_token_matching: bool,
    ) -> PyResult<Vec<u32>> {
        py.allow_threads(|| {
            self.loaded
                .encode_ids(text, add_special_tokens, no_special_token_matching)
        })
    }

    #[pyo3(signature = (token_ids, skip_special_tokens = false))]
    fn decode(
        &self,
        py: Python<'_>,
        token_ids: Vec<i64>,
        skip_special_tokens: bool,
    ) -> PyResult<String> {
        let ids = self::token_ids(token_ids)?;
        py.allow_threads(|| self.loaded.decode(&ids, skip_special_tokens))
    }

    #[pyo3(signature = (add_special_tokens = false, no_special_token_matching = false))]
    fn encode_stream(
        &self,
        add_special_tokens: bool,
        no_special_token_matching: bool,
    ) -> PyTokenizerEncodeStream {
        PyTokenizerEncodeStream {
            state: parking_lot::Mutex::new(Some(EncodeState {
                loaded: self.loaded.clone(),
                add_special_tokens,
                no_special_token_matching,
                text: String::new(),
                emitted: Vec::new(),
            })),
        }
    }

    #[pyo3(signature = (skip_special_tokens = false))]
    fn decode_stream(&self, skip_special_tokens: bool) -> PyTokenizerDecodeStream {
        PyTokenizerDecodeStream {
            state: parking_lot::Mutex::new(Some(DecodeState {
                loaded: self.loaded.clone(),
                skip_special_tokens,
                window: Vec::new(),
                prefix_len: 0,
                prefix: String::new(),
            })),
        }
    }

    /// Tokens in the vocabulary, added tokens included.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.loaded.tokenizer.get_vocab_size(true)
    }

    #[getter]
    fn model_type(&self) -> &'static str {
        self.loaded.model_type
    }

    fn id_to_token(&self, token_id: i64) -> Option<String> {
        let id = u32::try_from(token_id).ok()?;
        self.loaded.tokenizer.id_to_token(id)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.loaded.tokenizer.token_to_id(token)
    }

    /// `bos`, `eos`, `unk`, `pad`, `sep`, `cls`, `mask` → id or None. Only
    /// the model's unknown token is declared as such by `tokenizer.json`.
    #[getter]
    fn special_ids(&self) -> HashMap<&'static str, Option<u32>> {
        let mut ids: HashMap<&'static str, Option<u32>> =
            ["bos", "eos", "pad", "sep", "cls", "mask"]
                .into_iter()
                .map(|k| (k, None))
                .collect();
        ids.insert("unk", self.loaded.unk);
        ids
    }

    fn __repr__(&self) -> String {
        format!(
            "<Tokenizer model_type='{}' vocab_size={}>",
            self.loaded.model_type,
            self.vocab_size()
        )
    }
}

/// State of an encode stream (None once finalized).
struct EncodeState {
    loaded: Arc<Loaded>,
    add_special_tokens: bool,
    no_special_token_matching: bool,
    /// All text fed so far.
    text: String,
    /// Ids handed out so far (a prefix of the final encoding).
    emitted: Vec<u32>,
}

impl EncodeState {
    /// Appends `chunk` and returns the ids that no further text can change.
    ///
    /// The pending text is encoded whole; a word's tokens are final when
    /// the word lies before the last two pre-tokenizer words (the last word
    /// may grow, and a run of whitespace before it may split differently)
    /// and ends before the last `longest_added` bytes (where a partly fed
    /// added token could still match). Tokens the post-processor adds (no
    /// word) go out with the first final word after them, so a trailing EOS
    /// waits for finalize. For word-local tokenizers the text of handed-out
    /// tokens is then dropped, so a long stream costs linear time.
    fn feed(&mut self, chunk: &str) -> PyResult<Vec<u32>> {
        self.text.push_str(chunk);
        let enc = self.loaded.encode(
            &self.text,
            self.add_special_tokens,
            self.no_special_token_matching,
        )?;
        let words = enc.get_word_ids();
        let offsets = enc.get_offsets();
        let Some(last_word) = words.iter().flatten().max().copied() else {
            return Ok(Vec::new());
        };
        let limit = self.text.len().saturating_sub(self.loaded.longest_added);
        // The end of each word's text, to hold back any word that reaches
        // into the last `longest_added` bytes.
        let mut word_end: HashMap<u32, usize> = HashMap::new();
        for (w, o) in words.iter().zip(offsets) {
            if let Some(w) = w {
                let e = word_end.entry(*w).or_default();
                *e = (*e).max(o.1);
            }
        }
        let mut end = self.emitted.len();
        for (i, word) in words.iter().enumerate().skip(self.emitted.len()) {
            match word {
                Some(w) if w + 2 <= last_word && word_end[w] <= limit => end = i + 1,
                Some(_) => break,
                None => {}
            }
        }
        let fresh = enc.get_ids()[self.emitted.len()..end].to_vec();
        self.emitted.extend_from_slice(&fresh);
        if self.loaded.word_local && end > 0 && end < enc.len() {
            // Restart after the last handed-out word.
            let cut = offsets[end - 1].1;
            if self.text.is_char_boundary(cut) {
                self.text.drain(..cut);
                self.emitted.clear();
            }
        }
        Ok(fresh)
    }

    /// The ids not yet handed out, checked to extend what was handed out.
    fn finalize(self) -> PyResult<Vec<u32>> {
        let enc = self.loaded.encode(
            &self.text,
            self.add_special_tokens,
            self.no_special_token_matching,
        )?;
        let ids = enc.get_ids();
        if !ids.starts_with(&self.emitted) {
            return Err(PyRuntimeError::new_err(
                "streaming encode diverged from encoding the whole text (a tokenizer whose \
                 pre-tokenizer looks further ahead than two words); use encode() instead",
            ));
        }
        Ok(ids[self.emitted.len()..].to_vec())
    }
}

/// An incremental encoder: `feed(text)` → ids, `finalize()` → the rest.
#[pyclass(name = "TokenizerEncodeStream", module = "ferrite._ferrite", frozen)]
pub struct PyTokenizerEncodeStream {
    state: parking_lot::Mutex<Option<EncodeState>>,
}

#[pymethods]
impl PyTokenizerEncodeStream {
    fn feed(&self, py: Python<'_>, chunk: &str) -> PyResult<Vec<u32>> {
        let mut g = self.state.lock();
        let state = g
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("Cannot feed after finalize"))?;
        py.allow_threads(|| state.feed(chunk))
    }

    fn finalize(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        let state = self
            .state
            .lock()
            .take()
            .ok_or_else(|| PyValueError::new_err("Already finalized"))?;
        py.allow_threads(|| state.finalize())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) {}
}

/// State of a decode stream (None once finalized).
struct DecodeState {
    loaded: Arc<Loaded>,
    skip_special_tokens: bool,
    /// Recent ids: the first `prefix_len` were already turned into text
    /// (`prefix`) and stay as context for the decoder.
    window: Vec<u32>,
    prefix_len: usize,
    prefix: String,
}

impl DecodeState {
    fn push(&mut self, ids: &[u32]) -> PyResult<String> {
        let mut out = String::new();
        for &id in ids {
            self.window.push(id);
            let text = self.loaded.decode(&self.window, self.skip_special_tokens)?;
            // Wait while the text ends in an incomplete UTF-8 sequence or
            // has not grown past what was already handed out.
            if text.len() <= self.prefix.len() || text.ends_with('\u{FFFD}') {
                continue;
            }
            let Some(fresh) = text.strip_prefix(self.prefix.as_str()) else {
                // The decoder rewrote earlier text (rare); hand out the
                // part after the common prefix.
                let common = common_prefix(&text, &self.prefix);
                out.push_str(&text[common..]);
                self.advance()?;
                continue;
            };
            out.push_str(fresh);
            self.advance()?;
        }
        Ok(out)
    }

    /// Drops the ids already covered, keeping the ones just decoded as
    /// context for the next.
    fn advance(&mut self) -> PyResult<()> {
        self.window.drain(..self.prefix_len);
        self.prefix_len = self.window.len();
        self.prefix = self.loaded.decode(&self.window, self.skip_special_tokens)?;
        Ok(())
    }

    fn finalize(self) -> PyResult<String> {
        let text = self.loaded.decode(&self.window, self.skip_special_tokens)?;
        let common = common_prefix(&text, &self.prefix);
        Ok(text[common..].to_string())
    }
}

/// Byte length of the longest common prefix of `a` and `b`, on a char
/// boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

/// An incremental decoder: `feed(ids)` → text, `finalize()` → the rest.
#[pyclass(name = "TokenizerDecodeStream", module = "ferrite._ferrite", frozen)]
pub struct PyTokenizerDecodeStream {
    state: parking_lot::Mutex<Option<DecodeState>>,
}

#[pymethods]
impl PyTokenizerDecodeStream {
    fn feed(&self, py: Python<'_>, token_ids: Vec<i64>) -> PyResult<String> {
        let ids = self::token_ids(token_ids)?;
        let mut g = self.state.lock();
        let state = g
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("Cannot feed after finalize"))?;
        py.allow_threads(|| state.push(&ids))
    }

    /// Feeds one id (the per-token path of generation loops).
    fn feed_one(&self, token_id: i64) -> PyResult<String> {
        let ids = self::token_ids(vec![token_id])?;
        let mut g = self.state.lock();
        let state = g
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("Cannot feed after finalize"))?;
        state.push(&ids)
    }

    fn finalize(&self) -> PyResult<String> {
        let state = self
            .state
            .lock()
            .take()
            .ok_or_else(|| PyValueError::new_err("Already finalized"))?;
        state.finalize()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) {}
}
