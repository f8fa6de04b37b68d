//! The paged KV cache as the model uses it: the pool's bookkeeping plus the device arenas.
//! Sliding-window layers (Gemma 3's) keep theirs in a second, FP32 pool whose sequences
//! give back every block the window has passed; the two pools hold the same sequences.

use std::collections::{HashMap, HashSet};

use burn_tensor::backend::Backend;

use super::{
    BatchSeq, BlockPool, BlockValues, KvCapacity, KvDims, KvError, KvStats, KvStore, Move,
    PagedBatch, SeqId, Tier, TierPolicy, BLOCK_TOKENS,
};
use crate::prefix::{PrefixIndex, PrefixStats};

/// The sliding pool: the windowed layers' blocks, at most a window's worth per sequence
/// between steps.
#[derive(Debug)]
struct SlidingKv<B: Backend> {
    pool: BlockPool,
    store: KvStore<B>,
    /// Keys a windowed query sees.
    keys: usize,
}

impl<B: Backend> SlidingKv<B> {
    /// Clears freed slots for their next user.
    fn clear(&mut self, freed: &[(Tier, u32)]) {
        if !freed.is_empty() {
            self.store.clear(freed);
        }
    }

    /// Gives back `seq`'s blocks that no later query of its layers can see.
    fn trim(&mut self, seq: SeqId) -> Result<(), KvError> {
        let (freed, moves) = self.pool.trim_window(seq, 0, self.keys)?;
        debug_assert!(moves.is_empty(), "the sliding pool is FP32 only");
        self.clear(&freed);
        Ok(())
    }
}

/// Block pool and arenas, allocated once.
#[derive(Debug)]
pub struct PagedKv<B: Backend> {
    /// The pool of every layer that attends to all earlier keys.
    pub pool: BlockPool,
    pub store: KvStore<B>,
    /// Windowed layers' pool, when the model has them and the capacity gives it slots.
    sliding: Option<SlidingKv<B>>,
    dims: KvDims,
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
    /// A pool of `capacity` blocks for a model of `dims` on `device`: windowed layers in a
    /// sliding pool of `capacity.sliding` blocks, or with the others when that is zero.
    pub fn new(dims: KvDims, capacity: KvCapacity, policy: TierPolicy, device: &B::Device) -> Self {
        let dims = match capacity.sliding {
            0 => KvDims {
                sliding: None,
                ..dims
            },
            _ => dims,
        };
        let sliding = dims.windowed().map(|(_, s)| {
            let slots = KvCapacity::f32_only(capacity.sliding);
            SlidingKv {
                pool: BlockPool::new(slots, TierPolicy::ALL_F32),
                store: KvStore::for_layers(dims.members(true), dims, slots, device),
                keys: s.keys,
            }
        });
        Self {
            pool: BlockPool::new(capacity, policy),
            store: KvStore::for_layers(dims.members(false), dims, capacity, device),
            sliding,
            dims,
            kernels: true,
            held: HashSet::new(),
            staged: HashMap::new(),
            published: Vec::new(),
        }
    }

