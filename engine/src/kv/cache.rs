//! The paged KV cache as the model uses it: the pool's bookkeeping plus the device arenas.

use std::collections::{HashMap, HashSet};

use burn_tensor::backend::Backend;

use super::{
    BatchSeq, BlockPool, BlockValues, KvCapacity, KvDims, KvError, KvStats, KvStore, Move,
    PagedBatch, SeqId, Tier, TierPolicy, BLOCK_TOKENS,
};

/// Block pool and arenas, allocated once.
#[derive(Debug)]
pub struct PagedKv<B: Backend> {
    pub pool: BlockPool,
    pub store: KvStore<B>,
    /// Attend with our kernels where the backend has them (`false`: burn reference path).
    pub kernels: bool,
    /// Sequences whose tokens written since their last settle may be taken back.
    held: HashSet<SeqId>,
    /// Token ids sequences will hold after the next commit (see [`Self::stage_tokens`]).
    staged: HashMap<SeqId, Vec<u32>>,
    /// Published blocks read from the device, waiting for [`Self::take_published`].
    published: Vec<(Vec<u32>, BlockValues)>,
}

impl<B: Backend> PagedKv<B> {
    /// A pool of `capacity` blocks for a model of `dims` on `device`.
    pub fn new(dims: KvDims, capacity: KvCapacity, policy: TierPolicy, device: &B::Device) -> Self {
        Self {
            pool: BlockPool::new(capacity, policy),
            store: KvStore::new(dims, capacity, device),
            kernels: true,
            held: HashSet::new(),
            staged: HashMap::new(),
            published: Vec::new(),
        }
    }

    /// Registers an empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        self.pool.add_sequence()
    }

    /// Frees a sequence's blocks (clearing the slots on the device for their next user).
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        self.held.remove(&seq);
        self.staged.remove(&seq);
        let freed = self.pool.free_sequence(seq)?;
        self.clear_freed(&freed);
        Ok(())
    }

    /// Frees a preempted sequence holding `tokens`; with the host tier on, its partly
    /// filled last block is read into host memory first (see [`BlockPool::swap_out_tail`]).
    pub fn preempt_sequence(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        self.pool.swap_out_tail(seq, tokens);
        self.read_outgoing();
        self.free_sequence(seq)
    }

    /// Frees a sequence that never ran (see [`BlockPool::abandon_sequence`]).
    pub fn abandon_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        let freed = self.pool.abandon_sequence(seq)?;
        self.clear_freed(&freed);
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
        // Blocks leaving the device are read for the host first, then slots taken from
        // evicted cached blocks are cleared, then blocks brought back from the host are
        // written into their (now zero) slots, before copies read them.
        self.read_outgoing();
        let evicted = self.pool.take_evicted();
        if !evicted.is_empty() {
            self.store.clear(&evicted);
        }
        self.store.write_f32_blocks(&self.pool.take_restores());
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

    /// Reads, in one read, the indexed blocks leaving the device into the host tier and
    /// the newly indexed blocks to publish (before their slots are cleared or converted).
    fn read_outgoing(&mut self) {
        let offload = self.pool.take_offload();
        let published = self.pool.take_published();
        if offload.is_empty() && published.is_empty() {
            return;
        }
        let slots: Vec<u32> = offload
            .iter()
            .map(|o| o.0)
            .chain(published.iter().map(|p| p.0))
            .collect();
        let mut values = self.store.read_f32_blocks(&slots).into_iter();
        for ((_, key), values) in offload.into_iter().zip(values.by_ref()) {
            self.pool.store_offloaded(key, values);
        }
        self.published
            .extend(published.into_iter().map(|p| p.1).zip(values));
    }

    /// Clears freed slots on the device for their next user, after reading what leaves
    /// the device from them (a slot evicted this step, taken for a block brought back and
    /// freed again, still holds the evicted block the host tier waits for).
    fn clear_freed(&mut self, freed: &[(Tier, u32)]) {
        if !freed.is_empty() {
            self.read_outgoing();
            self.store.clear(freed);
        }
    }

    /// Records the token ids `seq` will hold after the next commit, so that its full
    /// blocks are indexed then, before any of them ages (with the prefix cache on).
    pub fn stage_tokens(&mut self, seq: SeqId, tokens: Vec<u32>) {
        self.staged.insert(seq, tokens);
    }

    /// The full blocks indexed since the last call (with publishing on), read from the
    /// device: the tokens up to each block's end and its values.
    pub fn take_published(&mut self) -> Vec<(Vec<u32>, BlockValues)> {
        self.read_outgoing();
        std::mem::take(&mut self.published)
    }

    /// Converts blocks as the pool decided, after reading those leaving the prefix index
    /// for the host tier.
    fn apply_moves(&mut self, moves: &[Move]) {
        self.read_outgoing();
        if !moves.is_empty() {
            self.store.apply_moves(moves);
        }
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
        self.clear_freed(&freed);
        self.apply_moves(&moves);
        Ok(())
    }

    /// Marks `seq`'s next tokens as tentative (speculative): they may be taken back with
    /// [`Self::truncate`], and its blocks do not age until [`Self::settle`], so a block
    /// converts at the same length as without speculation.
    pub fn hold(&mut self, seq: SeqId) {
        self.held.insert(seq);
    }

    /// Takes back `seq`'s tokens from `len` on, written since it was held: blocks past the
    /// new end return to the pool and the rows they left in the last block are zeroed
    /// (the slots are then as if never written). No block is copied.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let (freed, rows) = self.pool.truncate(seq, len)?;
        self.clear_freed(&freed);
        self.store.clear_rows(rows);
        Ok(())
    }

    /// Takes back everything `seq` wrote since it was held (down to `len`, its length
    /// then) and ends the hold without ageing: the sequence is as it was.
    pub fn restore(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        self.truncate(seq, len)?;
        self.held.remove(&seq);
        Ok(())
    }

    /// Ends `seq`'s hold: its blocks age as its kept length says.
    pub fn settle(&mut self, seq: SeqId) -> Result<(), KvError> {
        self.held.remove(&seq);
        let moves = self.pool.settle(seq)?;
        self.apply_moves(&moves);
        Ok(())
    }

    /// Records that the batch's tokens were written, and converts blocks that aged (held
    /// sequences age when they settle).
    pub fn commit(&mut self, parts: &[(SeqId, usize)]) -> Result<(), KvError> {
        let mut moves = Vec::new();
        for &(seq, new) in parts {
            let staged = self.staged.remove(&seq);
            if self.held.contains(&seq) {
                self.pool.advance_tentative(seq, new)?;
            } else {
                moves.extend(self.pool.advance_indexed(seq, new, staged.as_deref())?);
            }
        }
        self.apply_moves(&moves);
        Ok(())
    }
}
