//! Exact counts of what work on a CubeCL device costs: kernel dispatches and host-device
//! synchronisations (read-backs).
//!
//! - Dispatches: every kernel launch goes through cubecl's `ComputeClient`, burn's
//!   operations and ours alike; built with cubecl's `tracing` feature, each launch opens a
//!   span (`launch_inner`) on the launching thread, which a scoped subscriber counts.
//! - Syncs: every read-back in Fornax goes through [`read_back`] (or its async twin), which
//!   counts it and the bytes it brings back.
//!
//! Counts are per thread: [`counted`] sees what its closure launches and reads, nothing of
//! other threads. The CPU backend launches no kernels; its read-backs are copies, counted
//! the same way.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use burn_tensor::{backend::Backend, BasicOps, Tensor, TensorData};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// Dispatches and read-backs of some work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounts {
    /// Kernel launches.
    pub dispatches: u64,
    /// Host-device synchronisations: read-backs.
    pub syncs: u64,
    /// Bytes the read-backs brought to the host.
    pub read_bytes: u64,
}

thread_local! {
    static READS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Counts one read-back of `bytes` bytes on this thread.
fn note_read(bytes: usize) {
    READS.with(|r| {
        let (n, b) = r.get();
        r.set((n + 1, b + bytes as u64));
    });
}

/// `t`'s values on the host: one synchronisation, counted.
pub fn read_back<B: Backend, const D: usize, K: BasicOps<B>>(t: Tensor<B, D, K>) -> TensorData {
    let data = t.into_data();
    note_read(data.bytes.len());
    data
}

/// [`read_back`] without blocking the thread (WebGPU maps buffers only asynchronously).
pub async fn read_back_async<B: Backend, const D: usize, K: BasicOps<B>>(
    t: Tensor<B, D, K>,
) -> Result<TensorData, String> {
    let data = t.into_data_async().await.map_err(|e| format!("{e:?}"))?;
    note_read(data.bytes.len());
    Ok(data)
}

/// Whether a span is cubecl's kernel launch.
fn is_launch(meta: &Metadata<'_>) -> bool {
    meta.name() == "launch_inner" && meta.target().starts_with("cubecl_runtime")
}

/// A subscriber that only counts kernel-launch spans.
struct LaunchCounter(Arc<AtomicU64>);

impl Subscriber for LaunchCounter {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if is_launch(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        is_launch(meta)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        self.0.fetch_add(1, Ordering::Relaxed);
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Runs `f` and counts the dispatches and read-backs it makes on this thread.
pub fn counted<R>(f: impl FnOnce() -> R) -> (R, DeviceCounts) {
    let launches = Arc::new(AtomicU64::new(0));
    let reads_before = READS.with(Cell::get);
    let out = tracing::subscriber::with_default(LaunchCounter(launches.clone()), f);
    let (n, b) = READS.with(Cell::get);
    let counts = DeviceCounts {
        dispatches: launches.load(Ordering::Relaxed),
        syncs: n - reads_before.0,
        read_bytes: b - reads_before.1,
    };
    (out, counts)
}
