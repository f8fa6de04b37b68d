//! Flags of the paged KV cache shared by the commands that run the model.

use anyhow::{bail, Result};
use clap::Args;
use fornax_engine::kv::{KvCapacity, KvDims, TierPolicy, BLOCK_TOKENS};

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
}

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
