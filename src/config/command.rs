//! The command each worker runs: the entry point kind (script, module, program, `--run-path`),
//! the program lookup (`execvp` rules), the Python interpreter lookup, and the `--run-path`
//! bootstrap program (`run_path_bootstrap.py`, embedded).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{ConfigError, EntrypointKind, FileKind, Host, WorkerCommand};
use crate::cli::{EnvFn, LaunchArgs};

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
mod tests {
    use super::super::testkit::*;
    use super::super::RealHost;
    use super::*;

    fn command(argv: &[&str], env: &[(&str, &str)]) -> Result<WorkerCommand, ConfigError> {
        resolve_command(&args(argv), &env_of(env), &FakeHost::new())
    }

    #[test]
    fn worker_commands() {
        use EntrypointKind::*;
        let s = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        type Case<'a> = (
            &'a [&'a str],
            &'a [(&'a str, &'a str)],
            EntrypointKind,
            &'a str,
            &'a [&'a str],
            &'a str,
        );
        let cases: &[Case] = &[
            (
                &["t.py", "a", "${local_rank}"],
                &[],
                PythonScript,
                "/usr/bin/python3",
                &["-u", "t.py", "a", "${local_rank}"],
                "t.py",
            ),
            (
                &["t.py"],
                &[("VIRTUAL_ENV", "/venv")],
                PythonScript,
                "/venv/bin/python",
                &["-u", "t.py"],
                "t.py",
            ),
            (
                &["t.py"],
                &[("PYTHON_EXEC", "/opt/py"), ("VIRTUAL_ENV", "/venv")],
                PythonScript,
                "/opt/py",
                &["-u", "t.py"],
                "t.py",
            ),
            (
                &["t.py"],
                &[("PYTHON_EXEC", "python3")],
                PythonScript,
                "/usr/bin/python3",
                &["-u", "t.py"],
                "t.py",
            ),
            (
                &["-m", "pkg.mod", "x"],
                &[],
                PythonModule,
                "/usr/bin/python3",
                &["-u", "-m", "pkg.mod", "x"],
                "pkg.mod",
            ),
            (
                &["--no-python", "true", "x"],
                &[],
                Exec,
                "/bin/true",
                &["x"],
                "true",
            ),
            (
                &["--no-python", "./prog"],
                &[],
                Exec,
                "./prog",
                &[],
                "./prog",
            ),
            (
                &["train", "--lr", "1"],
                &[],
                Exec,
                "/usr/bin/train",
                &["--lr", "1"],
                "train",
            ),
            (&["./prog", "a"], &[], Exec, "./prog", &["a"], "./prog"),
            (&["localbin"], &[], Exec, "./localbin", &[], "localbin"),
            (
                &["script", "a"],
                &[],
                PythonScript,
                "/usr/bin/python3",
                &["-u", "script", "a"],
                "script",
            ),
            (
                &["--run-path", "-m", "t.py", "a"],
                &[],
                RunPath,
                "/usr/bin/python3",
                &["-u", "-c", RUN_PATH_BOOTSTRAP, "t.py", "a"],
                "run_script_path",
            ),
            (
                &["--run-path", "--no-python", "t.py"],
                &[],
                RunPath,
                "/usr/bin/python3",
                &["-u", "-c", RUN_PATH_BOOTSTRAP, "t.py"],
                "run_script_path",
            ),
        ];
        for (argv, env, kind, program, a, name) in cases {
            let c = command(argv, env).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            assert_eq!(c.kind, *kind, "{argv:?}");
            assert_eq!(c.program, PathBuf::from(program), "{argv:?}");
            assert_eq!(c.args, s(a), "{argv:?}");
            assert_eq!(c.display_name, *name, "{argv:?}");
        }
    }

    #[test]
    fn python_environment_is_resolved_once() {
        let py = Some(PathBuf::from("/usr/bin/python3"));
        assert_eq!(command(&["t.py"], &[]).unwrap().python, py);
        assert_eq!(command(&["--run-path", "t.py"], &[]).unwrap().python, py);
        // A program run directly: the python a Python launch would use, if any.
        assert_eq!(command(&["./prog"], &[]).unwrap().python, py);
        let venv = command(&["./prog"], &[("VIRTUAL_ENV", "/venv")]).unwrap();
        assert_eq!(venv.python, Some(PathBuf::from("/venv/bin/python")));
        let none = command(&["--no-python", "./prog"], &[("PATH", "/nowhere")]).unwrap();
        assert_eq!(none.python, None);
    }

    #[test]
    fn worker_command_errors() {
        type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str, i32);
        let cases: &[Case] = &[
            (&["missing.py"], &[], "training script not found: missing.py", 1),
            (&["--run-path", "missing.py"], &[], "training script not found: missing.py", 1),
            (&["nothing-here"], &[], "training script not found: nothing-here", 1),
            (&["./nothing"], &[], "training script not found: ./nothing", 1),
            (&["--no-python", "nope"], &[], "program not found: nope (no such file, and not an executable on PATH)", 1),
            (&["--no-python", "./data.txt"], &[], "program is not executable: ./data.txt", 1),
            (
                &["--no-python", "-m", "x"],
                &[],
                "don't use both the '--no-python' flag and the '--module' flag at the same time",
                2,
            ),
            (&["t.py"], &[("PYTHON_EXEC", "/missing/python")], "python interpreter not found: PYTHON_EXEC=/missing/python", 1),
            (&["t.py"], &[("PYTHON_EXEC", "./data.txt")], "python interpreter not found: PYTHON_EXEC=./data.txt", 1),
            (
                &["t.py"],
                &[("PATH", "/nowhere")],
                "python interpreter not found: no python3 or python on PATH (set PYTHON_EXEC or activate a virtualenv)",
                1,
            ),
        ];
        for (argv, env, msg, code) in cases {
            let e = command(argv, env).unwrap_err();
            assert_eq!(e.to_string(), *msg, "{argv:?}");
            assert_eq!(e.exit_code(), *code, "{argv:?}");
        }
        // A missing virtualenv python falls through to PATH.
        let c = command(&["t.py"], &[("VIRTUAL_ENV", "/gone")]).unwrap();
        assert_eq!(c.program, PathBuf::from("/usr/bin/python3"));
    }

    /// The `--run-path` bootstrap writes torch's error-file JSON; needs a python3 on PATH.
    #[test]
    fn run_path_bootstrap_writes_error_file() {
        let Some(python) = find_program("python3", &crate::config::process_env, &RealHost) else {
            eprintln!("skipped: no python3 on PATH");
            return;
        };
        let tmp = tempfile::Builder::new()
            .prefix("rdrun-bootstrap-")
            .tempdir()
            .expect("temp dir");
        let dir = tmp.path();
        let script = dir.join("boom.py");
        std::fs::write(&script, "import sys\nassert sys.argv[1:] == ['a', 'b'], sys.argv\nraise ValueError('bad ' + __name__)\n")
            .expect("write script");
        let err_file = dir.join("error.json");
        let out = std::process::Command::new(python)
            .args(["-u", "-c", RUN_PATH_BOOTSTRAP])
            .arg(&script)
            .args(["a", "b"])
            .env("TORCHELASTIC_ERROR_FILE", &err_file)
            .output()
            .expect("run python3");
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&err_file).expect("error file"))
                .expect("json");
        assert_eq!(json["message"]["message"], "ValueError: bad __main__");
        let tb = json["message"]["extraInfo"]["py_callstack"]
            .as_str()
            .expect("callstack");
        assert!(tb.contains("Traceback") && tb.contains("boom.py"), "{tb}");
        let ts = json["message"]["extraInfo"]["timestamp"]
            .as_str()
            .expect("timestamp");
        assert!(ts.parse::<u64>().is_ok(), "{ts}");
        // SystemExit passes through without an error file.
        std::fs::remove_file(&err_file).expect("rm");
        std::fs::write(&script, "import sys\nsys.exit(3)\n").expect("write script");
        let out = std::process::Command::new("python3")
            .args(["-u", "-c", RUN_PATH_BOOTSTRAP])
            .arg(&script)
            .env("TORCHELASTIC_ERROR_FILE", &err_file)
            .output()
            .expect("run python3");
        assert_eq!(out.status.code(), Some(3));
        assert!(!err_file.exists());
    }
}
