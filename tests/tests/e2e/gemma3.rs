//! Gemma 3 270M (Q4_K_M, the real file) against llama.cpp on the same file
//! (`tests/reference/gemma3/llama_cpp.json`, written by `scripts/peer/llama-reference.mjs`
//! from `cases.json`): the tokenizer exact, greedy tokens equal up to a step where
//! llama.cpp's own top-2 margin is below 0.1, perplexity over 1,023 tokens (past the
//! 512-key window) within 1%, on the CPU backend and on wgpu. The windowed layers' sliding
//! pool gives blocks back as the window passes them, and the prefix cache reuses what
//! both pools still hold.

use crate::common::{gemma_file, read_reference, run_on, serve_waves};
use crate::llama_cpp::{check_greedy, greedy_batch, Reference};
use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::Model;
use fornax_engine::sched::{PolicyKind, SchedulerConfig};
use fornax_engine::score::{perplexity, token_logprobs_in};
use fornax_engine::seq_cache::PagedSeq;
use fornax_engine::tokenizer::Tokenizer;
use fornax_engine::{generate_in, Engine, GenerateParams};

/// Allowed relative perplexity difference from llama.cpp's.
const PPL_TOLERANCE: f64 = 0.01;

fn reference() -> Reference {
    read_reference("gemma3/llama_cpp.json")
}

/// The reference prompts, each with its ids (BOS first).
pub(crate) fn prompt_ids() -> Vec<(String, Vec<u32>)> {
    reference()
        .prompts
        .into_iter()
        .map(|p| (p.prompt, p.ids))
        .collect()
}

#[test]
fn tokenizer_matches_llama_cpp() {
    let gguf = GgufFile::parse(gemma_file().bytes()).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let cases = reference().tokenizer;
    assert!(cases.len() >= 20);
    for c in &cases {
        let ids = tok.encode(&c.text, c.parse_special).unwrap();
        assert_eq!(ids, c.ids, "{}: {:?}", c.name, c.text);
        assert_eq!(tok.decode(&ids).unwrap(), c.text, "{} decodes back", c.name);
    }
    for p in &reference().prompts {
        assert_eq!(tok.encode_prompt(&p.prompt, false).unwrap(), p.ids);
    }
}

/// The file has no chat template but Gemma's turn tokens: chat prompts use the built-in
/// Gemma format, BOS once, each turn marker a single token, and generation stops at
/// `<end_of_turn>`.
#[test]
fn chat_prompts_use_gemma_turns() {
    let gguf = GgufFile::parse(gemma_file().bytes()).unwrap();
    assert!(gguf.get("tokenizer.chat_template").is_none());
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    assert_eq!(tok.chat_template().unwrap().built_in(), Some("gemma"));
    let ids = tok
        .encode_chat(&[fornax_engine::tokenizer::ChatMessage::new("user", "Hi")])
        .unwrap();
    let id = |t: &str| tok.token_id(t).unwrap();
    let (start, end) = (id("<start_of_turn>"), id("<end_of_turn>"));
    assert_eq!(ids[..2], [tok.bos_id.unwrap(), start]);
    assert_eq!(ids.iter().filter(|&&i| i == tok.bos_id.unwrap()).count(), 1);
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 2);
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 1);
    assert_eq!(
        tok.decode(&ids).unwrap(),
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    assert!(tok.stop_ids().contains(&end));
}

/// What one backend is checked on.
#[derive(Debug, Clone, Copy)]
enum Check {
    /// Each prompt alone, as `fornax generate` runs it.
    Greedy,
    /// Every prompt in one ragged batch, one forward pass a step, as the engine runs
    /// them (and far fewer passes than one prompt at a time on lavapipe).
    GreedyBatch,
    /// Perplexity of the first `tokens` tokens over the paged cache, as `fornax
    /// perplexity` runs.
    Perplexity { tokens: usize },
}

