//! Fornax as a library: a model by alias (fetched and checked on first use) or path, then
//! a greedy chat reply streamed token by token, on the CPU backend.
//!
//! `cargo run --release -p fornax --example library -- [ALIAS|PATH] [QUESTION]`

use std::io::Write;

use anyhow::Result;
use fornax::model_file::ModelFile;
use fornax::model_store;
use fornax_backends::CpuBackend;
use fornax_engine::gguf::GgufFile;
use fornax_engine::model::Model;
use fornax_engine::tokenizer::{ChatMessage, TextStream, Tokenizer};
use fornax_engine::{generate, GenerateParams};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "smollm2-135m".into());
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".into());

    // An alias is fetched into the cache and verified; anything else is a path.
    let path = match model_store::alias(&model) {
        Some(alias) => alias.ensure(&mut |status| eprintln!("{status}"))?,
        None => model.into(),
    };
    let file = ModelFile::open(&path)?;
    let gguf = GgufFile::parse(file.bytes())?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let model = Model::<CpuBackend>::from_gguf(&gguf, &Default::default(), &mut |_, _| {})?;

    // The chat template comes from the file; generation stops at its end-of-turn token.
    let prompt = tokenizer.encode_chat(&[ChatMessage::new("user", &question)])?;
    let params = GenerateParams {
        max_tokens: 48,
        stop_ids: tokenizer.stop_ids(),
        ..GenerateParams::default()
    };
    let mut text = TextStream::default();
    let mut stdout = std::io::stdout();
    generate(&model, &prompt, &params, |id| {
        if !params.stop_ids.contains(&id) {
            print!(
                "{}",
                text.push(tokenizer.token_bytes(id).unwrap_or_default())
            );
            let _ = stdout.flush();
        }
        true
    })?;
    println!("{}", text.finish());
    Ok(())
}
