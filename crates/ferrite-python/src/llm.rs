//! `Llm` and `LlmStream`: the Python face of `ferrite_llm::Llm` (which holds
//! the generate loop, the tokenizer and chat template from the `.gguf`, the
//! sampling and the stop conditions; the CLI's `generate` runs the same
//! code). `python/ferrite/llm.py` is the user-facing wrapper.
//!
//! The model runs with the GIL released. A generation holds the model's
//! lock from prefill to its last token; a stream runs its generation on a
//! worker thread that sends each token's text to the iterator, so the
//! consumer's Python code runs while the next token is computed. Ctrl-C
//! (a pending Python signal) is checked after every token.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use ferrite_llm::{chat::Message, Finish, Generation, Llm, Options, Sampling, Status, StatusCode};
use ferrite_tokenizer::Tokenizer;
use parking_lot::Mutex;
use pyo3::exceptions::{
    PyFileNotFoundError, PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLlm>()?;
    m.add_class::<PyLlmStream>()?;
    Ok(())
}

/// Bad input (a malformed or mismatched `.gguf`, a prompt past the
/// context, an id outside the vocabulary) is a `ValueError`; a `.gguf` that
/// does not exist a `FileNotFoundError`; anything else a `RuntimeError`.
fn to_py(status: &Status, gguf: Option<&Path>) -> PyErr {
    let message = status.message().to_string();
    match status.code() {
        StatusCode::NotFound if gguf.is_some_and(|p| !p.exists()) => {
            PyFileNotFoundError::new_err(message)
        }
        StatusCode::InvalidArgument | StatusCode::NotFound | StatusCode::OutOfRange => {
            PyValueError::new_err(message)
        }
        StatusCode::Unimplemented => PyNotImplementedError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

/// A filesystem path from `str`, `bytes` or an `os.PathLike`.
fn path_arg(path: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let ok = path.is_instance_of::<PyString>()
        || path.is_instance_of::<pyo3::types::PyBytes>()
        || path.hasattr("__fspath__")?;
    if !ok {
        return Err(PyTypeError::new_err(format!(
            "a path must be str, bytes or os.PathLike, not {}",
            path.get_type().qualname()?
        )));
    }
    let s: String = path
        .py()
        .import("os")?
        .call_method1("fsdecode", (path,))?
        .extract()?;
    Ok(PathBuf::from(s))
}

/// Prompt ids from Python ints: each must be in `0..2^32` (the model then
/// checks it against its vocabulary).
fn prompt_ids(ids: Vec<i64>) -> PyResult<Vec<u32>> {
    ids.into_iter()
        .enumerate()
        .map(|(i, id)| {
            u32::try_from(id).map_err(|_| {
                PyValueError::new_err(format!("prompt id {id} at index {i} is not a token id"))
            })
        })
        .collect()
}

fn finish_name(f: &Finish) -> &'static str {
    match f {
        Finish::Eos => "eos",
        Finish::Length => "length",
        Finish::Stop => "stop",
        Finish::Cancelled => "cancelled",
    }
}

/// A finished generation as the dict `ferrite.llm.Completion` is built from.
fn generation_dict<'py>(py: Python<'py>, g: &Generation) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("text", &g.text)?;
    d.set_item("ids", &g.ids)?;
    d.set_item("finish_reason", finish_name(&g.finish))?;
    d.set_item("prompt_tokens", g.prompt_tokens)?;
    d.set_item("time_to_first_token", g.time_to_first_token.as_secs_f64())?;
    d.set_item("decode_seconds", g.decode_time.as_secs_f64())?;
    d.set_item("decode_steps", g.decode_steps)?;
    Ok(d)
}

/// A loaded model (`ferrite_llm::Llm`).
#[pyclass(name = "Llm", module = "ferrite._ferrite", frozen)]
pub struct PyLlm {
    llm: Arc<Mutex<Llm>>,
    /// The model's tokenizer, shared, so that encoding and decoding need
    /// not wait for a generation in flight.
    tokenizer: Arc<Tokenizer>,
    context: usize,
    eos: Option<u32>,
    gguf: PathBuf,
    device: String,
}

