//! The server's scheduler over the batch program, without HTTP: what
//! `scripts/bench-serve.py` measures at 1 and 16 streams, minus the
//! sockets, so that two batch programs can be compared in one process with
//! their runs interleaved (on a loaded machine the load then falls on both
//! alike).
//!
//!     cargo run --release -p ferrite-serve --example schedule_bench -- \
//!         PATH.gguf [device] [rounds] [--program PROGRAM.vmfb] [--compare PROGRAM.vmfb]
//!
//! Each level sends greedy completions of 32 tokens (end-of-sequence
//! ignored) of bench-serve.py's four story prompts: 1 stream runs 4
//! requests one after the other, 16 streams 16 requests from 16 client
//! threads at once. Printed per program: aggregate tokens/s (generated
//! tokens over the level's wall time, prefills included), time to first
//! token and inter-token latency (p50 / max), and the 16-stream rate over
//! the 1-stream rate of the same round; the median of the rounds last.
//! `--program` replaces the built-in batch program (which is for CPUs:
//! on cuda pass the program compiled for it, docs/llm-batch.md);
//! `--compare` loads a second batch program file (e.g. the one built
//! before the `step` entry point, whose prompts go through `prefill_slot`
//! calls of their own) and runs it right after the built-in one each round.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferrite_llm::{BatchLlm, Sampling};
use ferrite_serve::engine::{BatchEngine, Engine};
use ferrite_serve::metrics::Metrics;
use ferrite_serve::scheduler::{Event, Job, Queue, Scheduler, SchedulerConfig};

/// bench-serve.py's prompts.
const PROMPTS: [&str; 4] = [
    "Write a long story about a dragon who lives in a castle. Once upon a time,",
    "Here is a detailed history of the Roman Empire. In the beginning,",
    "The following is a long essay about the ocean and its creatures. The ocean",
    "A travel diary of a journey across the mountains. Day one: we set out",
];
const TOKENS: usize = 32;

struct Level {
    tokens_per_s: f64,
    ttft: Vec<f64>,
    itl: Vec<f64>,
}

/// One request: (text chunk times, first chunk time from submission,
/// generated tokens).
fn request(queue: &Queue, prompt: Vec<u32>) -> (Vec<Instant>, Instant, usize) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sent = Instant::now();
    if let Err(e) = queue.submit(Job {
        prompt,
        max_tokens: TOKENS,
        sampling: Sampling::default(),
        stop: Vec::new(),
        ignore_eos: true,
        events: tx,
        arrived: sent,
    }) {
        panic!("submit: {e}");
    }
    let mut times = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Text(_) => times.push(Instant::now()),
            Event::Done {
                completion_tokens, ..
            } => return (times, sent, completion_tokens),
            Event::Error(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("the engine dropped a request");
}

