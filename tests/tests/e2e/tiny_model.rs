//! Layer tests on a small random model on the CPU backend: cached decoding, the paged
//! cache against the contiguous one, RMSNorm, RoPE and the in-place layer operations
//! against burn's, and bad input.

use burn_tensor::{activation::silu, backend::Backend, Int, Tensor, TensorData};
use fornax_backends::CpuBackend as B;
use fornax_engine::logits_to_vec;
use fornax_engine::model::{
    reference_geglu, reference_rms_norm, LayerOps, Logits, Model, ModelConfig, ModelError, RmsNorm,
    Rope, RopeStyle, SeqTokens,
};

fn tiny() -> Model<B> {
    B::seed(&Default::default(), 7);
    let config = ModelConfig::new(64, 48, 2, 6, 2, 96, 64);
    Model::random(config, &Default::default())
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn cached_decoding_matches_full_forward() {
    let model = tiny();
    let ids = [3u32, 17, 42, 5, 9, 60, 1, 33, 12, 8];
    let full = logits_to_vec(
        model
            .forward(&ids, &mut model.new_cache(), Logits::All)
            .unwrap(),
    );
    // Prefill 4 tokens, then 2, then one at a time.
    let mut cache = model.new_cache();
    let mut stepped = logits_to_vec(model.forward(&ids[..4], &mut cache, Logits::All).unwrap());
    stepped.extend(logits_to_vec(
        model.forward(&ids[4..6], &mut cache, Logits::All).unwrap(),
    ));
    for &t in &ids[6..] {
        stepped.extend(logits_to_vec(
            model.forward(&[t], &mut cache, Logits::Last).unwrap(),
        ));
    }
    assert_eq!(cache.len(), ids.len());
    assert!(
        max_diff(&full, &stepped) < 1e-4,
        "diff {}",
        max_diff(&full, &stepped)
    );
}

#[test]
fn future_tokens_do_not_change_past_logits() {
    let model = tiny();
    let a = logits_to_vec(
        model
            .forward(&[1, 2, 3, 4], &mut model.new_cache(), Logits::All)
            .unwrap(),
    );
    let b = logits_to_vec(
        model
            .forward(&[1, 2, 3, 9], &mut model.new_cache(), Logits::All)
            .unwrap(),
    );
    let vocab = 64;
    assert!(max_diff(&a[..3 * vocab], &b[..3 * vocab]) < 1e-5);
    assert!(max_diff(&a[3 * vocab..], &b[3 * vocab..]) > 1e-3);
}

#[test]
fn rms_norm_matches_formula() {
    let device = Default::default();
    let x = [1.0f32, -2.0, 3.0, 0.5];
    let norm = RmsNorm::<B>::new(
        Tensor::from_data(TensorData::new(vec![1.0f32, 2.0, 1.0, 1.0], [4]), &device),
        1e-5,
    );
    let y = logits_to_vec(norm.forward(Tensor::from_data(
        TensorData::new(x.to_vec(), [1, 4]),
        &device,
    )));
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / 4.0 + 1e-5).sqrt();
    let want = [1.0 / rms, -4.0 / rms, 3.0 / rms, 0.5 / rms];
    assert!(max_diff(&y, &want) < 1e-6);
}

