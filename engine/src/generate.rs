//! The generation loop for one sequence: chunked prefill, then one token per step (and
//! the tokens a grammar forces with it).

use crate::device_counts::{read_back, read_back_async};
use crate::EngineBackend;
use burn_tensor::{backend::Backend, Tensor, TensorData};

use crate::grammar::Constraint;
use crate::model::{Logits, Model, ModelError};
use crate::sampling::{mask_rows, pick_rows, pick_rows_async, Sampler, SamplingParams};
use crate::seq_cache::SeqCache;

/// Settings of one generation.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops after emitting any of these.
    pub stop_ids: Vec<u32>,
    /// Prompt tokens per forward pass during prefill.
    pub prefill_chunk: usize,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 32,
            sampling: SamplingParams::greedy(),
            stop_ids: Vec::new(),
            prefill_chunk: 256,
        }
    }
}

/// Reads a `[1, vocab]` or `[rows, vocab]` logits tensor back to the host.
pub fn logits_to_vec<B: Backend>(logits: Tensor<B, 2>) -> Vec<f32> {
    floats(read_back(logits))
}

/// [`logits_to_vec`] without blocking the thread: the way to read logits in a browser,
/// where WebGPU maps buffers only asynchronously.
pub async fn logits_to_vec_async<B: Backend>(logits: Tensor<B, 2>) -> Result<Vec<f32>, ModelError> {
    let data = read_back_async(logits)
        .await
        .map_err(ModelError::Readback)?;
    Ok(floats(data))
}

fn floats(data: TensorData) -> Vec<f32> {
    data.convert::<f32>().into_vec::<f32>().expect("f32 logits")
}

/// Runs the prompt through the model in chunks and returns the last position's logits,
/// still on the device.
pub fn prefill_logits<B: EngineBackend>(
    model: &Model<B>,
    prompt: &[u32],
    cache: &mut impl SeqCache<B>,
    chunk: usize,
) -> Result<Tensor<B, 2>, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::EmptyInput);
    }
    let limit = model.config.max_seq_len;
    if cache.cached() + prompt.len() >= limit {
        return Err(ModelError::ContextOverflow {
            needed: cache.cached() + prompt.len() + 1,
            limit,
        });
    }
    let mut last = None;
    for part in prompt.chunks(chunk.max(1)) {
        last = Some(cache.forward(model, part, Logits::Last)?);
    }
    Ok(last.expect("non-empty prompt"))
}

/// Runs the prompt through the model in chunks and returns the last position's logits.
pub fn prefill<B: EngineBackend>(
    model: &Model<B>,
    prompt: &[u32],
    cache: &mut impl SeqCache<B>,
    chunk: usize,
) -> Result<Vec<f32>, ModelError> {
    prefill_logits(model, prompt, cache, chunk).map(logits_to_vec)
}

/// One sequence's generation as steps, for callers that read the logits back themselves
/// (asynchronously in a browser): [`Generation::start`] runs the prompt, then
/// [`Generation::pick`] (or [`Generation::sample`]) picks a token from the last pass's
/// logits and [`Generation::advance`] runs it, until [`Generation::finished`]. Under a
/// grammar ([`Generation::with_constraint`]) each token is sampled under its mask on the
/// host, and the tokens the grammar forces after it join it ([`Generation::pending`]) and
/// run in the same pass.
pub struct Generation<'m, B: EngineBackend, C: SeqCache<B>> {
    model: &'m Model<B>,
    cache: C,
    params: GenerateParams,
    sampler: Sampler,
    constraint: Option<Constraint>,
    /// Whether the grammar was completed by a sampled token.
    complete: bool,
    tokens: Vec<u32>,
    /// Tokens already run through the model (the others run in the next pass).
    fed: usize,
}

impl<'m, B: EngineBackend, C: SeqCache<B>> Generation<'m, B, C> {
    /// Prefills `prompt` into `cache`; returns the generation and the prompt's last logits.
    pub fn start(
        model: &'m Model<B>,
        mut cache: C,
        prompt: &[u32],
        params: GenerateParams,
    ) -> Result<(Self, Tensor<B, 2>), ModelError> {
        let logits = prefill_logits(model, prompt, &mut cache, params.prefill_chunk)?;
        let generation = Self {
            model,
            cache,
            sampler: Sampler::new(params.sampling.clone()),
            constraint: None,
            complete: false,
            tokens: Vec::with_capacity(params.max_tokens),
            fed: 0,
            params,
        };
        Ok((generation, logits))
    }

