//! The tokenizer built from the real model's metadata against llama.cpp's ids.

use crate::common::{model_file, read_reference, Perplexity};
use fornax_engine::gguf::GgufFile;
use fornax_engine::tokenizer::{ChatMessage, TextStream, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    parse_special: bool,
    add_bos: bool,
    ids: Vec<u32>,
    roundtrip: String,
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::parse(model_file().bytes()).unwrap()).unwrap()
}

#[test]
fn every_reference_case_gives_the_reference_ids() {
    let tok = tokenizer();
    let cases: Cases = read_reference("tokenization.json");
    assert!(cases.cases.len() >= 8);
    for c in &cases.cases {
        let mut ids = tok.encode(&c.text, c.parse_special).unwrap();
        if c.add_bos {
            ids.insert(0, tok.bos_id.unwrap());
        }
        assert_eq!(ids, c.ids, "case {}", c.name);
        let skip = usize::from(c.add_bos);
        assert_eq!(
            tok.decode(&ids[skip..]).unwrap(),
            c.roundtrip,
            "case {}",
            c.name
        );
    }
}

#[test]
fn reference_prompts_and_perplexity_text_tokenize_exactly() {
    let tok = tokenizer();
    let prompts: crate::common::Prompts = read_reference("prompts.json");
    for p in &prompts.prompts {
        assert_eq!(
            tok.encode(&p.prompt, false).unwrap(),
            p.prompt_ids,
            "{:?}",
            p.prompt
        );
    }
    let ppl: Perplexity = read_reference("perplexity.json");
    let text =
        std::fs::read_to_string(crate::common::reference_dir().join("ppl_text.txt")).unwrap();
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(ids.len(), ppl.n_tokens);
    assert_eq!(ids, ppl.ids);
}

#[test]
fn streaming_decode_never_emits_broken_characters() {
    let tok = tokenizer();
    let text = "I love 🦀 Rust! 🚀🔥 👍🏽 naïve café — Ångström";
    let ids = tok.encode(text, false).unwrap();
    let mut stream = TextStream::default();
    let mut out = String::new();
    let mut split_seen = false;
    for &id in &ids {
        let bytes = tok.token_bytes(id).unwrap();
        split_seen |= std::str::from_utf8(bytes).is_err();
        let piece = stream.push(bytes);
        assert!(
            !piece.contains('\u{fffd}'),
            "garbage emitted for token {id}"
        );
        out += &piece;
    }
    out += &stream.finish();
    assert!(
        split_seen,
        "the text should contain a character split across tokens"
    );
    assert_eq!(out, text);
}

#[test]
fn chat_template_renders_smollm_format() {
    let tok = tokenizer();
    let text = tok
        .chat_template()
        .unwrap()
        .render(&[ChatMessage::new("user", "hi")], true)
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok
        .encode_chat(&[
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "hi"),
        ])
        .unwrap();
    let im_start = tok.token_id("<|im_start|>").unwrap();
    assert_eq!(ids[0], im_start);
    assert_eq!(ids.iter().filter(|&&i| i == im_start).count(), 3);
    assert!(tok.is_control(im_start));
}