impl BackendTask for Check {
    type Output = Result<String, String>;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        info: DeviceInfo,
    ) -> Self::Output {
        let gguf = GgufFile::parse(gemma_file().bytes()).map_err(|e| e.to_string())?;
        let model =
            Model::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).map_err(|e| e.to_string())?;
        let r = reference();
        let mut report = format!("[{} on {}]\n", info.kind, info.adapter);
        let mut failures = Vec::new();
        match self {
            Check::Greedy => {
                for case in &r.prompts {
                    let params = GenerateParams {
                        max_tokens: case.greedy.len(),
                        ..GenerateParams::default()
                    };
                    let blocks = (case.ids.len() + params.max_tokens).div_ceil(BLOCK_TOKENS);
                    let mut kv =
                        model.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
                    let mut seq = PagedSeq::new(&mut kv);
                    let ours = generate_in(&model, &mut seq, &case.ids, &params, |_| true)
                        .map_err(|e| e.to_string())?;
                    match check_greedy(&ours, case) {
                        Ok(n) => {
                            report +=
                                &format!("{:?}: {n}/{} equal\n", case.prompt, case.greedy.len())
                        }
                        Err(e) => failures.push(format!("{:?}: {e}", case.prompt)),
                    }
                }
            }
            Check::GreedyBatch => {
                let steps = r.prompts[0].greedy.len();
                let prompts: Vec<&[u32]> = r.prompts.iter().map(|c| &c.ids[..]).collect();
                let ours = greedy_batch(&model, &prompts, steps)?;
                for (case, ours) in r.prompts.iter().zip(&ours) {
                    match check_greedy(&ours.tokens, case) {
                        Ok(n) => report += &format!("{:?}: {n}/{steps} equal\n", case.prompt),
                        Err(e) => failures.push(format!("{:?}: {e}", case.prompt)),
                    }
                }
            }
            Check::Perplexity { tokens } => {
                let ids = &r.text.ids[..tokens];
                let want = r.text.perplexity(tokens);
                let blocks = ids.len().div_ceil(BLOCK_TOKENS);
                // 64 tokens a pass: 256 rows of 262,144 logits would not fit one buffer
                // on lavapipe. The windowed layers keep their keys in the sliding pool,
                // which gives blocks back as the window passes them.
                let dims = model.kv_dims();
                let capacity = KvCapacity::f32_only(blocks).with_sliding(dims, 1, 64);
                let mut kv = model.new_paged_cache(capacity, TierPolicy::ALL_F32);
                let mut seq = PagedSeq::new(&mut kv);
                let logprobs =
                    token_logprobs_in(&model, &mut seq, ids, 64).map_err(|e| e.to_string())?;
                let window = dims.windowed().ok_or("Gemma 3 has windowed layers")?.1;
                let held = seq.kv.sliding_stats().ok_or("a sliding pool")?;
                report += &format!(
                    "sliding pool: {} of {} blocks held after {} tokens, {} tokens given back\n",
                    held.blocks_used,
                    held.blocks_total,
                    ids.len(),
                    held.window_dropped_tokens
                );
                if held.blocks_used > window.kept_blocks() + 1 || held.window_trims == 0 {
                    failures.push(format!("the sliding pool kept {held:?}"));
                }
                let ppl = perplexity(&logprobs);
                let rel = (ppl - want).abs() / want;
                report += &format!(
                    "perplexity {ppl:.4} over {} tokens, llama.cpp {want:.4}: {:+.3}%\n",
                    logprobs.len(),
                    (ppl / want - 1.0) * 100.0
                );
                if logprobs.len() + 1 != ids.len() || rel > PPL_TOLERANCE {
                    failures.push(format!("perplexity {ppl} vs {want}"));
                }
            }
        }
        match failures.is_empty() {
            true => Ok(report),
            false => Err(format!("{report}failures:\n{}", failures.join("\n"))),
        }
    }
}

fn check(kind: BackendKind, check: Check) {
    match run_on(kind, check).expect("backend available") {
        Ok(report) => eprintln!("{report}"),
        Err(report) => panic!("{check:?} failed\n{report}"),
    }
}

