//! What the committed programs need of a `.gguf` file besides the weights'
//! bytes: its architecture and tensor table checked against the program
//! ([`check_model`]), and the text side (tokenizer, chat template, BOS and
//! EOS) both hosts ([`crate::Llm`], [`crate::batch::BatchLlm`]) read. A
//! file of its own so that `batch` names it without naming the crate root.

use std::sync::{Arc, Mutex};

use ferrite::{DeviceTensor, Result, Status, StatusCode, Value};
use ferrite_tokenizer::Tokenizer;

use crate::{chat, gguf, tokenizer};

/// The shape the committed program was built for; a `.gguf` must match it.
pub struct Architecture {
    /// Transformer blocks.
    pub layers: u64,
    /// Embedding width.
    pub dim: u64,
    /// FFN width.
    pub ffn: u64,
    /// Query heads.
    pub heads: u64,
    /// KV heads.
    pub kv_heads: u64,
    /// Vocabulary size.
    pub vocab: u64,
}

/// SmolLM2-135M's numbers.
pub const SMOLLM2_135M: Architecture = Architecture {
    layers: 30,
    dim: 576,
    ffn: 1536,
    heads: 9,
    kv_heads: 3,
    vocab: 49152,
};

const F32: u32 = 0;
const Q4_1: u32 = 3;
const Q8_0: u32 = 8;

/// Checks the file against the program: architecture numbers, then every
/// tensor the program reads (name, GGML type, dims).
pub fn check_model(file: &gguf::GgufFile, a: &Architecture) -> Result<()> {
    let arch = file.str("general.architecture")?;
    if arch != "llama" {
        return Err(Status::new(
            StatusCode::InvalidArgument,
            format!("gguf general.architecture is '{arch}'; the program is for 'llama'"),
        ));
    }
    for (key, want) in [
        ("llama.block_count", a.layers),
        ("llama.embedding_length", a.dim),
        ("llama.feed_forward_length", a.ffn),
        ("llama.attention.head_count", a.heads),
        ("llama.attention.head_count_kv", a.kv_heads),
    ] {
        let got = file.int(key)?;
        if got != want as i64 {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!("gguf {key} is {got}; the program was built for {want}"),
            ));
        }
    }
    let kv = a.kv_heads * (a.dim / a.heads);
    file.expect_tensor("token_embd.weight", Q8_0, &[a.dim, a.vocab])?;
    file.expect_tensor("output_norm.weight", F32, &[a.dim])?;
    for i in 0..a.layers {
        let p = |n: &str| format!("blk.{i}.{n}.weight");
        file.expect_tensor(&p("attn_norm"), F32, &[a.dim])?;
        file.expect_tensor(&p("ffn_norm"), F32, &[a.dim])?;
        file.expect_tensor(&p("attn_q"), Q4_1, &[a.dim, a.dim])?;
        file.expect_tensor(&p("attn_k"), Q4_1, &[a.dim, kv])?;
        file.expect_tensor(&p("attn_v"), Q4_1, &[a.dim, kv])?;
        file.expect_tensor(&p("attn_output"), Q4_1, &[a.dim, a.dim])?;
        file.expect_tensor(&p("ffn_gate"), Q4_1, &[a.dim, a.ffn])?;
        file.expect_tensor(&p("ffn_up"), Q4_1, &[a.dim, a.ffn])?;
        file.expect_tensor(&p("ffn_down"), Q4_1, &[a.ffn, a.dim])?;
    }
    Ok(())
}

/// Hands the heap memory that loading freed back to the system.
///
/// Loading builds the tokenizer through several transient copies of its
/// vocabulary and merges (the GGUF arrays, a tokenizer definition, the
/// tokenizers crate's parse buffers): up to 40 MB of heap at once (massif,
/// SmolLM2), freed before the first token, while the tables that stay
/// (about 12 MB) were allocated between them. glibc's allocator returns only the free memory
/// at the top of its heap by itself, so without this the freed middle
/// stayed resident for the life of the process, on top of the weights and
/// the KV cache (peak RSS, issue 27). A no-op where the allocator is not
/// glibc's.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and locks each arena itself; it
    // only releases pages of chunks that are free, so no live allocation is
    // touched, whatever other threads are doing.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The last step of loading a model (both hosts): builds the tokenizer's
