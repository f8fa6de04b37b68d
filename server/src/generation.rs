//! One generation as the HTTP handlers see it: a validated job submitted to the engine
//! loop, then text pieces as tokens arrive, with latency metrics. Dropping a generation
//! before it ends (the client went away) cancels it, so its KV blocks return at once.

use std::sync::Arc;
use std::time::Instant;

use fornax_engine::grammar::Grammar;
use fornax_engine::sampling::{SamplingParams, TokenLogprobs};
use fornax_engine::sched::{FinishReason, RequestId};
use fornax_engine::Request;
use metrics::{counter, histogram};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::access::Caller;
use crate::api::GenerationParams;
use crate::engine_loop::{Command, Update};
use crate::error::ApiError;
use crate::limits::QueueSlot;
use crate::telemetry::{
    E2E, GENERATED_TOKENS, INTER_TOKEN, KEY_REQUESTS, KEY_TOKENS, PROMPT_TOKENS, REQUESTS_FINISHED,
    TTFT,
};
use crate::text::StopText;
use crate::tools::ToolPlan;
use crate::AppState;
use fornax_engine::grammar::CallSyntax;

/// The most choices one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// QoS class of requests that give no `priority`.
pub const DEFAULT_PRIORITY: u8 = 1;
/// Highest QoS class (batch).
const LOWEST_PRIORITY: i64 = 3;

/// A validated request.
#[derive(Debug, Clone)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// The QoS class it runs at: the one asked for, capped at the key's.
    pub qos: u8,
    /// The key it came with (none when the server has no keys).
    pub caller: Option<Caller>,
    pub sampling: SamplingParams,
    /// `Some(n)`: each token's log-probability with the `n` most likely tokens'.
    pub logprobs: Option<usize>,
    /// The same for the prompt's tokens (`echo` with `logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// Token ids that end the output, besides the model's own.
    pub stop_ids: Vec<u32>,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices to generate (`n`), each drawn with its own seed.
    pub n: usize,
    /// The grammar the output must match, compiled when the job starts, and the field
    /// it came from.
    pub grammar: Option<(Grammar, &'static str)>,
    /// The output may be tool calls, in this syntax (`tools.rs`).
    pub tools: Option<CallSyntax>,
}

