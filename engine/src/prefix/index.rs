//! The global index of full KV blocks by token prefix. A block's key chains the key of the
//! block before it with its own 32 token ids and a salt (model and precision), so equal
//! keys mean equal prefixes up to hash collisions. Every hit is verified: the entry's
//! tokens must equal the request's and its parent must be the entry matched just before
//! (node ids are never reused), so a collision can only cost a miss, never wrong output.
//! The last, partly filled block of a finished sequence is indexed too, found through its
//! parent; a full block can also serve its first tokens. A sequence that reuses a block
//! partly copies it before writing into it. An index for sliding-window layers keeps
//! ghosts of full blocks whose data has gone (their tokens and place in the chain, no
//! block): a walk goes on through them, so a long prefix whose window is still cached is
//! found and verified however much of its start has been given back.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::kv::{BlockId, BlockKey, BLOCK_TOKENS};

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

/// An indexed block: a full one under its key, or a partly filled one (the last block of
/// a finished sequence) found through its parent.
#[derive(Debug, Clone)]
struct Node {
    key: Option<u64>,
    node: u64,
    parent: u64,
    /// The parent's key (the salted root's for a first block).
    parent_key: u64,
    tokens: Box<[u32]>,
}

/// A full block whose data has gone: where it sat in the chain and what it held.
#[derive(Debug, Clone)]
struct Ghost {
    node: u64,
    parent: u64,
    tokens: Box<[u32]>,
    /// When it became a ghost (its place in the order ghosts are forgotten in).
    since: u64,
}

/// What the index holds under a block's key.
enum Found {
    Nothing,
    /// Another prefix's block or ghost (a hash collision).
    Other,
    /// The block (`None`: its ghost) holding these tokens after this chain, and its node.
    Here(Option<BlockId>, u64),
}

/// What a lookup found: full blocks in order (`None` for a ghost), then perhaps a block
/// whose first tokens continue the prompt (to be copied before it is written:
/// copy-on-write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixMatch {
    pub full: Vec<Option<BlockId>>,
    pub partial: Option<(BlockId, usize)>,
    /// The walk from the root: where it stood before each full block, and after the last.
    pub chains: Vec<Chain>,
}

impl PrefixMatch {
    /// Tokens reused.
    pub fn tokens(&self) -> usize {
        self.full.len() * BLOCK_TOKENS + self.partial.map_or(0, |p| p.1)
    }

    /// The walk after the full blocks.
    pub fn chain(&self) -> Chain {
        *self.chains.last().expect("the root at least")
    }

    /// Keeps the longest part of the match whose blocks holding the last `window` tokens
    /// all have their data (all of it when `window` is `None`), dropping the rest; returns
    /// the full blocks before those, which a sequence starting here does without.
    pub fn fit_window(&mut self, window: Option<usize>) -> usize {
        let real = |m: &Self, from: usize| m.full[from..].iter().all(Option::is_some);
        let first = |len: usize| window.map_or(0, |w| len.saturating_sub(w) / BLOCK_TOKENS);
        if self.partial.is_some() && real(self, first(self.tokens())) {
            return first(self.tokens());
        }
        self.partial = None;
        loop {
            let from = first(self.tokens());
            if real(self, from) {
                return from;
            }
            self.full.pop();
            self.chains.pop();
        }
    }
}

/// Counters of the index, read by metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompts looked up.
    pub lookups: u64,
    /// Tokens those prompts could have reused (all but their last token).
    pub lookup_tokens: u64,
    /// Tokens reused from the index.
    pub hit_tokens: u64,
    /// Blocks added to the index.
    pub inserted: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
    /// Indexed blocks that left the index when they aged into a lower tier.
    pub aged_out: u64,
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