#[test]
fn rope_rotates_pairs_in_both_layouts() {
    let device = Default::default();
    let rope = Rope::<B>::new(4, 8, 100.0, None, RopeStyle::Adjacent, &device);
    let x = Tensor::<B, 2>::from_data(
        TensorData::new(vec![1.0f32, 0.0, 1.0, 0.0], [1, 4]),
        &device,
    );
    let at = || Tensor::<B, 1, Int>::from_data(TensorData::new(vec![3i64], [1]), &device);
    // Pair 0 turns by 3 rad, pair 1 by 3 * 100^(-1/2) rad: burn's operations and the CPU
    // backend's in-place RoPE alike.
    let a1 = 3.0f32 * 0.1;
    let want = [3.0f32.cos(), 3.0f32.sin(), a1.cos(), a1.sin()];
    let burn_ops = logits_to_vec(rope.apply_rows(x.clone(), 1, at()));
    let in_place = logits_to_vec(B::rope_rows(x, 1, at(), &rope));
    assert!(max_diff(&burn_ops, &want) < 1e-5, "{burn_ops:?}");
    assert!(max_diff(&in_place, &want) < 1e-5, "{in_place:?}");

    // NeoX: angle 0 turns dimensions (0, 2), angle 1 dimensions (1, 3).
    let neox = Rope::<B>::new(4, 8, 100.0, None, RopeStyle::Neox, &device);
    let (c, s) = (3.0f32.cos(), 3.0f32.sin());
    let want = [c - s, a1.cos() - a1.sin(), s + c, a1.sin() + a1.cos()];
    let x = Tensor::<B, 2>::from_data(TensorData::new(vec![1.0f32; 4], [1, 4]), &device);
    let burn_ops = logits_to_vec(neox.apply_rows(x.clone(), 1, at()));
    let in_place = logits_to_vec(B::rope_rows(x, 1, at(), &neox));
    assert!(max_diff(&burn_ops, &want) < 1e-5, "{burn_ops:?}");
    assert!(max_diff(&in_place, &want) < 1e-5, "{in_place:?}");
}

#[test]
fn bad_inputs_are_errors() {
    let model = tiny();
    assert!(matches!(
        model.forward(&[], &mut model.new_cache(), Logits::Last),
        Err(ModelError::EmptyInput)
    ));
    assert!(matches!(
        model.forward(&[64], &mut model.new_cache(), Logits::Last),
        Err(ModelError::TokenOutOfRange { id: 64, .. })
    ));
    let long = vec![1u32; 65];
    assert!(matches!(
        model.forward(&long, &mut model.new_cache(), Logits::Last),
        Err(ModelError::ContextOverflow {
            needed: 65,
            limit: 64
        })
    ));
}

/// The paged cache (reference path on the CPU) gives the contiguous cache's logits for a
/// ragged batch: three sequences of different lengths, prefilled in chunks then decoded
/// together, across block boundaries.
#[test]
fn paged_batch_matches_contiguous_cache() {
    use fornax_engine::kv::{KvCapacity, TierPolicy};
    let model = tiny();
    let prompts: [Vec<u32>; 3] = [
        (0..40).map(|i| (i * 7 % 64) as u32).collect(),
        vec![5, 9, 11],
        (0..33).map(|i| (i * 13 % 61) as u32).collect(),
    ];
    let mut kv = model.new_paged_cache(KvCapacity::f32_only(16), TierPolicy::ALL_F32);
    let seqs: Vec<_> = prompts.iter().map(|_| kv.add_sequence()).collect();
    // Prefill in two ragged batches (chunks of up to 20 tokens), then 3 decode steps.
    let mut paged: Vec<Vec<f32>> = vec![Vec::new(); 3];
    for chunk in [0..20usize, 20..40] {
        let parts: Vec<(usize, &[u32])> = prompts
            .iter()
            .enumerate()
            .filter(|(_, p)| p.len() > chunk.start)
            .map(|(i, p)| (i, &p[chunk.start..chunk.end.min(p.len())]))
            .collect();
        let batch: Vec<SeqTokens> = parts
            .iter()
            .map(|&(i, tokens)| SeqTokens {
                seq: seqs[i],
                tokens,
            })
            .collect();
        let logits = logits_to_vec(model.forward_batch(&batch, &mut kv, Logits::All).unwrap());
        let mut at = 0;
        for &(i, tokens) in &parts {
            let n = tokens.len() * 64;
            paged[i].extend_from_slice(&logits[at..at + n]);
            at += n;
        }
    }
    let steps = [[1u32, 2, 3], [4, 5, 6], [7, 8, 9]];
    for step in steps {
        let batch: Vec<SeqTokens> = (0..3)
            .map(|i| SeqTokens {
                seq: seqs[i],
                tokens: &step[i..i + 1],
            })
            .collect();
        let logits = logits_to_vec(model.forward_batch(&batch, &mut kv, Logits::Last).unwrap());
        for i in 0..3 {
            paged[i].extend_from_slice(&logits[i * 64..(i + 1) * 64]);
        }
    }
    for i in 0..3 {
        let mut ids = prompts[i].clone();
        ids.extend(steps.iter().map(|s| s[i]));
        let full = logits_to_vec(
            model
                .forward(&ids, &mut model.new_cache(), Logits::All)
                .unwrap(),
        );
        let diff = max_diff(&full, &paged[i]);
        assert!(diff < 1e-4, "sequence {i}: {diff}");
    }
    assert_eq!(kv.stats().tokens_stored, 40 + 3 + 33 + 9);
    for s in seqs {
        kv.free_sequence(s).unwrap();
    }
    assert_eq!(kv.stats().blocks_used, 0);
}

