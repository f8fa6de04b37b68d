//! The prefix cache on the block pool alone (no device): hits, partial hits, verification
//! against forced collisions, eviction order and that caching never refuses blocks.

use super::*;
use crate::kv::{BlockPool, KvCapacity, SeqId, TierPolicy, BLOCK_TOKENS};

fn pool(blocks: usize) -> BlockPool {
    let mut p = BlockPool::new(KvCapacity::f32_only(blocks), TierPolicy::DEFAULT);
    p.enable_prefix_cache(PrefixIndex::new(7));
    p
}

/// Token ids `from..from + n`.
fn tokens(from: u32, n: usize) -> Vec<u32> {
    (from..from + n as u32).collect()
}

/// Runs a sequence over `prompt` (all of it computed and indexed); returns it.
fn run(pool: &mut BlockPool, prompt: &[u32]) -> (SeqId, usize) {
    let (seq, hit) = pool.add_sequence_with_prefix(prompt);
    let rest = prompt.len() - hit;
    pool.reserve(seq, rest).unwrap();
    pool.advance(seq, rest).unwrap();
    pool.index_prefix(seq, prompt, false);
    (seq, hit)
}

#[test]
fn a_repeated_prompt_reuses_all_but_its_last_token_copying_the_block_it_writes() {
    let mut p = pool(16);
    let prompt = tokens(0, 3 * BLOCK_TOKENS);
    let (a, hit) = run(&mut p, &prompt);
    assert_eq!(hit, 0);
    let (b, hit) = run(&mut p, &prompt);
    // Two full blocks and 31 tokens of the third; the last token is computed for its
    // logits, into a copy of the third block.
    assert_eq!(hit, 3 * BLOCK_TOKENS - 1);
    assert_eq!(p.blocks(a).unwrap()[..2], p.blocks(b).unwrap()[..2]);
    assert_ne!(p.blocks(a).unwrap()[2], p.blocks(b).unwrap()[2]);
    assert_eq!(p.take_copies().len(), 1);
    assert_eq!(p.stats().shared_blocks, 2);
    assert_eq!(p.prefix_stats().unwrap().hit_tokens, hit as u64);
}

#[test]
fn a_prompt_that_parts_midway_reuses_only_the_common_blocks() {
    let mut p = pool(16);
    let a = tokens(0, 4 * BLOCK_TOKENS);
    run(&mut p, &a);
    let mut b = a.clone();
    b[BLOCK_TOKENS + 5] = 9999; // parts in the second block
    let (_, hit) = run(&mut p, &b);
    // The first block, and the second's first five tokens (copied before writing).
    assert_eq!(hit, BLOCK_TOKENS + 5);
    let stats = p.prefix_stats().unwrap();
    assert_eq!(stats.lookups, 2);
    assert_eq!(stats.collisions, 0);
}

#[test]
fn a_forced_hash_collision_is_caught_by_verification() {
    let mut p = BlockPool::new(KvCapacity::f32_only(16), TierPolicy::DEFAULT);
    // Every block gets the same key.
    p.enable_prefix_cache(PrefixIndex::with_hasher(7, |_, _| 42));
    let a = tokens(0, 2 * BLOCK_TOKENS + 1);
    run(&mut p, &a);
    let b = tokens(1000, 2 * BLOCK_TOKENS + 1);
    let (_, hit) = run(&mut p, &b);
    assert_eq!(hit, 0, "other tokens under the same key are not reused");
    // Same first block: it hits; the second has the first's key and fails verification.
    let (_, hit) = run(&mut p, &a);
    assert_eq!(hit, BLOCK_TOKENS);
    assert!(p.prefix_stats().unwrap().collisions >= 2);
}

