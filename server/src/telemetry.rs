//! Prometheus metrics (through the `metrics` facade) and `tracing` logs of the server.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use fornax_engine::{Engine, EngineBackend};
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// HTTP responses by route and status code.
pub const HTTP_REQUESTS: &str = "fornax_http_requests_total";
/// Generation requests that ended, by finish reason (stop, length, cancelled, error).
pub const REQUESTS_FINISHED: &str = "fornax_requests_finished_total";
/// Prompt tokens of accepted requests.
pub const PROMPT_TOKENS: &str = "fornax_prompt_tokens_total";
/// Tokens generated.
pub const GENERATED_TOKENS: &str = "fornax_generated_tokens_total";
/// Time from a request's arrival to its first token.
pub const TTFT: &str = "fornax_time_to_first_token_seconds";
/// Time between consecutive tokens of one request.
pub const INTER_TOKEN: &str = "fornax_inter_token_latency_seconds";
/// Time from a request's arrival to its last token.
pub const E2E: &str = "fornax_request_latency_seconds";
/// Requests holding KV blocks.
pub const RUNNING: &str = "fornax_requests_running";
/// Requests queued in the engine.
pub const WAITING: &str = "fornax_requests_waiting";
/// Sequences per engine step.
pub const BATCH_SEQUENCES: &str = "fornax_batch_sequences";
/// Tokens per engine step.
pub const BATCH_TOKENS: &str = "fornax_batch_tokens";
/// KV blocks in use.
pub const KV_USED: &str = "fornax_kv_blocks_used";
/// KV blocks free.
pub const KV_FREE: &str = "fornax_kv_blocks_free";
/// Unused token slots in partly filled blocks over the slots of used blocks.
pub const KV_WASTE: &str = "fornax_kv_waste_ratio";
/// Requests preempted (their blocks taken back) since start.
pub const PREEMPTIONS: &str = "fornax_preemptions_total";
/// Prompts looked up in the prefix cache.
pub const PREFIX_LOOKUPS: &str = "fornax_prefix_lookups_total";
/// Prompt tokens those lookups could have reused.
pub const PREFIX_LOOKUP_TOKENS: &str = "fornax_prefix_lookup_tokens_total";
/// Prompt tokens reused from the prefix cache.
pub const PREFIX_HIT_TOKENS: &str = "fornax_prefix_hit_tokens_total";
/// Hit tokens over lookup tokens since start.
pub const PREFIX_HIT_RATE: &str = "fornax_prefix_hit_rate";
/// Cached blocks evicted to make room.
pub const PREFIX_EVICTIONS: &str = "fornax_prefix_evictions_total";
/// KV blocks read by more than one sequence.
pub const KV_SHARED: &str = "fornax_kv_blocks_shared";
/// Cached KV blocks no sequence uses (evictable, counted as free).
pub const KV_CACHED: &str = "fornax_kv_blocks_cached";
/// Sequences trimmed by the elastic KV window.
pub const WINDOW_TRIMS: &str = "fornax_kv_window_trims_total";
/// Tokens whose KV the elastic window dropped.
pub const WINDOW_DROPPED: &str = "fornax_kv_window_dropped_tokens_total";
/// Prefix blocks copied into the host-memory tier as they left the device.
pub const HOST_STORED: &str = "fornax_kv_host_stored_blocks_total";
/// Blocks brought back from the host-memory tier instead of recomputed.
pub const HOST_RESTORED: &str = "fornax_kv_host_restored_blocks_total";
/// Blocks dropped from the host-memory tier to make room.
pub const HOST_DROPPED: &str = "fornax_kv_host_dropped_blocks_total";
/// Bytes of blocks held in the host-memory tier.
pub const HOST_BYTES: &str = "fornax_kv_host_bytes";
/// Tokens preempted requests computed again.
pub const RECOMPUTED: &str = "fornax_preemption_recomputed_tokens_total";
/// Indexed prefix blocks that aged into FP16 and left the index.
pub const PREFIX_AGED_OUT: &str = "fornax_prefix_aged_out_total";
/// Requests refused for want of a valid API key, by reason (missing, malformed, unknown).
pub const AUTH_FAILURES: &str = "fornax_auth_failures_total";
/// Generation requests accepted, by key name and the QoS class they ran at.
pub const KEY_REQUESTS: &str = "fornax_key_requests_total";
/// Prompt plus generated tokens, by key name.
pub const KEY_TOKENS: &str = "fornax_key_tokens_total";
/// Requests refused by a key's limits, by key name and reason (requests, tokens).
pub const KEY_REFUSALS: &str = "fornax_key_refusals_total";
/// Engine steps since start.
pub const STEPS: &str = "fornax_engine_steps_total";
/// Drafted tokens verified by speculative decoding.
pub const SPEC_PROPOSED: &str = "fornax_spec_proposed_tokens_total";
/// Drafted tokens kept.
pub const SPEC_ACCEPTED: &str = "fornax_spec_accepted_tokens_total";
/// Drafts verified (one per request and step).
pub const SPEC_VERIFICATIONS: &str = "fornax_spec_verifications_total";

