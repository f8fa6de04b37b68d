//! Token sampling from logits: greedy, temperature, top-k, top-p and min-p, reproducible
//! by seed; penalties and biases ([`Adjustments`]), grammar masks and log-probabilities on
//! the host ([`HostRow`]).

use rand::{rngs::StdRng, Rng, SeedableRng};

mod adjust;
mod device;
mod logprobs;
pub use adjust::{Adjustments, History, BAN};
pub use logprobs::{TokenLogprobs, MAX_TOP_LOGPROBS};

use crate::grammar::Mask;
pub(crate) use device::select_rows;
pub use device::{
    argmax_rows, argmax_rows_async, mask_rows, pick_rows, pick_rows_async, pick_rows_hosted,
    SamplingOps,
};

/// Sampling settings. `temperature == 0` means greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = none).
    pub min_p: f32,
    /// Seed of the random generator.
    pub seed: u64,
    /// Penalties and biases applied to the logits first.
    pub adjust: Adjustments,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            adjust: Adjustments::default(),
        }
    }
}

/// What a row's choice needs on the host besides its sampler: the grammar's mask, the
/// request's history (for its penalties) and how many log-probabilities to report.
#[derive(Debug, Clone)]
pub struct HostRow<'a> {
    pub mask: Option<Mask>,
    pub history: &'a History,
    /// `Some(n)`: the chosen token's log-probability and the `n` most likely tokens'.
    pub logprobs: Option<usize>,
}

/// Index of the largest logit (the lowest index on ties; NaN never wins).
///
/// Two passes the compiler vectorises: the maximum lane by lane, then the first run of
/// 64 values holding it (a 49,152-value row takes microseconds, where a compare and
/// branch per value took tens of them).
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    const RUN: usize = 64;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let max = lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    let run = logits
        .chunks(RUN)
        .position(|c| c.iter().fold(false, |hit, &v| hit | (v == max)))
        .unwrap_or(0);
    let at = logits[run * RUN..]
        .iter()
        .position(|&v| v == max)
        .unwrap_or(0);
    (run * RUN + at) as u32
}

/// Draws tokens according to [`SamplingParams`].
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    /// A sampler seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        let rng = StdRng::seed_from_u64(params.seed);
        Self { params, rng }
    }

    /// Whether it always takes the most likely token (which the device can pick:
    /// [`argmax_rows`]).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0 || self.params.top_k == 1
    }

    /// Whether its choices need the host (settings the device kernel lacks).
    pub fn needs_host(&self) -> bool {
        (self.params.min_p > 0.0 && !self.is_greedy()) || !self.params.adjust.is_none()
    }

    /// Picks the next token from one raw row of logits with what `host` asks: the
    /// log-probabilities of the raw row, then the penalties and biases, then the mask.
    pub fn sample_hosted(
        &mut self,
        row: &mut [f32],
        host: &HostRow<'_>,
    ) -> (u32, Option<TokenLogprobs>) {
        let raw = host.logprobs.map(|_| row.to_vec());
        self.params.adjust.apply(row, host.history);
        if let Some(mask) = &host.mask {
            mask.apply(row);
        }
        let token = self.sample(row);
        let logprobs = raw.map(|raw| TokenLogprobs::of(&raw, token, host.logprobs.unwrap_or(0)));
        (token, logprobs)
    }

    /// Picks the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let draw = self.draw();
        self.choose(logits, draw.u)
    }

    /// This sample's settings and uniform draw, taken from the generator now (greedy
    /// takes none), for a choice made elsewhere ([`Self::choose`] or the device).
    pub fn draw(&mut self) -> Draw {
        let p = &self.params;
        let greedy = self.is_greedy();
        Draw {
            temperature: if greedy { 1.0 } else { p.temperature },
            top_k: if greedy { 1 } else { p.top_k },
            top_p: if greedy { 1.0 } else { p.top_p },
            u: if greedy {
                0.0
            } else {
                self.rng.random::<f32>()
            },
        }
    }

    /// The token `u` (this sample's [`Draw`]) picks from one row of logits: the tokens
    /// ordered most likely first (lower id first on ties), cut to the top `k`, to those
    /// at least `min_p` times as likely as the first, and to the smallest head reaching
    /// `top_p`; then the first whose cumulative probability passes `u`. Only the head of
    /// the order is sorted (1,024 tokens): the walk almost always ends in it, and a
    /// choice that does not sorts the rest.
    pub fn choose(&self, logits: &[f32], u: f32) -> u32 {
        if self.is_greedy() {
            return argmax(logits);
        }
        let p = &self.params;
        let mut cands = scaled(logits, p.temperature);
        if cands.is_empty() {
            return argmax(logits);
        }
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cands.len() {
            cands.select_nth_unstable_by(p.top_k - 1, order);
            cands.truncate(p.top_k);
        }
        let head = HEAD.min(cands.len());
        if head < cands.len() {
            cands.select_nth_unstable_by(head - 1, order);
        }
        cands[..head].sort_unstable_by(order);
        if let Some(token) = walk(&cands, head, p, u) {
            return token;
        }
        cands.sort_unstable_by(order);
        walk(&cands, cands.len(), p, u).expect("the whole order is sorted")
    }
}