#[test]
fn freed_blocks_stay_cached_and_are_evicted_least_recently_used_deepest_first() {
    let mut p = pool(6);
    let a = tokens(0, 3 * BLOCK_TOKENS);
    let (sa, _) = run(&mut p, &a);
    p.free_sequence(sa).unwrap();
    assert_eq!(p.stats().blocks_used, 0);
    assert_eq!(p.stats().cached_blocks, 3);
    assert_eq!(
        p.free_blocks(crate::kv::Tier::F32),
        6,
        "cached blocks count as free"
    );
    let b = tokens(5000, 3 * BLOCK_TOKENS);
    let (sb, _) = run(&mut p, &b);
    p.free_sequence(sb).unwrap();
    assert_eq!(p.stats().cached_blocks, 6);
    // Needing 2 blocks evicts a's deepest two (freed first, deepest first).
    let c = tokens(9000, 2 * BLOCK_TOKENS);
    let (sc, _) = run(&mut p, &c);
    assert_eq!(p.prefix_stats().unwrap().evictions, 2);
    let (_, hit) = p.add_sequence_with_prefix(&a);
    assert_eq!(hit, BLOCK_TOKENS, "a's first block survived");
    let (_, hit) = p.add_sequence_with_prefix(&b);
    assert_eq!(hit, 3 * BLOCK_TOKENS - 1, "b was used later and kept");
    let _ = sc;
}

#[test]
fn the_cache_never_makes_a_reservation_fail_while_blocks_are_evictable() {
    let mut p = pool(4);
    for round in 0..10u32 {
        let prompt = tokens(round * 1000, 4 * BLOCK_TOKENS);
        let (s, hit) = run(&mut p, &prompt);
        assert_eq!(hit, 0);
        p.free_sequence(s).unwrap();
    }
    assert_eq!(p.prefix_stats().unwrap().evictions, 36);
}

#[test]
fn writing_after_a_shared_partly_filled_block_copies_it_first() {
    let mut p = BlockPool::new(KvCapacity::f32_only(8), TierPolicy::ALL_F32);
    let a = p.add_sequence();
    p.reserve(a, 40).unwrap();
    p.advance(a, 40).unwrap();
    let b = p.fork(a, 2).unwrap();
    assert_eq!(p.len(b).unwrap(), 40);
    assert_eq!(p.blocks_needed(b, 1).unwrap(), 1, "the copy");
    p.reserve(b, 1).unwrap();
    let copies = p.take_copies();
    assert_eq!(copies.len(), 1);
    assert_ne!(p.blocks(a).unwrap()[1], p.blocks(b).unwrap()[1]);
    assert_eq!(
        p.blocks(a).unwrap()[0],
        p.blocks(b).unwrap()[0],
        "full blocks stay shared"
    );
    // a now holds its block alone: writing into it copies nothing.
    assert_eq!(p.blocks_needed(a, 1).unwrap(), 0);
    p.reserve(a, 1).unwrap();
    assert!(p.take_copies().is_empty());
}

#[test]
fn the_partly_filled_last_block_of_a_finished_sequence_is_reused() {
    let mut p = pool(16);
    let a = tokens(0, 40);
    let (sa, _) = p.add_sequence_with_prefix(&a);
    p.reserve(sa, 40).unwrap();
    p.advance(sa, 40).unwrap();
    p.index_prefix(sa, &a, true);
    p.free_sequence(sa).unwrap();
    assert_eq!(
        p.stats().cached_blocks,
        2,
        "a full and a partial block stay cached"
    );
    let mut b = a.clone();
    b.extend(tokens(500, 8));
    let (sb, hit) = p.add_sequence_with_prefix(&b);
    assert_eq!(hit, 40);
    p.reserve(sb, 8).unwrap();
    let copies = p.take_copies();
    assert_eq!(
        copies.len(),
        1,
        "the cached partial block is copied, not written"
    );
    assert_eq!(copies[0].1, 8, "the copy keeps its 8 tokens");
}

#[test]
fn blocks_that_age_into_fp16_leave_the_index_and_a_trimmed_sequence_adds_none() {
    let mut p = BlockPool::new(KvCapacity::tiers([16, 16, 0]), TierPolicy::DEFAULT);
    p.enable_prefix_cache(PrefixIndex::new(7));
    // 96 tokens: three full FP32 blocks indexed.
    let (a, _) = run(&mut p, &tokens(0, 96));
    assert_eq!(p.prefix_stats().unwrap().inserted, 3);
    // 96 more: the first two blocks are now older than the newest 128 tokens.
    p.reserve(a, 96).unwrap();
    p.advance(a, 96).unwrap();
    assert_eq!(p.prefix_stats().unwrap().aged_out, 2);
    // Their prefix is gone, so nothing after it can be reached either.
    let (c, hit) = p.add_sequence_with_prefix(&tokens(0, 192));
    assert_eq!(hit, 0);
    p.abandon_sequence(c).unwrap();
    // A fresh sequence trimmed to a window adds nothing more to the index.
    let (b, _) = run(&mut p, &tokens(1000, 32));
    p.reserve(b, 160).unwrap();
    p.advance(b, 160).unwrap();
    p.trim_window(b, 1, 64).unwrap();
    p.index_prefix(b, &tokens(1000, 192), true);
    assert_eq!(p.prefix_stats().unwrap().inserted, 4);
}

