//! The dependency rules of `docs/architecture.md`, enforced: every `src/**/*.rs` file is scanned
//! for the crate modules it names (`crate::x`, `use crate::{x, y::z}`, and `super::` chains that
//! climb to the crate root), and each arrow must be in [`ALLOWED`]. A new top-level module fails
//! the test until it has a row, so the table stays the whole map. The files of `src/` must also
//! import each other without a cycle, and only `config`, `workerenv`, `bin` (and the runtime,
//! inside workers) may read the environment (production code; tests may reach anywhere). Two
//! rules of ownership besides: only the agent's files emit observer events (the observer and
//! its `RunEvent` are named nowhere else), and only the console thread writes rdrun's stdout and
//! stderr (`print!`, `eprintln!`, `dbg!`, `io::stdout`/`io::stderr` appear nowhere else).
//!
//! Compiled only for tests (`lib.rs`: `#[cfg(test)] mod import_rules`); the print and stream
//! spellings below are the terminal rule's patterns, never calls.
//!
//! This is a text scan, not a parser: comments are dropped first, and inline modules are assumed
//! to run to the end of their file (the crate's only inline modules are trailing `mod tests`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the other top-level modules it may name. Mirrors the "Dependency
/// direction" paragraph of `docs/architecture.md`; change both together.
const ALLOWED: &[(&str, &[&str])] = &[
    // `--help` and the man page list `exit`'s table of statuses (a leaf: no cycle).
    ("cli", &["exit"]),
    ("workerenv", &[]),
    ("store", &[]),
    ("cluster", &[]),
    // ConfigError carries its exit code; cluster detection feeds the resolved config.
    ("config", &["cli", "cluster", "exit", "workerenv"]),
    // The rendezvous is built from the resolved config's spec types (node range, backend,
    // endpoint, rdzv conf), which `config` owns with every other resolved flag.
    ("rendezvous", &["config", "store"]),
    ("runtime", &["store", "workerenv"]),
    // Node health checks read the resolved config; the supervisor acts on their verdicts.
    ("health", &["config"]),
    (
        "supervisor",
        &[
            "cluster",
            "config",
            "exit",
            "health",
            "rendezvous",
            "store",
            "workerenv",
        ],
    ),
    // Exit codes are a leaf: the supervisor maps its `RunEnd` to an `exit::Exit`.
    ("exit", &[]),
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

/// The production text of a file: up to its first trailing `#[cfg(test)]` inline module
/// (`mod tests {`; a `mod x;` declaration does not end it).
fn production(text: &str) -> &str {
    let end = text.match_indices("#[cfg(test)]\n").find(|(i, m)| {
        let next = text[i + m.len()..].lines().next().unwrap_or("").trim();
        next.strip_prefix("pub ")
            .unwrap_or(next)
            .starts_with("mod ")
            && next.ends_with('{')
    });
    &text[..end.map_or(text.len(), |(i, _)| i)]
}

/// Files that are compiled only for tests: those declared by a `mod x;` under `#[cfg(test)]`
/// (following a `#[path = "..."]` if given), and everything below them.
fn test_only_files(src: &Path, files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, l) in lines.iter().enumerate() {
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let Some(name) = l.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) else {
                continue;
            };
            let attrs: Vec<&str> = lines[..i]
                .iter()
                .rev()
                .take_while(|a| a.starts_with("#["))
                .copied()
                .collect();
            if !attrs.contains(&"#[cfg(test)]") {
                continue;
            }
            let here = f.parent().unwrap();
            let stem = f.file_stem().unwrap();
            let dir = if stem == "mod" || stem == "lib" {
                here.to_path_buf()
            } else {
                here.join(stem)
            };
            let path = attrs.iter().find_map(|a| {
                a.strip_prefix("#[path = \"")
                    .and_then(|p| p.strip_suffix("\"]"))
            });
            match path {
                Some(p) => {
                    out.insert(here.join(p));
                }
                None => {
                    out.insert(dir.join(format!("{name}.rs")));
                    out.insert(dir.join(name).join("mod.rs"));
                }
            }
        }
    }
    // Everything below a test-only module file is test-only too.
    let roots: Vec<PathBuf> = out.iter().cloned().collect();
    for f in files {
        for r in &roots {
            let folder = if r.file_name().is_some_and(|n| n == "mod.rs") {
                r.parent().unwrap().to_path_buf()
            } else {
                r.with_extension("")
            };
            if f.starts_with(&folder) && folder != src {
                out.insert(f.clone());
            }
        }
    }
    out
}

