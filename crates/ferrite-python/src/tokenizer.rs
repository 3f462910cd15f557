//! `Tokenizer`, `TokenizerEncodeStream`, `TokenizerDecodeStream`: the Python
//! face of `ferrite-tokenizer` (which holds the semantics and the docs).

use ferrite_base::{Status, StatusCode};
use ferrite_tokenizer::{DecodeStream, EncodeStream, Tokenizer};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTokenizer>()?;
    m.add_class::<PyTokenizerEncodeStream>()?;
    m.add_class::<PyTokenizerDecodeStream>()?;
    Ok(())
}

/// Bad input is a `ValueError` (as upstream); anything else a
/// `RuntimeError`.
fn to_py(status: Status) -> PyErr {
    match status.code() {
        StatusCode::InvalidArgument | StatusCode::NotFound => {
            PyValueError::new_err(status.message().to_string())
        }
        StatusCode::Unimplemented => {
            pyo3::exceptions::PyNotImplementedError::new_err(status.message().to_string())
        }
        _ => PyRuntimeError::new_err(status.message().to_string()),
    }
}

/// Upstream's token ids are C `int32_t`: a value outside that range is a
/// `TypeError` (the argument does not convert), as there.
fn id_out_of_range(id: &dyn std::fmt::Display) -> PyErr {
    PyTypeError::new_err(format!(
        "token id {id} does not fit in a 32-bit signed integer"
    ))
}

/// One token id from a Python int: None for a negative id (no token has
/// it; `decode` skips it, as upstream does), `TypeError` past `int32`.
fn token_id(id: i64) -> PyResult<Option<u32>> {
    match i32::try_from(id) {
        Ok(v) if v >= 0 => Ok(Some(v as u32)),
        Ok(_) => Ok(None),
        Err(_) => Err(id_out_of_range(&id)),
    }
}

/// Token ids from a sequence of Python ints (see [`token_id`]).
///
/// Lists and tuples are read item by item straight into the ids, and
/// objects exposing a buffer of 64- or 32-bit integers (numpy arrays,
/// `array.array`) are copied whole; any other sequence goes through
/// pyo3's generic extraction. Decoding is a table lookup per id, so
/// reading the ids is most of a `decode` call.
fn token_ids(ids: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if ids.is_instance_of::<pyo3::types::PyString>() {
        return Err(PyTypeError::new_err(
            "token_ids must be a sequence of ints, not str",
        ));
    }
    if let Ok(list) = ids.downcast::<pyo3::types::PyList>() {
        return collect_ids(list.len(), list.iter().map(|item| item_id(&item)));
    }
    if let Ok(tuple) = ids.downcast::<pyo3::types::PyTuple>() {
        return collect_ids(tuple.len(), tuple.iter().map(|item| item_id(&item)));
    }
    if let Ok(buffer) = pyo3::buffer::PyBuffer::<i64>::get(ids) {
        let raw = buffer.to_vec(ids.py())?;
        return collect_ids(raw.len(), raw.into_iter().map(Ok));
    }
    if let Ok(buffer) = pyo3::buffer::PyBuffer::<i32>::get(ids) {
        let raw = buffer.to_vec(ids.py())?;
        return collect_ids(raw.len(), raw.into_iter().map(|id| Ok(i64::from(id))));
    }
    let ids: Vec<i64> = ids.extract().map_err(|e| overflow_as_range(ids.py(), e))?;
    collect_ids(ids.len(), ids.into_iter().map(Ok))
}

/// Keeps the ids [`token_id`] accepts, in order.
fn collect_ids(len: usize, ids: impl Iterator<Item = PyResult<i64>>) -> PyResult<Vec<u32>> {
    let mut out = Vec::with_capacity(len);
    for id in ids {
        if let Some(id) = token_id(id?)? {
            out.push(id);
        }
    }
    Ok(out)
}

/// One item of an id sequence as an `i64`.
fn item_id(item: &Bound<'_, PyAny>) -> PyResult<i64> {
    item.extract().map_err(|e| overflow_as_range(item.py(), e))
}

/// An int past 64 bits is reported as an id out of range, as one that
/// fits 64 bits but not 32 is.
fn overflow_as_range(py: Python<'_>, e: PyErr) -> PyErr {
    if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
        id_out_of_range(&"(an int past 64 bits)")
    } else {
        e
    }
}

