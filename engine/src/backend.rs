//! What the engine needs from a burn backend beyond burn's own operations.

use crate::kv::PagedAttentionOps;

/// A backend the whole engine runs on: burn's operations plus our kernels (or their
/// burn reference fallbacks).
pub trait EngineBackend: PagedAttentionOps {}

impl<B: PagedAttentionOps> EngineBackend for B {}
