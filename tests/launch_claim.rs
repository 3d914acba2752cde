//! The in-pod launcher in claim mode (a warm pod's run container), run for
//! real as a process: it waits for the claim file the upload sidecar
//! writes, checks that nothing was left in the pod before the claim, and
//! runs the claimed script under the same fence as a command line's.
//!
//! The process check reads `/proc`, which lists the container's processes
//! only inside a PID namespace of its own. These tests run the launcher
//! without one, so they point it at an empty directory (`--proc-root`) and
//! the check's own rules are unit-tested over fake proc directories
//! (src/artifacts/client/warm.rs, src/runner/launch.rs); the last test
//! runs the real check inside a PID namespace when bubblewrap is installed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use skill_operator::artifacts::client::warm::{read_key_file, write_claim_file, TAMPERED};
use skill_operator::artifacts::sealed;
use skill_operator::artifacts::verdict::Collector;
use skill_operator::artifacts::{sha256_digest, Claim, ClaimInput};

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");
const UID: &str = "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60";

/// A warm pod's directories, the way the run container sees them, and
/// the sidecar's end of the verdict channel (written into `result/`).
struct Pod {
    root: tempfile::TempDir,
    sidecar: std::sync::Mutex<Option<Collector>>,
}

impl Pod {
    fn new() -> Pod {
        let root = tempfile::tempdir().unwrap();
        for d in ["claim", "claim-key", "package/scripts", "work", "result", "tmp", "proc", "elsewhere"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        let pod = Pod { root, sidecar: std::sync::Mutex::new(None) };
        // The script leaves a marker wherever it runs: a refused claim must leave none.
        let script = format!(
            "import json, os, sys\nopen({marker:?}, 'w').write('ran')\n\
             data = open('data/input.csv').read() if os.path.exists('data/input.csv') else ''\n\
             open('out.txt', 'w').write(data.upper())\n\
             proxy = {{k: os.environ[k] for k in ('HTTPS_PROXY', 'http_proxy', 'NO_PROXY', 'NODE_USE_ENV_PROXY') if k in os.environ}}\n\
             granted = {{k: os.environ[k] for k in ('WEATHER_API_KEY', 'REGION') if k in os.environ}}\n\
             print(json.dumps({{'argv': sys.argv[1:], 'env': sorted(os.environ), 'cwd': os.getcwd(), 'proxy': proxy, 'granted': granted}}))\n",
            marker = pod.marker().display().to_string()
        );
        for dir in ["package/scripts", "elsewhere"] {
            std::fs::write(pod.path(dir).join("run.py"), &script).unwrap();
        }
        pod
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.path().join(p)
    }

    fn marker(&self) -> PathBuf {
        self.path("marker")
    }

    /// The verdict the launcher sent, once it has (as the sidecar keeps it).
    fn result(&self) -> Value {
        if let Some(sidecar) = self.sidecar.lock().unwrap().take() {
            sidecar.wait().expect("the launcher sent a verdict");
        }
        serde_json::from_slice(&std::fs::read(self.path("result/result.json")).unwrap()).unwrap()
    }

    /// The script's stdout, as the launcher sent it.
    fn stdout(&self) -> Value {
        self.result();
        serde_json::from_slice(&std::fs::read(self.path("result/stdout")).unwrap()).unwrap()
    }

    fn claim(&self, inputs: &[(&str, &[u8])]) -> Claim {
        Claim {
            skilljob_uid: UID.into(),
            interpreter: "/usr/bin/python3".into(),
            script: self.path("package/scripts/run.py").display().to_string(),
            args: vec!["; rm -rf /".into(), "$(id)".into()],
            timeout_secs: 60,
            inputs: inputs.iter().map(|(path, bytes)| ClaimInput { path: path.to_string(), digest: sha256_digest(bytes) }).collect(),
            proxy: None,
            env: None,
        }
    }

    /// What the sidecar does before the handover: the inputs into /work.
    fn bring_inputs(&self, inputs: &[(&str, &[u8])]) {
        for (path, bytes) in inputs {
            let file = self.path("work").join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, bytes).unwrap();
        }
    }

