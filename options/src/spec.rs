//! Flags of speculative decoding, shared by the commands that run the engine.

use clap::Args;
use fornax_engine::spec::{ProposerKind, SpecConfig};
use fornax_engine::{Engine, EngineBackend};

/// Speculative decoding settings (off unless `--spec` names a proposer).
#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: drafts from `ngram` (prompt lookup: what followed the last
    /// n-gram where it occurred before) or `draft` (the model's first layers), verified in
    /// the step's one forward pass. Output is that of plain decoding.
    #[arg(long)]
    pub spec: Option<ProposerKind>,
    /// Tokens drafted per request and step at most.
    #[arg(long, default_value_t = 3)]
    pub spec_tokens: usize,
    /// Layers of the model the `draft` proposer runs.
    #[arg(long, default_value_t = 8)]
    pub spec_draft_layers: usize,
}

impl SpecArgs {
    /// The settings, if speculation is on.
    pub fn config(&self) -> Option<SpecConfig> {
        self.spec.map(|proposer| SpecConfig {
            proposer,
            tokens: self.spec_tokens,
            draft_layers: self.spec_draft_layers,
        })
    }

    /// `engine` with these settings.
    pub fn apply<'m, B: EngineBackend>(&self, engine: Engine<'m, B>) -> Engine<'m, B> {
        match self.config() {
            Some(config) => engine.with_speculation(config),
            None => engine,
        }
    }
}
