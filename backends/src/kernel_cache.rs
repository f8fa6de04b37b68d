//! Compiled kernels kept across runs. cubecl compiles each kernel the first time a
//! process launches it; on CUDA that is an NVRTC compile per kernel in every process.
//! Given a cache folder, cubecl keeps the PTX there and later processes load it instead
//! (wgpu builds without cubecl's SPIR-V compiler, as ours, keep nothing there).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cubecl_runtime::config::{cache::CacheConfig, CubeClRuntimeConfig, RuntimeConfig};

/// Prefix of the per-build folders under the cache root.
const BUILD_PREFIX: &str = "build-";

/// Build folders not written to for this long are removed.
const KEEP_UNUSED: Duration = Duration::from_secs(14 * 24 * 3600);

/// The folder for one build of an executable under `root`, named by the executable's
/// length and modification time: cubecl keys cached kernels by kernel and arguments, not
/// by their code, so a rebuilt binary must not load an older build's kernels.
pub fn build_folder(root: &Path, exe: &std::fs::Metadata) -> PathBuf {
    let modified = exe
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .unwrap_or_default();
    root.join(format!(
        "{BUILD_PREFIX}{:x}-{:x}",
        exe.len(),
        modified.as_nanos()
    ))
}

/// `config` with `folder` as its compiled-kernel cache, unless it names one already (a
/// `cubecl.toml`); the flag says whether `folder` was set.
pub fn with_kernel_cache(
    mut config: CubeClRuntimeConfig,
    folder: PathBuf,
) -> (CubeClRuntimeConfig, bool) {
    if config.compilation.cache.is_some() {
        return (config, false);
    }
    config.compilation.cache = Some(CacheConfig::File(folder));
    (config, true)
}

/// Makes cubecl keep this executable's compiled kernels under `root` (see
/// [`build_folder`]), reading its configuration files and environment as it would itself,
/// and removes build folders unused for two weeks. Call before any backend starts: once
/// cubecl has read its configuration this changes nothing and returns `None`; so it does
/// when a configuration file names its own cache. Returns the folder set.
pub fn keep_compiled_kernels(root: &Path) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let folder = build_folder(root, &std::fs::metadata(exe).ok()?);
    let mut state = CubeClRuntimeConfig::storage().lock();
    if state.is_some() {
        return None;
    }
    let config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    let (config, set) = with_kernel_cache(config, folder.clone());
    *state = Some(Arc::new(config));
    drop(state);
    if !set {
        return None;
    }
    remove_unused_builds(root, &folder, SystemTime::now());
    Some(folder)
}

/// Removes the build folders under `root`, other than `current`, not written to within
/// `KEEP_UNUSED` of `now`. Failures are ignored: the cache is only a saving.
pub fn remove_unused_builds(root: &Path, current: &Path, now: SystemTime) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_build = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(BUILD_PREFIX));
        let unused = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > KEEP_UNUSED);
        if is_build && unused && path != current && path.is_dir() {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_build_of_the_executable_has_its_own_folder() {
        let dir = std::env::temp_dir().join(format!("fornax-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("exe");
        std::fs::write(&exe, b"one build").unwrap();
        let first = build_folder(&dir, &std::fs::metadata(&exe).unwrap());
        assert_eq!(first, build_folder(&dir, &std::fs::metadata(&exe).unwrap()));
        assert!(first
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(BUILD_PREFIX));
        // Another build: another length, then the same length written later.
        std::fs::write(&exe, b"another build").unwrap();
        let second = build_folder(&dir, &std::fs::metadata(&exe).unwrap());
        assert_ne!(first, second);
        let f = std::fs::File::options().write(true).open(&exe).unwrap();
        f.set_modified(SystemTime::now() + Duration::from_secs(60))
            .unwrap();
        assert_ne!(
            second,
            build_folder(&dir, &std::fs::metadata(&exe).unwrap())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_cache_is_set_unless_a_configuration_file_names_one() {
        let folder = PathBuf::from("/somewhere/build-1-2");
        let (config, set) = with_kernel_cache(CubeClRuntimeConfig::default(), folder.clone());
        assert!(set);
        assert!(matches!(&config.compilation.cache, Some(CacheConfig::File(f)) if *f == folder));
        let mut chosen = CubeClRuntimeConfig::default();
        chosen.compilation.cache = Some(CacheConfig::Global);
        let (config, set) = with_kernel_cache(chosen, folder);
        assert!(!set);
        assert!(matches!(
            config.compilation.cache,
            Some(CacheConfig::Global)
        ));
    }

    #[test]
    fn only_old_build_folders_other_than_the_current_one_are_removed() {
        let root = std::env::temp_dir().join(format!("fornax-kc-old-{}", std::process::id()));
        for name in ["build-a", "build-b", "models"] {
            std::fs::create_dir_all(root.join(name)).unwrap();
        }
        let current = root.join("build-b");
        // A month from now both build folders are old; the current one and the folder
        // that is not a build stay.
        let later = SystemTime::now() + Duration::from_secs(30 * 24 * 3600);
        remove_unused_builds(&root, &current, SystemTime::now());
        assert!(root.join("build-a").is_dir(), "removed while in use");
        remove_unused_builds(&root, &current, later);
        assert!(!root.join("build-a").exists());
        assert!(current.is_dir());
        assert!(root.join("models").is_dir());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
