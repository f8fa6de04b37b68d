//! Flags of the elastic KV window (opt-in): under block pressure sequences keep their
//! sink blocks and newest W = min(L_max, a * sqrt(B) + b) tokens instead of preempting.

use clap::{Args, ValueEnum};
use fornax_engine::sched::ElasticWindow;

/// What a sequence keeps when the KV pool runs short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum WindowMode {
    /// Every token; requests are preempted when blocks run out.
    #[default]
    Full,
    /// Sinks plus the newest W tokens, trimmed before anyone is preempted.
    Elastic,
}

/// Elastic window settings.
#[derive(Args, Debug, Clone)]
pub struct WindowArgs {
    /// KV kept under pressure: `full` (preempt) or `elastic` (trim to a window; changes
    /// outputs).
    #[arg(long, value_enum, default_value_t = WindowMode::Full)]
    pub kv_window: WindowMode,
    /// Slope a of W = min(L_max, a * sqrt(B) + b), B the running sequences.
    #[arg(long, default_value_t = 12.8)]
    pub kv_window_a: f64,
    /// Offset b of W.
    #[arg(long, default_value_t = 64.0)]
    pub kv_window_b: f64,
    /// L_max, the largest W (default: the model's context).
    #[arg(long)]
    pub kv_window_max: Option<usize>,
    /// Leading 32-token blocks every sequence keeps (attention sinks).
    #[arg(long, default_value_t = 1)]
    pub kv_sink_blocks: usize,
}

impl WindowArgs {
    /// The window, when `--kv-window elastic`.
    pub fn window(&self) -> Option<ElasticWindow> {
        (self.kv_window == WindowMode::Elastic).then(|| self.elastic())
    }

    /// The window these parameters describe, whatever `--kv-window` says.
    pub fn elastic(&self) -> ElasticWindow {
        ElasticWindow {
            a: self.kv_window_a,
            b: self.kv_window_b,
            max_tokens: self.kv_window_max.unwrap_or(usize::MAX),
            sink_blocks: self.kv_sink_blocks,
        }
    }
}
