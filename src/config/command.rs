//! The command each worker runs: the entry point kind (script, module, program, `--run-path`),
//! the program lookup (`execvp` rules), the Python interpreter lookup, and the `--run-path`
//! bootstrap program (`run_path_bootstrap.py`, embedded).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::host::{FileKind, Host};
use crate::cli::{EnvFn, LaunchArgs};

/// How the worker program is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntrypointKind {
    /// `python -u script.py args…`.
    PythonScript,
    /// `python -u -m module args…`.
    PythonModule,
    /// Exec the program directly (`--no-python`, or a non-`.py` executable).
    Exec,
    /// `--run-path`: `python -u -c <bootstrap>` running the script with runpy, error file always written.
    RunPath,
}

/// The command each worker runs, before `${local_rank}` substitution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    pub kind: EntrypointKind,
    /// Program to exec (the Python interpreter, or the program itself).
    pub program: PathBuf,
    /// Full argv after the program (e.g. `["-u", "train.py", "--lr", "0.1"]`), bytes as typed.
    pub args: Vec<std::ffi::OsString>,
    /// Name used in the failure report title (script as typed, module, or binary).
    pub display_name: String,
    /// The launch's Python environment, resolved here once: the interpreter of a Python launch,
    /// else the one a Python launch would use (`PYTHON_EXEC`, `$VIRTUAL_ENV`, `python3` on PATH;
    /// `None` when there is none). The supervisor looks there for pip's NCCL.
    pub python: Option<PathBuf>,
}

/// The `python -u -c` program behind `--run-path` (spec §3.10): argv as `python script args`,
/// the script's directory first on `sys.path` as for `python script.py`, `runpy.run_path(script,
/// run_name="__main__")`, and on an uncaught exception the TORCHELASTIC_ERROR_FILE JSON of
/// torch's `@record` (spec §3.9): `{"message": {"message": "<Type>: <str>", "extraInfo":
/// {"py_callstack": <traceback>, "timestamp": "<epoch s>"}}}`. `SystemExit` passes through
/// unrecorded, as under `@record`.
pub const RUN_PATH_BOOTSTRAP: &str = include_str!("run_path_bootstrap.py");

/// Finds `name` the way `execvp` does: a name with a `/` is a path; otherwise the first
/// executable regular file in the PATH directories.
pub fn find_program(name: impl AsRef<OsStr>, env: EnvFn<'_>, host: &dyn Host) -> Option<PathBuf> {
    let name = name.as_ref();
    if name.is_empty() {
        return None;
    }
    if has_slash(name) {
        return matches!(host.file(Path::new(name)), FileKind::File { .. }).then(|| name.into());
    }
    let path = env("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    path.split(':').find_map(|dir| {
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = Path::new(dir).join(name);
        matches!(host.file(&candidate), FileKind::File { executable: true }).then_some(candidate)
    })
}

fn has_slash(name: &OsStr) -> bool {
    name.as_bytes().contains(&b'/')
}

/// The interpreter for Python workers: `$PYTHON_EXEC`, else `$VIRTUAL_ENV/bin/python`, else
/// `python3` then `python` on PATH (spec §6: rdrun has no `sys.executable` of its own).
pub fn find_python(env: EnvFn<'_>, host: &dyn Host) -> Result<PathBuf, ConfigError> {
    if let Some(exec) = env("PYTHON_EXEC").filter(|p| !p.is_empty()) {
        return find_program(&exec, env, host)
            .filter(|p| matches!(host.file(p), FileKind::File { executable: true }))
            .ok_or_else(|| ConfigError::PythonNotFound(format!("PYTHON_EXEC={exec}")));
    }
    if let Some(venv) = env("VIRTUAL_ENV").filter(|p| !p.is_empty()) {
        let p = Path::new(&venv).join("bin").join("python");
        if matches!(host.file(&p), FileKind::File { executable: true }) {
            return Ok(p);
        }
    }
    ["python3", "python"]
        .iter()
        .find_map(|n| find_program(n, env, host))
        .ok_or_else(|| {
            ConfigError::PythonNotFound(
                "no python3 or python on PATH (set PYTHON_EXEC or activate a virtualenv)".into(),
            )
        })
}