/// A batch that does not fit is refused whole: no sequence advances.
#[test]
fn paged_batch_out_of_blocks_is_an_error_not_a_panic() {
    use fornax_engine::kv::{KvCapacity, KvError, TierPolicy};
    let model = tiny();
    let mut kv = model.new_paged_cache(KvCapacity::f32_only(2), TierPolicy::ALL_F32);
    let a = kv.add_sequence();
    let b = kv.add_sequence();
    let tokens: Vec<u32> = (0..40).collect();
    let err = model
        .forward_batch(
            &[
                SeqTokens {
                    seq: a,
                    tokens: &tokens,
                },
                SeqTokens {
                    seq: b,
                    tokens: &tokens[..5],
                },
            ],
            &mut kv,
            Logits::Last,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Kv(KvError::OutOfBlocks {
                needed: 3,
                free: 2,
                ..
            })
        ),
        "{err}"
    );
    assert_eq!(kv.len(a).unwrap(), 0);
    assert_eq!(kv.stats().blocks_used, 0);
}

/// The CPU backend's in-place RMSNorm, SwiGLU and GeGLU gates against burn's operations,
/// on odd sizes with values of both signs.
#[test]
fn in_place_layer_ops_match_burn_operations() {
    let device = Default::default();
    let values = |n: usize, seed: f32| -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed).sin() * 3.0)
            .collect()
    };
    let (rows, d) = (3, 37);
    let x = Tensor::<B, 2>::from_data(TensorData::new(values(rows * d, 0.1), [rows, d]), &device);
    let w = Tensor::<B, 1>::from_data(TensorData::new(values(d, 0.7), [d]), &device);
    let ours = logits_to_vec(B::rms_norm(x.clone(), w.clone(), 1e-5));
    let burn_ops = logits_to_vec(reference_rms_norm(x.clone(), w, 1e-5));
    assert!(max_diff(&ours, &burn_ops) < 1e-5, "rms_norm");
    let up = Tensor::<B, 2>::from_data(TensorData::new(values(rows * d, 2.0), [rows, d]), &device);
    let ours = logits_to_vec(B::swiglu(x.clone(), up.clone()));
    let burn_ops = logits_to_vec(silu(x.clone()).mul(up.clone()));
    assert!(max_diff(&ours, &burn_ops) < 1e-5, "swiglu");
    // Gates far out, where e^-gate under- or overflows (the SIMD exp clamps there).
    let far: Vec<f32> = values(rows * d, 0.3).iter().map(|v| v * 40.0).collect();
    let far = Tensor::<B, 2>::from_data(TensorData::new(far, [rows, d]), &device);
    let ours = logits_to_vec(B::swiglu(far.clone(), up.clone()));
    let burn_ops = logits_to_vec(silu(far.clone()).mul(up.clone()));
    let rel = ours
        .iter()
        .zip(&burn_ops)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0f32, f32::max);
    assert!(rel < 1e-6, "swiglu on far gates: {rel}");
    // GeGLU (tanh GELU) as llama.cpp's CPU backend takes it: the gate and GELU rounded to
    // FP16 (a step of |x| 2^-11 at most, GELU's slope under 1.13).
    let ups = logits_to_vec(up.clone());
    for gate in [x, far] {
        let xs = logits_to_vec(gate.clone());
        let ours = logits_to_vec(B::geglu(gate.clone(), up.clone()));
        let burn_ops = logits_to_vec(reference_geglu(gate, up.clone()));
        for (i, (a, b)) in ours.iter().zip(&burn_ops).enumerate() {
            let bound = 6e-4 * ((xs[i] * ups[i]).abs() + b.abs()) + 1e-6;
            assert!((a - b).abs() <= bound, "geglu at {}: {a} vs {b}", xs[i]);
        }
    }
}

