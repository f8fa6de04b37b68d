//! The fused layer kernels (CubeCL, on wgpu: lavapipe here) against burn's operations (the
//! reference path) on random data of odd sizes, and their dispatch counts: one launch each.

use burn_tensor::activation::silu;
use burn_tensor::{DType, Distribution, Int, Tensor, TensorData};
use fornax_backends::{wgpu_device, WgpuBackend};
use fornax_engine::device_counts::counted;
use fornax_engine::model::{reference_rms_norm, LayerOps, Rope, RopeStyle};
use fornax_shaders::layer_launch::{self, HeadWork, Norm};
use fornax_shaders::quant_launch::RopeKv;

use crate::fused_layers::{float, tensor};

type B = WgpuBackend;

/// Largest `|a - b|` over `max(1, |b|)`.
fn worst_relative(a: Tensor<B, 2>, b: Tensor<B, 2>) -> f32 {
    let (a, b): (Vec<f32>, Vec<f32>) = (
        a.into_data().to_vec().unwrap(),
        b.into_data().to_vec().unwrap(),
    );
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

#[test]
fn rms_norm_kernel_matches_burn_operations_in_one_dispatch() {
    let _shared = crate::common::wgpu_shared();
    let device = wgpu_device().expect("a wgpu adapter").0;
    for (rows, d) in [(1, 576), (7, 576), (3, 100), (5, 33), (2, 1536)] {
        let x = Tensor::<B, 2>::random([rows, d], Distribution::Uniform(-3.0, 3.0), &device);
        let w = Tensor::<B, 1>::random([d], Distribution::Uniform(-2.0, 2.0), &device);
        let want = reference_rms_norm(x.clone(), w.clone(), 1e-5);
        let (got, counts) = counted(|| B::rms_norm(x.clone(), w.clone(), 1e-5));
        assert_eq!(counts.dispatches, 1, "[{rows}x{d}] one launch");
        let err = worst_relative(got, want);
        assert!(err < 1e-5, "[{rows}x{d}] differs by {err}");
    }
}

#[test]
fn swiglu_kernel_matches_burn_operations_in_one_dispatch() {
    let _shared = crate::common::wgpu_shared();
    let device = wgpu_device().expect("a wgpu adapter").0;
    for (rows, d) in [(1, 1536), (9, 1536), (3, 77)] {
        let gate = Tensor::<B, 2>::random([rows, d], Distribution::Uniform(-8.0, 8.0), &device);
        let up = Tensor::<B, 2>::random([rows, d], Distribution::Uniform(-2.0, 2.0), &device);
        let want = silu(gate.clone()).mul(up.clone());
        let (got, counts) = counted(|| B::swiglu(gate.clone(), up.clone()));
        assert_eq!(counts.dispatches, 1, "[{rows}x{d}] one launch");
        let err = worst_relative(got, want);
        assert!(err < 1e-5, "[{rows}x{d}] differs by {err}");
    }
}

/// `norm` (RMSNorm with `weight`) over each `head_dim` slice of every row of `x`.
fn per_head(x: Tensor<B, 2>, weight: Tensor<B, 1>, head_dim: usize) -> Tensor<B, 2> {
    let [rows, width] = x.dims();
    reference_rms_norm(x.reshape([rows * width / head_dim, head_dim]), weight, 1e-6)
        .reshape([rows, width])
}

/// The per-head kernel after the QKV product (head norms where asked, RoPE of either
/// pairing, K and V into the arena rows) against the split product, burn's RMSNorm per
/// head, the reference RoPE and the rows written by hand: every combination, one launch.
#[test]
fn qkv_heads_kernel_matches_burn_operations_in_one_dispatch() {
    let _shared = crate::common::wgpu_shared();
    let device = wgpu_device().expect("a wgpu adapter").0;
    let (heads, kv_heads, slots) = (4, 2, 40);
    for head_dim in [32, 256] {
        let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
        for style in [RopeStyle::Adjacent, RopeStyle::Neox] {
            let rope = Rope::<B>::new(head_dim, 300, 10_000.0, None, style, &device);
            for normed in [false, true] {
                for tokens in [1, 6] {
                    let label =
                        format!("{style:?}, head {head_dim}, normed {normed}, {tokens} tokens");
                    let qkv = Tensor::<B, 2>::random(
                        [tokens, q_width + 2 * kv_width],
                        Distribution::Uniform(-2.0, 2.0),
                        &device,
                    );
                    let weight = || {
                        Tensor::<B, 1>::random([head_dim], Distribution::Uniform(0.5, 1.5), &device)
                    };
                    let (qn, kn) = (weight(), weight());
                    let positions: Vec<i32> =
                        (0..tokens as i32).map(|t| (53 * t + 7) % 300).collect();
                    let rows: Vec<i32> = (0..tokens as i32)
                        .map(|t| (7 * t + 3) % slots as i32)
                        .collect();
                    let info: Vec<i32> = positions
                        .iter()
                        .zip(&rows)
                        .flat_map(|(&p, &r)| [p, r])
                        .collect();
                    let ints = |v: &[i32]| {
                        Tensor::<B, 1, Int>::from_data(
                            TensorData::new(v.to_vec(), [v.len()]),
                            &device,
                        )
                    };
                    let mut q = qkv.clone().narrow(1, 0, q_width);
                    let mut k = qkv.clone().narrow(1, q_width, kv_width);
                    let v = qkv.clone().narrow(1, q_width + kv_width, kv_width);
                    if normed {
                        q = per_head(q, qn.clone(), head_dim);
                        k = per_head(k, kn.clone(), head_dim);
                    }
                    let want_q = rope.apply_rows(q, heads, ints(&positions));
                    let want_k = rope.apply_rows(k, kv_heads, ints(&positions));
                    let keys = Tensor::<B, 2>::zeros([slots, kv_width], &device);
                    let values = Tensor::<B, 2>::zeros([slots, kv_width], &device);
                    let launch = || {
                        let to = RopeKv {
                            keys: float(keys.clone()),
                            values: float(values.clone()),
                            info: ints(&info).into_primitive(),
                            table: float(rope.pairs().clone()),
                            q_width,
                            kv_width,
                            head_dim,
                        };
                        let norm = |w: &Tensor<B, 1>| Norm {
                            weight: float(w.clone()),
                            eps: 1e-6,
                        };
                        let work = HeadWork {
                            norms: normed.then(|| (norm(&qn), norm(&kn))),
                            neox: style == RopeStyle::Neox,
                        };
                        tensor(layer_launch::qkv_heads(
                            float(qkv.clone()),
                            to,
                            work,
                            DType::F32,
                        ))
                    };
                    // Counted on a second launch (see the next test).
                    let got_q = launch();
                    let (_, counts) = counted(launch);
                    assert_eq!(counts.dispatches, 1, "{label}: one launch");
                    let err = worst_relative(got_q, want_q);
                    assert!(err < 1e-5, "{label}: Q differs by {err}");
                    for (arena, want, name) in [(keys, want_k, "K"), (values, v, "V")] {
                        let written = arena.select(0, ints(&rows));
                        let err = worst_relative(written, want);
                        assert!(err < 1e-5, "{label}: {name} differs by {err}");
                    }
                }
            }
        }
    }
}

/// The post norm with its residual add, and the next norm of the sum, against burn's
/// RMSNorm and add: one launch for both outputs.
#[test]
fn norm_residual_kernel_matches_burn_operations_in_one_dispatch() {
    let _shared = crate::common::wgpu_shared();
    let device = wgpu_device().expect("a wgpu adapter").0;
    for (rows, d) in [(1, 640), (5, 640), (3, 100)] {
        let random = |shape: [usize; 2]| {
            Tensor::<B, 2>::random(shape, Distribution::Uniform(-3.0, 3.0), &device)
        };
        let weight = || Tensor::<B, 1>::random([d], Distribution::Uniform(0.5, 2.0), &device);
        let (a, residual, post, next) = (random([rows, d]), random([rows, d]), weight(), weight());
        let want_h = residual.clone() + reference_rms_norm(a.clone(), post.clone(), 1e-6);
        let want_n = reference_rms_norm(want_h.clone(), next.clone(), 1e-5);
        for then_norm in [false, true] {
            let norm = |w: &Tensor<B, 1>, eps| Norm {
                weight: float(w.clone()),
                eps,
            };
            let run = || {
                layer_launch::norm_residual(
                    float(a.clone()),
                    norm(&post, 1e-6),
                    float(residual.clone()),
                    then_norm.then(|| norm(&next, 1e-5)),
                    DType::F32,
                )
            };
            // Counted on a second launch: a kernel's first launch in the process was seen
            // missed by the counter (0) while other tests ran beside this one.
            let (h, n) = run();
            let (_, counts) = counted(run);
            let err = worst_relative(tensor(h), want_h.clone());
            assert!(err < 1e-5, "[{rows}x{d}] sum differs by {err}");
            assert_eq!(counts.dispatches, 1, "[{rows}x{d}] one launch");
            assert_eq!(n.is_some(), then_norm);
            if let Some(n) = n {
                let err = worst_relative(tensor(n), want_n.clone());
                assert!(err < 1e-5, "[{rows}x{d}] next norm differs by {err}");
            }
        }
    }
}
