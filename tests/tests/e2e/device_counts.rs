//! Dispatches and host-device synchronisations per decode step, counted exactly
//! (`fornax_engine::device_counts`), and greedy tokens chosen on the device.

use burn_tensor::{Tensor, TensorData};
use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::device_counts::{counted, DeviceCounts};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy};
use fornax_engine::model::{LoadOptions, Logits, Model, SeqTokens};
use fornax_engine::sampling::{argmax, argmax_rows};
use fornax_engine::store::ModelFile;
use fornax_engine::EngineBackend;

use crate::common::{gemma_file, model_file, run_on, wgpu_alone};

/// Two greedy decode steps of the real model for `batch` sequences after an 8-token
/// prompt each, over the paged cache (as the engine and server run), each step counted:
/// the layer count and the steps' counts. With `tiled_steps` the steps multiply their
/// tokens with the tiled kernel on every device ([`TiledEverywhere`]).
struct DecodeSteps {
    file: fn() -> &'static ModelFile,
    batch: usize,
    options: LoadOptions,
    tiled_steps: bool,
}

const ONE: DecodeSteps = DecodeSteps {
    file: model_file,
    batch: 1,
    options: LoadOptions {
        dequantize: false,
        reference_ops: false,
    },
    tiled_steps: false,
};

impl BackendTask for DecodeSteps {
    type Output = (usize, [DeviceCounts; 2]);

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Self::Output {
        let gguf = GgufFile::parse((self.file)().bytes()).expect("model");
        let model = Model::<B>::from_gguf_with(&gguf, &device, self.options, &mut |_, _| {})
            .expect("model");
        let capacity = KvCapacity::f32_only(2 * self.batch);
        let mut kv = model.new_paged_cache(capacity, TierPolicy::ALL_F32);
        let seqs: Vec<_> = (0..self.batch).map(|_| kv.add_sequence()).collect();
        let prompt = [1, 504, 3575, 282, 4649, 314, 253, 2];
        let batch: Vec<_> = seqs
            .iter()
            .map(|&seq| SeqTokens {
                seq,
                tokens: &prompt,
            })
            .collect();
        let logits = model
            .forward_batch(&batch, &mut kv, Logits::Last)
            .expect("prefill");
        let mut next = argmax_rows(logits);
        let _tiled = self.tiled_steps.then(TiledEverywhere::on);
        let steps = [(); 2].map(|_| {
            let (tokens, counts) = counted(|| {
                let batch: Vec<_> = seqs
                    .iter()
                    .zip(&next)
                    .map(|(&seq, t)| SeqTokens {
                        seq,
                        tokens: std::slice::from_ref(t),
                    })
                    .collect();
                let logits = model
                    .forward_batch(&batch, &mut kv, Logits::Last)
                    .expect("decode");
                argmax_rows(logits)
            });
            next = tokens;
            counts
        });
        eprintln!(
            "[{} on {}, {} sequences{}] decode step: {} dispatches ({:.1} per layer), {} syncs, {} bytes read back",
            info.kind,
            info.adapter,
            self.batch,
            if self.options.reference_ops { ", reference ops" } else { "" },
            steps[1].dispatches,
            steps[1].dispatches as f64 / model.config.n_layers as f64,
            steps[1].syncs,
            steps[1].read_bytes
        );
        (model.config.n_layers, steps)
    }
}

/// On a CubeCL device every kernel launch of a decode step is counted, the count is the
/// same step after step, and the step reads back one token id: one sync of at most 8
/// bytes, not the 49,152 logits.
#[test]
fn decode_step_dispatches_and_syncs_are_counted_on_wgpu() {
    let (layers, [a, b]) = run_on(BackendKind::Wgpu, ONE).expect("a wgpu adapter");
    assert!(
        a.dispatches >= layers as u64,
        "at least one dispatch per layer, counted {}",
        a.dispatches
    );
    assert_eq!(
        a.dispatches, b.dispatches,
        "steady decode steps dispatch alike"
    );
    for step in [a, b] {
        assert_eq!(step.syncs, 1, "one read-back per step");
        assert!(step.read_bytes <= 8, "read back {} bytes", step.read_bytes);
    }
}

/// The dispatch budget of the fused layers: a decode step (embedding, every layer, final
/// norm, output product and greedy choice together) launches at most 8 kernels per layer,
/// alone and for a batch of sequences, and at most a quarter of what the same step costs
/// operation by operation (`--reference-ops`).
#[test]
fn fused_decode_step_launches_at_most_eight_kernels_per_layer() {
    let reference = DecodeSteps {
        batch: 1,
        options: LoadOptions {
            reference_ops: true,
            ..LoadOptions::default()
        },
        ..ONE
    };
    let (_, [_, by_operation]) = run_on(BackendKind::Wgpu, reference).expect("a wgpu adapter");
    for batch in [1, 4] {
        let steps = DecodeSteps { batch, ..ONE };
        let (layers, [_, step]) = run_on(BackendKind::Wgpu, steps).unwrap();
        assert!(
            step.dispatches <= 8 * layers as u64,
            "{batch} sequences: {} dispatches for {layers} layers",
            step.dispatches
        );
        if batch == 1 {
            assert!(
                4 * step.dispatches <= by_operation.dispatches,
                "fused {} against {} operation by operation",
                step.dispatches,
                by_operation.dispatches
            );
        }
    }
}

