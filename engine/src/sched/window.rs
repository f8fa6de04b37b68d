//! The elastic cache window: under block pressure a running sequence keeps its first
//! blocks ("sinks") and its newest W tokens, W = min(L_max, a * sqrt(B) + b) for B
//! running sequences, instead of a request being preempted (StreamingLLM-style). It
//! changes outputs, so it is opt-in (`--kv-window elastic`).

/// Parameters of the elastic window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ElasticWindow {
    pub a: f64,
    pub b: f64,
    /// The most tokens W may be (L_max).
    pub max_tokens: usize,
    /// Leading blocks every sequence keeps (the attention sinks).
    pub sink_blocks: usize,
}

impl Default for ElasticWindow {
    fn default() -> Self {
        Self {
            a: 12.8,
            b: 64.0,
            max_tokens: usize::MAX,
            sink_blocks: 1,
        }
    }
}

impl ElasticWindow {
    /// W for `batch` running sequences (at least one token).
    pub fn tokens(&self, batch: usize) -> usize {
        let w = self.a * (batch.max(1) as f64).sqrt() + self.b;
        (w.max(1.0) as usize).min(self.max_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_grows_with_the_square_root_of_the_batch() {
        let w = ElasticWindow::default();
        assert_eq!(w.tokens(1), 76);
        assert_eq!(w.tokens(8), 100);
        assert_eq!(w.tokens(64), 166);
        assert_eq!(w.tokens(128), 208);
        let capped = ElasticWindow {
            max_tokens: 120,
            ..w
        };
        assert_eq!(capped.tokens(128), 120);
    }
}