/// The worker command (spec §1.3 step 10, §6) and the improvement of issue #2: a program that
/// is not a `.py` file and is executable runs directly even without `--no-python`.
pub fn resolve_command(
    args: &LaunchArgs,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<WorkerCommand, ConfigError> {
    // The script and its arguments stay bytes (they reach execve as typed); only the name in
    // messages and the report is text.
    let script = args.training_script.as_os_str();
    let name = script.to_string_lossy().into_owned();
    let rest = args.training_script_args.iter().cloned();
    let words = |w: &[&str]| w.iter().map(OsString::from).collect::<Vec<_>>();
    let require_script = || match host.file(Path::new(script)) {
        FileKind::File { .. } => Ok(()),
        _ => Err(ConfigError::ScriptNotFound(name.clone())),
    };
    if args.run_path {
        require_script()?;
        let mut a = words(&["-u", "-c", RUN_PATH_BOOTSTRAP]);
        a.push(script.to_owned());
        a.extend(rest);
        let python = find_python(env, host)?;
        return Ok(WorkerCommand {
            kind: EntrypointKind::RunPath,
            program: python.clone(),
            args: a,
            display_name: "run_script_path".into(),
            python: Some(python),
        });
    }
    if args.no_python && args.module {
        return Err(ConfigError::ModuleWithNoPython);
    }
    if args.module {
        let mut a = words(&["-u", "-m"]);
        a.push(script.to_owned());
        a.extend(rest);
        let python = find_python(env, host)?;
        return Ok(WorkerCommand {
            kind: EntrypointKind::PythonModule,
            program: python.clone(),
            args: a,
            display_name: name.clone(),
            python: Some(python),
        });
    }
    let exec = |program: PathBuf| WorkerCommand {
        kind: EntrypointKind::Exec,
        program,
        args: args.training_script_args.clone(),
        display_name: name.clone(),
        // A program run directly may still use the Python environment's NCCL (see the field).
        python: find_python(env, host).ok(),
    };
    let python_script = || -> Result<WorkerCommand, ConfigError> {
        let mut a = words(&["-u"]);
        a.push(script.to_owned());
        a.extend(args.training_script_args.iter().cloned());
        let python = find_python(env, host)?;
        Ok(WorkerCommand {
            kind: EntrypointKind::PythonScript,
            program: python.clone(),
            args: a,
            display_name: name.clone(),
            python: Some(python),
        })
    };
    if args.no_python {
        return match find_program(script, env, host) {
            Some(p) if matches!(host.file(&p), FileKind::File { executable: true }) => Ok(exec(p)),
            Some(_) => Err(ConfigError::NotExecutable(name)),
            None => Err(ConfigError::ProgramNotFound(name)),
        };
    }
    if script.as_bytes().ends_with(b".py") {
        require_script()?;
        return python_script();
    }
    // Not a .py file: an existing file runs directly when executable, else under python (as
    // torchrun); a bare name that is no file here is looked up on PATH.
    match host.file(Path::new(script)) {
        FileKind::File { executable: true } => {
            let program = if has_slash(script) {
                PathBuf::from(script)
            } else {
                // execvp would search PATH for a bare name; the file meant is the one here.
                Path::new(".").join(script)
            };
            Ok(exec(program))
        }
        FileKind::File { executable: false } => python_script(),
        FileKind::Dir => {
            // `python dir` runs dir/__main__.py, as torchrun would.
            python_script()
        }
        FileKind::Missing => match find_program(script, env, host).filter(|_| !has_slash(script)) {
            Some(p) => Ok(exec(p)),
            None => Err(ConfigError::ScriptNotFound(name)),
        },
    }
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