/// Gemma 3's blocks run fused as well: its head norms and NeoX RoPE take one kernel after
/// the QKV product and each post norm one with its residual add, so a decode step launches
/// 9 kernels per layer (plus at most 12 for the embedding, the final norm, the output
/// product and the greedy choice), a quarter or less of the same step operation by
/// operation.
#[test]
fn gemma_fused_decode_step_launches_at_most_nine_kernels_per_layer() {
    let gemma = DecodeSteps {
        file: gemma_file,
        ..ONE
    };
    let reference = DecodeSteps {
        options: LoadOptions {
            reference_ops: true,
            ..LoadOptions::default()
        },
        ..gemma
    };
    let (_, [_, by_operation]) = run_on(BackendKind::Wgpu, reference).expect("a wgpu adapter");
    let (layers, [_, step]) = run_on(BackendKind::Wgpu, gemma).unwrap();
    assert!(
        step.dispatches <= 9 * layers as u64 + 12,
        "{} dispatches for {layers} layers",
        step.dispatches
    );
    assert!(
        4 * step.dispatches <= by_operation.dispatches,
        "fused {} against {} operation by operation",
        step.dispatches,
        by_operation.dispatches
    );
}

/// Keeps products over many tokens on the tiled kernel for as long as it lives (for the
/// whole process: hold [`wgpu_alone`]).
struct TiledEverywhere;

impl TiledEverywhere {
    fn on() -> Self {
        fornax_backends::tile_many_tokens_everywhere(true);
        Self
    }
}

impl Drop for TiledEverywhere {
    fn drop(&mut self) {
        fornax_backends::tile_many_tokens_everywhere(false);
    }
}

/// The way GPUs and the browser multiply more than 8 tokens (the tiled kernel, its
/// epilogue fused) keeps a decode step of 16 sequences within the same budget of 8 launches
/// per layer. Lavapipe by default multiplies so many rows as FP32 matmuls, with more
/// launches, because that is faster there; the test asks for the tiled kernel in the
/// decode steps (the prefill keeps lavapipe's way), alone on the device, since the choice
/// holds for the whole process.
#[test]
fn tiled_decode_of_many_sequences_launches_at_most_eight_kernels_per_layer() {
    let _alone = wgpu_alone();
    let steps = DecodeSteps {
        batch: 16,
        tiled_steps: true,
        ..ONE
    };
    let (layers, [_, step]) =
        fornax_backends::run_on(BackendKind::Wgpu, steps).expect("a wgpu adapter");
    assert!(
        step.dispatches <= 8 * layers as u64,
        "16 sequences: {} dispatches for {layers} layers",
        step.dispatches
    );
    assert_eq!(step.syncs, 1, "one read-back per step");
}

/// The CPU backend launches no kernels and reads nothing back: the greedy token is
/// picked from the logits where they lie (`SamplingOps::argmax_ids`).
#[test]
fn cpu_decode_step_launches_no_kernels() {
    let (_, steps) = run_on(BackendKind::Cpu, ONE).unwrap();
    for step in steps {
        assert_eq!(step.dispatches, 0);
        assert_eq!(step.syncs, 0);
        assert_eq!(step.read_bytes, 0);
    }
}

/// Greedy tokens chosen on the device equal the host's argmax on a fixed logits tensor:
/// a tie (the lowest index wins), the maximum at the last index, random rows.
struct GreedyRows;

impl BackendTask for GreedyRows {
    type Output = (Vec<u32>, Vec<u32>);

    fn run<B: EngineBackend>(self, device: B::Device, _: DeviceInfo) -> Self::Output {
        let vocab = 49_152;
        let rows = 5;
        let mut state = 12345u64;
        let mut logits: Vec<f32> = (0..rows * vocab)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 20.0 - 10.0
            })
            .collect();
        // Row 0: a tie between 700 and 30,000; row 1: the maximum at the last index.
        logits[700] = 50.0;
        logits[30_000] = 50.0;
        logits[2 * vocab - 1] = 60.0;
        let host: Vec<u32> = logits.chunks_exact(vocab).map(argmax).collect();
        let t = Tensor::<B, 2>::from_data(TensorData::new(logits, [rows, vocab]), &device);
        (argmax_rows(t), host)
    }
}

#[test]
fn device_greedy_equals_host_argmax() {
    for kind in [BackendKind::Wgpu, BackendKind::Cpu] {
        let (device, host) = run_on(kind, GreedyRows).expect("backend");
        assert_eq!(device, host, "{kind:?}");
        assert_eq!(host[0], 700);
        assert_eq!(host[1], 49_151);
    }
}
