//! Decode step time of the batch program at several batch sizes, beside the
//! single-sequence program's decode step, on one device.
//!
//!     cargo run --release -p ferrite-llm --example batch_bench -- PATH.gguf [device] [steps]
//!
//! Every slot first holds a 64-token prompt; each step then decodes one
//! token for B slots at positions 64, 65, ... (B = 1, 4, 16, capped at the
//! program's slots). Prints the median step time and aggregate tokens/s
//! (B / step time). The ids are not checked here: tests/batch.rs checks the
//! batched greedy ids against `Llm::generate`.

use std::time::{Duration, Instant};

use ferrite_llm::{BatchLlm, Llm};

const PROMPT: usize = 64;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> ferrite_llm::Result<()> {
    let mut args = std::env::args().skip(1);
    let gguf = args.next().unwrap_or_else(|| {
        eprintln!("usage: batch_bench PATH.gguf [device] [steps]");
        std::process::exit(2)
    });
    let device = args.next().unwrap_or_else(|| "local-task".into());
    let steps: usize = match args.next().map(|s| s.parse()) {
        None => 8,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("steps must be a positive integer");
            std::process::exit(2)
        }
    };
    let prompt = vec![504u32; PROMPT];

    let single = Llm::load(&gguf, &device)?;
    single.prefill(&prompt)?;
    let mut times = Vec::new();
    for i in 0..steps + 1 {
        let t = Instant::now();
        single.decode_step(504, PROMPT + i)?;
        times.push(t.elapsed());
    }
    let base = median(times[1..].to_vec());
    println!(
        "{device}: single-sequence decode step {:.1} ms ({:.1} tokens/s)",
        base.as_secs_f64() * 1e3,
        1.0 / base.as_secs_f64()
    );
    drop(single);

    let llm = BatchLlm::load(&gguf, &device)?;
    for slot in 0..llm.slots() {
        llm.prefill(slot, &prompt, 0)?;
    }
    for b in [1, 4, 16].into_iter().filter(|&b| b <= llm.slots()) {
        let mut times = Vec::new();
        for i in 0..steps + 1 {
            let items: Vec<_> = (0..b).map(|s| (s, 504, PROMPT + i)).collect();
            let t = Instant::now();
            llm.decode_batch(&items)?;
            times.push(t.elapsed());
        }
        let step = median(times[1..].to_vec());
        let tps = b as f64 / step.as_secs_f64();
        println!(
            "{device}: decode_batch B={b:2}: step {:.1} ms, aggregate {tps:.1} tokens/s ({:.2}x the single-sequence step's rate)",
            step.as_secs_f64() * 1e3,
            tps * base.as_secs_f64()
        );
    }
    Ok(())
}
