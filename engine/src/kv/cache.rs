//! The paged KV cache as the model uses it: the pool's bookkeeping plus the device arenas.

use burn::tensor::backend::Backend;

use super::{
    BatchSeq, BlockPool, KvCapacity, KvDims, KvError, KvStats, KvStore, PagedBatch, SeqId, Tier,
    TierPolicy, BLOCK_TOKENS,
};

/// Block pool and arenas, allocated once.
#[derive(Debug)]
pub struct PagedKv<B: Backend> {
    pub pool: BlockPool,
    pub store: KvStore<B>,
    /// Attend with our kernels where the backend has them (`false`: burn reference path).
    pub kernels: bool,
}

impl<B: Backend> PagedKv<B> {
    /// A pool of `capacity` blocks for a model of `dims` on `device`.
    pub fn new(dims: KvDims, capacity: KvCapacity, policy: TierPolicy, device: &B::Device) -> Self {
        Self {
            pool: BlockPool::new(capacity, policy),
            store: KvStore::new(dims, capacity, device),
            kernels: true,
        }
    }

    /// Registers an empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        self.pool.add_sequence()
    }

    /// Frees a sequence's blocks (clearing the slots on the device for their next user).
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        let freed = self.pool.free_sequence(seq)?;
        self.store.clear(&freed);
        Ok(())
    }

    /// Frees a sequence that never ran (see [`BlockPool::abandon_sequence`]).
    pub fn abandon_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        let freed = self.pool.abandon_sequence(seq)?;
        self.store.clear(&freed);
        Ok(())
    }

    /// Tokens cached for `seq`.
    pub fn len(&self, seq: SeqId) -> Result<usize, KvError> {
        self.pool.len(seq)
    }

    /// The pool's figures.
    pub fn stats(&self) -> KvStats {
        self.pool.stats()
    }

    /// Reserves room for `new` tokens of each `(sequence, new)` (all or nothing) and
    /// describes the batch for the forward pass.
    pub fn prepare(&mut self, parts: &[(SeqId, usize)]) -> Result<PagedBatch<B>, KvError> {
        let mut needed = 0;
        let capacity = self.pool.capacity().total() * BLOCK_TOKENS;
        for &(seq, new) in parts {
            let tokens = self.pool.stored(seq)? + new;
            if tokens > capacity {
                return Err(KvError::NeverFits { tokens, capacity });
            }
            needed += self.pool.blocks_needed(seq, new)?;
        }
        let free = self.pool.free_blocks(Tier::F32);
        if needed > free {
            return Err(KvError::OutOfBlocks {
                tier: Tier::F32,
                needed,
                free,
            });
        }
        let mut seqs = Vec::with_capacity(parts.len());
        let mut rows = Vec::new();
        let mut row_start = 0;
        for &(seq, new) in parts {
            self.pool.reserve(seq, new)?;
            rows.extend(self.pool.write_rows(seq, new)?);
            seqs.push(BatchSeq {
                row_start,
                rows: new,
                start: self.pool.stored(seq)?,
                position: self.pool.len(seq)?,
                table: self.pool.table(seq)?,
            });
            row_start += new;
        }
        // Slots taken from evicted cached blocks are cleared before they are written.
        let evicted = self.pool.take_evicted();
        if !evicted.is_empty() {
            self.store.clear(&evicted);
        }
        let copies = self.pool.take_copies();
        if !copies.is_empty() {
            self.store.copy_blocks(&copies);
        }
        Ok(PagedBatch::new(
            seqs,
            &rows,
            self.kernels,
            self.store.device(),
        ))
    }

    /// Keeps `seq`'s first `sink_blocks` blocks and those holding its newest `window`
    /// tokens, freeing the blocks between (see [`BlockPool::trim_window`]).
    pub fn trim_window(
        &mut self,
        seq: SeqId,
        sink_blocks: usize,
        window: usize,
    ) -> Result<(), KvError> {
        let (freed, moves) = self.pool.trim_window(seq, sink_blocks, window)?;
        self.store.clear(&freed);
        if !moves.is_empty() {
            self.store.apply_moves(&moves);
        }
        Ok(())
    }

    /// Records that the batch's tokens were written, and converts blocks that aged.
    pub fn commit(&mut self, parts: &[(SeqId, usize)]) -> Result<(), KvError> {
        let mut moves = Vec::new();
        for &(seq, new) in parts {
            moves.extend(self.pool.advance(seq, new)?);
        }
        if !moves.is_empty() {
            self.store.apply_moves(&moves);
        }
        Ok(())
    }
}
