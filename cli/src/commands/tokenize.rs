//! `fornax tokenize`: text to ids, or ids to text.

use anyhow::{Context, Result};
use clap::Args;

use fornax_options::{parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Text to encode (or, with --decode, a JSON array of ids).
    pub text: String,
    /// Parse special-token text such as <|im_start|> as special tokens.
    #[arg(long)]
    pub special: bool,
    /// Decode a JSON array of ids instead.
    #[arg(long)]
    pub decode: bool,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let tok = tokenizer(&gguf)?;
    if args.decode {
        let ids: Vec<u32> = serde_json::from_str(&args.text)
            .context("--decode expects a JSON array of token ids")?;
        println!("{}", tok.decode(&ids)?);
    } else {
        println!(
            "{}",
            serde_json::to_string(&tok.encode(&args.text, args.special)?)?
        );
    }
    Ok(())
}
