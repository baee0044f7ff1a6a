//! `--help` and `--version` text. The help screen is generated from the option table
//! ([`OPTIONS`]): torchrun's own flags first, then rdrun's by topic ([`Section`]), every flag with
//! its spellings, its values where they are a closed set (`{off,on,auto}`), its default and
//! `PET_*` variable, wrapped to the terminal; then every exit status of `crate::exit`.
//!
//! Pure text: the caller (the binary) measures the terminal and passes its width in.

use super::options::{Kind, OptSpec, Section, OPTIONS, SHELLS};

/// Narrower than this, wrapped text is mostly indentation.
const MIN_COLUMNS: usize = 40;
/// Wider than this, prose lines get hard to read: a wide terminal wraps here (argparse caps its
/// help column the same way, `max_help_position`).
const MAX_COLUMNS: usize = 100;
/// The indentation of an option's help under its names.
const HELP_INDENT: usize = 6;

/// `rdrun 0.1.0 (git 1a2b3c4)`: the version and the git revision the binary was built from
/// (`unknown` when built outside a git checkout, e.g. from an sdist; see `build.rs`).
pub fn version_text() -> String {
    format!(
        "rdrun {} (git {})\n",
        env!("CARGO_PKG_VERSION"),
        env!("RDRUN_GIT_REV")
    )
}

/// The help text at 80 columns (what argparse uses when the output is not a terminal).
pub fn help_text() -> String {
    help_text_for(80)
}

/// The help text wrapped for a terminal of `columns` columns (clamped to 40..=100; two columns
/// are left free, as argparse does).
pub fn help_text_for(columns: usize) -> String {
    let width = columns.clamp(MIN_COLUMNS, MAX_COLUMNS) - 2;
    let mut out = wrap(
        "usage: rdrun [OPTIONS] training_script [training_script_args ...]",
        0,
        13,
        width,
    );
    out.push('\n');
    out.push_str(&wrap(
        "rdrun: a drop-in replacement for torchrun (torch.distributed.run, PyTorch 2.15). \
         Everything after training_script is passed to it verbatim.",
        0,
        0,
        width,
    ));
    out.push_str("\npositional arguments:\n");
    for (name, help) in [
        (
            "training_script",
            "Path of the training script (.py), module name (-m) or program to launch.",
        ),
        (
            "training_script_args",
            "Arguments for the training script; ${local_rank} becomes the local rank.",
        ),
    ] {
        out.push_str(&format!("  {name}\n"));
        out.push_str(&wrap(help, HELP_INDENT, HELP_INDENT, width));
    }
    for &section in Section::ALL {
        let heading = match section {
            Section::Torchrun => format!(
                "{} (every long option also accepts '_' for '-', --opt=value, and unique \
                 prefixes; rdrun's own options, in the sections after this one, must be spelled \
                 in full):",
                section.title()
            ),
            _ => format!("{}:", section.title()),
        };
        out.push('\n');
        out.push_str(&wrap(&heading, 0, 2, width));
        for o in OPTIONS.iter().filter(|o| o.section == section) {
            entry(&mut out, o, width);
        }
    }
    out.push_str("\nexit status:\n");
    let code_width = crate::exit::STATUSES
        .iter()
        .map(|(c, _)| c.len())
        .max()
        .unwrap_or(0);
    for (code, meaning) in crate::exit::STATUSES {
        // The code in a column of its own (wrap collapses runs of spaces, so it goes in after).
        let text = wrap(meaning, code_width + 4, code_width + 4, width);
        out.push_str(&format!(
            "  {code:<code_width$}  {}",
            &text[code_width + 4..]
        ));
    }
    out
}

