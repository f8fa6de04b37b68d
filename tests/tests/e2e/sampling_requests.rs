//! What a request asks of sampling besides its temperature, on the real model (SmolLM2,
//! CPU backend): log-probabilities (of generated and of prompt tokens) equal to the
//! reference path's log-softmax, and logit biases and penalties steering the tokens as
//! OpenAI documents them.

use std::collections::HashMap;

use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::model::Model;
use fornax_engine::sampling::{Adjustments, SamplingParams, TokenLogprobs, BAN};
use fornax_engine::score::token_logprobs;
use fornax_engine::tokenizer::{ChatMessage, Tokenizer};
use fornax_engine::{EngineBackend, Event, Request, PROMPT_SCORE_CHUNK};

use crate::common::{f32_engine, model_file, run_on};

/// One request's settings.
#[derive(Clone)]
struct Ask {
    prompt: &'static str,
    sampling: SamplingParams,
    logprobs: Option<usize>,
}

impl Ask {
    fn greedy(prompt: &'static str) -> Self {
        Self {
            prompt,
            sampling: SamplingParams::greedy(),
            logprobs: None,
        }
    }

    fn adjusted(prompt: &'static str, adjust: Adjustments) -> Self {
        let sampling = SamplingParams {
            adjust,
            ..SamplingParams::greedy()
        };
        Self {
            sampling,
            ..Self::greedy(prompt)
        }
    }
}

/// The real model's tokenizer and weights on `device`.
fn load<B: EngineBackend>(device: &B::Device) -> (Tokenizer, Model<B>) {
    let gguf = GgufFile::parse(model_file().bytes()).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let model = Model::<B>::from_gguf(&gguf, device, &mut |_, _| {}).unwrap();
    (tok, model)
}

/// Each request's prompt, tokens and log-probabilities.
type Outputs = Vec<(Vec<u32>, Vec<u32>, Vec<Option<Box<TokenLogprobs>>>)>;

/// Runs every request in one batch through the engine for `max_tokens` tokens (stop
/// tokens ignored); with `reference`, also returns the reference path's log-probability
/// of each generated token of the first request (contiguous KV, every position's logits).
struct Run {
    asks: Vec<Ask>,
    max_tokens: usize,
    reference: bool,
}

impl BackendTask for Run {
    type Output = (Outputs, Vec<f32>);

    fn run<B: EngineBackend>(self, device: B::Device, _: DeviceInfo) -> Self::Output {
        let (tok, model) = load::<B>(&device);
        let mut engine = f32_engine(&model, 256);
        let mut at = HashMap::new();
        let mut out: Outputs = Vec::new();
        for (i, ask) in self.asks.iter().enumerate() {
            let prompt = tok
                .encode_chat(&[ChatMessage::new("user", ask.prompt)])
                .unwrap();
            let request = Request {
                prompt: prompt.clone(),
                max_tokens: self.max_tokens,
                qos: 0,
                sampling: ask.sampling.clone(),
                stop_ids: Vec::new(),
                constraint: None,
                logprobs: ask.logprobs,
                prompt_logprobs: None,
            };
            at.insert(engine.submit(request).unwrap(), i);
            out.push((prompt, Vec::new(), Vec::new()));
        }
        while !engine.is_idle() {
            for event in engine.step().unwrap() {
                if let Event::Token {
                    id,
                    token,
                    logprobs,
                } = event
                {
                    let o = &mut out[at[&id]];
                    o.1.push(token);
                    o.2.push(logprobs);
                }
            }
        }
        let reference = match self.reference {
            false => Vec::new(),
            true => {
                let (prompt, tokens, _) = &out[0];
                let ids: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
                let all = token_logprobs(&model, &ids, 64).unwrap();
                all[prompt.len() - 1..].to_vec()
            }
        };
        (out, reference)
    }
}

