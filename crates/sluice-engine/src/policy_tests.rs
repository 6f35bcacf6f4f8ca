//! Tests of the width policy: [`best_width`] on synthetic costs, and whole decodes simulated
//! with passes costing `c0 + c1·k` seconds (no clock involved), compared with plain decoding and
//! fixed widths.

use super::*;

/// One simulated decode of `tokens` new tokens (after the prefill's first) under `p`; a draft
/// at output position `i` is right when `right(i)`. Returns the simulated seconds and passes.
fn simulate(
    p: &mut WidthPolicy,
    tokens: usize,
    c0: f64,
    c1: f64,
    right: impl Fn(usize) -> bool,
) -> (f64, usize) {
    let (mut emitted, mut secs, mut passes) = (0, 0.0, 0);
    while emitted < tokens {
        let k = p.width().min(tokens - emitted);
        let accepted = (0..k).take_while(|&i| right(emitted + i)).count();
        // Generation stops after `tokens`: a draft past the end is never verified.
        let emit = (accepted + 1).min(tokens - emitted);
        let rejected = accepted < k && emit == accepted + 1;
        #[allow(clippy::cast_precision_loss)]
        let t = c0 + c1 * k as f64;
        p.record(k + 1, t, accepted.min(emit), rejected);
        emitted += emit;
        secs += t;
        passes += 1;
    }
    (secs, passes)
}

/// The K3-slice costs measured before this policy (docs/PERFORMANCE.md, issue 5): a one-row
/// pass of 2.9 s, and 0.75 s per extra row when drafts are right (1.2 s when they are wrong:
/// wrong rows route to experts no other row needs).
const C0: f64 = 2.9;

#[test]
fn best_width_on_synthetic_costs() {
    // Right drafts and rows at a tenth of a pass: verify all 8.
    assert_eq!(best_width(0.95, 1.0, 0.1, 0.0, 8).0, 8);
    // Never accepted: no drafts, whatever rows cost.
    assert_eq!(best_width(0.0, 1.0, 0.0001, 0.0, 8), (0, 1.0));
    // Rows as expensive as a whole pass: even 90% acceptance loses (1.9 tokens for 2 passes).
    assert_eq!(best_width(0.9, 1.0, 1.0, 0.0, 8).0, 0);
    // A tie (every width emits exactly as many tokens per second) takes no drafts.
    assert_eq!(best_width(1.0, 1.0, 1.0, 0.0, 8).0, 0);
    // Half accepted, rows at 0.1: rates 1, 1.364, 1.458, 1.442 — two drafts.
    let (k, speedup) = best_width(0.5, 1.0, 0.1, 0.0, 8);
    assert_eq!(k, 2);
    assert!((speedup - 1.75 / 1.2).abs() < 1e-12, "{speedup}");
    // The same with a drafter costing 0.2 s per token: one draft (1.5 / 1.3 beats 1.75 / 1.6);
    // at 0.6 s per token none (1.5 / 1.7 < 1).
    assert_eq!(best_width(0.5, 1.0, 0.1, 0.2, 8).0, 1);
    assert_eq!(best_width(0.5, 1.0, 0.1, 0.6, 8).0, 0);
    assert!((expected_tokens(0.5, 3) - 1.875).abs() < 1e-12);
}

#[test]
fn a_first_wide_pass_no_longer_makes_rows_look_as_expensive_as_a_pass() {
    // The bug: the first pass ran at full width and its time was split evenly between c0 and
    // c1, a tie at 100% acceptance, and the tie chose no drafts.
    let mut p = WidthPolicy::new(4);
    assert_eq!(p.width(), 0, "first a one-row pass measures c0");
    p.record(1, 1.0, 0, false);
    assert_eq!(p.width(), 4, "then a full-width pass measures c1");
    p.record(5, 1.5, 4, false);
    assert_eq!(p.c1, Some(0.125));
    assert_eq!(p.width(), 4, "all accepted, rows at an eighth of a pass: stay wide");
    assert_eq!(p.measuring_passes, 2);
    assert!((p.expected_speedup - 5.0 / 1.5).abs() < 1e-9, "{}", p.expected_speedup);
}