    fn hand_over(&self, claim: &Claim) {
        write_claim_file(&self.path("claim"), claim).unwrap();
    }

    /// `launch` in claim mode, as the warm pod's run container starts it
    /// (a fresh sidecar stand-in listening for its verdict).
    fn command(&self, program: &Path) -> Command {
        let sidecar = Collector::start(&self.path("result/result.json")).unwrap();
        let cmd = self.command_on(program, &sidecar.name);
        *self.sidecar.lock().unwrap() = Some(sidecar);
        cmd
    }

    /// [`Pod::command`] with the verdict channel `name` (whoever listens there).
    fn command_on(&self, program: &Path, name: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(self.path("work"))
            .env("API_KEY", "k")
            .env("SECRET_OF_NODE", "leak")
            .args(["launch", "--verdict", name])
            .args(["--timeout", "60", "--allow-env", "API_KEY", "--claim-dir"])
            .arg(self.path("claim"))
            .arg("--package-dir")
            .arg(self.path("package"))
            .arg("--empty-dir")
            .arg(self.path("tmp"));
        cmd
    }

    fn spawn(&self) -> Child {
        let mut child = self.command(Path::new(BIN)).arg("--proc-root").arg(self.path("proc")).stderr(Stdio::piped()).spawn().unwrap();
        wait_until_waiting(&mut child);
        child
    }

    fn key_file(&self) -> PathBuf {
        self.path("claim-key/key.json")
    }

    /// [`Pod::spawn`] with `--claim-key`: the launcher makes its key pair
    /// and leaves the public half before it says it waits.
    fn spawn_with_key(&self) -> Child {
        let mut child = self
            .command(Path::new(BIN))
            .arg("--claim-key")
            .arg(self.key_file())
            .arg("--proc-root")
            .arg(self.path("proc"))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until_waiting(&mut child);
        child
    }

