//! Attention over the paged KV cache, read where it lies: FP32 key and value rows are read
//! in their blocks, FP16 and INT8 rows decoded once per piece of work, with no gathered
//! copy of the sequence. Work is split over the thread pool by (sequence, KV head, chunk of
//! rows).
//!
//! The layout is the engine's (`fornax_engine::kv`): blocks of [`BLOCK_TOKENS`] rows, a
//! block-table entry `tier << TIER_SHIFT | slot`, arena row `slot * 32 + offset`, columns
//! `kv_head * words + i`; FP16 words hold two halves (even dimension low), INT8 words four
//! signed bytes (dimension `4 i + b` in byte `b`), each scaled by one FP32 per (slot, KV head).

use half::{f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

use crate::SimdLevel;

/// Tokens per block.
pub const BLOCK_TOKENS: usize = 32;
/// Bit position of the tier in a block-table entry.
pub const TIER_SHIFT: u32 = 28;
const SLOT_MASK: u32 = (1 << TIER_SHIFT) - 1;
/// Query rows per piece of work: bounds the scores buffer of a long prefill.
const ROW_CHUNK: usize = 64;

/// 32-bit words as the backend stores them (burn's integer tensors are `i32` or `i64`).
#[derive(Debug, Clone, Copy)]
pub enum Words<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl Words<'_> {
    fn at(&self, i: usize) -> u32 {
        match self {
            Words::I32(w) => w[i] as u32,
            Words::I64(w) => w[i] as u32,
        }
    }
}

/// The three tiers of one layer's keys (or values).
#[derive(Debug, Clone, Copy)]
pub struct TierRows<'a> {
    pub f32_rows: &'a [f32],
    pub f16_rows: Words<'a>,
    pub f16_scales: &'a [f32],
    pub i8_rows: Words<'a>,
    pub i8_scales: &'a [f32],
}

/// One sequence's part of the batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqRows<'a> {
    /// First row of the sequence in `q` and the output.
    pub row_start: usize,
    /// New rows (queries).
    pub rows: usize,
    /// Rows cached before them: query `i` sees keys `0..=start + i`.
    pub start: usize,
    /// Block-table entries covering `start + rows` keys.
    pub table: &'a [u32],
}

/// Heads, their size, and how far back a query sees.
#[derive(Debug, Clone, Copy)]
pub struct AttentionDims {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Keys a query sees, itself included (`None`: every earlier key).
    pub window: Option<usize>,
}

/// Where attention reads key (or value) `k` of KV head `g`.
trait Rows: Sync {
    /// Row `k` of KV head `g` where it lies, when it is stored as FP32 values.
    fn direct(&self, k: usize, g: usize, dims: AttentionDims) -> Option<&[f32]>;
    /// Row `k` of KV head `g`, decoded into `out` (`head_dim` values).
    fn decode(&self, k: usize, g: usize, dims: AttentionDims, out: &mut [f32]);
}

/// One sequence's rows in the paged arenas.
struct Paged<'a> {
    tiers: &'a TierRows<'a>,
    table: &'a [u32],
}

impl Rows for Paged<'_> {
    fn direct(&self, k: usize, g: usize, dims: AttentionDims) -> Option<&[f32]> {
        self.tiers.f32_row(self.table[k / BLOCK_TOKENS], k, g, dims)
    }

    fn decode(&self, k: usize, g: usize, dims: AttentionDims, out: &mut [f32]) {
        self.tiers
            .row(self.table[k / BLOCK_TOKENS], k, g, dims, out);
    }
}

/// One sequence's rows laid out `[n_kv_heads, total, head_dim]` (the contiguous cache).
struct HeadMajor<'a> {
    data: &'a [f32],
    total: usize,
}

impl Rows for HeadMajor<'_> {
    fn direct(&self, k: usize, g: usize, dims: AttentionDims) -> Option<&[f32]> {
        let hd = dims.head_dim;
        Some(&self.data[(g * self.total + k) * hd..][..hd])
    }

    fn decode(&self, k: usize, g: usize, dims: AttentionDims, out: &mut [f32]) {
        out.copy_from_slice(self.direct(k, g, dims).expect("always direct"));
    }
}

