//! The burn tensor path for attention over the paged cache: gathers each sequence's keys
//! and values, decodes the tiers with tensor ops and attends as the contiguous cache does.
//! It is the reference the kernels are tested against and the path of other backends.

use burn_tensor::{backend::Backend, DType, ElementConversion, Int, Tensor, TensorData};

use super::store::{block_rows, ids};
use super::{
    AttentionShape, LayerKv, PagedBatch, Tier, TierArena, BLOCK_TOKENS, SLOT_MASK, TIER_SHIFT,
};
use crate::model::attend;

/// Attention of `q` `[rows, n_heads * head_dim]` over the cache, one sequence at a time.
pub fn paged_attention<B: Backend>(
    q: Tensor<B, 2>,
    kv: &LayerKv<B>,
    batch: &PagedBatch<B>,
    shape: AttentionShape,
) -> Tensor<B, 2> {
    let hd = shape.head_dim;
    // In FP32, as the cache is, whatever the activations' float type.
    let dtype = q.dtype();
    let q = q.cast(DType::F32);
    let outs = batch
        .seqs
        .iter()
        .map(|s| {
            let q = q
                .clone()
                .narrow(0, s.row_start, s.rows)
                .reshape([s.rows, shape.n_heads, hd])
                .swap_dims(0, 1);
            let heads =
                |t: Tensor<B, 2>| t.reshape([s.total(), shape.n_kv_heads, hd]).swap_dims(0, 1);
            let k = heads(gather(&kv.keys, &s.table, s.total(), shape));
            let v = heads(gather(&kv.values, &s.table, s.total(), shape));
            attend(q, k, v, s.start, shape.window)
        })
        .collect();
    Tensor::cat(outs, 0).cast(dtype)
}

/// The first `len` tokens of the sequence with block table `table`, decoded to FP32,
/// `[len, n_kv * head_dim]`.
pub fn gather<B: Backend>(
    arena: &TierArena<B>,
    table: &[u32],
    len: usize,
    shape: AttentionShape,
) -> Tensor<B, 2> {
    let device = arena.f32_rows.get().device();
    let n_blocks = len.div_ceil(BLOCK_TOKENS);
    let mut parts = Vec::new();
    let mut order = Vec::new();
    for tier in Tier::ALL {
        let (blocks, slots): (Vec<usize>, Vec<u32>) = table[..n_blocks]
            .iter()
            .enumerate()
            .filter(|(_, &e)| e >> TIER_SHIFT == tier as u32)
            .map(|(i, &e)| (i, e & SLOT_MASK))
            .unzip();
        if blocks.is_empty() {
            continue;
        }
        order.extend(blocks);
        let rows = block_rows::<B>(&slots, &device);
        parts.push(match tier {
            Tier::F32 => arena.f32_rows.get().clone().select(0, rows),
            Tier::F16 => scaled(
                decode_f16(arena.f16_rows.get().clone().select(0, rows)),
                arena.f16_scales.get(),
                &slots,
                shape,
            ),
            Tier::I8 => scaled(
                decode_i8(arena.i8_rows.get().clone().select(0, rows)),
                arena.i8_scales.get(),
                &slots,
                shape,
            ),
        });
    }
    // Row `p` of the result is token `p`: find where its block landed in `parts`.
    let mut rank = vec![0usize; n_blocks];
    for (i, &b) in order.iter().enumerate() {
        rank[b] = i;
    }
    let perm: Vec<u32> = (0..len)
        .map(|p| (rank[p / BLOCK_TOKENS] * BLOCK_TOKENS + p % BLOCK_TOKENS) as u32)
        .collect();
    Tensor::cat(parts, 0).select(0, ids(&perm, &device))
}

/// Multiplies decoded rows `[blocks * 32, n_kv * hd]` by their (block, head) scale.
fn scaled<B: Backend>(
    values: Tensor<B, 2>,
    scales: &Tensor<B, 2>,
    slots: &[u32],
    shape: AttentionShape,
) -> Tensor<B, 2> {
    let rows = slots.len() * BLOCK_TOKENS;
    let slot_of_row: Vec<u32> = slots
        .iter()
        .flat_map(|&s| std::iter::repeat_n(s, BLOCK_TOKENS))
        .collect();
    let s = scales
        .clone()
        .select(0, ids(&slot_of_row, &values.device()))
        .reshape([rows, shape.n_kv_heads, 1]);
    (values.reshape([rows, shape.n_kv_heads, shape.head_dim]) * s)
        .reshape([rows, shape.n_kv_heads * shape.head_dim])
}

/// Words of two IEEE halves to `[rows, 2 * words]` floats (normals and subnormals exact).
fn decode_f16<B: Backend>(words: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    let [rows, width] = words.dims();
    let lo = words.clone().bitwise_and_scalar(int::<B>(0xffff));
    let hi = words
        .bitwise_right_shift_scalar(int::<B>(16))
        .bitwise_and_scalar(int::<B>(0xffff));
    let halves = Tensor::stack::<3>(vec![lo, hi], 2).reshape([rows * width * 2]);
    let device = halves.device();
    let exponent = halves
        .clone()
        .bitwise_right_shift_scalar(int::<B>(10))
        .bitwise_and_scalar(int::<B>(31));
    let mantissa = f32s(halves.clone().bitwise_and_scalar(int::<B>(1023)));
    let sign = f32s(
        halves
            .bitwise_right_shift_scalar(int::<B>(15))
            .bitwise_and_scalar(int::<B>(1)),
    );
    // value = (mantissa + implicit bit) * 2^(max(e, 1) - 25), tabled by exponent.
    let implicit: Vec<f32> = (0..32).map(|e| if e > 0 { 1024.0 } else { 0.0 }).collect();
    let power: Vec<f32> = (0..32).map(|e: i32| 2f32.powi(e.max(1) - 25)).collect();
    let table =
        |v: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(v, [32]), (&device, DType::F32));
    let implicit = table(implicit).select(0, exponent.clone());
    let power = table(power).select(0, exponent);
    let magnitude = (mantissa + implicit) * power;
    (magnitude * (sign * -2.0 + 1.0)).reshape([rows, width * 2])
}

/// Words of four signed bytes to `[rows, 4 * words]` floats.
fn decode_i8<B: Backend>(words: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    let [rows, width] = words.dims();
    let bytes: Vec<Tensor<B, 2, Int>> = (0..4)
        .map(|b| {
            words
                .clone()
                .bitwise_right_shift_scalar(int::<B>(8 * b))
                .bitwise_and_scalar(int::<B>(0xff))
        })
        .collect();
    let bytes: Tensor<B, 3, Int> = Tensor::stack(bytes, 2);
    let high: Tensor<B, 3, Int> = bytes.clone().bitwise_right_shift_scalar(int::<B>(7));
    (f32s(bytes) - f32s(high) * 256.0).reshape([rows, width * 4])
}

/// Small integers as FP32 (exact).
fn f32s<B: Backend, const D: usize>(t: Tensor<B, D, Int>) -> Tensor<B, D> {
    t.float().cast(DType::F32)
}

fn int<B: Backend>(v: i32) -> B::IntElem {
    v.elem()
}
