//! Tokens chosen where the logits are: a step reads back one token id per sequence instead
//! of its whole row of logits (49,152 floats for the default model). Greedy rows take the
//! row's argmax (burn's reduction on CubeCL backends, the host's vectorised
//! [`super::argmax`] on the CPU backend); sampled rows go through our sampling kernel
//! (`fornax_shaders::sampling`) on CubeCL backends, with the draw made on the host from
//! the request's seeded generator. A row whose token lies beyond the kernel's window, and
//! every row on other backends, is read back and sampled on the host with the same draw.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_tensor::{backend::Backend, Int, Tensor, TensorData};
use fornax_shaders::sampling::{FALLBACK, PARAMS, WINDOW};

use super::{Draw, HostRow, Sampler, TokenLogprobs};
use crate::device_counts::{read_back, read_back_async};
use crate::{logits_to_vec, logits_to_vec_async};

fn ids(data: TensorData) -> Vec<u32> {
    data.convert::<i64>()
        .iter::<i64>()
        .map(|i| i as u32)
        .collect()
}

fn argmax<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 2, Int> {
    // burn's argmax (cubek's reduction on CubeCL devices) keeps the lowest index on
    // ties, as `super::argmax` does.
    logits.argmax(1)
}

/// burn's argmax of each row on the device and one read-back of the ids.
fn device_argmax_ids<B: Backend>(logits: Tensor<B, 2>) -> Vec<u32> {
    ids(read_back(argmax(logits)))
}

/// The greedy token of each row of `logits` `[rows, vocab]`, chosen where the logits are
/// (on a GPU, one read-back of `rows` ids).
pub fn argmax_rows<B: SamplingOps>(logits: Tensor<B, 2>) -> Vec<u32> {
    B::argmax_ids(logits)
}

/// [`argmax_rows`] without blocking the thread (in a browser).
pub async fn argmax_rows_async<B: Backend>(logits: Tensor<B, 2>) -> Result<Vec<u32>, String> {
    Ok(ids(read_back_async(argmax(logits)).await?))
}

/// Backends that can sample on the device.
pub trait SamplingOps: Backend {
    /// The token of each row of `logits` under its draw, or [`FALLBACK`] where the host
    /// must choose; `None` where this backend has no sampling kernel.
    fn sample_rows(_logits: Tensor<Self, 2>, _draws: &[Draw]) -> Option<Tensor<Self, 1, Int>> {
        None
    }

    /// The greedy token of each row of `logits`: burn's argmax on the device and one
    /// read-back of the ids.
    fn argmax_ids(logits: Tensor<Self, 2>) -> Vec<u32> {
        device_argmax_ids(logits)
    }
}

impl SamplingOps for crate::CpuBackend {
    /// The host's vectorised argmax over the logits where they lie (burn-ndarray's
    /// reduction and the row copies around it took 50 us a row).
    fn argmax_ids(logits: Tensor<Self, 2>) -> Vec<u32> {
        let [_, vocab] = logits.dims();
        crate::host_values::host_f32(logits)
            .chunks_exact(vocab.max(1))
            .map(super::argmax)
            .collect()
    }
}

impl<R, F, I, BT> SamplingOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn sample_rows(logits: Tensor<Self, 2>, draws: &[Draw]) -> Option<Tensor<Self, 1, Int>> {
        // The kernel reads FP32 logits and writes 32-bit ids.
        let fits = F::dtype() == burn_tensor::DType::F32 && I::dtype().size() == 4;
        if !fits || draws.iter().any(|d| d.top_k > WINDOW) {
            return None;
        }
        let params: Vec<f32> = draws
            .iter()
            .flat_map(|d| [d.temperature, d.top_k as f32, d.top_p, d.u])
            .collect();
        let params = Tensor::<Self, 1>::from_data(
            TensorData::new(params, [draws.len() * PARAMS]),
            &logits.device(),
        );
        let out = fornax_shaders::sampling_launch::sample(
            logits.into_primitive().tensor(),
            params.into_primitive().tensor(),
            I::dtype(),
        );
        Some(Tensor::from_primitive(out))
    }
}

/// How a step's rows get their tokens.
enum Plan<B: Backend> {
    /// Every row greedy: the logits for [`SamplingOps::argmax_ids`].
    Greedy(Tensor<B, 2>),
    /// The sampling kernel's ids, with the logits for rows that fall back.
    Device(Tensor<B, 1, Int>, Tensor<B, 2>),
    /// Every row from the logits on the host.
    Host(Tensor<B, 2>),
}

fn plan<B: SamplingOps>(logits: Tensor<B, 2>, draws: &[Draw]) -> Plan<B> {
    if draws.iter().all(|d| d.top_k == 1) {
        return Plan::Greedy(logits);
    }
    match B::sample_rows(logits.clone(), draws) {
        Some(ids) => Plan::Device(ids, logits),
        None => Plan::Host(logits),
    }
}

/// The host's choice for each row of `values` (`vocab` wide).
fn choose_all(values: &[f32], samplers: &[&mut Sampler], draws: &[Draw]) -> Vec<u32> {
    let vocab = values.len() / draws.len().max(1);
    values
        .chunks_exact(vocab.max(1))
        .zip(samplers.iter().zip(draws))
        .map(|(row, (s, d))| s.choose(row, d.u))
        .collect()
}