    /// Whether model `layer` keeps its keys in the sliding pool.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding.is_some() && self.dims.is_sliding(layer)
    }

    /// The arenas holding model `layer`.
    pub fn store(&self, layer: usize) -> &KvStore<B> {
        match &self.sliding {
            Some(s) if self.dims.is_sliding(layer) => &s.store,
            _ => &self.store,
        }
    }

    /// [`Self::store`], to write into.
    pub fn store_mut(&mut self, layer: usize) -> &mut KvStore<B> {
        match &mut self.sliding {
            Some(s) if self.dims.is_sliding(layer) => &mut s.store,
            _ => &mut self.store,
        }
    }

    /// Bytes of every arena, both pools.
    pub fn bytes(&self) -> usize {
        self.store.bytes() + self.sliding.as_ref().map_or(0, |s| s.store.bytes())
    }

    /// The sliding pool's figures, if there is one.
    pub fn sliding_stats(&self) -> Option<KvStats> {
        self.sliding.as_ref().map(|s| s.pool.stats())
    }

    /// Shares full blocks across sequences through prefix indexes salted with `salt`
    /// (one per pool). The sliding pool's keeps ghosts of the blocks it gave back, as many
    /// as the other pool has blocks: a prefix that pool holds whole is found in it while
    /// its window is still cached.
    pub fn enable_prefix_cache(&mut self, salt: u64) {
        self.pool.enable_prefix_cache(PrefixIndex::new(salt));
        let ghosts = self.pool.capacity().total();
        if let Some(s) = &mut self.sliding {
            let index = PrefixIndex::new(salt).with_ghosts(ghosts);
            s.pool.enable_windowed_prefix_cache(index, s.keys);
        }
    }

    /// The sliding pool's prefix-cache figures, if it has one.
    pub fn sliding_prefix_stats(&self) -> Option<PrefixStats> {
        self.sliding.as_ref().and_then(|s| s.pool.prefix_stats())
    }

    /// Registers an empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        let id = self.pool.add_sequence();
        if let Some(s) = &mut self.sliding {
            s.pool.add_sequence_as(id);
        }
        id
    }

    /// A new sequence starting with the cached blocks matching `tokens` in both pools
    /// (see [`BlockPool::add_sequence_with_prefix`]): as many tokens as each pool holds
    /// the keys of. Returns it and the tokens it holds.
    pub fn add_sequence_with_prefix(&mut self, tokens: &[u32]) -> (SeqId, usize) {
        self.add_sequence_with_prefix_upto(tokens, usize::MAX)
    }

    /// [`Self::add_sequence_with_prefix`] reusing at most `cap` tokens (0: none, its own
    /// blocks still indexed for later sequences).
    pub fn add_sequence_with_prefix_upto(&mut self, tokens: &[u32], cap: usize) -> (SeqId, usize) {
        let (mut id, mut held) = self.pool.add_sequence_with_prefix_upto(tokens, cap);
        loop {
            let Some(s) = &mut self.sliding else {
                return (id, held);
            };
            let reach = s.pool.add_sequence_with_prefix_as(id, tokens, held);
            if reach >= held {
                return (id, held);
            }
            // The windowed layers hold less of it: both start again from there.
            let freed = s.pool.abandon_sequence(id).expect("just added");
            s.clear(&freed);
            let freed = self.pool.abandon_sequence(id).expect("just added");
            self.clear_freed(&freed);
            (id, held) = self.pool.add_sequence_with_prefix_upto(tokens, reach);
        }
    }

    /// Offers `seq`'s full blocks, holding `tokens`, to the prefix indexes (see
    /// [`BlockPool::index_prefix`]).
    pub fn index_prefix(&mut self, seq: SeqId, tokens: &[u32], finished: bool) {
        self.pool.index_prefix(seq, tokens, finished);
        if let Some(s) = &mut self.sliding {
            s.pool.index_prefix(seq, tokens, finished);
        }
    }

    /// Free blocks new tokens can be written to, in whichever pool has fewer.
    pub fn free_blocks(&self) -> usize {
        let main = self.pool.free_blocks(Tier::F32);
        self.sliding
            .as_ref()
            .map_or(main, |s| main.min(s.pool.free_blocks(Tier::F32)))
    }

    /// Blocks `seq` needs for `extra` more tokens, in whichever pool needs more.
    pub fn blocks_needed(&self, seq: SeqId, extra: usize) -> Result<usize, KvError> {
        let main = self.pool.blocks_needed(seq, extra)?;
        match &self.sliding {
            Some(s) => Ok(main.max(s.pool.blocks_needed(seq, extra)?)),
            None => Ok(main),
        }
    }

    /// Frees a sequence's blocks (clearing the slots on the device for their next user).
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        self.held.remove(&seq);
        self.staged.remove(&seq);
        let freed = self.pool.free_sequence(seq)?;
        self.clear_freed(&freed);
        if let Some(s) = &mut self.sliding {
            let freed = s.pool.free_sequence(seq)?;
            s.clear(&freed);
        }
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
        if let Some(s) = &mut self.sliding {
            let freed = s.pool.abandon_sequence(seq)?;
            s.clear(&freed);
        }
        Ok(())
    }

    /// Tokens cached for `seq`.
    pub fn len(&self, seq: SeqId) -> Result<usize, KvError> {
        self.pool.len(seq)
    }

    /// The main pool's figures, with the sliding pool's block counts.
    pub fn stats(&self) -> KvStats {
        let sliding = self.sliding_stats().unwrap_or_default();
        KvStats {
            sliding_used: sliding.blocks_used,
            sliding_total: sliding.blocks_total,
            ..self.pool.stats()
        }
    }

    /// Reserves room for `new` tokens of each `(sequence, new)` (all or nothing) and
    /// describes the batch for the forward pass.
    pub fn prepare(&mut self, parts: &[(SeqId, usize)]) -> Result<PagedBatch<B>, KvError> {
        let capacity = self.pool.capacity().total() * BLOCK_TOKENS;
        for &(seq, new) in parts {
            let tokens = self.pool.stored(seq)? + new;
            if tokens > capacity {
                return Err(KvError::NeverFits { tokens, capacity });
            }
        }
        check_room(&self.pool, parts)?;
        if let Some(s) = &self.sliding {
            check_room(&s.pool, parts)?;
        }
        let (seqs, rows) = describe(&mut self.pool, parts)?;
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
        let mut batch = PagedBatch::new(seqs, &rows, self.kernels, self.store.device());
        if let Some(s) = &mut self.sliding {
            let (seqs, rows) = describe(&mut s.pool, parts)?;
            let evicted = s.pool.take_evicted();
            s.clear(&evicted);
            let copies = s.pool.take_copies();
            if !copies.is_empty() {
                s.store.copy_blocks(&copies);
            }
            let windowed = PagedBatch::new(seqs, &rows, self.kernels, s.store.device());
            batch.sliding = Some(Box::new(windowed));
        }
        Ok(batch)
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
        if let Some(s) = &mut self.sliding {
            let (freed, rows) = s.pool.truncate(seq, len)?;
            s.clear(&freed);
            s.store.clear_rows(rows);
        }
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
        if let Some(s) = &mut self.sliding {
            s.trim(seq)?;
        }
        Ok(())
    }

    /// Records that the batch's tokens were written, and converts blocks that aged (held
    /// sequences age when they settle).
    pub fn commit(&mut self, parts: &[(SeqId, usize)]) -> Result<(), KvError> {
        let mut moves = Vec::new();
        for &(seq, new) in parts {
            let staged = self.staged.remove(&seq);
            let held = self.held.contains(&seq);
            if held {
                self.pool.advance_tentative(seq, new)?;
            } else {
                moves.extend(self.pool.advance_indexed(seq, new, staged.as_deref())?);
            }
            if let Some(s) = &mut self.sliding {
                if held {
                    s.pool.advance_tentative(seq, new)?;
                } else {
                    s.pool.advance_indexed(seq, new, staged.as_deref())?;
                    s.trim(seq)?;
                }
            }
        }
        self.apply_moves(&moves);
        Ok(())
    }
}

