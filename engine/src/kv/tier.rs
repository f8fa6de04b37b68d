//! Precision tiers of KV blocks and the rule that ages blocks from one to the next.

use std::fmt;

pub use fornax_shaders::paged_attention::{BLOCK_TOKENS, SLOT_MASK, TIER_SHIFT};

/// Storage format of a block's keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Full precision: the newest tokens.
    F32 = 0,
    /// IEEE half with a per-(block, head) power-of-two scale, two per `u32`.
    F16 = 1,
    /// Signed bytes with a per-(block, head) scale, four per `u32`.
    I8 = 2,
}

impl Tier {
    /// Every tier, in the order of their index.
    pub const ALL: [Tier; 3] = [Tier::F32, Tier::F16, Tier::I8];

    /// Position in [`Tier::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// `u32` words per token and kv head of size `head_dim`.
    pub fn words(self, head_dim: usize) -> usize {
        match self {
            Tier::F32 => head_dim,
            Tier::F16 => head_dim / 2,
            Tier::I8 => head_dim / 4,
        }
    }

    /// Whether the tier stores a scale per (block, head).
    pub fn scaled(self) -> bool {
        self != Tier::F32
    }

    /// The block-table entry of a block of this tier in `slot`.
    pub fn entry(self, slot: u32) -> u32 {
        debug_assert!(slot <= SLOT_MASK);
        (self as u32) << TIER_SHIFT | slot
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::F32 => "FP32",
            Tier::F16 => "FP16",
            Tier::I8 => "INT8",
        })
    }
}

/// Which tier a block belongs in, given its age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierPolicy {
    /// Blocks holding any of the newest `recent` tokens stay FP32; `None` keeps all FP32.
    pub recent: Option<usize>,
    /// Blocks whose tokens are all older than the newest `int8_after` go to INT8.
    pub int8_after: Option<usize>,
}

impl TierPolicy {
    /// Everything in FP32 (the reference).
    pub const ALL_F32: TierPolicy = TierPolicy {
        recent: None,
        int8_after: None,
    };

    /// The default: the newest 128 tokens in FP32, older blocks FP16.
    pub const DEFAULT: TierPolicy = TierPolicy {
        recent: Some(128),
        int8_after: None,
    };

    /// The tier block `index` of a sequence of `len` tokens belongs in.
    pub fn tier_for(&self, index: usize, len: usize) -> Tier {
        let end = (index + 1) * BLOCK_TOKENS;
        let Some(recent) = self.recent else {
            return Tier::F32;
        };
        if end + recent > len {
            return Tier::F32;
        }
        match self.int8_after {
            Some(after) if end + after.max(recent) <= len => Tier::I8,
            _ => Tier::F16,
        }
    }

    /// The first length after `len` at which some block of a sequence changes tier
    /// (`None`: blocks never age). Rows computed in one pass from `len` all see the tiers
    /// of `len`; computed one at a time, a row at this length or beyond would see the
    /// aged block.
    pub fn next_change(&self, len: usize) -> Option<usize> {
        let recent = self.recent?;
        // Block i changes at 32 (i + 1) + age, for i >= 0.
        let after = |age: usize| {
            let first = age + BLOCK_TOKENS;
            if len < first {
                first
            } else {
                first + ((len - first) / BLOCK_TOKENS + 1) * BLOCK_TOKENS
            }
        };
        let f16 = after(recent);
        Some(match self.int8_after {
            Some(a) => f16.min(after(a.max(recent))),
            None => f16,
        })
    }
}

impl Default for TierPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `next_change` is where `tier_for` first differs for some block, brute force.
    #[test]
    fn the_next_change_is_where_a_block_first_changes_tier() {
        for p in [
            TierPolicy::DEFAULT,
            TierPolicy {
                recent: Some(40),
                int8_after: Some(100),
            },
            TierPolicy {
                recent: Some(64),
                int8_after: Some(16),
            },
        ] {
            for len in 0..400 {
                let changes = |t: usize| {
                    (0..t / BLOCK_TOKENS).any(|i| p.tier_for(i, t) != p.tier_for(i, len))
                };
                let want = (len + 1..1000).find(|&t| changes(t));
                assert_eq!(p.next_change(len), want, "{p:?} at {len}");
            }
        }
        assert_eq!(TierPolicy::ALL_F32.next_change(500), None);
    }

    #[test]
    fn blocks_age_through_the_tiers() {
        let p = TierPolicy {
            recent: Some(64),
            int8_after: Some(128),
        };
        // 200 tokens: block 0 covers 0..32 (all older than 200 - 128 = 72) -> INT8,
        // block 2 covers 64..96 (tokens 72..96 are not older than 128) -> FP16,
        // block 4 covers 128..160, tokens 136.. are among the newest 64 -> FP32.
        assert_eq!(p.tier_for(0, 200), Tier::I8);
        assert_eq!(p.tier_for(1, 200), Tier::I8);
        assert_eq!(p.tier_for(2, 200), Tier::F16);
        assert_eq!(p.tier_for(3, 200), Tier::F16);
        assert_eq!(p.tier_for(4, 200), Tier::F32);
        assert_eq!(p.tier_for(6, 200), Tier::F32);
        assert_eq!(TierPolicy::ALL_F32.tier_for(0, 10_000), Tier::F32);
        // A block turns FP16 exactly when its last token leaves the recent window.
        assert_eq!(TierPolicy::DEFAULT.tier_for(0, 159), Tier::F32);
        assert_eq!(TierPolicy::DEFAULT.tier_for(0, 160), Tier::F16);
    }

    #[test]
    fn entries_pack_tier_and_slot() {
        assert_eq!(Tier::F16.entry(5), 1 << TIER_SHIFT | 5);
        assert_eq!(Tier::I8.entry(SLOT_MASK) >> TIER_SHIFT, 2);
    }
}
