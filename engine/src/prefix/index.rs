//! The global index of full KV blocks by token prefix. A block's key chains the key of the
//! block before it with its own 32 token ids and a salt (model and precision), so equal
//! keys mean equal prefixes up to hash collisions. Every hit is verified: the entry's
//! tokens must equal the request's and its parent must be the entry matched just before
//! (node ids are never reused), so a collision can only cost a miss, never wrong output.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::kv::{BlockId, BLOCK_TOKENS};

/// Hashes a block: the parent's key and the block's token ids (and the salt, in the parent
/// key of the first block).
pub type BlockHasher = fn(parent: u64, tokens: &[u32]) -> u64;

/// SipHash-1-3 with fixed keys: deterministic across runs.
pub fn sip_hasher(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// Where a walk down the index stands: the key and node of the last block matched or
/// inserted (the root before the first block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    pub key: u64,
    pub node: u64,
}

/// The root node's id; real nodes start at 1.
const ROOT_NODE: u64 = 0;

#[derive(Debug, Clone)]
struct Entry {
    block: BlockId,
    node: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

/// Counters of the index, read by metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompts looked up.
    pub lookups: u64,
    /// Tokens those prompts could have reused (their full blocks, less the last token).
    pub lookup_tokens: u64,
    /// Tokens reused from the index.
    pub hit_tokens: u64,
    /// Blocks added to the index.
    pub inserted: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
    /// Keys that matched but failed verification (hash collisions).
    pub collisions: u64,
}

impl PrefixStats {
    /// Hit tokens over lookup tokens.
    pub fn hit_rate(&self) -> f64 {
        match self.lookup_tokens {
            0 => 0.0,
            n => self.hit_tokens as f64 / n as f64,
        }
    }
}

/// Full blocks by chained prefix hash.
#[derive(Debug)]
pub struct PrefixIndex {
    entries: HashMap<u64, Entry>,
    keys: HashMap<BlockId, u64>,
    hasher: BlockHasher,
    root: u64,
    next_node: u64,
    pub stats: PrefixStats,
}

impl PrefixIndex {
    /// An empty index whose keys are salted with `salt` (what else decides a block's
    /// contents: the model, the precision).
    pub fn new(salt: u64) -> Self {
        Self::with_hasher(salt, sip_hasher)
    }

    /// An index with another hash function (tests force collisions with it).
    pub fn with_hasher(salt: u64, hasher: BlockHasher) -> Self {
        Self {
            entries: HashMap::new(),
            keys: HashMap::new(),
            hasher,
            root: hasher(salt, &[]),
            next_node: ROOT_NODE + 1,
            stats: PrefixStats::default(),
        }
    }

    /// The walk's starting point.
    pub fn root(&self) -> Chain {
        Chain {
            key: self.root,
            node: ROOT_NODE,
        }
    }

    /// The verified cached blocks that start `tokens`, at most `max_blocks` of them.
    pub fn lookup(&mut self, tokens: &[u32], max_blocks: usize) -> (Vec<BlockId>, Chain) {
        let mut chain = self.root();
        let mut found = Vec::new();
        for block in tokens.chunks_exact(BLOCK_TOKENS).take(max_blocks) {
            let key = (self.hasher)(chain.key, block);
            let Some(e) = self.entries.get(&key) else {
                break;
            };
            if e.parent != chain.node || *e.tokens != *block {
                self.stats.collisions += 1;
                break;
            }
            found.push(e.block);
            chain = Chain { key, node: e.node };
        }
        (found, chain)
    }

    /// Indexes `block`, holding `tokens`, after `chain`; returns the chain that continues
    /// from it. When its key is taken (the same prefix cached by another block, or a
    /// collision) the block stays out of the index and the chain goes on through the
    /// entry already there if it holds the same prefix, else the walk cannot go on.
    pub fn insert(&mut self, chain: Chain, block: BlockId, tokens: &[u32]) -> Option<Chain> {
        debug_assert_eq!(tokens.len(), BLOCK_TOKENS);
        let key = (self.hasher)(chain.key, tokens);
        if let Some(e) = self.entries.get(&key) {
            return (e.parent == chain.node && *e.tokens == *tokens)
                .then_some(Chain { key, node: e.node });
        }
        let node = self.next_node;
        self.next_node += 1;
        self.entries.insert(
            key,
            Entry {
                block,
                node,
                parent: chain.node,
                tokens: tokens.into(),
            },
        );
        self.keys.insert(block, key);
        self.stats.inserted += 1;
        Some(Chain { key, node })
    }

    /// Whether `block` is in the index.
    pub fn contains(&self, block: BlockId) -> bool {
        self.keys.contains_key(&block)
    }

    /// Takes `block` out of the index (it was evicted or its contents change).
    pub fn remove(&mut self, block: BlockId) -> bool {
        match self.keys.remove(&block) {
            Some(key) => {
                self.entries.remove(&key);
                true
            }
            None => false,
        }
    }

    /// Blocks in the index.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
