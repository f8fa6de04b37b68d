//! Sampling on the device (`fornax_engine::sampling::pick_rows`) against the host sampler
//! with the same seeds on a fixed logits tensor: greedy, temperature, top-k and top-p,
//! rows whose token always lies in the device's window and a flat row whose token mostly
//! does not (then the host picks it from the logits with the same draw).

use burn_tensor::{Tensor, TensorData};
use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::device_counts::counted;
use fornax_engine::sampling::{pick_rows, Sampler, SamplingParams};
use fornax_engine::EngineBackend;

use crate::common::run_on;

const VOCAB: usize = 49_152;

/// A row with a head of 30 likely tokens over a long tail, or a flat row.
fn row(seed: u64, flat: bool) -> Vec<f32> {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..VOCAB)
        .map(|i| match (flat, i % 1637 == 5) {
            (true, _) => next() * 2.0 - 1.0,
            (false, true) => 10.0 + next() * 5.0,
            (false, false) => next() * -10.0,
        })
        .collect()
}

fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed,
        ..SamplingParams::greedy()
    }
}

/// Each row's settings; the last row is flat.
fn settings() -> Vec<SamplingParams> {
    vec![
        SamplingParams::greedy(),
        params(0.8, 40, 1.0, 1),
        params(1.0, 5, 0.9, 2),
        params(0.7, 0, 0.9, 3),
        params(1.0, 0, 1.0, 4),
        params(1.3, 64, 0.95, 5),
        params(1.0, 0, 1.0, 6),
    ]
}

/// 40 steps over the same logits: the tokens picked by `pick_rows` (device where it can)
/// and by the host sampler, and the read-backs of a step of the windowed rows alone.
struct Picks;

impl BackendTask for Picks {
    type Output = (Vec<Vec<u32>>, Vec<Vec<u32>>, (u64, u64), u64);

    fn run<B: EngineBackend>(self, device: B::Device, _: DeviceInfo) -> Self::Output {
        let settings = settings();
        let rows = settings.len();
        let values: Vec<f32> = (0..rows)
            .flat_map(|r| row(100 + r as u64, r == rows - 1))
            .collect();
        let logits =
            Tensor::<B, 2>::from_data(TensorData::new(values.clone(), [rows, VOCAB]), &device);
        let mut device_samplers: Vec<Sampler> =
            settings.iter().cloned().map(Sampler::new).collect();
        let mut host_samplers = device_samplers.clone();
        let (mut on_device, mut on_host) = (Vec::new(), Vec::new());
        for _ in 0..40 {
            let mut refs: Vec<&mut Sampler> = device_samplers.iter_mut().collect();
            on_device.push(pick_rows(logits.clone(), &mut refs));
            on_host.push(
                host_samplers
                    .iter_mut()
                    .zip(values.chunks_exact(VOCAB))
                    .map(|(s, l)| s.sample(l))
                    .collect(),
            );
        }
        // Top-k rows never leave the window: one read-back of one id each.
        let windowed = logits.clone().narrow(0, 0, 3);
        let mut refs: Vec<&mut Sampler> = device_samplers.iter_mut().take(3).collect();
        let (_, counts) = counted(|| pick_rows(windowed, &mut refs));
        // Peaked rows without top-k: the draw lands in the window nearly always.
        let peaked = logits.narrow(0, 3, 2);
        let (_, peaked_counts) = counted(|| {
            for _ in 0..10 {
                let mut refs: Vec<&mut Sampler> = device_samplers[3..5].iter_mut().collect();
                pick_rows(peaked.clone(), &mut refs);
            }
        });
        (
            on_device,
            on_host,
            (counts.syncs, counts.read_bytes),
            peaked_counts.syncs,
        )
    }
}

#[test]
fn device_sampling_equals_host_sampling() {
    for kind in [BackendKind::Wgpu, BackendKind::Cpu] {
        let (device, host, (syncs, bytes), peaked_syncs) = run_on(kind, Picks).expect("backend");
        assert_eq!(device, host, "{kind:?}: tokens per step, per row");
        // The draws did move: sampled rows do not repeat one token throughout.
        for r in 1..settings().len() {
            let first = host[0][r];
            assert!(
                host.iter().any(|step| step[r] != first),
                "row {r} never varies"
            );
        }
        if kind == BackendKind::Wgpu {
            assert_eq!(syncs, 1, "one read-back");
            assert!(bytes <= 3 * 8, "{bytes} bytes read back for 3 ids");
            assert!(peaked_syncs <= 12, "{peaked_syncs} read-backs for 10 steps");
        }
    }
}
