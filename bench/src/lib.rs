//! `fornax bench`: measured figures printed side by side, never pass/fail.

mod case;
mod kv;
mod load;
mod prefix;
mod single;
mod spec;
mod structured;
mod table;
mod window;

use anyhow::Result;
use clap::Subcommand;
use fornax_engine::tokenizer::Tokenizer;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// One sequence: prefill and decode tokens/s (median of several runs).
    Single(single::SingleArgs),
    /// One case (prefill, batched decode) as a JSON line, for scripts comparing engines.
    Case(case::CaseArgs),
    /// The paged KV cache: bytes per token, perplexity and decode speed for each tier policy.
    Kv(kv::KvBenchArgs),
    /// Open-loop load: one at a time vs static batches vs continuous batching.
    Load(load::LoadArgs),
    /// Shared prompt prefixes (chat): the prefix cache off and on at several batch sizes.
    Prefix(prefix::PrefixArgs),
    /// Speculative decoding off, with n-gram drafts and with the self-draft, on repetitive
    /// and free text.
    Spec(spec::SpecBenchArgs),
    /// Constrained decoding: time per output token with and without a JSON schema, and
    /// the token mask's time per step.
    Structured(structured::StructuredArgs),
    /// The seed's A/B table: before, after and llama.cpp on one customer-service workload,
    /// with SVG plots (latency CDF, throughput against offered load).
    Table(table::TableArgs),
    /// The elastic KV window off and on: perplexity at W(B), and a burst under KV pressure.
    Window(window::WindowBenchArgs),
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Single(args) => single::run(args),
        BenchCommand::Case(args) => case::run(args),
        BenchCommand::Kv(args) => kv::run(args),
        BenchCommand::Load(args) => load::run(args),
        BenchCommand::Prefix(args) => prefix::run(args),
        BenchCommand::Spec(args) => spec::run(args),
        BenchCommand::Structured(args) => structured::run(args),
        BenchCommand::Table(args) => table::run(args),
        BenchCommand::Window(args) => window::run(args),
    }
}

/// Checks a `MIN MAX` token range flag: `1 <= MIN <= MAX`.
fn token_range(range: &[usize], flag: &str) -> Result<[usize; 2]> {
    match range {
        &[lo, hi] if lo >= 1 && lo <= hi => Ok([lo, hi]),
        _ => anyhow::bail!("{flag} takes MIN MAX, 1 <= MIN <= MAX"),
    }
}

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A prompt of `tokens` tokens cut from real text (the same for every bench and engine).
fn text_prompt(tok: &Tokenizer, tokens: usize) -> Result<Vec<u32>> {
    let text = "The history of computing is a story of abstractions built on abstractions. "
        .repeat(tokens);
    Ok(tok.encode(&text, false)?.into_iter().take(tokens).collect())
}
