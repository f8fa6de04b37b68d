//! Llama 3.x, Qwen2/2.5 and Qwen3 on random-weight checkpoints with their real
//! vocabularies (`scripts/family-checkpoints.py`, which the test command runs), against
//! two references made from the same files: transformers in float32
//! (`tests/reference/families/transformers.json`, `scripts/family-transformers.py`) and
//! llama.cpp (`llama_cpp_<file>.json`, `scripts/peer/llama-reference.mjs`). Tokenizers,
//! chat templates, the logits of every prompt position, greedy tokens and the
//! log-probabilities of a text, on the CPU backend and on wgpu.

use std::collections::HashMap;
use std::path::PathBuf;

use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::kv::{KvCapacity, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::{LoadOptions, Logits, Model, SeqTokens};
use fornax_engine::score::{log_softmax_rows, token_logprobs_in};
use fornax_engine::seq_cache::PagedSeq;
use fornax_engine::store::{home, sha256_file, ModelFile};
use fornax_engine::tokenizer::{ChatMessage, Tokenizer};
use serde::Deserialize;

use crate::common::{read_reference, run_on};
use crate::llama_cpp::{agreeing_steps, check_greedy, greedy_batch, Greedy, Reference};

/// The families, as `scripts/family-checkpoints.py` names its files.
const FAMILIES: [&str; 3] = ["llama3", "qwen2", "qwen3"];
/// The formats each family is written in (Q4_K with rows of 256 values, its own shapes;
/// checked against llama.cpp only).
const FORMATS: [&str; 3] = ["f32", "q8_0", "q4_k"];
/// Largest logit difference from transformers, relative to the logit (at least 1).
const LOGIT_TOLERANCE: f64 = 1e-3;
/// Largest difference from llama.cpp's log-probabilities of the text's tokens, summed and
/// relative to theirs, by format (Q8_0: llama.cpp quantizes activations to 8 bits in
/// its own way; so does the CPU backend, and wgpu keeps them in f32).
const LOGPROB_TOLERANCE: [(&str, f64); 3] = [("f32", 1e-4), ("q8_0", 1e-2), ("q4_k", 1e-2)];

#[derive(Debug, Deserialize)]
struct Transformers {
    families: HashMap<String, HfFamily>,
}

#[derive(Debug, Deserialize)]
struct HfFamily {
    prompts: Vec<HfPrompt>,
    tokenizer: Vec<HfCase>,
    chat: HfChat,
}

#[derive(Debug, Deserialize)]
struct HfPrompt {
    prompt: String,
    ids: Vec<u32>,
    /// Each position's top logits and log-sum-exp.
    positions: Vec<HfPosition>,
    greedy: Vec<u32>,
    margins: Vec<f64>,
}

#[derive(Debug, Deserialize)]
struct HfPosition {
    top: Vec<(u32, f64)>,
    lse: f64,
}

#[derive(Debug, Deserialize)]
struct HfCase {
    name: String,
    ids: Vec<u32>,
}

#[derive(Debug, Deserialize)]
struct HfChat {
    messages: Vec<HfMessage>,
    rendered: String,
}

#[derive(Debug, Deserialize)]
struct HfMessage {
    role: String,
    content: String,
}

fn transformers(family: &str) -> HfFamily {
    let mut all: Transformers = read_reference("families/transformers.json");
    all.families.remove(family).expect("the family's reference")
}

/// The reference prompts of `family` and their ids.
pub(crate) fn prompt_ids(family: &str) -> Vec<(String, Vec<u32>)> {
    let prompts = transformers(family).prompts;
    prompts.into_iter().map(|p| (p.prompt, p.ids)).collect()
}

fn llama_cpp(file: &str) -> Reference {
    read_reference(&format!("families/llama_cpp_{file}.json"))
}

/// The checkpoint `file` (`llama3-f32`, ...), which the test command writes.
pub(crate) fn checkpoint(file: &str) -> ModelFile {
    let path = folder().join(format!("{file}.gguf"));
    assert!(
        path.exists(),
        "{} is missing: scripts/test.sh writes it (scripts/family-checkpoints.py {})",
        path.display(),
        folder().display()
    );
    ModelFile::open(&path).expect("open the checkpoint")
}

fn folder() -> PathBuf {
    home().join("models").join("families")
}

/// The files are the ones the references were made from: numpy's generator and `gguf`'s
/// writer, pinned, give the same bytes everywhere.
#[test]
fn checkpoints_are_the_references_files() {
    let sums = std::fs::read_to_string(crate::common::reference_dir().join("families/SHA256SUMS"))
        .expect("SHA256SUMS");
    let mut checked = 0;
    for line in sums.lines() {
        let (sum, name) = line.split_once("  ").expect("sha256sum's format");
        checkpoint(name.trim_end_matches(".gguf"));
        let got = sha256_file(&folder().join(name)).expect("hash");
        assert_eq!(
            got, sum,
            "{name} differs from the file the references were made from"
        );
        checked += 1;
    }
    assert_eq!(checked, FAMILIES.len() * FORMATS.len());
}

/// Each vocabulary's 30-odd cases (Unicode, CJK, emoji, numbers, whitespace runs, code,
/// contractions, special tokens parsed and not) encode as its own tokenizer and llama.cpp
/// encode them, and decode back to the text; prompts get BOS as the file says.
#[test]
fn tokenizers_match_transformers_and_llama_cpp() {
    for family in FAMILIES {
        let file = checkpoint(&format!("{family}-f32"));
        let tok = Tokenizer::from_gguf(&GgufFile::parse(file.bytes()).unwrap()).unwrap();
        let hf = transformers(family);
        let ll = llama_cpp(&format!("{family}-f32"));
        assert!(ll.tokenizer.len() >= 30);
        for (case, theirs) in ll.tokenizer.iter().zip(&hf.tokenizer) {
            assert_eq!(case.name, theirs.name);
            let ids = tok.encode(&case.text, case.parse_special).unwrap();
            assert_eq!(ids, case.ids, "{family} {}: llama.cpp", case.name);
            assert_eq!(ids, theirs.ids, "{family} {}: its own tokenizer", case.name);
            assert_eq!(
                tok.decode(&ids).unwrap(),
                case.text,
                "{family} {}",
                case.name
            );
        }
        for (p, q) in hf.prompts.iter().zip(&ll.prompts) {
            let ids = tok.encode_prompt(&p.prompt, false).unwrap();
            assert_eq!(ids, p.ids, "{family}: {:?}", p.prompt);
            assert_eq!(ids, q.ids, "{family}: {:?}", p.prompt);
        }
    }
}

/// The file's template renders a multi-turn conversation with a system message as
/// transformers renders the same template string.
#[test]
fn chat_templates_render_as_transformers() {
    for family in FAMILIES {
        let file = checkpoint(&format!("{family}-f32"));
        let tok = Tokenizer::from_gguf(&GgufFile::parse(file.bytes()).unwrap()).unwrap();
        let chat = transformers(family).chat;
        let messages: Vec<ChatMessage> = chat
            .messages
            .iter()
            .map(|m| ChatMessage::new(&m.role, &m.content))
            .collect();
        let rendered = tok
            .chat_template()
            .unwrap()
            .render(&messages, true)
            .unwrap();
        assert_eq!(rendered, chat.rendered, "{family}");
        assert!(
            tok.stop_ids().contains(&tok.eos_id.unwrap()),
            "{family} stops at its end of turn"
        );
    }
}

/// Every checkpoint on one backend against both references.
struct Families;

impl BackendTask for Families {
    type Output = Result<String, String>;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        info: DeviceInfo,
    ) -> Self::Output {
        let mut report = format!("[{} on {}]\n", info.kind, info.adapter);
        let mut failures = Vec::new();
        for family in FAMILIES {
            let hf = transformers(family);
            for format in FORMATS {
                let name = format!("{family}-{format}");
                let file = checkpoint(&name);
                let gguf = GgufFile::parse(file.bytes()).map_err(|e| e.to_string())?;
                let model = Model::<B>::from_gguf(&gguf, &device, &mut |_, _| {})
                    .map_err(|e| format!("{name}: {e}"))?;
                let ll = llama_cpp(&name);
                let mut fail = |e: String| failures.push(format!("{name}: {e}"));
                if format == "f32" {
                    let worst = worst_logit_error(&model, &hf.prompts)?;
                    report +=
                        &format!("{name}: logits within {worst:.2e} (relative) of transformers\n");
                    if worst > LOGIT_TOLERANCE {
                        fail(format!("logits {worst:.2e} from transformers'"));
                    }
                }
                let prompts: Vec<&[u32]> = ll.prompts.iter().map(|p| &p.ids[..]).collect();
                let steps = ll.prompts[0].greedy.len();
                let ours = greedy_batch(&model, &prompts, steps)?;
                // Against a K-quant file llama.cpp quantizes activations to 8 bits with one
                // scale per 256 values, which moves its logits more than ours: where it
                // parts at a clear margin, the same bytes dequantized to FP32 weights (the
                // exact computation) must give our tokens.
                // Made when first needed: loading it takes as long as the checks.
                let mut exact: Option<Vec<Greedy>> = None;
                let exact_run = || -> Result<Vec<Greedy>, String> {
                    let options = LoadOptions {
                        dequantize: true,
                        ..LoadOptions::default()
                    };
                    let fp32 = Model::<B>::from_gguf_with(&gguf, &device, options, &mut |_, _| {})
                        .map_err(|e| format!("{name}: {e}"))?;
                    greedy_batch(&fp32, &prompts, steps)
                };
                for (i, (g, case)) in ours.iter().zip(&ll.prompts).enumerate() {
                    match check_greedy(&g.tokens, case) {
                        Ok(n) => {
                            report += &format!(
                                "{name} prompt {i}: {n}/{steps} greedy equal to llama.cpp's"
                            )
                        }
                        Err(e) if format == "q4_k" => {
                            if exact.is_none() {
                                exact = Some(exact_run()?);
                            }
                            let x = &exact.as_ref().expect("just made")[i];
                            match agreeing_steps(&g.tokens, &x.tokens, &x.margins) {
                                Ok(n) => {
                                    report += &format!(
                                        "{name} prompt {i}: llama.cpp parts ({e}); {n}/{steps} equal to the FP32 weights'"
                                    )
                                }
                                Err(x) => fail(format!(
                                    "prompt {i} against llama.cpp: {e}; against the FP32 weights: {x}"
                                )),
                            }
                        }
                        Err(e) => fail(format!("prompt {i} against llama.cpp: {e}")),
                    }
                    if format == "f32" {
                        let h = &hf.prompts[i];
                        match agreeing_steps(&g.tokens, &h.greedy, &h.margins) {
                            Ok(n) => report += &format!(", {n}/{steps} to transformers'\n"),
                            Err(e) => fail(format!("prompt {i} against transformers: {e}")),
                        }
                    } else {
                        report += "\n";
                    }
                }
                let ids = &ll.text.ids;
                let blocks = ids.len().div_ceil(BLOCK_TOKENS);
                let mut kv =
                    model.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
                let mut seq = PagedSeq::new(&mut kv);
                let lp = token_logprobs_in(&model, &mut seq, ids, 64).map_err(|e| e.to_string())?;
                let diff: f64 = lp
                    .iter()
                    .zip(&ll.text.logprobs)
                    .map(|(&a, &b)| (f64::from(a) - b).abs())
                    .sum();
                let mean = diff / ll.text.logprobs.iter().map(|b| b.abs()).sum::<f64>();
                let bar = LOGPROB_TOLERANCE
                    .iter()
                    .find(|(f, _)| *f == format)
                    .unwrap()
                    .1;
                report += &format!(
                    "{name}: text log-probabilities {:.2e} (relative, mean) from llama.cpp's over {} tokens\n",
                    mean,
                    lp.len()
                );
                if lp.len() != ll.text.logprobs.len() || mean > bar {
                    fail(format!(
                        "text log-probabilities {mean:.3e} from llama.cpp's"
                    ));
                }
            }
        }
        match failures.is_empty() {
            true => Ok(report),
            false => Err(format!("{report}failures:\n{}", failures.join("\n"))),
        }
    }
}

