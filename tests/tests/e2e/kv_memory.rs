//! The KV pool allocates once: across 100 decode steps of a batch on lavapipe the device
//! allocator's live allocations and reserved bytes stay flat (blocks come from the pool,
//! tokens are written in place). A small random model is enough: this is about the
//! cache's allocations, not the model's outputs.

use fornax_backends::{run_on, BackendKind, BackendTask, DeviceInfo};
use fornax_engine::kv::{KvCapacity, TierPolicy};
use fornax_engine::model::{LlamaConfig, LlamaModel, Logits, SeqTokens};
use fornax_engine::sampling::argmax;
use fornax_engine::{logits_to_vec, EngineBackend};

struct DecodeSteps;

impl BackendTask for DecodeSteps {
    type Output = ();

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) {
        B::seed(&device, 3);
        let config = LlamaConfig::new(256, 128, 2, 4, 2, 256, 512);
        let model = LlamaModel::<B>::random(config, &device);
        let policy = TierPolicy {
            recent: Some(32),
            int8_after: Some(96),
        };
        let mut kv = model.new_paged_cache(KvCapacity { slots: [8, 8, 8] }, policy);
        let seqs = [kv.add_sequence(), kv.add_sequence()];
        let prompts: [Vec<u32>; 2] = [(0..20).collect(), (100..107).collect()];
        let batch: Vec<SeqTokens> = (0..2)
            .map(|i| SeqTokens {
                seq: seqs[i],
                tokens: &prompts[i],
            })
            .collect();
        let logits = logits_to_vec(model.forward_batch(&batch, &mut kv, Logits::Last).unwrap());
        let mut next: Vec<u32> = logits.chunks(256).map(argmax).collect();
        let mut usage = Vec::new();
        for _ in 0..110 {
            let step: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
            let batch: Vec<SeqTokens> = (0..2)
                .map(|i| SeqTokens {
                    seq: seqs[i],
                    tokens: &step[i],
                })
                .collect();
            let logits = logits_to_vec(model.forward_batch(&batch, &mut kv, Logits::Last).unwrap());
            next = logits.chunks(256).map(argmax).collect();
            usage.push(B::device_memory(&device).expect("a cube backend reports memory"));
        }
        let stats = kv.stats();
        eprintln!("{}: {stats:?}", info.adapter);
        for (i, u) in usage.iter().enumerate().step_by(10) {
            eprintln!("step {i}: {u:?}");
        }
        // Blocks aged through both lower tiers during the run.
        assert!(stats.conversions >= 6, "{stats:?}");
        // After 10 warm-up steps, 100 steps with identical allocator figures.
        let warm = &usage[10..];
        assert_eq!(warm.len(), 100);
        for (i, u) in warm.iter().enumerate() {
            assert_eq!(*u, warm[0], "step {}: allocator figures changed", i + 10);
        }
    }
}

#[test]
fn decoding_does_not_allocate_per_token() {
    // The allocator's figures are the device's: no other test may use it meanwhile. Hence
    // fornax_backends::run_on here: common::run_on would wait for the shared lock we hold.
    let _alone = crate::common::wgpu_alone();
    run_on(BackendKind::Wgpu, DecodeSteps).expect("wgpu adapter");
}
