//! argparse's rules for one command-line word (`_parse_optional`): exact and abbreviated option
//! names, "does this look like a negative number", and Python's `int`/`float`/
//! `comma_separated_list` conversions of a value.

use super::options::OPTIONS;
use super::UsageError;

/// Index into [`OPTIONS`].
pub(super) type OptId = usize;

/// What one command-line word is, by argparse's rules (`_parse_optional`).
pub(super) enum Class<'a> {
    Positional,
    Unknown,
    Option {
        id: OptId,
        name: &'static str,
        explicit: Option<&'a str>,
    },
}

pub(super) fn exact(name: &str) -> Option<(OptId, &'static str)> {
    OPTIONS
        .iter()
        .enumerate()
        .find_map(|(id, o)| o.names.iter().find(|n| **n == name).map(|n| (id, *n)))
}

/// argparse's "looks like a negative number" test; such words are values, not flags.
pub(super) fn is_negative_number(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('-') else {
        return false;
    };
    let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if all_digits(rest) {
        return true;
    }
    match rest.split_once('.') {
        Some((int, frac)) => (int.is_empty() || all_digits(int)) && all_digits(frac),
        None => false,
    }
}

pub(super) fn classify(arg: &str) -> Result<Class<'_>, UsageError> {
    if !arg.starts_with('-') {
        return Ok(Class::Positional);
    }
    if let Some((id, name)) = exact(arg) {
        return Ok(Class::Option {
            id,
            name,
            explicit: None,
        });
    }
    if arg.len() == 1 {
        return Ok(Class::Positional);
    }
    if let Some((flag, value)) = arg.split_once('=') {
        if let Some((id, name)) = exact(flag) {
            return Ok(Class::Option {
                id,
                name,
                explicit: Some(value),
            });
        }
    }
    // Unique-prefix abbreviation (argparse `_get_option_tuples`, Python 3.11).
    let mut matches: Vec<(OptId, &'static str, Option<&str>)> = Vec::new();
    if arg.starts_with("--") {
        let (prefix, explicit) = match arg.split_once('=') {
            Some((p, v)) => (p, Some(v)),
            None => (arg, None),
        };
        for (id, o) in OPTIONS.iter().enumerate().filter(|(_, o)| o.abbreviable) {
            for n in o.names.iter().filter(|n| n.starts_with(prefix)) {
                matches.push((id, n, explicit));
            }
        }
    } else {
        // `-r3` is `-r` with the value `3`; `-mr3` is `-m` then `-r3` (chained in `parse_from`).
        let short = arg.get(..2).unwrap_or(arg);
        let rest = arg.get(2..).unwrap_or("");
        for (id, o) in OPTIONS.iter().enumerate() {
            for n in o.names.iter() {
                if *n == short {
                    matches.push((id, n, Some(rest)));
                } else if n.starts_with(arg) {
                    matches.push((id, n, None));
                }
            }
        }
    }
    match matches.len() {
        0 => {}
        1 => {
            let (id, name, explicit) = matches[0];
            return Ok(Class::Option { id, name, explicit });
        }
        _ => {
            return Err(UsageError::Ambiguous {
                option: arg.to_string(),
                matches: matches.iter().map(|m| m.1).collect::<Vec<_>>().join(", "),
            })
        }
    }
    if is_negative_number(arg) || arg.contains(' ') {
        return Ok(Class::Positional);
    }
    Ok(Class::Unknown)
}

/// argparse's display name of an option: all its spellings joined by `/`.
pub(super) fn display(id: OptId) -> String {
    OPTIONS[id].names.join("/")
}

/// Python `int(text)`: surrounding whitespace, an optional sign, `_` between digits.
pub(crate) fn python_int(text: &str) -> Option<i64> {
    let t = text.trim();
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    let v: i64 = clean.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// Python `float(text)` for the forms people type: decimals, exponents, `inf`, `nan`.
pub(crate) fn python_float(text: &str) -> Option<f64> {
    let t = text.trim();
    if t.is_empty() || t.contains("__") || t.starts_with('_') || t.ends_with('_') {
        return None;
    }
    let clean: String = t.chars().filter(|c| *c != '_').collect();
    clean.parse::<f64>().ok()
}

/// torchrun's `comma_separated_list`: split on `,`, where `,,` stands for a literal comma.
pub(crate) fn comma_separated_list(value: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut cur = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                cur.push(',');
            } else {
                items.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    items.push(cur);
    items
}
