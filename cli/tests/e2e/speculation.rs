//! `fornax serve --spec ngram` against a server without speculation: the same greedy
//! answers for repetitive and free prompts sent together (so drafts share steps with
//! requests that draft nothing), drafts counted on `/metrics`, every KV block back.

use crate::server::{completion, streamed_text, Server};

const PROMPTS: [&str; 4] = [
    "Monday: open 9:00-17:00, closed for lunch 12:00-13:00\nTuesday: open 9:00-17:00, closed for lunch 12:00-13:00\nWednesday:",
    "red, green, blue, red, green, blue, red, green,",
    "The capital of France is",
    "Once upon a time",
];

/// Streamed texts of every prompt, all in flight at once.
fn answers(server: &Server) -> Vec<String> {
    std::thread::scope(|s| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let chunks = server
                        .stream("/v1/completions", &completion(p, 32, true))
                        .rest();
                    streamed_text(&chunks, false).0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn speculation_keeps_the_servers_answers_and_counts_its_drafts() {
    let plain = answers(&Server::start(&[]));
    let server = Server::start(&["--spec", "ngram"]);
    let speculated = answers(&server);
    assert_eq!(speculated, plain);
    let (status, r) = server.post("/v1/completions", &completion(PROMPTS[0], 32, false));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["text"], plain[0]);
    let m = server.metrics();
    let proposed = m.value("fornax_spec_proposed_tokens_total", &[]);
    let accepted = m.value("fornax_spec_accepted_tokens_total", &[]);
    eprintln!("drafted {proposed}, accepted {accepted}");
    assert!(
        accepted > 0.0 && proposed >= accepted,
        "{proposed} / {accepted}"
    );
    assert!(m.value("fornax_spec_verifications_total", &[]) > 0.0);
    assert_eq!(
        m.value("fornax_kv_blocks_used", &[]),
        0.0,
        "every block back"
    );
    server.assert_healthy();
}