impl Job {
    /// Checks the parameters against the model and the server's limits; `caller`'s key
    /// caps the QoS class.
    pub fn new(
        state: &AppState,
        mut params: GenerationParams,
        prompt: Vec<u32>,
        caller: Option<Caller>,
    ) -> Result<Self, ApiError> {
        let grammar = match params.response_format.take() {
            Some(format) => format.grammar()?.map(|g| (g, "response_format")),
            None => None,
        };
        let grammar = match (grammar, params.structured_outputs.take()) {
            (None, None) => None,
            (Some(g), None) => Some(g),
            (None, Some(s)) => Some((s.grammar()?, "structured_outputs")),
            (Some(_), Some(_)) => return Err(ApiError::invalid_param(
                "structured_outputs",
                "response_format and structured_outputs cannot be used together (send one grammar)",
            )),
        };
        let n = params.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(ApiError::invalid_param(
                "n",
                format!("n must be 1 to {MAX_CHOICES}"),
            ));
        }
        if prompt.is_empty() {
            return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
        }
        let limits = &state.limits;
        if prompt.len() > limits.max_prompt_tokens {
            return Err(ApiError::context_exceeded(format!(
                "the prompt has {} tokens; this server accepts at most {} (the model's context is {})",
                prompt.len(),
                limits.max_prompt_tokens,
                state.model.context
            )));
        }
        let room = state.model.context.saturating_sub(prompt.len());
        let max_tokens = match params.max_completion_tokens.or(params.max_tokens) {
            Some(0) => return Err(ApiError::invalid_param("max_tokens", "max_tokens must be at least 1")),
            Some(m) if m > limits.max_output_tokens => {
                return Err(ApiError::invalid_param(
                    "max_tokens",
                    format!("max_tokens is {m}; this server allows at most {}", limits.max_output_tokens),
                ))
            }
            Some(m) if m > room => {
                return Err(ApiError::context_exceeded(format!(
                    "the prompt has {} tokens and max_tokens is {m}: {} in all, over the model's context of {} tokens",
                    prompt.len(),
                    prompt.len() + m,
                    state.model.context
                )))
            }
            Some(m) => m,
            None if room == 0 => {
                return Err(ApiError::context_exceeded(format!(
                    "the prompt's {} tokens fill the model's context of {} tokens",
                    prompt.len(),
                    state.model.context
                )))
            }
            None => room.min(limits.max_output_tokens),
        };
        let vocab = state.tokenizer.vocab_size();
        let (sampling, logprobs) = crate::sampling::sampling(&params, vocab)?;
        let stop_ids = params
            .stop_token_ids
            .iter()
            .flatten()
            .map(|t| crate::sampling::token_id("stop_token_ids", &t.to_string(), vocab))
            .collect::<Result<Vec<u32>, ApiError>>()?;
        let asked = match params.priority {
            None => DEFAULT_PRIORITY,
            Some(p @ 0..=LOWEST_PRIORITY) => p as u8,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "priority",
                    "priority must be 0 (interactive, served first) .. 3 (batch)",
                ))
            }
        };
        let qos = match &caller {
            Some(Caller(key)) if asked < key.class => {
                tracing::info!(key = %key.name, asked, class = key.class, "priority capped at the key's class");
                key.class
            }
            _ => asked,
        };
        Ok(Self {
            prompt,
            max_tokens,
            qos,
            caller,
            sampling,
            logprobs,
            prompt_logprobs: None,
            stop_ids,
            stops: params.stop.map(|s| s.strings()).unwrap_or_default(),
            stream: params.stream,
            include_usage: params.stream_options.is_some_and(|o| o.include_usage),
            n,
            grammar,
            tools: None,
        })
    }

    /// Choice `i` of the job: its seed moved on by `i`. Only the first computes the
    /// prompt's log-probabilities (the same for every choice).
    pub fn choice(&self, i: usize) -> Self {
        let mut job = self.clone();
        job.sampling.seed = job.sampling.seed.wrapping_add(i as u64);
        if i > 0 {
            job.prompt_logprobs = None;
        }
        job
    }

    /// Asks for the output `plan` allows (tool calls or text).
    pub fn with_tools(mut self, plan: ToolPlan) -> Result<Self, ApiError> {
        if self.grammar.is_some() {
            return Err(ApiError::invalid_param(
                "response_format",
                "response_format or structured_outputs and tools cannot be used together \
                 (send one grammar)",
            ));
        }
        self.grammar = Some((plan.grammar, "tools"));
        self.tools = Some(plan.syntax);
        Ok(self)
    }
}

/// A token with its log-probabilities (`None` for the prompt's first token, which
/// nothing predicts).
#[derive(Debug, Clone)]
pub struct Logprob {
    pub token: u32,
    pub logprobs: Option<Box<TokenLogprobs>>,
}

/// What a generation produced next, with the log-probabilities of the tokens it covers
/// (where asked for).
#[derive(Debug)]
pub enum Piece {
    /// More text.
    Text {
        text: String,
        logprobs: Vec<Logprob>,
    },
    /// The end: the last text and the OpenAI finish reason (`stop` or `length`).
    Done {
        text: String,
        reason: &'static str,
        logprobs: Vec<Logprob>,
    },
    /// The engine failed.
    Failed(String),
}

/// A request in the engine.
pub struct Generation {
    state: Arc<AppState>,
    id: RequestId,
    updates: UnboundedReceiver<Update>,
    /// Updates received early (while waiting for the first token).
    early: std::collections::VecDeque<Update>,
    /// The queue place, held until the first token.
    slot: Option<QueueSlot>,
    text: StopText,
    /// Log-probabilities of tokens whose text is not released yet.
    logprobs: Vec<Logprob>,
    /// The prompt, where its log-probabilities were asked for, and those received.
    prompt: Vec<u32>,
    prompt_logprobs: Vec<Logprob>,
    /// Token ids that end the output (the model's and the request's).
    stop_ids: Vec<u32>,
    arrived: Instant,
    last_token: Option<Instant>,
    prompt_tokens: usize,
    completion_tokens: usize,
    done: bool,
    caller: Option<Caller>,
}

