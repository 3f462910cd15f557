//! `ferrite generate`: text generation with a GGUF model (ferrite-llm).
//! Stdout carries only the generated text (streamed) or, with
//! `--output_ids`, the generated ids on one line; everything else goes to
//! stderr.

use std::io::Write;
use std::path::PathBuf;

use ferrite_llm::{Llm, Options, Result, Sampling, Status, StatusCode};

/// Arguments of `ferrite generate`.
#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The model file (.gguf; SmolLM2-135M's architecture).
    #[arg(long)]
    gguf: PathBuf,
    /// A plain text prompt (no template).
    #[arg(long, conflicts_with_all = ["chat", "prompt_ids"])]
    prompt: Option<String>,
    /// A user message, wrapped in the file's chat template.
    #[arg(long, conflicts_with = "prompt_ids")]
    chat: Option<String>,
    /// The prompt as comma-separated token ids.
    #[arg(long = "prompt_ids", value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate at most.
    #[arg(long = "max_tokens", default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Top-k (0: off).
    #[arg(long = "top_k", default_value_t = 0)]
    top_k: usize,
    /// Top-p (1: off).
    #[arg(long = "top_p", default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when the text contains this (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Keep generating past the end-of-sequence token.
    #[arg(long = "ignore_eos")]
    ignore_eos: bool,
    /// The device (local-sync, local-task, local-task://?workers=N).
    #[arg(long, default_value = "local-task")]
    device: String,
    /// KV cache capacity in positions (prompt plus generated tokens),
    /// allocated on the device at load; positions past it are an error.
    #[arg(long, default_value_t = ferrite_llm::DEFAULT_CONTEXT)]
    context: usize,
    /// A program to use instead of the built-in one.
    #[arg(long)]
    module: Option<PathBuf>,
    /// Print the generated ids (one line, space-separated) instead of text.
    #[arg(long = "output_ids")]
    output_ids: bool,
    /// Print time to first token and decode tokens/s to stderr.
    #[arg(long)]
    benchmark: bool,
}

/// Runs `ferrite generate`.
pub fn run(a: &GenerateArgs) -> Result<()> {
    let mut llm = Llm::load_with_context(&a.gguf, &a.device, a.module.as_deref(), a.context)?;
    let prompt = match (&a.prompt, &a.chat, &a.prompt_ids) {
        (Some(p), None, None) => llm.encode(p)?,
        (None, Some(c), None) => llm.chat_prompt(c)?,
        (None, None, Some(ids)) => ids.clone(),
        _ => {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                "give one of --prompt, --chat or --prompt_ids",
            ))
        }
    };
    let opts = Options {
        max_tokens: a.max_tokens,
        sampling: Sampling {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        stop_at_eos: !a.ignore_eos,
        stop: a.stop.clone(),
    };
    let stdout = std::io::stdout();
    let stream_text = !a.output_ids;
    let out = llm.generate(&prompt, &opts, |_, text| {
        if stream_text {
            let mut o = stdout.lock();
            let _ = o.write_all(text.as_bytes());
            let _ = o.flush();
        }
        true
    })?;
    if a.output_ids {
        let ids: Vec<String> = out.ids.iter().map(u32::to_string).collect();
        println!("{}", ids.join(" "));
    } else {
        println!();
    }
    if a.benchmark {
        eprintln!(
            "prompt tokens: {}\ngenerated tokens: {}\ntime to first token: {:.2} ms\ndecode: {:.2} tokens/s ({:.2} ms/token over {} steps)\nfinish: {:?}",
            out.prompt_tokens,
            out.ids.len(),
            out.time_to_first_token.as_secs_f64() * 1e3,
            out.decode_tokens_per_second(),
            if out.decode_steps > 0 { out.decode_time.as_secs_f64() * 1e3 / out.decode_steps as f64 } else { 0.0 },
            out.decode_steps,
            out.finish
        );
    }
    Ok(())
}
