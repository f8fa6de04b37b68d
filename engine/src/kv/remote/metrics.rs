//! The shared KV tier's metrics: names, descriptions, and their publication from
//! [`RemoteStats`].

use metrics::{counter, describe_counter};

use super::RemoteStats;

/// Requests looked up in the shared KV tier.
pub const REMOTE_LOOKUPS: &str = "fornax_kv_remote_lookups_total";
/// Blocks found and verified in the shared KV tier.
pub const REMOTE_HITS: &str = "fornax_kv_remote_hit_blocks_total";
/// Lookups that found no block.
pub const REMOTE_MISSES: &str = "fornax_kv_remote_misses_total";
/// Values in the shared tier that did not verify (another model, other tokens, truncated).
pub const REMOTE_REJECTED: &str = "fornax_kv_remote_rejected_total";
/// Failed or timed-out calls to the shared tier, and writes dropped.
pub const REMOTE_ERRORS: &str = "fornax_kv_remote_errors_total";
/// Blocks written to the shared tier.
pub const REMOTE_WRITTEN: &str = "fornax_kv_remote_written_blocks_total";
/// Bytes read from and written to the shared tier.
pub const REMOTE_BYTES_READ: &str = "fornax_kv_remote_read_bytes_total";
pub const REMOTE_BYTES_WRITTEN: &str = "fornax_kv_remote_written_bytes_total";

/// Describes the tier's metrics to the recorder (with the server's others).
pub fn describe() {
    describe_counter!(REMOTE_LOOKUPS, "Requests looked up in the shared KV tier");
    describe_counter!(
        REMOTE_HITS,
        "KV blocks found and verified in the shared tier"
    );
    describe_counter!(REMOTE_MISSES, "Shared-tier lookups that found no block");
    describe_counter!(
        REMOTE_REJECTED,
        "Shared-tier values that did not verify (never used)"
    );
    describe_counter!(
        REMOTE_ERRORS,
        "Failed or timed-out shared-tier calls and dropped writes"
    );
    describe_counter!(REMOTE_WRITTEN, "KV blocks written to the shared tier");
    describe_counter!(REMOTE_BYTES_READ, "Bytes read from the shared KV tier");
    describe_counter!(REMOTE_BYTES_WRITTEN, "Bytes written to the shared KV tier");
}

/// Publishes the shared KV tier's figures.
pub fn record(stats: &RemoteStats) {
    let get = RemoteStats::get;
    counter!(REMOTE_LOOKUPS).absolute(get(&stats.lookups));
    counter!(REMOTE_HITS).absolute(get(&stats.hit_blocks));
    counter!(REMOTE_MISSES).absolute(get(&stats.misses));
    counter!(REMOTE_REJECTED).absolute(get(&stats.rejected));
    counter!(REMOTE_ERRORS).absolute(get(&stats.errors));
    counter!(REMOTE_WRITTEN).absolute(get(&stats.written_blocks));
    counter!(REMOTE_BYTES_READ).absolute(get(&stats.bytes_read));
    counter!(REMOTE_BYTES_WRITTEN).absolute(get(&stats.bytes_written));
}
