//! The user docs list every flag of every command exactly once, and no flag the binary lacks:
//! `docs/CLI.md` holds a section per command (`## \`sluice CMD …\``, with its `###`
//! subsections) and `docs/SERVER.md` holds `serve`'s. A flag is documented by a table row whose
//! first cell names it (`| \`--memory SIZE\` | … |`, or several: `` | `--host`, `--port` | ``).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "sluice {args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands `sluice --help` lists.
fn commands() -> Vec<String> {
    let h = help(&[]);
    let mut in_cmds = false;
    let mut cmds = Vec::new();
    for line in h.lines() {
        if line.starts_with("Commands:") {
            in_cmds = true;
            continue;
        }
        if in_cmds {
            if !line.starts_with("  ") {
                break;
            }
            let name = line.split_whitespace().next().unwrap();
            if name != "help" {
                cmds.push(name.to_string());
            }
        }
    }
    assert!(cmds.len() >= 10, "too few commands parsed from `sluice --help`: {cmds:?}");
    cmds
}

/// The long flags one command's `--help` lists (without `--help` and `--version`).
fn flags_of(cmd: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for line in help(&[cmd]).lines() {
        let t = line.trim_start();
        let t = t
            .strip_prefix("-")
            .filter(|r| r.chars().nth(1) == Some(','))
            .map_or(t, |r| r[2..].trim_start());
        if let Some(rest) = t.strip_prefix("--") {
            let name: String =
                rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            if name != "help" && name != "version" && !name.is_empty() {
                flags.insert(format!("--{name}"));
            }
        }
    }
    flags
}

/// The flags named in the first cell of the table rows of `text`, with how often each appears.
/// Every word of a code span in that cell that starts with `--` names a flag.
fn documented(text: &str) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for line in text.lines() {
        let Some(row) = line.strip_prefix('|') else { continue };
        let first = row.split(" |").next().unwrap_or("");
        for span in first.split('`').skip(1).step_by(2) {
            for word in span.split_whitespace().filter(|w| w.starts_with("--")) {
                let name: String = word[2..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                *seen.entry(format!("--{name}")).or_insert(0) += 1;
            }
        }
    }
    seen
}

fn doc(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The part of CLI.md about one command: from its `## \`sluice CMD` heading to the next `## `.
fn cli_section(cli: &str, cmd: &str) -> Option<String> {
    let head = format!("## `sluice {cmd}");
    let start = cli.lines().position(|l| {
        l.starts_with(&head) && {
            let after = &l[head.len()..];
            after.starts_with('`') || after.starts_with(' ')
        }
    })?;
    let lines: Vec<&str> = cli.lines().collect();
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |e| start + 1 + e);
    Some(lines[start..end].join("\n"))
}

#[test]
fn docs_listed_some_flags_twice_and_missed_others() {
    let cli = doc("CLI.md");
    let server = doc("SERVER.md");
    let mut problems = Vec::new();
    for cmd in commands() {
        let section = if cmd == "serve" { Some(server.clone()) } else { cli_section(&cli, &cmd) };
        let Some(section) = section else {
            problems.push(format!("docs/CLI.md has no `## \\`sluice {cmd} …\\`` section"));
            continue;
        };
        let file = if cmd == "serve" { "SERVER.md" } else { "CLI.md" };
        let want = flags_of(&cmd);
        let have = documented(&section);
        for f in &want {
            match have.get(f) {
                None => problems.push(format!("{file}: `sluice {cmd}` flag {f} is not documented")),
                Some(&n) if n > 1 => {
                    problems
                        .push(format!("{file}: `sluice {cmd}` flag {f} is documented {n} times"));
                }
                Some(_) => {}
            }
        }
        for f in have.keys() {
            if !want.contains(f) {
                problems
                    .push(format!("{file}: `sluice {cmd}` documents {f}, which it does not take"));
            }
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}
