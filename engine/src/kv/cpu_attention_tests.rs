//! The CPU backend's paged attention (`fornax_cpu::attention`) at every SIMD level this
//! machine has, over blocks of all three tiers packed as the store packs them, against a
//! plain attention (in f64) over the values those blocks hold: block boundaries, partly
//! filled last blocks, prefill and decode rows, FP16 blocks with a range scale, 32- and
//! 64-bit words. The blocks decode exactly, so the two differ only in summation order.

use fornax_cpu::attention::{paged_attention_at, AttentionDims, SeqRows, TierRows, Words};
use fornax_cpu::SimdLevel;
use rand::{rngs::StdRng, Rng, SeedableRng};

use super::pack::{decode_f16, decode_i8, encode_f16, encode_i8, f16_scale, i8_scale};
use super::{Tier, BLOCK_TOKENS};

/// Slots per tier arena.
const SLOTS: usize = 24;

/// Three tier arenas and, per table entry, what its block holds once decoded.
struct Arenas {
    dims: AttentionDims,
    f32_rows: Vec<f32>,
    f16_rows: Vec<u32>,
    f16_scales: Vec<f32>,
    i8_rows: Vec<u32>,
    i8_scales: Vec<f32>,
    next_slot: [usize; 3],
}

/// A sequence's table and its keys and values as stored: `[tokens, n_kv_heads * head_dim]`.
struct Seq {
    table: Vec<u32>,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl Arenas {
    fn new(dims: AttentionDims) -> Self {
        let (rows, n_kv, hd) = (SLOTS * BLOCK_TOKENS, dims.n_kv_heads, dims.head_dim);
        Self {
            dims,
            f32_rows: vec![0.0; rows * n_kv * hd],
            f16_rows: vec![0; rows * n_kv * Tier::F16.words(hd)],
            f16_scales: vec![0.0; SLOTS * n_kv],
            i8_rows: vec![0; rows * n_kv * Tier::I8.words(hd)],
            i8_scales: vec![0.0; SLOTS * n_kv],
            next_slot: [0; 3],
        }
    }

    /// Stores `tokens` random rows with block `b` in `tiers[b]`, slots taken from the top
    /// down so tables are not in slot order; `big` bounds the first block's values (beyond
    /// FP16's range: a scale other than 1), 2 the others'. Returns the table and the rows
    /// as stored.
    fn sequence(
        &mut self,
        rng: &mut StdRng,
        tokens: usize,
        tiers: &[Tier],
        big: f32,
    ) -> (Vec<u32>, Vec<f32>) {
        let width = self.dims.n_kv_heads * self.dims.head_dim;
        let (mut table, mut held) = (Vec::new(), Vec::new());
        for (b, &tier) in tiers.iter().enumerate() {
            let n = (tokens - b * BLOCK_TOKENS).min(BLOCK_TOKENS);
            let bound = if b == 0 { big } else { 2.0 };
            let rows: Vec<f32> = (0..n * width)
                .map(|_| rng.random_range(-bound..bound))
                .collect();
            let slot = SLOTS - 1 - self.next_slot[tier.index()];
            self.next_slot[tier.index()] += 1;
            held.extend(self.put(tier, slot, &rows, n));
            table.push(tier.entry(slot as u32));
        }
        (table, held)
    }

    /// Packs `n` rows of `values` into `slot` of `tier` as the store does (one scale per
    /// block and KV head); returns the values the block holds once decoded.
    fn put(&mut self, tier: Tier, slot: usize, values: &[f32], n: usize) -> Vec<f32> {
        let (n_kv, hd) = (self.dims.n_kv_heads, self.dims.head_dim);
        let width = n_kv * hd;
        let mut held = vec![0.0f32; n * width];
        for g in 0..n_kv {
            let head: Vec<f32> = (0..n)
                .flat_map(|t| values[t * width + g * hd..][..hd].to_vec())
                .collect();
            let (scale, decoded) = match tier {
                Tier::F32 => (1.0, head.clone()),
                Tier::F16 => {
                    let s = f16_scale(&head);
                    (s, decode_f16(&encode_f16(&head, s), s))
                }
                Tier::I8 => {
                    let s = i8_scale(&head);
                    (s, decode_i8(&encode_i8(&head, s), s))
                }
            };
            let words = tier.words(hd);
            for t in 0..n {
                let row = (slot * BLOCK_TOKENS + t) * n_kv + g;
                let own = &head[t * hd..][..hd];
                held[t * width + g * hd..][..hd].copy_from_slice(&decoded[t * hd..][..hd]);
                match tier {
                    Tier::F32 => self.f32_rows[row * hd..][..hd].copy_from_slice(own),
                    Tier::F16 => self.f16_rows[row * words..][..words]
                        .copy_from_slice(&encode_f16(own, scale)),
                    Tier::I8 => {
                        self.i8_rows[row * words..][..words].copy_from_slice(&encode_i8(own, scale))
                    }
                }
            }
            match tier {
                Tier::F32 => {}
                Tier::F16 => self.f16_scales[slot * n_kv + g] = scale,
                Tier::I8 => self.i8_scales[slot * n_kv + g] = scale,
            }
        }
        held
    }
}

/// Plain causal attention in f64 over decoded keys and values, each query seeing the
/// last `dims.window` keys where given: `[rows, n_heads * hd]`.
fn plain(q: &[f32], seq: &Seq, start: usize, rows: usize, dims: AttentionDims) -> Vec<f32> {
    let (hd, n_kv) = (dims.head_dim, dims.n_kv_heads);
    let group = dims.n_heads / n_kv;
    let width = n_kv * hd;
    let scale = (hd as f64).powf(-0.5);
    let mut out = vec![0.0f32; rows * dims.n_heads * hd];
    for r in 0..rows {
        for h in 0..dims.n_heads {
            let g = h / group;
            let query = &q[(r * dims.n_heads + h) * hd..][..hd];
            let first = dims.window.map_or(0, |w| (start + r + 1).saturating_sub(w));
            let scores: Vec<f64> = (first..=start + r)
                .map(|t| {
                    let key = &seq.keys[t * width + g * hd..][..hd];
                    let dot: f64 = query
                        .iter()
                        .zip(key)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum();
                    dot * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f64::MIN, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..hd {
                let v: f64 = e
                    .iter()
                    .enumerate()
                    .map(|(t, p)| p * seq.values[(first + t) * width + g * hd + d] as f64)
                    .sum();
                out[(r * dims.n_heads + h) * hd + d] = (v / sum) as f32;
            }
        }
    }
    out
}

/// One case: sequences of `lengths` (cached + new) with `rows` new rows each, their blocks
/// in the tiers `tier_of(block, blocks)` gives, at every SIMD level.
fn check(
    dims: AttentionDims,
    lengths: &[usize],
    rows: usize,
    tier_of: impl Fn(usize, usize) -> Tier,
    wide_words: bool,
) {
    let mut rng = StdRng::seed_from_u64(lengths.iter().sum::<usize>() as u64 + rows as u64);
    // Keys and values in separate arenas, as the store keeps them.
    let mut key_arenas = Arenas::new(dims);
    let mut value_arenas = Arenas::new(dims);
    let mut seqs = Vec::new();
    for (i, &len) in lengths.iter().enumerate() {
        let blocks = len.div_ceil(BLOCK_TOKENS);
        let tiers: Vec<Tier> = (0..blocks).map(|b| tier_of(b, blocks)).collect();
        // Outliers in the first sequence's values only: keys that large would make the
        // softmax a step function.
        let big = if i == 0 { 1.0e5 } else { 2.0 };
        let (table, keys) = key_arenas.sequence(&mut rng, len, &tiers, 2.0);
        let (values_table, values) = value_arenas.sequence(&mut rng, len, &tiers, big);
        assert_eq!(table, values_table);
        seqs.push(Seq {
            table,
            keys,
            values,
        });
    }
    let width = dims.n_heads * dims.head_dim;
    let q: Vec<f32> = (0..lengths.len() * rows * width)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let expected: Vec<f32> = seqs
        .iter()
        .zip(lengths)
        .enumerate()
        .flat_map(|(i, (s, &len))| {
            plain(
                &q[i * rows * width..][..rows * width],
                s,
                len - rows,
                rows,
                dims,
            )
        })
        .collect();
    let wide = |w: &[u32]| w.iter().map(|&x| x as i64).collect::<Vec<i64>>();
    let narrow = |w: &[u32]| w.iter().map(|&x| x as i32).collect::<Vec<i32>>();
    let words = [
        (wide(&key_arenas.f16_rows), narrow(&key_arenas.f16_rows)),
        (wide(&key_arenas.i8_rows), narrow(&key_arenas.i8_rows)),
        (wide(&value_arenas.f16_rows), narrow(&value_arenas.f16_rows)),
        (wide(&value_arenas.i8_rows), narrow(&value_arenas.i8_rows)),
    ];
    let pick = |i: usize| match wide_words {
        true => Words::I64(&words[i].0),
        false => Words::I32(&words[i].1),
    };
    fn tier_rows<'a>(a: &'a Arenas, f16_rows: Words<'a>, i8_rows: Words<'a>) -> TierRows<'a> {
        TierRows {
            f32_rows: &a.f32_rows,
            f16_rows,
            f16_scales: &a.f16_scales,
            i8_rows,
            i8_scales: &a.i8_scales,
        }
    }
    let keys = tier_rows(&key_arenas, pick(0), pick(1));
    let values = tier_rows(&value_arenas, pick(2), pick(3));
    let seq_rows: Vec<SeqRows> = seqs
        .iter()
        .zip(lengths)
        .enumerate()
        .map(|(i, (s, &len))| SeqRows {
            row_start: i * rows,
            rows,
            start: len - rows,
            table: &s.table,
        })
        .collect();
    for level in SimdLevel::available() {
        let got = paged_attention_at(level, &q, &keys, &values, &seq_rows, dims);
        // Error relative to the size of the values each output is a mean of.
        let worst = got
            .chunks(rows * width)
            .zip(expected.chunks(rows * width))
            .zip(&seqs)
            .flat_map(|((got, expected), s)| {
                let size = s.values.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                got.iter()
                    .zip(expected)
                    .map(move |(a, b)| (a - b).abs() / size)
            })
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 2e-5,
            "{}: lengths {lengths:?}, {rows} rows, head_dim {}: off by {worst:e}",
            level.name(),
            dims.head_dim
        );
    }
}

