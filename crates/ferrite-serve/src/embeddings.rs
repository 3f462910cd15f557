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
//! Calls are futures ([`ferrite::OwnedFunction::call_async`], resolved when
//! the call's device work is done): a request awaits its embeddings on the
//! async runtime with no thread parked per call, and concurrent requests
//! share the one loaded program. On `local-sync`, which runs device work on
//! the submitting thread, the call is started inside
//! `tokio::task::block_in_place` so the computation does not stall the
//! runtime's other tasks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrite::{Instance, OwnedFunction, Session, Tensor, Value};
use ferrite_llm::{Result, Status, StatusCode};
use ferrite_tokenizer::Tokenizer;

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

/// The loaded embeddings program: `Send + Sync`, shared by every request.
pub struct Embedder {
    embed: OwnedFunction,
    tokenizer: Arc<Tokenizer>,
    /// The device runs work on the submitting thread (`local-sync`).
    inline: bool,
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

fn vector(out: Vec<Value>) -> Result<Vec<f32>> {
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
    Ok(v)
}

impl Embedder {
    /// Loads the program and weights from `dir` on `device` (blocking: call
    /// it off the async runtime).
    pub fn load(dir: &Path, module: Option<&Path>, device: &str) -> Result<Embedder> {
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
        let instance = Instance::new();
        let mut session = Session::new(&instance, device)?;
        session.add_parameter_file("model", &weights)?;
        match &module {
            Some(m) => session.load_file(m)?,
            None if device.starts_with("cuda") => session.load_static(MINILM_CUDA_VMFB)?,
            None => session.load_static(MINILM_VMFB)?,
        };
        // The owned handle keeps the program's context (and devices) alive
        // without the session.
        let embed = session.function_owned("embed")?;
        Ok(Embedder {
            embed,
            tokenizer,
            inline: device.starts_with("local-sync"),
        })
    }

    /// Embeds `texts` (in order).
    pub async fn embed(&self, texts: Vec<String>) -> Result<Embedded> {
        let mut out = Embedded {
            vectors: Vec::with_capacity(texts.len()),
            tokens: 0,
        };
        let shape = [1, SEQ as u64];
        for text in &texts {
            let (ids, mask, n) = encode(&self.tokenizer, text)?;
            let args = [
                Value::from(Tensor::from_slice(&shape, &ids)?),
                Value::from(Tensor::from_slice(&shape, &mask)?),
            ];
            let call = if self.inline {
                tokio::task::block_in_place(|| self.embed.call_async(&args))
            } else {
                self.embed.call_async(&args)
            };
            out.vectors.push(vector(call.await?)?);
            out.tokens += n;
        }
        Ok(out)
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
