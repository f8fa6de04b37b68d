//! Token sampling from logits: greedy, temperature, top-k and top-p, reproducible by seed.

use rand::{rngs::StdRng, Rng, SeedableRng};

mod device;
pub(crate) use device::select_rows;
pub use device::{
    argmax_rows, argmax_rows_async, pick_rows, pick_rows_async, pick_rows_masked, SamplingOps,
};

/// Sampling settings. `temperature == 0` means greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Seed of the random generator.
    pub seed: u64,
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
            seed: 0,
        }
    }
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

    /// The token `u` (this sample's [`Draw`]) picks from one row of logits.
    pub fn choose(&self, logits: &[f32], u: f32) -> u32 {
        if self.is_greedy() {
            return argmax(logits);
        }
        let p = &self.params;
        let mut cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| (i as u32, v / p.temperature))
            .collect();
        if cands.is_empty() {
            return argmax(logits);
        }
        cands.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            cands.truncate(p.top_k);
        }
        let max = cands[0].1;
        let mut probs: Vec<f32> = cands.iter().map(|&(_, v)| (v - max).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|&x| {
                    acc += x;
                    acc >= p.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let total: f32 = probs.iter().sum();
        let mut r = u * total;
        for (i, &x) in probs.iter().enumerate() {
            if r < x {
                return cands[i].0;
            }
            r -= x;
        }
        cands[probs.len() - 1].0
    }
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
        });
        assert!((0..100).all(|_| s.sample(&logits) == 0));
    }
}