    fn run(&self) -> (i32, String) {
        let out = self.command(Path::new(BIN)).arg("--proc-root").arg(self.path("proc")).output().unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Until the launcher says it waits for the claim (its signal handlers are
/// in place by then); its stderr is drained on a thread afterwards.
fn wait_until_waiting(child: &mut Child) {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.by_ref() {
            let line = line.unwrap_or_default();
            if line.contains("waiting for") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("the launcher never said it was waiting");
}

fn wait(child: &mut Child, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "the launcher did not end within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_claim_appearing_runs_its_script_with_its_args_and_inputs_in_the_fence() {
    let pod = Pod::new();
    let mut child = pod.spawn();
    assert!(child.try_wait().unwrap().is_none(), "it waits for a claim");
    let inputs: &[(&str, &[u8])] = &[("data/input.csv", b"a,b\n1,2\n")];
    pod.bring_inputs(inputs);
    pod.hand_over(&pod.claim(inputs));
    assert_eq!(wait(&mut child, Duration::from_secs(30)), 0);
    let result = pod.result();
    assert_eq!(result["exitCode"], 0, "{result}");
    assert!(result.get("error").is_none_or(Value::is_null), "{result}");
    let out = pod.stdout();
    assert_eq!(out["argv"], serde_json::json!(["; rm -rf /", "$(id)"]), "argv literal, no shell");
    let env: Vec<&str> = out["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(env.contains(&"API_KEY") && !env.contains(&"SECRET_OF_NODE"), "{env:?}");
    assert_eq!(out["proxy"], serde_json::json!({}), "no proxy in the claim, no proxy variable");
    assert_eq!(Path::new(out["cwd"].as_str().unwrap()).canonicalize().unwrap(), pod.path("work").canonicalize().unwrap());
    assert_eq!(std::fs::read_to_string(pod.path("work/out.txt")).unwrap(), "A,B\n1,2\n");
    assert!(pod.marker().exists());
}

/// A run granted egress gets its proxy with the claim: the pod was made
/// without one, and the launcher gives the script exactly the variables a
/// cold run's pod has (one list, `skill_operator::egress::proxy_env`).
#[test]
fn a_claim_with_a_proxy_gives_the_script_the_proxy_variables() {
    let pod = Pod::new();
    let url = skill_operator::egress::proxy_url("10.96.0.9:3128", &[7u8; 32], &skill_operator::egress::JobId::new("team-a", UID));
    pod.hand_over(&Claim { proxy: Some(url.clone()), ..pod.claim(&[]) });
    let (code, stderr) = pod.run();
    assert_eq!(code, 0, "{stderr}");
    let out = pod.stdout();
    assert_eq!(
        out["proxy"],
        serde_json::json!({ "HTTPS_PROXY": url, "http_proxy": url, "NO_PROXY": "", "NODE_USE_ENV_PROXY": "1" }),
        "{out}"
    );
    // The proxy URL of another run is refused before anything runs.
    let pod = Pod::new();
    let other = skill_operator::egress::proxy_url("10.96.0.9:3128", &[7u8; 32], &skill_operator::egress::JobId::new("team-a", "other"));
    pod.hand_over(&Claim { proxy: Some(other), ..pod.claim(&[]) });
    let (code, stderr) = pod.run();
    assert_eq!(code, 127, "{stderr}");
    assert!(pod.result()["error"].as_str().unwrap_or_default().contains("the credential is the run"), "{}", pod.result());
    assert!(!pod.marker().exists(), "nothing ran");
}

#[test]
fn the_timeout_is_the_smaller_of_the_claims_and_the_launchers() {
    let pod = Pod::new();
    let claim =
        Claim { script: pod.path("package/scripts/sleep.py").display().to_string(), timeout_secs: 1, args: vec![], ..pod.claim(&[]) };
    std::fs::write(pod.path("package/scripts/sleep.py"), "import time\ntime.sleep(30)\n").unwrap();
    pod.hand_over(&claim);
    let started = Instant::now();
    let (code, stderr) = pod.run();
    assert_eq!(code, 124, "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert_eq!(pod.result()["timedOut"], true);
}

/// Every thing left in the pod before the claim refuses it, naming what
/// was found, before the script could start (it would leave its marker).
#[test]
fn each_thing_left_in_the_pod_refuses_the_claim_and_nothing_runs() {
    let inputs: &[(&str, &[u8])] = &[("data/input.csv", b"a,b\n")];
    type Plant = fn(&Pod, &mut Claim);
    let cases: [(&str, Plant, &str); 6] = [
        (
            "an extra file in work",
            |p, _| std::fs::write(p.path("work/extra.txt"), b"x").unwrap(),
            "extra.txt, which is not one of the claim's inputs",
        ),
        ("an extra directory in work", |p, _| std::fs::create_dir(p.path("work/cache")).unwrap(), "cache/, which holds none"),
        ("a file in an --empty-dir", |p, _| std::fs::write(p.path("tmp/.bashrc"), b"x").unwrap(), "tmp holds .bashrc"),
        ("a wrong input digest", |p, _| std::fs::write(p.path("work/data/input.csv"), b"changed").unwrap(), "the claim says"),
        ("a missing input", |p, _| std::fs::remove_file(p.path("work/data/input.csv")).unwrap(), "is missing from the work directory"),
        (
            "a script outside the package dir",
            |p, c| c.script = p.path("elsewhere/run.py").display().to_string(),
            "is not under the package directory",
        ),
    ];
    for (what, plant, says) in cases {
        let pod = Pod::new();
        pod.bring_inputs(inputs);
        let mut claim = pod.claim(inputs);
        plant(&pod, &mut claim);
        pod.hand_over(&claim);
        let (code, stderr) = pod.run();
        assert_eq!(code, 127, "{what}: {stderr}");
        let result = pod.result();
        let error = result["error"].as_str().unwrap_or_else(|| panic!("{what}: {result}"));
        assert!(error.starts_with(&format!("{TAMPERED}: ")) && error.contains(says), "{what}: {error}");
        assert!(!pod.marker().exists(), "{what}: the script ran");
        assert_eq!(result["exitCode"], Value::Null, "{what}: nothing started");
        assert!(stderr.contains(TAMPERED), "{what}: {stderr}");
    }
}

#[test]
fn sigterm_while_waiting_exits_0_without_a_result() {
    let pod = Pod::new();
    let mut child = pod.spawn();
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(wait(&mut child, Duration::from_secs(10)), 0);
    let sidecar = pod.sidecar.lock().unwrap().take().unwrap();
    assert!(matches!(sidecar.wait(), Err(skill_operator::artifacts::verdict::VerdictError::NoVerdict)), "no verdict");
    for file in ["result.json", "stdout", "stderr"] {
        assert!(!pod.path("result").join(file).exists(), "no {file}");
    }
    assert!(!pod.marker().exists());
}

/// The real process check, in a PID namespace of the launcher's own
/// (bubblewrap, as PID 1 like the run container's entry point): alone it
/// runs the claim; with a process left beside it, it refuses.
#[test]
fn in_its_own_pid_namespace_a_process_left_beside_the_launcher_refuses_the_claim() {
    let Some(bwrap) = skill_operator::runner::sandbox::detect_bwrap() else {
        skill_operator::gated::skip("the launcher's process check in a PID namespace", "bwrap not installed (apt-get install bubblewrap)");
        return;
    };
    let in_namespace = |pod: &Pod, before: &str| {
        let launch = pod.command(Path::new(BIN));
        let argv: Vec<String> = std::iter::once(BIN.to_string())
            .chain(launch.get_args().map(|a| a.to_string_lossy().into_owned()))
            .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
            .collect();
        let script = format!("{before} exec {}", argv.join(" "));
        Command::new(&bwrap)
            .args(["--dev-bind", "/", "/", "--unshare-pid", "--as-pid-1", "--proc", "/proc", "--die-with-parent", "--chdir"])
            .arg(pod.path("work"))
            .args(["--", "/bin/bash", "-c", &script])
            .env("API_KEY", "k")
            .output()
            .unwrap()
    };
    // Alone: the claim runs.
    let pod = Pod::new();
    pod.hand_over(&pod.claim(&[]));
    let out = in_namespace(&pod, "");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(pod.marker().exists());
    // A process left in the namespace (PID 2, a `sleep` started before the launcher took PID 1 over).
    let pod = Pod::new();
    pod.hand_over(&pod.claim(&[]));
    let out = in_namespace(&pod, "sleep 30 &");
    assert_eq!(out.status.code(), Some(127), "{}", String::from_utf8_lossy(&out.stderr));
    let error = pod.result()["error"].as_str().unwrap().to_string();
    assert!(error.starts_with(TAMPERED) && error.contains("another process runs in its container (pid 2)"), "{error}");
    assert!(!pod.marker().exists());
}

fn granted(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

/// A run granted variables gets them sealed to the key this launcher made
/// at its start: it opens them for the script, and they were nowhere in
/// the claim in the clear. The key file holds the public half only.
#[test]
fn variables_sealed_to_the_pods_key_reach_the_script() {
    let pod = Pod::new();
    let mut child = pod.spawn_with_key();
    let published = std::fs::read(pod.key_file()).unwrap();
    let key = read_key_file(&pod.key_file()).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&published).unwrap(),
        serde_json::json!({ "x25519": key.x25519 }),
        "the public key and nothing else"
    );
    let vars = granted(&[("WEATHER_API_KEY", "s3cret-value"), ("REGION", "eu-west-1")]);
    let claim = Claim { env: Some(sealed::seal(&key, UID, &vars).unwrap()), ..pod.claim(&[]) };
    let on_disk = serde_json::to_string(&claim).unwrap();
    assert!(!on_disk.contains("s3cret-value") && !on_disk.contains("WEATHER_API_KEY"), "{on_disk}");
    pod.hand_over(&claim);
    assert_eq!(wait(&mut child, Duration::from_secs(30)), 0);
    let out = pod.stdout();
    assert_eq!(out["granted"], serde_json::json!({ "WEATHER_API_KEY": "s3cret-value", "REGION": "eu-west-1" }), "{out}");
}

/// Variables that do not open with this launcher's key refuse the claim
/// before anything runs: sealed to another pod, for another run, or to a
/// launcher that made no key.
#[test]
fn variables_that_do_not_open_here_refuse_the_claim() {
    let vars = granted(&[("WEATHER_API_KEY", "s3cret-value")]);
    let another_pod = sealed::PodKey::generate().unwrap().public();
    type Seal = fn(&sealed::ClaimKey, &sealed::ClaimKey, &[(String, String)]) -> sealed::SealedEnv;
    let cases: [(&str, Seal); 2] = [
        ("another pod's key", |_, other, vars| sealed::seal(other, UID, vars).unwrap()),
        ("another run", |mine, _, vars| sealed::seal(mine, "9a8b7c6d-0000-4000-8000-000000000001", vars).unwrap()),
    ];
    for (what, seal) in cases {
        let pod = Pod::new();
        let mut child = pod.spawn_with_key();
        let mine = read_key_file(&pod.key_file()).unwrap();
        pod.hand_over(&Claim { env: Some(seal(&mine, &another_pod, &vars)), ..pod.claim(&[]) });
        assert_eq!(wait(&mut child, Duration::from_secs(30)), 127, "{what}");
        let error = pod.result()["error"].as_str().unwrap_or_default().to_string();
        assert!(error.contains("cannot be opened") && error.contains("do not open with this pod's key"), "{what}: {error}");
        assert!(!pod.marker().exists(), "{what}: nothing ran");
    }
    // A launcher started without --claim-key has no key to open them with.
    let pod = Pod::new();
    pod.hand_over(&Claim { env: Some(sealed::seal(&another_pod, UID, &vars).unwrap()), ..pod.claim(&[]) });
    let (code, stderr) = pod.run();
    assert_eq!(code, 127, "{stderr}");
    assert!(pod.result()["error"].as_str().unwrap_or_default().contains("made no key"), "{}", pod.result());
    assert!(!pod.marker().exists(), "nothing ran");
}

/// A sidecar restarted while the pod waits has lost the launcher's
/// channel, and a restarted sidecar takes none: the launcher notices its
/// end closing and stops, so the pod never runs a claim it could not
/// report (the pool replaces it).
#[test]
fn a_launcher_whose_verdict_channel_closes_while_it_waits_runs_nothing() {
    use skill_operator::artifacts::verdict::{listen, Listening};
    let pod = Pod::new();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let name = format!("skill-operator-test/closing/{}", uuid::Uuid::new_v4().simple());
    let Listening::Waiting(listener) = runtime.block_on(async { listen(&name, &pod.path("result/result.json")) }).unwrap() else {
        panic!("nothing received yet")
    };
    let mut child = pod.command_on(Path::new(BIN), &name).arg("--proc-root").arg(pod.path("proc")).stderr(Stdio::piped()).spawn().unwrap();
    let connection = runtime.block_on(listener.accept()).expect("the launcher connects at its start");
    wait_until_waiting(&mut child);
    drop(connection);
    assert_eq!(wait(&mut child, Duration::from_secs(10)), 127, "the launcher stops once the channel closes");
    // A claim arriving now finds no launcher: nothing runs.
    pod.hand_over(&pod.claim(&[]));
    assert!(!pod.marker().exists());
}
