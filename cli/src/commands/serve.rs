//! `fornax serve`: the OpenAI-compatible HTTP server over continuous batching.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::grammar::GrammarCompiler;
use fornax_engine::tokenizer::Tokenizer;
use fornax_engine::EngineBackend;
use fornax_server::access::Access;
use fornax_server::engine_loop::run_engine_with;
use fornax_server::keys::ApiKey;
use fornax_server::limits::Queue;
use fornax_server::usage::Usage;
use fornax_server::{spawn_http, telemetry, unix_now, AppState, Limits, ModelInfo, ServerConfig};

use fornax_options::kv::KvArgs;
use fornax_options::sched::SchedArgs;
use fornax_options::{load_model, parse, tokenizer, ModelArgs, TemplateArgs};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The model name clients use (default: the file name without `.gguf`).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Requests waiting for their first token at most; more are refused with 503.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Prompt tokens per request at most (default: the model's context).
    #[arg(long)]
    pub max_prompt_tokens: Option<usize>,
    /// `max_tokens` per request at most (default: the model's context).
    #[arg(long)]
    pub max_output_tokens: Option<usize>,
    /// Request body size at most, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Open connections at most; further clients wait to be accepted.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds running requests may take to finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace_s: u64,
    /// An API key clients must send (`Authorization: Bearer KEY`); repeatable. Such keys
    /// may use every QoS class, without limits. `FORNAX_API_KEY` adds one more. Keys on
    /// the command line show in the process list: prefer `--api-keys` or the variable.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_keys_given: Vec<String>,
    /// Keys file: one key per line, `KEY NAME CLASS [rpm=N] [tpm=N]` (CLASS: the highest
    /// QoS class the key may use, 0..3; rpm/tpm: requests and prompt plus generated tokens
    /// per window). Re-read on SIGHUP. With no key at all the server is open to anyone.
    #[arg(long = "api-keys", value_name = "FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// `/metrics` answers without a key.
    #[arg(long)]
    pub metrics_open: bool,
    /// The window the keys' rpm and tpm limits count over, in seconds.
    #[arg(long, default_value_t = 60)]
    pub rate_window_s: u64,
    #[command(flatten)]
    pub template: TemplateArgs,
    #[command(flatten)]
    pub sched: SchedArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

struct Serve<'a> {
    args: &'a ServeArgs,
    path: PathBuf,
    gguf: &'a GgufFile<'a>,
    tokenizer: Arc<Tokenizer>,
    listener: TcpListener,
    name: String,
    access: Access,
}

impl BackendTask for Serve<'_> {
    type Output = Result<()>;

    fn run<B: EngineBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let a = self.args;
        let model = load_model::<B>(self.gguf, &device, a.model.load_options())?;
        let config = a.sched.config();
        let capacity = a.kv.capacity(model.kv_dims(), config.max_batch, 256)?;
        let kv = a.kv.paged(&model, capacity, !a.sched.no_prefix_cache)?;
        let remote = a.kv.remote(&self.path, model.kv_dims())?;
        let mut engine = a.sched.engine(&model, kv);
        let context = model.config.max_seq_len;
        let stop_ids = self.tokenizer.stop_ids();
        let grammars = Arc::new(
            GrammarCompiler::new(self.tokenizer.clone())
                .context("cannot index the vocabulary for constrained decoding")?,
        );

        let (commands, inbox) = channel();
        let engine_alive = Arc::new(AtomicBool::new(true));
        let state = Arc::new(AppState {
            commands,
            tokenizer: self.tokenizer.clone(),
            model: ModelInfo {
                name: self.name.clone(),
                created: unix_now(),
                context,
            },
            limits: Limits {
                max_prompt_tokens: a.max_prompt_tokens.unwrap_or(context),
                max_output_tokens: a.max_output_tokens.unwrap_or(context),
            },
            queue: Queue::new(a.max_queue),
            stop_ids,
            metrics: telemetry::install_metrics()?,
            next_id: AtomicU64::new(0),
            engine_alive: engine_alive.clone(),
            access: self.access,
            grammars,
        });
        let server_config = ServerConfig {
            max_body_bytes: a.max_body_bytes,
            max_connections: a.max_connections,
            shutdown_grace: Duration::from_secs(a.shutdown_grace_s),
        };
        let addr = self.listener.local_addr()?;
        let http = spawn_http(self.listener, state, server_config)?;
        tracing::info!(model = %self.name, backend = %info.kind, adapter = %info.adapter, dtype = %info.dtype, context, "model loaded");
        println!("fornax: serving {} on http://{addr}", self.name);
        run_engine_with(
            &mut engine,
            &inbox,
            Duration::from_millis(a.sched.batch_window_ms),
            remote,
        );
        engine_alive.store(false, Ordering::Release);
        let served = http
            .join()
            .map_err(|_| anyhow::anyhow!("the HTTP thread panicked"))?;
        tracing::info!(steps = engine.steps, "engine stopped");
        served
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    telemetry::init_logs();
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let path = args.model.path()?;
    let name = match &args.served_model_name {
        Some(n) => n.clone(),
        None => path
            .file_name()
            .map(|f| f.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| "model".into()),
    };
    let access = access(&args)?;
    let keys = access.keys();
    let addr = listener.local_addr()?;
    if keys.is_empty() && !addr.ip().is_loopback() {
        tracing::warn!(%addr, "no API keys: anyone who can reach this address may use the server (--api-keys, --api-key or FORNAX_API_KEY)");
    } else if !keys.is_empty() {
        tracing::info!(
            keys = keys.len(),
            metrics_open = args.metrics_open,
            "API keys required"
        );
    }
    let file = fornax_engine::store::ModelFile::open(&path)?;
    let gguf = parse(&file)?;
    let mut tokenizer = tokenizer(&gguf)?;
    args.template.apply(&mut tokenizer)?;
    let tokenizer = Arc::new(tokenizer);
    args.model.run_on(Serve {
        args: &args,
        path: path.clone(),
        gguf: &gguf,
        tokenizer,
        listener,
        name,
        access,
    })?
}

/// The keys of `--api-keys`, `--api-key` and `FORNAX_API_KEY`.
fn access(args: &ServeArgs) -> Result<Access> {
    let mut extra = Vec::new();
    for (i, key) in args.api_keys_given.iter().enumerate() {
        extra.push(ApiKey::open(format!("key-{}", i + 1), key).context("--api-key")?);
    }
    if let Ok(key) = std::env::var("FORNAX_API_KEY") {
        extra.push(ApiKey::open("env", &key).context("FORNAX_API_KEY")?);
    }
    if args.rate_window_s == 0 {
        anyhow::bail!("--rate-window-s must be at least 1");
    }
    Access::new(
        args.api_keys_file.clone(),
        extra,
        Usage::new(Duration::from_secs(args.rate_window_s)),
        args.metrics_open,
    )
}
