//! The paged-attention kernels (CubeCL, on wgpu: lavapipe here; and the CPU backend's
//! attention over the blocks in place) against the burn reference path on random data, and
//! both against plain FP32 attention over the unquantized keys.
//!
//! Tolerances. Kernel vs reference: both read the same stored blocks and decode each tier
//! exactly, so they differ only in summation order: 2e-5 absolute on outputs of size ~1.
//! Against FP32 attention over the original values the tier's rounding adds: FP16 has a
//! relative error <= 2^-11 per value, which moves an output (a convex combination of values
//! in [-2, 2], with scores perturbed by <= |q||k| 2^-11) by well under 5e-3; INT8 steps of
//! max/127 give up to 6e-2.

use crate::common::run_on;
use burn_tensor::{Distribution, Tensor};
use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::kv::{
    reference, AttentionShape, KvCapacity, KvDims, PagedBatch, PagedKv, SeqId, Tier, TierPolicy,
};
use fornax_engine::EngineBackend;
use fornax_shaders::launch::DecodeKernel;

const N_KV: usize = 3;
const GROUP: usize = 3;
const HD: usize = 64;

const SHAPE: AttentionShape = AttentionShape {
    n_heads: N_KV * GROUP,
    n_kv_heads: N_KV,
    head_dim: HD,
    max_blocks: 0,
    window: None,
};

/// One sequence filled with random keys and values, kept on the host as well.
struct Filled {
    seq: SeqId,
    keys: Vec<f32>,
    values: Vec<f32>,
}

fn random<B: EngineBackend>(rows: usize, width: usize, device: &B::Device) -> Tensor<B, 2> {
    Tensor::random([rows, width], Distribution::Uniform(-2.0, 2.0), device)
}

fn host<B: EngineBackend>(t: &Tensor<B, 2>) -> Vec<f32> {
    t.clone().into_data().convert::<f32>().into_vec().unwrap()
}

/// Writes `n` random tokens after what `seq` holds (as the model does: prepare, write,
/// commit) and returns them.
fn append<B: EngineBackend>(
    kv: &mut PagedKv<B>,
    seq: SeqId,
    n: usize,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let device = kv.store.device().clone();
    let batch = kv.prepare(&[(seq, n)]).unwrap();
    let k = random::<B>(n, N_KV * HD, &device);
    let v = random::<B>(n, N_KV * HD, &device);
    kv.store
        .write(0, batch.write_rows.clone(), k.clone(), v.clone());
    kv.commit(&[(seq, n)]).unwrap();
    (k, v)
}

fn fill<B: EngineBackend>(kv: &mut PagedKv<B>, len: usize) -> Filled {
    let seq = kv.add_sequence();
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    // In steps of 100 so blocks age (and convert) while the sequence grows.
    let mut done = 0;
    while done < len {
        let n = (len - done).min(100);
        let (k, v) = append(kv, seq, n);
        keys.extend(host(&k));
        values.extend(host(&v));
        done += n;
    }
    Filled { seq, keys, values }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Plain FP32 attention of one row's query at position `pos` over the original values.
fn exact_row(q: &[f32], keys: &[f32], values: &[f32], first: usize, pos: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; N_KV * GROUP * HD];
    let scale = (HD as f32).powf(-0.5);
    for h in 0..N_KV * GROUP {
        let kvh = h / GROUP;
        let scores: Vec<f32> = (first..=pos)
            .map(|t| {
                (0..HD)
                    .map(|d| q[h * HD + d] * keys[t * N_KV * HD + kvh * HD + d])
                    .sum::<f32>()
                    * scale
            })
            .collect();
        let m = scores.iter().copied().fold(f32::MIN, f32::max);
        let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
        let sum: f32 = e.iter().sum();
        for (t, p) in (first..=pos).zip(&e) {
            for d in 0..HD {
                out[h * HD + d] += p / sum * values[t * N_KV * HD + kvh * HD + d];
            }
        }
    }
    out
}

