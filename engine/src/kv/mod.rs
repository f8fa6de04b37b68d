//! The paged KV cache: a pool of 32-token blocks allocated once, per-sequence block
//! tables, precision tiers (FP32 for the newest tokens, FP16 and optionally INT8 for
//! older blocks) and attention over it.

mod batch;
mod cache;
#[cfg(test)]
mod cpu_attention_tests;
mod error;
mod host_tier;
mod layout;
mod ops;
pub mod pack;
mod pool;
pub mod reference;
#[cfg(feature = "redis")]
pub mod remote;
mod stats;
mod store;
#[cfg(test)]
mod tests;
mod tier;

pub use batch::{BatchSeq, PagedBatch};
pub use cache::PagedKv;
pub use error::KvError;
pub use fornax_shaders::launch::AttentionShape;
pub use host_tier::{BlockKey, BlockValues, HostStats, HostTier};
pub use layout::{KvCapacity, KvDims, Sliding};
pub use ops::PagedAttentionOps;
pub use pool::{BlockId, BlockPool, Move, SeqId};
pub use stats::KvStats;
pub use store::{KvStore, LayerKv, Owned, TierArena};
pub use tier::{Tier, TierPolicy, BLOCK_TOKENS, SLOT_MASK, TIER_SHIFT};