/// The largest difference, over every position of the prompts, between our logits and
/// transformers' at its top 8 and between the log-sum-exps, relative to the logit (at
/// least 1).
fn worst_logit_error<B: fornax_engine::EngineBackend>(
    model: &Model<B>,
    prompts: &[HfPrompt],
) -> Result<f64, String> {
    let mut worst = 0.0f64;
    for p in prompts {
        let mut kv = model.new_paged_cache(
            KvCapacity::f32_only(p.ids.len().div_ceil(BLOCK_TOKENS)),
            TierPolicy::ALL_F32,
        );
        let seq = kv.add_sequence();
        let batch = [SeqTokens {
            seq,
            tokens: &p.ids,
        }];
        let logits = model
            .forward_batch(&batch, &mut kv, Logits::All)
            .map_err(|e| e.to_string())?;
        let vocab = logits.dims()[1];
        let rows = fornax_engine::logits_to_vec(logits);
        for (row, want) in rows.chunks_exact(vocab).zip(&p.positions) {
            let lse = log_sum_exp(row);
            let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1.0);
            worst = worst.max(rel(lse, want.lse));
            for &(id, logit) in &want.top {
                worst = worst.max(rel(f64::from(row[id as usize]), logit));
            }
        }
    }
    Ok(worst)
}

