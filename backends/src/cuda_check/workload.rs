//! What the engine launches on a device, run once on the compile-only runtime: the decode
//! steps of the server's path at batch 1 and 64, prefill, scoring, and sampling.

use burn_tensor::Tensor;
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy};
use fornax_engine::model::{LoadOptions, Logits, Model, SeqTokens};
use fornax_engine::sampling::{argmax_rows, pick_rows, Sampler, SamplingParams};
use fornax_engine::EngineBackend;

/// Sequences of the batched decode step.
pub const BATCH: usize = 64;
/// Prompt tokens of each sequence: four KV blocks, so that tiered caches hold blocks of
/// every tier.
const PROMPT: usize = 128;

/// Runs the workload on `B`: the model loaded as the engine loads it, then per KV policy
/// (all FP32; FP32, FP16 and INT8 tiers) a prefill of [`BATCH`] prompts and decode steps
/// at batch 1 and [`BATCH`], greedy and sampled, and a prompt scored at every position.
pub fn run<B: EngineBackend>(gguf: &GgufFile, device: &B::Device) -> anyhow::Result<()> {
    let model = Model::<B>::from_gguf_with(gguf, device, LoadOptions::default(), &mut |_, _| {})?;
    let vocab = model.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..PROMPT as u32)
        .map(|i| (i * 7919 + 11) % vocab)
        .collect();
    let tiered = TierPolicy {
        recent: Some(32),
        int8_after: Some(64),
    };
    for policy in [TierPolicy::ALL_F32, tiered] {
        let capacity = KvCapacity::from_budget(4 << 30, model.kv_dims(), policy, BATCH, 256);
        let mut kv = model.new_paged_cache(capacity, policy);
        let seqs: Vec<_> = (0..BATCH).map(|_| kv.add_sequence()).collect();
        for &seq in &seqs {
            let batch = [SeqTokens {
                seq,
                tokens: &prompt,
            }];
            model.forward_batch(&batch, &mut kv, Logits::Last)?;
        }
        for rows in [1, BATCH] {
            let next = [1u32];
            let batch: Vec<_> = seqs[..rows]
                .iter()
                .map(|&seq| SeqTokens { seq, tokens: &next })
                .collect();
            let logits: Tensor<B, 2> = model.forward_batch(&batch, &mut kv, Logits::Last)?;
            argmax_rows(logits.clone());
            let mut samplers: Vec<Sampler> = (0..rows)
                .map(|i| {
                    Sampler::new(SamplingParams {
                        temperature: 0.8,
                        top_k: 40,
                        top_p: 0.95,
                        seed: i as u64,
                        ..SamplingParams::greedy()
                    })
                })
                .collect();
            let mut refs: Vec<&mut Sampler> = samplers.iter_mut().collect();
            pick_rows(logits, &mut refs);
        }
        let scored = kv.add_sequence();
        let batch = [SeqTokens {
            seq: scored,
            tokens: &prompt[..64],
        }];
        model.forward_batch(&batch, &mut kv, Logits::All)?;
    }
    Ok(())
}
