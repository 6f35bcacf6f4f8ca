//! Where a prompt's prefill passes end, and which checkpoint points inside a pass are captured.
//!
//! The engine snapshots a prompt's state at its **checkpoint points**: multiples of the session
//! cache's `checkpoint_every` and of the on-disk state cache's interval, and message boundaries.
//! On a model whose routed experts stream from SSD every prefill pass reads roughly every
//! expert once, so a pass cut at each point would multiply the prompt's reads by the number of
//! points. Instead a pass runs to the end of its chunk (the memory plan's rows) or of the
//! prompt, and the state after each point inside it is **captured** during the pass
//! (`sluice_models::Model::forward_capturing`). A pass is still cut at a point when the state
//! cannot capture (a family without captures) or when more than
//! [`sluice_models::MAX_CAPTURES`] points fall inside it: each capture holds a copy of the
//! state's fixed part until the pass ends, so their number is bounded per pass.

use sluice_models::MAX_CAPTURES;

/// How one prefill pass runs: the rows it covers and the rows inside it captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PassPlan {
    /// The position the pass ends at (exclusive).
    pub end: usize,
    /// Rows of the pass (offsets from its start, ascending, each inside it) after which the
    /// state is captured.
    pub captures: Vec<usize>,
    /// Whether the pass ends at a checkpoint point before `limit` because the point could not
    /// be captured (the state cannot capture, or the pass holds [`MAX_CAPTURES`] already).
    pub cut: bool,
}

/// The checkpoint points of a prompt of `len` tokens after position `pos` and before `limit`:
/// multiples of `every` and of `disk_every` (0: none) and the `boundaries`, ascending, each
/// once.
pub(crate) fn points(
    pos: usize,
    limit: usize,
    every: usize,
    disk_every: usize,
    boundaries: &[usize],
) -> Vec<usize> {
    let mut out: Vec<usize> =
        boundaries.iter().copied().filter(|&b| b > pos && b < limit).collect();
    for e in [every, disk_every].into_iter().filter(|&e| e > 0) {
        let mut p = (pos / e + 1) * e;
        while p < limit {
            out.push(p);
            p += e;
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The pass from `pos` to at most `limit` given the checkpoint `points` inside it (ascending,
/// from [`points`]): captured when the state `can_capture`, at most [`MAX_CAPTURES`] of them,
/// the pass cut at the first point it cannot capture.
pub(crate) fn plan(pos: usize, limit: usize, points: &[usize], can_capture: bool) -> PassPlan {
    let take = if can_capture { MAX_CAPTURES } else { 0 };
    match points.get(take) {
        Some(&end) => {
            PassPlan { end, captures: points[..take].iter().map(|p| p - pos).collect(), cut: true }
        }
        None => {
            PassPlan { end: limit, captures: points.iter().map(|p| p - pos).collect(), cut: false }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_merge_intervals_and_boundaries_inside_the_pass() {
        assert_eq!(points(0, 20, 4, 6, &[5, 6, 19, 20, 30]), [4, 5, 6, 8, 12, 16, 18, 19]);
        assert_eq!(points(8, 13, 4, 0, &[8]), [12], "a point at the start is behind");
        assert_eq!(points(3, 8, 0, 0, &[]), Vec::<usize>::new());
    }

    #[test]
    fn a_capturing_state_runs_to_the_limit_with_up_to_max_captures() {
        let p = plan(10, 40, &[12, 20], true);
        assert_eq!(p, PassPlan { end: 40, captures: vec![2, 10], cut: false });
        let many: Vec<usize> = (1..=MAX_CAPTURES + 2).map(|i| 10 + 3 * i).collect();
        let p = plan(10, 40, &many, true);
        assert_eq!(p.end, many[MAX_CAPTURES]);
        assert_eq!(p.captures.len(), MAX_CAPTURES);
        assert!(p.cut);
    }

    #[test]
    fn a_state_that_cannot_capture_is_cut_at_the_first_point() {
        assert_eq!(plan(0, 9, &[4, 8], false), PassPlan { end: 4, captures: vec![], cut: true });
        assert_eq!(plan(0, 9, &[], false), PassPlan { end: 9, captures: vec![], cut: false });
    }
}
