//! Errors of the paged KV cache: the scheduler acts on them (preempts, rejects).

use super::{SeqId, Tier};

/// Why a KV cache operation could not be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The pool has too few free blocks in `tier` for the request.
    #[error("KV cache full: {needed} more {tier} blocks needed, {free} free")]
    OutOfBlocks {
        tier: Tier,
        needed: usize,
        free: usize,
    },
    /// The sequence was never added or was already freed.
    #[error("unknown KV sequence {0:?}")]
    UnknownSequence(SeqId),
    /// The sequence would need more blocks than the whole pool has.
    #[error("KV cache too small: a sequence of {tokens} tokens can never fit a pool of {capacity} tokens")]
    NeverFits { tokens: usize, capacity: usize },
}
