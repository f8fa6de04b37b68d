//! Proposers, the acceptance rule and the per-request switch.

use super::*;
use crate::model::ModelConfig;
use crate::sampling::{Sampler, SamplingParams};

#[test]
fn ngram_drafts_what_followed_the_latest_match() {
    let p = NgramProposer::default();
    // "1, 2, 3, 1, 2" -> the trigram is unseen; "1, 2" last occurred at 0, then "3": a
    // match of n tokens drafts at most n - 2 (at least one).
    assert_eq!(p.lookup(&[1, 2, 3, 1, 2], 4), vec![3]);
    assert_eq!(p.lookup(&[1, 2, 3, 1, 2], 1), vec![3]);
    // The longest n-gram wins: "7 8 9" matches at 4, not "8 9" at 0.
    assert_eq!(p.lookup(&[8, 9, 5, 5, 7, 8, 9, 6, 7, 8, 9], 2), vec![6]);
    // A match of five drafts three, of six four (up to `max`).
    let five = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5];
    assert_eq!(p.lookup(&five, 4), vec![6, 7, 8]);
    let six = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6];
    assert_eq!(p.lookup(&six, 4), vec![7, 8, 9, 0]);
    assert_eq!(p.lookup(&six, 3), vec![7, 8, 9]);
    // Up to five tokens back: "1 2 3 4 5" at 0 (then 9), not the later "3 4 5" (then 7).
    let tokens = [1, 2, 3, 4, 5, 9, 3, 4, 5, 7, 1, 2, 3, 4, 5];
    assert_eq!(p.lookup(&tokens, 1), vec![9]);
    // A match one token shorter but more recent wins: in " 16, 17, 26, " (space 7,
    // comma 8) "6, " last occurred in "16, " (then "1"), ", " in "17, " (then "2").
    assert_eq!(
        p.lookup(&[7, 1, 6, 8, 7, 1, 7, 8, 7, 2, 6, 8, 7], 3),
        vec![2]
    );
    // Two shorter loses: "1 2 3" (then 4) against the later "3" (then 9).
    assert_eq!(p.lookup(&[1, 2, 3, 4, 3, 9, 1, 2, 3], 1), vec![4]);
    // A single token drafts one; nothing is invented.
    assert_eq!(p.lookup(&[4, 5, 6, 4], 4), vec![5]);
    assert!(p.lookup(&[4, 5, 6], 4).is_empty());
    assert!(p.lookup(&[1], 4).is_empty());
}

#[test]
fn verification_keeps_the_agreeing_prefix_and_the_models_next_token() {
    assert_eq!(
        verify(&[5, 6, 7], &[5, 6, 9, 1]),
        Verdict {
            tokens: vec![5, 6, 9],
            accepted: 2
        }
    );
    assert_eq!(
        verify(&[5, 6], &[5, 6, 8]),
        Verdict {
            tokens: vec![5, 6, 8],
            accepted: 2
        }
    );
    assert_eq!(
        verify(&[5], &[4, 5]),
        Verdict {
            tokens: vec![4],
            accepted: 0
        }
    );
    assert_eq!(verify(&[], &[3]).tokens, vec![3]);
}

