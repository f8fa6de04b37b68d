//! Pool bookkeeping: block accounting, typed errors, sharing and tier conversion.

use super::*;

fn pool(slots: [usize; 3], policy: TierPolicy) -> BlockPool {
    BlockPool::new(KvCapacity { slots }, policy)
}

#[test]
fn blocks_are_taken_per_32_tokens_not_per_token() {
    let mut p = pool([8, 0, 0], TierPolicy::ALL_F32);
    let s = p.add_sequence();
    let mut taken = Vec::new();
    for _ in 0..100 {
        p.reserve(s, 1).unwrap();
        p.advance(s, 1).unwrap();
        taken.push(p.stats().blocks_used);
    }
    // 100 tokens: 4 blocks, each taken when its first token arrived.
    assert_eq!(p.stats().blocks_used, 4);
    assert_eq!(taken.windows(2).filter(|w| w[1] > w[0]).count(), 3);
    let st = p.stats();
    assert_eq!(st.tokens_stored, 100);
    assert_eq!(st.waste_slots, 28);
    assert!((st.utilisation() - 0.5).abs() < 1e-9);
    assert!((st.waste() - 28.0 / 128.0).abs() < 1e-9);
}

#[test]
fn running_out_is_a_typed_error_and_changes_nothing() {
    let mut p = pool([4, 0, 0], TierPolicy::ALL_F32);
    let a = p.add_sequence();
    p.reserve(a, 64).unwrap();
    p.advance(a, 64).unwrap();
    let b = p.add_sequence();
    p.reserve(b, 32).unwrap();
    let before = p.stats();
    let err = p.reserve(a, 64).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfBlocks {
            tier: Tier::F32,
            needed: 2,
            free: 1
        }
    );
    assert_eq!(p.stats(), before);
    assert!(matches!(
        p.reserve(a, 10_000),
        Err(KvError::NeverFits { .. })
    ));
    assert!(matches!(
        p.reserve(SeqId(99), 1),
        Err(KvError::UnknownSequence(SeqId(99)))
    ));
}

#[test]
fn shared_blocks_live_until_the_last_reader_leaves() {
    let mut p = pool([8, 0, 0], TierPolicy::ALL_F32);
    let a = p.add_sequence();
    p.reserve(a, 70).unwrap();
    p.advance(a, 70).unwrap();
    let b = p.fork(a, 2).unwrap();
    assert_eq!(p.len(b).unwrap(), 64);
    assert_eq!(p.blocks(b).unwrap(), &p.blocks(a).unwrap()[..2]);
    assert_eq!(p.stats().blocks_used, 3);
    // Freeing the owner frees only its unshared block.
    assert_eq!(p.free_sequence(a).unwrap().len(), 1);
    assert_eq!(p.stats().blocks_used, 2);
    assert_eq!(p.free_sequence(b).unwrap().len(), 2);
    assert_eq!(p.stats().blocks_used, 0);
    assert_eq!(p.free_blocks(Tier::F32), 8);
}

#[test]
fn aged_blocks_convert_once_and_free_their_fp32_slot() {
    let policy = TierPolicy {
        recent: Some(64),
        int8_after: None,
    };
    let mut p = pool([4, 8, 0], policy);
    let s = p.add_sequence();
    let mut moves = Vec::new();
    for _ in 0..200 {
        p.reserve(s, 1).unwrap();
        moves.extend(p.advance(s, 1).unwrap());
    }
    // 200 tokens in 7 blocks, only 4 FP32 slots: the old ones must have moved to FP16.
    let st = p.stats();
    assert_eq!(st.blocks_used_by_tier, [3, 4, 0]);
    assert_eq!(st.conversions, 4);
    assert_eq!(moves.len(), 4);
    assert!(moves
        .iter()
        .all(|m| m.from.0 == Tier::F32 && m.to.0 == Tier::F16));
    let table = p.table(s).unwrap();
    assert_eq!(table[0] >> TIER_SHIFT, Tier::F16 as u32);
    assert_eq!(table[6] >> TIER_SHIFT, Tier::F32 as u32);
}

#[test]
fn a_full_lower_tier_defers_the_conversion() {
    let policy = TierPolicy {
        recent: Some(32),
        int8_after: Some(64),
    };
    // No INT8 slots and one FP16 slot: the first aged block goes FP16, the next waits.
    let mut p = pool([8, 1, 0], policy);
    let s = p.add_sequence();
    p.reserve(s, 160).unwrap();
    let moves = p.advance(s, 160).unwrap();
    assert_eq!(moves.len(), 1);
    assert_eq!(moves[0].to.0, Tier::F16);
    let st = p.stats();
    assert!(st.deferred_conversions >= 2, "{st:?}");
    assert_eq!(st.blocks_used_by_tier, [4, 1, 0]);
}
