//! The dependency rules of `docs/architecture.md`, enforced: every `src/**/*.rs` file is scanned
//! for the crate modules it names (`crate::x`, `use crate::{x, y::z}`, and `super::` chains that
//! climb to the crate root), and each arrow must be in [`ALLOWED`]. A new top-level module fails
//! the test until it has a row, so the table stays the whole map. The runtime's files must also
//! import each other without a cycle (production code; tests may reach anywhere in `runtime`).
//!
//! This is a text scan, not a parser: comments are dropped first, and inline modules are assumed
//! to run to the end of their file (the crate's only inline modules are trailing `mod tests`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the other top-level modules it may name. Mirrors the "Dependency
/// direction" paragraph of `docs/architecture.md`; change both together.
const ALLOWED: &[(&str, &[&str])] = &[
    ("cli", &[]),
    ("workerenv", &[]),
    ("store", &[]),
    ("cluster", &[]),
    // ConfigError carries its exit code; cluster detection feeds the resolved config.
    ("config", &["cli", "cluster", "exit", "workerenv"]),
    // The rendezvous is built from the resolved config's spec types (node range, backend,
    // endpoint, rdzv conf), which `config` owns with every other resolved flag.
    ("rendezvous", &["config", "store"]),
    ("runtime", &["store", "workerenv"]),
    (
        "supervisor",
        &[
            "cluster",
            "config",
            "exit",
            "rendezvous",
            "store",
            "workerenv",
        ],
    ),
    // `exit::for_run_end` maps the supervisor's `RunEnd` (and its report) to the exit code.
    ("exit", &["supervisor"]),
];

/// Files that are not part of a top-level module's code.
fn skipped(rel: &Path) -> bool {
    rel.starts_with("bin") || rel == Path::new("lib.rs") || rel == Path::new("import_rules.rs")
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Source text without `//` and `/* */` comments (so doc links and prose are not imports).
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let end = src[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            out.push_str(&"\n".repeat(src[i..end].matches('\n').count()));
            i = end;
        } else {
            let c = src[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn ident_at(s: &str) -> &str {
    let s = s.trim_start();
    &s[..s.find(|c: char| !is_ident(c)).unwrap_or(s.len())]
}

/// The first segment of every item in a `{a, b::c, d::{e, f}}` group (`s` starts after `{`).
fn group_heads(s: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut at_item = true;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item = true,
            c if at_item && !c.is_whitespace() => {
                at_item = false;
                let id = ident_at(&s[i..]);
                if !id.is_empty() && id != "self" {
                    heads.push(id.to_string());
                }
            }
            _ => {}
        }
    }
    heads
}

/// Whether the `needle` found at `i` starts a path (not the tail of `foo_crate::` or `$crate::`).
fn starts_path(text: &str, i: usize) -> bool {
    !text[..i]
        .chars()
        .next_back()
        .is_some_and(|c| is_ident(c) || c == '$' || c == ':')
}

/// The top-level modules named from a file whose module path is `module` (e.g. `["runtime",
/// "group"]`; a `mod.rs` names its folder). `tops` are the crate's top-level module names.
fn named_modules(module: &[String], src: &str, tops: &BTreeSet<String>) -> BTreeSet<String> {
    let text = strip_comments(src);
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        if !starts_path(&text, i) {
            continue;
        }
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.trim_start().strip_prefix('{') {
            found.extend(group_heads(group));
        } else {
            found.insert(ident_at(rest).to_string());
        }
    }
    for (i, _) in text.match_indices("super::") {
        if !starts_path(&text, i) {
            continue;
        }
        // Inline modules opened before this point (assumed to run to the end of the file).
        let inline = text[..i]
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                let l = l.strip_prefix("pub ").unwrap_or(l);
                l.strip_prefix("mod ")
                    .is_some_and(|m| m.trim_end().ends_with('{'))
            })
            .count();
        let mut rest = &text[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        let depth = module.len() + inline;
        if ups == depth {
            let named = if let Some(group) = rest.trim_start().strip_prefix('{') {
                group_heads(group)
            } else {
                vec![ident_at(rest).to_string()]
            };
            found.extend(named);
        }
    }
    found.retain(|m| tops.contains(m) && *m != module[0]);
    found
}

fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_import_follows_the_documented_arrows() {
    let src = src_dir();
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let tops: BTreeSet<String> = files
        .iter()
        .map(|f| f.strip_prefix(&src).unwrap().to_path_buf())
        .filter(|rel| !skipped(rel))
        .map(|rel| module_path(&rel)[0].clone())
        .collect();
    let unlisted: Vec<_> = tops
        .iter()
        .filter(|t| !allowed.contains_key(t.as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "top-level modules without a row in ALLOWED (and in docs/architecture.md): {unlisted:?}"
    );
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        if skipped(rel) {
            continue;
        }
        let module = module_path(rel);
        let text = std::fs::read_to_string(f).unwrap();
        for m in named_modules(&module, &text, &tops) {
            if !allowed[module[0].as_str()].contains(&m.as_str()) {
                bad.push(format!("{} -> {m}", rel.display()));
            }
        }
    }
    assert!(bad.is_empty(), "forbidden imports:\n{}", bad.join("\n"));
}

/// The runtime's own files form no import cycle (production code: up to the first trailing
/// `#[cfg(test)]` module), e.g. `group` and `nccl` both sit on `bootstrap`, neither on the other.
#[test]
fn runtime_files_import_each_other_without_a_cycle() {
    let dir = src_dir().join("runtime");
    let mut files = Vec::new();
    rs_files(&dir, &mut files);
    let names: BTreeSet<String> = files
        .iter()
        .map(|f| f.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "mod" && n != "tests")
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let me = f.file_stem().unwrap().to_string_lossy().into_owned();
        if !names.contains(&me) {
            continue;
        }
        let text = strip_comments(&std::fs::read_to_string(f).unwrap());
        let prod = text.split("#[cfg(test)]\nmod ").next().unwrap();
        let mut uses = BTreeSet::new();
        for pat in ["super::", "crate::runtime::"] {
            for (i, _) in prod.match_indices(pat) {
                if !starts_path(prod, i) {
                    continue;
                }
                let rest = &prod[i + pat.len()..];
                let heads = match rest.trim_start().strip_prefix('{') {
                    Some(g) => group_heads(g),
                    None => vec![ident_at(rest).to_string()],
                };
                uses.extend(heads.into_iter().filter(|h| names.contains(h) && *h != me));
            }
        }
        edges.insert(me, uses);
    }
    assert!(!edges["nccl"].contains("group"), "nccl.rs imports group.rs");
    // Depth-first search for a back edge.
    fn visit<'a>(
        n: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if let Some(at) = path.iter().position(|p| *p == n) {
            return Some(format!("{} -> {n}", path[at..].join(" -> ")));
        }
        if !done.insert(n) {
            return None;
        }
        path.push(n);
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(cycle) = visit(n, &edges, &mut Vec::new(), &mut done) {
            panic!("import cycle among src/runtime files: {cycle}");
        }
    }
}

/// The scanner itself sees each spelling of a cross-module path and ignores comments.
#[test]
fn the_scanner_finds_each_spelling() {
    let tops: BTreeSet<String> = ALLOWED.iter().map(|(m, _)| m.to_string()).collect();
    let m = |path: &[&str], src: &str| {
        let module: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        named_modules(&module, src, &tops)
            .into_iter()
            .collect::<Vec<_>>()
    };
    let c = "crate";
    assert_eq!(m(&["store"], &format!("use {c}::config::X;")), ["config"]);
    assert_eq!(
        m(
            &["store", "a"],
            &format!("use {c}::{{exit::E, cli,\n runtime::{{x, y}}}};")
        ),
        ["cli", "exit", "runtime"]
    );
    assert_eq!(
        m(&["store"], &format!("let x = {c}::supervisor::run();")),
        ["supervisor"]
    );
    assert_eq!(
        m(&["store", "a"], "use super::super::config::X;"),
        ["config"]
    );
    // Inside an inline module, one more `super` is needed to reach the root.
    assert!(m(
        &["runtime", "a"],
        "mod tests {\n use super::super::store::X;"
    )
    .is_empty());
    assert_eq!(
        m(
            &["runtime", "a"],
            "mod tests {\n use super::super::super::store::X;"
        ),
        ["store"]
    );
    assert!(m(
        &["store"],
        &format!("// {c}::config::X\n/* {c}::cli */ $crate::exit")
    )
    .is_empty());
    assert!(m(&["store"], &format!("use {c}::store::X; other_{c}::cli")).is_empty());
}
