//! Opening a GGUF file from disk: memory-mapped, then parsed by the engine.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use memmap2::Mmap;

/// A memory-mapped model file.
pub struct ModelFile {
    map: Mmap,
}

impl ModelFile {
    /// Maps `path` read-only.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path)
            .with_context(|| format!("cannot open model file {}", path.display()))?;
        // SAFETY: the map is read-only; the file is not expected to change while in use.
        let map = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        Ok(Self { map })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}
