//! The shared KV tier on Redis (`--kv-remote redis://HOST:PORT[/DB]`): full prefix blocks
//! are written through by a thread of their own, and looked up for a request before it
//! reaches the engine, with a timeout. Redis's own `maxmemory` policy evicts.
//!
//! Faults are misses: Redis down, slow or full, or a value that does not verify
//! (`format::decode`), costs a recompute and a count in the figures, never an error to
//! the client; nothing in the engine's step loop waits on Redis.

pub mod format;
pub mod metrics;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kv::{BlockValues, KvDims, BLOCK_TOKENS};
use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

pub use format::Fingerprint;

/// Blocks waiting to be written; more are dropped (and counted) rather than waited for.
const WRITE_QUEUE: usize = 64;
/// After a failure, Redis is left alone this long before the next attempt.
const BACKOFF: Duration = Duration::from_secs(2);

/// Counters of the shared tier, read by metrics and benchmarks.
#[derive(Debug, Default)]
pub struct RemoteStats {
    /// Requests looked up, blocks found and verified, and requests that found none.
    pub lookups: AtomicU64,
    pub hit_blocks: AtomicU64,
    pub misses: AtomicU64,
    /// Values found that did not verify (foreign, other model, other tokens, truncated).
    pub rejected: AtomicU64,
    /// Failed or timed-out calls and writes dropped for a full queue.
    pub errors: AtomicU64,
    pub dropped_writes: AtomicU64,
    pub written_blocks: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

impl RemoteStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// One connection with timeouts, reopened after a failure once the back-off has passed.
struct Link {
    client: redis::Client,
    timeout: Duration,
    connection: Option<redis::Connection>,
    failed_at: Option<Instant>,
}

impl Link {
    fn new(client: redis::Client, timeout: Duration) -> Self {
        Self {
            client,
            timeout,
            connection: None,
            failed_at: None,
        }
    }

    /// Runs `f` on the connection; any failure drops the connection and starts the
    /// back-off. `None` while backing off or on failure.
    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Option<T> {
        if self.failed_at.is_some_and(|t| t.elapsed() < BACKOFF) {
            return None;
        }
        if self.connection.is_none() {
            let opened = self
                .client
                .get_connection_with_timeout(self.timeout)
                .and_then(|c| {
                    c.set_read_timeout(Some(self.timeout))?;
                    c.set_write_timeout(Some(self.timeout))?;
                    Ok(c)
                });
            match opened {
                Ok(c) => self.connection = Some(c),
                Err(_) => {
                    self.failed_at = Some(Instant::now());
                    return None;
                }
            }
        }
        match f(self.connection.as_mut().expect("opened above")) {
            Ok(v) => {
                self.failed_at = None;
                Some(v)
            }
            Err(_) => {
                self.connection = None;
                self.failed_at = Some(Instant::now());
                None
            }
        }
    }
}

/// Work for the writer thread.
enum Write {
    /// A block: the tokens up to its end and its values.
    Block(Vec<u32>, BlockValues),
    /// Answer once everything queued before is written (or failed).
    Flush(SyncSender<()>),
}

/// A lookup for the lookup thread.
struct Lookup {
    prompt: Vec<u32>,
    first: usize,
    done: Box<dyn FnOnce(Vec<BlockValues>) + Send>,
}

/// The shared tier of one engine.
pub struct RemoteTier {
    fingerprint: Fingerprint,
    /// Floats in one block.
    block_floats: usize,
    reader: Mutex<Link>,
    writes: SyncSender<Write>,
    lookups: Mutex<Sender<Lookup>>,
    pub stats: Arc<RemoteStats>,
}

impl RemoteTier {
    /// A tier on the Redis at `url` for blocks of `dims` under `fingerprint`; calls time
    /// out after `timeout`. Nothing is connected yet: a Redis that is down is a miss.
    pub fn open(
        url: &str,
        fingerprint: Fingerprint,
        dims: KvDims,
        timeout: Duration,
    ) -> Result<Arc<Self>> {
        let client = redis::Client::open(url)
            .with_context(|| format!("--kv-remote {url:?} is not a redis:// URL"))?;
        let stats = Arc::new(RemoteStats::default());
        let (writes, queue) = sync_channel(WRITE_QUEUE);
        let writer = Link::new(client.clone(), timeout);
        let writer_stats = stats.clone();
        std::thread::Builder::new()
            .name("kv-remote-writer".into())
            .spawn(move || write_through(writer, queue, fingerprint, &writer_stats))
            .context("cannot start the KV writer thread")?;
        let (lookups, jobs) = channel::<Lookup>();
        let tier = Arc::new(Self {
            fingerprint,
            block_floats: BLOCK_TOKENS * 2 * dims.n_layers * dims.n_kv_heads * dims.head_dim,
            reader: Mutex::new(Link::new(client, timeout)),
            writes,
            lookups: Mutex::new(lookups),
            stats,
        });
        let weak = Arc::downgrade(&tier);
        std::thread::Builder::new()
            .name("kv-remote-lookup".into())
            .spawn(move || {
                for job in jobs {
                    let found = match weak.upgrade() {
                        Some(tier) => {
                            let found = tier.lookup(&job.prompt, job.first);
                            metrics::record(&tier.stats);
                            found
                        }
                        None => Vec::new(),
                    };
                    (job.done)(found);
                }
            })
            .context("cannot start the KV lookup thread")?;
        Ok(tier)
    }

