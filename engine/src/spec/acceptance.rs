//! Per-request switch: speculation pauses for a request whose drafts keep being rejected.

/// Smoothing of the acceptance rate (weight of the newest verification).
const WEIGHT: f32 = 0.3;
/// Below this smoothed rate the request stops drafting for a while.
const MIN_RATE: f32 = 0.3;
/// Steps of the first pause; each pause in a row doubles it, up to `MAX_PAUSE`.
const FIRST_PAUSE: u32 = 8;
const MAX_PAUSE: u32 = 256;

/// One request's recent acceptance and its pause.
#[derive(Debug, Clone, Copy)]
pub struct Acceptance {
    rate: f32,
    pause: u32,
    next_pause: u32,
    /// Drafted tokens the last verification kept, if it rejected one.
    last_kept: Option<usize>,
}

impl Default for Acceptance {
    fn default() -> Self {
        Self {
            rate: 0.5,
            pause: 0,
            next_pause: FIRST_PAUSE,
            last_kept: None,
        }
    }
}

impl Acceptance {
    /// Whether to draft this step (a paused request counts its pause down).
    pub fn wants_draft(&mut self) -> bool {
        if self.pause > 0 {
            self.pause -= 1;
            return false;
        }
        true
    }

    /// Tokens to draft at most this step: `max`, or one more than the last verification
    /// kept when it rejected a token (a drafted token that fails costs a row of the pass).
    pub fn draft_len(&self, max: usize) -> usize {
        self.last_kept.map_or(max, |k| (k + 1).min(max))
    }

    /// Records a verification of `proposed` drafted tokens of which `accepted` were kept.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        self.last_kept = (accepted < proposed).then_some(accepted);
        let rate = accepted as f32 / proposed as f32;
        self.rate = (1.0 - WEIGHT) * self.rate + WEIGHT * rate;
        if self.rate < MIN_RATE {
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
            self.rate = 0.5;
        } else if rate >= MIN_RATE {
            self.next_pause = FIRST_PAUSE;
        }
    }
}
