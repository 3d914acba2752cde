//! The in-pod launcher, run for real as a process: argv kept literal, only
//! allowed variables passed, timeout, caps, exit status and result files.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

fn launch(dir: &Path, timeout: &str, allow: &[&str], command: &[&str]) -> (i32, serde_json::Value) {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(dir)
        .env("SECRET_OF_NODE", "leak")
        .env("API_KEY", "k")
        .arg("launch")
        .arg("--result")
        .arg(dir.join("result/result.json"))
        .args(["--timeout", timeout]);
    for a in allow {
        cmd.args(["--allow-env", a]);
    }
    let status = cmd.arg("--").args(command).status().unwrap();
    let result = serde_json::from_slice(&std::fs::read(dir.join("result/result.json")).unwrap()).unwrap();
    (status.code().unwrap_or(-1), result)
}

fn setup() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("result")).unwrap();
    t
}

#[test]
fn runs_the_script_with_literal_args_and_only_allowed_env() {
    let t = setup();
    std::fs::write(t.path().join("input.txt"), "hello").unwrap();
    let script = "import json,os,sys; open('output.txt','w').write(open('input.txt').read().upper()); print(json.dumps({'argv': sys.argv[1:], 'env': sorted(os.environ)}))";
    let (code, result) = launch(t.path(), "10", &["API_KEY"], &["/usr/bin/python3", "-c", script, "; rm -rf /", "$(id)"]);
    assert_eq!(code, 0);
    assert_eq!(result["exitCode"], 0);
    let out: serde_json::Value = serde_json::from_slice(&std::fs::read(t.path().join("result/stdout")).unwrap()).unwrap();
    assert_eq!(out["argv"], serde_json::json!(["; rm -rf /", "$(id)"]));
    let env: Vec<&str> = out["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(env.contains(&"API_KEY") && !env.contains(&"SECRET_OF_NODE"), "{env:?}");
    assert_eq!(std::fs::read_to_string(t.path().join("output.txt")).unwrap(), "HELLO");
}

#[test]
fn exit_codes_signals_and_timeouts_become_the_launcher_status() {
    let t = setup();
    let (code, result) = launch(t.path(), "10", &[], &["/bin/bash", "-c", "echo oops >&2; exit 3"]);
    assert_eq!((code, result["exitCode"].as_i64()), (3, Some(3)));
    assert_eq!(std::fs::read_to_string(t.path().join("result/stderr")).unwrap(), "oops\n");
    let (code, result) = launch(t.path(), "1", &[], &["/bin/bash", "-c", "sleep 30"]);
    assert_eq!(code, 124);
    assert_eq!(result["timedOut"], true);
    let (code, _) = launch(t.path(), "10", &[], &["/bin/bash", "-c", "kill -9 $$"]);
    assert_eq!(code, 128 + 9);
}

#[test]
fn output_is_capped_at_one_mib_per_stream() {
    let t = setup();
    let (code, result) =
        launch(t.path(), "10", &[], &["/usr/bin/python3", "-c", "import sys\nfor _ in range(40): sys.stdout.write('x'*65536)"]);
    assert_eq!(code, 0);
    assert_eq!(result["stdoutBytes"], 40 * 65536);
    assert_eq!(result["stdoutTruncated"], true);
    assert_eq!(std::fs::metadata(t.path().join("result/stdout")).unwrap().len(), 1024 * 1024);
}

#[test]
fn a_missing_interpreter_is_reported_not_hidden() {
    let t = setup();
    let (code, result) = launch(t.path(), "10", &[], &["/nonexistent/python", "x.py"]);
    assert_eq!(code, 127);
    assert!(result["error"].as_str().unwrap().contains("could not be started"));
}