/// Rows `first..total` of KV head `g`: FP32 rows where they lie, the others decoded once
/// into `scratch`.
fn gather<'a>(
    rows: &'a impl Rows,
    keys: std::ops::Range<usize>,
    g: usize,
    dims: AttentionDims,
    scratch: &'a mut Vec<f32>,
) -> Vec<&'a [f32]> {
    let hd = dims.head_dim;
    let first = keys.start;
    let direct: Vec<Option<&[f32]>> = keys.map(|k| rows.direct(k, g, dims)).collect();
    let decoded = direct.iter().filter(|d| d.is_none()).count();
    scratch.clear();
    scratch.resize(decoded * hd, 0.0);
    let missing = direct.iter().enumerate().filter(|(_, d)| d.is_none());
    for ((k, _), out) in missing.zip(scratch.chunks_exact_mut(hd)) {
        rows.decode(first + k, g, dims, out);
    }
    let scratch: &'a Vec<f32> = scratch;
    let mut next = scratch.chunks_exact(hd);
    direct
        .into_iter()
        .map(|d| d.unwrap_or_else(|| next.next().expect("a decoded row")))
        .collect()
}

/// Halves converted on the stack at a time ([`TierRows::row`]).
const STACK_HALVES: usize = 256;

impl TierRows<'_> {
    /// Key `k` of KV head `g` (table entry `entry`) where it lies, if its block is FP32.
    fn f32_row(&self, entry: u32, k: usize, g: usize, dims: AttentionDims) -> Option<&[f32]> {
        (entry >> TIER_SHIFT == 0).then(|| {
            let row = (entry & SLOT_MASK) as usize * BLOCK_TOKENS + k % BLOCK_TOKENS;
            let hd = dims.head_dim;
            &self.f32_rows[(row * dims.n_kv_heads + g) * hd..][..hd]
        })
    }

    /// Key `k` of KV head `g` (table entry `entry`) decoded into `out` (`head_dim` values).
    fn row(&self, entry: u32, k: usize, g: usize, dims: AttentionDims, out: &mut [f32]) {
        if let Some(values) = self.f32_row(entry, k, g, dims) {
            out.copy_from_slice(values);
            return;
        }
        let (hd, n_kv) = (dims.head_dim, dims.n_kv_heads);
        let slot = (entry & SLOT_MASK) as usize;
        let row = slot * BLOCK_TOKENS + k % BLOCK_TOKENS;
        match entry >> TIER_SHIFT {
            1 => {
                let base = (row * n_kv + g) * (hd / 2);
                let scale = self.f16_scales[slot * n_kv + g];
                // Through the slice conversion (F16C where the CPU has it), a stackful of
                // halves at a time.
                let mut halves = [f16::ZERO; STACK_HALVES];
                for (c, part) in out.chunks_mut(STACK_HALVES).enumerate() {
                    let first = base + c * STACK_HALVES / 2;
                    for (i, pair) in halves[..part.len()].chunks_exact_mut(2).enumerate() {
                        let w = self.f16_rows.at(first + i);
                        pair[0] = f16::from_bits(w as u16);
                        pair[1] = f16::from_bits((w >> 16) as u16);
                    }
                    halves[..part.len()].convert_to_f32_slice(part);
                    part.iter_mut().for_each(|v| *v *= scale);
                }
            }
            _ => {
                let words = hd / 4;
                let base = (row * n_kv + g) * words;
                let scale = self.i8_scales[slot * n_kv + g];
                for (i, four) in out.chunks_exact_mut(4).enumerate() {
                    let w = self.i8_rows.at(base + i);
                    for (b, v) in four.iter_mut().enumerate() {
                        *v = f32::from((w >> (8 * b)) as u8 as i8) * scale;
                    }
                }
            }
        }
    }
}

/// Attention of `q` (`[rows, n_heads * head_dim]`, RoPE applied) over the cache for every
/// sequence: `[rows, n_heads * head_dim]`. Query head `h` reads KV head
/// `h / (n_heads / n_kv_heads)`.
pub fn paged_attention(
    q: &[f32],
    keys: &TierRows<'_>,
    values: &TierRows<'_>,
    seqs: &[SeqRows<'_>],
    dims: AttentionDims,
) -> Vec<f32> {
    paged_attention_at(SimdLevel::best(), q, keys, values, seqs, dims)
}

/// [`paged_attention`] with the products of `level` (AVX2's for both x86 levels; plain
/// Rust for the others, or where `level` is not available): every level gives the same
/// values up to summation order.
pub fn paged_attention_at(
    level: SimdLevel,
    q: &[f32],
    keys: &TierRows<'_>,
    values: &TierRows<'_>,
    seqs: &[SeqRows<'_>],
    dims: AttentionDims,
) -> Vec<f32> {
    let width = dims.n_heads * dims.head_dim;
    let rows: usize = seqs.iter().map(|s| s.rows).sum();
    assert_eq!(q.len(), rows * width, "q is [rows, n_heads * head_dim]");
    let work: Vec<(usize, usize, usize)> = seqs
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            (0..dims.n_kv_heads)
                .flat_map(move |g| (0..s.rows).step_by(ROW_CHUNK).map(move |r0| (i, g, r0)))
        })
        .collect();
    let parts: Vec<Vec<f32>> = work
        .par_iter()
        .map(|&(i, g, r0)| {
            let s = &seqs[i];
            let (k, v) = (
                Paged {
                    tiers: keys,
                    table: s.table,
                },
                Paged {
                    tiers: values,
                    table: s.table,
                },
            );
            attend(level, q, &k, &v, s, g, r0, dims)
        })
        .collect();
    let placed = work
        .iter()
        .map(|&(i, g, r0)| (seqs[i].row_start + r0, g))
        .zip(&parts);
    assemble(rows, dims, placed)
}

