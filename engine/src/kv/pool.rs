//! The block pool: fixed slots per tier, allocated once, handed out to sequences in
//! blocks of 32 tokens, reference-counted so prefixes can be shared.

use std::collections::HashMap;

use super::{KvCapacity, KvError, KvStats, Tier, TierPolicy, BLOCK_TOKENS};

/// A sequence's handle in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// A logical block: stays the same while its data moves between tiers.
pub type BlockId = u32;

#[derive(Debug, Clone, Copy)]
struct Block {
    tier: Tier,
    slot: u32,
    refs: u32,
    /// Tokens written to it (0..=32).
    fill: u32,
}

#[derive(Debug, Clone, Default)]
struct Sequence {
    blocks: Vec<BlockId>,
    len: usize,
}

/// One block's data to be converted from one tier's slot into another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub from: (Tier, u32),
    pub to: (Tier, u32),
}

/// Host-side bookkeeping of the KV pool; the device arenas mirror its slots.
#[derive(Debug)]
pub struct BlockPool {
    policy: TierPolicy,
    capacity: KvCapacity,
    free_slots: [Vec<u32>; 3],
    blocks: Vec<Block>,
    free_ids: Vec<BlockId>,
    seqs: HashMap<SeqId, Sequence>,
    next_seq: u64,
    conversions: u64,
    deferred: u64,
}

impl BlockPool {
    /// A pool with `capacity` slots per tier, aged by `policy`.
    pub fn new(capacity: KvCapacity, policy: TierPolicy) -> Self {
        let free_slots = Tier::ALL.map(|t| (0..capacity.slots[t.index()] as u32).rev().collect());
        Self {
            policy,
            capacity,
            free_slots,
            blocks: Vec::with_capacity(capacity.total()),
            free_ids: Vec::new(),
            seqs: HashMap::new(),
            next_seq: 0,
            conversions: 0,
            deferred: 0,
        }
    }

    /// Slots per tier.
    pub fn capacity(&self) -> KvCapacity {
        self.capacity
    }

