//! Log-probabilities of the model's distribution at a step (the log-softmax of the raw
//! logits, before penalties, masks and temperature): the chosen token's and the most
//! likely ones', as OpenAI's `logprobs` and `top_logprobs` report them.

/// The most alternatives a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generated token's log-probability and the step's most likely tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's log-probability.
    pub logprob: f32,
    /// The most likely tokens with theirs, most likely first (lower id first on ties).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// Those of `token` and the `top` most likely tokens in one row of raw logits.
    pub fn of(row: &[f32], token: u32, top: usize) -> Self {
        let lse = log_sum_exp(row);
        let at = |t: u32| row.get(t as usize).map_or(f32::NEG_INFINITY, |&l| l - lse);
        Self {
            logprob: at(token),
            top: top_tokens(row, top.min(MAX_TOP_LOGPROBS))
                .into_iter()
                .map(|t| (t, at(t)))
                .collect(),
        }
    }
}

/// `log(sum(exp(row)))`, accumulated in f64 around the maximum.
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
    (f64::from(max) + sum.ln()) as f32
}

/// The ids of the `n` largest finite values, largest first (lower id first on ties): one
/// pass that compares most values with the smallest kept only.
fn top_tokens(row: &[f32], n: usize) -> Vec<u32> {
    let mut kept: Vec<(f32, u32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return Vec::new();
    }
    for (i, &v) in row.iter().enumerate() {
        if !v.is_finite() || (kept.len() == n && v <= kept[n - 1].0) {
            continue;
        }
        let at = kept.partition_point(|&(k, _)| k >= v);
        kept.insert(at, (v, i as u32));
        kept.truncate(n);
    }
    kept.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a log-softmax computed in f64 value by value and a full sort.
    #[test]
    fn logprobs_are_the_log_softmax_and_top_tokens_the_largest() {
        let row: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1013) as f32 / 50.0 - 10.0)
            .collect();
        let lse = row.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
        let lp = TokenLogprobs::of(&row, 17, 5);
        assert!((f64::from(lp.logprob) - (f64::from(row[17]) - lse)).abs() < 1e-5);
        let mut order: Vec<u32> = (0..1000).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        let top: Vec<u32> = lp.top.iter().map(|&(t, _)| t).collect();
        assert_eq!(top, order[..5]);
        for (t, l) in lp.top {
            assert!((f64::from(l) - (f64::from(row[t as usize]) - lse)).abs() < 1e-5);
        }
        let masked = [f32::NEG_INFINITY, 1.0, 1.0];
        assert_eq!(TokenLogprobs::of(&masked, 0, 3).top.len(), 2);
        assert_eq!(
            TokenLogprobs::of(&masked, 2, 3).top[0].0,
            1,
            "ties: lower id"
        );
        assert!(TokenLogprobs::of(&row, 3, 0).top.is_empty());
    }
}
