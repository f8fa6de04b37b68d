//! Prefix cache: full KV blocks indexed by a chained hash of the tokens up to and
//! including them, shared across requests and verified token for token before reuse.
//! The block pool holds the index ([`crate::kv::BlockPool::enable_prefix_cache`]): it
//! attaches hits to new sequences, keeps freed cached blocks until their slots are needed
//! and evicts them least recently used first.

mod index;
pub use index::{sip_hasher, BlockHasher, Chain, PrefixIndex, PrefixMatch, PrefixStats};

#[cfg(test)]
mod tests;
