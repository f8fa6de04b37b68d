//! `fornax serve` with API keys, on the real model over HTTP: requests without a valid key
//! never reach the engine, the official client works with `api_key=`, a key's class caps
//! the priority, its rate limit answers 429 until its window passes, SIGHUP swaps keys
//! while an earlier stream finishes intact, and no key shows in logs, errors or metrics.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::server::{
    completion, openai_client, streamed_text, Metrics, Server, COMPLETION_PROMPT, MAX_TOKENS,
};

const WEB: &str = "sk-test-web-interactive-01";
const NIGHTLY: &str = "sk-test-nightly-batch-002";
const LIMITED: &str = "sk-test-limited-rpm1-0003";
const OLD: &str = "sk-test-old-revoked-00004";
const ADDED: &str = "sk-test-added-by-hup-0005";
const ENV: &str = "sk-test-from-environment6";
/// What every key here starts with: no log line, body or metric may contain it.
const SECRET_PREFIX: &str = "sk-test-";

fn keys_file(lines: &[&str]) -> String {
    lines.join("\n") + "\n"
}

/// Sends SIGHUP to the server.
fn hang_up(server: &Server) {
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -HUP");
}

/// Waits until `key` gets `status` on `/v1/models` (the keys were re-read).
fn wait_for(server: &Server, key: &str, status: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.send("/v1/models", None, Some(key)).status != status {
        assert!(Instant::now() < deadline, "the keys were not re-read");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn keys_guard_the_server_cap_classes_limit_rates_and_reload_on_sighup() {
    let dir = std::env::temp_dir().join(format!("fornax-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    std::fs::write(
        &file,
        keys_file(&[
            "# name, highest class, limits",
            &format!("{WEB} web 0"),
            &format!("{NIGHTLY} nightly 2"),
            &format!("{LIMITED} limited 1 rpm=1"),
            &format!("{OLD} old 1"),
        ]),
    )
    .unwrap();
    let server = Server::launch(
        &["--api-keys", file.to_str().unwrap(), "--rate-window-s", "3"],
        &[("FORNAX_API_KEY", ENV)],
    );
    // Every body and page the test sees, checked for keys at the end.
    let mut seen: Vec<String> = Vec::new();
    let metrics = |seen: &mut Vec<String>| {
        let r = server.send("/metrics", None, Some(WEB));
        assert_eq!(r.status, 200, "/metrics with a key");
        seen.push(r.text.clone());
        Metrics::parse(&r.text)
    };

    // Open routes and the key-only ones.
    assert_eq!(server.send("/health", None, None).status, 200);
    let r = server.send("/metrics", None, None);
    assert_eq!(r.status, 401, "/metrics needs a key: {}", r.text);
    let before = metrics(&mut seen);

    // No, malformed, wrong and empty keys: 401 before the engine.
    let body = completion(COMPLETION_PROMPT, 4, false);
    let near_miss = format!("Bearer {WEB}x");
    let refused = [
        (None, "missing"),
        (Some("Basic c2stdGVzdDp4"), "malformed"),
        (Some("Bearer "), "malformed"),
        (Some("Bearer sk-test-not-a-key-at-all"), "unknown"),
        (Some(near_miss.as_str()), "unknown"),
    ];
    for (header, _) in &refused {
        let r = server.send_authorized("/v1/completions", Some(&body), *header);
        assert_eq!(r.header["www-authenticate"], "Bearer", "{header:?}");
        assert_eq!(r.status, 401, "{header:?}: {}", r.text);
        assert_eq!(r.body["error"]["code"], "invalid_api_key", "{}", r.text);
        seen.push(r.text);
    }
    let after = metrics(&mut seen);
    for counter in [
        "fornax_prompt_tokens_total",
        "fornax_generated_tokens_total",
        "fornax_engine_steps_total",
    ] {
        assert_eq!(
            after.value(counter, &[]),
            before.value(counter, &[]),
            "{counter} moved for refused requests"
        );
    }
    for reason in ["missing", "malformed", "unknown"] {
        // The keyless `/metrics` above counts as missing too.
        let probe = usize::from(reason == "missing");
        let want = (refused.iter().filter(|(_, r)| *r == reason).count() + probe) as f64;
        assert_eq!(
            after.value("fornax_auth_failures_total", &[("reason", reason)]),
            want,
            "{reason}"
        );
    }

    // The official client with `api_key=`, and the key from the environment.
    let client = openai_client(&server, Some(WEB));
    assert_eq!(client["streamed_completion_tokens"], MAX_TOKENS);
    assert!(!client["chat"].as_str().unwrap().is_empty());
    assert_eq!(server.send("/v1/models", None, Some(ENV)).status, 200);

    // A class-2 key asking for priority 0 runs at class 2; a class-0 key keeps its ask.
    let mut ask_first = completion(COMPLETION_PROMPT, 4, false);
    ask_first["priority"] = json!(0);
    let r = server.send("/v1/completions", Some(&ask_first), Some(NIGHTLY));
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header["x-fornax-priority"], "2");
    seen.push(r.text);
    let r = server.send("/v1/completions", Some(&ask_first), Some(WEB));
    assert_eq!(r.header["x-fornax-priority"], "0");
    let m = metrics(&mut seen);
    let key_requests = |key, class| {
        m.value(
            "fornax_key_requests_total",
            &[("key", key), ("class", class)],
        )
    };
    assert_eq!(key_requests("nightly", "2"), 1.0);
    assert_eq!(key_requests("nightly", "0"), 0.0);
    assert!(key_requests("web", "0") >= 1.0);
    assert!(m.value("fornax_key_tokens_total", &[("key", "nightly")]) >= 4.0);

    // One request per 3 s window: the second gets 429 with Retry-After, then succeeds.
    assert_eq!(
        server
            .send("/v1/completions", Some(&body), Some(LIMITED))
            .status,
        200
    );
    let r = server.send("/v1/completions", Some(&body), Some(LIMITED));
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.body["error"]["code"], "rate_limit_exceeded");
    let wait: u64 = r.header["retry-after"].parse().unwrap();
    assert!((1..=3).contains(&wait), "Retry-After {wait}");
    seen.push(r.text);
    std::thread::sleep(Duration::from_secs(wait));
    let r = server.send("/v1/completions", Some(&body), Some(LIMITED));
    assert_eq!(r.status, 200, "after the window: {}", r.text);
    let m = metrics(&mut seen);
    assert_eq!(
        m.value(
            "fornax_key_refusals_total",
            &[("key", "limited"), ("reason", "requests")]
        ),
        1.0
    );

    // SIGHUP: `old` removed and `added` added while a stream runs; the stream ends intact.
    let streamed = completion("Once upon a time", 48, true);
    let mut events = server.stream_as("/v1/completions", &streamed, Some(WEB));
    let first = events.next().expect("a first chunk");
    std::fs::write(
        &file,
        keys_file(&[
            &format!("{WEB} web 0"),
            &format!("{NIGHTLY} nightly 2"),
            &format!("{ADDED} added 1"),
        ]),
    )
    .unwrap();
    hang_up(&server);
    wait_for(&server, ADDED, 200);
    let prompt_tokens = metrics(&mut seen).value("fornax_prompt_tokens_total", &[]);
    let r = server.send("/v1/completions", Some(&body), Some(OLD));
    assert_eq!(r.status, 401, "a revoked key: {}", r.text);
    assert_eq!(r.body["error"]["code"], "invalid_api_key");
    seen.push(r.text);
    assert_eq!(
        metrics(&mut seen).value("fornax_prompt_tokens_total", &[]),
        prompt_tokens,
        "a revoked key reached the engine"
    );
    let mut chunks: Vec<Value> = vec![first];
    chunks.extend(events.rest());
    let (text, finish, tokens) = streamed_text(&chunks, false);
    let mut whole = completion("Once upon a time", 48, false);
    whole["stream"] = json!(false);
    let r = server.send("/v1/completions", Some(&whole), Some(ADDED));
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        text, r.body["choices"][0]["text"],
        "the stream ended intact"
    );
    assert_eq!(finish, r.body["choices"][0]["finish_reason"]);
    assert_eq!(
        tokens,
        r.body["usage"]["completion_tokens"].as_u64().unwrap()
    );

    // A keys file that does not parse keeps the keys in force.
    std::fs::write(&file, "this is not a keys file\n").unwrap();
    hang_up(&server);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server
        .log
        .lock()
        .unwrap()
        .contains("keeping the previous keys")
    {
        assert!(Instant::now() < deadline, "no log of the bad keys file");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(server.send("/v1/models", None, Some(ADDED)).status, 200);

    // No key in any body, metrics page or log line.
    metrics(&mut seen);
    let log = server.log.lock().unwrap().clone();
    assert!(log.contains("API keys required"), "{log}");
    seen.push(log);
    for text in &seen {
        assert!(!text.contains(SECRET_PREFIX), "a key leaked into: {text}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
