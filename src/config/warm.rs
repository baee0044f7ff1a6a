//! Warm-start settings (`--warm-start`, `--preload`, `RDRUN_WARM_START`, `RDRUN_PRELOAD`): whether
//! Python workers are forked from a per-node template interpreter, and what it imports first.
//! The supervisor's `warm` module does the forking; this file only resolves the settings.

use std::path::{Path, PathBuf};

use crate::cli::{EnvFn, LaunchArgs};

use super::error::{invalid, ConfigError};

/// `--warm-start`: whether workers are forked from a template interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WarmMode {
    /// Every worker is spawned cold (exec of the interpreter), as torchrun.
    Off,
    /// Python workers are forked from a template that imports torch (and `--preload`) before
    /// the first fork; a reason to spawn cold is a WARN line.
    On,
    /// The default: Python workers are forked from a template that starts bare and imports
    /// what the workers import (learned), so that no launch waits for imports its workers
    /// would not make; a reason to spawn cold is an INFO line, a non-Python worker is silent.
    #[default]
    Auto,
}

impl WarmMode {
    pub fn parse(text: &str) -> Option<WarmMode> {
        match text.trim() {
            "off" | "0" | "false" => Some(WarmMode::Off),
            "on" | "1" | "true" => Some(WarmMode::On),
            "auto" => Some(WarmMode::Auto),
            _ => None,
        }
    }
}

/// The resolved warm-start settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WarmSettings {
    pub mode: WarmMode,
    /// Modules imported by the template besides `torch` (which it imports when importable);
    /// each must import, else the run spawns cold.
    pub preload: Vec<String>,
    /// Where the template remembers what a job's workers imported, for the next run's first
    /// launch (`RDRUN_WARM_MEMORY`, else `$XDG_CACHE_HOME/rdrun/warm`, else
    /// `$HOME/.cache/rdrun/warm`); `None`: nothing is remembered (`RDRUN_WARM_MEMORY=off`).
    pub memory: Option<PathBuf>,
}

/// The flags first, then `RDRUN_WARM_START` / `RDRUN_PRELOAD`.
pub fn resolve(args: &LaunchArgs, env: EnvFn<'_>) -> Result<WarmSettings, ConfigError> {
    let mode = match args.warm_start.clone() {
        Some(text) => WarmMode::parse(&text)
            .ok_or_else(|| invalid("--warm-start", text, "must be off, on or auto"))?,
        None => match env("RDRUN_WARM_START") {
            None => WarmMode::Auto,
            Some(text) => WarmMode::parse(&text).ok_or_else(|| ConfigError::Invalid {
                flag: "RDRUN_WARM_START",
                value: text.clone(),
                reason: "must be off, on or auto".into(),
                var: Some("RDRUN_WARM_START".into()),
            })?,
        },
    };
    let listed: Vec<String> = if args.preload.is_empty() {
        env("RDRUN_PRELOAD")
            .map(|t| t.split(',').map(str::to_string).collect())
            .unwrap_or_default()
    } else {
        args.preload.clone()
    };
    let mut preload = Vec::new();
    for name in listed {
        let name = name.trim().to_string();
        if name.is_empty() {
            continue;
        }
        if !is_module_name(&name) {
            return Err(invalid(
                "--preload",
                name,
                "must be a Python module name (dotted identifiers, e.g. transformers or torch.distributed)",
            ));
        }
        if !preload.contains(&name) {
            preload.push(name);
        }
    }
    let memory = match env("RDRUN_WARM_MEMORY") {
        Some(v) if matches!(v.trim(), "off" | "0" | "false" | "") => None,
        Some(v) => Some(PathBuf::from(v)),
        None => env("XDG_CACHE_HOME")
            .filter(|d| Path::new(d).is_absolute())
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".cache")))
            .map(|d| d.join("rdrun").join("warm")),
    };
    Ok(WarmSettings {
        mode,
        preload,
        memory,
    })
}

/// `a.b_c.d`: dotted identifiers (ASCII letters, digits, `_`; no leading digit). Checked here
/// so that the template never receives anything but a module name to import.
fn is_module_name(name: &str) -> bool {
    name.split('.').all(|part| {
        let mut chars = part.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{args, env_of};
    use super::*;

    fn settings(argv: &[&str], env: &[(&str, &str)]) -> Result<WarmSettings, String> {
        resolve(&args(argv), &env_of(env)).map_err(|e| e.to_string())
    }

    #[test]
    fn modes_and_lists() {
        // auto by default (issue 37), off by the flag or the variable.
        assert_eq!(settings(&["t.py"], &[]).unwrap(), WarmSettings::default());
        assert_eq!(settings(&["t.py"], &[]).unwrap().mode, WarmMode::Auto);
        let s = settings(&["t.py"], &[("RDRUN_WARM_START", "off")]).unwrap();
        assert_eq!(s.mode, WarmMode::Off);
        let s = settings(&["--warm-start", "on", "t.py"], &[]).unwrap();
        assert_eq!(s.mode, WarmMode::On);
        let s = settings(&["t.py"], &[("RDRUN_WARM_START", "auto")]).unwrap();
        assert_eq!(s.mode, WarmMode::Auto);
        // The flag wins over the variable.
        let s = settings(&["--warm-start=off", "t.py"], &[("RDRUN_WARM_START", "on")]).unwrap();
        assert_eq!(s.mode, WarmMode::Off);
        let s = settings(&["--preload", "transformers,a.b_c,a.b_c", "t.py"], &[]).unwrap();
        assert_eq!(s.preload, vec!["transformers", "a.b_c"]);
        let s = settings(&["t.py"], &[("RDRUN_PRELOAD", "x, y")]).unwrap();
        assert_eq!(s.preload, vec!["x", "y"]);
    }

    #[test]
    fn where_the_learned_list_is_remembered() {
        let m = |env: &[(&str, &str)]| settings(&["t.py"], env).unwrap().memory;
        assert_eq!(
            m(&[("HOME", "/h")]),
            Some(PathBuf::from("/h/.cache/rdrun/warm"))
        );
        assert_eq!(
            m(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/c")]),
            Some(PathBuf::from("/c/rdrun/warm"))
        );
        // A relative XDG_CACHE_HOME is ignored, as the XDG rules say.
        assert_eq!(
            m(&[("HOME", "/h"), ("XDG_CACHE_HOME", "c")]),
            Some(PathBuf::from("/h/.cache/rdrun/warm"))
        );
        assert_eq!(m(&[("HOME", "/h"), ("RDRUN_WARM_MEMORY", "off")]), None);
        assert_eq!(m(&[("RDRUN_WARM_MEMORY", "/m")]), Some(PathBuf::from("/m")));
        assert_eq!(m(&[]), None);
    }

    #[test]
    fn bad_values_name_their_source() {
        let e = settings(&["--warm-start", "yes", "t.py"], &[]).unwrap_err();
        assert!(e.contains("--warm-start") && e.contains("yes"), "{e}");
        let e = settings(&["t.py"], &[("RDRUN_WARM_START", "maybe")]).unwrap_err();
        assert!(e.contains("RDRUN_WARM_START"), "{e}");
        let e = settings(&["--preload", "os;rm", "t.py"], &[]).unwrap_err();
        assert!(e.contains("--preload") && e.contains("os;rm"), "{e}");
        assert!(settings(&["--preload", "1abc", "t.py"], &[]).is_err());
    }
}