/// Every path after `prefix` in `text`, as its segments: `a::b::{c, d::e}` gives `[a, b, c]`
/// and `[a, b, d, e]`.
fn paths_after(text: &str, prefix: &str) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    for (i, _) in text.match_indices(prefix) {
        if !starts_path(text, i) {
            continue;
        }
        found.extend(
            parse_paths(&text[i + prefix.len()..])
                .into_iter()
                .map(|p| (i, p)),
        );
    }
    found
}

/// The paths a `use` tree or path expression at the start of `s` names (see [`paths_after`]).
fn parse_paths(s: &str) -> Vec<Vec<String>> {
    fn parse(s: &str, base: &[String], out: &mut Vec<Vec<String>>) {
        let mut segs = base.to_vec();
        let mut rest = s.trim_start();
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 0;
                let mut start = 0;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            parse(&group[start..i], &segs, out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            parse(&group[start..i], &segs, out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            let id = ident_at(rest);
            if id.is_empty() {
                break;
            }
            if id != "self" {
                segs.push(id.to_string());
            }
            rest = rest.trim_start()[id.len()..].trim_start();
            match rest.strip_prefix("::") {
                Some(r) => rest = r.trim_start(),
                None => break,
            }
        }
        if segs.len() > base.len() || !base.is_empty() {
            out.push(segs);
        }
    }
    let mut paths = Vec::new();
    parse(s, &[], &mut paths);
    paths
}

/// The production files of `src/` and, for each, the other production files it names
/// (`crate::`, `super::` and `self::` paths, resolved to the deepest file they reach). An arrow
/// between a folder's file and a file below it is left out: a `mod.rs` declares and re-exports
/// its children, so those arrows run both ways by design.
fn file_edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = src_dir();
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let tests = test_only_files(&src, &files);
    let mut by_module: BTreeMap<Vec<String>, String> = BTreeMap::new();
    let mut prod = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        if tests.contains(f) || skipped(rel) {
            continue;
        }
        let name = rel.display().to_string();
        by_module.insert(module_path(rel), name.clone());
        prod.push((f.clone(), module_path(rel), name));
    }
    let resolve = |segs: &[String]| -> Option<(Vec<String>, String)> {
        (1..=segs.len()).rev().find_map(|n| {
            by_module
                .get(&segs[..n])
                .map(|f| (segs[..n].to_vec(), f.clone()))
        })
    };
    let mut edges = BTreeMap::new();
    for (f, module, name) in &prod {
        let text = strip_comments(&std::fs::read_to_string(f).unwrap());
        let text = production(&text);
        let mut out = BTreeSet::new();
        let mut named: Vec<Vec<String>> = Vec::new();
        named.extend(paths_after(text, "crate::").into_iter().map(|(_, p)| p));
        for (_, p) in paths_after(text, "self::") {
            named.push(module.iter().cloned().chain(p).collect());
        }
        for (i, _) in text.match_indices("super::") {
            if !starts_path(text, i) || text[..i].ends_with("super::") {
                continue;
            }
            let mut rest = &text[i..];
            let mut ups = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                ups += 1;
                rest = r;
            }
            // `super` of a `foo.rs` is its folder's module; of a `mod.rs`, the folder above.
            let Some(keep) = module.len().checked_sub(ups) else {
                continue;
            };
            for p in parse_paths(rest) {
                named.push(module[..keep].iter().cloned().chain(p).collect());
            }
        }
        for segs in named {
            let Some((target, file)) = resolve(&segs) else {
                continue;
            };
            let related = target.starts_with(module) || module.starts_with(&target);
            if !related {
                out.insert(file);
            }
        }
        edges.insert(name.clone(), out);
    }
    edges
}

