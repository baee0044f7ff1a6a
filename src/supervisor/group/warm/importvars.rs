//! The variables read while the warm-start template starts and imports (docs/warm-start.md
//! "What is fixed at import time"): which they are, and the rule that a worker whose value of
//! one differs from the template's is spawned cold; the template's own environment (the first
//! worker's without the per-rank variables).

/// Prefixes of the variables read while the template starts and imports torch: a worker whose
/// value differs from the template's would silently get the template's, so it is spawned cold
/// instead. Measured with `scripts/import-env-vars.py` (getenv(3) interposed, `os.environ`
/// lookups recorded; torch 2.15, numpy 2.4; the per-variable list is in docs/warm-start.md),
/// plus what glibc and the dynamic loader read internally, which no interposer sees (`LD_`,
/// `MALLOC_`, `GLIBC_`, the locale). A whole family is listed where the measurement found some
/// of its members: other versions read other members.
pub const IMPORT_TIME_PREFIXES: &[&str] = &[
    // The interpreter at start-up; the loader, allocator, tunables and locale (glibc).
    "PYTHON",
    "_PYTHON",
    "LD_",
    "MALLOC_",
    "GLIBC_",
    "LC_",
    // OpenMP (libgomp, Intel's), BLAS and oneDNN, at library load.
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL_",
    "MKLDNN_",
    "DNNL_",
    "ONEDNN_",
    "OPENBLAS_",
    "GOTO_",
    "BLIS_",
    "GFORTRAN_",
    // MPI sizes MKL reads at load.
    "I_MPI_",
    "OMPI_",
    // numpy's CPU dispatch and allocator.
    "NPY_",
    "NUMPY_",
    // torch (C++ and Python), its compilers and profilers at import.
    "TORCH_",
    "TORCHDYNAMO_",
    "TORCHINDUCTOR_",
    "TORCHEXPORT_",
    "PYTORCH_",
    // What the DDP preload list (torch._dynamo, torch._inductor) reads at its import.
    "INDUCTOR_",
    "AOT_INDUCTOR_",
    "AOTINDUCTOR_",
    "TRITON_",
    "SYMPY_",
    "MPMATH_",
    "FX_",
    "COMPILE_STROBELIGHT_",
    "KINETO_",
    // CUDA and ROCm libraries loaded by `import torch`.
    "CUDA_",
    "CUBLAS",
    "NVRTC_",
    "LIBNVVM_",
    "NV_",
    "NVIDIA_",
    "HIP_",
    "ROCR_",
    "LLVM_",
    "OPENSSL_",
];

/// Single variables read at import (same measurement) outside the families above.
pub const IMPORT_TIME_NAMES: &[&str] = &[
    "LANG",
    "HOME",
    "MPI_LOCALNRANKS",
    "INTEL_LIBITTNOTIFY64",
    "ACC_DEVICE_NUM",
    "ACC_DEVICE_TYPE",
    "GLIBCXX_TUNABLES",
    "AS_SECURE_LOG_FILE",
    "CASK_LOG_INFO",
];

/// Whether `name` is read when the template starts or imports (so it must be the worker's).
pub fn read_at_import(name: &str) -> bool {
    IMPORT_TIME_NAMES.contains(&name) || IMPORT_TIME_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The template's overlay: the first worker's, without the per-rank and per-attempt variables.
pub(super) fn template_env(overlay: &[(String, String)]) -> Vec<(String, String)> {
    overlay
        .iter()
        .filter(|(k, _)| !crate::workerenv::CONTRACT_VARS.contains(&k.as_str()))
        .cloned()
        .collect()
}

/// The first import-time variable whose value in `worker` differs from the template's.
pub(super) fn import_time_difference(
    template: &[(String, String)],
    worker: &[(String, String)],
) -> Option<String> {
    let get = |set: &[(String, String)], k: &str| {
        set.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    let mut names: Vec<&str> = template
        .iter()
        .chain(worker)
        .map(|(k, _)| k.as_str())
        .filter(|k| read_at_import(k))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .find(|k| get(template, k) != get(worker, k))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_template_gets_no_per_rank_variables() {
        let env = template_env(&pairs(&[
            ("RANK", "1"),
            ("LOCAL_RANK", "1"),
            ("TORCHELASTIC_RESTART_COUNT", "0"),
            ("OMP_NUM_THREADS", "1"),
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        ]));
        assert_eq!(
            env,
            pairs(&[
                ("OMP_NUM_THREADS", "1"),
                ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
            ])
        );
    }

    #[test]
    fn import_time_variables_must_match() {
        let t = pairs(&[("OMP_NUM_THREADS", "1"), ("RANK", "0")]);
        // Per-rank variables read later are no difference.
        assert_eq!(
            import_time_difference(&t, &pairs(&[("OMP_NUM_THREADS", "1"), ("RANK", "3")])),
            None
        );
        assert_eq!(
            import_time_difference(&t, &pairs(&[("OMP_NUM_THREADS", "2")])),
            Some("OMP_NUM_THREADS".into())
        );
        // Present in one only (the --virtual-local-rank device list).
        assert_eq!(
            import_time_difference(
                &t,
                &pairs(&[("OMP_NUM_THREADS", "1"), ("CUDA_VISIBLE_DEVICES", "1")])
            ),
            Some("CUDA_VISIBLE_DEVICES".into())
        );
        // The last value of a name counts (the overlay's override).
        assert_eq!(
            import_time_difference(
                &t,
                &pairs(&[("OMP_NUM_THREADS", "4"), ("OMP_NUM_THREADS", "1")])
            ),
            None
        );
    }

    #[test]
    fn measured_import_time_variables_are_covered() {
        // A sample of what scripts/import-env-vars.py found read during `import torch`.
        for name in [
            "OMP_NUM_THREADS",
            "GOMP_SPINCOUNT",
            "MKL_NUM_THREADS",
            "MKLDNN_VERBOSE",
            "OPENBLAS_NUM_THREADS",
            "NPY_DISABLE_CPU_FEATURES",
            "TORCH_SHOW_CPP_STACKTRACES",
            "TORCH_LOGS",
            "TORCHDYNAMO_TRANSLATION_VALIDATION",
            "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
            "PYTORCH_CUDA_ALLOC_CONF",
            "KINETO_USE_DAEMON",
            "CUBLAS_LOGINFO_DBG",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            "MPI_LOCALNRANKS",
            "PYTHONHASHSEED",
            "LC_ALL",
            "LANG",
            // With --preload torch._dynamo,torch._inductor,torch.onnx.
            "TRITON_INTERPRET",
            "AOT_INDUCTOR_DEBUG_COMPILE",
            "SYMPY_USE_CACHE",
            "CUDA_VISIBLE_DEVICES",
        ] {
            assert!(read_at_import(name), "{name}");
        }
        assert!(!read_at_import("RANK"));
        assert!(!read_at_import("GLOO_SOCKET_IFNAME"));
    }

    /// The template is started without the per-rank contract variables: that is only right
    /// while none of them is read at import (measured: WORLD_SIZE and MASTER_* at first use).
    #[test]
    fn no_contract_variable_is_read_at_import() {
        for name in crate::workerenv::CONTRACT_VARS {
            assert!(!read_at_import(name), "{name}");
        }
    }
}
