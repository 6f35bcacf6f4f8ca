//! Output into a pipe whose reader has gone (`sluice inspect DIR | head -1`): the process ends
//! quietly on SIGPIPE, as Unix tools do, instead of panicking with "failed printing to stdout".
#![allow(clippy::unwrap_used, missing_docs)]

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a")
}

/// A pipe whose read end is already closed: every write to the returned end fails with EPIPE.
fn closed_pipe() -> std::fs::File {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe` writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] is the read end just created and owned by nobody else.
    unsafe { libc::close(fds[0]) };
    use std::os::fd::FromRawFd;
    // SAFETY: fds[1] is the write end just created; the File takes sole ownership.
    unsafe { std::fs::File::from_raw_fd(fds[1]) }
}

#[test]
fn inspect_and_verify_panicked_writing_into_a_closed_pipe() {
    let dir = fixture();
    for cmd in ["inspect", "verify"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([cmd, dir.to_str().unwrap()])
            .stdout(Stdio::from(closed_pipe()))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{cmd}: {err}");
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{cmd}: {:?} {err}", out.status);
    }
}
