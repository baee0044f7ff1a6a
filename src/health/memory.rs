//! The failure memory between jobs (issue 28 item 4, its file part): whether this node is on
//! an exclude list (`--exclude-nodes-from`, read by `config::resilience`), and appending a bad
//! node's name to `--bad-nodes-file`, one per line, as Slurm's `--exclude=<file>` reads it.

use std::io::Write;
use std::path::Path;

use crate::config::resilience::read_node_file;

/// Whether `node` is on `names`: its full name, or its short name (up to the first dot) against
/// a listed short name.
pub fn listed(node: &str, names: &[String]) -> bool {
    let short = |n: &str| n.split('.').next().unwrap_or(n).to_string();
    names
        .iter()
        .any(|n| n == node || short(n) == short(node) && !n.contains('.'))
}

/// Appends `node` to `path` unless it is already listed there. One `write` of the whole line
/// to a file opened with `O_APPEND`, so nodes of one job that fail at once do not mix their
/// lines. What is there is read within the bound of an exclude list (the file is one, for the
/// next job): a file or device that never ends (`/dev/full`, `/dev/zero`) is an error, not a
/// read without end.
pub fn remember(path: &Path, node: &str) -> std::io::Result<()> {
    let known = match read_node_file(path) {
        Ok(Some(text)) => text.lines().any(|l| l.trim() == node),
        Ok(None) => false,
        Err(why) => return Err(std::io::Error::other(why)),
    };
    if known {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(format!("{node}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_by_full_or_short_name() {
        let names = vec!["n1".to_string(), "gpu7.cluster".to_string()];
        assert!(listed("n1", &names));
        assert!(listed("n1.cluster", &names));
        assert!(listed("gpu7.cluster", &names));
        assert!(!listed("gpu7", &names));
        assert!(!listed("n10", &names));
        assert!(!listed("n1", &[]));
    }

    #[test]
    fn remember_appends_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad");
        remember(&path, "n1").unwrap();
        remember(&path, "n2").unwrap();
        remember(&path, "n1").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "n1\nn2\n");
        assert!(remember(&dir.path().join("no/such/dir"), "n1").is_err());
    }

    /// Issue 38.12: a file that never ends (`/dev/full` reads zeros for ever) is an error once
    /// the bound is read, not a read without end; nothing is written to it.
    #[test]
    fn remember_reads_within_the_bound() {
        let full = Path::new("/dev/full");
        if !full.exists() {
            return;
        }
        let e = remember(full, "n1").unwrap_err().to_string();
        assert!(e.contains("longer than 16 MiB"), "{e}");
    }
}
