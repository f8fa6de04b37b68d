//! The block pool: fixed slots per tier, allocated once, handed out to sequences in
//! blocks of 32 tokens, reference-counted so prefixes can be shared. With a prefix cache,
//! full FP32 blocks are indexed by prefix; when their last reference goes they stay
//! cached (counted as free) until a new block needs their slot, least recently used first.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::{
    BlockKey, BlockValues, HostStats, HostTier, KvCapacity, KvError, KvStats, Tier, TierPolicy,
    BLOCK_TOKENS,
};
use crate::prefix::{Chain, PrefixIndex, PrefixStats};

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
    /// When it became evictable (no references, still cached).
    idle_since: u64,
}

#[derive(Debug, Clone, Default)]
struct Sequence {
    blocks: Vec<BlockId>,
    /// Tokens it has run: the position of its next token.
    len: usize,
    /// Tokens whose blocks an elastic window dropped (whole blocks after the first
    /// `sinks`).
    dropped: usize,
    sinks: usize,
    /// Leading blocks matched in or added to the prefix index, and where that walk stands
    /// (`None`: it cannot go on).
    indexed: usize,
    chain: Option<Chain>,
    /// Its prefix lookup: tokens it could have reused and tokens it did.
    lookup: (usize, usize),
}

impl Sequence {
    /// Tokens held in its blocks.
    fn stored(&self) -> usize {
        self.len - self.dropped
    }

    /// The block holding its `i`-th block of tokens (`None`: a window dropped it).
    fn block_at(&self, i: usize) -> Option<BlockId> {
        let gone = self.dropped / BLOCK_TOKENS;
        match i.checked_sub(self.sinks) {
            None => self.blocks.get(i).copied(),
            Some(j) if j < gone => None,
            Some(_) => self.blocks.get(i - gone).copied(),
        }
    }
}

/// One block's data to be converted from one tier's slot into another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub from: (Tier, u32),
    pub to: (Tier, u32),
}

/// What trimming a sequence to a window gave back: slots freed (to clear on the device)
/// and conversions now possible (to copy on the device).
pub type Trimmed = (Vec<(Tier, u32)>, Vec<Move>);

/// What taking tokens back gave back: slots freed and the arena rows of the last kept
/// block that held taken-back tokens (both to clear on the device).
pub type TakenBack = (Vec<(Tier, u32)>, Range<u32>);

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
    /// Elastic-window trims and the tokens they dropped.
    trims: u64,
    trimmed_tokens: u64,
    prefix: Option<PrefixIndex>,
    /// Keys a query sees, where every sequence keeps only its window (a sliding pool): a
    /// reused prefix then needs only the blocks holding its last `window` tokens.
    window: Option<usize>,
    /// Cached blocks without references, by the tick they became so.
    evictable: BTreeMap<u64, BlockId>,
    tick: u64,
    /// Slots of evicted blocks the device must clear before they are written.
    evicted: Vec<(Tier, u32)>,
    /// Shared blocks copied for a sequence about to write into them (copy-on-write), with
    /// the rows of each copy that hold that sequence's tokens (the rest start at zero).
    copies: Vec<(Move, usize)>,
    /// Indexed blocks that leave the device go here, when it is on.
    host: Option<HostTier>,
    /// Blocks brought back from the host: FP32 slots (free, so zero) to write.
    restores: Vec<(u32, BlockValues)>,
    /// Indexed FP32 slots leaving the device (evicted or aged): the device reads them into
    /// the host tier before they are cleared or converted.
    offload: Vec<(u32, BlockKey)>,
    /// Whether newly indexed full blocks are published (to a tier shared with other
    /// engines), and those waiting: FP32 slots and the tokens up to each block's end.
    publish: bool,
    published: Vec<(u32, Vec<u32>)>,
}