const SMOLLM2: AttentionDims = AttentionDims {
    n_heads: 9,
    n_kv_heads: 3,
    head_dim: 64,
    window: None,
};

/// Every block of a sequence in one tier in turn, and the three mixed as the pool ages
/// them (oldest INT8, then FP16, newest FP32), over lengths on each side of a block edge.
#[test]
fn every_tier_at_every_level_matches_plain_attention() {
    let lengths = [1, 31, 32, 33, 64, 65, 97, 130];
    let aged = |b: usize, blocks: usize| match blocks - b {
        1 => Tier::F32,
        2 | 3 => Tier::F16,
        _ => Tier::I8,
    };
    for rows in [1, 5] {
        let lengths: Vec<usize> = lengths.iter().map(|&n| n.max(rows)).collect();
        for tier in Tier::ALL {
            check(SMOLLM2, &lengths[..6], rows, |_, _| tier, false);
        }
        check(SMOLLM2, &lengths, rows, aged, rows == 1);
    }
}

/// Partly filled blocks in the FP16 and INT8 tiers too (the pool converts full blocks
/// only, the kernels must not care), and head sizes the AVX2 products do not take (not a
/// multiple of 8) or take in several pieces (256, Gemma 3's).
#[test]
fn partial_blocks_and_other_head_sizes_match_plain_attention() {
    let alternate = |b: usize, _| [Tier::F16, Tier::I8, Tier::F32][b % 3];
    check(SMOLLM2, &[17, 40, 75], 3, alternate, true);
    for (n_heads, n_kv_heads, head_dim) in [(4, 1, 256), (4, 2, 12), (2, 2, 8)] {
        let dims = AttentionDims {
            n_heads,
            n_kv_heads,
            head_dim,
            window: None,
        };
        check(dims, &[1, 33, 70], 1, alternate, false);
        check(dims, &[9, 70], 4, alternate, true);
    }
}

/// A sliding window (Gemma 3's layers): each query sees only its last `window` keys, in
/// decode and prefill rows (more than one chunk of them), the window's edge inside a
/// block and on one, over every tier.
#[test]
fn windowed_attention_sees_only_the_last_keys() {
    let aged = |b: usize, blocks: usize| match blocks - b {
        1 => Tier::F32,
        2 => Tier::F16,
        _ => Tier::I8,
    };
    for window in [1, 32, 45] {
        let gemma = AttentionDims {
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 256,
            window: Some(window),
        };
        let smollm2 = AttentionDims {
            window: Some(window),
            ..SMOLLM2
        };
        for dims in [gemma, smollm2] {
            check(dims, &[1, 31, 46, 97, 130], 1, aged, false);
            check(dims, &[70, 150], 70, aged, true);
        }
    }
}
