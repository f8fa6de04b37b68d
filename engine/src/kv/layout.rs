//! Sizes of the KV pool: bytes per block in each tier and how a memory budget is split.

use super::{Tier, TierPolicy, BLOCK_TOKENS};

/// The model dimensions the KV cache stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvDims {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Layers whose attention sees only the newest keys (`None`: every layer sees all).
    pub sliding: Option<Sliding>,
}

/// Sliding-window layers: their keys and values live in a pool of their own that gives
/// blocks back once the window has passed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sliding {
    /// Keys a query sees, itself included.
    pub keys: usize,
    /// Bit `i` set: layer `i` is windowed.
    pub layers: u128,
}

impl Sliding {
    /// The windowed layers of a model whose layer `i` sees `windows[i]` keys (`None`:
    /// all); the pool keeps the largest window. `None` without windowed layers or past
    /// 128 layers (then every layer stays in the main pool, which is as exact).
    pub fn of_layers(windows: &[Option<usize>]) -> Option<Self> {
        if windows.len() > 128 {
            return None;
        }
        let keys = windows.iter().flatten().copied().max()?;
        let layers = windows
            .iter()
            .enumerate()
            .filter(|(_, w)| w.is_some())
            .fold(0u128, |mask, (i, _)| mask | 1 << i);
        Some(Self { keys, layers })
    }

    /// Blocks one sequence keeps between steps: those holding its newest `keys` tokens.
    pub fn kept_blocks(&self) -> usize {
        (self.keys + BLOCK_TOKENS - 1).div_ceil(BLOCK_TOKENS)
    }
}

impl KvDims {
    /// Dimensions with every layer in the one pool.
    pub const fn dense(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        Self {
            n_layers,
            n_kv_heads,
            head_dim,
            sliding: None,
        }
    }

    /// Whether `layer` keeps its keys in the sliding pool.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding
            .is_some_and(|s| layer < 128 && s.layers >> layer & 1 == 1)
    }

    /// The layers of the main pool (`sliding == false`) or of the sliding pool, in order.
    pub fn members(&self, sliding: bool) -> Vec<usize> {
        (0..self.n_layers)
            .filter(|&l| self.is_sliding(l) == sliding)
            .collect()
    }

    /// The main pool's dimensions: its layers only.
    pub fn main(&self) -> KvDims {
        Self::dense(self.members(false).len(), self.n_kv_heads, self.head_dim)
    }

    /// The sliding pool's dimensions and window, if the model has windowed layers.
    pub fn windowed(&self) -> Option<(KvDims, Sliding)> {
        let s = self.sliding?;
        let dims = Self::dense(self.members(true).len(), self.n_kv_heads, self.head_dim);
        Some((dims, s))
    }

    /// Device bytes of one block of `tier` in the main pool: keys and values of 32 tokens
    /// for each of its layers and kv heads, plus the per-(block, head) scales of the
    /// scaled tiers.
    pub fn block_bytes(&self, tier: Tier) -> usize {
        let words = BLOCK_TOKENS * self.n_kv_heads * tier.words(self.head_dim);
        let scales = if tier.scaled() { self.n_kv_heads } else { 0 };
        2 * self.main().n_layers * (words + scales) * 4
    }

    /// Device bytes of one (FP32) block of the sliding pool; 0 without one.
    pub fn sliding_block_bytes(&self) -> usize {
        self.windowed().map_or(0, |(d, _)| d.block_bytes(Tier::F32))
    }
}

/// Sliding-pool blocks for `max_seqs` sequences that each keep their window and together
/// write `chunk` new tokens a step (0 without windowed layers in `dims`).
fn sliding_blocks(dims: KvDims, max_seqs: usize, chunk: usize) -> usize {
    dims.windowed().map_or(0, |(_, s)| {
        max_seqs * (s.kept_blocks() + 1) + chunk.div_ceil(BLOCK_TOKENS)
    })
}

