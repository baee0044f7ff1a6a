//! What a new user meets first, through the real binary (issue 40): the help screen (every flag
//! with a closed set of values shows them, `{off,on,auto}`; every exit status `src/exit.rs` names
//! is listed; the sections in order; lines that fit the terminal, `COLUMNS`), `-V` (the version
//! and the git revision the binary was built from), and the README's first demo job.

use std::process::Command;

use rdrun::cli::{flag_table, FlagValue, Section};

use crate::util::*;

fn help(columns: &str) -> String {
    let out = Rdrun::new().env("COLUMNS", columns).arg("--help").run();
    out.assert_code(0);
    assert_eq!(out.stderr, "", "{out:?}");
    out.stdout
}

/// The exit statuses `src/exit.rs` defines, read from its source: every `pub const NAME: i32 =
/// N;`, every literal arm of `Exit::code` (`=> 0,`), and `128+N` for `128 + signal`.
fn exit_rs_codes() -> Vec<String> {
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/exit.rs")).unwrap();
    let mut codes = Vec::new();
    for line in src.lines().map(str::trim) {
        let literal = line
            .strip_prefix("pub const ")
            .and_then(|l| l.split_once(": i32 = "))
            .map(|(_, v)| v.trim_end_matches(';'))
            .or_else(|| {
                line.split_once(" => ")
                    .map(|(_, v)| v.trim_end_matches(','))
            });
        if let Some(v) = literal.filter(|v| v.parse::<i32>().is_ok()) {
            codes.push(v.to_string());
        }
        if line.contains("128 + signal") {
            codes.push("128+N".to_string());
        }
    }
    codes.sort();
    codes.dedup();
    codes
}

#[test]
fn every_enum_flag_shows_its_values_and_every_exit_code_is_listed() {
    let h = help("100");
    let mut enums = 0;
    for f in flag_table() {
        let shown = match f.value {
            FlagValue::Choice(c) => format!(" {{{}}}", c.join(",")),
            FlagValue::OptionalChoice(c) => format!("[={{{}}}]", c.join(",")),
            _ => continue,
        };
        enums += 1;
        let line = format!("  {}{shown}", f.names.join(", "));
        assert!(h.contains(&format!("\n{line}\n")), "{line:?} missing:\n{h}");
    }
    // --start-method, --numa-binding, --rdzv-backend, --warm-start, --hang-detect, ...
    assert!(enums >= 12, "{enums}");
    assert!(
        h.contains("--warm-start, --warm_start {off,on,auto}\n"),
        "{h}"
    );

    let codes = exit_rs_codes();
    for want in ["0", "1", "2", "75", "93", "128+N"] {
        assert!(
            codes.iter().any(|c| c == want),
            "{want} not read from exit.rs: {codes:?}"
        );
    }
    let status = &h[h.find("\nexit status:\n").expect("exit status section")..];
    for code in &codes {
        assert!(
            status.contains(&format!("\n  {code} ")),
            "exit {code} missing:\n{status}"
        );
    }
}

#[test]
fn sections_in_order_and_lines_fit_the_terminal() {
    let h = help("60");
    let mut last = 0;
    for s in Section::ALL {
        let at = h
            .find(&format!("\n{}", s.title()))
            .unwrap_or_else(|| panic!("{}:\n{h}", s.title()));
        assert!(at > last, "{} out of order:\n{h}", s.title());
        last = at;
    }
    // torchrun's flags before rdrun's own.
    assert!(h.find("  --virtual-local-rank").unwrap() < h.find("\nrdrun: cluster").unwrap());
    assert!(h.find("  --hang-timeout").unwrap() > h.find("\nrdrun: hangs").unwrap());
    for line in h.lines() {
        let unbreakable = line.trim_start().starts_with('[') || !line.trim().contains(' ');
        assert!(line.chars().count() <= 58 || unbreakable, "{line:?}");
    }
    assert!(!h.contains("needs the `etcd` build feature"), "{h}");
}

#[test]
fn version_names_the_revision() {
    for flag in ["--version", "-V"] {
        let out = Rdrun::new().arg(flag).run();
        out.assert_code(0);
        let want = format!("rdrun {} (git ", env!("CARGO_PKG_VERSION"));
        let rev = out
            .stdout
            .strip_prefix(&want)
            .and_then(|r| r.strip_suffix(")\n"))
            .unwrap_or_else(|| panic!("{out:?}"));
        if rev == "unknown" {
            continue;
        }
        assert!(
            rev.len() >= 7 && rev.chars().all(|c| c.is_ascii_hexdigit()),
            "{out:?}"
        );
        // The revision is a commit of this repository (HEAD may have moved since the build).
        let known = Command::new("git")
            .args(["cat-file", "-e", &format!("{rev}^{{commit}}")])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status();
        if let Ok(status) = known {
            assert!(status.success(), "{rev} is not a commit here");
        }
    }
    let out = Rdrun::new().arg("--version=1").run();
    out.assert_code(2);
}

/// The README's first command runs `rdrun --nproc_per_node=4 examples/hello.py` (standard
/// library only: no torch after `pip install .`).
#[test]
fn readme_demo_job() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    assert!(
        readme.contains("rdrun --nproc_per_node=4 examples/hello.py"),
        "README changed?"
    );
    let out = Rdrun::new()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--nproc_per_node=4", "examples/hello.py"])
        .run();
    out.assert_code(0);
    for rank in 0..4 {
        assert!(
            out.stdout
                .contains(&format!("rank {rank}/4 (local rank {rank}) on ")),
            "{out:?}"
        );
    }
}
