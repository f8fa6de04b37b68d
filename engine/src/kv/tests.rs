//! Pool bookkeeping: block accounting, typed errors, sharing and tier conversion.

use super::*;

fn pool(slots: [usize; 3], policy: TierPolicy) -> BlockPool {
    BlockPool::new(KvCapacity::tiers(slots), policy)
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
    // Bytes in use count each block at its tier's size: FP16 blocks take about half.
    let dims = KvDims::dense(2, 3, 64);
    let f32_block = 2 * 2 * 32 * 3 * 64 * 4;
    let f16_block = 2 * 2 * (32 * 3 * 32 + 3) * 4;
    assert_eq!(st.bytes_used(dims), 3 * f32_block + 4 * f16_block);
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

#[test]
fn an_elastic_window_drops_whole_blocks_between_the_sinks_and_the_newest_tokens() {
    let mut p = pool([8, 0, 0], TierPolicy::ALL_F32);
    let s = p.add_sequence();
    p.reserve(s, 200).unwrap();
    p.advance(s, 200).unwrap();
    let table = p.table(s).unwrap();
    // A window longer than the sequence keeps everything.
    let (freed, _) = p.trim_window(s, 1, 200).unwrap();
    assert!(freed.is_empty());
    // Keep block 0 and the blocks holding the newest 70 tokens (130..200: blocks 4..6).
    let (freed, moves) = p.trim_window(s, 1, 70).unwrap();
    assert_eq!(freed.len(), 3);
    assert!(moves.is_empty());
    assert_eq!(p.len(s).unwrap(), 200, "positions go on");
    assert_eq!(p.stored(s).unwrap(), 104);
    assert_eq!(
        p.table(s).unwrap(),
        [table[0], table[4], table[5], table[6]]
    );
    assert_eq!(p.free_blocks(Tier::F32), 8 - 4);
    // The next token goes after the last stored one, in the last block.
    let rows = p.write_rows(s, 1).unwrap();
    assert_eq!(rows, [(table[6] & SLOT_MASK) * 32 + 8]);
    let st = p.stats();
    assert_eq!((st.window_trims, st.window_dropped_tokens), (1, 96));
    assert_eq!(st.tokens_stored, 104);
    // Trimming again at the same length drops nothing.
    assert!(p.trim_window(s, 1, 70).unwrap().0.is_empty());
    p.free_sequence(s).unwrap();
    assert_eq!(p.free_blocks(Tier::F32), 8);
}

#[test]
fn trimming_frees_room_for_conversions_deferred_by_a_full_tier() {
    // Two FP16 slots: of a 192-token sequence's five aged blocks, three stay FP32.
    let policy = TierPolicy {
        recent: Some(32),
        int8_after: None,
    };
    let mut p = pool([8, 2, 0], policy);
    let s = p.add_sequence();
    p.reserve(s, 192).unwrap();
    let moves = p.advance(s, 192).unwrap();
    assert_eq!(moves.len(), 2);
    assert_eq!(p.stats().blocks_used_by_tier, [4, 2, 0]);
    // Keep block 0 and blocks 4..6: block 1 (FP16) and blocks 2, 3 (FP32) go, and block
    // 4, now old enough, converts into the freed FP16 slot.
    let (freed, moves) = p.trim_window(s, 1, 64).unwrap();
    assert_eq!(freed.len(), 3);
    assert_eq!(moves.len(), 1);
    assert_eq!(moves[0].to.0, Tier::F16);
    assert_eq!(p.stats().blocks_used_by_tier, [1, 2, 0]);
    assert_eq!(p.stored(s).unwrap(), 96);
}

#[test]
fn taking_back_tentative_tokens_restores_the_pool_and_defers_ageing() {
    let policy = TierPolicy {
        recent: Some(32),
        int8_after: None,
    };
    // Speculative run: 60 tokens settled, 6 tentative (crossing into block 2), 2 kept.
    let mut p = pool([8, 4, 0], policy);
    let s = p.add_sequence();
    p.reserve(s, 60).unwrap();
    p.advance(s, 60).unwrap();
    p.reserve(s, 6).unwrap();
    p.advance_tentative(s, 6).unwrap();
    assert_eq!(p.stats().conversions, 0, "held tokens do not age blocks");
    let slot = |p: &BlockPool, i: usize| p.table(s).unwrap()[i] & SLOT_MASK;
    let (freed, rows) = p.truncate(s, 62).unwrap();
    assert_eq!(freed.len(), 1, "block 2 held only taken-back tokens");
    let base = slot(&p, 1) * 32;
    assert_eq!(rows, base + 30..base + 32);
    assert_eq!(p.settle(s).unwrap().len(), 0);
    // Plain run to the same length.
    let mut q = pool([8, 4, 0], policy);
    let t = q.add_sequence();
    q.reserve(t, 62).unwrap();
    q.advance(t, 62).unwrap();
    assert_eq!(p.stats(), q.stats());
    assert_eq!(p.len(s).unwrap(), 62);
    // Past 64 + 32 tokens block 0 ages exactly when the plain run's does.
    p.reserve(s, 34).unwrap();
    p.advance(s, 34).unwrap();
    q.reserve(t, 34).unwrap();
    q.advance(t, 34).unwrap();
    assert_eq!(p.stats(), q.stats());
    assert_eq!(p.stats().conversions, 2);
}

#[test]
fn indexed_blocks_leaving_the_device_go_to_the_host_tier_and_come_back() {
    let mut p = pool([3, 0, 0], TierPolicy::ALL_F32);
    p.enable_prefix_cache(crate::prefix::PrefixIndex::new(1));
    p.enable_host_tier(HostTier::new(10 * 16, 16));
    // Two full blocks and 6 tokens, indexed when finished, then cached.
    let tokens: Vec<u32> = (0..70).collect();
    let (a, hit) = p.add_sequence_with_prefix(&tokens);
    assert_eq!(hit, 0);
    p.reserve(a, 70).unwrap();
    p.advance(a, 70).unwrap();
    p.index_prefix(a, &tokens, true);
    p.free_sequence(a).unwrap();
    assert_eq!(p.stats().cached_blocks, 3);
    assert!(p.take_offload().is_empty());

    // Another sequence needs every slot: the cached blocks are evicted, the two full ones
    // queued for the host (the partly filled one is not kept).
    let b = p.add_sequence();
    p.reserve(b, 96).unwrap();
    let offload = p.take_offload();
    assert_eq!(offload.len(), 2);
    let mut firsts: Vec<u32> = offload.iter().map(|(_, k)| k.tokens[0]).collect();
    firsts.sort();
    assert_eq!(firsts, [0, 32]);
    for (slot, key) in offload {
        p.store_offloaded(key, vec![slot as f32; 4].into());
    }
    p.free_sequence(b).unwrap();

    // The prompt comes back: both full blocks are restored into free slots and indexed.
    let (c, hit) = p.add_sequence_with_prefix(&tokens);
    assert_eq!(hit, 64);
    assert_eq!(p.take_restores().len(), 2);
    let host = p.host_stats().unwrap();
    assert_eq!((host.stored, host.restored), (2, 2));
    assert_eq!(p.stats().blocks_used, 2);
    p.free_sequence(c).unwrap();
    // Now on the device again: a hit without a restore.
    let (_, hit) = p.add_sequence_with_prefix(&tokens);
    assert_eq!(hit, 64);
    assert!(p.take_restores().is_empty());
}

#[test]
fn a_host_block_under_another_prefix_is_not_restored() {
    let mut p = pool([4, 0, 0], TierPolicy::ALL_F32);
    p.enable_prefix_cache(crate::prefix::PrefixIndex::new(1));
    p.enable_host_tier(HostTier::new(10 * 16, 16));
    let tokens: Vec<u32> = (0..40).collect();
    // A block stored under the key the first block would have, but other tokens.
    let index = crate::prefix::PrefixIndex::new(1);
    let root = index.root();
    let key = BlockKey {
        key: index.key_after(root, &tokens[..32]),
        parent: root.key,
        tokens: (100..132).collect(),
    };
    p.store_offloaded(key, vec![0.0; 4].into());
    let (_, hit) = p.add_sequence_with_prefix(&tokens);
    assert_eq!(hit, 0);
    assert!(p.take_restores().is_empty());
}

#[test]
fn a_preempted_sequence_resumes_with_its_partly_filled_block_from_the_host() {
    use crate::sched::KvBlocks;
    let mut p = pool([3, 0, 0], TierPolicy::ALL_F32);
    p.enable_prefix_cache(crate::prefix::PrefixIndex::new(1));
    p.enable_host_tier(HostTier::new(10 * 16, 16));
    // One full block and 18 tokens computed, the full block indexed as it filled.
    let tokens: Vec<u32> = (0..51).collect();
    let (a, _) = p.add_sequence_with_prefix(&tokens);
    p.reserve(a, 50).unwrap();
    p.advance_indexed(a, 50, Some(&tokens[..50])).unwrap();
    KvBlocks::preempt_sequence(&mut p, a, &tokens[..50]);
    // Its partly filled block is queued for the host; the full one stays cached.
    let offload = p.take_offload();
    assert_eq!(offload.len(), 1);
    assert_eq!(*offload[0].1.tokens, tokens[32..50]);
    for (slot, key) in offload {
        p.store_offloaded(key, vec![slot as f32; 4].into());
    }
    assert_eq!(p.stats().cached_blocks, 1);
    // Another sequence takes every slot: the full block goes to the host too.
    let b = p.add_sequence();
    p.reserve(b, 96).unwrap();
    for (slot, key) in p.take_offload() {
        p.store_offloaded(key, vec![slot as f32; 4].into());
    }
    p.free_sequence(b).unwrap();

    // Admitted again, it holds all 50 tokens: both blocks come back, the last one
    // unindexed, with room for the next token.
    let (c, hit) = p.add_sequence_with_prefix(&tokens);
    assert_eq!(hit, 50);
    assert_eq!(p.blocks_needed(c, 1).unwrap(), 0);
    assert_eq!(p.take_restores().len(), 2);
    assert_eq!(p.host_stats().unwrap().restored, 2);
    p.free_sequence(c).unwrap();
    assert_eq!(p.stats().cached_blocks, 1, "only the full block is cached");

    // Abandoned before its restores were written: the freed last block's is dropped.
    let (d, hit) = p.add_sequence_with_prefix(&tokens);
    assert_eq!(hit, 50);
    p.abandon_sequence(d).unwrap();
    // (The full block was on the device; the last block's restore went with it.)
    assert!(p.take_restores().is_empty());
    assert_eq!(p.stats().blocks_used, 0);
}

#[test]
fn a_full_block_in_host_memory_wins_over_a_shorter_cached_match() {
    let mut p = pool([2, 0, 0], TierPolicy::ALL_F32);
    p.enable_prefix_cache(crate::prefix::PrefixIndex::new(1));
    p.enable_host_tier(HostTier::new(10 * 16, 16));
    let a: Vec<u32> = (0..41).collect();
    // A's first block is computed, indexed, then evicted into host memory.
    let (x, _) = p.add_sequence_with_prefix(&a);
    p.reserve(x, 40).unwrap();
    p.advance_indexed(x, 40, Some(&a[..40])).unwrap();
    p.free_sequence(x).unwrap();
    let z = p.add_sequence();
    p.reserve(z, 64).unwrap();
    for (slot, key) in p.take_offload() {
        p.store_offloaded(key, vec![slot as f32; 4].into());
    }
    p.free_sequence(z).unwrap();
    // A finished request sharing A's first 5 tokens leaves a partly filled cached block.
    let b: Vec<u32> = a[..5].iter().copied().chain(1000..1005).collect();
    let (y, _) = p.add_sequence_with_prefix(&b);
    p.reserve(y, 10).unwrap();
    p.advance(y, 10).unwrap();
    p.index_prefix(y, &b, true);
    p.free_sequence(y).unwrap();
    // A again: the host's full block (32 tokens) beats the device's 5.
    let (_, hit) = p.add_sequence_with_prefix(&a);
    assert_eq!(hit, 32);
    assert_eq!(p.take_restores().len(), 1);
}