#[pymethods]
impl PyLlm {
    /// Loads `gguf` with the built-in program (or the program file
    /// `program`, e.g. one compiled for cuda) on `device`, its KV cache
    /// allocated for `context` positions.
    #[staticmethod]
    #[pyo3(signature = (gguf, device = "local-task", program = None, context = ferrite_llm::DEFAULT_CONTEXT))]
    fn load(
        py: Python<'_>,
        gguf: &Bound<'_, PyAny>,
        device: &str,
        program: Option<&Bound<'_, PyAny>>,
        context: usize,
    ) -> PyResult<PyLlm> {
        let gguf = path_arg(gguf)?;
        let program = program.map(path_arg).transpose()?;
        let device = device.to_string();
        let llm = py
            .allow_threads(|| Llm::load_with_context(&gguf, &device, program.as_deref(), context))
            .map_err(|s| {
                // A missing program file is named by the status too; only
                // a missing .gguf is the FileNotFoundError of the model.
                let missing = if program.as_deref().is_some_and(|p| !p.exists()) {
                    program.as_deref()
                } else {
                    Some(gguf.as_path())
                };
                to_py(&s, missing)
            })?;
        Ok(PyLlm {
            tokenizer: llm.tokenizer().clone(),
            context: llm.context_length(),
            eos: llm.eos(),
            llm: Arc::new(Mutex::new(llm)),
            gguf,
            device,
        })
    }

    /// The KV cache's capacity in positions (prompt plus generated tokens).
    #[getter]
    fn context_length(&self) -> usize {
        self.context
    }

    #[getter]
    fn eos_token_id(&self) -> Option<u32> {
        self.eos
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    #[getter]
    fn gguf_path(&self) -> String {
        self.gguf.display().to_string()
    }

    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    /// Token ids of `text`: `Llm::encode`'s call (special tokens matched,
    /// no BOS) on the shared tokenizer.
    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        py.allow_threads(|| self.tokenizer.encode(text, false, false))
            .map_err(|s| to_py(&s, None))
    }

    /// Text of `ids` with special tokens skipped (`Llm::decode`'s call).
    fn decode(&self, py: Python<'_>, ids: Vec<i64>) -> PyResult<String> {
        let ids = prompt_ids(ids)?;
        py.allow_threads(|| self.tokenizer.decode(&ids, true))
            .map_err(|s| to_py(&s, None))
    }

    /// The `.gguf`'s chat template over `(role, content)` pairs with the
    /// assistant's turn opened, as token ids.
    fn chat_prompt(&self, py: Python<'_>, messages: Vec<(String, String)>) -> PyResult<Vec<u32>> {
        let msgs: Vec<Message> = messages.iter().map(|(r, c)| Message::new(r, c)).collect();
        py.allow_threads(|| self.llm.lock().chat_prompt_messages(&msgs))
            .map_err(|s| to_py(&s, None))
    }

    /// Generates after the prompt ids; returns the finished generation as
    /// a dict (text, ids, finish_reason, timings).
    #[pyo3(signature = (ids, max_tokens, temperature, top_k, top_p, seed, stop, ignore_eos))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<i64>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
        stop: Vec<String>,
        ignore_eos: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let ids = prompt_ids(ids)?;
        let opts = options(
            max_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            stop,
            ignore_eos,
        )?;
        let mut interrupted = None;
        let result = py.allow_threads(|| {
            self.llm.lock().generate(&ids, &opts, |_, _| {
                match Python::with_gil(|py| py.check_signals()) {
                    Ok(()) => true,
                    Err(e) => {
                        interrupted = Some(e);
                        false
                    }
                }
            })
        });
        if let Some(e) = interrupted {
            return Err(e);
        }
        generation_dict(py, &result.map_err(|s| to_py(&s, None))?)
    }

    /// Starts a generation on a worker thread and returns the iterator of
    /// its text pieces. Waits for the first token, so a bad prompt raises
    /// here rather than at the first `next()`.
    #[pyo3(signature = (ids, max_tokens, temperature, top_k, top_p, seed, stop, ignore_eos))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        py: Python<'_>,
        ids: Vec<i64>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
        stop: Vec<String>,
        ignore_eos: bool,
    ) -> PyResult<PyLlmStream> {
        let ids = prompt_ids(ids)?;
        let opts = options(
            max_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            stop,
            ignore_eos,
        )?;
        let (tx, rx) = mpsc::channel();
        let llm = self.llm.clone();
        std::thread::Builder::new()
            .name("ferrite-llm-stream".into())
            .spawn(move || {
                // A send fails once the iterator is gone: the generation
                // then ends as cancelled and the model's lock is released.
                let done = llm.lock().generate(&ids, &opts, |id, text| {
                    tx.send(Event::Token(id, text.to_string())).is_ok()
                });
                let _ = tx.send(Event::Done(done));
            })
            .map_err(|e| {
                PyRuntimeError::new_err(format!("cannot start the generation thread: {e}"))
            })?;
        let stream = PyLlmStream {
            rx: Arc::new(Mutex::new(Some(rx))),
            state: Mutex::new(StreamState::default()),
        };
        match stream.receive(py)? {
            Some(Event::Done(Err(s))) => Err(to_py(&s, None)),
            Some(event) => {
                stream.state.lock().apply(event);
                Ok(stream)
            }
            None => Err(PyRuntimeError::new_err(
                "the generation thread ended without a result",
            )),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferrite.llm.Llm {} on {} (context {})>",
            self.gguf.display(),
            self.device,
            self.context
        )
    }
}

