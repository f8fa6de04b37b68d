//! What the scheduler needs from the KV cache: block counts, sequences to add and free.

use burn_tensor::backend::Backend;

use crate::kv::{BlockPool, PagedKv, SeqId, Tier, BLOCK_TOKENS};

/// The KV block accounting the scheduler plans against.
pub trait KvBlocks {
    /// Free blocks new tokens can be written to (FP32).
    fn free_blocks(&self) -> usize;
    /// Blocks `seq` needs to hold `extra` more tokens.
    fn blocks_needed(&self, seq: SeqId, extra: usize) -> usize;
    /// Tokens the whole pool can hold.
    fn capacity_tokens(&self) -> usize;
    /// Registers an empty sequence.
    fn add_sequence(&mut self) -> SeqId;
    /// Registers a sequence that starts with the cached blocks matching at most `cap` of
    /// `tokens` (with the prefix cache on); returns it and the tokens it already holds.
    fn add_sequence_with_prefix(&mut self, tokens: &[u32], cap: usize) -> (SeqId, usize);
    /// Frees a sequence from [`Self::add_sequence_with_prefix`] that never ran.
    fn abandon_sequence(&mut self, seq: SeqId);
    /// Offers `seq`'s full blocks, holding `tokens`, to the prefix cache (and with
    /// `finished` its partly filled last block).
    fn index_prefix(&mut self, seq: SeqId, tokens: &[u32], finished: bool);
    /// Frees a sequence and its blocks.
    fn free_sequence(&mut self, seq: SeqId);
    /// Frees a preempted sequence holding `tokens`, keeping its partly filled last block
    /// in host memory when that tier is on (its full blocks stay cached).
    fn preempt_sequence(&mut self, seq: SeqId, tokens: &[u32]);
    /// Drops `seq`'s blocks between its first `sink_blocks` and those holding its newest
    /// `window` tokens (the elastic window).
    fn trim_window(&mut self, seq: SeqId, sink_blocks: usize, window: usize);
}

impl KvBlocks for BlockPool {
    fn free_blocks(&self) -> usize {
        BlockPool::free_blocks(self, Tier::F32)
    }

    fn blocks_needed(&self, seq: SeqId, extra: usize) -> usize {
        BlockPool::blocks_needed(self, seq, extra).unwrap_or(extra.div_ceil(BLOCK_TOKENS))
    }

    fn capacity_tokens(&self) -> usize {
        self.capacity().total() * BLOCK_TOKENS
    }

    fn add_sequence(&mut self) -> SeqId {
        BlockPool::add_sequence(self)
    }

    fn add_sequence_with_prefix(&mut self, tokens: &[u32], cap: usize) -> (SeqId, usize) {
        BlockPool::add_sequence_with_prefix_upto(self, tokens, cap)
    }

    fn index_prefix(&mut self, seq: SeqId, tokens: &[u32], finished: bool) {
        BlockPool::index_prefix(self, seq, tokens, finished)
    }

    fn abandon_sequence(&mut self, seq: SeqId) {
        let _ = BlockPool::abandon_sequence(self, seq);
    }

    fn free_sequence(&mut self, seq: SeqId) {
        // Freeing an unknown sequence has nothing to free.
        let _ = BlockPool::free_sequence(self, seq);
    }

    fn preempt_sequence(&mut self, seq: SeqId, tokens: &[u32]) {
        self.swap_out_tail(seq, tokens);
        KvBlocks::free_sequence(self, seq);
    }

    fn trim_window(&mut self, seq: SeqId, sink_blocks: usize, window: usize) {
        // Without a device, conversions are bookkeeping only.
        let _ = BlockPool::trim_window(self, seq, sink_blocks, window);
    }
}

/// With a sliding pool, the scheduler plans in the scarcer pool's blocks: free blocks are
/// the fewer of the two, and a sequence needs the more of the two, so a plan that fits
/// these counts fits both pools.
impl<B: Backend> KvBlocks for PagedKv<B> {
    fn free_blocks(&self) -> usize {
        PagedKv::free_blocks(self)
    }

    fn blocks_needed(&self, seq: SeqId, extra: usize) -> usize {
        PagedKv::blocks_needed(self, seq, extra).unwrap_or(extra.div_ceil(BLOCK_TOKENS))
    }

    fn capacity_tokens(&self) -> usize {
        self.pool.capacity_tokens()
    }

    fn add_sequence(&mut self) -> SeqId {
        PagedKv::add_sequence(self)
    }

    fn add_sequence_with_prefix(&mut self, tokens: &[u32], cap: usize) -> (SeqId, usize) {
        PagedKv::add_sequence_with_prefix_upto(self, tokens, cap)
    }

    fn index_prefix(&mut self, seq: SeqId, tokens: &[u32], finished: bool) {
        PagedKv::index_prefix(self, seq, tokens, finished)
    }

    fn abandon_sequence(&mut self, seq: SeqId) {
        let _ = PagedKv::abandon_sequence(self, seq);
    }

    fn free_sequence(&mut self, seq: SeqId) {
        let _ = PagedKv::free_sequence(self, seq);
    }

    fn preempt_sequence(&mut self, seq: SeqId, tokens: &[u32]) {
        let _ = PagedKv::preempt_sequence(self, seq, tokens);
    }

    fn trim_window(&mut self, seq: SeqId, sink_blocks: usize, window: usize) {
        let _ = PagedKv::trim_window(self, seq, sink_blocks, window);
    }
}
