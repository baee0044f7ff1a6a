//! Making a pip-installed NCCL loadable by cudarc (launcher side; no CUDA needed to build).
//!
//! cudarc's dynamic loader only tries unversioned names (`libnccl.so`, `libnccl64*.so`,
//! `libnccl.so.13`...), never `libnccl.so.2` — the only file the pip wheel `nvidia-nccl-cu*`
//! ships (`nvidia/nccl/lib/libnccl.so.2`). Preloading by absolute path does not help, because
//! later dlopens match the SONAME. The fix (spec runtime.md §1.4, tested there): a directory
//! holding `libnccl.so -> .../libnccl.so.2`, prepended to the workers' `LD_LIBRARY_PATH`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the wheel puts the library, relative to a site-packages directory.
pub const PIP_NCCL_REL: &str = "nvidia/nccl/lib/libnccl.so.2";

/// The first `site-packages` directory (in order) that holds the pip NCCL library.
pub fn find_pip_nccl(site_packages: &[PathBuf]) -> Option<PathBuf> {
    site_packages
        .iter()
        .map(|sp| sp.join(PIP_NCCL_REL))
        .find(|p| p.is_file())
}

/// Creates `<run_dir>/nccl-lib/libnccl.so -> lib` (replacing an old link) and returns the
/// directory to prepend to `LD_LIBRARY_PATH`.
pub fn make_nccl_shim(lib: &Path, run_dir: &Path) -> std::io::Result<PathBuf> {
    let dir = run_dir.join("nccl-lib");
    std::fs::create_dir_all(&dir)?;
    let link = dir.join("libnccl.so");
    match std::fs::remove_file(&link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::os::unix::fs::symlink(lib, &link)?;
    Ok(dir)
}

/// `dir` prepended to an existing `LD_LIBRARY_PATH` value (an empty value adds nothing).
pub fn prepend_ld_library_path(dir: &Path, existing: Option<&std::ffi::OsStr>) -> OsString {
    let mut v = OsString::from(dir);
    if let Some(e) = existing.filter(|e| !e.is_empty()) {
        v.push(":");
        v.push(e);
    }
    v
}

/// The site-packages directories of a Python interpreter (runs it once; empty on failure).
pub fn python_site_packages(python: &Path) -> Vec<PathBuf> {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import site,sys\nfor p in site.getsitepackages()+[site.getusersitepackages()]+sys.path: print(p)",
        ])
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// One step for the launcher: find the pip NCCL for `python`, build the shim under `run_dir`,
/// return the new `LD_LIBRARY_PATH` value (None when no pip NCCL is installed).
pub fn pip_nccl_ld_library_path(
    python: &Path,
    run_dir: &Path,
    existing: Option<&std::ffi::OsStr>,
) -> std::io::Result<Option<OsString>> {
    let Some(lib) = find_pip_nccl(&python_site_packages(python)) else {
        return Ok(None);
    };
    let dir = make_nccl_shim(&lib, run_dir)?;
    Ok(Some(prepend_ld_library_path(&dir, existing)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_tree() {
        let root = std::env::temp_dir().join(format!("rdrun-nccl-{}", std::process::id()));
        let sp1 = root.join("venv/lib/python3.12/site-packages");
        let sp2 = root.join("user/site-packages");
        std::fs::create_dir_all(sp2.join("nvidia/nccl/lib")).unwrap();
        std::fs::create_dir_all(&sp1).unwrap();
        std::fs::write(sp2.join(PIP_NCCL_REL), b"elf").unwrap();
        assert_eq!(find_pip_nccl(std::slice::from_ref(&sp1)), None);
        let lib = find_pip_nccl(&[sp1, sp2.clone()]).unwrap();
        assert_eq!(lib, sp2.join(PIP_NCCL_REL));
        let run = root.join("run");
        let dir = make_nccl_shim(&lib, &run).unwrap();
        let dir2 = make_nccl_shim(&lib, &run).unwrap(); // idempotent
        assert_eq!(dir, dir2);
        assert_eq!(std::fs::read_link(dir.join("libnccl.so")).unwrap(), lib);
        assert_eq!(std::fs::read(dir.join("libnccl.so")).unwrap(), b"elf");
        assert_eq!(
            prepend_ld_library_path(&dir, Some(std::ffi::OsStr::new("/a:/b"))),
            OsString::from(format!("{}:/a:/b", dir.display()))
        );
        assert_eq!(
            prepend_ld_library_path(&dir, Some(std::ffi::OsStr::new(""))),
            OsString::from(dir.as_os_str())
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn missing_python_finds_nothing() {
        assert!(python_site_packages(Path::new("/nonexistent/python3")).is_empty());
        let r = pip_nccl_ld_library_path(
            Path::new("/nonexistent/python3"),
            &std::env::temp_dir(),
            None,
        );
        assert!(matches!(r, Ok(None)));
    }
}