    /// Registers an empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        let id = SeqId(self.next_seq);
        self.next_seq += 1;
        self.seqs.insert(id, Sequence::default());
        id
    }

    fn seq(&self, id: SeqId) -> Result<&Sequence, KvError> {
        self.seqs.get(&id).ok_or(KvError::UnknownSequence(id))
    }

    /// Tokens stored for `id`.
    pub fn len(&self, id: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(id)?.len)
    }

    /// Blocks of `id`, oldest first.
    pub fn blocks(&self, id: SeqId) -> Result<&[BlockId], KvError> {
        Ok(&self.seq(id)?.blocks)
    }

    /// Free FP32 blocks (the tier new tokens are written to).
    pub fn free_blocks(&self, tier: Tier) -> usize {
        self.free_slots[tier.index()].len()
    }

    /// FP32 blocks `id` still needs to hold `extra` more tokens.
    pub fn blocks_needed(&self, id: SeqId, extra: usize) -> Result<usize, KvError> {
        let seq = self.seq(id)?;
        Ok((seq.len + extra)
            .div_ceil(BLOCK_TOKENS)
            .saturating_sub(seq.blocks.len()))
    }

    /// Makes room for `extra` more tokens of `id`, taking fresh FP32 blocks. All or nothing:
    /// on [`KvError::OutOfBlocks`] nothing changed.
    pub fn reserve(&mut self, id: SeqId, extra: usize) -> Result<(), KvError> {
        let needed = self.blocks_needed(id, extra)?;
        let tokens = self.seq(id)?.len + extra;
        if tokens.div_ceil(BLOCK_TOKENS) > self.capacity.total() {
            return Err(KvError::NeverFits {
                tokens,
                capacity: self.capacity.total() * BLOCK_TOKENS,
            });
        }
        let free = self.free_blocks(Tier::F32);
        if needed > free {
            return Err(KvError::OutOfBlocks {
                tier: Tier::F32,
                needed,
                free,
            });
        }
        for _ in 0..needed {
            let slot = self.free_slots[0].pop().expect("counted above");
            let block = self.new_block(Tier::F32, slot);
            self.seqs.get_mut(&id).expect("checked").blocks.push(block);
        }
        Ok(())
    }

    fn new_block(&mut self, tier: Tier, slot: u32) -> BlockId {
        let block = Block {
            tier,
            slot,
            refs: 1,
            fill: 0,
        };
        match self.free_ids.pop() {
            Some(id) => {
                self.blocks[id as usize] = block;
                id
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as BlockId
            }
        }
    }

    /// FP32 arena rows (`slot * 32 + offset`) of positions `start..start + count` of `id`,
    /// which [`reserve`](Self::reserve) made room for.
    pub fn write_rows(&self, id: SeqId, start: usize, count: usize) -> Result<Vec<u32>, KvError> {
        let seq = self.seq(id)?;
        Ok((start..start + count)
            .map(|pos| {
                let block = self.blocks[seq.blocks[pos / BLOCK_TOKENS] as usize];
                assert_eq!(block.tier, Tier::F32, "new tokens go to FP32 blocks");
                block.slot * BLOCK_TOKENS as u32 + (pos % BLOCK_TOKENS) as u32
            })
            .collect())
    }

    /// Records `count` tokens written after the current end of `id`, and converts the
    /// blocks that aged out of their tier. Returns the conversions the device must copy.
    pub fn advance(&mut self, id: SeqId, count: usize) -> Result<Vec<Move>, KvError> {
        let seq = self.seqs.get_mut(&id).ok_or(KvError::UnknownSequence(id))?;
        let len = seq.len + count;
        assert!(
            len <= seq.blocks.len() * BLOCK_TOKENS,
            "advance past reserve"
        );
        seq.len = len;
        let ids = seq.blocks.clone();
        let mut moves = Vec::new();
        for (index, &bid) in ids.iter().enumerate() {
            let block = &mut self.blocks[bid as usize];
            block.fill = (len.saturating_sub(index * BLOCK_TOKENS)).min(BLOCK_TOKENS) as u32;
            let target = self.policy.tier_for(index, len);
            // Shared blocks are read by other sequences at other ages: they keep their tier.
            if target <= block.tier || block.refs > 1 {
                continue;
            }
            let from = (block.tier, block.slot);
            // Prefer the target tier; with it full, any tier between the two.
            let dest = (block.tier.index() + 1..=target.index())
                .rev()
                .map(|t| Tier::ALL[t])
                .find(|t| !self.free_slots[t.index()].is_empty());
            let Some(tier) = dest else {
                self.deferred += 1;
                continue;
            };
            let slot = self.free_slots[tier.index()].pop().expect("checked");
            self.free_slots[from.0.index()].push(from.1);
            let block = &mut self.blocks[bid as usize];
            block.tier = tier;
            block.slot = slot;
            self.conversions += 1;
            moves.push(Move {
                from,
                to: (tier, slot),
            });
        }
        Ok(moves)
    }

    /// Block-table entries of `id` (`tier << 28 | slot`), oldest first.
    pub fn table(&self, id: SeqId) -> Result<Vec<u32>, KvError> {
        let seq = self.seq(id)?;
        Ok(seq
            .blocks
            .iter()
            .map(|&b| {
                let block = self.blocks[b as usize];
                block.tier.entry(block.slot)
            })
            .collect())
    }

    /// Adds a reference to `block` (a sharer now reads it).
    pub fn retain(&mut self, block: BlockId) {
        self.blocks[block as usize].refs += 1;
    }

    /// Drops a reference to `block`; at zero its slot returns to the free list and is
    /// returned, so the device can clear it.
    pub fn release(&mut self, block: BlockId) -> Option<(Tier, u32)> {
        let b = &mut self.blocks[block as usize];
        b.refs -= 1;
        if b.refs > 0 {
            return None;
        }
        self.free_slots[b.tier.index()].push(b.slot);
        self.free_ids.push(block);
        Some((b.tier, b.slot))
    }

    /// A new sequence that starts with the first `n_blocks` blocks of `id`, shared.
    pub fn fork(&mut self, id: SeqId, n_blocks: usize) -> Result<SeqId, KvError> {
        let shared: Vec<BlockId> = self.seq(id)?.blocks[..n_blocks].to_vec();
        let len = shared
            .iter()
            .map(|&b| self.blocks[b as usize].fill as usize)
            .sum();
        for &b in &shared {
            self.retain(b);
        }
        let new = self.add_sequence();
        self.seqs.insert(
            new,
            Sequence {
                blocks: shared,
                len,
            },
        );
        Ok(new)
    }

    /// Frees `id`, releases its blocks and returns the slots that became free.
    pub fn free_sequence(&mut self, id: SeqId) -> Result<Vec<(Tier, u32)>, KvError> {
        let seq = self.seqs.remove(&id).ok_or(KvError::UnknownSequence(id))?;
        Ok(seq
            .blocks
            .into_iter()
            .filter_map(|b| self.release(b))
            .collect())
    }

    /// Current figures.
    pub fn stats(&self) -> KvStats {
        let mut used = [0usize; 3];
        let mut tokens = 0usize;
        let mut used_blocks = 0usize;
        for b in &self.blocks {
            if b.refs > 0 {
                used[b.tier.index()] += 1;
                tokens += b.fill as usize;
                used_blocks += 1;
            }
        }
        KvStats {
            blocks_total: self.capacity.total(),
            blocks_used: used_blocks,
            blocks_used_by_tier: used,
            blocks_total_by_tier: self.capacity.slots,
            tokens_stored: tokens,
            waste_slots: used_blocks * BLOCK_TOKENS - tokens,
            conversions: self.conversions,
            deferred_conversions: self.deferred,
            sequences: self.seqs.len(),
        }
    }
}