/// Latency buckets in seconds, from 5 ms to 5 minutes.
const LATENCY_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0,
];
/// Batch-size buckets (sequences or tokens per step).
const BATCH_BUCKETS: [f64; 13] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

/// Installs the process-wide Prometheus recorder and describes every metric.
pub fn install_metrics() -> Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Prefix("fornax_batch_".into()), &BATCH_BUCKETS)
        })
        .context("metric buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    describe_counter!(HTTP_REQUESTS, "HTTP responses by route and status code");
    describe_counter!(
        REQUESTS_FINISHED,
        "Generation requests that ended, by reason"
    );
    describe_counter!(PROMPT_TOKENS, "Prompt tokens of accepted requests");
    describe_counter!(GENERATED_TOKENS, "Tokens generated");
    describe_histogram!(TTFT, metrics::Unit::Seconds, "Arrival to first token");
    describe_histogram!(
        INTER_TOKEN,
        metrics::Unit::Seconds,
        "Time between tokens of a request"
    );
    describe_histogram!(E2E, metrics::Unit::Seconds, "Arrival to last token");
    describe_gauge!(RUNNING, "Requests holding KV blocks");
    describe_gauge!(WAITING, "Requests queued in the engine");
    describe_histogram!(BATCH_SEQUENCES, "Sequences per engine step");
    describe_histogram!(BATCH_TOKENS, "Tokens per engine step");
    describe_gauge!(KV_USED, "KV cache blocks in use");
    describe_gauge!(KV_FREE, "KV cache blocks free");
    describe_gauge!(
        KV_WASTE,
        "Unused slots in partly filled KV blocks over used slots"
    );
    describe_counter!(PREEMPTIONS, "Requests preempted when KV blocks ran out");
    describe_counter!(STEPS, "Engine steps");
    describe_counter!(
        SPEC_PROPOSED,
        "Drafted tokens verified (speculative decoding)"
    );
    describe_counter!(SPEC_ACCEPTED, "Drafted tokens kept (speculative decoding)");
    describe_counter!(
        SPEC_VERIFICATIONS,
        "Drafts verified, one per request and step"
    );
    describe_counter!(PREFIX_LOOKUPS, "Prompts looked up in the prefix cache");
    describe_counter!(
        PREFIX_LOOKUP_TOKENS,
        "Prompt tokens the lookups could have reused"
    );
    describe_counter!(
        PREFIX_HIT_TOKENS,
        "Prompt tokens reused from the prefix cache"
    );
    describe_gauge!(
        PREFIX_HIT_RATE,
        "Prefix cache hit tokens over lookup tokens"
    );
    describe_counter!(PREFIX_EVICTIONS, "Cached KV blocks evicted to make room");
    describe_counter!(
        HOST_STORED,
        "Prefix blocks copied into host memory as they left the device"
    );
    describe_counter!(
        HOST_RESTORED,
        "KV blocks brought back from host memory instead of recomputed"
    );
    describe_counter!(
        HOST_DROPPED,
        "KV blocks dropped from host memory to make room"
    );
    describe_gauge!(HOST_BYTES, "Bytes of KV blocks held in host memory");
    describe_counter!(RECOMPUTED, "Tokens preempted requests computed again");
    fornax_engine::kv::remote::metrics::describe();
    describe_gauge!(KV_SHARED, "KV blocks read by more than one sequence");
    describe_gauge!(KV_CACHED, "Cached KV blocks no sequence uses (evictable)");
    describe_counter!(
        PREFIX_AGED_OUT,
        "Indexed KV blocks that aged into FP16 and left the prefix cache"
    );
    describe_counter!(
        WINDOW_TRIMS,
        "Sequences trimmed to the elastic KV window instead of preempting"
    );
    describe_counter!(WINDOW_DROPPED, "Tokens whose KV the elastic window dropped");
    describe_counter!(
        AUTH_FAILURES,
        "Requests refused for want of a valid API key, by reason"
    );
    describe_counter!(
        KEY_REQUESTS,
        "Generation requests accepted, by key name and QoS class"
    );
    describe_counter!(KEY_TOKENS, "Prompt plus generated tokens, by key name");
    describe_counter!(KEY_REFUSALS, "Requests refused by a key's limits");
    Ok(handle)
}