/// Each finite logit's token with the logit divided by `temperature`.
fn scaled(logits: &[f32], temperature: f32) -> Vec<(u32, f32)> {
    logits
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as u32, v / temperature))
        .collect()
}

/// Candidates a host choice sorts first (of 49,152 or 262,144): sorting them all took
/// most of a sampled step's host time.
const HEAD: usize = 1024;

/// The choice [`Sampler::choose`] describes over `cands` (scaled logits after top-k),
/// of which the first `sorted` are in order; `None` where it needs more of the order.
fn walk(cands: &[(u32, f32)], sorted: usize, p: &SamplingParams, u: f32) -> Option<u32> {
    let complete = sorted == cands.len();
    let max = cands[0].1;
    let weight = |v: f32| (v - max).exp();
    // min-p keeps the tokens whose weight reaches it (the first token's weight is 1).
    let floor = p.min_p.clamp(0.0, 1.0);
    let z: f64 = cands
        .iter()
        .map(|&(_, v)| weight(v))
        .filter(|&w| w >= floor)
        .map(f64::from)
        .sum();
    let kept = cands[..sorted]
        .iter()
        .take_while(|&&(_, v)| weight(v) >= floor)
        .count();
    // The kept tokens are all among the sorted ones.
    let kept_known = kept < sorted || complete;
    let prob = |i: usize| f64::from(weight(cands[i].1)) / z;
    let mut keep = kept_known.then_some(kept);
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let reached = (0..kept).position(|i| {
            acc += prob(i);
            acc >= f64::from(p.top_p)
        });
        keep = match reached {
            Some(i) => Some(i + 1),
            None if kept_known => Some(kept),
            None => return None,
        };
    }
    let total = match keep {
        Some(k) if p.top_p < 1.0 => (0..k).map(prob).sum(),
        _ => 1.0,
    };
    let mut r = f64::from(u) * total;
    for (i, &(token, _)) in cands[..keep.unwrap_or(kept)].iter().enumerate() {
        let x = prob(i);
        if r < x {
            return Some(token);
        }
        r -= x;
    }
    keep.map(|k| cands[k - 1].0)
}

