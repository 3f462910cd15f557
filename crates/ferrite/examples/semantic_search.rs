//! Semantic search with all-MiniLM-L6-v2 through the `ferrite` facade: the
//! committed program `examples/minilm/minilm.vmfb` reads the upstream
//! `model.safetensors` as its parameters (scope `model`), embeds every
//! sentence of `examples/minilm/corpus.txt` and a query, and prints the
//! closest sentences.
//!
//! ```text
//! python examples/minilm/assets.py     # fetches the weights and tokenizer once
//! cargo run --release -p ferrite --example semantic_search -- ["a query"] [--device local-sync] [--top 5]
//! ```
//!
//! Tokenization uses the `tokenizers` crate on the same `tokenizer.json`
//! (`[CLS] tokens [SEP]`, at most 128); the ids are padded with 0 to the
//! program's 128 and the attention mask marks the real tokens.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use ferrite::{Instance, Session, Tensor, Value};

const SEQ: usize = 128;
const HIDDEN: usize = 384;
const DEFAULT_QUERY: &str = "Someone is playing a musical instrument.";

struct Args {
    query: String,
    device: String,
    top: usize,
    example_dir: PathBuf,
    cache_dir: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache = std::env::var_os("FERRITE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache"));
    let mut args = Args {
        query: DEFAULT_QUERY.into(),
        device: "local-task".into(),
        top: 5,
        example_dir: root.join("examples/minilm"),
        cache_dir: cache.join("minilm"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (key, inline) = match a.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match key.as_str() {
            "--device" => args.device = value("--device")?,
            "--top" => {
                let v = value("--top")?;
                args.top = v
                    .parse()
                    .map_err(|_| format!("--top expects a count, got '{v}'"))?;
            }
            "--dir" => args.example_dir = PathBuf::from(value("--dir")?),
            "--cache" => args.cache_dir = PathBuf::from(value("--cache")?),
            "-h" | "--help" => {
                println!("usage: semantic_search [QUERY] [--device local-task|local-sync|cuda] [--top N] [--dir examples/minilm] [--cache DIR]");
                std::process::exit(0);
            }
            other if other.starts_with('-') => {
                return Err(format!("unknown argument '{other}' (try --help)"))
            }
            _ => args.query = a,
        }
    }
    Ok(args)
}

fn existing(path: PathBuf) -> Result<PathBuf, String> {
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found: run `python examples/minilm/assets.py` (or scripts/run-example.sh) to fetch the weights",
            path.display()
        ))
    }
}

/// Token ids and attention mask, each `[1, SEQ]` i64.
fn encode(tokenizer: &tokenizers::Tokenizer, text: &str) -> Result<(Vec<i64>, Vec<i64>), String> {
    let enc = tokenizer
        .encode(text, true)
        .map_err(|e| format!("tokenizing {text:?}: {e}"))?;
    // The real tokens (the file may ask the crate to pad; the mask says
    // which tokens are real).
    let mut ids: Vec<i64> = enc
        .get_ids()
        .iter()
        .zip(enc.get_attention_mask())
        .filter(|(_, &m)| m != 0)
        .map(|(&i, _)| i as i64)
        .collect();
    if ids.len() > SEQ {
        let sep = *ids.last().unwrap_or(&0);
        ids.truncate(SEQ - 1);
        ids.push(sep);
    }
    let mut mask = vec![1i64; ids.len()];
    ids.resize(SEQ, 0);
    mask.resize(SEQ, 0);
    Ok((ids, mask))
}

fn embed(
    session: &Session,
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let (ids, mask) = encode(tokenizer, text)?;
    let shape = [1, SEQ as u64];
    let out = session.call(
        "embed",
        &[
            Value::from(Tensor::from_slice(&shape, &ids)?),
            Value::from(Tensor::from_slice(&shape, &mask)?),
        ],
    )?;
    let v = out[0]
        .as_tensor()
        .ok_or("embed returned no tensor")?
        .to_f32_vec()?;
    if v.len() != HIDDEN {
        return Err(format!("embed returned {} values, expected {HIDDEN}", v.len()).into());
    }
    Ok(v)
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let module = args.example_dir.join(if args.device.starts_with("cuda") {
        "minilm_cuda.vmfb"
    } else {
        "minilm.vmfb"
    });
    let corpus_path = args.example_dir.join("corpus.txt");
    let weights = existing(args.cache_dir.join("model.safetensors"))?;
    let tokenizer_path = existing(args.cache_dir.join("tokenizer.json"))?;
    let corpus: Vec<String> = std::fs::read_to_string(&corpus_path)
        .map_err(|e| format!("reading {}: {e}", corpus_path.display()))?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();

    let t0 = Instant::now();
    let tokenizer = tokenizers::Tokenizer::from_file(Path::new(&tokenizer_path))
        .map_err(|e| format!("loading {}: {e}", tokenizer_path.display()))?;
    let instance = Instance::new();
    let mut session = Session::new(&instance, &args.device)?;
    session.add_parameter_file("model", &weights)?;
    session.load_file(&module)?;
    let t1 = Instant::now();
    let docs = corpus
        .iter()
        .map(|s| embed(&session, &tokenizer, s))
        .collect::<Result<Vec<_>, _>>()?;
    let t2 = Instant::now();
    let query = embed(&session, &tokenizer, &args.query)?;

    let mut scored: Vec<(f32, &str)> = docs
        .iter()
        .zip(&corpus)
        .map(|(d, s)| (d.iter().zip(&query).map(|(a, b)| a * b).sum(), s.as_str()))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "ferrite (Rust API) on {}: loaded in {:.0} ms, embedded {} sentences in {:.0} ms ({:.1} ms each)",
        args.device,
        ms(t1 - t0),
        corpus.len(),
        ms(t2 - t1),
        ms(t2 - t1) / corpus.len() as f64
    );
    println!("query: {}", args.query);
    for (rank, (score, sentence)) in scored.iter().take(args.top).enumerate() {
        println!("  {}. {score:.4}  {sentence}", rank + 1);
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("semantic_search: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("semantic_search: {e}");
            ExitCode::FAILURE
        }
    }
}