/// The output `[rows, n_heads * head_dim]` from the pieces: each holds the query heads of
/// KV head `g` for rows from `first`.
fn assemble<'p>(
    rows: usize,
    dims: AttentionDims,
    pieces: impl Iterator<Item = ((usize, usize), &'p Vec<f32>)>,
) -> Vec<f32> {
    let width = dims.n_heads * dims.head_dim;
    let heads = dims.n_heads / dims.n_kv_heads * dims.head_dim;
    let mut out = vec![0.0f32; rows * width];
    for ((first, g), part) in pieces {
        for (r, chunk) in part.chunks_exact(heads).enumerate() {
            let at = (first + r) * width + g * heads;
            out[at..at + heads].copy_from_slice(chunk);
        }
    }
    out
}

/// Attention of `q` (`[rows, n_heads * head_dim]`, the first row at position `start`) over
/// one sequence's contiguous keys and values (`[n_kv_heads, start + rows, head_dim]`): the
/// same arithmetic in the same order as [`paged_attention`], so both caches give
/// identical results.
pub fn contiguous_attention(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    start: usize,
    dims: AttentionDims,
) -> Vec<f32> {
    let width = dims.n_heads * dims.head_dim;
    let rows = q.len() / width;
    let total = start + rows;
    assert_eq!(keys.len(), dims.n_kv_heads * total * dims.head_dim, "keys");
    assert_eq!(values.len(), keys.len(), "values");
    let seq = SeqRows {
        row_start: 0,
        rows,
        start,
        table: &[],
    };
    let (k, v) = (
        HeadMajor { data: keys, total },
        HeadMajor {
            data: values,
            total,
        },
    );
    let level = SimdLevel::best();
    let work: Vec<(usize, usize)> = (0..dims.n_kv_heads)
        .flat_map(|g| (0..rows).step_by(ROW_CHUNK).map(move |r0| (g, r0)))
        .collect();
    let parts: Vec<Vec<f32>> = work
        .par_iter()
        .map(|&(g, r0)| attend(level, q, &k, &v, &seq, g, r0, dims))
        .collect();
    assemble(rows, dims, work.iter().map(|&(g, r0)| (r0, g)).zip(&parts))
}

/// Keys scored together: one query against four keys runs four independent sums.
const KEYS: usize = 4;

/// Value rows a weighted sum takes for every query head of a group before the next run
/// (16 KB of rows of 256 values: they stay in L1 across the heads).
const VALUES: usize = 16;

/// The two products attention is made of, per instruction set. Every key's score goes
/// through [`Products::dot4`] (the rows padded to a multiple of [`KEYS`]), so a score
/// does not depend on which other keys it was computed with.
trait Products {
    /// `q · k_j` for the four rows `keys` (`q.len()` values each).
    fn dot4(q: &[f32], keys: [&[f32]; KEYS]) -> [f32; KEYS];
    /// `out = sum_k p[k] * values[k]` over rows of `out.len()` values; with `more`, the
    /// sum goes on from what `out` holds (a later run of keys: each value still sums its
    /// products in key order).
    fn weighted_sum(p: &[f32], values: &[&[f32]], out: &mut [f32], more: bool);
    /// The scores replaced by their softmax.
    fn softmax(scores: &mut [f32]);
}

/// Plain Rust.
struct Portable;

impl Products for Portable {
    fn dot4(q: &[f32], keys: [&[f32]; KEYS]) -> [f32; KEYS] {
        keys.map(|k| q.iter().zip(k).map(|(a, b)| a * b).sum())
    }

    fn weighted_sum(p: &[f32], values: &[&[f32]], out: &mut [f32], more: bool) {
        if !more {
            out.fill(0.0);
        }
        for (&p, v) in p.iter().zip(values) {
            for (o, v) in out.iter_mut().zip(v.iter()) {
                *o += p * v;
            }
        }
    }

