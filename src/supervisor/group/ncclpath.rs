//! Making a pip-installed NCCL loadable by workers that use cudarc (the `nccl` runtime backend).
//!
//! cudarc's dynamic loader only tries unversioned names (`libnccl.so`, …), never `libnccl.so.2`,
//! the only file the pip wheel `nvidia-nccl-cu*` ships (`nvidia/nccl/lib/libnccl.so.2`); and
//! preloading by absolute path does not help, because later dlopens match the SONAME (spec
//! runtime.md §1.4). The fix: a directory holding `libnccl.so -> …/libnccl.so.2`, prepended to the
//! workers' `LD_LIBRARY_PATH`.
//!
//! Launch speed matters, so the Python environment is found from the interpreter's path (the
//! `<prefix>/lib/python3.*/site-packages` layout of venvs and CPython installs) without starting
//! Python. The shim directory is a per-user cache keyed by the library's path, created once with
//! an atomic rename, so concurrent launches share it and nothing per run is left behind.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// Where the wheel puts the library, relative to a site-packages directory.
pub const PIP_NCCL_REL: &str = "nvidia/nccl/lib/libnccl.so.2";

/// The site-packages directories of the Python installation that `python` belongs to, found
/// from its path (and the path it links to): `<prefix>/lib/python3.*/site-packages`.
pub fn site_packages_of(python: &Path) -> Vec<PathBuf> {
    let mut prefixes = Vec::new();
    let mut push_prefix = |p: &Path| {
        if let Some(prefix) = p.parent().and_then(Path::parent) {
            if !prefixes.iter().any(|q: &PathBuf| q == prefix) {
                prefixes.push(prefix.to_path_buf());
            }
        }
    };
    push_prefix(python);
    if let Ok(real) = std::fs::canonicalize(python) {
        push_prefix(&real);
    }
    let mut out = Vec::new();
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path().join("site-packages"))
            .filter(|p| p.is_dir())
            .collect();
        found.sort();
        out.extend(found);
    }
    out
}

/// The first site-packages directory (in order) that holds the pip NCCL library.
pub fn find_pip_nccl(site_packages: &[PathBuf]) -> Option<PathBuf> {
    site_packages
        .iter()
        .map(|sp| sp.join(PIP_NCCL_REL))
        .find(|p| p.is_file())
}

/// Makes `<cache>/nccl-<hash>/libnccl.so -> lib` exist and returns that directory.
///
/// The link is created under a temporary name and renamed into place, so concurrent launches
/// never see a half-made directory.
pub fn make_nccl_shim(lib: &Path, cache: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let dir = cache.join(format!(
        "nccl-{:016x}",
        crate::workerenv::fnv1a(lib.as_os_str().as_bytes())
    ));
    let link = dir.join("libnccl.so");
    if std::fs::read_link(&link).is_ok_and(|target| target == lib) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".libnccl.so.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(lib, &tmp)?;
    std::fs::rename(&tmp, &link)?;
    Ok(dir)
}

/// `dir` prepended to an existing `LD_LIBRARY_PATH` value (an empty value adds nothing).
pub fn prepend_ld_library_path(dir: &Path, existing: Option<&OsStr>) -> OsString {
    let mut v = OsString::from(dir);
    if let Some(e) = existing.filter(|e| !e.is_empty()) {
        v.push(":");
        v.push(e);
    }
    v
}

/// One step for the launcher: the `LD_LIBRARY_PATH` value that makes the pip NCCL of `python`'s
/// environment loadable, or `None` when that environment has no pip NCCL.
pub fn pip_nccl_ld_library_path(
    python: &Path,
    cache: &Path,
    existing: Option<&OsStr>,
) -> std::io::Result<Option<OsString>> {
    let Some(lib) = find_pip_nccl(&site_packages_of(python)) else {
        return Ok(None);
    };
    let dir = make_nccl_shim(&lib, cache)?;
    Ok(Some(prepend_ld_library_path(&dir, existing)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_venv_tree() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        let venv = root.join("venv");
        let sp = venv.join("lib/python3.11/site-packages");
        std::fs::create_dir_all(sp.join("nvidia/nccl/lib")).expect("mkdir");
        std::fs::create_dir_all(venv.join("bin")).expect("mkdir");
        std::fs::write(venv.join("bin/python"), b"").expect("write");
        std::fs::write(sp.join(PIP_NCCL_REL), b"elf").expect("write");

        assert_eq!(site_packages_of(&venv.join("bin/python")), vec![sp.clone()]);
        let cache = root.join("cache");
        let v =
            pip_nccl_ld_library_path(&venv.join("bin/python"), &cache, Some(OsStr::new("/a:/b")))
                .expect("shim")
                .expect("found");
        let v = v.to_string_lossy().to_string();
        let dir = PathBuf::from(v.split(':').next().expect("first"));
        assert!(v.ends_with(":/a:/b"), "{v}");
        assert_eq!(
            std::fs::read_link(dir.join("libnccl.so")).expect("link"),
            sp.join(PIP_NCCL_REL)
        );
        assert_eq!(std::fs::read(dir.join("libnccl.so")).expect("read"), b"elf");
        // Idempotent: a second launch reuses the same directory.
        assert_eq!(
            make_nccl_shim(&sp.join(PIP_NCCL_REL), &cache).expect("again"),
            dir
        );
        assert_eq!(
            prepend_ld_library_path(&dir, Some(OsStr::new(""))),
            OsString::from(dir.as_os_str())
        );
    }

    #[test]
    fn no_pip_nccl_finds_nothing() {
        let r = pip_nccl_ld_library_path(
            Path::new("/nonexistent/bin/python3"),
            &std::env::temp_dir(),
            None,
        );
        assert!(matches!(r, Ok(None)));
    }
}