/// One option: its spellings and value, its help, then `[default: …; env: …]`.
fn entry(out: &mut String, o: &OptSpec, width: usize) {
    let value = match o.kind {
        Kind::Flag | Kind::Help | Kind::Man | Kind::Version => String::new(),
        Kind::Choice(c) => format!(" {{{}}}", c.join(",")),
        Kind::OptionalChoice(c) => format!("[={{{}}}]", c.join(",")),
        Kind::Completion => format!(" {{{}}}", SHELLS.join(",")),
        _ if !o.values.is_empty() => format!(" {{{}}}", o.values.join(",")),
        _ => format!(" {}", o.dest.to_ascii_uppercase()),
    };
    out.push_str(&wrap(
        &format!("  {}{value}", o.names.join(", ")),
        0,
        4,
        width,
    ));
    out.push_str(&wrap(o.help, HELP_INDENT, HELP_INDENT, width));
    let mut notes = Vec::new();
    if !o.kind.prints_and_exits() {
        let d = if o.default.is_empty() {
            "\"\""
        } else {
            o.default
        };
        notes.push(format!("default: {d}"));
    }
    if o.pet {
        notes.push(format!("env: PET_{}", o.dest.to_ascii_uppercase()));
    }
    if !notes.is_empty() {
        // One line even past the width: `[default: …; env: …]` is what a reader searches for.
        out.push_str(&format!(
            "{}[{}]\n",
            " ".repeat(HELP_INDENT),
            notes.join("; ")
        ));
    }
}

/// `text` wrapped at spaces to `width` columns: the first line indented by `first` spaces (or
/// already starting with its own), the others by `rest`. A word longer than a line stays whole.
/// Ends with a newline.
fn wrap(text: &str, first: usize, rest: usize, width: usize) -> String {
    let lead = text.len() - text.trim_start_matches(' ').len();
    let mut out = String::new();
    let mut line = " ".repeat(first + lead);
    let mut empty = true;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let len = line.chars().count();
        if !empty && len + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line = " ".repeat(rest);
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_the_width_and_keeps_long_words() {
        let w = wrap("aaa bbb ccc ddd", 2, 4, 10);
        assert_eq!(w, "  aaa bbb\n    ccc\n    ddd\n");
        let w = wrap("x averyveryverylongword y", 0, 2, 8);
        assert_eq!(w, "x\n  averyveryverylongword\n  y\n");
        assert_eq!(wrap("  --a, --b", 0, 4, 80), "  --a, --b\n");
    }

    #[test]
    fn every_line_fits_but_the_notes_and_long_words() {
        for columns in [40, 80, 100, 200] {
            let h = help_text_for(columns);
            let width = columns.clamp(MIN_COLUMNS, MAX_COLUMNS) - 2;
            for line in h.lines() {
                let unbreakable = line.trim_start().starts_with("[default:")
                    || line.trim_start().starts_with("[env:")
                    || !line.trim().contains(' ');
                assert!(
                    line.chars().count() <= width || unbreakable,
                    "{columns}: {line:?}"
                );
            }
        }
    }

    /// torchrun's flags first, then rdrun's sections in order; enum values shown.
    #[test]
    fn sections_in_order_with_values() {
        let h = help_text_for(100);
        let at = |s: &str| h.find(s).unwrap_or_else(|| panic!("{s} missing:\n{h}"));
        let mut last = 0;
        for s in Section::ALL {
            let i = at(&format!("\n{}", s.title()));
            assert!(i > last, "{} out of order", s.title());
            last = i;
        }
        assert!(at("--nnodes") < at("\nrdrun: cluster"));
        assert!(at("  --warm-start, --warm_start {off,on,auto}") > at("\nrdrun: recovery"));
        assert!(h.contains("--hang-detect {off,observe,kill}"));
        assert!(h.contains("--rdzv-backend, --rdzv_backend {static,c10d,etcd-v3}"));
        assert!(h.contains("--print-topology, --print_topology[={text,json}]"));
        assert!(!h.contains("needs the `etcd` build feature"));
        for (code, _) in crate::exit::STATUSES {
            assert!(h.contains(&format!("\n  {code:<5}  ")), "exit {code}:\n{h}");
        }
    }

    #[test]
    fn version_names_the_revision() {
        let v = version_text();
        assert!(v.starts_with(&format!("rdrun {} (git ", env!("CARGO_PKG_VERSION"))));
        assert!(v.ends_with(")\n"));
    }
}
