//! The sub-commands; the options they share are `fornax_options`'s, the benchmarks
//! `fornax_bench`'s and the server `fornax_server`'s.

pub mod generate;
pub mod info;
pub mod kernels;
pub mod models;
pub mod perplexity;
pub mod serve;
pub mod tokenize;

use anyhow::{Context, Result};
use fornax_engine::store;

/// `fornax fetch [ALIAS]`: the alias's file (default model if none), fetched when missing.
pub fn fetch(name: Option<String>) -> Result<()> {
    let alias = match name {
        None => store::DEFAULT,
        Some(n) => store::alias(&n)
            .with_context(|| format!("no model alias {n:?} (aliases: {})", store::alias_names()))?,
    };
    let path = fornax_options::with_status(|status| alias.ensure(status))?;
    println!("{}", path.display());
    Ok(())
}