impl Generation {
    /// Queues `job`; refused at once when the queue is full or the engine rejects it.
    pub async fn start(state: Arc<AppState>, job: Job, arrived: Instant) -> Result<Self, ApiError> {
        let slot = state.queue.enter().ok_or_else(|| {
            ApiError::overloaded(format!(
                "the server is at its queue limit of {} waiting requests; retry later",
                state.queue.limit()
            ))
        })?;
        // Compiled in its queue place: a full queue refuses at once, without compiling.
        let constraint = match job.grammar {
            Some((g, param)) => {
                Some(crate::response_format::compile(state.grammars.clone(), g, param).await?)
            }
            None => None,
        };
        let (updates_tx, mut updates) = unbounded_channel();
        let prompt_tokens = job.prompt.len();
        let prompt = match job.prompt_logprobs {
            Some(_) => job.prompt.clone(),
            None => Vec::new(),
        };
        let caller = job.caller;
        let mut stop_ids = state.stop_ids.clone();
        stop_ids.extend(job.stop_ids);
        let request = Request {
            prompt: job.prompt,
            max_tokens: job.max_tokens,
            qos: job.qos,
            sampling: job.sampling,
            stop_ids: stop_ids.clone(),
            constraint,
            logprobs: job.logprobs,
            prompt_logprobs: job.prompt_logprobs,
        };
        state
            .commands
            .send(Command::Submit {
                request,
                updates: updates_tx,
            })
            .map_err(|_| ApiError::overloaded("the server is shutting down"))?;
        let id = match updates.recv().await {
            Some(Update::Accepted(id)) => id,
            Some(Update::Rejected(e)) => return Err(e.into()),
            _ => return Err(ApiError::internal("the engine stopped")),
        };
        counter!(PROMPT_TOKENS).increment(prompt_tokens as u64);
        if let Some(Caller(key)) = &caller {
            counter!(KEY_REQUESTS, "key" => key.name.clone(), "class" => job.qos.to_string())
                .increment(1);
        }
        let generation = Self {
            state,
            id,
            updates,
            early: Default::default(),
            slot: Some(slot),
            text: StopText::new(job.stops),
            logprobs: Vec::new(),
            prompt,
            prompt_logprobs: Vec::new(),
            stop_ids,
            arrived,
            last_token: None,
            prompt_tokens,
            completion_tokens: 0,
            done: false,
            caller,
        };
        generation.count_tokens(prompt_tokens);
        Ok(generation)
    }

    /// Counts `tokens` against the caller's key (metric and token limit).
    fn count_tokens(&self, tokens: usize) {
        if let Some(Caller(key)) = &self.caller {
            counter!(KEY_TOKENS, "key" => key.name.clone()).increment(tokens as u64);
            self.state
                .access
                .usage
                .add_tokens(key, tokens as u64, Instant::now());
        }
    }

    /// Waits for the next piece of text or the end.
    pub async fn next(&mut self) -> Piece {
        if self.done {
            return Piece::Failed("the generation has ended".into());
        }
        loop {
            let update = match self.early.pop_front() {
                Some(u) => Some(u),
                None => self.updates.recv().await,
            };
            match update {
                Some(Update::Token(token, logprobs)) => {
                    self.on_token();
                    if self.stop_ids.contains(&token) {
                        continue; // the engine ends the request with this token
                    }
                    if let Some(logprobs) = logprobs {
                        self.logprobs.push(Logprob {
                            token,
                            logprobs: Some(logprobs),
                        });
                    }
                    let delta = self.text.push(&self.state.tokenizer, token);
                    if self.text.stopped() {
                        let _ = self.state.commands.send(Command::Cancel(self.id));
                        return self.end("stop", delta);
                    }
                    if !delta.is_empty() {
                        let logprobs = std::mem::take(&mut self.logprobs);
                        return Piece::Text {
                            text: delta,
                            logprobs,
                        };
                    }
                }
                Some(Update::Finished(reason)) => {
                    let rest = self.text.finish();
                    let reason = match reason {
                        FinishReason::Length => "length",
                        FinishReason::Stop | FinishReason::Cancelled => "stop",
                        FinishReason::GrammarFailed => {
                            return self.fail("constrained decoding failed to match".into())
                        }
                    };
                    return self.end(reason, rest);
                }
                Some(Update::Failed(message)) => return self.fail(message),
                Some(Update::PromptLogprobs(l)) => self.on_prompt_logprobs(l),
                Some(Update::Accepted(_) | Update::Rejected(_)) => {}
                None => return self.fail("the engine stopped".into()),
            }
        }
    }

