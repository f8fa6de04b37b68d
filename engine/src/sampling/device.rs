//! Tokens chosen where the logits are: a step reads back one token id per sequence instead
//! of its whole row of logits (49,152 floats for the default model). Greedy rows take the
//! row's argmax (burn's reduction on CubeCL backends, the host's vectorised
//! [`super::argmax`] on the CPU backend); sampled rows go through our sampling kernel
//! (`fornax_shaders::sampling`) on CubeCL backends, with the draw made on the host from
//! the request's seeded generator. A row whose token lies beyond the kernel's window, and
//! every row on other backends, is read back and sampled on the host with the same draw.
//! A row that needs only its grammar's mask is masked where the logits are: the mask goes
//! to the device packed, a bit per token ([`mask_rows`]), and the row is then picked there
//! like any other; rows with penalties or log-probabilities are read back.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_tensor::{backend::Backend, ElementConversion, Int, Tensor, TensorData};
use fornax_shaders::sampling::{FALLBACK, PARAMS, WINDOW};

use super::{Draw, HostRow, Sampler, TokenLogprobs};
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

    /// Whether grammars' masks are applied where the logits are ([`mask_rows`]) rather
    /// than on rows read back.
    fn masks_on_device() -> bool {
        true
    }
}

impl SamplingOps for crate::CpuBackend {
    /// The logits are on the host already: a masked row is read (copied) and masked there.
    fn masks_on_device() -> bool {
        false
    }

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
        // The kernel reads FP32, FP16 or BF16 logits and writes 32-bit ids.
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
            (&logits.device(), burn_tensor::DType::F32),
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

/// `logits` `[rows, vocab]` with each token that row `i`'s mask does not allow set to
/// minus infinity (`None`: every token allowed), where the logits are: the masks go up
/// packed, a bit per token (`vocab / 32` words a row: 6 KB for 49,152 tokens instead of
/// the row's 192 KB coming down), and are expanded into the fill's condition there.
pub fn mask_rows<B: Backend>(logits: Tensor<B, 2>, masks: &[Option<&Mask>]) -> Tensor<B, 2> {
    let [rows, vocab] = logits.dims();
    assert_eq!(rows, masks.len(), "a mask per row");
    let words = vocab.div_ceil(32);
    let packed: Vec<i64> = masks
        .iter()
        .flat_map(|m| {
            let w = m.map_or(&[][..], |m| m.words());
            // Words as i32 bit patterns (the device's integers); past the mask: none allowed.
            (0..words).map(move |i| match m {
                None => -1,
                Some(_) => i64::from(w.get(i).copied().unwrap_or(0) as i32),
            })
        })
        .collect();
    let device = logits.device();
    let packed = Tensor::<B, 2, Int>::from_data(TensorData::new(packed, [rows, words]), &device);
    let token = Tensor::<B, 1, Int>::arange(0..vocab as i64, &device);
    let word = token
        .clone()
        .div_scalar(32)
        .unsqueeze::<2>()
        .expand([rows, vocab]);
    let bit = token
        .remainder_scalar(32)
        .unsqueeze::<2>()
        .expand([rows, vocab]);
    let allowed = packed
        .gather(1, word)
        .bitwise_right_shift(bit)
        .bitwise_and_scalar(1i32.elem());
    logits.mask_fill(allowed.equal_elem(0), f32::NEG_INFINITY)
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
/// there (penalties, log-probabilities: [`Sampler::sample_hosted`]): those rows' logits are
/// read back; the other rows are picked as [`pick_rows`] picks them, a row that needs only
/// its grammar's mask masked on the device first ([`mask_rows`], with `device_masks` and
/// where the backend does: [`SamplingOps::masks_on_device`]). Returns each row's token
/// and, where asked, its log-probabilities.
pub fn pick_rows_hosted<B: SamplingOps>(
    logits: Tensor<B, 2>,
    samplers: &mut [&mut Sampler],
    hosted: &[Option<HostRow<'_>>],
    device_masks: bool,
) -> (Vec<u32>, Vec<Option<TokenLogprobs>>) {
    let host = |i: usize| hosted.get(i).and_then(Option::as_ref);
    let device_masks = device_masks && B::masks_on_device();
    let read: Vec<bool> = (0..samplers.len())
        .map(|i| {
            host(i)
                .is_some_and(|h| !device_masks || h.logprobs.is_some() || samplers[i].needs_host())
        })
        .collect();
    let (on_host, on_device): (Vec<usize>, Vec<usize>) =
        (0..samplers.len()).partition(|&i| read[i]);
    let masks: Vec<Option<&Mask>> = on_device
        .iter()
        .map(|&i| host(i).and_then(|h| h.mask.as_ref()))
        .collect();
    let masked = masks.iter().any(Option::is_some);
    let mut logprobs = vec![None; samplers.len()];
    if on_host.is_empty() && !masked {
        return (pick_rows(logits, samplers), logprobs);
    }
    let mut tokens = vec![0; samplers.len()];
    let (mut host_samplers, mut device_samplers) = (Vec::new(), Vec::new());
    for (i, s) in samplers.iter_mut().enumerate() {
        match read[i] {
            true => host_samplers.push(&mut **s),
            false => device_samplers.push(&mut **s),
        }
    }
    let host_logits = match (on_device.is_empty(), on_host.is_empty()) {
        (true, _) => Some(logits),
        (false, all_device) => {
            let rows = match all_device {
                true => logits.clone(),
                false => select_rows(logits.clone(), &on_device),
            };
            let rows = match masked {
                true => mask_rows(rows, &masks),
                false => rows,
            };
            for (&r, t) in on_device.iter().zip(pick_rows(rows, &mut device_samplers)) {
                tokens[r] = t;
            }
            (!all_device).then(|| select_rows(logits, &on_host))
        }
    };
    let Some(host_logits) = host_logits else {
        return (tokens, logprobs);
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