    /// Makes the output match `constraint`'s grammar; it ends when the grammar is complete.
    pub fn with_constraint(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Picks the next token from the logits read back and records it (with the tokens the
    /// grammar then forces).
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, ModelError> {
        let Some(c) = self.constraint.as_mut() else {
            let token = self.sampler.sample(logits);
            self.tokens.push(token);
            return Ok(token);
        };
        let mut row = logits.to_vec();
        c.mask()?.apply(&mut row);
        let token = self.sampler.sample(&row);
        self.take(token)
    }

    /// Records `token`, chosen under the grammar's mask, and the tokens the grammar then
    /// forces.
    fn take(&mut self, token: u32) -> Result<u32, ModelError> {
        let c = self.constraint.as_mut().expect("constrained");
        self.tokens.push(token);
        // A grammar completed by the sampled token ends the generation; one completed by
        // forced tokens ends at the token sampled after them (the end token, all its mask
        // allows, which it does not consume), as in the engine.
        if !c.is_finished() {
            c.consume(&[token])?;
        }
        self.complete = c.is_finished();
        if self.complete || self.params.stop_ids.contains(&token) {
            return Ok(token);
        }
        // Forced tokens fit what is left of `max_tokens` and of the context.
        let held = self.cache.cached() + self.tokens.len() - self.fed;
        let room = (self.params.max_tokens - self.tokens.len())
            .min(self.model.config.max_seq_len.saturating_sub(held));
        let mut forced = c.forced();
        forced.truncate(room);
        c.consume(&forced)?;
        // The generator moves one draw per token, as the engine's does.
        for _ in &forced {
            self.sampler.draw();
        }
        self.tokens.extend(forced);
        Ok(token)
    }

    /// The logits masked on the device by the grammar (see [`mask_rows`]), where the
    /// backend masks there; `None` without a grammar or where the row is read back.
    fn masked(&mut self, logits: &Tensor<B, 2>) -> Result<Option<Tensor<B, 2>>, ModelError> {
        match self.constraint.as_mut() {
            Some(c) if B::masks_on_device() => {
                let mask = c.mask()?;
                Ok(Some(mask_rows(logits.clone(), &[Some(&mask)])))
            }
            _ => Ok(None),
        }
    }

    /// Picks the next token from the last pass's logits where they are (on the device
    /// where the backend can, reading back one id, a grammar's mask sent there; else the
    /// row is read back and sampled) and records it.
    pub fn pick(&mut self, logits: Tensor<B, 2>) -> Result<u32, ModelError> {
        if let Some(masked) = self.masked(&logits)? {
            let token = pick_rows(masked, &mut [&mut self.sampler])[0];
            return self.take(token);
        }
        if self.constraint.is_some() {
            return self.sample(&logits_to_vec(logits));
        }
        let token = pick_rows(logits, &mut [&mut self.sampler])[0];
        self.tokens.push(token);
        Ok(token)
    }

    /// [`Generation::pick`] without blocking the thread (in a browser).
    pub async fn pick_async(&mut self, logits: Tensor<B, 2>) -> Result<u32, ModelError> {
        if let Some(masked) = self.masked(&logits)? {
            let token = pick_rows_async(masked, &mut [&mut self.sampler])
                .await
                .map_err(ModelError::Readback)?[0];
            return self.take(token);
        }
        if self.constraint.is_some() {
            return self.sample(&logits_to_vec_async(logits).await?);
        }
        let token = pick_rows_async(logits, &mut [&mut self.sampler])
            .await
            .map_err(ModelError::Readback)?[0];
        self.tokens.push(token);
        Ok(token)
    }

    /// The tokens the next pass runs: the one picked last and those its grammar forced.
    pub fn pending(&self) -> &[u32] {
        &self.tokens[self.fed..]
    }

    /// Whether generation ends here: `max_tokens` reached, a stop token sampled, the
    /// grammar complete, or the context full.
    pub fn finished(&self) -> bool {
        self.tokens.len() >= self.params.max_tokens
            || self.tokens[self.fed..]
                .iter()
                .any(|t| self.params.stop_ids.contains(t))
            || self.complete
            || self.cache.cached() + self.pending().len() > self.model.config.max_seq_len
    }

    /// Runs the tokens picked (and forced) since the last pass through the model and
    /// returns the logits of the last.
    pub fn advance(&mut self) -> Result<Tensor<B, 2>, ModelError> {
        if self.fed == self.tokens.len() {
            return Err(ModelError::EmptyInput);
        }
        let logits = self
            .cache
            .forward(self.model, &self.tokens[self.fed..], Logits::Last)?;
        self.fed = self.tokens.len();
        Ok(logits)
    }

    /// The tokens generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The tokens generated.
    pub fn into_tokens(self) -> Vec<u32> {
        self.tokens
    }
}

/// Generates up to `params.max_tokens` tokens after `prompt` over a fresh contiguous
/// cache, calling `on_token` with each one as it is sampled; `on_token` returns `false`
/// to stop early. Returns the new tokens.
pub fn generate<B: EngineBackend>(
    model: &Model<B>,
    prompt: &[u32],
    params: &GenerateParams,
    on_token: impl FnMut(u32) -> bool,
) -> Result<Vec<u32>, ModelError> {
    generate_in(model, &mut model.new_cache(), prompt, params, on_token)
}

/// [`generate`] continuing the sequence in `cache` (contiguous or paged).
pub fn generate_in<B: EngineBackend>(
    model: &Model<B>,
    cache: &mut impl SeqCache<B>,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Vec<u32>, ModelError> {
    if params.max_tokens == 0 {
        prefill_logits(model, prompt, cache, params.prefill_chunk)?;
        return Ok(Vec::new());
    }
    let (mut generation, mut logits) = Generation::start(model, cache, prompt, params.clone())?;
    loop {
        let token = generation.pick(logits)?;
        if !on_token(token) || generation.finished() {
            return Ok(generation.into_tokens());
        }
        logits = generation.advance()?;
    }
}