/// Runs `batch` (prepared, keys written) through the kernel and the reference path.
fn both<B: EngineBackend>(
    kv: &PagedKv<B>,
    batch: &mut PagedBatch<B>,
    q: Tensor<B, 2>,
    shape: AttentionShape,
) -> (Vec<f32>, Vec<f32>) {
    let layer = kv.store.layer(0);
    batch.kernels = true;
    let kernel = B::paged_attention(q.clone(), layer, batch, shape);
    let reference = reference::paged_attention(q, layer, batch, shape);
    (host(&kernel), host(&reference))
}

struct KernelCheck {
    backend: BackendKind,
    policy: TierPolicy,
    lengths: Vec<usize>,
    /// Largest allowed difference from FP32 attention over the original values.
    tier_tolerance: f32,
    /// New query rows per sequence (1: the decode kernel).
    rows: usize,
    /// Run single-row batches through the prefill kernel too.
    force_prefill: bool,
    /// Trim each sequence to its first block and newest `window` tokens first (the
    /// elastic window): new rows then sit at positions past their cache rows.
    window: Option<usize>,
    /// Each query sees only the newest this many keys (a sliding-window layer).
    attention_window: Option<usize>,
}

/// Drops from `f`'s host copy the tokens its trimmed sequence no longer holds.
fn trim_host<B: EngineBackend>(kv: &mut PagedKv<B>, f: &mut Filled, window: usize) {
    let width = N_KV * HD;
    let len = f.keys.len() / width;
    kv.trim_window(f.seq, 1, window).unwrap();
    let dropped = len - kv.pool.stored(f.seq).unwrap();
    let gone = 32 * width..(32 + dropped) * width;
    if dropped > 0 {
        f.keys.drain(gone.clone());
        f.values.drain(gone);
    }
}

impl BackendTask for KernelCheck {
    type Output = ();

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) {
        let dims = KvDims::dense(1, N_KV, HD);
        let capacity = KvCapacity::tiers([64, 64, 64]);
        let mut kv = PagedKv::<B>::new(dims, capacity, self.policy, &device);
        let mut filled: Vec<Filled> = self.lengths.iter().map(|&n| fill(&mut kv, n)).collect();
        if let Some(window) = self.window {
            for f in &mut filled {
                trim_host(&mut kv, f, window);
            }
            assert!(kv.stats().window_dropped_tokens > 0);
        }
        let tiers = kv.stats().blocks_used_by_tier;
        let shape = AttentionShape {
            window: self.attention_window,
            ..SHAPE
        };

        // New rows for every sequence in one dispatch: keys written first, as the model does.
        let parts: Vec<_> = filled.iter().map(|f| (f.seq, self.rows)).collect();
        let mut batch = kv.prepare(&parts).unwrap();
        let rows = parts.len() * self.rows;
        let k = random::<B>(rows, N_KV * HD, &device);
        let v = random::<B>(rows, N_KV * HD, &device);
        kv.store
            .write(0, batch.write_rows.clone(), k.clone(), v.clone());
        let q: Tensor<B, 2> = Tensor::random(
            [rows, N_KV * GROUP * HD],
            Distribution::Uniform(-1.0, 1.0),
            &device,
        );
        assert_eq!(batch.decode_only, self.rows == 1);
        if self.force_prefill {
            batch.decode_only = false;
        }
        // FP32-only batches may bind only the FP32 arenas (8 buffers, within WebGPU's limits).
        let only_f32 = tiers[Tier::F16.index()] == 0 && tiers[Tier::I8.index()] == 0;
        assert_eq!(batch.all_f32, only_f32, "{tiers:?}");
        // Decode batches on wgpu run both decode kernels, whichever this device would pick.
        let decode_kernels = if batch.decode_only && self.backend == BackendKind::Wgpu {
            vec![Some(DecodeKernel::Tiles), Some(DecodeKernel::UnitKeys)]
        } else {
            vec![None]
        };
        let (qh, kh, vh) = (host(&q), host(&k), host(&v));
        for decode_kernel in decode_kernels {
            batch.decode_kernel = decode_kernel;
            let (kernel, reference) = both(&kv, &mut batch, q.clone(), shape);
            let diff = max_diff(&kernel, &reference);
            if batch.all_f32 {
                // The kernels binding only the FP32 arenas (as in a browser): identical sums.
                batch.f32_bindings = true;
                let f32_only = host(&B::paged_attention(
                    q.clone(),
                    kv.store.layer(0),
                    &batch,
                    shape,
                ));
                batch.f32_bindings = false;
                assert_eq!(
                    max_diff(&kernel, &f32_only),
                    0.0,
                    "FP32-only vs tiered bindings"
                );
            }

            let width = N_KV * GROUP * HD;
            let mut tier_diff = 0.0f32;
            for (i, f) in filled.iter().enumerate() {
                let mut keys = f.keys.clone();
                let mut values = f.values.clone();
                let new = i * self.rows * N_KV * HD..(i + 1) * self.rows * N_KV * HD;
                keys.extend_from_slice(&kh[new.clone()]);
                values.extend_from_slice(&vh[new]);
                for r in 0..self.rows {
                    let row = i * self.rows + r;
                    let pos = f.keys.len() / (N_KV * HD) + r;
                    let first = self
                        .attention_window
                        .map_or(0, |w| (pos + 1).saturating_sub(w));
                    let q_row = &qh[row * width..(row + 1) * width];
                    let exact = exact_row(q_row, &keys, &values, first, pos);
                    tier_diff =
                        tier_diff.max(max_diff(&kernel[row * width..(row + 1) * width], &exact));
                }
            }
            eprintln!(
                "{}: lengths {:?} +{} rows, blocks per tier {:?}, {decode_kernel:?}: kernel vs reference {diff:.2e}, vs exact FP32 {tier_diff:.2e}",
                info.adapter, self.lengths, self.rows, tiers
            );
            assert!(diff <= 2e-5, "kernel vs reference: {diff}");
            assert!(
                tier_diff <= self.tier_tolerance,
                "vs exact FP32: {tier_diff}"
            );
        }
        // The tiers under test were really present.
        if self.policy.recent.is_some() {
            assert!(tiers[Tier::F16.index()] > 0, "{tiers:?}");
        }
        if self.policy.int8_after.is_some() {
            assert!(tiers[Tier::I8.index()] > 0, "{tiers:?}");
        }
    }
}

