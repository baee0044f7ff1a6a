//! Unit tests of `command.rs` (in a file of their own: they run real tools and print why a step
//! was skipped, which the library itself never does).

use super::super::testkit::*;
use super::super::RealHost;
use super::*;

fn command(argv: &[&str], env: &[(&str, &str)]) -> Result<WorkerCommand, ConfigError> {
    resolve_command(&args(argv), &env_of(env), &FakeHost::new())
}

/// Each command line's worker command: (argv, environment, kind, program, arguments, name).
/// Long because it is one table row per case, read as a list; the check is the final loop.
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
