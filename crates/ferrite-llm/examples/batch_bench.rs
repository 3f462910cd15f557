//! Decode step time of the batch program at several batch sizes, beside the
//! single-sequence program's decode step, on one device.
//!
//!     cargo run --release -p ferrite-llm --example batch_bench -- PATH.gguf [device] [rounds] [sizes]
//!
//! `sizes` is a comma-separated list of batch sizes (default `1,4,8,16`).
//! On `cuda` the programs must be compiled for it: `FERRITE_LLM_PROGRAM`
//! names the single-sequence program file and `FERRITE_BATCH_PROGRAM` the
//! batch program file (e.g. `build/llm/smollm2-cuda.vmfb` and
//! `build/llm/smollm2_batch-cuda.vmfb`); unset, the built-in CPU programs.
//! `FERRITE_BENCH_TRACE=FILE.json` records the counted rounds as a
//! Chrome/Perfetto trace (`ferrite profile FILE.json` summarizes it).
//!
//! Both programs are loaded; every slot first holds a 64-token prompt. Each
//! round then times, one after the other, a single-sequence decode step and
//! a `decode_batch` step of B = 1, 4, 8 and 16 sequences (capped at the
//! program's slots) at positions 64, 65, ..., so that a busy machine slows
//! all of them alike. Prints the median and the fastest step of each and
//! aggregate tokens/s (B / median step). The ids are not checked here:
//! tests/batch.rs checks the batched greedy ids against `Llm::generate`.

use std::time::{Duration, Instant};

use ferrite_llm::{BatchLlm, Llm};

const PROMPT: usize = 64;

fn main() -> ferrite_llm::Result<()> {
    let mut args = std::env::args().skip(1);
    let gguf = args.next().unwrap_or_else(|| {
        eprintln!("usage: batch_bench PATH.gguf [device] [rounds]");
        std::process::exit(2)
    });
    let device = args.next().unwrap_or_else(|| "local-task".into());
    let rounds: usize = match args.next().map(|s| s.parse()) {
        None => 8,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("rounds must be a positive integer");
            std::process::exit(2)
        }
    };
    let sizes: Vec<usize> = match args.next() {
        None => vec![1, 4, 8, 16],
        Some(list) => match list.split(',').map(|s| s.trim().parse()).collect() {
            Ok(v) => v,
            Err(_) => {
                eprintln!("sizes must be a comma-separated list of integers, e.g. 1,16");
                std::process::exit(2)
            }
        },
    };
    let program = |var: &str| std::env::var_os(var).map(std::path::PathBuf::from);
    let prompt = vec![504u32; PROMPT];
    let single = Llm::load_with_program(&gguf, &device, program("FERRITE_LLM_PROGRAM").as_deref())?;
    single.prefill(&prompt)?;
    let llm =
        BatchLlm::load_with_program(&gguf, &device, program("FERRITE_BATCH_PROGRAM").as_deref())?;
    for slot in 0..llm.slots() {
        llm.prefill(slot, &prompt, 0)?;
    }
    let sizes: Vec<usize> = sizes
        .into_iter()
        .filter(|&b| b >= 1 && b <= llm.slots())
        .collect();
    // times[0]: the single program; times[1 + i]: decode_batch of sizes[i].
    let mut times = vec![Vec::new(); sizes.len() + 1];
    // Round 0 warms up and is not counted.
    let trace_file = std::env::var_os("FERRITE_BENCH_TRACE").map(std::path::PathBuf::from);
    for round in 0..=rounds {
        if round == 1 && trace_file.is_some() {
            ferrite::trace::start()?;
        }
        let pos = PROMPT + round;
        let t = Instant::now();
        single.decode_step(504, pos)?;
        let d = t.elapsed();
        if round > 0 {
            times[0].push(d);
        }
        for (i, &b) in sizes.iter().enumerate() {
            let items: Vec<_> = (0..b).map(|s| (s, 504, pos)).collect();
            let t = Instant::now();
            llm.decode_batch(&items)?;
            let d = t.elapsed();
            if round > 0 {
                times[1 + i].push(d);
            }
        }
    }
    if let Some(path) = &trace_file {
        if let Some(trace) = ferrite::trace::stop() {
            trace.write_chrome_json(path)?;
            eprintln!("trace written to {}", path.display());
        }
    }
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        (v[v.len() / 2].as_secs_f64(), v[0].as_secs_f64())
    };
    let (base, base_min) = stats(&mut times[0]);
    println!(
        "{device}: single-sequence decode step {:.1} ms (fastest {:.1}), {:.1} tokens/s",
        base * 1e3,
        base_min * 1e3,
        1.0 / base
    );
    for (i, &b) in sizes.iter().enumerate() {
        let (step, fastest) = stats(&mut times[1 + i]);
        let entry = if b == 1 {
            "decode_slot"
        } else if b >= llm.wide_batch_min() {
            "decode_batch_wide"
        } else {
            "decode_batch"
        };
        println!(
            "{device}: B={b:2} ({entry}): step {:.1} ms (fastest {:.1}), aggregate {:.1} tokens/s = {:.2}x single-sequence",
            step * 1e3,
            fastest * 1e3,
            b as f64 / step,
            b as f64 / step * base
        );
    }
    Ok(())
}
