//! The learned preload's side in rdrun (docs/warm-start.md "Learned preload"): the private
//! directory the workers report their imports to, and which file remembers a job's list
//! across runs. What the template learns, and the rules, are `learn.py`'s.

use std::ffi::OsString;
use std::path::Path;

/// A private directory (0700) where the workers report the modules they import (learn.py);
/// removed with the run's manager.
pub(super) struct LearnDir {
    pub(super) path: std::path::PathBuf,
}

impl LearnDir {
    /// A fresh 0700 directory under `temp` (the config's `RunEnv::temp_dir`).
    pub(super) fn create(temp: &std::path::Path) -> std::io::Result<LearnDir> {
        use std::os::unix::fs::DirBuilderExt;
        let path = temp.join(format!(
            "rdrun-warm-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(LearnDir { path })
    }
}

impl Drop for LearnDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// What identifies a job for the remembered list: the interpreter's real path, the script's (a
/// module's name and the working directory for `-m`; the code and its script for `-c`); and
/// the script file, whose edits invalidate the list (template.py checks the fingerprint).
pub(super) fn memory_key(
    program: &Path,
    args: &[OsString],
) -> (OsString, Option<std::path::PathBuf>) {
    let mut key = std::fs::canonicalize(program)
        .unwrap_or_else(|_| program.to_path_buf())
        .into_os_string();
    let mut script = None;
    let cwd = std::env::current_dir().unwrap_or_default();
    match args.get(1).and_then(|a| a.to_str()) {
        Some("-m") => {
            for part in [
                args.get(2).cloned().unwrap_or_default(),
                cwd.into_os_string(),
            ] {
                key.push("\n");
                key.push(part);
            }
        }
        Some("-c") => {
            key.push("\n-c\n");
            key.push(args.get(2).cloned().unwrap_or_default());
            if let Some(s) = args.get(3).and_then(|s| std::fs::canonicalize(s).ok()) {
                key.push("\n");
                key.push(&s);
                script = Some(s);
            }
        }
        _ => {
            if let Some(s) = args.get(1).and_then(|s| std::fs::canonicalize(s).ok()) {
                key.push("\n");
                key.push(&s);
                script = Some(s);
            }
        }
    }
    (key, script)
}

/// The remembered list's file for a job's key: `DIR/<16 hex digits>.json`. The hash is std's
/// (SipHash with fixed keys), stable for a given build: a Rust release that changes it costs
/// one first run (a miss), never a wrong list (the template checks its fingerprint).
pub(super) fn memory_file(dir: &Path, key: &std::ffi::OsStr) -> std::path::PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    dir.join(format!("{:016x}.json", h.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_remembered_list_per_interpreter_and_script() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.py"), dir.path().join("b.py"));
        std::fs::write(&a, "").unwrap();
        std::fs::write(&b, "").unwrap();
        let os = |v: &[&Path]| {
            v.iter()
                .map(|p| p.as_os_str().to_owned())
                .collect::<Vec<_>>()
        };
        let file = |prog: &str, script: &Path| {
            let (key, s) = memory_key(Path::new(prog), &os(&[Path::new("-u"), script]));
            assert_eq!(
                s.as_deref(),
                Some(std::fs::canonicalize(script).unwrap().as_path())
            );
            memory_file(Path::new("/m"), &key)
        };
        assert_eq!(file("/py", &a), file("/py", &a));
        assert_ne!(file("/py", &a), file("/py", &b));
        assert_ne!(file("/py", &a), file("/other", &a));
        let f = file("/py", &a);
        assert!(
            f.starts_with("/m") && f.extension().is_some_and(|e| e == "json"),
            "{f:?}"
        );
    }
}
