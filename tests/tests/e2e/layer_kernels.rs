//! The fused layer kernels (CubeCL, on wgpu: lavapipe here) against burn's operations (the
//! reference path) on random data of odd sizes, and their dispatch counts: one launch each.

use burn_tensor::activation::silu;
use burn_tensor::{Distribution, Tensor};
use fornax_backends::{wgpu_device, WgpuBackend};
use fornax_engine::device_counts::counted;
use fornax_engine::model::{reference_rms_norm, LayerOps};

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
