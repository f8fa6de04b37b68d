//! llama.cpp on the same arrivals: the workload written to a file, replayed in real time
//! by `scripts/peer/llama-replay.mjs` under node, its figures read back.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::workload::PeerWorkload;
use crate::load::{Figures, Job};

/// How to run the peer.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The driver script, in a folder where `node-llama-cpp` resolves.
    pub script: PathBuf,
    pub model: PathBuf,
    pub threads: usize,
}

/// What the driver prints.
#[derive(Debug, Deserialize)]
struct PeerRun {
    adapter: String,
    kv_bytes: f64,
    makespan_s: f64,
    busy_s: f64,
    requests: Vec<PeerResult>,
}

#[derive(Debug, Deserialize)]
struct PeerResult {
    ttft_s: Option<f64>,
    e2e_s: Option<f64>,
    tokens: usize,
    completed: bool,
}

impl Peer {
    /// Replays `workload` (the requests of `jobs`) and returns its figures and the
    /// driver's description of itself.
    pub fn replay(&self, jobs: &[Job], workload: &PeerWorkload<'_>) -> Result<(Figures, String)> {
        let file = std::env::temp_dir().join(format!("fornax-table-{}.json", std::process::id()));
        std::fs::write(&file, serde_json::to_vec(workload)?)
            .with_context(|| format!("cannot write {}", file.display()))?;
        let out = self.run(&file);
        let _ = std::fs::remove_file(&file);
        let run: PeerRun = serde_json::from_slice(&out?).context("unreadable peer output")?;
        if run.requests.len() != jobs.len() {
            bail!(
                "the peer answered {} requests of {}",
                run.requests.len(),
                jobs.len()
            );
        }
        let mut f = Figures {
            makespan: run.makespan_s,
            busy: run.busy_s,
            peak_kv_bytes: run.kv_bytes as usize,
            ..Figures::default()
        };
        for (r, job) in run.requests.iter().zip(jobs) {
            if let Some(t) = r.ttft_s {
                f.ttft.push(t);
                f.ttft_by_qos[job.qos as usize].push(t);
            }
            match (r.completed, r.e2e_s) {
                (true, Some(e2e)) => {
                    f.e2e.push(e2e);
                    f.generated += r.tokens;
                }
                _ => f.failed += 1,
            }
        }
        Ok((f, run.adapter))
    }

    fn run(&self, workload: &Path) -> Result<Vec<u8>> {
        let out = Command::new("node")
            .arg(&self.script)
            .arg(&self.model)
            .arg(self.threads.to_string())
            .arg(workload)
            .stderr(Stdio::inherit())
            .output()
            .context("cannot run node (needed for the llama.cpp peer)")?;
        if !out.status.success() {
            bail!("the llama.cpp driver failed ({})", out.status);
        }
        Ok(out.stdout)
    }
}
