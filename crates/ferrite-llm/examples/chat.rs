//! A chat answer streamed to the terminal through ferrite-llm.
//!
//!     cargo run --release -p ferrite-llm --example chat -- PATH.gguf ["question"] [device]

use std::io::Write;

fn main() -> ferrite_llm::Result<()> {
    let mut args = std::env::args().skip(1);
    let gguf = args.next().unwrap_or_else(|| {
        eprintln!("usage: chat PATH.gguf [\"question\"] [device]");
        std::process::exit(2)
    });
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".into());
    let device = args.next().unwrap_or_else(|| "local-task".into());
    let mut llm = ferrite_llm::Llm::load(&gguf, &device)?;
    let prompt = llm.chat_prompt(&question)?;
    let out = llm.generate(&prompt, &ferrite_llm::Options::default(), |_, text| {
        print!("{text}");
        let _ = std::io::stdout().flush();
        true
    })?;
    println!();
    eprintln!(
        "[{} prompt tokens, {} generated, first token {:.0} ms, {:.2} tokens/s]",
        out.prompt_tokens,
        out.ids.len(),
        out.time_to_first_token.as_secs_f64() * 1e3,
        out.decode_tokens_per_second()
    );
    Ok(())
}