/// Whether `pool` has the free FP32 blocks every `(sequence, new)` needs together.
fn check_room(pool: &BlockPool, parts: &[(SeqId, usize)]) -> Result<(), KvError> {
    let mut needed = 0;
    for &(seq, new) in parts {
        needed += pool.blocks_needed(seq, new)?;
    }
    let free = pool.free_blocks(Tier::F32);
    if needed > free {
        return Err(KvError::OutOfBlocks {
            tier: Tier::F32,
            needed,
            free,
        });
    }
    Ok(())
}

/// Reserves room in `pool` for each `(sequence, new)` and describes them for a batch:
/// the sequences and the FP32 arena row of every new token.
fn describe(
    pool: &mut BlockPool,
    parts: &[(SeqId, usize)],
) -> Result<(Vec<BatchSeq>, Vec<u32>), KvError> {
    let mut seqs = Vec::with_capacity(parts.len());
    let mut rows = Vec::new();
    let mut row_start = 0;
    for &(seq, new) in parts {
        pool.reserve(seq, new)?;
        rows.extend(pool.write_rows(seq, new)?);
        seqs.push(BatchSeq {
            row_start,
            rows: new,
            start: pool.stored(seq)?,
            position: pool.len(seq)?,
            table: pool.table(seq)?,
        });
        row_start += new;
    }
    Ok((seqs, rows))
}