/// Publishes the engine's figures; `stepped` after a step (records the batch size).
pub fn record_engine<B: EngineBackend>(engine: &Engine<'_, B>, stepped: bool) {
    let (running, waiting) = engine.load();
    gauge!(RUNNING).set(running as f64);
    gauge!(WAITING).set(waiting as f64);
    let kv = engine.kv_stats();
    gauge!(KV_USED).set(kv.blocks_used as f64);
    gauge!(KV_FREE).set(kv.blocks_free() as f64);
    gauge!(KV_WASTE).set(kv.waste());
    gauge!(KV_SHARED).set(kv.shared_blocks as f64);
    gauge!(KV_CACHED).set(kv.cached_blocks as f64);
    if let Some(p) = engine.kv.pool.prefix_stats() {
        counter!(PREFIX_LOOKUPS).absolute(p.lookups);
        counter!(PREFIX_LOOKUP_TOKENS).absolute(p.lookup_tokens);
        counter!(PREFIX_HIT_TOKENS).absolute(p.hit_tokens);
        counter!(PREFIX_EVICTIONS).absolute(p.evictions);
        counter!(PREFIX_AGED_OUT).absolute(p.aged_out);
        gauge!(PREFIX_HIT_RATE).set(p.hit_rate());
    }
    if let Some(h) = engine.kv.pool.host_stats() {
        counter!(HOST_STORED).absolute(h.stored);
        counter!(HOST_RESTORED).absolute(h.restored);
        counter!(HOST_DROPPED).absolute(h.dropped);
        gauge!(HOST_BYTES).set(h.bytes as f64);
    }
    counter!(PREEMPTIONS).absolute(engine.sched.preemptions);
    counter!(RECOMPUTED).absolute(engine.sched.recomputed);
    counter!(WINDOW_TRIMS).absolute(kv.window_trims);
    counter!(WINDOW_DROPPED).absolute(kv.window_dropped_tokens);
    counter!(STEPS).absolute(engine.steps);
    if engine.speculation().is_some() {
        counter!(SPEC_PROPOSED).absolute(engine.spec_stats.proposed);
        counter!(SPEC_ACCEPTED).absolute(engine.spec_stats.accepted);
        counter!(SPEC_VERIFICATIONS).absolute(engine.spec_stats.verifications);
    }
    if stepped {
        let (seqs, tokens) = engine.last_batch;
        histogram!(BATCH_SEQUENCES).record(seqs as f64);
        histogram!(BATCH_TOKENS).record(tokens as f64);
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default: `info`).
pub fn init_logs() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
