//! `/v1/embeddings` with all-MiniLM-L6-v2: the committed program
//! (`examples/minilm/minilm.vmfb`, or `minilm_cuda.vmfb` on a `cuda`
//! device; built into this crate) reading `model.safetensors` as its
//! parameters, and the model's own `tokenizer.json`.
//!
//! The assets are found in the directory given with `--embeddings=DIR`
//! (`DIR/model.safetensors`, `DIR/tokenizer.json`; `python
//! examples/minilm/assets.py` puts them in `.cache/minilm`); a program file
//! may replace the built-in one (`--embeddings_module=PATH`).
//!
//! One worker thread owns the session and embeds texts one at a time (the
//! program takes one `[1, 128]` sequence per call); handlers await its
//! answer without blocking the async runtime.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

use ferrite::{Instance, Session, Tensor, Value};
use ferrite_llm::{Result, Status, StatusCode};
use ferrite_tokenizer::Tokenizer;
use tokio::sync::oneshot;

/// The program's sequence length: ids are padded (or truncated) to it.
pub const SEQ: usize = 128;
/// The embedding width.
pub const WIDTH: usize = 384;
/// The name `/v1/models` lists (requests may also say `default`).
pub const MODEL_NAME: &str = "all-MiniLM-L6-v2";

static MINILM_VMFB: &[u8] = include_bytes!("../../../examples/minilm/minilm.vmfb");
static MINILM_CUDA_VMFB: &[u8] = include_bytes!("../../../examples/minilm/minilm_cuda.vmfb");

/// The embeddings of one request and the tokens they took.
pub struct Embedded {
    /// One unit-length vector per text.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens fed to the model (special tokens included, padding not).
    pub tokens: usize,
}

struct EmbedJob {
    texts: Vec<String>,
    reply: oneshot::Sender<Result<Embedded>>,
}

/// A handle on the embeddings worker.
#[derive(Clone)]
pub struct Embedder {
    jobs: mpsc::Sender<EmbedJob>,
}

fn need(path: PathBuf) -> Result<PathBuf> {
    if path.exists() {
        Ok(path)
    } else {
        Err(Status::new(
            StatusCode::NotFound,
            format!(
                "{} not found: --embeddings takes the MiniLM directory holding model.safetensors and tokenizer.json (python examples/minilm/assets.py fetches them into .cache/minilm)",
                path.display()
            ),
        ))
    }
}

/// The real token count of an encoding padded with id 0 (`[PAD]`).
fn real_length(ids: &[u32]) -> usize {
    ids.iter().rposition(|&i| i != 0).map_or(0, |p| p + 1)
}

/// Ids and mask, each `[1, SEQ]`, for one text.
fn encode(tokenizer: &Tokenizer, text: &str) -> Result<(Vec<i64>, Vec<i64>, usize)> {
    let ids = tokenizer.encode(text, true, false)?;
    let mut ids: Vec<i64> = ids[..real_length(&ids)]
        .iter()
        .map(|&i| i64::from(i))
        .collect();
    if ids.len() > SEQ {
        // Keep the closing [SEP].
        let sep = ids[ids.len() - 1];
        ids.truncate(SEQ - 1);
        ids.push(sep);
    }
    let n = ids.len();
    let mut mask = vec![1i64; n];
    ids.resize(SEQ, 0);
    mask.resize(SEQ, 0);
    Ok((ids, mask, n))
}

fn embed_one(session: &Session, tokenizer: &Tokenizer, text: &str) -> Result<(Vec<f32>, usize)> {
    let (ids, mask, n) = encode(tokenizer, text)?;
    let shape = [1, SEQ as u64];
    let out = session.call(
        "embed",
        &[
            Value::from(Tensor::from_slice(&shape, &ids)?),
            Value::from(Tensor::from_slice(&shape, &mask)?),
        ],
    )?;
    let v = out
        .first()
        .and_then(Value::as_tensor)
        .ok_or_else(|| Status::new(StatusCode::Internal, "embed returned no tensor"))?
        .to_f32_vec()?;
    if v.len() != WIDTH {
        return Err(Status::new(
            StatusCode::Internal,
            format!("embed returned {} values, expected {WIDTH}", v.len()),
        ));
    }
    Ok((v, n))
}

impl Embedder {
    /// Starts the worker: loads the program and weights from `dir` on
    /// `device`; returns once loaded (or with the loading error).
    pub fn start(dir: &Path, module: Option<&Path>, device: &str) -> Result<Embedder> {
        let weights = need(dir.join("model.safetensors"))?;
        let tokenizer_path = need(dir.join("tokenizer.json"))?;
        let module = module.map(|m| need(m.to_path_buf())).transpose()?;
        let json = std::fs::read_to_string(&tokenizer_path).map_err(|e| {
            Status::new(
                StatusCode::Unavailable,
                format!("reading {}: {e}", tokenizer_path.display()),
            )
        })?;
        let tokenizer = Arc::new(Tokenizer::from_json(&json)?);
        let (jobs, rx) = mpsc::channel::<EmbedJob>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let device = device.to_string();
        std::thread::Builder::new()
            .name("ferrite-embeddings".into())
            .spawn(move || {
                let load = || -> Result<Session> {
                    let instance = Instance::new();
                    let mut session = Session::new(&instance, &device)?;
                    session.add_parameter_file("model", &weights)?;
                    match &module {
                        Some(m) => session.load_file(m)?,
                        None if device.starts_with("cuda") => {
                            session.load_static(MINILM_CUDA_VMFB)?
                        }
                        None => session.load_static(MINILM_VMFB)?,
                    };
                    Ok(session)
                };
                let session = match load() {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for job in rx {
                    if job.reply.is_closed() {
                        continue;
                    }
                    let mut out = Embedded {
                        vectors: Vec::with_capacity(job.texts.len()),
                        tokens: 0,
                    };
                    let mut result = Ok(());
                    for text in &job.texts {
                        match embed_one(&session, &tokenizer, text) {
                            Ok((v, n)) => {
                                out.vectors.push(v);
                                out.tokens += n;
                            }
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                        if job.reply.is_closed() {
                            break;
                        }
                    }
                    let _ = job.reply.send(result.map(|()| out));
                }
            })
            .map_err(|e| {
                Status::new(
                    StatusCode::Internal,
                    format!("starting the embeddings thread: {e}"),
                )
            })?;
        ready_rx.recv().map_err(|_| {
            Status::new(
                StatusCode::Internal,
                "the embeddings thread ended while loading",
            )
        })??;
        Ok(Embedder { jobs })
    }

    /// Embeds `texts` (in order).
    pub async fn embed(&self, texts: Vec<String>) -> Result<Embedded> {
        let (reply, rx) = oneshot::channel();
        self.jobs.send(EmbedJob { texts, reply }).map_err(|_| {
            Status::new(StatusCode::Unavailable, "the embeddings worker has stopped")
        })?;
        rx.await.map_err(|_| {
            Status::new(
                StatusCode::Internal,
                "the embeddings worker dropped a request",
            )
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_not_counted_as_tokens() {
        assert_eq!(real_length(&[101, 7592, 102, 0, 0]), 3);
        assert_eq!(real_length(&[0, 0]), 0);
        assert_eq!(real_length(&[101, 102]), 2);
    }
}
