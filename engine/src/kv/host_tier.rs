//! The host-memory tier of the prefix cache: full blocks that leave the device (evicted
//! from the prefix cache, or aged into a lower tier) are kept in host RAM under their
//! chained prefix key, least recently used dropped first, and brought back into a free
//! FP32 slot when a prompt's walk down the index reaches them, instead of recomputed.
//!
//! A preempted sequence's partly filled last block is kept too, under a key of its own
//! after its full blocks ([`crate::prefix::PrefixIndex::tail_key`]): it comes back as the
//! sequence's last block, unindexed, so a preemption recomputes nothing the tier holds.
//!
//! Blocks are kept as the FP32 values the device held (only FP32 blocks are indexed), so
//! a block brought back is bit-identical and outputs equal those without the tier.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::BLOCK_TOKENS;

/// Keys and values of one block for every layer, `[layer][k or v][token][n_kv * head_dim]`
/// flattened, as the device held them.
pub type BlockValues = Arc<[f32]>;

/// Where a block sits in the prefix chain and what it holds: enough to verify a hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockKey {
    /// Its chained key (the parent's key and its tokens, hashed).
    pub key: u64,
    /// The key of the block before it (the salted root for the first block).
    pub parent: u64,
    /// Its token ids: 32, or fewer for a sequence's partly filled last block.
    pub tokens: Box<[u32]>,
}

/// Counters of the host tier, read by metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Blocks copied from the device into host memory.
    pub stored: u64,
    /// Blocks brought back to the device instead of recomputed.
    pub restored: u64,
    /// Blocks dropped from host memory to make room.
    pub dropped: u64,
    /// Blocks put here from a tier shared with other engines.
    pub imported: u64,
    /// Blocks and bytes held now.
    pub blocks: usize,
    pub bytes: usize,
}

#[derive(Debug)]
struct Entry {
    parent: u64,
    tokens: Box<[u32]>,
    values: BlockValues,
    /// Its place in the recency order.
    tick: u64,
}

/// Full blocks in host memory by chained key, within a byte budget.
#[derive(Debug)]
pub struct HostTier {
    budget: usize,
    block_bytes: usize,
    entries: HashMap<u64, Entry>,
    /// Keys by the tick they were last stored or used.
    recency: BTreeMap<u64, u64>,
    tick: u64,
    pub stats: HostStats,
}

impl HostTier {
    /// A tier of at most `budget` bytes for blocks of `block_bytes` each.
    pub fn new(budget: usize, block_bytes: usize) -> Self {
        Self {
            budget,
            block_bytes,
            entries: HashMap::new(),
            recency: BTreeMap::new(),
            tick: 0,
            stats: HostStats::default(),
        }
    }

    /// How many blocks fit.
    pub fn capacity_blocks(&self) -> usize {
        self.budget / self.block_bytes.max(1)
    }

    /// Keeps `values` under `key`, dropping the least recently used blocks while the
    /// budget is exceeded. A tier too small for one block keeps nothing.
    pub fn store(&mut self, key: BlockKey, values: BlockValues) {
        debug_assert!((1..=BLOCK_TOKENS).contains(&key.tokens.len()));
        if self.capacity_blocks() == 0 {
            return;
        }
        if let Some(old) = self.entries.remove(&key.key) {
            self.recency.remove(&old.tick);
        }
        while self.entries.len() >= self.capacity_blocks() {
            let Some((_, victim)) = self.recency.pop_first() else {
                break;
            };
            self.entries.remove(&victim);
            self.stats.dropped += 1;
        }
        self.tick += 1;
        self.recency.insert(self.tick, key.key);
        self.entries.insert(
            key.key,
            Entry {
                parent: key.parent,
                tokens: key.tokens,
                values,
                tick: self.tick,
            },
        );
        self.stats.stored += 1;
        self.update_size();
    }

