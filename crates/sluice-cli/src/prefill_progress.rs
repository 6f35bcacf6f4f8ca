//! Prefill progress for `sluice run`, always on stderr (stdout carries only the generated text,
//! or the one `--json` object): a progress bar with an ETA when stderr is a terminal, otherwise
//! a plain line every few seconds and at the end of a prefill of more than one pass, e.g.
//! `sluice: prefill 512/2000 positions, 1.20 GiB of experts read, ETA 40 s`.

use crate::inspect::human;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sluice_engine::progress::LineThrottle;
use sluice_engine::{PrefillHook, PrefillProgress};
use std::io::IsTerminal;
use std::sync::{Mutex, PoisonError};

/// Seconds between plain progress lines.
const LINE_EVERY_S: f64 = 3.0;

/// The hook `run` passes to the engine.
pub fn hook() -> PrefillHook {
    if std::io::stderr().is_terminal() {
        bar()
    } else {
        lines()
    }
}

/// A bar on the terminal, cleared when the prefill ends (the generated text follows it).
fn bar() -> PrefillHook {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("prefill [{bar:30}] {pos}/{len} positions, {msg}, ETA {eta}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    PrefillHook::new(move |p: &PrefillProgress| {
        // The message first: each setter may redraw, and the first frame should be whole.
        bar.set_message(format!("{} of experts read", human(p.expert_bytes_read)));
        bar.set_length(n(p.total));
        bar.set_position(n(p.done));
        if p.done >= p.total {
            bar.finish_and_clear();
        }
    })
}

/// Plain lines, for a log file or a pipe.
fn lines() -> PrefillHook {
    let throttle = Mutex::new(LineThrottle::new(LINE_EVERY_S));
    PrefillHook::new(move |p: &PrefillProgress| {
        if throttle.lock().unwrap_or_else(PoisonError::into_inner).due(p) {
            eprintln!("sluice: {}", line(p));
        }
    })
}

/// `prefill 512/2000 positions, 1.20 GiB of experts read, ETA 40 s`.
fn line(p: &PrefillProgress) -> String {
    let eta = match p.eta_s(0) {
        Some(s) if p.done < p.total => format!(", ETA {s:.0} s"),
        _ => format!(", {:.1} s", p.elapsed_s),
    };
    format!(
        "prefill {}/{} positions, {} of experts read{eta}",
        p.done,
        p.total,
        human(p.expert_bytes_read)
    )
}

fn n(x: usize) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_shows_eta_while_running_and_time_at_the_end() {
        let mut p =
            PrefillProgress { done: 500, total: 2000, expert_bytes_read: 3 << 30, elapsed_s: 10.0 };
        assert_eq!(line(&p), "prefill 500/2000 positions, 3.00 GiB of experts read, ETA 30 s");
        p.done = 2000;
        assert_eq!(line(&p), "prefill 2000/2000 positions, 3.00 GiB of experts read, 10.0 s");
    }
}