/// A greedy request with `logprobs: 5` batched beside one without: its tokens equal the
/// other's, each token's log-probability equals the reference path's log-softmax within
/// 1e-3, and its alternatives come most likely first, headed by the greedy token.
#[test]
fn logprobs_equal_the_reference_log_softmax() {
    let prompt = "Name three colours of the rainbow.";
    let asks = vec![
        Ask {
            logprobs: Some(5),
            ..Ask::greedy(prompt)
        },
        Ask::greedy(prompt),
    ];
    let (out, reference) = run_on(
        BackendKind::Cpu,
        Run {
            asks,
            max_tokens: 24,
            reference: true,
        },
    )
    .unwrap();
    let (_, tokens, logprobs) = &out[0];
    assert_eq!(tokens, &out[1].1, "logprobs change no token");
    assert!(
        out[1].2.iter().all(Option::is_none),
        "none asked, none given"
    );
    assert_eq!(reference.len(), tokens.len());
    let mut worst = 0f32;
    for ((&token, lp), &want) in tokens.iter().zip(logprobs).zip(&reference) {
        let lp = lp.as_ref().expect("asked for");
        worst = worst.max((lp.logprob - want).abs());
        assert_eq!(lp.top.len(), 5);
        assert_eq!(lp.top[0], (token, lp.logprob), "greedy takes the top token");
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let mass: f32 = lp.top.iter().map(|&(_, l)| l.exp()).sum();
        assert!(mass <= 1.0 + 1e-4, "{mass}");
    }
    eprintln!(
        "{} tokens; largest difference from the reference: {worst:.2e}",
        tokens.len()
    );
    assert!(worst < 1e-3, "{worst}");
}

/// On greedy decoding of 64 tokens: a -100 bias bans the token greedy took first (it
/// never appears), a +100 bias selects its token at every step, and a frequency penalty
/// of 2 at least halves the repeats of the most repeated token (" the", 8 times without).
#[test]
fn logit_bias_and_penalties_steer_the_tokens() {
    let plain = "Tell me about the sea.";
    let run = |asks: Vec<Ask>| {
        run_on(
            BackendKind::Cpu,
            Run {
                asks,
                max_tokens: 64,
                reference: false,
            },
        )
        .unwrap()
        .0
    };
    let base = run(vec![Ask::greedy(plain)]);
    let first = base[0].1[0];
    let chosen = base[0].1[3];
    let bias = |list| Adjustments {
        logit_bias: list,
        ..Adjustments::default()
    };
    let steered = run(vec![
        Ask::adjusted(plain, bias(vec![(first, BAN)])),
        Ask::adjusted(plain, bias(vec![(chosen, 100.0)])),
        Ask::adjusted(
            plain,
            Adjustments {
                frequency_penalty: 2.0,
                ..Adjustments::default()
            },
        ),
    ]);
    assert!(!steered[0].1.contains(&first), "{:?}", steered[0].1);
    assert!(
        steered[1].1.iter().all(|&t| t == chosen),
        "{:?}",
        steered[1].1
    );
    let most = |tokens: &[u32]| {
        let mut counts = HashMap::new();
        tokens
            .iter()
            .for_each(|&t| *counts.entry(t).or_insert(0) += 1);
        counts.into_values().max().unwrap_or(0)
    };
    let (before, after) = (most(&base[0].1), most(&steered[2].1));
    eprintln!("most repeats of one token: {before} without the penalty, {after} with it");
    assert!(after * 2 <= before, "{before} -> {after}");
}

/// A prompt of several score chunks run three times through an engine with the prefix
/// cache: plainly, then with `prompt_logprobs` beside a short request, then plainly again.
/// Returns the prompt, the scored request's prompt events (each a list of entries) and
/// tokens, the plain first run's tokens, the prefix cache's hit tokens after each run,
/// and the reference path's log-probabilities of the prompt.
struct PromptScores;

type PromptScored = (
    Vec<u32>,
    Vec<Vec<TokenLogprobs>>,
    Vec<u32>,
    Vec<u32>,
    [u64; 3],
    Vec<f32>,
);

impl BackendTask for PromptScores {
    type Output = PromptScored;