    /// The block under `key` if it verifies: the same parent key, and its tokens the
    /// first of `tokens` (all 32 of a full block; a sequence's partly filled last block
    /// holds fewer). A hash collision is a miss, never a wrong block. Returns the values
    /// and the tokens they hold; a hit becomes the most recent.
    pub fn get(&mut self, key: u64, parent: u64, tokens: &[u32]) -> Option<(BlockValues, usize)> {
        let held = self.find(key, parent, tokens)?;
        let entry = self.entries.get_mut(&key).expect("found");
        self.recency.remove(&entry.tick);
        self.tick += 1;
        entry.tick = self.tick;
        self.recency.insert(self.tick, key);
        Some((entry.values.clone(), held))
    }

    /// How many of `tokens` the block under `key` holds if it verifies (see [`Self::get`]),
    /// without touching its recency.
    pub fn find(&self, key: u64, parent: u64, tokens: &[u32]) -> Option<usize> {
        let entry = self.entries.get(&key)?;
        (entry.parent == parent && !entry.tokens.is_empty() && tokens.starts_with(&entry.tokens))
            .then_some(entry.tokens.len())
    }

    /// Whether a block is kept under `key` (unverified: for deciding whether to look
    /// further).
    pub fn contains(&self, key: u64) -> bool {
        self.entries.contains_key(&key)
    }

    fn update_size(&mut self) {
        self.stats.blocks = self.entries.len();
        self.stats.bytes = self.entries.len() * self.block_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: u64, parent: u64, first: u32) -> BlockKey {
        BlockKey {
            key: k,
            parent,
            tokens: (first..first + BLOCK_TOKENS as u32).collect(),
        }
    }

    fn values(v: f32) -> BlockValues {
        vec![v; 4].into()
    }

    #[test]
    fn a_hit_must_match_parent_and_tokens() {
        let mut t = HostTier::new(1 << 20, 16);
        t.store(key(7, 1, 100), values(1.0));
        let tokens: Vec<u32> = (100..132).collect();
        let (values, held) = t.get(7, 1, &tokens).unwrap();
        assert_eq!((&values[..], held), (&[1.0; 4][..], BLOCK_TOKENS));
        // Another parent or other tokens under the same key: a miss.
        assert!(t.get(7, 2, &tokens).is_none());
        let other: Vec<u32> = (101..133).collect();
        assert!(t.get(7, 1, &other).is_none());
        assert!(t.get(8, 1, &tokens).is_none());
    }

    #[test]
    fn a_partly_filled_block_matches_tokens_that_start_with_its_own() {
        let mut t = HostTier::new(1 << 20, 16);
        let tail: Box<[u32]> = (100..110).collect();
        t.store(
            BlockKey {
                key: 9,
                parent: 4,
                tokens: tail.clone(),
            },
            values(2.0),
        );
        // The sequence resumes with the same ten tokens, or with more after them.
        assert_eq!(t.find(9, 4, &tail), Some(10));
        let longer: Vec<u32> = (100..120).collect();
        assert_eq!(t.get(9, 4, &longer).map(|(_, n)| n), Some(10));
        // Fewer tokens than it holds, other tokens, or another parent: a miss.
        assert_eq!(t.find(9, 4, &tail[..9]), None);
        let other: Vec<u32> = (101..120).collect();
        assert_eq!(t.find(9, 4, &other), None);
        assert_eq!(t.find(9, 5, &tail), None);
    }

    #[test]
    fn the_least_recently_used_block_is_dropped_first() {
        // Room for two blocks.
        let mut t = HostTier::new(32, 16);
        t.store(key(1, 0, 0), values(1.0));
        t.store(key(2, 1, 32), values(2.0));
        // Using block 1 makes block 2 the oldest.
        let first: Vec<u32> = (0..32).collect();
        assert!(t.get(1, 0, &first).is_some());
        t.store(key(3, 2, 64), values(3.0));
        assert_eq!(t.stats.dropped, 1);
        assert_eq!(t.stats.blocks, 2);
        assert_eq!(t.stats.bytes, 32);
        assert!(t.get(1, 0, &first).is_some());
        let second: Vec<u32> = (32..64).collect();
        assert!(t.get(2, 1, &second).is_none());
    }

    #[test]
    fn a_tier_smaller_than_a_block_keeps_nothing() {
        let mut t = HostTier::new(15, 16);
        t.store(key(1, 0, 0), values(1.0));
        assert_eq!(t.stats, HostStats::default());
    }
}