fn check(policy: TierPolicy, lengths: &[usize], rows: usize, tier_tolerance: f32) {
    run(policy, lengths, rows, tier_tolerance, false);
}

/// The CPU backend's attention over the blocks in place, on the same cases.
fn check_cpu(policy: TierPolicy, lengths: &[usize], rows: usize, tier_tolerance: f32) {
    run_check(KernelCheck {
        backend: BackendKind::Cpu,
        policy,
        lengths: lengths.to_vec(),
        tier_tolerance,
        rows,
        force_prefill: false,
        window: None,
        attention_window: None,
    });
}

fn run(
    policy: TierPolicy,
    lengths: &[usize],
    rows: usize,
    tier_tolerance: f32,
    force_prefill: bool,
) {
    run_check(KernelCheck {
        backend: BackendKind::Wgpu,
        policy,
        lengths: lengths.to_vec(),
        tier_tolerance,
        rows,
        force_prefill,
        window: None,
        attention_window: None,
    });
}

fn run_check(check: KernelCheck) {
    run_on(check.backend, check).expect("backend available");
}

/// The lengths the issue names, after which the new token lands at 1, 31, 32, 33, 1000.
const LENGTHS: [usize; 5] = [0, 30, 31, 32, 999];

#[test]
fn decode_fp32_matches_reference() {
    check(TierPolicy::ALL_F32, &LENGTHS, 1, 2e-5);
}

#[test]
fn decode_mixed_fp16_fp32_matches_reference() {
    check(
        TierPolicy {
            recent: Some(64),
            int8_after: None,
        },
        &LENGTHS,
        1,
        5e-3,
    );
}

