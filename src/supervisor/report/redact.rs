//! Secrets out of every command line rdrun writes (issue 38 item 8): a process's arguments are
//! shown in WARN lines (processes left behind, for one), and a debugger adapter's
//! `--server-access-token`, a `--password=…` or a `https://user:pass@host` would otherwise land
//! in the console, the log directory and the events file.
//!
//! What counts as secret-looking, by the argument's name (case-insensitive): it contains
//! `token`, `password`, `passwd`, `secret`, `credential`, `auth`, `api-key`/`api_key`/`apikey`,
//! `private-key`, or is `key`/`--key`. The value goes as `***`, whether it follows the flag as
//! the next argument or after `=` (`--token=…`, `TOKEN=…`). A URL's password (`scheme://user:pw@`)
//! goes too. Names are kept, so the line still says what the process is.
//!
//! Hand-written: the rule is a few name fragments over an argv; no crate scrubs argv vectors.

const SECRET_WORDS: &[&str] = &[
    "token",
    "password",
    "passwd",
    "secret",
    "credential",
    "auth",
    "api-key",
    "api_key",
    "apikey",
    "private-key",
    "private_key",
];

/// What replaces a secret value.
pub const MASK: &str = "***";

/// Whether an option or variable name (without its leading dashes) names a secret.
fn secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "key" || SECRET_WORDS.iter().any(|w| lower.contains(w))
}

/// `scheme://user:password@host…` → `scheme://user:***@host…`; other text as is.
fn redact_url(arg: &str) -> String {
    let Some(scheme_end) = arg.find("://") else {
        return arg.to_string();
    };
    let rest = &arg[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return arg.to_string();
    };
    let Some(colon) = authority[..at].find(':') else {
        return arg.to_string();
    };
    format!(
        "{}{}:{MASK}{}",
        &arg[..scheme_end + 3],
        &authority[..colon],
        &rest[at..]
    )
}

/// The arguments with every secret-looking value masked (module doc).
pub fn redact_args<S: AsRef<str>>(args: &[S]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut mask_next = false;
    for arg in args.iter().map(AsRef::as_ref) {
        if mask_next {
            mask_next = false;
            if !arg.starts_with('-') {
                out.push(MASK.to_string());
                continue;
            }
        }
        let bare = arg.trim_start_matches('-');
        let is_flag = arg.starts_with('-') && !bare.is_empty();
        match bare.split_once('=') {
            Some((name, _)) if secret_name(name) && (is_flag || is_var_name(name)) => {
                out.push(format!(
                    "{}={MASK}",
                    &arg[..arg.len() - bare.len() + name.len()]
                ));
            }
            None if is_flag && secret_name(bare) => {
                out.push(arg.to_string());
                mask_next = true;
            }
            _ => out.push(redact_url(arg)),
        }
    }
    out
}

/// `NAME` of a `NAME=value` argument that reads as an environment variable (letters, digits,
/// `_`), so that an ordinary argument containing `=` is left alone unless it is a flag.
fn is_var_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// A command line as `/proc/<pid>/cmdline` holds it (arguments split by NUL) → the arguments
/// joined by spaces, secrets masked.
pub fn redacted_cmdline(raw: &str) -> String {
    let args: Vec<&str> = raw.trim_end_matches('\0').split('\0').collect();
    redact_args(&args).join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(line: &str) -> String {
        redact_args(&line.split(' ').collect::<Vec<_>>()).join(" ")
    }

    #[test]
    fn debugpy_adapter_token_is_masked() {
        // The adapter's command line as debugpy 1.8 starts it (issue 38 item 8).
        assert_eq!(
            r(
                "python -m debugpy.adapter --for-server 5679 --host 127.0.0.1 --port 5678 \
               --server-access-token 0f3c9a2b77d1e0aa"
            ),
            "python -m debugpy.adapter --for-server 5679 --host 127.0.0.1 --port 5678 \
             --server-access-token ***"
        );
    }

    #[test]
    fn flags_variables_and_urls() {
        assert_eq!(r("app --password=hunter2 -v"), "app --password=*** -v");
        assert_eq!(
            r("app --api-key abc --keys 3"),
            "app --api-key *** --keys 3"
        );
        assert_eq!(r("app --key k1 --token"), "app --key *** --token");
        assert_eq!(r("env HF_TOKEN=hf_x A=1 run"), "env HF_TOKEN=*** A=1 run");
        assert_eq!(
            r("git clone https://bob:s3cret@example.com/x.git"),
            "git clone https://bob:***@example.com/x.git"
        );
        // Nothing secret: unchanged, a flag after a secret flag is not taken as its value.
        assert_eq!(
            r("python train.py --lr 0.1 --out=a=b"),
            "python train.py --lr 0.1 --out=a=b"
        );
        assert_eq!(
            r("app --auth-token --verbose x"),
            "app --auth-token --verbose x"
        );
        assert_eq!(
            r("https://example.com:8080/a@b"),
            "https://example.com:8080/a@b"
        );
    }

    #[test]
    fn proc_cmdline_form() {
        assert_eq!(
            redacted_cmdline("python\0-m\0x\0--token\0abc\0"),
            "python -m x --token ***"
        );
    }
}
