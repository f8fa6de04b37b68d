//! Logit adjustments a request asks for before its token is chosen, as OpenAI and Hugging
//! Face define them: the repetition penalty over every token seen (prompt and output), the
//! presence and frequency penalties over the output, and a bias per token.

use std::collections::{HashMap, HashSet};

/// A request's penalties and biases (the default changes nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct Adjustments {
    /// Subtracted once from every token already generated (OpenAI's `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted per time a token was generated (OpenAI's `frequency_penalty`).
    pub frequency_penalty: f32,
    /// Divides positive and multiplies negative logits of every token seen, prompt
    /// included (1 = none).
    pub repetition_penalty: f32,
    /// Added to a token's logit; -100 bans the token outright (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for Adjustments {
    fn default() -> Self {
        Self {
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
        }
    }
}

/// The bias that bans a token.
pub const BAN: f32 = -100.0;

impl Adjustments {
    /// Whether it changes nothing.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// Whether it needs the prompt's tokens (the repetition penalty does).
    pub fn reads_prompt(&self) -> bool {
        self.repetition_penalty != 1.0
    }

    /// Adjusts one row of logits for a request that has seen `history`.
    pub fn apply(&self, row: &mut [f32], history: &History) {
        let r = self.repetition_penalty;
        if r != 1.0 {
            let seen = history.prompt.iter().chain(history.generated.keys());
            for &t in seen.collect::<HashSet<_>>() {
                if let Some(l) = row.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
        }
        if self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 {
            for (&t, &count) in &history.generated {
                if let Some(l) = row.get_mut(t as usize) {
                    *l -= self.presence_penalty + self.frequency_penalty * count as f32;
                }
            }
        }
        for &(t, bias) in &self.logit_bias {
            if let Some(l) = row.get_mut(t as usize) {
                *l = if bias <= BAN {
                    f32::NEG_INFINITY
                } else {
                    *l + bias
                };
            }
        }
    }
}

/// The tokens a request has seen, as its penalties read them.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// The prompt's distinct tokens (kept only for the repetition penalty).
    prompt: HashSet<u32>,
    /// How many times each token was generated.
    generated: HashMap<u32, u32>,
}

impl History {
    /// The history of a request with `prompt`, for `adjust`.
    pub fn new(prompt: &[u32], adjust: &Adjustments) -> Self {
        let prompt = match adjust.reads_prompt() {
            true => prompt.iter().copied().collect(),
            false => HashSet::new(),
        };
        Self {
            prompt,
            generated: HashMap::new(),
        }
    }

    /// Counts generated tokens.
    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            *self.generated.entry(t).or_default() += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenAI's formula on a constructed case: `logit - count * frequency - (count > 0) *
    /// presence + bias`; the repetition penalty divides positive and multiplies negative
    /// logits of tokens seen in the prompt or the output; -100 bans.
    #[test]
    fn penalties_and_bias_follow_the_documented_formulas() {
        let logits = [2.0f32, 1.0, -1.0, 0.5, 3.0];
        let mut history = History::new(
            &[2],
            &Adjustments {
                repetition_penalty: 2.0,
                ..Adjustments::default()
            },
        );
        history.extend(&[0, 0, 1]);
        let adjust = Adjustments {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            repetition_penalty: 1.0,
            logit_bias: vec![(3, 1.5), (4, BAN)],
        };
        let mut row = logits;
        adjust.apply(&mut row, &history);
        assert_eq!(row[0], 2.0 - 0.5 - 0.25 * 2.0);
        assert_eq!(row[1], 1.0 - 0.5 - 0.25);
        assert_eq!(row[2], -1.0, "presence and frequency read the output only");
        assert_eq!(row[3], 2.0);
        assert_eq!(row[4], f32::NEG_INFINITY);

        let repeat = Adjustments {
            repetition_penalty: 2.0,
            ..Adjustments::default()
        };
        let mut row = logits;
        repeat.apply(&mut row, &history);
        assert_eq!(row, [1.0, 0.5, -2.0, 0.5, 3.0]);
        assert!(Adjustments::default().is_none() && !repeat.is_none());
    }
}