/// Rows answered [`FALLBACK`].
fn fallback_rows(tokens: &[u32]) -> Vec<usize> {
    (0..tokens.len())
        .filter(|&i| tokens[i] == FALLBACK)
        .collect()
}

/// `rows` of `logits`, in order.
pub(crate) fn select_rows<B: Backend>(logits: Tensor<B, 2>, rows: &[usize]) -> Tensor<B, 2> {
    let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [rows.len()]), &logits.device());
    logits.select(0, idx)
}

/// The host's choice for the fallback `rows` of `tokens`, whose logits are `values`.
fn fill(
    tokens: &mut [u32],
    rows: &[usize],
    values: &[f32],
    samplers: &[&mut Sampler],
    draws: &[Draw],
) {
    let vocab = values.len() / rows.len();
    for (k, &r) in rows.iter().enumerate() {
        tokens[r] = samplers[r].choose(&values[k * vocab..(k + 1) * vocab], draws[r].u);
    }
}

async fn logits_async<B: Backend>(logits: Tensor<B, 2>) -> Result<Vec<f32>, String> {
    logits_to_vec_async(logits).await.map_err(|e| e.to_string())
}

/// One token per row of `logits` `[rows, vocab]`, row `i` drawn by `samplers[i]` (each
/// takes its draw here, as [`Sampler::sample`] would): chosen on the device where it can
/// be (one read-back of the ids), else on the host from the logits read back.
pub fn pick_rows<B: SamplingOps>(logits: Tensor<B, 2>, samplers: &mut [&mut Sampler]) -> Vec<u32> {
    let draws: Vec<Draw> = samplers.iter_mut().map(|s| s.draw()).collect();
    match plan(logits, &draws) {
        Plan::Greedy(logits) => B::argmax_ids(logits),
        Plan::Host(logits) => choose_all(&logits_to_vec(logits), samplers, &draws),
        Plan::Device(ids_t, logits) => {
            let mut tokens = ids(read_back(ids_t));
            let rows = fallback_rows(&tokens);
            if !rows.is_empty() {
                let values = logits_to_vec(select_rows(logits, &rows));
                fill(&mut tokens, &rows, &values, samplers, &draws);
            }
            tokens
        }
    }
}

/// [`pick_rows`] with row `i` chosen on the host where `hosted[i]` says what it needs
/// there (a grammar's mask, penalties, log-probabilities: [`Sampler::sample_hosted`]):
/// those rows' logits are read back; the other rows are picked as [`pick_rows`] picks
/// them. Returns each row's token and, where asked, its log-probabilities.
pub fn pick_rows_hosted<B: SamplingOps>(
    logits: Tensor<B, 2>,
    samplers: &mut [&mut Sampler],
    hosted: &[Option<HostRow<'_>>],
) -> (Vec<u32>, Vec<Option<TokenLogprobs>>) {
    let host = |i: usize| hosted.get(i).and_then(Option::as_ref);
    let (on_host, free): (Vec<usize>, Vec<usize>) =
        (0..samplers.len()).partition(|&i| host(i).is_some());
    let mut logprobs = vec![None; samplers.len()];
    if on_host.is_empty() {
        return (pick_rows(logits, samplers), logprobs);
    }
    let mut tokens = vec![0; samplers.len()];
    let (mut host_samplers, mut free_samplers) = (Vec::new(), Vec::new());
    for (i, s) in samplers.iter_mut().enumerate() {
        match host(i) {
            Some(_) => host_samplers.push(&mut **s),
            None => free_samplers.push(&mut **s),
        }
    }
    let host_logits = match free.is_empty() {
        true => logits,
        false => {
            let picked = pick_rows(select_rows(logits.clone(), &free), &mut free_samplers);
            for (&r, t) in free.iter().zip(picked) {
                tokens[r] = t;
            }
            select_rows(logits, &on_host)
        }
    };
    let mut values = logits_to_vec(host_logits);
    let vocab = values.len() / on_host.len();
    let rows = values.chunks_exact_mut(vocab);
    for ((&r, row), s) in on_host.iter().zip(rows).zip(host_samplers) {
        (tokens[r], logprobs[r]) = s.sample_hosted(row, host(r).expect("a hosted row"));
    }
    (tokens, logprobs)
}

/// [`pick_rows`] without blocking the thread (in a browser).
pub async fn pick_rows_async<B: SamplingOps>(
    logits: Tensor<B, 2>,
    samplers: &mut [&mut Sampler],
) -> Result<Vec<u32>, String> {
    let draws: Vec<Draw> = samplers.iter_mut().map(|s| s.draw()).collect();
    Ok(match plan(logits, &draws) {
        Plan::Greedy(logits) => argmax_rows_async(logits).await?,
        Plan::Host(logits) => choose_all(&logits_async(logits).await?, samplers, &draws),
        Plan::Device(ids_t, logits) => {
            let mut tokens = ids(read_back_async(ids_t).await?);
            let rows = fallback_rows(&tokens);
            if !rows.is_empty() {
                let values = logits_async(select_rows(logits, &rows)).await?;
                fill(&mut tokens, &rows, &values, samplers, &draws);
            }
            tokens
        }
    })
}