/// Slots per tier of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCapacity {
    /// Blocks per tier of the main pool, indexed by [`Tier::index`].
    pub slots: [usize; 3],
    /// FP32 blocks of the sliding pool (windowed layers; 0 without them).
    pub sliding: usize,
}

impl KvCapacity {
    /// Main-pool blocks per tier, no sliding pool.
    pub const fn tiers(slots: [usize; 3]) -> Self {
        Self { slots, sliding: 0 }
    }

    /// Every block in FP32.
    pub fn f32_only(blocks: usize) -> Self {
        Self::tiers([blocks, 0, 0])
    }

    /// `self` with a sliding pool sized for `max_seqs` sequences that each keep their
    /// window and together write `chunk` new tokens a step (nothing without windowed
    /// layers in `dims`).
    pub fn with_sliding(self, dims: KvDims, max_seqs: usize, chunk: usize) -> Self {
        Self {
            sliding: sliding_blocks(dims, max_seqs, chunk),
            ..self
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
        // The sliding pool first, at most the share its layers would take without it.
        let sliding = sliding_blocks(dims, max_seqs, chunk);
        let share = bytes / dims.n_layers.max(1) * dims.members(true).len();
        let sliding = sliding.min(share / dims.sliding_block_bytes().max(1));
        let bytes = bytes - sliding * dims.sliding_block_bytes();
        Self {
            sliding,
            ..Self::main_from_budget(bytes, dims, policy, max_seqs, chunk)
        }
    }

    /// The main pool's tiers from `bytes`, as [`Self::from_budget`] splits them.
    fn main_from_budget(
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
            None => Self::tiers([f32_blocks, rest / b16, 0]),
            Some(after) => {
                let f16_blocks = window_blocks(after.saturating_sub(recent)).min(rest / 2 / b16);
                let b8 = dims.block_bytes(Tier::I8);
                Self::tiers([f32_blocks, f16_blocks, (rest - f16_blocks * b16) / b8])
            }
        }
    }

    /// Blocks in all tiers of the main pool.
    pub fn total(&self) -> usize {
        self.slots.iter().sum()
    }

    /// Device bytes of both pools.
    pub fn bytes(&self, dims: KvDims) -> usize {
        let main: usize = Tier::ALL
            .iter()
            .map(|&t| self.slots[t.index()] * dims.block_bytes(t))
            .sum();
        main + self.sliding * dims.sliding_block_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOL: KvDims = KvDims::dense(30, 3, 64);

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

#[cfg(test)]
mod sliding_tests {
    use super::*;

    /// Gemma 3 270M: 18 layers, five of every six windowed over 512 keys.
    const GEMMA: KvDims = KvDims {
        n_layers: 18,
        n_kv_heads: 1,
        head_dim: 256,
        sliding: Some(Sliding {
            keys: 512,
            layers: 0b011111_011111_011111,
        }),
    };

    #[test]
    fn sliding_layers_split_the_pools() {
        assert_eq!(GEMMA.members(false), vec![5, 11, 17]);
        assert_eq!(GEMMA.members(true).len(), 15);
        assert_eq!(GEMMA.block_bytes(Tier::F32), 2 * 3 * 32 * 256 * 4);
        assert_eq!(GEMMA.sliding_block_bytes(), 2 * 15 * 32 * 256 * 4);
        assert_eq!(GEMMA.windowed().unwrap().1.kept_blocks(), 17);
    }

    #[test]
    fn the_sliding_pool_comes_out_of_the_budget() {
        let budget = 256 << 20;
        let cap = KvCapacity::from_budget(budget, GEMMA, TierPolicy::DEFAULT, 4, 512);
        assert_eq!(cap.sliding, 4 * 18 + 16);
        assert!(cap.bytes(GEMMA) <= budget);
        assert!(cap.bytes(GEMMA) > budget * 9 / 10, "{cap:?}");
        // Never more than the windowed layers' share of the budget.
        let cap = KvCapacity::from_budget(budget, GEMMA, TierPolicy::DEFAULT, 1000, 512);
        assert!(cap.sliding * GEMMA.sliding_block_bytes() <= budget / 18 * 15);
    }
}
