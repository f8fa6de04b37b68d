//! Attention speed over the paged arenas: one sequence of 160 cached tokens (SmolLM2's
//! 9 heads, 3 KV heads of 64), 1 and 4 new rows, FP32 and FP16 blocks, on the thread
//! pool. Microseconds per call. A benchmark, not a test.
use fornax_cpu::attention::{
    paged_attention, AttentionDims, SeqRows, TierRows, Words, BLOCK_TOKENS, TIER_SHIFT,
};
use std::time::Instant;

fn main() {
    let dims = AttentionDims {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        window: None,
    };
    let (hd, n_kv) = (dims.head_dim, dims.n_kv_heads);
    let slots = 8;
    let rows = slots * BLOCK_TOKENS;
    let f32_rows: Vec<f32> = (0..rows * n_kv * hd)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let f16_rows: Vec<i64> = (0..rows * n_kv * hd / 2)
        .map(|i| (0x3c00_3800 + (i % 1024) as i64) & 0xffff_ffff)
        .collect();
    let i8_rows: Vec<i64> = vec![0; rows * n_kv * hd / 4];
    let scales = vec![1.0f32; slots * n_kv];
    let tiers = TierRows {
        f32_rows: &f32_rows,
        f16_rows: Words::I64(&f16_rows),
        f16_scales: &scales,
        i8_rows: Words::I64(&i8_rows),
        i8_scales: &scales,
    };
    for tier in [0u32, 1] {
        let table: Vec<u32> = (0..slots as u32).map(|s| tier << TIER_SHIFT | s).collect();
        for new in [1usize, 4] {
            let start = 160;
            let q: Vec<f32> = (0..new * dims.n_heads * hd)
                .map(|i| (i % 13) as f32 / 13.0)
                .collect();
            let seqs = [SeqRows {
                row_start: 0,
                rows: new,
                start,
                table: &table,
            }];
            let n = 3000;
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                for _ in 0..n {
                    std::hint::black_box(paged_attention(&q, &tiers, &tiers, &seqs, dims));
                }
                best = best.min(t.elapsed().as_secs_f64() / n as f64);
            }
            let name = ["fp32", "fp16"][tier as usize];
            println!(
                "{name} blocks, {new} new rows: {:.1} us per call",
                best * 1e6
            );
        }
    }
}