impl BlockPool {
    /// How the pool ages blocks.
    pub fn policy(&self) -> TierPolicy {
        self.policy
    }

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
            trims: 0,
            trimmed_tokens: 0,
            prefix: None,
            window: None,
            evictable: BTreeMap::new(),
            tick: 0,
            evicted: Vec::new(),
            copies: Vec::new(),
            host: None,
            restores: Vec::new(),
            offload: Vec::new(),
            publish: false,
            published: Vec::new(),
        }
    }

    /// Queues every full block newly added to the prefix index for [`Self::take_published`].
    pub fn enable_publishing(&mut self) {
        self.publish = true;
    }

    /// Full blocks indexed since the last call: FP32 slots (to read before the next step
    /// can move them) and the tokens up to each block's end; empties the list.
    pub fn take_published(&mut self) -> Vec<(u32, Vec<u32>)> {
        std::mem::take(&mut self.published)
    }

    /// Puts `blocks`, the values of the full blocks of `tokens` from block `first` on, in
    /// order (from a tier shared with other engines, verified against these tokens), into
    /// the host tier under this index's keys, so that admitting `tokens` brings them back.
    /// Returns the blocks taken (none without the host tier and the prefix cache).
    pub fn import_to_host(
        &mut self,
        tokens: &[u32],
        first: usize,
        blocks: Vec<BlockValues>,
    ) -> usize {
        let (Some(host), Some(prefix)) = (self.host.as_mut(), self.prefix.as_ref()) else {
            return 0;
        };
        let mut taken = 0;
        for ((parent, key, block), values) in prefix.block_keys(tokens).skip(first).zip(blocks) {
            let tokens = block.into();
            host.store(
                BlockKey {
                    key,
                    parent,
                    tokens,
                },
                values,
            );
            host.stats.imported += 1;
            taken += 1;
        }
        taken
    }

    /// How many leading full blocks of `tokens` (never the one holding its last token)
    /// this engine holds, on the device or in host memory: what a shared tier need not
    /// be asked for.
    pub fn held_blocks(&self, tokens: &[u32]) -> usize {
        let Some(prefix) = self.prefix.as_ref() else {
            return 0;
        };
        let limit = tokens.len().saturating_sub(1);
        let on_host = |key| {
            self.host
                .as_ref()
                .is_some_and(|h: &HostTier| h.contains(key))
        };
        prefix
            .block_keys(&tokens[..limit])
            .take_while(|&(_, key, _)| prefix.has_key(key) || on_host(key))
            .count()
    }

    /// Keeps indexed blocks that leave the device in `tier` (host memory) and brings them
    /// back when a prompt reaches them. Takes effect with the prefix cache.
    pub fn enable_host_tier(&mut self, tier: HostTier) {
        self.host = Some(tier);
    }

    /// The host tier's counters, if it is on.
    pub fn host_stats(&self) -> Option<HostStats> {
        self.host.as_ref().map(|h| h.stats)
    }

    /// Slots to write with blocks brought back from the host (before anything else this
    /// step touches the arenas); empties the list.
    pub fn take_restores(&mut self) -> Vec<(u32, BlockValues)> {
        std::mem::take(&mut self.restores)
    }

    /// FP32 slots whose blocks leave the device, to read into the host tier before they
    /// are cleared or converted; empties the list.
    pub fn take_offload(&mut self) -> Vec<(u32, BlockKey)> {
        std::mem::take(&mut self.offload)
    }

    /// Keeps a block read from the device (see [`Self::take_offload`]) in the host tier.
    pub fn store_offloaded(&mut self, key: BlockKey, values: BlockValues) {
        if let Some(host) = self.host.as_mut() {
            host.store(key, values);
        }
    }

    /// Queues `block`'s FP32 slot for the host tier if it is on and the block is a full,
    /// indexed one.
    fn offload_block(&mut self, block: BlockId) {
        if self.host.is_none() {
            return;
        }
        if let Some(key) = self.prefix.as_ref().and_then(|p| p.block_key(block)) {
            self.offload.push((self.blocks[block as usize].slot, key));
        }
    }

    /// Shares full blocks across sequences through `index`.
    pub fn enable_prefix_cache(&mut self, index: PrefixIndex) {
        self.prefix = Some(index);
    }

    /// [`Self::enable_prefix_cache`] for a pool whose sequences keep only the blocks
    /// holding their newest `window` tokens: a sequence reusing a prefix starts without
    /// the blocks before those (best with an index that keeps ghosts).
    pub fn enable_windowed_prefix_cache(&mut self, index: PrefixIndex, window: usize) {
        self.prefix = Some(index);
        self.window = Some(window);
    }

    /// The prefix cache's counters, if it is on.
    pub fn prefix_stats(&self) -> Option<PrefixStats> {
        self.prefix.as_ref().map(|p| p.stats)
    }

    /// A new sequence starting with the cached blocks that match `tokens` (never the block
    /// holding the last token, whose logits the caller needs). Returns it and the tokens
    /// it already holds.
    pub fn add_sequence_with_prefix(&mut self, tokens: &[u32]) -> (SeqId, usize) {
        self.add_sequence_with_prefix_upto(tokens, usize::MAX)
    }

    /// [`Self::add_sequence_with_prefix`] reusing at most `cap` tokens (counted in the
    /// figures as a lookup of the whole prompt).
    pub fn add_sequence_with_prefix_upto(&mut self, tokens: &[u32], cap: usize) -> (SeqId, usize) {
        let id = self.add_sequence();
        (id, self.attach_prefix(id, tokens, cap))
    }

    /// Registers sequence `id` (kept in step with another pool's) starting with at most
    /// `cap` cached tokens of `tokens`; returns the tokens it holds.
    pub fn add_sequence_with_prefix_as(&mut self, id: SeqId, tokens: &[u32], cap: usize) -> usize {
        self.add_sequence_as(id);
        self.attach_prefix(id, tokens, cap)
    }

    /// Gives the new, empty sequence `id` the cached blocks matching at most `cap` tokens of
    /// `tokens`; returns the tokens it then holds.
    fn attach_prefix(&mut self, id: SeqId, tokens: &[u32], cap: usize) -> usize {
        let Some(prefix) = self.prefix.as_mut() else {
            return 0;
        };
        let looked = tokens.len().saturating_sub(1);
        let limit = looked.min(cap);
        let mut m = prefix.lookup(tokens, limit);
        let gone = m.fit_window(self.window);
        let mut chain = m.chain();
        // A partly filled cached block is passed over when host memory holds more there.
        let partial = m
            .partial
            .filter(|&(_, n)| self.host_reach(&tokens[..limit], m.full.len(), chain) <= n);
        let attached: Vec<BlockId> = m.full[gone..]
            .iter()
            .map(|b| b.expect("fit to the window"))
            .chain(partial.map(|p| p.0))
            .collect();
        for &b in &attached {
            let block = &mut self.blocks[b as usize];
            if block.refs == 0 {
                self.evictable.remove(&block.idle_since);
            }
            block.refs += 1;
        }
        let (restored, tail) = match partial {
            None => self.restore_from_host(&tokens[..limit], m.full.len(), &mut chain),
            Some(_) => (Vec::new(), None),
        };
        let full = m.full.len() + restored.len();
        let len = full * BLOCK_TOKENS + partial.map_or(0, |p| p.1) + tail.map_or(0, |t| t.1);
        let mut blocks = attached;
        blocks.extend(restored);
        blocks.extend(tail.map(|t| t.0));
        let prefix = self.prefix.as_mut().expect("checked above");
        prefix.stats.lookups += 1;
        prefix.stats.lookup_tokens += looked as u64;
        prefix.stats.hit_tokens += len as u64;
        let seq = self.seqs.get_mut(&id).expect("just added");
        seq.lookup = (looked, len);
        seq.indexed = full;
        seq.chain = Some(chain);
        seq.blocks = blocks;
        seq.len = len;
        seq.dropped = gone * BLOCK_TOKENS;
        len
    }

    /// How many of `tokens` from block `i` on (after `chain`) the host tier would bring
    /// back as one block: a full block, or a partly filled last block, or none.
    fn host_reach(&self, tokens: &[u32], i: usize, chain: Chain) -> usize {
        let (Some(host), Some(prefix)) = (self.host.as_ref(), self.prefix.as_ref()) else {
            return 0;
        };
        let rest = &tokens[(i * BLOCK_TOKENS).min(tokens.len())..];
        if let Some(block) = rest.get(..BLOCK_TOKENS) {
            let key = prefix.key_after(chain, block);
            if host.find(key, chain.key, block) == Some(BLOCK_TOKENS) {
                return BLOCK_TOKENS;
            }
        }
        self.host_tail(rest, chain).map_or(0, |(_, held)| held)
    }

    /// The key of the partly filled block the host tier keeps after `chain`, and the
    /// tokens it holds, if they are the first of `rest`.
    fn host_tail(&self, rest: &[u32], chain: Chain) -> Option<(u64, usize)> {
        let key = self.prefix.as_ref()?.tail_key(chain);
        let rest = &rest[..rest.len().min(BLOCK_TOKENS - 1)];
        Some((key, self.host.as_ref()?.find(key, chain.key, rest)?))
    }

    /// Brings back from the host tier the full blocks of `tokens` after the first `full`,
    /// as far as they are there in order and FP32 slots last (free ones, else evicting
    /// the least recently used cached blocks); each is indexed after `chain`, which moves
    /// on. Then, where the full blocks end, a preempted sequence's partly filled last
    /// block if the host holds it (unindexed). Returns the full blocks and that block
    /// with the tokens it holds.
    fn restore_from_host(
        &mut self,
        tokens: &[u32],
        full: usize,
        chain: &mut Chain,
    ) -> (Vec<BlockId>, Option<(BlockId, usize)>) {
        let mut restored = Vec::new();
        let mut i = full;
        while (i + 1) * BLOCK_TOKENS <= tokens.len() {
            let block = &tokens[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS];
            let prefix = self.prefix.as_ref().expect("the caller checked");
            let key = prefix.key_after(*chain, block);
            let Some(host) = self.host.as_mut() else {
                break;
            };
            let Some((values, BLOCK_TOKENS)) = host.get(key, chain.key, block) else {
                break;
            };
            // The host stays in place: a block this evicts goes to it.
            let Some(slot) = self.take_f32_slot() else {
                return (restored, None);
            };
            let b = self.new_block(Tier::F32, slot);
            self.blocks[b as usize].fill = BLOCK_TOKENS as u32;
            let prefix = self.prefix.as_mut().expect("the caller checked");
            let Some(next) = prefix.insert(*chain, b, block) else {
                // Its key is taken by another prefix (a collision): the slot is left
                // unused (free, cleared with the evicted ones if it was evicted).
                self.free_slots[0].push(slot);
                self.free_ids.push(b);
                return (restored, None);
            };
            self.restores.push((slot, values));
            *chain = next;
            restored.push(b);
            i += 1;
        }
        let tail = self.restore_tail(&tokens[(i * BLOCK_TOKENS).min(tokens.len())..], *chain);
        if let Some(host) = self.host.as_mut() {
            host.stats.restored += (restored.len() + usize::from(tail.is_some())) as u64;
        }
        (restored, tail)
    }

    /// Brings back the partly filled block kept after `chain` if it holds the first of
    /// `rest` (fewer than 32 of them) and a slot is free.
    fn restore_tail(&mut self, rest: &[u32], chain: Chain) -> Option<(BlockId, usize)> {
        let (key, held) = self.host_tail(rest, chain)?;
        let slot = self.take_f32_slot()?;
        let (values, _) = self.host.as_mut()?.get(key, chain.key, &rest[..held])?;
        let b = self.new_block(Tier::F32, slot);
        self.blocks[b as usize].fill = held as u32;
        self.restores.push((slot, values));
        Some((b, held))
    }

    /// With the host tier on, queues `id`'s partly filled last block (holding the last of
    /// `tokens`, the ids it holds) to be kept there, under the tail key after its indexed
    /// full blocks: a preempted sequence then resumes from host memory.
    pub fn swap_out_tail(&mut self, id: SeqId, tokens: &[u32]) {
        let (Some(_), Some(prefix), Some(seq)) =
            (self.host.as_ref(), self.prefix.as_ref(), self.seqs.get(&id))
        else {
            return;
        };
        let full = seq.len / BLOCK_TOKENS;
        let (Some(chain), true) = (seq.chain, seq.indexed == full && seq.dropped == 0) else {
            return;
        };
        let Some(&b) = seq.blocks.get(full) else {
            return;
        };
        let block = self.blocks[b as usize];
        let tail = tokens.get(full * BLOCK_TOKENS..seq.len).unwrap_or_default();
        // Brought back and not yet written: the host still holds it.
        let pending = self.pending_restore(block.slot).is_some();
        if tail.is_empty() || block.tier != Tier::F32 || pending {
            return;
        }
        let key = BlockKey {
            key: prefix.tail_key(chain),
            parent: chain.key,
            tokens: tail.into(),
        };
        self.offload.push((block.slot, key));
    }

    /// Frees a sequence that never ran (its admission was put off) and takes its lookup
    /// back out of the prefix-cache figures, so a request counts once however often it
    /// waits.
    pub fn abandon_sequence(&mut self, id: SeqId) -> Result<Vec<(Tier, u32)>, KvError> {
        let (looked, hit) = self.seq(id)?.lookup;
        if let Some(p) = self.prefix.as_mut() {
            p.stats.lookups -= 1;
            p.stats.lookup_tokens -= looked as u64;
            p.stats.hit_tokens -= hit as u64;
        }
        self.free_sequence(id)
    }

    /// Adds `id`'s full FP32 blocks not yet indexed (ghosts of those a window dropped
    /// first), and with `finished` its partly filled last block; `tokens` are the ids it
    /// holds (at least its length).
    pub fn index_prefix(&mut self, id: SeqId, tokens: &[u32], finished: bool) {
        let Some(prefix) = self.prefix.as_mut() else {
            return;
        };
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let full = seq.len.min(tokens.len()) / BLOCK_TOKENS;
        while seq.indexed < full {
            let Some(chain) = seq.chain else { return };
            let i = seq.indexed;
            let held = &tokens[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS];
            let Some(b) = seq.block_at(i) else {
                seq.chain = prefix.insert_ghost(chain, held);
                seq.indexed += 1;
                continue;
            };
            if self.blocks[b as usize].tier != Tier::F32 {
                seq.chain = None;
                return;
            }
            let inserted = prefix.stats.inserted;
            seq.chain = prefix.insert(chain, b, held);
            seq.indexed += 1;
            if self.publish && prefix.stats.inserted > inserted {
                let slot = self.blocks[b as usize].slot;
                self.published
                    .push((slot, tokens[..(i + 1) * BLOCK_TOKENS].to_vec()));
            }
        }
        let len = seq.len.min(tokens.len());
        let tail = full * BLOCK_TOKENS..len;
        if finished && !tail.is_empty() && seq.indexed == full {
            let b = seq.block_at(full).expect("a window keeps the last block");
            if let (Some(chain), Tier::F32) = (seq.chain, self.blocks[b as usize].tier) {
                prefix.insert_partial(chain, b, &tokens[tail]);
            }
        }
    }

    /// Blocks to copy on the device (after clearing evicted slots, before writing):
    /// shared, partly filled last blocks given to the sequence about to write into them.
    pub fn take_copies(&mut self) -> Vec<(Move, usize)> {
        std::mem::take(&mut self.copies)
    }

    /// Whether `seq`'s next token goes into a block other sequences read or the prefix
    /// cache holds.
    fn writes_shared(&self, seq: &Sequence) -> bool {
        let at = seq.stored();
        if at.is_multiple_of(BLOCK_TOKENS) || at / BLOCK_TOKENS >= seq.blocks.len() {
            return false;
        }
        let b = seq.blocks[at / BLOCK_TOKENS];
        self.blocks[b as usize].refs > 1 || self.prefix.as_ref().is_some_and(|p| p.contains(b))
    }

    /// Slots of evicted blocks to clear on the device before writing; empties the list.
    pub fn take_evicted(&mut self) -> Vec<(Tier, u32)> {
        // A slot evicted twice in a step (taken for a restore, evicted again) is cleared once.
        let mut evicted = std::mem::take(&mut self.evicted);
        evicted.sort_unstable();
        evicted.dedup();
        evicted
    }

    /// A free FP32 slot, evicting the least recently used cached block when none is free.
    fn take_f32_slot(&mut self) -> Option<u32> {
        if let Some(slot) = self.free_slots[0].pop() {
            return Some(slot);
        }
        let (_, b) = self.evictable.pop_first()?;
        let slot = self.blocks[b as usize].slot;
        match self.pending_restore(slot) {
            // Brought back from the host this step and not yet written: the host still
            // has it, and nothing is to be written into the slot for it any more.
            Some(i) => {
                self.restores.swap_remove(i);
            }
            None => self.offload_block(b),
        }
        let prefix = self
            .prefix
            .as_mut()
            .expect("only cached blocks are evictable");
        prefix.remove(b);
        prefix.stats.evictions += 1;
        let block = self.blocks[b as usize];
        self.free_ids.push(b);
        self.evicted.push((block.tier, block.slot));
        Some(block.slot)
    }

    /// Where in `restores` a block brought back into FP32 `slot` waits to be written.
    fn pending_restore(&self, slot: u32) -> Option<usize> {
        self.restores.iter().position(|r| r.0 == slot)
    }

    /// Slots per tier.
    pub fn capacity(&self) -> KvCapacity {
        self.capacity
    }

    /// Registers an empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        let id = SeqId(self.next_seq);
        self.add_sequence_as(id);
        id
    }

    /// Registers an empty sequence under `id` (another pool's), which must be new here.
    pub fn add_sequence_as(&mut self, id: SeqId) {
        let fresh = self.seqs.insert(id, Sequence::default()).is_none();
        assert!(fresh, "sequence {id:?} is already in the pool");
        self.next_seq = self.next_seq.max(id.0 + 1);
    }

    fn seq(&self, id: SeqId) -> Result<&Sequence, KvError> {
        self.seqs.get(&id).ok_or(KvError::UnknownSequence(id))
    }

    /// Tokens `id` has run (the position of its next token).
    pub fn len(&self, id: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(id)?.len)
    }

    /// Tokens held in `id`'s blocks: [`len`](Self::len) less those a window dropped.
    pub fn stored(&self, id: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(id)?.stored())
    }

    /// Blocks of `id`, oldest first.
    pub fn blocks(&self, id: SeqId) -> Result<&[BlockId], KvError> {
        Ok(&self.seq(id)?.blocks)
    }

    /// Free blocks of `tier`; for FP32 (the tier new tokens are written to) this counts
    /// cached blocks without references, which are evicted when needed.
    pub fn free_blocks(&self, tier: Tier) -> usize {
        let cached = match tier {
            Tier::F32 => self.evictable.len(),
            _ => 0,
        };
        self.free_slots[tier.index()].len() + cached
    }

    /// FP32 blocks `id` still needs to hold `extra` more tokens (counting the copy of a
    /// shared, partly filled block it would write into).
    pub fn blocks_needed(&self, id: SeqId, extra: usize) -> Result<usize, KvError> {
        let seq = self.seq(id)?;
        let copy = usize::from(extra > 0 && self.writes_shared(seq));
        Ok((seq.stored() + extra)
            .div_ceil(BLOCK_TOKENS)
            .saturating_sub(seq.blocks.len())
            + copy)
    }

    /// Makes room for `extra` more tokens of `id`, taking fresh FP32 blocks. All or nothing:
    /// on [`KvError::OutOfBlocks`] nothing changed.
    pub fn reserve(&mut self, id: SeqId, extra: usize) -> Result<(), KvError> {
        let needed = self.blocks_needed(id, extra)?;
        let tokens = self.seq(id)?.stored() + extra;
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
        let mut needed = needed;
        if extra > 0 && self.writes_shared(self.seq(id)?) {
            // Copy-on-write: this sequence gets its own copy of the shared block.
            let index = self.seq(id)?.stored() / BLOCK_TOKENS;
            let shared = self.seq(id)?.blocks[index];
            let old = self.blocks[shared as usize];
            let slot = self.take_f32_slot().expect("counted above");
            let copy = self.new_block(Tier::F32, slot);
            let keep = self.seq(id)?.stored() % BLOCK_TOKENS;
            self.blocks[copy as usize].fill = keep as u32;
            self.copies.push((
                Move {
                    from: (old.tier, old.slot),
                    to: (Tier::F32, slot),
                },
                keep,
            ));
            self.seqs.get_mut(&id).expect("checked").blocks[index] = copy;
            self.release(shared);
            needed -= 1;
        }
        for _ in 0..needed {
            let slot = self.take_f32_slot().expect("counted above");
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
            idle_since: 0,
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

    /// FP32 arena rows (`slot * 32 + offset`) of `id`'s next `count` tokens, which
    /// [`reserve`](Self::reserve) made room for.
    pub fn write_rows(&self, id: SeqId, count: usize) -> Result<Vec<u32>, KvError> {
        let seq = self.seq(id)?;
        let start = seq.stored();
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
        self.advance_indexed(id, count, None)
    }

    /// [`Self::advance`], indexing `id`'s full blocks for `tokens` (the ids it holds now)
    /// before any of them ages, so a long prompt's early blocks reach the index (and the
    /// host tier, where they go when they age) instead of ageing unindexed.
    pub fn advance_indexed(
        &mut self,
        id: SeqId,
        count: usize,
        tokens: Option<&[u32]>,
    ) -> Result<Vec<Move>, KvError> {
        self.extend(id, count)?;
        if let Some(tokens) = tokens {
            self.index_prefix(id, tokens, false);
        }
        Ok(self.age(id))
    }

    /// Records `count` tokens written after the current end of `id` that may still be
    /// taken back ([`Self::truncate`]): no block ages until [`Self::settle`].
    pub fn advance_tentative(&mut self, id: SeqId, count: usize) -> Result<(), KvError> {
        self.extend(id, count)?;
        self.refill(id);
        Ok(())
    }

    /// Moves `id`'s end `count` tokens on, within the blocks reserved for it.
    fn extend(&mut self, id: SeqId, count: usize) -> Result<(), KvError> {
        let seq = self.seqs.get_mut(&id).ok_or(KvError::UnknownSequence(id))?;
        assert!(
            seq.stored() + count <= seq.blocks.len() * BLOCK_TOKENS,
            "advance past reserve"
        );
        seq.len += count;
        Ok(())
    }

    /// Takes back `id`'s tokens from `len` on (written this step, not yet indexed): blocks
    /// past the new end are released, no data is copied. Returns the slots freed and the
    /// FP32 arena rows of the last kept block that held taken-back tokens; the device
    /// clears both so they can be written again.
    pub fn truncate(&mut self, id: SeqId, len: usize) -> Result<TakenBack, KvError> {
        let seq = self.seqs.get_mut(&id).ok_or(KvError::UnknownSequence(id))?;
        assert!(
            len <= seq.len && len >= seq.dropped,
            "truncate within the stored tokens"
        );
        let (old, new) = (seq.stored(), len - seq.dropped);
        let kept = new.div_ceil(BLOCK_TOKENS);
        debug_assert!(
            seq.indexed <= new / BLOCK_TOKENS,
            "taken-back tokens were indexed"
        );
        let gone: Vec<BlockId> = seq.blocks.drain(kept.min(seq.blocks.len())..).collect();
        seq.len = len;
        let mut rows = 0..0;
        if !new.is_multiple_of(BLOCK_TOKENS) {
            let block = self.blocks[seq.blocks[kept - 1] as usize];
            assert_eq!(block.tier, Tier::F32, "tentative tokens are in FP32 blocks");
            let base = block.slot * BLOCK_TOKENS as u32;
            let end = old.min(kept * BLOCK_TOKENS);
            rows =
                base + (new % BLOCK_TOKENS) as u32..base + (end - (kept - 1) * BLOCK_TOKENS) as u32;
        }
        let freed = gone
            .into_iter()
            .rev()
            .filter_map(|b| self.release(b))
            .collect();
        self.refill(id);
        Ok((freed, rows))
    }

    /// Ages `id`'s blocks after tentative tokens were kept or taken back; returns the
    /// conversions the device must copy.
    pub fn settle(&mut self, id: SeqId) -> Result<Vec<Move>, KvError> {
        self.seq(id)?;
        Ok(self.age(id))
    }

    /// Sets the fill of `id`'s blocks from its stored tokens.
    fn refill(&mut self, id: SeqId) {
        let seq = &self.seqs[&id];
        let stored = seq.stored();
        for (index, &bid) in seq.blocks.iter().enumerate() {
            self.blocks[bid as usize].fill =
                (stored.saturating_sub(index * BLOCK_TOKENS)).min(BLOCK_TOKENS) as u32;
        }
    }

    /// Updates the fill of `id`'s blocks and converts those that aged out of their tier
    /// (as far as the lower tiers have room); returns the conversions.
    fn age(&mut self, id: SeqId) -> Vec<Move> {
        self.refill(id);
        let seq = &self.seqs[&id];
        let stored = seq.stored();
        let ids = seq.blocks.clone();
        let mut moves = Vec::new();
        for (index, &bid) in ids.iter().enumerate() {
            let block = &mut self.blocks[bid as usize];
            let target = self.policy.tier_for(index, stored);
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
            // Its contents change: it leaves the prefix index (for the host tier, if on).
            self.offload_block(bid);
            if let Some(p) = self.prefix.as_mut() {
                if p.remove(bid) {
                    p.stats.aged_out += 1;
                }
            }
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
        moves
    }

    /// Drops `id`'s whole blocks between its first `sink_blocks` and the blocks holding
    /// its newest `window` tokens (an elastic window); the sequence goes on at the same
    /// positions. Returns the slots freed (to clear on the device) and the conversions of
    /// blocks that can now move to a lower tier.
    pub fn trim_window(
        &mut self,
        id: SeqId,
        sink_blocks: usize,
        window: usize,
    ) -> Result<Trimmed, KvError> {
        let seq = self.seqs.get_mut(&id).ok_or(KvError::UnknownSequence(id))?;
        let stored = seq.stored();
        // The first block still holding one of the newest `window` tokens.
        let first_kept = stored.saturating_sub(window) / BLOCK_TOKENS;
        if first_kept <= sink_blocks {
            return Ok((Vec::new(), Vec::new()));
        }
        let gone: Vec<BlockId> = seq.blocks.drain(sink_blocks..first_kept).collect();
        seq.dropped += gone.len() * BLOCK_TOKENS;
        seq.sinks = sink_blocks;
        self.trimmed_tokens += (gone.len() * BLOCK_TOKENS) as u64;
        self.trims += 1;
        let freed = gone
            .into_iter()
            .rev()
            .filter_map(|b| self.release(b))
            .collect();
        Ok((freed, self.age(id)))
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
    /// returned, so the device can clear it, unless the block is cached: then it waits,
    /// evictable, for a sequence to match it again.
    pub fn release(&mut self, block: BlockId) -> Option<(Tier, u32)> {
        let b = &mut self.blocks[block as usize];
        b.refs -= 1;
        if b.refs > 0 {
            return None;
        }
        if self.prefix.as_ref().is_some_and(|p| p.contains(block)) {
            b.idle_since = self.tick;
            self.evictable.insert(self.tick, block);
            self.tick += 1;
            return None;
        }
        let freed = (b.tier, b.slot);
        self.free_slots[freed.0.index()].push(freed.1);
        self.free_ids.push(block);
        // A block brought back and freed before it was written: nothing is written there.
        if freed.0 == Tier::F32 {
            self.restores.retain(|r| r.0 != freed.1);
        }
        Some(freed)
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
                ..Sequence::default()
            },
        );
        Ok(new)
    }

    /// Frees `id`, releases its blocks and returns the slots that became free.
    pub fn free_sequence(&mut self, id: SeqId) -> Result<Vec<(Tier, u32)>, KvError> {
        let seq = self.seqs.remove(&id).ok_or(KvError::UnknownSequence(id))?;
        // Deepest first: cached blocks then age so that prefixes outlive their extensions.
        Ok(seq
            .blocks
            .into_iter()
            .rev()
            .filter_map(|b| self.release(b))
            .collect())
    }

    /// Current figures.
    pub fn stats(&self) -> KvStats {
        let mut used = [0usize; 3];
        let mut tokens = 0usize;
        let mut used_blocks = 0usize;
        let mut shared = 0usize;
        for b in &self.blocks {
            if b.refs > 0 {
                used[b.tier.index()] += 1;
                tokens += b.fill as usize;
                used_blocks += 1;
                shared += usize::from(b.refs > 1);
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
            cached_blocks: self.evictable.len(),
            shared_blocks: shared,
            window_trims: self.trims,
            window_dropped_tokens: self.trimmed_tokens,
            sliding_used: 0,
            sliding_total: 0,
        }
    }
}