/// The groups of files that import each other in a circle (strongly connected components of
/// more than one file), each sorted.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, recursive (the graph has a few hundred files).
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn go<'a>(t: &mut T<'a>, n: &'a str) {
        let i = t.index.len();
        t.index.insert(n, i);
        t.low.insert(n, i);
        t.stack.push(n);
        t.on.insert(n);
        let edges = t.edges;
        for m in edges.get(n).into_iter().flatten() {
            let m = m.as_str();
            if !t.index.contains_key(m) {
                go(t, m);
                let l = t.low[m].min(t.low[n]);
                t.low.insert(n, l);
            } else if t.on.contains(m) {
                let l = t.index[m].min(t.low[n]);
                t.low.insert(n, l);
            }
        }
        if t.low[n] == t.index[n] {
            let mut group = Vec::new();
            loop {
                let m = t.stack.pop().unwrap();
                t.on.remove(m);
                group.push(m.to_string());
                if m == n {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                t.out.push(group);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for n in edges.keys() {
        if !t.index.contains_key(n.as_str()) {
            go(&mut t, n);
        }
    }
    t.out.sort();
    t.out
}

/// No two files of `src/` import each other, directly or round a longer circle (production
/// code; tests may reach anywhere). A circle means neither file can be read first.
#[test]
fn files_import_each_other_without_a_cycle() {
    let edges = file_edges();
    assert!(
        !edges["runtime/nccl.rs"].contains("runtime/group.rs"),
        "runtime/nccl.rs imports runtime/group.rs"
    );
    let found = cycles(&edges);
    let text: Vec<String> = found.iter().map(|c| c.join(" <-> ")).collect();
    assert!(
        found.is_empty(),
        "import cycles among the files of src/ (each line: files that import each other):\n{}",
        text.join("\n")
    );
}

/// Where the environment may be read: `config` resolves it once, `workerenv` is the worker
/// contract, `bin` is the entry point. The runtime is also allowed: it is the library inside a
/// worker process, and what it reads is exactly the contract `workerenv` writes (and the
/// user's own `CUDA_VISIBLE_DEVICES`), not a launcher setting.
fn may_read_env(rel: &Path) -> bool {
    ["config", "workerenv.rs", "bin", "runtime"]
        .iter()
        .any(|m| rel.starts_with(m))
}

/// Every environment read of the launcher happens while the config is resolved, so a bad value
/// is a one-line error before anything starts, and the rest of the code gets typed values.
#[test]
fn the_environment_is_read_only_where_the_config_is_resolved() {
    let bad = lines_outside(
        |rel| skipped(rel) || may_read_env(rel),
        |line| ENV_READS.iter().any(|r| line.contains(r)),
    );
    assert!(
        bad.is_empty(),
        "environment reads outside config/, workerenv.rs and bin/ (resolve them into the \
         config and pass the value down):\n{}",
        bad.join("\n")
    );
}

/// The spellings of an environment read (`env::var` covers `var`, `var_os`, `vars`, `vars_os`;
/// `env::temp_dir` reads `TMPDIR` and `env::home_dir` `HOME`, each at the moment it is called: the
/// config resolves them once, `RunEnv::temp_dir`, `RunEnv::cache_dir`).
const ENV_READS: &[&str] = &["env::var", "getenv(", "env::temp_dir", "env::home_dir"];

/// The file-graph helpers: a `use` tree gives every path it names, a circle is reported with all
/// its files, and the environment rule sees each spelling of a read.
#[test]
fn the_file_graph_helpers_see_paths_and_circles() {
    let c = "crate";
    let paths: Vec<Vec<String>> =
        paths_after(&format!("use {c}::a::{{b, c::{{d, self}}}};"), "crate::")
            .into_iter()
            .map(|(_, p)| p)
            .collect();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(paths, [s(&["a", "b"]), s(&["a", "c", "d"]), s(&["a", "c"])]);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in [("x", "y"), ("y", "z"), ("z", "x"), ("z", "w"), ("u", "v")] {
        edges.entry(a.into()).or_default().insert(b.into());
        edges.entry(b.into()).or_default();
    }
    assert_eq!(cycles(&edges), [s(&["x", "y", "z"])]);
    edges.get_mut("z").unwrap().remove("x");
    assert!(cycles(&edges).is_empty());
    for read in [
        "std::env::var(\"X\")",
        "env::var_os(k)",
        "std::env::vars()",
        "std::env::temp_dir()",
        "std::env::home_dir()",
    ] {
        assert!(ENV_READS.iter().any(|r| read.contains(r)), "{read}");
    }
    let text = "fn a() {}\n#[cfg(test)]\nmod tests;\nfn b() {}\n#[cfg(test)]\nmod tests {\n fn c() {}\n}\n";
    assert!(production(text).contains("fn b()") && !production(text).contains("fn c()"));
}

/// The agent's files: the only ones that emit [`crate::supervisor::observe::RunEvent`]s (the
/// agent and its parts, `agent_*.rs`; `setup.rs` and `workers.rs` beside it).
fn is_agent_file(rel: &Path) -> bool {
    let Ok(rest) = rel.strip_prefix("supervisor") else {
        return false;
    };
    let name = rest.to_str().unwrap_or("");
    name == "agent.rs"
        || (name.starts_with("agent_") && name.ends_with(".rs") && !name.contains('/'))
        || name == "setup.rs"
        || name == "workers.rs"
}

/// Whether `line` names `word` as a whole identifier.
fn names_ident(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The production lines that `hit` finds in the files outside `allowed` (and outside `bin/`,
/// this file and test-only files), as `file:line: text`.
fn lines_outside(allowed: impl Fn(&Path) -> bool, hit: impl Fn(&str) -> bool) -> Vec<String> {
    let src = src_dir();
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let tests = test_only_files(&src, &files);
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        if tests.contains(f) || rel.starts_with("bin") || rel == Path::new("import_rules.rs") {
            continue;
        }
        if allowed(rel) {
            continue;
        }
        let text = strip_comments(&std::fs::read_to_string(f).unwrap());
        for (n, line) in production(&text).lines().enumerate() {
            if hit(line) {
                bad.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
            }
        }
    }
    bad
}

/// Output is events (issue 39 item 2): the agent emits one `RunEvent` per thing that happened
/// and the observer's renderers consume it. Nothing below the agent names the observer or its
/// events: a gate (`nodes/health_gate.rs`, `nodes/network_check.rs`) hands back what it found
/// and the agent emits it.
#[test]
fn only_the_agent_emits_observer_events() {
    let bad = lines_outside(
        |rel| is_agent_file(rel) || rel.starts_with("supervisor/observe"),
        |line| names_ident(line, "Observer") || names_ident(line, "RunEvent"),
    );
    assert!(
        bad.is_empty(),
        "the observer named outside the agent's files (return what happened to the agent, \
         which emits the RunEvent):\n{}",
        bad.join("\n")
    );
}

/// The spellings of a write to rdrun's own stdout or stderr (the macros panic on a closed
/// stream besides; `dbg!` writes stderr).
const TERMINAL_WRITES: &[&str] = &[
    "print!(",
    "println!(",
    "eprint!(",
    "eprintln!(",
    "dbg!(",
    "io::stdout",
    "io::stderr",
];

/// Who may write the terminal (issue 39 item 3): the console thread (`output/console.rs` and
/// its part `output/console_own.rs`) is its one writer once the agent made it; `output/own.rs`
/// hands rdrun's own text to it, and writes directly only before the console exists (the
/// binary's usage errors, `--help`, `--dry-run`); it also asks whether a stream is a terminal.
/// `bin/` (skipped) holds programs with output of their own (the benchmarks, the demo trainer)
/// and `rdrun`'s `main`, which writes only through `own`. Tests may print.
#[test]
fn only_the_console_thread_writes_the_terminal() {
    let allowed = |rel: &Path| {
        [
            "supervisor/output/console.rs",
            "supervisor/output/console_own.rs",
            "supervisor/output/own.rs",
        ]
        .iter()
        .any(|a| rel == Path::new(a))
    };
    let bad = lines_outside(allowed, |line| {
        TERMINAL_WRITES.iter().any(|w| line.contains(w))
    });
    assert!(
        bad.is_empty(),
        "writes to rdrun's stdout/stderr outside the console thread (send rdrun's own text \
         through supervisor::output::own, worker output through the console):\n{}",
        bad.join("\n")
    );
}

/// The helpers of the two rules above see what they must and nothing else.
#[test]
fn the_observer_and_terminal_rules_see_each_spelling() {
    assert!(is_agent_file(Path::new("supervisor/agent.rs")));
    assert!(is_agent_file(Path::new("supervisor/agent_rounds.rs")));
    assert!(is_agent_file(Path::new("supervisor/workers.rs")));
    assert!(!is_agent_file(Path::new("supervisor/nodes/health_gate.rs")));
    assert!(!is_agent_file(Path::new("supervisor/group/agent_x.rs")));
    assert!(names_ident("obs: &Observer,", "Observer"));
    assert!(names_ident(
        "use crate::supervisor::observe::{Observer, RunEvent};",
        "RunEvent"
    ));
    assert!(!names_ident("struct ObserverLike;", "Observer"));
    for write in [
        "println!(\"x\")",
        "eprint!(\"x\")",
        "let _ = std::io::stderr().write_all(b)",
        ".with_writer(std::io::stdout)",
        "dbg!(x)",
    ] {
        assert!(TERMINAL_WRITES.iter().any(|w| write.contains(w)), "{write}");
    }
}