/// `requests` requests from `streams` client threads through a scheduler
/// over `engine` on this thread.
fn level(engine: &mut dyn Engine, prompts: &[Vec<u32>], streams: usize, requests: usize) -> Level {
    let metrics = Arc::new(Metrics::new());
    let queue = Arc::new(Queue::new(1024, metrics.clone()));
    let config = SchedulerConfig {
        max_batch: 16,
        prefill_chunk: 64,
        shutdown_grace: Duration::from_secs(60),
    };
    thread::scope(|s| {
        let q = queue.clone();
        let clients = s.spawn(move || {
            let start = Instant::now();
            let results: Vec<_> = thread::scope(|c| {
                let workers: Vec<_> = (0..streams)
                    .map(|w| {
                        let q = &q;
                        c.spawn(move || {
                            (w..requests)
                                .step_by(streams)
                                .map(|i| request(q, prompts[i % prompts.len()].clone()))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .flat_map(|w| w.join().expect("client thread"))
                    .collect()
            });
            let wall = start.elapsed().as_secs_f64();
            q.close();
            let tokens: usize = results.iter().map(|r| r.2).sum();
            let mut ttft = Vec::new();
            let mut itl = Vec::new();
            for (times, sent, _) in &results {
                if let Some(first) = times.first() {
                    ttft.push((*first - *sent).as_secs_f64());
                }
                for w in times.windows(2) {
                    itl.push((w[1] - w[0]).as_secs_f64());
                }
            }
            Level {
                tokens_per_s: tokens as f64 / wall,
                ttft,
                itl,
            }
        });
        Scheduler::new(engine, queue.clone(), metrics, config).run(&AtomicBool::new(false));
        clients.join().expect("client threads")
    })
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() -> ferrite_llm::Result<()> {
    let mut positional = Vec::new();
    let (mut program, mut compare) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--compare" || a == "--program" {
            let path = PathBuf::from(args.next().unwrap_or_else(|| {
                eprintln!("{a} needs a program file");
                std::process::exit(2)
            }));
            if a == "--compare" {
                compare = Some(path);
            } else {
                program = Some(path);
            }
        } else {
            positional.push(a);
        }
    }
    let Some(gguf) = positional.first().cloned() else {
        eprintln!(
            "usage: schedule_bench PATH.gguf [device] [rounds] [--program PROGRAM.vmfb] [--compare PROGRAM.vmfb]"
        );
        std::process::exit(2)
    };
    let device = positional
        .get(1)
        .cloned()
        .unwrap_or_else(|| "local-task".into());
    let rounds: usize = match positional.get(2).map(|s| s.parse()) {
        None => 3,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("rounds must be a positive integer");
            std::process::exit(2)
        }
    };
    let mut engines = vec![(
        program.as_ref().map_or_else(
            || "built-in program".to_string(),
            |p| p.display().to_string(),
        ),
        BatchEngine::new(BatchLlm::load_with_program(
            &gguf,
            &device,
            program.as_deref(),
        )?),
    )];
    if let Some(p) = &compare {
        engines.push((
            p.display().to_string(),
            BatchEngine::new(BatchLlm::load_with_program(&gguf, &device, Some(p))?),
        ));
    }
    let tokenizer = engines[0].1.tokenizer();
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| tokenizer.encode(p, false, false))
        .collect::<ferrite_llm::Result<_>>()?;
    // One unmeasured request per engine (first-call costs).
    for (_, e) in &mut engines {
        level(e, &prompts, 1, 1);
    }
    let mut ratios = vec![Vec::new(); engines.len()];
    for round in 0..rounds {
        for (k, (name, e)) in engines.iter_mut().enumerate() {
            let mut one = level(e, &prompts, 1, 4);
            let mut many = level(e, &prompts, 16, 16);
            let ratio = many.tokens_per_s / one.tokens_per_s;
            ratios[k].push(ratio);
            println!(
                "round {round} {name} ({device}, {} step rows): 1 stream {:.1} tok/s (TTFT p50 {:.0} ms, ITL p50 {:.1} ms); \
                 16 streams {:.1} tok/s (TTFT p50 {:.0} / max {:.0} ms, ITL p50 {:.1} / max {:.1} ms); 16/1 = {ratio:.2}x",
                e.step_rows(),
                one.tokens_per_s,
                quantile(&mut one.ttft, 0.5) * 1e3,
                quantile(&mut one.itl, 0.5) * 1e3,
                many.tokens_per_s,
                quantile(&mut many.ttft, 0.5) * 1e3,
                quantile(&mut many.ttft, 1.0) * 1e3,
                quantile(&mut many.itl, 0.5) * 1e3,
                quantile(&mut many.itl, 1.0) * 1e3,
            );
        }
    }
    for (k, (name, _)) in engines.iter().enumerate() {
        println!(
            "median 16/1 over {rounds} rounds, {name}: {:.2}x",
            quantile(&mut ratios[k], 0.5)
        );
    }
    Ok(())
}