#[test]
fn greedy_tokens_match_llama_cpp_on_cpu() {
    check(BackendKind::Cpu, Check::Greedy);
}

#[test]
fn perplexity_matches_llama_cpp_on_cpu() {
    check(BackendKind::Cpu, Check::Perplexity { tokens: 1024 });
}

#[test]
fn greedy_tokens_match_llama_cpp_on_wgpu() {
    check(BackendKind::Wgpu, Check::GreedyBatch);
}

#[test]
fn perplexity_matches_llama_cpp_on_wgpu() {
    check(BackendKind::Wgpu, Check::Perplexity { tokens: 1024 });
}

/// The engine on Gemma with the prefix cache: a 2,400-token prompt runs in chunks of 512
/// (its windowed layers give back the blocks past the window, and the sliding pool, too
/// small for them all, evicts the oldest), then the same prompt and one sharing its first
/// 2,000 tokens reuse every token of theirs that the main pool holds: the sliding pool
/// finds each prefix through ghosts of the blocks it gave back and holds the window before
/// it. Greedy tokens equal those computed without the cache.
struct SlidingPrefix;

impl BackendTask for SlidingPrefix {
    type Output = ();

    fn run<B: fornax_engine::EngineBackend>(self, device: B::Device, _: DeviceInfo) {
        let gguf = GgufFile::parse(gemma_file().bytes()).unwrap();
        let model = Model::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).unwrap();
        let text = &reference().text.ids;
        // The text three times over (BOS once).
        let long = [&text[..], &text[1..], &text[1..]].concat();
        let first = long[..2400].to_vec();
        let other = [&long[..2000], &text[500..600]].concat();
        let prompts = [first.clone(), first, other];
        let chunk = 512;
        let serve = |cache: bool| {
            let dims = model.kv_dims();
            let capacity = KvCapacity::f32_only(160).with_sliding(dims, 2, chunk);
            let kv = model.new_paged_cache(capacity, TierPolicy::ALL_F32);
            let config = SchedulerConfig {
                max_batch_tokens: chunk,
                ..SchedulerConfig::default()
            };
            let mut engine = Engine::new(&model, kv, config, PolicyKind::default());
            if cache {
                engine = engine.with_prefix_cache();
            }
            let mut most_held = 0;
            let got = serve_waves(&mut engine, &prompts, &[&[0], &[1, 2]], 8, |e| {
                let sliding = e.kv.sliding_stats().expect("a sliding pool");
                most_held = most_held.max(sliding.blocks_used);
            });
            let stats = (
                engine.kv.pool.prefix_stats(),
                engine.kv.sliding_prefix_stats(),
            );
            (got, stats, engine.tokens_computed, most_held)
        };
        let (want, _, computed_without, _) = serve(false);
        let (got, (stats, sliding), computed_with, most_held) = serve(true);
        let (stats, sliding) = (stats.expect("cache on"), sliding.expect("cache on"));
        eprintln!(
            "prefix cache on Gemma: {stats:?}; sliding pool {sliding:?}; tokens computed {computed_with} vs {computed_without} without; at most {most_held} sliding blocks held"
        );
        assert_eq!(got, want, "greedy tokens with and without the prefix cache");
        assert!(
            sliding.evictions > 0,
            "the sliding pool gave back a prefix's start"
        );
        // All but the last token of the first prompt, and the shared 2,000 of the other.
        assert_eq!(stats.hit_tokens, 2399 + 2000, "every token both pools hold");
        assert_eq!(sliding.hit_tokens, stats.hit_tokens);
        assert_eq!(computed_without - computed_with, stats.hit_tokens);
        // Two sequences each keeping its window (17 blocks) plus the block being written,
        // after a step of at most one chunk of new tokens.
        assert!(
            most_held <= 2 * 18 + chunk / 32,
            "{most_held} sliding blocks held"
        );
    }
}

#[test]
fn prefix_cache_reuses_what_both_pools_hold() {
    run_on(BackendKind::Cpu, SlidingPrefix).unwrap();
}
