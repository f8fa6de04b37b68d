//! Flags of the continuous-batching scheduler shared by the commands that serve requests.

use clap::Args;
use fornax_engine::kv::PagedKv;
use fornax_engine::model::Model;
use fornax_engine::sched::{PolicyKind, SchedulerConfig};
use fornax_engine::{Engine, EngineBackend};

use crate::spec::SpecArgs;
use crate::window::WindowArgs;

/// Scheduler settings.
#[derive(Args, Debug, Clone)]
pub struct SchedArgs {
    /// Tokens per step, all sequences together (prefill chunks and decodes).
    #[arg(long, default_value_t = 2048)]
    pub max_batch_tokens: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// How long an idle engine waits to gather a batch, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub batch_window_ms: u64,
    /// Priority policy: qos-aging (QoS class, then least remaining work, ageing one class
    /// per 64 steps), fcfs, or seed (0.6 x length + 0.4 x QoS).
    #[arg(long, default_value = "qos-aging")]
    pub policy: PolicyKind,
    /// Do not share the KV blocks of common prompt prefixes across requests.
    #[arg(long)]
    pub no_prefix_cache: bool,
    #[command(flatten)]
    pub elastic: WindowArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

impl SchedArgs {
    /// The scheduler limits (the context length is the model's, set by the engine).
    pub fn config(&self) -> SchedulerConfig {
        SchedulerConfig {
            max_batch_tokens: self.max_batch_tokens.max(1),
            max_batch: self.max_batch.max(1),
            window: self.elastic.window(),
            ..SchedulerConfig::default()
        }
    }

    /// An engine over `model` and `kv` with these settings.
    pub fn engine<'m, B: EngineBackend>(
        &self,
        model: &'m Model<B>,
        kv: PagedKv<B>,
    ) -> Engine<'m, B> {
        self.engine_with(model, kv, self.config(), self.policy)
    }

    /// An engine with these settings but the scheduler's `config` and `policy`.
    pub fn engine_with<'m, B: EngineBackend>(
        &self,
        model: &'m Model<B>,
        kv: PagedKv<B>,
        config: SchedulerConfig,
        policy: PolicyKind,
    ) -> Engine<'m, B> {
        let engine = self.spec.apply(Engine::new(model, kv, config, policy));
        match self.no_prefix_cache {
            true => engine,
            false => engine.with_prefix_cache(),
        }
    }

    /// The batch window in seconds.
    pub fn window_s(&self) -> f64 {
        self.batch_window_ms as f64 / 1000.0
    }
}
