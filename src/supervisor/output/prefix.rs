//! Console line prefixes of tee'd streams: torchrun's default `[<role><local_rank>]:` and
//! `--log-line-prefix-template`, substituted as Python's `string.Template.safe_substitute`.

/// Identity of a worker for prefixes and templates.
#[derive(Debug, Clone)]
pub struct RankIdentity {
    pub role: String,
    pub rank: usize,
    pub local_rank: usize,
    pub hostname: String,
}

/// The console prefix of a tee'd line: `[<role><local_rank>]:` or the template, substituted.
pub fn line_prefix(template: Option<&str>, id: &RankIdentity) -> String {
    match template {
        Some(t) => substitute_template(t, id),
        None => format!("[{}{}]:", id.role, id.local_rank),
    }
}

/// Python `string.Template.safe_substitute` with `role_name`, `rank`, `local_rank`, `hostname`:
/// `$$` is `$`, `$name` / `${name}` are replaced when known, anything else is kept as written.
pub fn substitute_template(template: &str, id: &RankIdentity) -> String {
    let lookup = |name: &str| -> Option<String> {
        match name {
            "role_name" => Some(id.role.clone()),
            "rank" => Some(id.rank.to_string()),
            "local_rank" => Some(id.local_rank.to_string()),
            "hostname" => Some(id.hostname.clone()),
            _ => None,
        }
    };
    // Python's idpattern `[_a-z][_a-z0-9]*`, matched case-insensitively (ASCII).
    let ident_len = |s: &str| -> usize {
        let b = s.as_bytes();
        if b.is_empty() || !(b[0] == b'_' || b[0].is_ascii_alphabetic()) {
            return 0;
        }
        b.iter()
            .take_while(|c| **c == b'_' || c.is_ascii_alphanumeric())
            .count()
    };
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        if let Some(inner) = after.strip_prefix('{') {
            let n = ident_len(inner);
            if n > 0 && inner[n..].starts_with('}') {
                if let Some(v) = lookup(&inner[..n]) {
                    out.push_str(&v);
                    rest = &inner[n + 1..];
                    continue;
                }
            }
        } else {
            let n = ident_len(after);
            if n > 0 {
                if let Some(v) = lookup(&after[..n]) {
                    out.push_str(&v);
                    rest = &after[n..];
                    continue;
                }
            }
        }
        out.push('$');
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::super::testutil::id;
    use super::*;

    #[test]
    fn template_substitution() {
        let cases = [
            ("[${rank}|${hostname}]", "[4|vm]"),
            ("${role_name}${local_rank}: ", "default0: "),
            ("$rank-$local_rank", "4-0"),
            (
                "$ranks ${ranks} $$rank ${rank",
                "$ranks ${ranks} $rank ${rank",
            ),
            ("$", "$"),
            ("a$1b", "a$1b"),
            ("${ rank}", "${ rank}"),
            ("[${rank}]:", "[4]:"),
        ];
        for (t, want) in cases {
            assert_eq!(substitute_template(t, &id(0)), want, "template {t:?}");
        }
        assert_eq!(line_prefix(None, &id(3)), "[default3]:");
        assert_eq!(line_prefix(Some("<${rank}> "), &id(3)), "<7> ");
    }
}
