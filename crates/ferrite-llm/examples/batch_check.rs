//! Checks a batch program's logits against the single-sequence program's on
//! one device (e.g. the cuda programs of `examples/llm/build_cuda.py`, on
//! weights whose values are arbitrary: no greedy ids of a real model to
//! compare with).
//!
//!     cargo run --release -p ferrite-llm --example batch_check -- PATH.gguf [device] [steps]
//!
//! `FERRITE_LLM_PROGRAM` and `FERRITE_BATCH_PROGRAM` name the program files
//! as for `batch_bench` (unset: the built-in CPU programs). Every slot gets
//! a prompt of its own (8 to 23 tokens); the single program prefills each
//! and decodes `steps` + 2 greedy tokens (the reference logits at every
//! position). The batch program then prefills every slot (`prefill_slot`),
//! decodes all slots together `steps` times with the reference's tokens
//! (`decode_batch` of every slot), then 3 slots (`decode_batch`), one slot
//! (`decode_slot`), and one `step` of a decode row beside a slot's whole
//! prompt again; each returned row is compared with the reference at its
//! position. Prints the largest difference relative to the largest
//! reference logit per entry point and exits 1 past 1e-3 or when an argmax
//! differs.

use ferrite_llm::{BatchLlm, Llm, StepRow};

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Largest |a - b| over the largest |b|, and whether the argmaxes agree.
fn compare(a: &[f32], b: &[f32]) -> (f64, bool) {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6) as f64;
    let diff = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    (diff / scale, argmax(a) == argmax(b))
}

struct Tally {
    name: &'static str,
    worst: f64,
    rows: usize,
    argmax_differs: usize,
}

impl Tally {
    fn new(name: &'static str) -> Tally {
        Tally {
            name,
            worst: 0.0,
            rows: 0,
            argmax_differs: 0,
        }
    }

    fn add(&mut self, got: &[f32], want: &[f32]) {
        let (d, same) = compare(got, want);
        self.worst = self.worst.max(d);
        self.rows += 1;
        if !same {
            self.argmax_differs += 1;
        }
    }

    fn ok(&self) -> bool {
        println!(
            "{:12} {:3} rows: largest relative difference {:.2e}, argmax differs in {}",
            self.name, self.rows, self.worst, self.argmax_differs
        );
        self.rows > 0 && self.worst <= 1e-3 && self.argmax_differs == 0
    }
}

fn main() -> ferrite_llm::Result<()> {
    let mut args = std::env::args().skip(1);
    let gguf = args.next().unwrap_or_else(|| {
        eprintln!("usage: batch_check PATH.gguf [device] [steps]");
        std::process::exit(2)
    });
    let device = args.next().unwrap_or_else(|| "local-task".into());
    let steps: usize = match args.next().map(|s| s.parse()) {
        None => 4,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("steps must be a non-negative integer");
            std::process::exit(2)
        }
    };
    let program = |var: &str| std::env::var_os(var).map(std::path::PathBuf::from);
    let single = Llm::load_with_program(&gguf, &device, program("FERRITE_LLM_PROGRAM").as_deref())?;
    let llm =
        BatchLlm::load_with_program(&gguf, &device, program("FERRITE_BATCH_PROGRAM").as_deref())?;
    let slots = llm.slots();
    let prompts: Vec<Vec<u32>> = (0..slots)
        .map(|s| {
            (0..8 + s)
                .map(|i| 100 + ((s * 131 + i * 17) % 40000) as u32)
                .collect()
        })
        .collect();
    // reference[s][k]: logits after prompt s and its first k greedy tokens
    // toks[s][0..k].
    let mut reference = Vec::new();
    let mut toks = Vec::new();
    for p in &prompts {
        let mut r = vec![single.prefill(p)?];
        let mut t = Vec::new();
        for k in 0..steps + 2 {
            t.push(argmax(&r[k]));
            r.push(single.decode_step(t[k], p.len() + k)?);
        }
        reference.push(r);
        toks.push(t);
    }
    let mut prefill = Tally::new("prefill_slot");
    for (s, p) in prompts.iter().enumerate() {
        prefill.add(&llm.prefill(s, p, 0)?, &reference[s][0]);
    }
    let mut all = Tally::new("batch(all)");
    for k in 0..steps {
        let items: Vec<_> = (0..slots)
            .map(|s| (s, toks[s][k], prompts[s].len() + k))
            .collect();
        for (s, got) in llm.decode_batch(&items)?.iter().enumerate() {
            all.add(got, &reference[s][k + 1]);
        }
    }
    let k = steps;
    let mut three = Tally::new("batch(3)");
    let some = [1 % slots, 5 % slots, 9 % slots];
    let items: Vec<_> = some
        .iter()
        .map(|&s| (s, toks[s][k], prompts[s].len() + k))
        .collect();
    for (&s, got) in some.iter().zip(llm.decode_batch(&items)?.iter()) {
        three.add(got, &reference[s][k + 1]);
    }
    let mut one = Tally::new("decode_slot");
    let s = some[0];
    let got = llm.decode_batch(&[(s, toks[s][k + 1], prompts[s].len() + k + 1)])?;
    one.add(&got[0], &reference[s][k + 2]);
    // A decode row of slot some[1] beside slot 12's whole prompt again.
    let mut step = Tally::new("step");
    let d = some[1];
    let again = 12 % slots;
    let mut rows = vec![StepRow {
        slot: d,
        token: toks[d][k + 1],
        pos: prompts[d].len() + k + 1,
        logits: true,
    }];
    let n = prompts[again].len();
    rows.extend(prompts[again].iter().enumerate().map(|(i, &t)| StepRow {
        slot: again,
        token: t,
        pos: i,
        logits: i + 1 == n,
    }));
    let got = llm.step(&rows)?;
    step.add(&got[0], &reference[d][k + 2]);
    step.add(&got[1], &reference[again][0]);
    let oks = [prefill.ok(), all.ok(), three.ok(), one.ok(), step.ok()];
    if oks.iter().all(|&ok| ok) {
        println!("{device}: batch program agrees with the single program");
        Ok(())
    } else {
        println!("{device}: batch program DIFFERS from the single program");
        std::process::exit(1)
    }
}
