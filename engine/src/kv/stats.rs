//! Figures of the KV pool, read by metrics and benchmarks.

/// A snapshot of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvStats {
    pub blocks_total: usize,
    pub blocks_used: usize,
    /// Used blocks per tier (FP32, FP16, INT8).
    pub blocks_used_by_tier: [usize; 3],
    /// Slots per tier.
    pub blocks_total_by_tier: [usize; 3],
    /// Tokens held in used blocks.
    pub tokens_stored: usize,
    /// Unused token slots in partly filled blocks (internal fragmentation).
    pub waste_slots: usize,
    /// Blocks converted to a lower tier so far.
    pub conversions: u64,
    /// Conversions postponed because the lower tier was full.
    pub deferred_conversions: u64,
    /// Live sequences.
    pub sequences: usize,
    /// Cached prefix blocks that no sequence uses (evictable; counted as free).
    pub cached_blocks: usize,
    /// Blocks read by more than one sequence.
    pub shared_blocks: usize,
    /// Times an elastic window trimmed a sequence, and the tokens it dropped.
    pub window_trims: u64,
    pub window_dropped_tokens: u64,
    /// Blocks of the sliding pool (windowed layers) in use, and in all.
    pub sliding_used: usize,
    pub sliding_total: usize,
}

impl KvStats {
    /// Free blocks.
    pub fn blocks_free(&self) -> usize {
        self.blocks_total - self.blocks_used
    }

    /// Used blocks over all blocks.
    pub fn utilisation(&self) -> f64 {
        ratio(self.blocks_used, self.blocks_total)
    }

    /// Device bytes of the used blocks, each at its tier's size, both pools.
    pub fn bytes_used(&self, dims: super::KvDims) -> usize {
        super::Tier::ALL
            .iter()
            .map(|&t| self.blocks_used_by_tier[t.index()] * dims.block_bytes(t))
            .sum::<usize>()
            + self.sliding_used * dims.sliding_block_bytes()
    }

    /// Unused slots over the slots of used blocks.
    pub fn waste(&self) -> f64 {
        ratio(self.waste_slots, self.blocks_used * super::BLOCK_TOKENS)
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
