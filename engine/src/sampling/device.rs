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

use super::{Draw, Sampler};
use crate::device_counts::{read_back, read_back_async};
use crate::grammar::Mask;
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

/// Rows answered [`FALLBACK`], as an index tensor on `logits`' device.
fn fallback_rows<B: Backend>(
    tokens: &[u32],
    device: &B::Device,
) -> Option<(Vec<usize>, Tensor<B, 1, Int>)> {
    let rows: Vec<usize> = (0..tokens.len())
        .filter(|&i| tokens[i] == FALLBACK)
        .collect();
    if rows.is_empty() {
        return None;
    }
    let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let t = Tensor::from_data(TensorData::new(idx, [rows.len()]), device);
    Some((rows, t))
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
            if let Some((rows, idx)) = fallback_rows::<B>(&tokens, &logits.device()) {
                let values = logits_to_vec(logits.select(0, idx));
                fill(&mut tokens, &rows, &values, samplers, &draws);
            }
            tokens
        }
    }
}

/// [`pick_rows`] with row `i` restricted to the tokens `masks[i]` allows, if any: the
/// masked rows' logits are read back, masked and chosen from on the host; the other rows
/// are picked as [`pick_rows`] picks them.
pub fn pick_rows_masked<B: SamplingOps>(
    logits: Tensor<B, 2>,
    samplers: &mut [&mut Sampler],
    masks: &[Option<Mask>],
) -> Vec<u32> {
    let masked: Vec<usize> = (0..samplers.len())
        .filter(|&i| masks.get(i).is_some_and(Option::is_some))
        .collect();
    if masked.is_empty() {
        return pick_rows(logits, samplers);
    }
    let device = logits.device();
    let select = |rows: &[usize]| {
        let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [rows.len()]), &device);
        logits.clone().select(0, idx)
    };
    let mut tokens = vec![0; samplers.len()];
    let (free_refs, masked_refs): (Vec<_>, Vec<_>) = samplers
        .iter_mut()
        .enumerate()
        .partition(|(i, _)| !masked.contains(i));
    let free: Vec<usize> = free_refs.iter().map(|(i, _)| *i).collect();
    let mut free_refs: Vec<&mut Sampler> = free_refs.into_iter().map(|(_, s)| &mut **s).collect();
    let mut masked_refs: Vec<&mut Sampler> =
        masked_refs.into_iter().map(|(_, s)| &mut **s).collect();
    let masked_logits = match free.is_empty() {
        true => logits.clone(),
        false => select(&masked),
    };
    if !free.is_empty() {
        for (&r, t) in free.iter().zip(pick_rows(select(&free), &mut free_refs)) {
            tokens[r] = t;
        }
    }
    choose_masked(&mut tokens, &masked, masked_logits, &mut masked_refs, masks);
    tokens
}

/// Chooses `tokens[r]` for each masked row `r` of `rows` from `logits` (those rows, in
/// order), each masked by `masks[r]`, drawn by `samplers` (one per row of `rows`).
fn choose_masked<B: Backend>(
    tokens: &mut [u32],
    rows: &[usize],
    logits: Tensor<B, 2>,
    samplers: &mut [&mut Sampler],
    masks: &[Option<Mask>],
) {
    let mut values = logits_to_vec(logits);
    let vocab = values.len() / rows.len();
    let draws: Vec<Draw> = samplers.iter_mut().map(|s| s.draw()).collect();
    for (k, &r) in rows.iter().enumerate() {
        let row = &mut values[k * vocab..(k + 1) * vocab];
        if let Some(mask) = &masks[r] {
            mask.apply(row);
        }
        tokens[r] = samplers[k].choose(row, draws[k].u);
    }
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
            if let Some((rows, idx)) = fallback_rows::<B>(&tokens, &logits.device()) {
                let values = logits_async(logits.select(0, idx)).await?;
                fill(&mut tokens, &rows, &values, samplers, &draws);
            }
            tokens
        }
    })
}