/// The CPU's SIMD GeGLU gives the portable lookup's results exactly, around the table's
/// ends and FP16 ties too, and stays within FP16 rounding of the FP32 tanh form.
#[test]
fn geglu_levels_agree_and_follow_the_tanh_form() {
    use fornax_cpu::layer_ops::{geglu, geglu_portable};
    let mut gate: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) * 0.00613).collect();
    gate.extend([
        -10.0,
        -10.000001,
        -9.99999,
        10.0,
        9.99999,
        10.5,
        -30.0,
        1.0 + 1.0 / 2048.0,
    ]);
    let up: Vec<f32> = (0..gate.len())
        .map(|i| 1.0 + (i % 7) as f32 * 0.25)
        .collect();
    let mut want = gate.clone();
    geglu_portable(&mut want, &up);
    let mut got = gate.clone();
    geglu(&mut got, &up);
    assert_eq!(got, want);
    for ((&g, &u), &y) in gate.iter().zip(&up).zip(&got) {
        let exact = 0.5 * g * (1.0 + (0.797_884_6 * g * (1.0 + 0.044_715 * g * g)).tanh()) * u;
        // FP16 rounding of the input (a step of |g| 2^-11 at most, GELU's slope under
        // 1.13) and of the output.
        let bound = 6e-4 * (g.abs() * u + exact.abs()) + 1e-9;
        assert!((y - exact).abs() <= bound, "{g}: {y} vs {exact}");
    }
}

/// Dense FP32 products on the CPU backend (`fornax_cpu::dense`: column strips up to 8
/// tokens, the blocked product on column blocks above) against the product summed in
/// FP64, on odd sizes: strips of 64 columns and a ragged last one, token tiles of 4 and a
/// ragged last one, column blocks of 16 and a ragged last one.
#[test]
fn dense_products_match_a_double_precision_sum() {
    use fornax_engine::quant::QuantOps;
    let device = Default::default();
    let (inp, out) = (37, 150);
    let value = |i: usize, seed: f64| ((i as f64 * 0.61 + seed).sin() * 2.0) as f32;
    let w: Vec<f32> = (0..inp * out).map(|i| value(i, 0.3)).collect();
    let wt = Tensor::<B, 2>::from_data(TensorData::new(w.clone(), [inp, out]), &device);
    for tokens in [1, 3, 4, 5, 8, 9, 40] {
        let x: Vec<f32> = (0..tokens * inp).map(|i| value(i, 1.7)).collect();
        let xt = Tensor::<B, 2>::from_data(TensorData::new(x.clone(), [tokens, inp]), &device);
        let got = logits_to_vec(B::dense_matmul(xt, &wt));
        assert_eq!(got.len(), tokens * out);
        for t in 0..tokens {
            for c in 0..out {
                let want: f64 = (0..inp)
                    .map(|i| f64::from(x[t * inp + i]) * f64::from(w[i * out + c]))
                    .sum();
                let err = (f64::from(got[t * out + c]) - want).abs();
                assert!(err < 1e-4, "{tokens} tokens, [{t}, {c}]: {err}");
            }
        }
    }
}