/// Runs a sequence over `prompt` in a pool keeping a window of `window` tokens, 32 tokens
/// a step (each step indexed, then trimmed); returns it and the tokens it reused.
fn run_windowed(pool: &mut BlockPool, prompt: &[u32], window: usize) -> (SeqId, usize) {
    let (seq, hit) = pool.add_sequence_with_prefix(prompt);
    let mut at = hit;
    while at < prompt.len() {
        let step = (prompt.len() - at).min(BLOCK_TOKENS);
        pool.reserve(seq, step).unwrap();
        pool.advance_indexed(seq, step, Some(prompt)).unwrap();
        pool.trim_window(seq, 0, window).unwrap();
        at += step;
    }
    (seq, hit)
}

/// A pool of 6 blocks whose sequences keep 64 tokens, indexed by `index`.
fn windowed_pool(index: PrefixIndex) -> BlockPool {
    let mut p = BlockPool::new(KvCapacity::f32_only(6), TierPolicy::ALL_F32);
    p.enable_windowed_prefix_cache(index, 64);
    p
}

#[test]
fn a_windowed_pool_reuses_a_long_prefix_through_ghosts_of_the_blocks_it_gave_back() {
    let prompt = tokens(0, 10 * BLOCK_TOKENS);
    let reuse = |index: PrefixIndex, again: &[u32]| {
        let mut p = windowed_pool(index);
        let (s, _) = run_windowed(&mut p, &prompt, 64);
        p.free_sequence(s).unwrap();
        assert!(
            p.prefix_stats().unwrap().evictions >= 4,
            "the start is gone"
        );
        let (s, hit) = p.add_sequence_with_prefix(again);
        (hit, p.blocks(s).unwrap().len(), p.stored(s).unwrap())
    };
    // 319 tokens reused; the sequence starts with the blocks of its last 64 (blocks 7, 8
    // and the first 31 tokens of 9), as if it had run them.
    let ghosts = || PrefixIndex::new(7).with_ghosts(16);
    assert_eq!(reuse(ghosts(), &prompt), (319, 3, 319 - 7 * BLOCK_TOKENS));
    // Without ghosts the walk stops at the first evicted block.
    assert_eq!(reuse(PrefixIndex::new(7), &prompt).0, 0);
    // Ghosts are verified like blocks: a prompt parting in the first block reuses nothing.
    let mut other = prompt.clone();
    other[5] = 9999;
    assert_eq!(reuse(ghosts(), &other).0, 0);
    // Past the limit the oldest ghosts are forgotten, and the walk stops there.
    assert_eq!(reuse(PrefixIndex::new(7).with_ghosts(2), &prompt).0, 0);
}

#[test]
fn a_block_computed_again_revives_its_ghost_for_later_walks() {
    let mut p = windowed_pool(PrefixIndex::new(7).with_ghosts(16));
    let a = tokens(0, 10 * BLOCK_TOKENS);
    let (s, _) = run_windowed(&mut p, &a, 64);
    p.free_sequence(s).unwrap();
    // A short prompt sharing a's first two blocks finds them only as ghosts: it computes
    // them again, and they come back into the index under their old place in the chain.
    let b = [&a[..2 * BLOCK_TOKENS], &tokens(5000, 8)[..]].concat();
    let (sb, hit) = run_windowed(&mut p, &b, 64);
    assert_eq!(hit, 0);
    let (sc, hit) = p.add_sequence_with_prefix(&b);
    assert_eq!(hit, 2 * BLOCK_TOKENS, "the revived blocks");
    assert_eq!(p.blocks(sc).unwrap()[..2], p.blocks(sb).unwrap()[..2]);
    // a's walk still goes through them to its later ghosts and cached window.
    let (_, hit) = p.add_sequence_with_prefix(&a);
    assert_eq!(hit, a.len() - 1);
}