/// decode table now, while its transient copy of the vocabulary can still
/// be returned (built on first use it was, after the first token, and it
/// stayed resident), then returns the heap loading freed
/// ([`release_freed_heap`]). Call it once nothing loading made is needed
/// any more (the parsed `.gguf` header dropped).
pub(crate) fn finish_load(tokenizer: &Tokenizer) -> Result<()> {
    tokenizer.decode(&[], true)?;
    release_freed_heap();
    Ok(())
}

fn token_text(t: &Tokenizer, id: Option<u32>) -> String {
    id.and_then(|i| t.id_to_token(i)).unwrap_or_default()
}

/// What both programs' hosts read from the file besides the weights: the
/// tokenizer, the chat template, BOS and EOS.
pub(crate) struct TextSide {
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) chat_template: Option<String>,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
}

impl TextSide {
    pub(crate) fn load(file: &gguf::GgufFile) -> Result<TextSide> {
        let tokenizer = Arc::new(tokenizer::load(file)?);
        let chat_template = file.str("tokenizer.chat_template").ok().map(str::to_string);
        let id = |k: &str| file.int(k).ok().and_then(|v| u32::try_from(v).ok());
        Ok(TextSide {
            tokenizer,
            chat_template,
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
        })
    }

    /// The chat template over `messages`, generation prompt added, as ids.
    pub(crate) fn chat_prompt_messages(&self, messages: &[chat::Message]) -> Result<Vec<u32>> {
        chat_ids(
            &self.tokenizer,
            self.chat_template.as_deref(),
            self.bos,
            self.eos,
            messages,
        )
    }
}

/// `template` (the file's chat template) over `messages`, generation prompt
/// added, encoded as [`Llm::encode`](crate::Llm::encode) does.
pub(crate) fn chat_ids(
    tokenizer: &Tokenizer,
    template: Option<&str>,
    bos: Option<u32>,
    eos: Option<u32>,
    messages: &[chat::Message],
) -> Result<Vec<u32>> {
    let template = template.ok_or_else(|| {
        Status::new(
            StatusCode::InvalidArgument,
            "gguf has no tokenizer.chat_template; use a plain prompt",
        )
    })?;
    let text = chat::render(
        template,
        messages,
        true,
        &token_text(tokenizer, bos),
        &token_text(tokenizer, eos),
    )?;
    tokenizer.encode(&text, false, false)
}

/// Reads the logits tensor `entry` returned (left on the device by
/// `call_device`; `rows` x `vocab` of them) into `buf`, the host buffer a
/// host keeps across calls (a fresh buffer per call costs page faults: 4 ms
/// for a 16-row step on an H100 host), and hands the filled slice to `take`.
pub(crate) fn read_logits<R>(
    entry: &str,
    results: Vec<Value>,
    rows: usize,
    vocab: usize,
    buf: &Mutex<Vec<f32>>,
    take: impl FnOnce(&[f32]) -> R,
) -> Result<R> {
    let no_tensor = || {
        Status::new(
            StatusCode::Internal,
            format!("{entry} returned no logits tensor"),
        )
    };
    let r = match results.into_iter().next() {
        Some(Value::Ref(r)) => r,
        _ => return Err(no_tensor()),
    };
    let t = DeviceTensor::from_ref(r).map_err(|_| no_tensor())?;
    let count: u64 = t.shape().iter().product();
    if count != (rows * vocab) as u64 {
        return Err(Status::new(
            StatusCode::Internal,
            format!("{entry} returned {count} logits for {rows} rows of {vocab}"),
        ));
    }
    // A poisoned lock only means a reader panicked mid-copy: the buffer is
    // overwritten whole before use.
    let mut buf = buf.lock().unwrap_or_else(|e| e.into_inner());
    buf.resize(rows * vocab, 0.0);
    t.read_into(&mut buf[..])?;
    Ok(take(&buf))
}
