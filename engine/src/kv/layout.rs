//! Sizes of the KV pool: bytes per block in each tier and how a memory budget is split.

use super::{Tier, TierPolicy, BLOCK_TOKENS};

/// The model dimensions the KV cache stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvDims {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvDims {
    /// Device bytes of one block of `tier`: keys and values of 32 tokens for every layer
    /// and kv head, plus the per-(block, head) scales of the scaled tiers.
    pub fn block_bytes(&self, tier: Tier) -> usize {
        let words = BLOCK_TOKENS * self.n_kv_heads * tier.words(self.head_dim);
        let scales = if tier.scaled() { self.n_kv_heads } else { 0 };
        2 * self.n_layers * (words + scales) * 4
    }
}

/// Slots per tier of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCapacity {
    /// Blocks per tier, indexed by [`Tier::index`].
    pub slots: [usize; 3],
}

impl KvCapacity {
    /// Every block in FP32.
    pub fn f32_only(blocks: usize) -> Self {
        Self {
            slots: [blocks, 0, 0],
        }
    }

    /// Splits `bytes` between the tiers for `policy` so that `max_seqs` sequences can
    /// each keep their recent window plus one prefill chunk of `chunk` tokens in FP32 (new
    /// tokens are written FP32): the FP32 tier gets that (at most half the budget); with
    /// INT8 enabled, the FP16 tier gets the same for the FP16 window (at most half the
    /// rest); what remains goes to the oldest tier.
    pub fn from_budget(
        bytes: usize,
        dims: KvDims,
        policy: TierPolicy,
        max_seqs: usize,
        chunk: usize,
    ) -> Self {
        let b32 = dims.block_bytes(Tier::F32);
        let Some(recent) = policy.recent else {
            return Self::f32_only(bytes / b32);
        };
        let window_blocks = |tokens: usize| max_seqs * (tokens.div_ceil(BLOCK_TOKENS) + 1);
        let f32_blocks = window_blocks(recent + chunk).min(bytes / 2 / b32).max(1);
        let rest = bytes.saturating_sub(f32_blocks * b32);
        let b16 = dims.block_bytes(Tier::F16);
        match policy.int8_after {
            None => Self {
                slots: [f32_blocks, rest / b16, 0],
            },
            Some(after) => {
                let f16_blocks = window_blocks(after.saturating_sub(recent)).min(rest / 2 / b16);
                let b8 = dims.block_bytes(Tier::I8);
                Self {
                    slots: [f32_blocks, f16_blocks, (rest - f16_blocks * b16) / b8],
                }
            }
        }
    }

    /// Blocks in all tiers.
    pub fn total(&self) -> usize {
        self.slots.iter().sum()
    }

    /// Device bytes of the pool.
    pub fn bytes(&self, dims: KvDims) -> usize {
        Tier::ALL
            .iter()
            .map(|&t| self.slots[t.index()] * dims.block_bytes(t))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOL: KvDims = KvDims {
        n_layers: 30,
        n_kv_heads: 3,
        head_dim: 64,
    };

    #[test]
    fn block_sizes_follow_the_tier() {
        assert_eq!(SMOL.block_bytes(Tier::F32), 2 * 30 * 32 * 3 * 64 * 4);
        assert_eq!(SMOL.block_bytes(Tier::F16), 2 * 30 * (32 * 3 * 32 + 3) * 4);
        assert_eq!(SMOL.block_bytes(Tier::I8), 2 * 30 * (32 * 3 * 16 + 3) * 4);
    }

    #[test]
    fn budget_split_stays_within_the_budget() {
        let budget = 256 << 20;
        for policy in [
            TierPolicy::ALL_F32,
            TierPolicy::DEFAULT,
            TierPolicy {
                recent: Some(128),
                int8_after: Some(512),
            },
        ] {
            let cap = KvCapacity::from_budget(budget, SMOL, policy, 8, 32);
            assert!(cap.bytes(SMOL) <= budget, "{policy:?}");
            assert!(cap.bytes(SMOL) > budget * 9 / 10, "{policy:?} {cap:?}");
            assert!(cap.slots[0] >= 1);
        }
        let cap = KvCapacity::from_budget(budget, SMOL, TierPolicy::DEFAULT, 8, 32);
        assert_eq!(cap.slots[0], 8 * 6);
    }
}
