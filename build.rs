//! Build script: the git revision rdrun is built from, for `--version` (`RDRUN_GIT_REV`).
//!
//! `git rev-parse --short HEAD` when the source is a git checkout and git is installed;
//! `unknown` otherwise (an sdist or a crate tarball has no `.git`). By hand rather than with a
//! crate (vergen, built): one command and its fallback.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}

fn main() {
    let rev = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=RDRUN_GIT_REV={rev}");
    println!("cargo:rerun-if-changed=build.rs");
    // Run again when HEAD moves: HEAD itself (a checkout), the branch it names (a commit) and
    // packed-refs. Only files that exist: cargo reruns a script whose listed file is missing
    // on every build, and that would rebuild the crate each time.
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched.into_iter().flatten() {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