/// Blocks by chained prefix hash.
#[derive(Debug)]
pub struct PrefixIndex {
    keys: HashMap<u64, BlockId>,
    nodes: HashMap<BlockId, Node>,
    /// Indexed blocks by their parent's node id.
    children: HashMap<u64, Vec<BlockId>>,
    /// Ghosts by key, at most `max_ghosts`, and their keys with when each became one, oldest
    /// first (a key revived since has a stale entry).
    ghosts: HashMap<u64, Ghost>,
    ghost_order: VecDeque<(u64, u64)>,
    max_ghosts: usize,
    ghost_tick: u64,
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
            keys: HashMap::new(),
            nodes: HashMap::new(),
            children: HashMap::new(),
            ghosts: HashMap::new(),
            ghost_order: VecDeque::new(),
            max_ghosts: 0,
            ghost_tick: 0,
            hasher,
            root: hasher(salt, &[]),
            next_node: ROOT_NODE + 1,
            stats: PrefixStats::default(),
        }
    }

    /// Keeps up to `max` ghosts of full blocks taken out of the index (for an index of
    /// sliding-window layers).
    pub fn with_ghosts(self, max: usize) -> Self {
        Self {
            max_ghosts: max,
            ..self
        }
    }

    /// The walk's starting point.
    pub fn root(&self) -> Chain {
        Chain {
            key: self.root,
            node: ROOT_NODE,
        }
    }

    /// The verified cached blocks that hold the first `limit` tokens of `tokens`, or as
    /// many as are cached: full blocks (or their ghosts) by key, then the child of the last
    /// one sharing the most leading tokens with what is left.
    pub fn lookup(&mut self, tokens: &[u32], limit: usize) -> PrefixMatch {
        let limit = limit.min(tokens.len());
        let mut chains = vec![self.root()];
        let mut full = Vec::new();
        while (full.len() + 1) * BLOCK_TOKENS <= limit {
            let i = full.len() * BLOCK_TOKENS;
            let block = &tokens[i..i + BLOCK_TOKENS];
            let chain = *chains.last().expect("the root at least");
            let key = (self.hasher)(chain.key, block);
            let (b, node) = match self.find(key, chain, block) {
                Found::Here(b, node) => (b, node),
                Found::Nothing => break,
                Found::Other => {
                    self.stats.collisions += 1;
                    break;
                }
            };
            full.push(b);
            chains.push(Chain { key, node });
        }
        let chain = *chains.last().expect("the root at least");
        let rest = &tokens[full.len() * BLOCK_TOKENS..limit];
        let partial = self
            .children
            .get(&chain.node)
            .into_iter()
            .flatten()
            .map(|&b| {
                let common = self.nodes[&b]
                    .tokens
                    .iter()
                    .zip(rest)
                    .take_while(|(x, y)| x == y)
                    .count();
                (b, common)
            })
            .filter(|&(_, common)| common > 0)
            .max_by_key(|&(_, common)| common);
        PrefixMatch {
            full,
            partial,
            chains,
        }
    }

    /// Indexes the full `block`, holding `tokens`, after `chain`; returns the chain that
    /// continues from it. When its key is taken (the same prefix cached by another block,
    /// or a collision) the block stays out of the index and the chain goes on through the
    /// block already there if it holds the same prefix, else the walk cannot go on.
    pub fn insert(&mut self, chain: Chain, block: BlockId, tokens: &[u32]) -> Option<Chain> {
        debug_assert_eq!(tokens.len(), BLOCK_TOKENS);
        let key = (self.hasher)(chain.key, tokens);
        let node = match self.find(key, chain, tokens) {
            Found::Other => return None,
            Found::Here(Some(_), node) => return Some(Chain { key, node }),
            // Its data again: the ghost comes back to life under its own node, so the
            // walks through it still hold.
            Found::Here(None, node) => {
                let g = self.ghosts.remove(&key).expect("just found");
                self.place(node, chain, block, g.tokens, Some(key));
                node
            }
            Found::Nothing => self.add(chain, block, tokens, Some(key)),
        };
        self.keys.insert(key, block);
        Some(Chain { key, node })
    }

    /// Records the full block holding `tokens` after `chain` as a ghost (its data has
    /// gone before it was indexed); returns the chain that continues from it, or `None`
    /// when this index keeps no ghosts or the key is another prefix's.
    pub fn insert_ghost(&mut self, chain: Chain, tokens: &[u32]) -> Option<Chain> {
        debug_assert_eq!(tokens.len(), BLOCK_TOKENS);
        if self.max_ghosts == 0 {
            return None;
        }
        let key = (self.hasher)(chain.key, tokens);
        let node = match self.find(key, chain, tokens) {
            Found::Other => return None,
            Found::Here(_, node) => node,
            Found::Nothing => {
                let node = self.new_node();
                self.add_ghost(key, node, chain.node, tokens.into());
                node
            }
        };
        Some(Chain { key, node })
    }

    /// What is under `key`, the key of `tokens` after `chain`: verified, it is theirs only
    /// if it holds `tokens` and follows `chain`'s node.
    fn find(&self, key: u64, chain: Chain, tokens: &[u32]) -> Found {
        let (block, node, parent, held) = match self.keys.get(&key) {
            Some(&b) => {
                let n = &self.nodes[&b];
                (Some(b), n.node, n.parent, &n.tokens)
            }
            None => match self.ghosts.get(&key) {
                Some(g) => (None, g.node, g.parent, &g.tokens),
                None => return Found::Nothing,
            },
        };
        match parent == chain.node && **held == *tokens {
            true => Found::Here(block, node),
            false => Found::Other,
        }
    }

    /// A new node id (never reused).
    fn new_node(&mut self) -> u64 {
        self.next_node += 1;
        self.next_node - 1
    }

    /// Keeps a ghost of `node` (after `parent`, holding `tokens`) under `key`, forgetting
    /// the oldest ghost past the limit.
    fn add_ghost(&mut self, key: u64, node: u64, parent: u64, tokens: Box<[u32]>) {
        let since = self.ghost_tick;
        self.ghost_tick += 1;
        self.ghost_order.push_back((key, since));
        let ghost = Ghost {
            node,
            parent,
            tokens,
            since,
        };
        self.ghosts.insert(key, ghost);
        let current = |ghosts: &HashMap<u64, Ghost>, (key, since): (u64, u64)| {
            ghosts.get(&key).is_some_and(|g| g.since == since)
        };
        while self.ghosts.len() > self.max_ghosts {
            let Some(entry) = self.ghost_order.pop_front() else {
                break;
            };
            if current(&self.ghosts, entry) {
                self.ghosts.remove(&entry.0);
            }
        }
        // Stale entries (ghosts revived since) are dropped before they outnumber the ghosts.
        if self.ghost_order.len() > 2 * self.max_ghosts {
            let ghosts = &self.ghosts;
            self.ghost_order.retain(|&e| current(ghosts, e));
        }
    }

    /// Indexes a partly filled last `block` holding `tokens` after `chain`, unless a
    /// child there already holds them.
    pub fn insert_partial(&mut self, chain: Chain, block: BlockId, tokens: &[u32]) {
        debug_assert!(!tokens.is_empty() && tokens.len() < BLOCK_TOKENS);
        let known = self
            .children
            .get(&chain.node)
            .into_iter()
            .flatten()
            .any(|b| self.nodes[b].tokens.starts_with(tokens));
        if !known {
            self.add(chain, block, tokens, None);
        }
    }

    /// Indexes `block` holding `tokens` after `chain` under a new node; returns it.
    fn add(&mut self, chain: Chain, block: BlockId, tokens: &[u32], key: Option<u64>) -> u64 {
        let node = self.new_node();
        self.place(node, chain, block, tokens.into(), key);
        node
    }

    /// Indexes `block` as `node`, holding `tokens` after `chain`.
    fn place(
        &mut self,
        node: u64,
        chain: Chain,
        block: BlockId,
        tokens: Box<[u32]>,
        key: Option<u64>,
    ) {
        self.nodes.insert(
            block,
            Node {
                key,
                node,
                parent: chain.node,
                parent_key: chain.key,
                tokens,
            },
        );
        self.children.entry(chain.node).or_default().push(block);
        self.stats.inserted += 1;
    }

    /// Each full block of `tokens` from the root, in order: its parent's key, its key and
    /// its tokens.
    pub fn block_keys<'t>(
        &self,
        tokens: &'t [u32],
    ) -> impl Iterator<Item = (u64, u64, &'t [u32])> + 't {
        let hasher = self.hasher;
        let mut parent = self.root;
        tokens.chunks_exact(BLOCK_TOKENS).map(move |block| {
            let key = hasher(parent, block);
            let keys = (parent, key, block);
            parent = key;
            keys
        })
    }

    /// The key of the full block holding `tokens` after `chain`.
    pub fn key_after(&self, chain: Chain, tokens: &[u32]) -> u64 {
        (self.hasher)(chain.key, tokens)
    }

    /// The key a partly filled last block after `chain` is kept under outside the index
    /// (one per chain: its tokens are verified on use).
    pub fn tail_key(&self, chain: Chain) -> u64 {
        (self.hasher)(chain.key, &[])
    }

    /// Where the full `block` sits in the chain and what it holds (`None` for a partly
    /// filled block or one not indexed).
    pub fn block_key(&self, block: BlockId) -> Option<BlockKey> {
        let n = self.nodes.get(&block)?;
        Some(BlockKey {
            key: n.key?,
            parent: n.parent_key,
            tokens: n.tokens.clone(),
        })
    }

    /// Whether a full block is indexed under `key`.
    pub fn has_key(&self, key: u64) -> bool {
        self.keys.contains_key(&key)
    }

    /// Whether `block` is in the index.
    pub fn contains(&self, block: BlockId) -> bool {
        self.nodes.contains_key(&block)
    }

    /// Takes `block` out of the index (it was evicted or its contents change); a full one
    /// stays as a ghost where the index keeps them.
    pub fn remove(&mut self, block: BlockId) -> bool {
        let Some(n) = self.nodes.remove(&block) else {
            return false;
        };
        if let Some(key) = n.key {
            self.keys.remove(&key);
            if self.max_ghosts > 0 {
                self.add_ghost(key, n.node, n.parent, n.tokens.clone());
            }
        }
        if let Some(siblings) = self.children.get_mut(&n.parent) {
            siblings.retain(|&b| b != block);
            if siblings.is_empty() {
                self.children.remove(&n.parent);
            }
        }
        true
    }

    /// Blocks in the index.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}
