//! Fornax as a library, on the CPU backend: a model by alias (fetched and checked on first
//! use) or path; a greedy chat reply streamed token by token; then a batch engine that
//! answers several prompts together, stepping them through one forward pass a step.
//!
//! `cargo run --release -p fornax-engine --example library -- [ALIAS|PATH] [QUESTION]`

use std::io::Write;
use std::path::Path;

use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy};
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{PolicyKind, SchedulerConfig};
use fornax_engine::store::{self, ModelFile};
use fornax_engine::tokenizer::{ChatMessage, TextStream, Tokenizer};
use fornax_engine::{generate, CpuBackend, Engine, Event, GenerateParams, Request};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "smollm2-135m".into());
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".into());

    // An alias is fetched into the cache and verified; anything else is a path.
    let path = store::resolve(Path::new(&name), &mut |status| eprintln!("{status}"))?;
    let file = ModelFile::open(&path)?;
    let gguf = GgufFile::parse(file.bytes())?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let model = Model::<CpuBackend>::from_gguf(&gguf, &Default::default(), &mut |_, _| {})?;

    // One reply, streamed: the chat template comes from the file, and generation stops at
    // its end-of-turn token.
    let prompt = tokenizer.encode_chat(&[ChatMessage::new("user", &question)])?;
    let params = GenerateParams {
        max_tokens: 48,
        stop_ids: tokenizer.stop_ids(),
        ..GenerateParams::default()
    };
    let mut text = TextStream::default();
    generate(&model, &prompt, &params, |id| {
        if !params.stop_ids.contains(&id) {
            print!(
                "{}",
                text.push(tokenizer.token_bytes(id).unwrap_or_default())
            );
            let _ = std::io::stdout().flush();
        }
        true
    })?;
    println!("{}", text.finish());

    // A batch engine: requests in, events out, one step at a time over a paged KV pool.
    let kv = model.new_paged_cache(
        KvCapacity::f32_only(64).with_sliding(model.kv_dims(), 2, 256),
        TierPolicy::DEFAULT,
    );
    let mut engine = Engine::new(
        &model,
        kv,
        SchedulerConfig::default(),
        PolicyKind::default(),
    );
    let mut answers = Vec::new();
    for country in ["Italy", "Japan"] {
        let message = format!("What is the capital of {country}?");
        let id = engine.submit(Request {
            prompt: tokenizer.encode_chat(&[ChatMessage::new("user", &message)])?,
            max_tokens: 24,
            qos: 0,
            sampling: SamplingParams::greedy(),
            stop_ids: tokenizer.stop_ids(),
            constraint: None,
            prompt_logprobs: None,
            logprobs: None,
        })?;
        answers.push((id, message, Vec::new()));
    }
    while !engine.is_idle() {
        for event in engine.step()? {
            if let Event::Token { id, token, .. } = event {
                let answer = answers.iter_mut().find(|a| a.0 == id).expect("submitted");
                answer.2.push(token);
            }
        }
    }
    for (_, message, tokens) in answers {
        let reply: Vec<u32> = tokens
            .into_iter()
            .filter(|t| !tokenizer.stop_ids().contains(t))
            .collect();
        println!("{message} {}", tokenizer.decode(&reply)?);
    }
    Ok(())
}
