//! The "before" of `bench table`: the engine as the seed's A/B test started from. One
//! request at a time in arrival order, each over its own contiguous FP32 KV cache, with
//! whatever weights and operations the model was loaded with (FP32 and operation by
//! operation in the table). Time is virtual as in `bench load`: the clock advances by the
//! measured compute and jumps over idle gaps.

use std::time::Instant;

use anyhow::Result;
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::EngineBackend;
use fornax_engine::{generate, GenerateParams};

use crate::load::{Figures, Job};

/// Serves `jobs` one at a time; a request older than `timeout` seconds is given up, before
/// it starts or while it runs.
pub fn serve_one_at_a_time<B: EngineBackend>(
    model: &Model<B>,
    jobs: &[Job],
    timeout: f64,
) -> Result<Figures> {
    let dims = model.kv_dims();
    // Keys and values of one token in every layer, in FP32.
    let token_bytes = 2 * dims.n_layers * dims.n_kv_heads * dims.head_dim * 4;
    let mut f = Figures::default();
    let start = jobs.first().map_or(0.0, |j| j.arrival);
    let mut now = start;
    for job in jobs {
        now = now.max(job.arrival);
        if now - job.arrival > timeout {
            f.failed += 1;
            continue;
        }
        let params = GenerateParams {
            max_tokens: job.max_tokens,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
            prefill_chunk: 256,
        };
        let t = Instant::now();
        let mut received = 0;
        let mut expired = false;
        let run = generate(model, &job.prompt, &params, |_| {
            let at = now + t.elapsed().as_secs_f64();
            received += 1;
            if received == 1 {
                f.ttft.push(at - job.arrival);
                f.ttft_by_qos[job.qos as usize].push(at - job.arrival);
            }
            expired = at - job.arrival > timeout;
            !expired
        });
        let dt = t.elapsed().as_secs_f64();
        now += dt;
        f.busy += dt;
        match run {
            Ok(tokens) if !expired => {
                f.generated += tokens.len();
                f.e2e.push(now - job.arrival);
                f.computed += (job.prompt.len() + tokens.len()) as u64;
                f.peak_kv_bytes = f
                    .peak_kv_bytes
                    .max((job.prompt.len() + tokens.len()) * token_bytes);
            }
            Ok(_) => f.failed += 1,
            Err(e) => {
                eprintln!("request failed: {e}");
                f.failed += 1;
            }
        }
    }
    f.makespan = now - start;
    Ok(f)
}