    fn softmax(scores: &mut [f32]) {
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for v in scores.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in scores.iter_mut() {
            *v *= inv;
        }
    }
}

/// AVX2 and FMA, for rows of a multiple of 8 values.
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Products for Avx2 {
    #[inline(always)]
    fn dot4(q: &[f32], keys: [&[f32]; KEYS]) -> [f32; KEYS] {
        // SAFETY: only called from `attend_avx2`, which runs where AVX2 and FMA are.
        unsafe { avx2::dot4(q, keys) }
    }

    #[inline(always)]
    fn weighted_sum(p: &[f32], values: &[&[f32]], out: &mut [f32], more: bool) {
        // SAFETY: as above.
        unsafe { avx2::weighted_sum(p, values, out, more) }
    }

    #[inline(always)]
    fn softmax(scores: &mut [f32]) {
        // SAFETY: as above.
        unsafe { avx2::softmax(scores) }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::KEYS;

    /// Sum of the eight lanes.
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// See [`super::Products::dot4`]; `q.len()` a multiple of 8.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot4(q: &[f32], keys: [&[f32]; KEYS]) -> [f32; KEYS] {
        let hd = q.len();
        assert!(hd.is_multiple_of(8) && keys.iter().all(|k| k.len() >= hd));
        let mut acc = [_mm256_setzero_ps(); KEYS];
        let (qp, kp) = (q.as_ptr(), keys.map(|k| k.as_ptr()));
        for i in (0..hd).step_by(8) {
            // SAFETY: i + 8 <= hd, and each key holds hd values (checked above).
            unsafe {
                let qv = _mm256_loadu_ps(qp.add(i));
                for (a, k) in acc.iter_mut().zip(kp) {
                    *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.add(i)), *a);
                }
            }
        }
        acc.map(|a| hsum(a))
    }

    /// See [`super::Products::weighted_sum`]; `out.len()` a multiple of 8. The output is
    /// held in registers 64 values at a time (then 8 at a time for the rest); each value
    /// sums its products in key order either way.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn weighted_sum(p: &[f32], values: &[&[f32]], out: &mut [f32], more: bool) {
        const REGS: usize = 8;
        let hd = out.len();
        assert!(
            hd.is_multiple_of(8)
                && values.len() >= p.len()
                && values[..p.len()].iter().all(|v| v.len() >= hd)
        );
        let full = hd / (8 * REGS) * 8 * REGS;
        for c in (0..full).step_by(8 * REGS) {
            // SAFETY: c + 8 REGS <= hd.
            unsafe { columns::<REGS>(p, values, c, out, more) };
        }
        for c in (full..hd).step_by(8) {
            // SAFETY: c + 8 <= hd.
            unsafe { columns::<1>(p, values, c, out, more) };
        }
    }

    /// See [`super::Products::softmax`]: eight scores at a time (the last ones padded).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn softmax(scores: &mut [f32]) {
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_ps();
        for chunk in scores.chunks_mut(8) {
            let mut lanes = [max; 8];
            lanes[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: eight values in `lanes`.
            let e = crate::exp::avx2::exp8(_mm256_sub_ps(
                unsafe { _mm256_loadu_ps(lanes.as_ptr()) },
                m,
            ));
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), e) };
            chunk.copy_from_slice(&lanes[..chunk.len()]);
            // Padding lanes (e^0) do not count.
            let keep = _mm256_cmpgt_epi32(
                _mm256_set1_epi32(chunk.len() as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(keep)));
        }
        let inv = 1.0 / hsum(sum);
        for v in scores.iter_mut() {
            *v *= inv;
        }
    }

    /// Columns `c..c + 8 R` of the weighted sum, in `R` registers.
    ///
    /// # Safety
    /// AVX2 and FMA; `c + 8 R` within `out` and every row of `values`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn columns<const R: usize>(
        p: &[f32],
        values: &[&[f32]],
        c: usize,
        out: &mut [f32],
        more: bool,
    ) {
        let mut acc = [_mm256_setzero_ps(); R];
        if more {
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: as the caller guarantees.
                *a = unsafe { _mm256_loadu_ps(out.as_ptr().add(c + 8 * r)) };
            }
        }
        for (&w, row) in p.iter().zip(values) {
            let w = _mm256_set1_ps(w);
            let vp = row.as_ptr();
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: as the caller guarantees.
                let v = unsafe { _mm256_loadu_ps(vp.add(c + 8 * r)) };
                *a = _mm256_fmadd_ps(w, v, *a);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            // SAFETY: as above, within `out`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c + 8 * r), *a) };
        }
    }
}

