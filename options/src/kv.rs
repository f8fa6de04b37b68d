//! Flags of the paged KV cache shared by the commands that run the model.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use fornax_engine::kv::remote::{fingerprint, RemoteTier};
use fornax_engine::kv::{HostTier, KvCapacity, KvDims, PagedKv, Tier, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::Model;
use fornax_engine::EngineBackend;

/// KV cache settings.
#[derive(Args, Debug, Clone)]
pub struct KvArgs {
    /// KV cache budget in MiB, allocated once at start-up.
    #[arg(long, default_value_t = 256)]
    pub kv_memory: usize,
    /// Newest tokens kept in FP32 (older blocks are converted to FP16), or `all`.
    #[arg(long, default_value = "128", value_parser = parse_recent)]
    pub kv_recent: Recent,
    /// Blocks whose tokens are all older than this many are converted to INT8.
    #[arg(long)]
    pub kv_int8_after: Option<usize>,
    /// Use the foundation's contiguous per-sequence cache instead of the paged pool.
    #[arg(long)]
    pub contiguous_kv: bool,
    /// Host memory in MiB for prefix-cache blocks that leave the device (evicted, aged,
    /// or of preempted requests), brought back instead of recomputed; 0: off. For `serve`
    /// and the load benchmarks; needs the prefix cache.
    #[arg(long, default_value_t = 0)]
    pub kv_host_memory: usize,
    /// A Redis shared by replicas (`redis://HOST:PORT[/DB]`): full prefix blocks are
    /// written there and prompts this server does not hold are looked up there (through
    /// the host tier, 256 MiB unless --kv-host-memory says). For `serve`.
    #[arg(long, value_name = "URL")]
    pub kv_remote: Option<String>,
    /// How long a call to the shared tier may take before it counts as a miss.
    #[arg(long, default_value_t = 500)]
    pub kv_remote_timeout_ms: u64,
}

/// Host memory of the host tier when only the shared tier is asked for, in MiB.
const REMOTE_HOST_MEMORY: usize = 256;

/// `--kv-recent`: a token count or everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recent(pub Option<usize>);

fn parse_recent(s: &str) -> Result<Recent> {
    if s == "all" {
        return Ok(Recent(None));
    }
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(Recent(Some(n))),
        _ => bail!("expected a positive token count or `all`"),
    }
}

impl KvArgs {
    /// The ageing rule the flags describe.
    pub fn policy(&self) -> TierPolicy {
        TierPolicy {
            recent: self.kv_recent.0,
            int8_after: self.kv_int8_after,
        }
    }

    /// The paged pool for `model` with `capacity` slots, with the host tier when asked
    /// for; refused when the tier is asked for without the prefix cache it extends.
    pub fn paged<B: EngineBackend>(
        &self,
        model: &Model<B>,
        capacity: KvCapacity,
        prefix_cache: bool,
    ) -> Result<PagedKv<B>> {
        let mut kv = model.new_paged_cache(capacity, self.policy());
        let host = match (self.kv_host_memory, &self.kv_remote) {
            (0, Some(_)) => REMOTE_HOST_MEMORY,
            (mib, _) => mib,
        };
        if host > 0 {
            if !prefix_cache {
                bail!("--kv-host-memory and --kv-remote keep prefix-cache blocks: they need the prefix cache (drop --no-prefix-cache)");
            }
            let block_bytes = model.kv_dims().block_bytes(Tier::F32);
            kv.pool
                .enable_host_tier(HostTier::new(host << 20, block_bytes));
        }
        Ok(kv)
    }

    /// The shared tier of `--kv-remote` for the model file at `path`, if asked for.
    pub fn remote(&self, path: &Path, dims: KvDims) -> Result<Option<Arc<RemoteTier>>> {
        let Some(url) = &self.kv_remote else {
            return Ok(None);
        };
        let timeout = Duration::from_millis(self.kv_remote_timeout_ms.max(1));
        let tier = RemoteTier::open(url, fingerprint(path, dims)?, dims, timeout)?;
        Ok(Some(tier))
    }

    /// Pool slots from the budget, for `max_seqs` sequences prefilled `chunk` tokens at a
    /// time. A budget whose FP32 tier cannot hold one sequence's newest tokens plus a
    /// block is refused: blocks would never age out of it, and nothing could run.
    pub fn capacity(&self, dims: KvDims, max_seqs: usize, chunk: usize) -> Result<KvCapacity> {
        let cap =
            KvCapacity::from_budget(self.kv_memory << 20, dims, self.policy(), max_seqs, chunk);
        let recent = self.kv_recent.0.unwrap_or(0);
        let needed = recent.div_ceil(BLOCK_TOKENS) + 1;
        if cap.slots[0] < needed {
            let what = match recent {
                0 => "one block".to_string(),
                r => format!("the newest {r} tokens, kept in FP32, plus one block"),
            };
            bail!(
                "KV cache too small: --kv-memory {} MiB leaves {} FP32 blocks and at least {needed} are needed ({what}): raise --kv-memory or lower --kv-recent",
                self.kv_memory,
                cap.slots[0]
            );
        }
        Ok(cap)
    }
}