#[test]
fn decode_mixed_int8_fp16_fp32_matches_reference() {
    check(
        TierPolicy {
            recent: Some(64),
            int8_after: Some(256),
        },
        &LENGTHS,
        1,
        6e-2,
    );
}

#[test]
fn prefill_mixed_tiers_matches_reference() {
    // 40 new rows each: two query tiles per sequence, the second partly filled.
    check(
        TierPolicy {
            recent: Some(64),
            int8_after: Some(256),
        },
        &[0, 31, 33, 300],
        40,
        6e-2,
    );
}

#[test]
fn prefill_fp32_matches_reference() {
    check(TierPolicy::ALL_F32, &[0, 5, 64], 33, 2e-5);
}

/// Long contexts through both kernels: lavapipe stops loops after 65,535 iterations, which
/// broke the prefill kernel past about 400 keys until its inner loops were unrolled.
#[test]
fn long_context_through_both_kernels() {
    run(TierPolicy::DEFAULT, &[2047], 1, 5e-3, false);
    run(TierPolicy::DEFAULT, &[2047], 1, 5e-3, true);
}

/// Sequences trimmed by the elastic window: both kernels attend over the kept blocks
/// (cache rows), not up to the tokens' positions.
#[test]
fn trimmed_sequences_through_both_kernels() {
    let policy = TierPolicy {
        recent: Some(64),
        int8_after: None,
    };
    for (rows, force_prefill) in [(1, false), (1, true), (40, false)] {
        run_check(KernelCheck {
            backend: BackendKind::Wgpu,
            policy,
            lengths: vec![10, 150, 300, 999],
            tier_tolerance: 5e-3,
            rows,
            force_prefill,
            window: Some(100),
            attention_window: None,
        });
    }
}

/// Sliding-window layers (Gemma 3): each query sees only its newest 100 keys, through both
/// decode kernels and the prefill kernel, the window's edge inside and across key tiles.
#[test]
fn windowed_attention_through_both_kernels() {
    for (rows, force_prefill) in [(1, false), (1, true), (40, false)] {
        run_check(KernelCheck {
            backend: BackendKind::Wgpu,
            policy: TierPolicy::DEFAULT,
            lengths: vec![0, 30, 99, 150, 999],
            tier_tolerance: 5e-3,
            rows,
            force_prefill,
            window: None,
            attention_window: Some(100),
        });
    }
}

/// The CPU backend on the windowed cases.
#[test]
fn cpu_windowed_attention_matches_reference() {
    for rows in [1, 40] {
        run_check(KernelCheck {
            backend: BackendKind::Cpu,
            policy: TierPolicy::DEFAULT,
            lengths: vec![0, 30, 99, 150, 999],
            tier_tolerance: 5e-3,
            rows,
            force_prefill: false,
            window: None,
            attention_window: Some(100),
        });
    }
}

const ALL_TIERS: TierPolicy = TierPolicy {
    recent: Some(64),
    int8_after: Some(256),
};

#[test]
fn cpu_decode_all_tiers_matches_reference() {
    check_cpu(TierPolicy::ALL_F32, &LENGTHS, 1, 2e-5);
    check_cpu(ALL_TIERS, &LENGTHS, 1, 6e-2);
}

#[test]
fn cpu_prefill_all_tiers_matches_reference() {
    // 70 new rows each: two chunks of query rows, the second partly filled.
    check_cpu(ALL_TIERS, &[0, 31, 33, 300], 70, 6e-2);
    check_cpu(TierPolicy::ALL_F32, &[0, 5, 64], 33, 2e-5);
}

/// Sequences trimmed by the elastic window: attention over the kept blocks (cache rows).
#[test]
fn cpu_trimmed_sequences_match_reference() {
    for rows in [1, 40] {
        run_check(KernelCheck {
            backend: BackendKind::Cpu,
            policy: TierPolicy {
                recent: Some(64),
                int8_after: None,
            },
            lengths: vec![10, 150, 300, 999],
            tier_tolerance: 5e-3,
            rows,
            force_prefill: false,
            window: Some(100),
            attention_window: None,
        });
    }
}