    /// Waits until the engine has computed the prompt (its first token came, or it
    /// ended): a request sharing the prompt submitted now reuses its KV blocks, and the
    /// prompt's log-probabilities (where asked for) have all come.
    pub async fn prompt_computed(&mut self) {
        loop {
            let Some(update) = self.updates.recv().await else {
                return;
            };
            let done = match update {
                Update::PromptLogprobs(l) => {
                    self.on_prompt_logprobs(l);
                    continue;
                }
                Update::Accepted(_) => false,
                _ => true,
            };
            self.early.push_back(update);
            if done {
                return;
            }
        }
    }

    fn on_prompt_logprobs(&mut self, logprobs: Vec<TokenLogprobs>) {
        let at = self.prompt_logprobs.len() + 1;
        let tokens = self.prompt.get(at..).unwrap_or_default();
        self.prompt_logprobs
            .extend(tokens.iter().zip(logprobs).map(|(&token, l)| Logprob {
                token,
                logprobs: Some(Box::new(l)),
            }));
    }

    /// The prompt's tokens with their log-probabilities (the first has none), once
    /// [`Self::prompt_computed`] has returned; empty where they were not asked for.
    pub fn prompt_logprobs(&self) -> Vec<Logprob> {
        let Some(&first) = self.prompt.first() else {
            return Vec::new();
        };
        let first = Logprob {
            token: first,
            logprobs: None,
        };
        std::iter::once(first)
            .chain(self.prompt_logprobs.iter().cloned())
            .collect()
    }

    /// Tokens of the prompt and generated so far.
    pub fn tokens(&self) -> (usize, usize) {
        (self.prompt_tokens, self.completion_tokens)
    }

    fn on_token(&mut self) {
        let now = Instant::now();
        match self.last_token {
            None => {
                histogram!(TTFT).record((now - self.arrived).as_secs_f64());
                self.slot = None;
            }
            Some(prev) => histogram!(INTER_TOKEN).record((now - prev).as_secs_f64()),
        }
        self.last_token = Some(now);
        self.completion_tokens += 1;
        counter!(GENERATED_TOKENS).increment(1);
    }

    fn end(&mut self, reason: &'static str, text: String) -> Piece {
        self.done = true;
        self.count_tokens(self.completion_tokens);
        self.slot = None;
        histogram!(E2E).record(self.arrived.elapsed().as_secs_f64());
        counter!(REQUESTS_FINISHED, "reason" => reason).increment(1);
        tracing::info!(
            request = self.id.0,
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens,
            reason,
            seconds = self.arrived.elapsed().as_secs_f64(),
            "generation finished"
        );
        let logprobs = std::mem::take(&mut self.logprobs);
        Piece::Done {
            text,
            reason,
            logprobs,
        }
    }

    fn fail(&mut self, message: String) -> Piece {
        self.done = true;
        self.count_tokens(self.completion_tokens);
        counter!(REQUESTS_FINISHED, "reason" => "error").increment(1);
        tracing::error!(request = self.id.0, %message, "generation failed");
        Piece::Failed(message)
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.done {
            self.count_tokens(self.completion_tokens);
            let _ = self.state.commands.send(Command::Cancel(self.id));
            counter!(REQUESTS_FINISHED, "reason" => "cancelled").increment(1);
            tracing::info!(
                request = self.id.0,
                completion_tokens = self.completion_tokens,
                "client went away; request cancelled"
            );
        }
    }
}