/// One id argument: as [`token_id`], any int accepted before the range check.
fn one_id(id: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
    token_id(item_id(id)?)
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

/// A tokenizer (HuggingFace `tokenizer.json` or tiktoken).
#[pyclass(name = "Tokenizer", module = "ferrite._ferrite", frozen)]
pub struct PyTokenizer {
    tokenizer: Arc<Tokenizer>,
}

impl PyTokenizer {
    fn new(tokenizer: Tokenizer) -> PyTokenizer {
        PyTokenizer {
            tokenizer: Arc::new(tokenizer),
        }
    }
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
            if !ferrite_tokenizer::tiktoken::is_known_encoding(name) {
                return Err(PyValueError::new_err(format!(
                    "Unknown tiktoken encoding in filename: {path} (name the file \
                     <encoding>.tiktoken, e.g. cl100k_base.tiktoken)"
                )));
            }
            return Self::from_tiktoken(py, &text, name);
        }
        let t = py
            .allow_threads(|| Tokenizer::from_json(&text))
            .map_err(to_py)?;
        Ok(Self::new(t))
    }

    /// Loads a tokenizer from the text of a HuggingFace `tokenizer.json`.
    #[staticmethod]
    fn from_huggingface_json(py: Python<'_>, json: &str) -> PyResult<Self> {
        let t = py
            .allow_threads(|| Tokenizer::from_json(json))
            .map_err(to_py)?;
        Ok(Self::new(t))
    }

    /// Loads a tiktoken vocabulary (`<base64> <rank>` lines) under a named
    /// encoding.
    #[staticmethod]
    fn from_tiktoken(py: Python<'_>, data: &str, encoding: &str) -> PyResult<Self> {
        let t = py
            .allow_threads(|| Tokenizer::from_tiktoken(data, encoding))
            .map_err(|s| {
                PyValueError::new_err(format!("Failed to parse tiktoken data: {}", s.message()))
            })?;
        Ok(Self::new(t))
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
            self.tokenizer
                .encode(text, add_special_tokens, no_special_token_matching)
        })
        .map_err(to_py)
    }

    #[pyo3(signature = (token_ids, skip_special_tokens = false))]
    fn decode(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        skip_special_tokens: bool,
    ) -> PyResult<String> {
        let ids = self::token_ids(token_ids)?;
        py.allow_threads(|| self.tokenizer.decode(&ids, skip_special_tokens))
            .map_err(to_py)
    }

    #[pyo3(signature = (add_special_tokens = false, no_special_token_matching = false))]
    fn encode_stream(
        &self,
        add_special_tokens: bool,
        no_special_token_matching: bool,
    ) -> PyTokenizerEncodeStream {
        PyTokenizerEncodeStream {
            state: parking_lot::Mutex::new(Some(EncodeStream::new(
                self.tokenizer.clone(),
                add_special_tokens,
                no_special_token_matching,
            ))),
        }
    }

    #[pyo3(signature = (skip_special_tokens = false))]
    fn decode_stream(&self, skip_special_tokens: bool) -> PyTokenizerDecodeStream {
        PyTokenizerDecodeStream {
            state: parking_lot::Mutex::new(Some(DecodeStream::new(
                self.tokenizer.clone(),
                skip_special_tokens,
            ))),
        }
    }

    /// Tokens in the vocabulary, added tokens included.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    #[getter]
    fn model_type(&self) -> &'static str {
        self.tokenizer.model_type()
    }

    fn id_to_token(&self, token_id: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        Ok(one_id(token_id)?.and_then(|id| self.tokenizer.id_to_token(id)))
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
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
        ids.insert("unk", self.tokenizer.unk_id());
        ids
    }

    fn __repr__(&self) -> String {
        format!(
            "<Tokenizer model_type='{}' vocab_size={}>",
            self.tokenizer.model_type(),
            self.vocab_size()
        )
    }
}

/// An incremental encoder: `feed(text)` → ids, `finalize()` → the rest.
#[pyclass(name = "TokenizerEncodeStream", module = "ferrite._ferrite", frozen)]
pub struct PyTokenizerEncodeStream {
    state: parking_lot::Mutex<Option<EncodeStream>>,
}

#[pymethods]
impl PyTokenizerEncodeStream {
    fn feed(&self, py: Python<'_>, chunk: &str) -> PyResult<Vec<u32>> {
        let mut g = self.state.lock();
        let state = g
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("Cannot feed after finalize"))?;
        py.allow_threads(|| state.feed(chunk)).map_err(to_py)
    }

    fn finalize(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        let state = self
            .state
            .lock()
            .take()
            .ok_or_else(|| PyValueError::new_err("Already finalized"))?;
        py.allow_threads(|| state.finalize()).map_err(to_py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) {}
}

/// An incremental decoder: `feed(ids)` → text, `finalize()` → the rest.
#[pyclass(name = "TokenizerDecodeStream", module = "ferrite._ferrite", frozen)]
pub struct PyTokenizerDecodeStream {
    state: parking_lot::Mutex<Option<DecodeStream>>,
}

#[pymethods]
impl PyTokenizerDecodeStream {
    fn feed(&self, py: Python<'_>, token_ids: &Bound<'_, PyAny>) -> PyResult<String> {
        let ids = self::token_ids(token_ids)?;
        let mut g = self.state.lock();
        let state = g
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("Cannot feed after finalize"))?;
        py.allow_threads(|| state.push(&ids)).map_err(to_py)
    }

    /// Feeds one id (the per-token path of generation loops).
    fn feed_one(&self, token_id: &Bound<'_, PyAny>) -> PyResult<String> {
        let id = one_id(token_id)?;
        let mut g = self.state.lock();
        let state = g
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("Cannot feed after finalize"))?;
        state.push(id.as_slice()).map_err(to_py)
    }

    fn finalize(&self) -> PyResult<String> {
        let state = self
            .state
            .lock()
            .take()
            .ok_or_else(|| PyValueError::new_err("Already finalized"))?;
        state.finalize().map_err(to_py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) {}
}
