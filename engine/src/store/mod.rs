//! Models on disk: aliases fetched into the cache and checked (`alias`), files
//! memory-mapped (`file`), and a name resolved to a file the way `--model` does.

mod alias;
mod file;

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

pub use alias::{
    alias, alias_names, ensure_default_model, home, sha256_file, Alias, ALIASES, DEFAULT,
};
pub use file::ModelFile;

/// The file `name` stands for: an existing path as given, else an alias's file (fetched
/// and checked when missing, `status` told each stage). A bare name that is no alias is an
/// error listing the aliases; any other path is left to fail when opened.
pub fn resolve(name: &Path, status: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if name.exists() {
        return Ok(name.to_path_buf());
    }
    match name.to_str().and_then(alias) {
        Some(alias) => alias.ensure(status),
        None if name.components().count() == 1 && name.extension().is_none() => bail!(
            "no model file or alias {} (aliases: {})",
            name.display(),
            alias_names()
        ),
        None => Ok(name.to_path_buf()),
    }
}