/// `log(sum(exp(row)))` in f64 around the maximum.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    max + row
        .iter()
        .map(|&x| (f64::from(x) - max).exp())
        .sum::<f64>()
        .ln()
}

fn check(kind: BackendKind) {
    match run_on(kind, Families).expect("backend available") {
        Ok(report) => eprintln!("{report}"),
        Err(report) => panic!("{report}"),
    }
}

#[test]
fn families_match_transformers_and_llama_cpp_on_cpu() {
    check(BackendKind::Cpu);
}

#[test]
fn families_match_transformers_and_llama_cpp_on_wgpu() {
    check(BackendKind::Wgpu);
}

/// Scoring reads every logit of a row whatever the vocabulary's width: the log-softmax
/// of rows as wide as these vocabularies (odd widths past 65,536 included, which burn's
/// own wgpu reduction cuts short) equals one computed in f64 on the host.
struct WideRows;

impl BackendTask for WideRows {
    type Output = ();

    fn run<B: fornax_engine::EngineBackend>(self, device: B::Device, _: DeviceInfo) {
        for width in [151_669usize, 128_257, 65_537, 262_144, 1_001] {
            let row: Vec<f32> = (0..width)
                .map(|i| ((i * 7919) % 1000) as f32 / 50.0 - 10.0)
                .collect();
            let lse = log_sum_exp(&row);
            let t = burn_tensor::Tensor::<B, 2>::from_data(
                burn_tensor::TensorData::new(row.clone(), [1, width]),
                &device,
            );
            let got = fornax_engine::logits_to_vec(log_softmax_rows(t));
            for i in [0, width / 2, width - 1] {
                let want = f64::from(row[i]) - lse;
                assert!(
                    (f64::from(got[i]) - want).abs() < 1e-3,
                    "width {width}, column {i}: {} vs {want}",
                    got[i]
                );
            }
        }
    }
}

#[test]
fn scoring_reads_every_logit_of_wide_rows() {
    run_on(BackendKind::Wgpu, WideRows).unwrap();
    run_on(BackendKind::Cpu, WideRows).unwrap();
}