#[test]
fn full_acceptance_with_cheap_rows_runs_about_as_fast_as_fixed_width() {
    let c1 = 0.75;
    let right = |_| true;
    let (plain, plain_passes) = simulate(&mut WidthPolicy::new(0), 11, C0, c1, right);
    let (fixed, _) = simulate(&mut WidthPolicy::fixed(4), 11, C0, c1, right);
    let mut p = WidthPolicy::new(4);
    let (policy, passes) = simulate(&mut p, 11, C0, c1, right);
    assert_eq!(plain_passes, 11);
    assert_eq!(p.histogram, vec![1, 0, 0, 0, 2], "one measuring one-row pass, then full width");
    assert_eq!(passes, 3);
    assert!(policy <= fixed * 1.05, "policy {policy} s, fixed width {fixed} s");
    assert!(plain / policy > 2.0, "plain {plain} s, policy {policy} s");
    // Longer decodes stay at full width (nothing narrower was ever better, so no exploring).
    let mut q = WidthPolicy::new(4);
    simulate(&mut q, 200, C0, c1, right);
    assert_eq!(q.histogram[1..4].iter().sum::<usize>(), 0, "{:?}", q.histogram);
    assert_eq!(q.exploring_passes, 0);
}

#[test]
fn zero_acceptance_pays_only_the_measuring_and_exploring_passes() {
    let c1 = 1.2;
    let wrong = |_| false;
    let (plain, _) = simulate(&mut WidthPolicy::new(0), 40, C0, c1, wrong);
    let (fixed, _) = simulate(&mut WidthPolicy::fixed(4), 40, C0, c1, wrong);
    let mut p = WidthPolicy::new(4);
    let (policy, passes) = simulate(&mut p, 40, C0, c1, wrong);
    assert_eq!(passes, 40, "every pass emits one token");
    // Passes 2 (measuring), 19 and 36 (exploring after 16 narrower passes) run at full width.
    assert_eq!(p.histogram, vec![37, 0, 0, 0, 3]);
    assert_eq!(p.exploring_passes, 2);
    assert_eq!(p.alpha, 0.0);
    assert!((policy - (plain + 3.0 * 4.0 * c1)).abs() < 1e-9, "policy {policy}, plain {plain}");
    assert!(fixed / policy > 2.0, "fixed width {fixed} s, policy {policy} s");
}

#[test]
fn rows_dearer_than_a_pass_stop_speculation_even_when_drafts_are_right() {
    let mut p = WidthPolicy::new(4);
    simulate(&mut p, 30, C0, 3.0, |_| true);
    assert_eq!(p.alpha, 1.0);
    assert_eq!(p.last_width, 0, "5 tokens for 14.9 s lose to 1 for 2.9 s");
    assert_eq!(p.histogram[1..4].iter().sum::<usize>(), 0, "{:?}", p.histogram);
}

#[test]
fn a_drafter_that_starts_matching_is_noticed_by_exploring() {
    let mut p = WidthPolicy::new(4);
    // Wrong for the first 20 output positions, right after.
    simulate(&mut p, 120, C0, 0.75, |i| i >= 20);
    assert!(p.exploring_passes >= 1);
    assert_eq!(p.last_width, 4, "{p}");
    assert!(p.histogram[4] >= 10, "{:?}", p.histogram);
}

#[test]
fn acceptance_counts_only_verified_drafts() {
    let mut p = WidthPolicy::new(4);
    p.record(1, 1.0, 0, false);
    p.record(5, 1.4, 2, false);
    assert_eq!(p.alpha, 1.0, "generation stopped after two accepted drafts: no failure seen");
    p.record(5, 1.4, 2, true);
    // (0.7·2 + 2) / (0.7·2 + 3)
    assert!((p.alpha - 3.4 / 4.4).abs() < 1e-12, "{}", p.alpha);
}

#[test]
fn an_expensive_drafter_narrows_what_cheap_rows_would_allow() {
    let mut p = WidthPolicy::new(8);
    p.record(1, 1.0, 0, false);
    for _ in 0..20 {
        p.record(9, 1.8, 4, true);
    }
    let free = p.clone().width();
    assert!(free > 0, "drafts accepted 4 of 5 trials with rows at 0.1 s pay");
    for _ in 0..20 {
        p.record_draft(8, 8.0);
    }
    assert_eq!(p.width(), 0, "a second of drafting per token never pays");
    let mut f = WidthPolicy::fixed(5);
    f.record(6, 9.0, 0, true);
    assert_eq!(f.width(), 5);
    assert!(f.to_string().starts_with("fixed width 5"), "{f}");
}

#[test]
fn the_stats_line_names_the_decision_and_its_inputs() {
    let mut p = WidthPolicy::new(4);
    simulate(&mut p, 11, C0, 0.75, |_| true);
    let s = p.to_string();
    assert!(s.contains("next width 4"), "{s}");
    assert!(s.contains("acceptance 1.000"), "{s}");
    assert!(s.contains("one-row pass 2.9000s"), "{s}");
    assert!(s.contains("per extra row 0.7500s"), "{s}");
    assert!(s.contains("drafting unmeasured"), "{s}");
    assert!(s.contains("2 measuring and 0 exploring passes"), "{s}");
}
