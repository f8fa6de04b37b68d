//! The kernels' threads: rayon's global pool, sized once.

/// The pool was already sized (or used) before [`set_threads`].
#[derive(Debug, thiserror::Error)]
#[error("the CPU thread pool is already running with {running} threads: {source}")]
pub struct ThreadsError {
    running: usize,
    source: rayon::ThreadPoolBuildError,
}

/// Sizes the pool the kernels (and burn's CPU backend) run on: `n` threads, the calling
/// thread being one of them. A product started from a thread outside the pool hands its
/// work over and sleeps until it is done (two context switches, tens of microseconds, a
/// hundred times per decoded token); started from the pool's own thread it works on a
/// share itself. Call it before any kernel runs, from the thread that will run the model;
/// later calls fail.
pub fn set_threads(n: usize) -> Result<(), ThreadsError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .use_current_thread()
        .build_global()
        .map_err(|source| ThreadsError {
            running: threads(),
            source,
        })
}

/// Threads in the pool.
pub fn threads() -> usize {
    rayon::current_num_threads()
}
