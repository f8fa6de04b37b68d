//! The `fornax` binary end to end on the real model (CPU backend).

use std::path::PathBuf;
use std::process::{Command, Output};

fn fornax(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fornax"))
        .args(args)
        .output()
        .expect("run fornax")
}

fn model() -> String {
    let path = fornax_engine::store::ensure_default_model(&mut |s| eprintln!("{s}")).unwrap();
    path.to_string_lossy().into_owned()
}

fn reference(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/reference")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn json_out(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// FP32 weights (`--dequantize`) give the float reference's tokens; the quantized CPU path
/// (8-bit activations) is held to the reference in `reference_cpu`.
#[test]
fn generate_json_gives_reference_greedy_ids() {
    let model = model();
    let case = &reference("prompts.json")["prompts"][0];
    let prompt = case["prompt"].as_str().unwrap();
    let out = json_out(&fornax(&[
        "generate",
        prompt,
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--json",
        "--backend",
        "cpu",
        "--dequantize",
        "--model",
        &model,
    ]));
    assert_eq!(out["prompt_ids"], case["prompt_ids"]);
    let want: Vec<_> = case["float_reference"]["greedy_ids"].as_array().unwrap()[..8].to_vec();
    assert_eq!(out["generated_ids"].as_array().unwrap(), &want);
    assert!(out["text"].as_str().unwrap().starts_with(" Paris"));
}

#[test]
fn sampling_is_reproducible_by_seed() {
    let model = model();
    let run = |seed: &str| {
        json_out(&fornax(&[
            "generate",
            "Once upon a time",
            "--max-tokens",
            "12",
            "--temperature",
            "1.0",
            "--top-k",
            "40",
            "--seed",
            seed,
            "--ignore-eos",
            "--json",
            "--backend",
            "cpu",
            "--model",
            &model,
        ]))["generated_ids"]
            .clone()
    };
    let a = run("7");
    assert_eq!(a, run("7"));
    assert_ne!(a, run("8"));
}

#[test]
fn tokenize_matches_reference_and_decodes_back() {
    let model = model();
    for case in reference("tokenization.json")["cases"].as_array().unwrap() {
        let mut args = vec![
            "tokenize",
            case["text"].as_str().unwrap(),
            "--model",
            &model,
        ];
        if case["parse_special"].as_bool().unwrap() {
            args.push("--special");
        }
        assert_eq!(json_out(&fornax(&args)), case["ids"], "{}", case["name"]);
    }
    let out = fornax(&[
        "tokenize",
        "--decode",
        "[504, 3575, 282, 4649, 314]",
        "--model",
        &model,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "The capital of France is\n"
    );
}

#[test]
fn bad_model_files_give_one_clear_error() {
    let missing = fornax(&[
        "generate",
        "hi",
        "--model",
        "/nonexistent/model.gguf",
        "--backend",
        "cpu",
    ]);
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.starts_with("error: cannot open model file /nonexistent/model.gguf"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let bytes = std::fs::read(model()).unwrap();
    let truncated =
        std::env::temp_dir().join(format!("fornax-truncated-{}.gguf", std::process::id()));
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let out = fornax(&[
        "generate",
        "hi",
        "--model",
        truncated.to_str().unwrap(),
        "--backend",
        "cpu",
    ]);
    std::fs::remove_file(&truncated).ok();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid GGUF model file") && err.contains("points past the end"),
        "{err}"
    );
}

#[test]
fn unknown_backend_is_refused_by_name() {
    let out = fornax(&["info", "--backend", "tpu"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown backend \"tpu\""));
}

#[test]
fn missing_python_is_one_clear_sentence() {
    let home = std::env::temp_dir().join(format!("fornax-nopython-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_fornax"))
        .arg("fetch")
        .env("FORNAX_HOME", &home)
        .env("PATH", "")
        .output()
        .unwrap();
    std::fs::remove_dir_all(&home).ok();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: python3 is needed to fetch the default model"),
        "{err}"
    );
    assert!(last.contains("--model PATH"), "{err}");
}

/// A KV budget too small for the prompt is one clear error, not a panic; the same prompt
/// with INT8 tiers and the contiguous cache both run.
#[test]
fn kv_flags_and_a_too_small_pool() {
    let model = model();
    let prompt = "The history of computing is a story of abstractions. ".repeat(8);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            &prompt,
            "--max-tokens",
            "4",
            "--ignore-eos",
            "--json",
            "--backend",
            "cpu",
            "--model",
            &model,
        ];
        args.extend_from_slice(extra);
        fornax(&args)
    };
    let out = run(&["--kv-memory", "1", "--kv-recent", "all"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("KV cache"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let a = json_out(&run(&["--kv-recent", "32", "--kv-int8-after", "64"]));
    let b = json_out(&run(&["--contiguous-kv"]));
    assert_eq!(a["prompt_ids"], b["prompt_ids"]);
    assert_eq!(a["generated_ids"].as_array().unwrap().len(), 4);
    let bad = run(&["--kv-recent", "0"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--kv-recent"));
    // The host tier keeps prefix-cache blocks: without the prefix cache it is refused.
    let out = fornax(&[
        "bench",
        "load",
        "--backend",
        "cpu",
        "--model",
        &model,
        "--requests",
        "1",
        "--text",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/reference/ppl_text.txt"
        ),
        "--no-prefix-cache",
        "--kv-host-memory",
        "8",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kv-host-memory") && !err.contains("panicked"),
        "{err}"
    );
}

/// `generate --spec` gives the tokens of plain `generate`, greedy and seeded, and says on
/// stderr how many drafted tokens were accepted; it refuses the contiguous cache.
#[test]
fn generate_with_speculation_gives_the_same_tokens() {
    let model = model();
    let prompt = "red, green, blue, red, green, blue, red,";
    for sampling in [
        &[][..],
        &["--temperature", "0.8", "--top-k", "20", "--seed", "5"],
    ] {
        let run = |spec: &[&str]| {
            let mut args = vec!["generate", "--json", "--backend", "cpu", "--model", &model];
            args.extend(["--max-tokens", "24", prompt]);
            args.extend(sampling);
            args.extend(spec);
            fornax(&args)
        };
        let plain = json_out(&run(&[]));
        for proposer in ["ngram", "draft"] {
            let out = run(&["--spec", proposer]);
            assert_eq!(
                json_out(&out)["generated_ids"],
                plain["generated_ids"],
                "{proposer} {sampling:?}"
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("accepted"), "{err}");
        }
    }
    let out = fornax(&[
        "generate",
        "--backend",
        "cpu",
        "--model",
        &model,
        "--spec",
        "ngram",
        "--contiguous-kv",
        "x",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--spec needs the paged KV cache"));
}

/// `fornax models` lists every alias and what the cached default file holds; an unknown
/// alias or a missing file is an error naming the aliases. (The default's alias resolves
/// to the cached file; nothing is fetched.)
#[test]
fn models_lists_aliases_and_unknown_ones_are_named() {
    model();
    let out = fornax(&["models"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for alias in fornax_engine::store::ALIASES.iter() {
        assert!(text.contains(alias.name), "{text}");
    }
    assert!(
        text.contains("architecture: llama (runs); tensors: Q4_1 x210, F32 x61, Q8_0 x1"),
        "{text}"
    );
    let out = fornax(&["fetch", "smollm2-135m"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), model());
    for args in [
        &["fetch", "no-such-model"][..],
        &["info", "--model", "no-such-model", "--backend", "cpu"][..],
    ] {
        let out = fornax(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("smollm2-135m, gemma3-270m"), "{args:?}: {err}");
    }
}

/// `generate --json-schema` prints JSON valid for the schema (sampled), `--regex` a match,
/// `--logprobs 3` each token's log-probability and three alternatives; a schema that
/// cannot compile and a missing file are one clear error each.
#[test]
fn generate_under_a_schema_or_a_regex() {
    let model = model();
    let dir = std::env::temp_dir().join(format!("fornax-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = dir.join("person.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"], "additionalProperties": false}"#,
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--chat", "--backend", "cpu", "--model", &model];
        args.extend_from_slice(extra);
        fornax(&args)
    };
    let schema_arg = schema.to_string_lossy().into_owned();
    let out = json_out(&run(&[
        "Describe a person.",
        "--json-schema",
        &schema_arg,
        "--temperature",
        "0.7",
        "--seed",
        "3",
        "--json",
    ]));
    let text = out["text"].as_str().unwrap().trim_end_matches("<|im_end|>");
    let person: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let fields: Vec<&String> = person.as_object().unwrap().keys().collect();
    assert_eq!(fields, ["name", "age"], "{text}");
    assert!(person["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
    assert!(
        person["name"]
            .as_str()
            .is_some_and(|n| n.chars().count() <= 30),
        "{text}"
    );

    let out = json_out(&run(&[
        "A phone number:",
        "--regex",
        "[0-9]{3}-[0-9]{4}",
        "--json",
    ]));
    let text = out["text"].as_str().unwrap().trim_end_matches("<|im_end|>");
    let b = text.as_bytes();
    assert!(b.len() == 8 && b[3] == b'-', "{text}");

    // --logprobs: one entry per generated token, greedy's token heading its alternatives.
    let out = json_out(&run(&[
        "Name a colour.",
        "--max-tokens",
        "6",
        "--logprobs",
        "3",
        "--json",
    ]));
    let ids = out["generated_ids"].as_array().unwrap();
    let entries = out["logprobs"].as_array().unwrap();
    assert_eq!(entries.len(), ids.len());
    for (e, id) in entries.iter().zip(ids) {
        assert_eq!(e["id"], *id, "{e}");
        let top = e["top"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        assert_eq!(
            (&top[0]["id"], &top[0]["logprob"]),
            (id, &e["logprob"]),
            "{e}"
        );
    }

    std::fs::write(&schema, r#"{"type": "objekt"}"#).unwrap();
    let bad = run(&["hi", "--json-schema", &schema_arg]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("does not compile"),
        "{err}"
    );
    let missing = run(&["hi", "--json-schema", "/nonexistent/schema.json"]);
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        !missing.status.success() && err.contains("cannot read"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
