//! `fornax bench single`: one sequence's prefill and decode speed over the paged KV cache
//! (as the server runs it), the device memory of the weights, and dispatches and syncs per
//! decoded token, side by side in one run: quantized weights through the fused kernels,
//! quantized weights operation by operation (`--reference-ops`) and FP32 weights.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::device_counts::{counted, DeviceCounts};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::{LoadOptions, Logits, Model};
use fornax_engine::sampling::argmax_rows;
use fornax_engine::seq_cache::{PagedSeq, SeqCache};
use fornax_engine::tokenizer::Tokenizer;
use fornax_engine::{prefill_logits, EngineBackend};

use crate::{median, text_prompt};
use fornax_options::{load_model, parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct SingleArgs {
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens decoded per run.
    #[arg(long, default_value_t = 32)]
    pub gen_tokens: usize,
    /// Measured runs (after one warm-up run).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    #[command(flatten)]
    pub model: ModelArgs,
}

struct Single<'a> {
    args: &'a SingleArgs,
    gguf: &'a GgufFile<'a>,
    tok: &'a Tokenizer,
    file_bytes: usize,
}

/// Figures of one way of holding the weights.
struct PathFigures {
    name: &'static str,
    quantized: usize,
    matrices: usize,
    weight_bytes: usize,
    /// Growth of the allocator's bytes in use while loading, where the backend reports it.
    device_bytes: Option<u64>,
    load_s: f64,
    prefill_tps: f64,
    decode_tps: f64,
    /// Dispatches, read-backs and bytes read back per decoded token (the last run).
    per_token: DeviceCounts,
}

impl Single<'_> {
    fn prompt(&self) -> Result<Vec<u32>> {
        text_prompt(self.tok, self.args.prompt_tokens)
    }

    fn measure<B: EngineBackend>(
        &self,
        device: &B::Device,
        name: &'static str,
        options: LoadOptions,
    ) -> Result<PathFigures> {
        let a = self.args;
        let before = B::device_memory(device);
        let t = Instant::now();
        let model: Model<B> = load_model::<B>(self.gguf, device, options)?;
        B::sync(device)?;
        let load_s = t.elapsed().as_secs_f64();
        let device_bytes = B::device_memory(device)
            .zip(before)
            .map(|(after, before)| after.bytes_in_use.saturating_sub(before.bytes_in_use));
        let prompt = self.prompt()?;
        let blocks = (prompt.len() + a.gen_tokens).div_ceil(BLOCK_TOKENS) + 1;
        let mut kv = model.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
        let (mut prefill_tps, mut decode_tps) = (Vec::new(), Vec::new());
        let mut decode_counts = DeviceCounts::default();
        for run in 0..=a.runs {
            let mut seq = PagedSeq::new(&mut kv);
            let t = Instant::now();
            let mut next = argmax_rows(prefill_logits(&model, &prompt, &mut seq, 256)?)[0];
            let prefill_s = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let decoded: Result<()>;
            (decoded, decode_counts) = counted(|| {
                for _ in 0..a.gen_tokens {
                    next = argmax_rows(seq.forward(&model, &[next], Logits::Last)?)[0];
                }
                Ok(())
            });
            decoded?;
            let decode_s = t.elapsed().as_secs_f64();
            if run > 0 {
                prefill_tps.push(prompt.len() as f64 / prefill_s);
                decode_tps.push(a.gen_tokens as f64 / decode_s);
            }
        }
        Ok(PathFigures {
            name,
            quantized: model.matrices().filter(|m| m.is_quantized()).count(),
            matrices: model.matrices().count(),
            weight_bytes: model.weight_bytes(),
            device_bytes,
            load_s,
            prefill_tps: median(prefill_tps),
            decode_tps: median(decode_tps),
            per_token: DeviceCounts {
                dispatches: decode_counts.dispatches / a.gen_tokens.max(1) as u64,
                syncs: decode_counts.syncs / a.gen_tokens.max(1) as u64,
                read_bytes: decode_counts.read_bytes / a.gen_tokens.max(1) as u64,
            },
        })
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

impl BackendTask for Single<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        let mut paths = Vec::new();
        if B::has_quant_kernels() && !a.model.dequantize {
            if B::has_fused_layers() {
                paths.push(self.measure::<B>(&device, "fused", LoadOptions::default())?);
            }
            let reference = LoadOptions {
                reference_ops: true,
                ..LoadOptions::default()
            };
            paths.push(self.measure::<B>(&device, "quantized", reference)?);
        }
        paths.push(self.measure::<B>(
            &device,
            "f32",
            LoadOptions {
                dequantize: true,
                ..LoadOptions::default()
            },
        )?);

        println!(
            "backend: {} | adapter: {} | dtype: {}",
            info.kind, info.adapter, info.dtype
        );
        println!(
            "model file: {} | prompt {} tokens, {} decoded tokens, median of {} runs",
            mb(self.file_bytes as u64),
            a.prompt_tokens,
            a.gen_tokens,
            a.runs
        );
        if !B::has_quant_kernels() {
            println!("this backend has no quantized-weight kernels: weights are FP32");
        }
        println!(
            "| path | quantized matrices | weight bytes | device memory (vs file) | load s | prefill tok/s | decode tok/s | dispatches per decoded token | syncs per decoded token | bytes read back per token |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for p in &paths {
            let device = match p.device_bytes {
                Some(b) => format!(
                    "{} ({:+.1}%)",
                    mb(b),
                    (b as f64 / self.file_bytes as f64 - 1.0) * 100.0
                ),
                None => "host memory".to_string(),
            };
            println!(
                "| {} | {}/{} | {} | {device} | {:.2} | {:.1} | {:.2} | {} | {} | {} |",
                p.name,
                p.quantized,
                p.matrices,
                mb(p.weight_bytes as u64),
                p.load_s,
                p.prefill_tps,
                p.decode_tps,
                p.per_token.dispatches,
                p.per_token.syncs,
                p.per_token.read_bytes
            );
        }
        let [.., q, f] = &paths[..] else {
            return Ok(());
        };
        if q.name == "quantized" {
            println!(
                "quantized vs f32: weights {:.2}x smaller, prefill {:.2}x, decode {:.2}x",
                f.weight_bytes as f64 / q.weight_bytes as f64,
                q.prefill_tps / f.prefill_tps,
                q.decode_tps / f.decode_tps
            );
        }
        if let [fused, reference, _] = &paths[..] {
            println!(
                "fused vs reference ops: dispatches per decoded token {:.2}x fewer, prefill {:.2}x, decode {:.2}x",
                reference.per_token.dispatches as f64 / fused.per_token.dispatches.max(1) as f64,
                fused.prefill_tps / reference.prefill_tps,
                fused.decode_tps / reference.decode_tps
            );
        }
        Ok(())
    }
}

pub fn run(args: SingleArgs) -> Result<()> {
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let tok = tokenizer(&gguf)?;
    args.model.run_on(Single {
        args: &args,
        gguf: &gguf,
        tok: &tok,
        file_bytes: file.bytes().len(),
    })?
}
