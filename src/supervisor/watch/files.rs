//! What an attempt's watching leaves outside the watch task: where its capture files go
//! ([`hang_dir`]) and torch's fatal-dump keys, which a store that outlives an attempt must lose
//! before the next one ([`clear_torch_dump_keys`]).

use std::path::{Path, PathBuf};

/// The store keys torch's ProcessGroupNCCL uses to broadcast a fatal dump to every rank
/// (`kStoreDumpKey`, `kStoreErrorSignalKey`; spec hang-detection §2). They sit at the store root,
/// outside every attempt prefix (torch strips all prefixes first), so a store that outlives an
/// attempt would hand a stale one to the next attempt's ranks: a dump and an abort ~8 minutes
/// into a healthy job. On the wire torch's TCPStore client puts `/` before every key, so the
/// server holds `/exception_dump`; the bare form is what another client may write.
pub(crate) const TORCH_DUMP_KEYS: [&str; 4] = [
    "/exception_dump",
    "/remote_error",
    "exception_dump",
    "remote_error",
];

/// Deletes [`TORCH_DUMP_KEYS`] from a store rdrun hosts; returns those that were there.
pub(crate) fn clear_torch_dump_keys(store: &crate::store::state::Store) -> Vec<&'static str> {
    TORCH_DUMP_KEYS
        .into_iter()
        .filter(|k| store.delete(k.as_bytes()))
        .collect()
}

/// Where an attempt's hang files go (module doc).
pub(crate) fn hang_dir(
    log_dir: Option<&Path>,
    attempt_dir: Option<&Path>,
    run_id: &str,
    attempt: u32,
    temp: &Path,
) -> PathBuf {
    match (log_dir, attempt_dir) {
        (Some(d), Some(a)) if d != Path::new("/dev/null") => a.join("hang"),
        _ => {
            let safe: String = run_id
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            temp.join(format!("rdrun-hang-{safe}-{}", std::process::id()))
                .join(format!("attempt_{attempt}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_dump_keys_are_deleted_and_nothing_else() {
        let store = crate::store::state::Store::new();
        // As torch's TCPStore client writes them (a `/` before the key), and bare.
        store.set(b"/exception_dump".to_vec(), 1i32.to_le_bytes().to_vec());
        store.set(b"/remote_error".to_vec(), b"rank 1".to_vec());
        store.set(b"exception_dump".to_vec(), b"x".to_vec());
        store.set(b"/worker/attempt_0/exception_dump".to_vec(), b"x".to_vec());
        assert_eq!(
            clear_torch_dump_keys(&store),
            ["/exception_dump", "/remote_error", "exception_dump"]
        );
        assert!(store.get(b"/exception_dump").is_none() && store.get(b"/remote_error").is_none());
        assert!(store.get(b"/worker/attempt_0/exception_dump").is_some());
        assert!(
            clear_torch_dump_keys(&store).is_empty(),
            "second time: nothing left"
        );
    }

    #[test]
    fn files_go_under_the_log_dir_else_a_named_temp_dir() {
        let a = Path::new("/logs/run/attempt_1");
        assert_eq!(
            hang_dir(
                Some(Path::new("/logs")),
                Some(a),
                "x",
                1,
                &std::env::temp_dir()
            ),
            a.join("hang")
        );
        let t = hang_dir(None, Some(a), "a/b", 2, &std::env::temp_dir());
        assert!(t.starts_with(std::env::temp_dir()), "{t:?}");
        assert!(t.ends_with("attempt_2"), "{t:?}");
        let name = t.parent().unwrap().file_name().unwrap().to_string_lossy();
        assert!(name.starts_with("rdrun-hang-a_b-"), "{name}");
        let n = hang_dir(
            Some(Path::new("/dev/null")),
            None,
            "x",
            0,
            &std::env::temp_dir(),
        );
        assert!(n.starts_with(std::env::temp_dir()), "{n:?}");
    }
}