/// One sample's settings with its uniform draw: what a choice needs besides the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// Temperature (1 for greedy).
    pub temperature: f32,
    /// Top-k, 0 for all (1 for greedy).
    pub top_k: usize,
    /// Top-p (1 for all).
    pub top_p: f32,
    /// The uniform draw in `[0, 1)`.
    pub u: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised argmax against a compare per value, on rows of odd lengths (values
    /// left over past the lanes), with the maximum repeated (first one wins), at the
    /// start, the end and across a run boundary, and with NaN among the values.
    #[test]
    fn argmax_agrees_with_a_compare_per_value() {
        let naive = |l: &[f32]| {
            let mut best = None;
            for (i, &v) in l.iter().enumerate() {
                if !v.is_nan() && best.is_none_or(|b: usize| v > l[b]) {
                    best = Some(i);
                }
            }
            best.unwrap_or(0) as u32
        };
        let mut rng = StdRng::seed_from_u64(5);
        for len in [1, 15, 16, 17, 63, 64, 65, 1000, 49_152] {
            for case in 0..6 {
                let mut l: Vec<f32> = (0..len).map(|_| rng.random_range(-9.0f32..9.0)).collect();
                let top = 20.0;
                match case {
                    1 => l[0] = top,
                    2 => l[len - 1] = top,
                    3 if len > 70 => {
                        l[66] = top;
                        l[63] = top;
                    }
                    4 => {
                        l[len / 2] = f32::NAN;
                        l[len - 1] = top;
                    }
                    5 => l.iter_mut().step_by(3).for_each(|v| *v = top),
                    _ => {}
                }
                assert_eq!(argmax(&l), naive(&l), "len {len}, case {case}");
            }
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(
            Sampler::new(SamplingParams::greedy()).sample(&[1.0, 2.0, 0.5]),
            1
        );
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_limits_choices() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let params = SamplingParams {
            temperature: 1.5,
            top_k: 3,
            top_p: 1.0,
            seed: 42,
            ..SamplingParams::greedy()
        };
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..200).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = draw(&params);
        assert_eq!(a, draw(&params));
        // The three largest logits (value 1.8) sit at indices 6, 13, 20.
        assert!(a.iter().all(|t| [6, 13, 20].contains(t)));
        assert!([6, 13, 20].iter().all(|t| a.contains(t)));
        let other = draw(&SamplingParams { seed: 43, ..params });
        assert_ne!(a, other);
    }

    #[test]
    fn top_p_keeps_the_head_of_the_distribution() {
        let logits = [10.0, 9.0, 0.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 1,
            ..SamplingParams::greedy()
        });
        assert!((0..100).all(|_| s.sample(&logits) == 0));
    }

    /// The choice over a sorted head against a full sort of every row (the order and
    /// cuts written out plainly), on rows where the walk often passes the head (flat
    /// rows at high temperature) and where it ends early, under every cut.
    #[test]
    fn a_sorted_head_chooses_as_a_full_sort_does() {
        let full = |logits: &[f32], p: &SamplingParams, u: f32| {
            let mut cands = scaled(logits, p.temperature);
            cands.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            if p.top_k > 0 {
                cands.truncate(p.top_k);
            }
            let w: Vec<f64> = cands
                .iter()
                .map(|&(_, v)| f64::from(v - cands[0].1).exp())
                .collect();
            let kept = w.iter().take_while(|&&x| x >= f64::from(p.min_p)).count();
            let z: f64 = w[..kept].iter().sum();
            let mut keep = kept;
            let mut acc = 0.0;
            for (i, x) in w[..kept].iter().enumerate() {
                acc += x / z;
                if p.top_p < 1.0 && acc >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            let total: f64 = w[..keep].iter().map(|x| x / z).sum();
            let mut r = f64::from(u) * if p.top_p < 1.0 { total } else { 1.0 };
            for (i, x) in w[..keep].iter().enumerate() {
                if r < x / z {
                    return cands[i].0;
                }
                r -= x / z;
            }
            cands[keep - 1].0
        };
        let mut rng = StdRng::seed_from_u64(9);
        let (mut cases, mut differ) = (0, 0);
        for spread in [0.5f32, 4.0, 12.0] {
            let mut row: Vec<f32> = (0..5000).map(|_| rng.random_range(0.0..spread)).collect();
            row[77] = f32::NEG_INFINITY;
            for temperature in [0.6f32, 1.0, 1.8] {
                for top_k in [0, 7, 1500] {
                    for (top_p, min_p) in [(1.0, 0.0), (0.9, 0.0), (0.3, 0.0), (1.0, 0.05)] {
                        let p = SamplingParams {
                            temperature,
                            top_k,
                            top_p,
                            min_p,
                            ..SamplingParams::greedy()
                        };
                        let s = Sampler::new(p.clone());
                        for u in [0.0, 0.5, 0.999_99, rng.random(), rng.random()] {
                            cases += 1;
                            differ += usize::from(s.choose(&row, u) != full(&row, &p, u));
                        }
                    }
                }
            }
        }
        // Sums in another order may move a boundary by an ulp: a rare neighbour.
        assert!(differ * 200 <= cases, "{differ} of {cases} choices differ");
    }

    /// min-p drops tokens whose probability is under `min_p` times the top one's: with
    /// weights 1, 0.74, 0.37 and 0.05 of the top one's, `min_p = 0.5` keeps the first two.
    #[test]
    fn min_p_drops_the_unlikely_tail() {
        let logits = [2.0f32, 1.7, 1.0, -1.0];
        let draw = |min_p: f32| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.0,
                min_p,
                seed: 3,
                ..SamplingParams::greedy()
            });
            let mut seen = [0; 4];
            (0..2000).for_each(|_| seen[s.sample(&logits) as usize] += 1);
            seen
        };
        let kept = draw(0.5);
        assert!(
            kept[0] > 0 && kept[1] > 0 && kept[2] == 0 && kept[3] == 0,
            "{kept:?}"
        );
        let all = draw(0.0);
        assert!(all[2] > 0, "{all:?}");
    }
}
