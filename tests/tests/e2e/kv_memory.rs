//! The KV pool allocates once: across 100 decode steps of a batch on lavapipe the device
//! allocator's live allocations and reserved bytes stay flat (blocks come from the pool,
//! tokens are written in place). A small random model covers the cache and its tiers; the
//! real model covers the fused layer kernels, whose activations and scratch buffers come
//! back to the allocator's pool step after step.

use burn_tensor::Tensor;
use fornax_backends::{run_on, BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, KvDims, PagedKv, Tier, TierPolicy};
use fornax_engine::model::{LoadOptions, Logits, Model, ModelConfig, SeqTokens};
use fornax_engine::sampling::{argmax, argmax_rows};
use fornax_engine::{logits_to_vec, DeviceMemory, EngineBackend};

use crate::common::model_file;

struct DecodeSteps;

impl BackendTask for DecodeSteps {
    type Output = ();

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) {
        B::seed(&device, 3);
        let config = ModelConfig::new(256, 128, 2, 4, 2, 256, 512);
        let model = Model::<B>::random(config, &device);
        let policy = TierPolicy {
            recent: Some(32),
            int8_after: Some(96),
        };
        let mut kv = model.new_paged_cache(KvCapacity::tiers([8, 8, 8]), policy);
        let prompts: [Vec<u32>; 2] = [(0..20).collect(), (100..107).collect()];
        let host_argmax = |l| logits_to_vec(l).chunks(256).map(argmax).collect();
        let usage = decode_steps(&model, &mut kv, [&prompts[0], &prompts[1]], host_argmax);
        let stats = kv.stats();
        eprintln!("{}: {stats:?}", info.adapter);
        for (i, u) in usage.iter().enumerate().step_by(10) {
            eprintln!("step {i}: {u:?}");
        }
        // Blocks aged through both lower tiers during the run.
        assert!(stats.conversions >= 6, "{stats:?}");
        assert_flat(&usage);
    }
}

/// Two sequences prefilled with `prompts`, then 110 decode steps, each token chosen by
/// `pick` from the step's logits: the allocator's figures after each step.
fn decode_steps<B: EngineBackend>(
    model: &Model<B>,
    kv: &mut PagedKv<B>,
    prompts: [&[u32]; 2],
    pick: impl Fn(Tensor<B, 2>) -> Vec<u32>,
) -> Vec<DeviceMemory> {
    let seqs = [kv.add_sequence(), kv.add_sequence()];
    let batch: Vec<SeqTokens> = (0..2)
        .map(|i| SeqTokens {
            seq: seqs[i],
            tokens: prompts[i],
        })
        .collect();
    let mut next = pick(model.forward_batch(&batch, kv, Logits::Last).unwrap());
    let mut usage = Vec::new();
    for _ in 0..110 {
        let step: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let batch: Vec<SeqTokens> = (0..2)
            .map(|i| SeqTokens {
                seq: seqs[i],
                tokens: &step[i],
            })
            .collect();
        next = pick(model.forward_batch(&batch, kv, Logits::Last).unwrap());
        usage.push(B::device_memory(&model.device()).expect("a cube backend reports memory"));
    }
    usage
}

/// After 10 warm-up steps, 100 steps with identical allocator figures.
fn assert_flat(usage: &[DeviceMemory]) {
    let warm = &usage[10..];
    assert_eq!(warm.len(), 100);
    for (i, u) in warm.iter().enumerate() {
        assert_eq!(*u, warm[0], "step {}: allocator figures changed", i + 10);
    }
}

/// The real model through the fused layer kernels (the KV written by the QKV product's
/// epilogue), greedy tokens picked on the device: 110 steps of two sequences.
struct FusedDecodeSteps;

impl BackendTask for FusedDecodeSteps {
    type Output = ();

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) {
        let gguf = GgufFile::parse(model_file().bytes()).expect("model");
        let model =
            Model::<B>::from_gguf_with(&gguf, &device, LoadOptions::default(), &mut |_, _| {})
                .expect("model");
        assert_eq!(
            model.matrices().count(),
            1 + 4 * model.config.n_layers,
            "joined weights: the fused path"
        );
        let mut kv = model.new_paged_cache(KvCapacity::f32_only(12), TierPolicy::ALL_F32);
        let prompts: [&[u32]; 2] = [&[504, 3575, 282, 4649, 314], &[1, 28, 216, 34, 28]];
        let usage = decode_steps(&model, &mut kv, prompts, argmax_rows);
        eprintln!(
            "{}: step 10 {:?}, step 109 {:?}",
            info.adapter, usage[10], usage[109]
        );
        assert_flat(&usage);
    }
}

#[test]
fn fused_decoding_does_not_allocate_per_token() {
    let _alone = crate::common::wgpu_alone();
    run_on(BackendKind::Wgpu, FusedDecodeSteps).expect("wgpu adapter");
}

#[test]
fn decoding_does_not_allocate_per_token() {
    // The allocator's figures are the device's: no other test may use it meanwhile. Hence
    // fornax_backends::run_on here: common::run_on would wait for the shared lock we hold.
    let _alone = crate::common::wgpu_alone();
    run_on(BackendKind::Wgpu, DecodeSteps).expect("wgpu adapter");
}

/// The pool's arenas take what the budget counts per block, on each backend: 32-bit words
/// in the FP16 and INT8 tiers (with 64-bit integers the CPU pool took 1.5 times its
/// `--kv-memory`).
struct PoolBytes;

impl BackendTask for PoolBytes {
    type Output = ();

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) {
        let dims = KvDims::dense(3, 2, 64);
        let capacity = KvCapacity::tiers([4, 6, 5]);
        let kv = PagedKv::<B>::new(dims, capacity, TierPolicy::DEFAULT, &device);
        let budgeted: usize = [Tier::F32, Tier::F16, Tier::I8]
            .iter()
            .map(|&t| capacity.slots[t.index()] * dims.block_bytes(t))
            .sum();
        eprintln!(
            "{}: {} bytes, {budgeted} budgeted",
            info.adapter,
            kv.store.bytes()
        );
        assert_eq!(kv.store.bytes(), budgeted);
    }
}

#[test]
fn the_pool_takes_the_bytes_its_budget_counts_on_cpu() {
    crate::common::run_on(BackendKind::Cpu, PoolBytes).expect("the CPU backend");
}

#[test]
fn the_pool_takes_the_bytes_its_budget_counts_on_wgpu() {
    crate::common::run_on(BackendKind::Wgpu, PoolBytes).expect("wgpu adapter");
}