/// `ferrite_llm::Options` from the Python arguments, refusing values no
/// sampler can use.
fn options(
    max_tokens: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    seed: u64,
    stop: Vec<String>,
    ignore_eos: bool,
) -> PyResult<Options> {
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "temperature must be a finite number >= 0 (0 is greedy), not {temperature}"
        )));
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(PyValueError::new_err(format!(
            "top_p must be in (0, 1], not {top_p}"
        )));
    }
    if stop.iter().any(String::is_empty) {
        return Err(PyValueError::new_err("a stop string is empty"));
    }
    Ok(Options {
        max_tokens,
        sampling: Sampling {
            temperature,
            top_k,
            top_p,
            seed,
        },
        stop_at_eos: !ignore_eos,
        stop,
    })
}

/// What the generation thread sends.
enum Event {
    /// A generated token and the text it completes (maybe empty).
    Token(u32, String),
    /// The generation's end.
    Done(ferrite_llm::Result<Generation>),
}

#[derive(Default)]
struct StreamState {
    /// Text pieces received and not yet returned.
    pending: std::collections::VecDeque<String>,
    ids: Vec<u32>,
    text: String,
    /// The finished generation (None while it runs).
    done: Option<Generation>,
    /// The generation's error, raised once at the iterator's end.
    error: Option<Status>,
}

impl StreamState {
    fn apply(&mut self, event: Event) {
        match event {
            Event::Token(id, piece) => {
                self.ids.push(id);
                self.text.push_str(&piece);
                if !piece.is_empty() {
                    self.pending.push_back(piece);
                }
            }
            Event::Done(Ok(g)) => self.done = Some(g),
            Event::Done(Err(s)) => self.error = Some(s),
        }
    }
    fn finished(&self) -> bool {
        self.done.is_some() || self.error.is_some()
    }
}

/// The text pieces of a generation running on a worker thread.
#[pyclass(name = "LlmStream", module = "ferrite._ferrite", frozen)]
pub struct PyLlmStream {
    /// None once closed (dropping the receiver cancels the generation).
    rx: Arc<Mutex<Option<Receiver<Event>>>>,
    state: Mutex<StreamState>,
}

impl PyLlmStream {
    /// The next event with the GIL released, checking for Ctrl-C every
    /// 100 ms; None when the stream is closed or the thread is gone.
    fn receive(&self, py: Python<'_>) -> PyResult<Option<Event>> {
        loop {
            let rx = self.rx.clone();
            let got = py.allow_threads(move || match rx.lock().as_ref() {
                Some(r) => r.recv_timeout(Duration::from_millis(100)),
                None => Err(RecvTimeoutError::Disconnected),
            });
            match got {
                Ok(e) => return Ok(Some(e)),
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            }
        }
    }
}

#[pymethods]
impl PyLlmStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        loop {
            {
                let mut st = self.state.lock();
                if let Some(p) = st.pending.pop_front() {
                    return Ok(Some(p));
                }
                if let Some(s) = st.error.take() {
                    return Err(to_py(&s, None));
                }
                if st.finished() {
                    return Ok(None);
                }
            }
            match self.receive(py)? {
                Some(e) => self.state.lock().apply(e),
                None => return Ok(None),
            }
        }
    }

    /// Stops the generation (after the token being computed) and ends the
    /// iteration.
    fn close(&self) {
        self.rx.lock().take();
    }

    /// Ids generated so far.
    #[getter]
    fn ids(&self) -> Vec<u32> {
        let st = self.state.lock();
        match &st.done {
            Some(g) => g.ids.clone(),
            None => st.ids.clone(),
        }
    }

    /// Text generated so far (cut before a stop string once one appeared).
    #[getter]
    fn text(&self) -> String {
        let st = self.state.lock();
        match &st.done {
            Some(g) => g.text.clone(),
            None => st.text.clone(),
        }
    }

    /// The finished generation as a dict (as `Llm.generate`'s), or None
    /// while it runs.
    fn result<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match &self.state.lock().done {
            Some(g) => Ok(Some(generation_dict(py, g)?)),
            None => Ok(None),
        }
    }
}