/// Rows `r0..` (at most [`ROW_CHUNK`]) of sequence `s`, the query heads of KV head `g`:
/// `[rows, group * head_dim]`, with AVX2 at the x86 levels where the CPU has it.
#[allow(clippy::too_many_arguments)]
fn attend(
    level: SimdLevel,
    q: &[f32],
    keys: &impl Rows,
    values: &impl Rows,
    s: &SeqRows<'_>,
    g: usize,
    r0: usize,
    dims: AttentionDims,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if dims.head_dim.is_multiple_of(8)
        && matches!(level, SimdLevel::Avx2 | SimdLevel::Avx512Vnni)
        && level.is_available()
    {
        // SAFETY: the CPU has AVX2 and FMA (both x86 levels include them).
        return unsafe { attend_avx2(q, keys, values, s, g, r0, dims) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    attend_with::<Portable>(q, keys, values, s, g, r0, dims)
}

/// [`attend_with`] compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(
    q: &[f32],
    keys: &impl Rows,
    values: &impl Rows,
    s: &SeqRows<'_>,
    g: usize,
    r0: usize,
    dims: AttentionDims,
) -> Vec<f32> {
    attend_with::<Avx2>(q, keys, values, s, g, r0, dims)
}

/// The body of [`attend`]: the piece's FP32 key and value rows read where they lie and the
/// others decoded once ([`gather`]), then per query its scores, their softmax and the
/// weighted sum of values.
#[inline(always)]
fn attend_with<P: Products>(
    q: &[f32],
    keys: &impl Rows,
    values: &impl Rows,
    s: &SeqRows<'_>,
    g: usize,
    r0: usize,
    dims: AttentionDims,
) -> Vec<f32> {
    let hd = dims.head_dim;
    let group = dims.n_heads / dims.n_kv_heads;
    let width = dims.n_heads * hd;
    let nr = (s.rows - r0).min(ROW_CHUNK);
    let total = s.start + r0 + nr;
    let scale = (hd as f32).powf(-0.5);
    // Query row i sees keys `seen(i)`: up to its own, the last `window` of them.
    let seen = |i: usize| {
        let end = s.start + r0 + i + 1;
        dims.window.map_or(0, |w| end.saturating_sub(w))..end
    };
    // The piece's rows from the first any query sees: FP32 rows read where they lie, the
    // others decoded once; keys padded with zero rows to a multiple of KEYS.
    let first = seen(0).start;
    let (mut k_scratch, mut v_scratch) = (Vec::new(), Vec::new());
    let zero = vec![0.0f32; hd];
    let mut k_rows = gather(keys, first..total, g, dims, &mut k_scratch);
    k_rows.resize((total - first).next_multiple_of(KEYS), &zero);
    let v_rows = gather(values, first..total, g, dims, &mut v_scratch);
    let mut out = vec![0.0f32; nr * group * hd];
    let stride = (total - first).next_multiple_of(KEYS);
    let mut scores = vec![0.0f32; group * stride];
    for i in 0..nr {
        let sees = seen(i);
        let (lo, hi) = (sees.start - first, sees.end - first);
        // Scores in runs of KEYS from the piece's first key, so that a key's score does
        // not depend on the row that asked for it. Every query head of the group takes
        // each run of keys in turn while they are in the nearest cache.
        let from = lo - lo % KEYS;
        let row = &q[(s.row_start + r0 + i) * width + g * group * hd..][..group * hd];
        for at in (from..hi.next_multiple_of(KEYS)).step_by(KEYS) {
            let run: [&[f32]; KEYS] = std::array::from_fn(|j| k_rows[at + j]);
            for (query, sc) in row.chunks_exact(hd).zip(scores.chunks_exact_mut(stride)) {
                let four = P::dot4(query, run);
                for (s, v) in sc[at..at + KEYS].iter_mut().zip(four) {
                    *s = v * scale;
                }
            }
        }
        for sc in scores.chunks_exact_mut(stride) {
            P::softmax(&mut sc[lo..hi]);
        }
        // The weighted sums in runs of VALUES keys, each run read once for every head.
        let o = &mut out[i * group * hd..][..group * hd];
        for start in (lo..hi).step_by(VALUES) {
            let end = (start + VALUES).min(hi);
            for (oh, sc) in o.chunks_exact_mut(hd).zip(scores.chunks_exact(stride)) {
                P::weighted_sum(&sc[start..end], &v_rows[start..end], oh, start > lo);
            }
        }
    }
    out
}