    fn run<B: EngineBackend>(self, device: B::Device, _: DeviceInfo) -> Self::Output {
        let (tok, model) = load::<B>(&device);
        let mut engine = f32_engine(&model, 256).with_prefix_cache();
        let text: String = (1..=24)
            .map(|i| {
                format!(
                    "On day {i} the baker sold {} loaves and {} cakes. ",
                    i * 7,
                    i % 5
                )
            })
            .collect();
        let prompt = tok.encode_prompt(&text, false).unwrap();
        let request = |prompt: Vec<u32>, prompt_logprobs| Request {
            prompt,
            max_tokens: 6,
            qos: 0,
            sampling: SamplingParams::greedy(),
            stop_ids: Vec::new(),
            constraint: None,
            logprobs: None,
            prompt_logprobs,
        };
        let mut run = |requests: Vec<Request>| {
            let ids: Vec<_> = requests
                .into_iter()
                .map(|r| engine.submit(r).unwrap())
                .collect();
            let (mut scores, mut tokens) = (Vec::new(), Vec::new());
            while !engine.is_idle() {
                for event in engine.step().unwrap() {
                    match event {
                        Event::PromptLogprobs { id, logprobs } => {
                            assert_eq!(id, ids[0]);
                            assert!(tokens.is_empty(), "the prompt's values come first");
                            scores.push(logprobs);
                        }
                        Event::Token { id, token, .. } if id == ids[0] => tokens.push(token),
                        _ => {}
                    }
                }
            }
            let hits = engine.kv.pool.prefix_stats().expect("on").hit_tokens;
            (scores, tokens, hits)
        };
        let (_, plain, first) = run(vec![request(prompt.clone(), None)]);
        let short = tok.encode_prompt("Count to five.", false).unwrap();
        let (scores, tokens, second) =
            run(vec![request(prompt.clone(), Some(3)), request(short, None)]);
        let (_, _, third) = run(vec![request(prompt.clone(), None)]);
        let reference = token_logprobs(&model, &prompt, 64).unwrap();
        (
            prompt,
            scores,
            tokens,
            plain,
            [first, second, third],
            reference,
        )
    }
}

/// `prompt_logprobs` on a prompt of several score chunks, batched beside a short request,
/// with the prefix cache holding the whole prompt: every prompt token after the first
/// gets its log-probability, equal to the reference path's within 1e-3, in one event per
/// chunk before any generated token, with 3 alternatives that bound it; the prompt is
/// computed in full (no token from the cache, which a plain request then reuses), and the
/// generated tokens equal the plain run's.
#[test]
fn prompt_logprobs_equal_the_reference_log_softmax() {
    let (prompt, scores, tokens, plain, hits, reference) =
        run_on(BackendKind::Cpu, PromptScores).unwrap();
    assert!(prompt.len() > 2 * PROMPT_SCORE_CHUNK, "{}", prompt.len());
    assert_eq!(scores.len(), prompt.len().div_ceil(PROMPT_SCORE_CHUNK));
    let scores: Vec<TokenLogprobs> = scores.into_iter().flatten().collect();
    assert_eq!(scores.len(), prompt.len() - 1);
    assert_eq!(reference.len(), scores.len());
    let mut worst = 0f32;
    for ((lp, &want), &token) in scores.iter().zip(&reference).zip(&prompt[1..]) {
        worst = worst.max((lp.logprob - want).abs());
        assert_eq!(lp.top.len(), 3);
        assert!(lp.top[0].1 >= lp.logprob - 1e-6, "{lp:?}");
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        if lp.top.iter().any(|&(t, _)| t == token) {
            let listed = lp.top.iter().find(|&&(t, _)| t == token).unwrap().1;
            assert_eq!(listed, lp.logprob);
        }
    }
    eprintln!(
        "{} prompt tokens; largest difference from the reference: {worst:.2e}; prefix hits {hits:?}",
        prompt.len()
    );
    assert!(worst < 1e-3, "{worst}");
    assert_eq!(tokens, plain, "scoring the prompt changes no token");
    assert_eq!(hits[0], 0);
    assert_eq!(hits[1], hits[0], "the scored prompt is computed in full");
    assert!(
        hits[2] > hits[1],
        "and its blocks are cached for others: {hits:?}"
    );
}