fn softmax(logits: &[f32]) -> Vec<f64> {
    let e: Vec<f64> = logits.iter().map(|&x| f64::from(x).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

/// Pearson's statistic of `counts` against `probs`.
fn chi_square(counts: &[u64], probs: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            let e = n as f64 * p;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// Sampling through a draft keeps the model's distribution: over a 4-token vocabulary
/// with fixed logits per position, the first emitted token follows softmax(row 0)
/// whatever was drafted, and the second (after an accepted draft) softmax(row 1).
/// Chi-square with 3 degrees of freedom at significance 0.001 (critical value 16.27).
#[test]
fn sampled_verification_keeps_the_distribution() {
    const CRITICAL: f64 = 16.27;
    let rows = [[1.0f32, 0.5, 0.0, -0.5], [0.0, 1.0, 0.2, 0.3]];
    let trials = 20_000u64;
    for draft in [0u32, 1, 3] {
        let mut first = [0u64; 4];
        let mut second = [0u64; 4];
        for seed in 0..trials {
            let sampler = Sampler::new(SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: seed * 7919 + u64::from(draft),
                ..SamplingParams::greedy()
            });
            let picks: Vec<u32> = sampler_chain(&sampler, 2)
                .iter_mut()
                .zip(&rows)
                .map(|(s, row)| s.sample(row))
                .collect();
            let v = verify(&[draft], &picks);
            first[v.tokens[0] as usize] += 1;
            if v.accepted == 1 {
                second[v.tokens[1] as usize] += 1;
            }
        }
        let x1 = chi_square(&first, &softmax(&rows[0]));
        let x2 = chi_square(&second, &softmax(&rows[1]));
        assert!(x1 < CRITICAL, "draft {draft}: first token chi2 {x1}");
        assert!(x2 < CRITICAL, "draft {draft}: second token chi2 {x2}");
        // The draft is accepted as often as the model would pick it.
        let rate = second.iter().sum::<u64>() as f64 / trials as f64;
        let p = softmax(&rows[0])[draft as usize];
        assert!((rate - p).abs() < 4.0 * (p * (1.0 - p) / trials as f64).sqrt());
    }
}

/// With a fixed seed, the tokens a verification emits are the tokens plain sampling
/// draws, and the request's generator ends where plain sampling leaves it.
#[test]
fn seeded_verification_draws_what_plain_sampling_draws() {
    let rows: Vec<Vec<f32>> = (0..6)
        .map(|j| {
            (0..50)
                .map(|i| ((i * 7 + j * 3) % 11) as f32 * 0.4)
                .collect()
        })
        .collect();
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        seed: 11,
        ..SamplingParams::greedy()
    };
    let mut plain = Sampler::new(params.clone());
    let expected: Vec<u32> = rows.iter().map(|r| plain.sample(r)).collect();
    let mut spec = Sampler::new(params);
    let mut emitted = Vec::new();
    let mut at = 0;
    while at < rows.len() {
        // Draft the true continuation for two tokens, then one wrong token.
        let mut draft: Vec<u32> = expected[at..].iter().take(2).copied().collect();
        draft.push(u32::MAX);
        draft.truncate(rows.len() - at - 1);
        let picks: Vec<u32> = sampler_chain(&spec, draft.len() + 1)
            .iter_mut()
            .zip(&rows[at..])
            .map(|(s, r)| s.sample(r))
            .collect();
        let v = verify(&draft, &picks);
        for _ in 0..v.tokens.len() {
            spec.draw();
        }
        at += v.tokens.len();
        emitted.extend(v.tokens);
    }
    assert_eq!(emitted, expected);
    assert_eq!(spec.draw(), plain.draw());
}

#[test]
fn low_acceptance_pauses_drafting_for_longer_each_time() {
    let mut a = Acceptance::default();
    assert!(a.wants_draft());
    let mut pauses = Vec::new();
    for _ in 0..3 {
        while a.wants_draft() {
            a.record(4, 0, 1);
        }
        let mut steps = 1;
        while !a.wants_draft() {
            steps += 1;
        }
        pauses.push(steps);
    }
    assert_eq!(pauses, vec![8, 16, 32]);
    // Good drafts keep it on.
    let mut b = Acceptance::default();
    for _ in 0..100 {
        assert!(b.wants_draft());
        b.record(4, 3, 1);
    }
}

/// Of `steps` steps in batches of `batch` sequences, those `a` pauses when every draft
/// of two tokens keeps one.
fn steps_paused_at_half(mut a: Acceptance, batch: usize, steps: usize) -> usize {
    (0..steps)
        .filter(|_| {
            let draft = a.wants_draft();
            if draft {
                a.record(2, 1, batch);
            }
            !draft
        })
        .count()
}

#[test]
fn a_costlier_proposer_pauses_sooner_and_for_longer() {
    // (drafts rejected before each pause, steps of the pause) for a proposer whose drafts
    // cost nothing, and for the self-draft of 8 of SmolLM2-135M's 30 layers (0.42 of a step).
    let pauses = |cost: f32| {
        let mut a = Acceptance::new(cost);
        let mut runs = Vec::new();
        for _ in 0..3 {
            let mut drafts = 0;
            while a.wants_draft() {
                a.record(1, 0, 1);
                drafts += 1;
            }
            let mut steps = 1;
            while !a.wants_draft() {
                steps += 1;
            }
            runs.push((drafts, steps));
            a.record(1, 0, 1);
        }
        runs
    };
    assert_eq!(pauses(0.0), vec![(2, 8), (1, 16), (1, 32)]);
    assert_eq!(pauses(0.42), vec![(1, 15), (0, 30), (0, 60)]);
    // Half of the drafted tokens kept pays for a cheap proposer, not for one that costs
    // as much as 0.42 of a step per token.
    assert_eq!(steps_paused_at_half(Acceptance::new(0.0), 1, 20), 0);
    assert!(steps_paused_at_half(Acceptance::new(0.42), 1, 20) > 0);
}

#[test]
fn a_drafted_row_costs_more_of_a_bigger_batch() {
    use super::acceptance::row_cost;
    assert!((row_cost(1) - 0.15).abs() < 1e-6);
    assert!((1..64).all(|b| row_cost(b) < row_cost(b + 1) && row_cost(b + 1) < 1.0));
    // Half of the drafted tokens kept: worth it alone, not in a step of 8 sequences.
    assert_eq!(steps_paused_at_half(Acceptance::default(), 1, 40), 0);
    assert!(steps_paused_at_half(Acceptance::default(), 8, 40) > 0);
}

#[test]
fn the_self_draft_costs_its_share_of_the_weights() {
    let config = ModelConfig::new(49152, 576, 30, 9, 3, 1536, 8192);
    type B = crate::CpuBackend;
    let cost = |layers| <SelfDraft as Proposer<B>>::draft_cost(&SelfDraft { layers }, &config);
    // A layer multiplies by 3.54 M weights, the output layer by 28.3 M (8 layers' worth).
    assert!((cost(8) - 16.0 / 38.0).abs() < 0.01, "{}", cost(8));
    assert!((cost(30) - 1.0).abs() < 1e-6);
    assert!(cost(0) > 0.2 && cost(0) < cost(1));
    let ngram = NgramProposer::default();
    assert_eq!(
        <NgramProposer as Proposer<B>>::draft_cost(&ngram, &config),
        0.0
    );
}

#[test]
fn proposer_names_parse() {
    assert_eq!("ngram".parse::<ProposerKind>(), Ok(ProposerKind::Ngram));
    assert_eq!("draft".parse::<ProposerKind>(), Ok(ProposerKind::SelfDraft));
    assert!("medusa".parse::<ProposerKind>().is_err());
}

#[test]
fn a_rejection_shortens_the_next_draft_until_one_is_kept_whole() {
    let mut a = Acceptance::default();
    assert_eq!(a.draft_len(3), 1, "a request's first draft is one token");
    a.record(1, 1, 1);
    assert_eq!(a.draft_len(3), 3, "a draft kept whole allows the limit");
    a.record(3, 1, 1);
    assert_eq!(
        a.draft_len(3),
        2,
        "one more than the last verification kept"
    );
    a.record(2, 2, 1);
    assert_eq!(a.draft_len(3), 3, "a draft kept whole restores the limit");
    a.record(3, 0, 1);
    assert_eq!(a.draft_len(3), 1);
}
