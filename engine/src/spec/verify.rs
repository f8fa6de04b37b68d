//! Accepting drafted tokens.

use crate::sampling::Sampler;

/// What a verified draft gives: the tokens to emit (the accepted drafted tokens, then the
/// model's own at the first disagreement or after the last drafted token) and how many
/// drafted tokens were accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub tokens: Vec<u32>,
    pub accepted: usize,
}

/// Verifies `draft` against `picks`, where `picks[j]` (for `j` in `0..=draft.len()`) is
/// the token the request's sampler chose from the logits that follow `draft[..j]`, each
/// with the next draw of its generator ([`sampler_chain`]).
///
/// For a deterministic proposal (all of ours) this is the rejection rule of speculative
/// sampling: the drafted token `d` is accepted with probability `p(d)` (the pick equals
/// it), and on rejection the emitted token follows `p` without `d`, renormalised (the pick
/// given that it is not `d`). With greedy settings the picks are the argmaxes, so the
/// output is plain greedy decoding's.
pub fn verify(draft: &[u32], picks: &[u32]) -> Verdict {
    assert_eq!(
        picks.len(),
        draft.len() + 1,
        "a pick per drafted position plus one"
    );
    let accepted = draft.iter().zip(picks).take_while(|(d, p)| d == p).count();
    Verdict {
        tokens: picks[..=accepted].to_vec(),
        accepted,
    }
}

/// `n` copies of `sampler`, the `j`-th advanced by `j` draws: the samplers of `n`
/// consecutive positions. After verification the request's own sampler is advanced by the
/// tokens emitted, so its generator is where plain decoding would have left it.
pub fn sampler_chain(sampler: &Sampler, n: usize) -> Vec<Sampler> {
    let mut next = sampler.clone();
    (0..n)
        .map(|_| {
            let this = next.clone();
            next.draw();
            this
        })
        .collect()
}