    /// Queues a block for writing (the tokens up to its end, its values); dropped and
    /// counted when the writer is behind.
    pub fn publish(&self, tokens: Vec<u32>, values: BlockValues) {
        match self.writes.try_send(Write::Block(tokens, values)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                RemoteStats::add(&self.stats.dropped_writes, 1);
                RemoteStats::add(&self.stats.errors, 1);
            }
        }
    }

    /// Waits until the blocks queued so far are written (or failed), at most `timeout`.
    pub fn flush(&self, timeout: Duration) {
        let (done, wait) = sync_channel(1);
        if self.writes.send(Write::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(timeout);
        }
    }

    /// Looks `prompt` up from full block `first` on (see [`Self::lookup`]) on the tier's
    /// lookup thread and hands the blocks found to `done` there.
    pub fn lookup_in_background(
        &self,
        prompt: Vec<u32>,
        first: usize,
        done: Box<dyn FnOnce(Vec<BlockValues>) + Send>,
    ) {
        let job = Lookup {
            prompt,
            first,
            done,
        };
        if let Err(e) = self.lookups.lock().expect("lookup queue").send(job) {
            // The lookup thread is gone: a miss.
            let job = e.0;
            (job.done)(Vec::new());
        }
    }

    /// The values of `prompt`'s full blocks from block `first` on (never the one holding
    /// its last token), as far as Redis holds them in order, each verified. Blocking. Any
    /// failure is a miss.
    pub fn lookup(&self, prompt: &[u32], first: usize) -> Vec<BlockValues> {
        RemoteStats::add(&self.stats.lookups, 1);
        let keys: Vec<String> = (first + 1..=lookable_blocks(prompt))
            .map(|n| format::key(&self.fingerprint, &prompt[..n * BLOCK_TOKENS]))
            .collect();
        let values: Option<Vec<Option<Vec<u8>>>> = match keys.is_empty() {
            true => Some(Vec::new()),
            false => self
                .reader
                .lock()
                .expect("reader lock")
                .with(|c| redis::cmd("MGET").arg(&keys).query(c)),
        };
        let Some(values) = values else {
            RemoteStats::add(&self.stats.errors, 1);
            RemoteStats::add(&self.stats.misses, 1);
            return Vec::new();
        };
        let mut found = Vec::new();
        for (n, value) in (first + 1..).zip(values) {
            let Some(bytes) = value else { break };
            RemoteStats::add(&self.stats.bytes_read, bytes.len() as u64);
            let tokens = &prompt[..n * BLOCK_TOKENS];
            match format::decode(&bytes, &self.fingerprint, tokens, self.block_floats) {
                Ok(v) => found.push(BlockValues::from(v)),
                Err(_) => {
                    RemoteStats::add(&self.stats.rejected, 1);
                    break;
                }
            }
        }
        match found.len() {
            0 => RemoteStats::add(&self.stats.misses, 1),
            n => RemoteStats::add(&self.stats.hit_blocks, n as u64),
        }
        found
    }
}

/// The writer thread: `SET key value NX` for each queued block until the tier is dropped.
fn write_through(
    mut link: Link,
    queue: Receiver<Write>,
    fingerprint: Fingerprint,
    stats: &RemoteStats,
) {
    for write in queue {
        let (tokens, values) = match write {
            Write::Block(tokens, values) => (tokens, values),
            Write::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let key = format::key(&fingerprint, &tokens);
        let value = format::encode(&fingerprint, &tokens, &values);
        let bytes = value.len() as u64;
        let written: Option<()> = link.with(|c| {
            redis::cmd("SET")
                .arg(&key)
                .arg(value)
                .arg("NX")
                .query::<Option<String>>(c)
                .map(|_| ())
        });
        match written {
            Some(()) => {
                RemoteStats::add(&stats.written_blocks, 1);
                RemoteStats::add(&stats.bytes_written, bytes);
            }
            None => RemoteStats::add(&stats.errors, 1),
        }
        metrics::record(stats);
    }
}

/// The full blocks of `prompt` a lookup can bring: all but the one holding its last token,
/// whose logits the engine must compute.
pub fn lookable_blocks(prompt: &[u32]) -> usize {
    prompt.len().saturating_sub(1) / BLOCK_TOKENS
}

/// The fingerprint of a model file and KV layout: the file's size and its first and last
/// MiB (cheap for multi-GB files, and enough to tell files apart), the dimensions, the
/// block size and the stored precision.
pub fn fingerprint(model: &Path, dims: KvDims) -> Result<Fingerprint> {
    use std::io::{Read, Seek, SeekFrom};
    const EDGE: u64 = 1 << 20;
    let mut file =
        std::fs::File::open(model).with_context(|| format!("cannot open {}", model.display()))?;
    let size = file.metadata()?.len();
    let mut h = Sha256::new();
    h.update(b"fornax-kv-f32-v1");
    h.update(size.to_le_bytes());
    for d in [dims.n_layers, dims.n_kv_heads, dims.head_dim, BLOCK_TOKENS] {
        h.update((d as u64).to_le_bytes());
    }
    let mut buf = Vec::new();
    file.by_ref().take(EDGE).read_to_end(&mut buf)?;
    h.update(&buf);
    buf.clear();
    file.seek(SeekFrom::Start(size.saturating_sub(EDGE)))?;
    file.take(EDGE).read_to_end(&mut buf)?;
    h.update(&buf);
    Ok(h.finalize().into())
}
