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
/// In a step of `b` sequences a row costs the same but a kept token saves only a `b`-th of
/// the step: see [`row_cost`].
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

/// The acceptance rate at which a drafted token's verification row pays for itself in a
/// step of `batch` sequences. With a step costing `a + r * rows`, `d` drafted rows of which
/// `k` are kept turn `batch` tokens for `a + r * batch` into `batch + k` tokens for
/// `a + r * (batch + d)`: cheaper per token while `k / d > r * batch / (a + r * batch)`.
pub fn row_cost(batch: usize) -> f32 {
    let r_over_a = VERIFY_ROW_COST / (1.0 - VERIFY_ROW_COST);
    let x = r_over_a * batch.max(1) as f32;
    x / (1.0 + x)
}

/// One request's recent acceptance and its pause.
#[derive(Debug, Clone, Copy)]
pub struct Acceptance {
    /// The proposer's cost per drafted token, as a fraction of a decoding step.
    draft_cost: f32,
    rate: f32,
    pause: u32,
    /// Pauses in a row so far (each twice as long as the one before).
    pauses: u32,
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
    /// A request's switch for a proposer that spends `draft_cost` of a decoding step on
    /// each drafted token. Its first draft is one token.
    pub fn new(draft_cost: f32) -> Self {
        let mut a = Self {
            draft_cost,
            rate: 0.0,
            pause: 0,
            pauses: 0,
            last_kept: Some(0),
        };
        a.rate = a.min_rate(1) + START_MARGIN;
        a
    }

    /// The smoothed rate below which drafting does not pay in a step of `batch` sequences.
    pub fn min_rate(&self, batch: usize) -> f32 {
        (self.draft_cost + row_cost(batch)).max(MIN_RATE)
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

    /// Records a verification of `proposed` drafted tokens of which `accepted` were kept,
    /// in a step of `batch` sequences.
    pub fn record(&mut self, proposed: usize, accepted: usize, batch: usize) {
        if proposed == 0 {
            return;
        }
        self.last_kept = (accepted < proposed).then_some(accepted);
        let min_rate = self.min_rate(batch);
        let rate = accepted as f32 / proposed as f32;
        self.rate = (1.0 - WEIGHT) * self.rate + WEIGHT * rate;
        if self.rate < min_rate {
            let first = (FIRST_PAUSE * min_rate / MIN_RATE).round() as u32;
            self.pause = (first << self.pauses.min(16)).min(MAX_PAUSE);
            self.pauses += 1;
            self.rate = min_rate + START_MARGIN;
        } else if rate >= min_rate {
            self.pauses = 0;
        }
    }
}
