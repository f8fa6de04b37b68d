//! Per-request switch: speculation pauses for a request whose drafts cost more than they
//! save.
//!
//! A drafted token costs the proposer's work plus a row of the verification pass, and
//! saves a whole decoding step when it is kept. Drafting pays while the acceptance rate is
//! above that cost (as a fraction of a step): below it the request pauses, for longer each
//! time in a row, and comes back with a one-token probe.

/// Smoothing of the acceptance rate (weight of the newest verification).
const WEIGHT: f32 = 0.3;
/// A drafted token's row of the verification pass, as a fraction of a one-token decoding
/// step (CPU backend, `bench spec`'s step timers: 0.45-0.6 ms a row against 3.3 ms a step).
const VERIFY_ROW_COST: f32 = 0.15;
/// The lowest acceptance rate that keeps a request drafting, whatever the cost.
const MIN_RATE: f32 = 0.3;
/// How far above the rate at which it pauses a request starts (and resumes): a cheap
/// proposer keeps drafting through two wholly rejected drafts, an expensive one pauses after
/// the first.
const START_MARGIN: f32 = 0.2;
/// Steps of the first pause of a proposer at `MIN_RATE`; a costlier proposer's is longer in
/// proportion, so that its probes take the same share of the steps. Each pause in a row
/// is twice as long, up to `MAX_PAUSE`.
const FIRST_PAUSE: f32 = 8.0;
const MAX_PAUSE: u32 = 512;

/// One request's recent acceptance and its pause.
#[derive(Debug, Clone, Copy)]
pub struct Acceptance {
    /// The smoothed rate below which drafting does not pay.
    min_rate: f32,
    first_pause: u32,
    rate: f32,
    pause: u32,
    next_pause: u32,
    /// Drafted tokens the last verification kept, if it rejected one.
    last_kept: Option<usize>,
}

impl Default for Acceptance {
    /// A proposer whose drafts cost nothing to make (prompt lookup).
    fn default() -> Self {
        Self::new(0.0)
    }
}

impl Acceptance {
    /// A request's switch for a proposer that spends `draft_cost` of a one-token decoding
    /// step on each drafted token. Its first draft is one token.
    pub fn new(draft_cost: f32) -> Self {
        let min_rate = (draft_cost + VERIFY_ROW_COST).max(MIN_RATE);
        let first_pause = (FIRST_PAUSE * min_rate / MIN_RATE).round() as u32;
        Self {
            min_rate,
            first_pause,
            rate: min_rate + START_MARGIN,
            pause: 0,
            next_pause: first_pause,
            last_kept: Some(0),
        }
    }

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
        if self.rate < self.min_rate {
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
            self.rate = self.min_rate + START_MARGIN;
        } else if rate >= self.min_rate {
            self.next_pause = self.first_pause;
        }
    }
}
