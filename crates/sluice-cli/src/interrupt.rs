//! Ctrl-C and SIGTERM for `sluice run`.
//!
//! [`install`] runs first thing; until [`arm`] is called (just before generation) a signal ends
//! the process at once, as it would without a handler, with the conventional status. Once armed,
//! the first signal raises the flag that generation polls at every pass boundary, so the run
//! stops after the current pass and still prints what it has and its statistics; a second
//! signal ends the process at once.
//!
//! The handler only touches atomics and calls `_exit`, both async-signal-safe.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Whether generation is running and polls [`STOP`].
static ARMED: AtomicBool = AtomicBool::new(false);
/// Raised by the first SIGINT or SIGTERM once armed.
static STOP: AtomicBool = AtomicBool::new(false);
/// The first signal received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    let first = SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_ok();
    if !first || !ARMED.load(Ordering::SeqCst) {
        // SAFETY: `_exit` is async-signal-safe; nothing else needs to run.
        unsafe { libc::_exit(exit_code(sig)) };
    }
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM (unarmed: a signal still ends the process).
pub fn install() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed `sigaction` is a valid value (no flags, empty mask) that is then
        // filled in; without SA_SIGINFO, `sa_sigaction` holds an `extern "C" fn(c_int)`, which
        // `on_signal` is, and it only touches atomics and `_exit`.
        let rc = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&raw mut act.sa_mask);
            libc::sigaction(sig, &raw const act, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Lets a write to a closed pipe end the process quietly, as it ends `cat` or `grep`.
///
/// The Rust runtime ignores SIGPIPE, so `println!` into `sluice inspect … | head -1` panicked
/// with "failed printing to stdout". Every command but `serve` and `run` restores the default
/// action; the server keeps it ignored, so a client that hangs up costs one failed write, not
/// the process, and `run` turns the failed write into a stop that still prints its statistics.
pub fn default_sigpipe() {
    // SAFETY: `signal` with `SIG_DFL` installs no handler code; it only resets the disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// From now on the first signal only raises the returned flag (generation polls it).
pub fn arm() -> &'static AtomicBool {
    ARMED.store(true, Ordering::SeqCst);
    &STOP
}

/// The signal that stopped the run, if one did.
pub fn received() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The signal's name, for messages.
pub fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// The conventional exit status after `sig`: 128 + its number (130 for SIGINT, 143 for
/// SIGTERM).
pub fn exit_code(sig: i32) -> i32 {
    128 + sig
}
