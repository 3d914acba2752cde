//! `skill-operator launch`: the in-pod launcher. It runs as the main
//! container's entry point (copied into the pod by the fetch init container),
//! applies the fence the local runner applies (argv array, environment
//! allowlist, timeout with process-group kill, 1 MiB per stream) and writes
//! the result for the upload sidecar. The pod itself is the sandbox: no
//! network but the artifact endpoint, no credentials, restricted Pod Security.
//!
//! The script runs as the launcher's uid in the launcher's container, so
//! nothing the script can reach carries the verdict: the launcher connects
//! to the upload sidecar's verdict channel ([`crate::artifacts::verdict`])
//! before any script exists and sends the result and the captured streams
//! over it when the script has ended; it writes no result file. It makes
//! itself non-dumpable, so the script (same uid, no capabilities) can
//! neither attach to it nor open its `/proc` entries, and it stops only on
//! a signal from outside its container (the kubelet's) or from its own
//! parent: a SIGTERM the script sends it is ignored
//! ([`crate::shutdown::Shutdown::on_outside_signals`]).
//!
//! Claim mode (`--claim-dir DIR --package-dir DIR [--empty-dir DIR]...`,
//! no command): the run container of a warm pod, made before its run. The
//! launcher waits for `DIR/claim.json` (inotify on the directory; a 5 ms
//! poll where no watch can be made), which the upload sidecar writes once a
//! run has claimed the pod and its inputs are in `/work`. Before anything
//! runs it checks that nothing was left in the pod meanwhile
//! ([`check_claimed_pod`]: no other process in its container, every
//! `--empty-dir` empty, the work directory (its cwd) holding exactly the
//! claim's inputs with their digests, the script under `--package-dir`,
//! the verdict channel still held by the sidecar); a failed check is a result saying so
//! ("the warm pod was tampered with before its claim: ...", exit 127,
//! nothing started). Then it runs `interpreter script args...` as a
//! command given on the command line runs, under the same fence, with the
//! timeout the smaller of the claim's and `--timeout`. SIGTERM while it
//! waits (an idle warm pod deleted) ends it with 0 and no result.
//!
//! With `--claim-key FILE` it first makes the pod's key pair and leaves the
//! public half in FILE for the sidecar to publish; a claim for a run
//! granted variables carries them sealed to it, and the launcher opens them
//! ([`crate::artifacts::sealed`]) for the script's environment. A claim
//! whose variables do not open is refused like a tampered pod's: nothing runs.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::artifacts::client::warm::{check_alone, check_empty, check_work, read_claim_file, tampered, wait_for_file, write_key_file};
use crate::artifacts::sealed::PodKey;
use crate::artifacts::verdict::{Verdict, VerdictSender, CONNECT_PATIENCE, DEFAULT_NAME as VERDICT_SOCKET};
use crate::artifacts::{Claim, CLAIM_FILE};

use super::process::{execute, ExecError, ExecSpec, ResourceLimits, RunAs};
pub use crate::api::outcome::LaunchResult;
use crate::api::outcome::RunOutcome;
use crate::api::outcome::{unix_nanos_now, FetchTimes, PodTimes, FETCH_TIMES_FILE};
use crate::shutdown::Shutdown;

#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// The abstract socket the upload sidecar listens on: the verdict and
    /// the captured streams go there, never into a file the script could write.
    #[arg(long, value_name = "NAME", default_value = VERDICT_SOCKET)]
    pub verdict: String,
    /// Wall-clock timeout in seconds (clamped to the hard ceiling).
    #[arg(long, value_name = "SECS")]
    pub timeout: u64,
    /// A variable passed through from the container's environment (repeatable); nothing else is.
    #[arg(long = "allow-env", value_name = "NAME")]
    pub allow_env: Vec<String>,
    /// A warm pod's launcher: wait for DIR/claim.json (the upload sidecar
    /// writes it once a run claims the pod) and run the command it names
    /// instead of one given here. The pod is made before its run, so the
    /// run's command comes with the claim; before it runs, the launcher
    /// checks that nothing was left in the pod meanwhile.
    #[arg(long, value_name = "DIR", requires = "package_dir")]
    pub claim_dir: Option<PathBuf>,
    /// With --claim-dir: where the package is (/package, or /skill in a
    /// prepared image). A claimed script outside it is refused: the claim
    /// names a script of the pod's own package, nothing else.
    #[arg(long, value_name = "DIR", requires = "claim_dir", conflicts_with = "command")]
    pub package_dir: Option<PathBuf>,
    /// With --claim-dir: a directory that must still be empty when the claim
    /// comes (repeatable; /tmp): whatever is in it was left before the run,
    /// and the script would meet it.
    #[arg(long = "empty-dir", value_name = "DIR", requires = "claim_dir", conflicts_with = "command")]
    pub empty_dirs: Vec<PathBuf>,
    /// With --claim-dir: make a key pair for this pod's one claim and leave
    /// its public half in FILE, which the upload sidecar publishes. A run
    /// granted variables gets them sealed to it in its claim; the private
    /// half never leaves this process. Without it, a claim carrying
    /// variables is refused.
    #[arg(long, value_name = "FILE", requires = "claim_dir", conflicts_with = "command")]
    pub claim_key: Option<PathBuf>,
    /// The proc filesystem whose entries are the container's processes
    /// (tests without a PID namespace give an empty directory).
    #[arg(long, value_name = "DIR", default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
    /// The interpreter and its arguments: `-- /usr/bin/python3 /package/scripts/x.py ARGS...`
    /// (none with --claim-dir: the claim names them).
    #[arg(last = true, required_unless_present = "claim_dir", conflicts_with = "claim_dir", value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// `skill-operator launch`: connect to the sidecar's verdict channel, run
/// the script, send the verdict, and exit with [`exit_status`]. A shutdown
/// from outside the container (the kubelet's SIGTERM, sent when the
/// SkillJob is deleted or the Job's deadline passes) stops the script's
/// whole process group at once and the verdict says `cancelled`.
pub async fn command(args: LaunchArgs, _shutdown: Shutdown) -> std::io::Result<std::process::ExitCode> {
    // First, while no script exists: the stop signals only from outside,
    // the process closed to its own uid, and the channel taken.
    let shutdown = Shutdown::on_outside_signals()?;
    super::process::protect_server_environ().map_err(std::io::Error::other)?;
    let name = args.verdict.clone();
    let sender = match tokio::task::spawn_blocking(move || VerdictSender::connect(&name, CONNECT_PATIENCE)).await? {
        Ok(sender) => sender,
        Err(err) => {
            eprintln!("skill-operator launch: {err}");
            return Ok(std::process::ExitCode::from(127));
        }
    };
    if args.claim_dir.is_some() {
        return claimed_command(args, sender, shutdown).await;
    }
    let mut command = args.command.into_iter();
    let program = PathBuf::from(command.next().unwrap_or_default());
    let spec = Launch {
        program,
        args: command.collect(),
        allow_env: args.allow_env,
        env: vec![],
        timeout: Duration::from_secs(args.timeout.clamp(1, crate::core::limits::MAX_TIMEOUT_SECS)),
        cwd: std::env::current_dir()?,
        cancel: Some(shutdown),
        fetched: fetch_times(),
    };
    let verdict = launch(spec, &|k| std::env::var(k).ok()).await;
    Ok(deliver(sender, verdict).await)
}

/// Sends the verdict to the sidecar and says its error, if any; the exit
/// status of [`exit_status`] either way.
async fn deliver(sender: VerdictSender, verdict: Verdict) -> std::process::ExitCode {
    if let Some(error) = &verdict.result.error {
        eprintln!("skill-operator launch: {error}");
    }
    let ignored = crate::shutdown::ignored_stop_signals();
    if ignored > 0 {
        eprintln!("skill-operator launch: ignored {ignored} stop signal(s) sent from inside the container");
    }
    let code = exit_status(&verdict.result);
    match tokio::task::spawn_blocking(move || sender.send(&verdict)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => eprintln!("skill-operator launch: {err}"),
        Err(err) => eprintln!("skill-operator launch: sending the verdict: {err}"),
    }
    // Exit statuses are 0-255; exit_status stays inside that range.
    std::process::ExitCode::from(code.clamp(0, 255) as u8)
}

/// How often a warm pod's launcher checks, while it waits, that the
/// sidecar still holds the verdict channel.
const CHANNEL_CHECK: Duration = Duration::from_secs(1);

/// Claim mode (see the module docs).
async fn claimed_command(args: LaunchArgs, sender: VerdictSender, shutdown: Shutdown) -> std::io::Result<std::process::ExitCode> {
    let claim_dir = args.claim_dir.clone().unwrap_or_default();
    let claim_file = claim_dir.join(CLAIM_FILE);
    // Made before the wait, so the sidecar can publish it while the pod is idle.
    let key = match &args.claim_key {
        Some(file) => {
            let key = PodKey::generate().map_err(std::io::Error::other)?;
            write_key_file(file, &key.public()).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
            Some(key)
        }
        None => None,
    };
    // The signal handlers are in place: from here a SIGTERM is an orderly
    // stop, which is what this line tells a watcher.
    eprintln!("skill-operator launch: waiting for {}", claim_file.display());
    let claimed = {
        let waiting = wait_for_file(&claim_file, &shutdown);
        tokio::pin!(waiting);
        let mut check = tokio::time::interval(CHANNEL_CHECK);
        loop {
            tokio::select! {
                claimed = &mut waiting => break claimed,
                _ = check.tick() => if !sender.is_open() {
                    // A sidecar restarted while the pod waited takes no verdict: this pod can run nothing.
                    eprintln!("skill-operator launch: the upload sidecar closed the verdict channel while this warm pod waited; it runs nothing");
                    return Ok(std::process::ExitCode::from(127));
                },
            }
        }
    };
    if !claimed {
        // An idle warm pod deleted: no run, no result.
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let cwd = std::env::current_dir()?;
    let pod = ClaimedPod {
        proc_root: &args.proc_root,
        own_pid: std::process::id(),
        empty_dirs: &args.empty_dirs,
        work: &cwd,
        package_dir: args.package_dir.as_deref().unwrap_or(Path::new("/package")),
    };
    let claim = read_claim_file(&claim_file)
        .map_err(|e| format!("the claim cannot be read: {e}"))
        .and_then(|claim| check_claimed_pod(&claim, &pod).map(|()| claim));
    let opened = claim.and_then(|claim| {
        let env = open_env(&claim, key)?;
        Ok((claim, env))
    });
    let (claim, granted) = match opened {
        Ok(opened) => opened,
        Err(why) => return Ok(deliver(sender, refuse(&why)).await),
    };
    let spec = claimed_launch(claim, granted, &args, cwd, shutdown);
    let verdict = launch(spec, &|k| std::env::var(k).ok()).await;
    Ok(deliver(sender, verdict).await)
}

/// The claim's granted variables, opened with this pod's key (none when
/// it carries none). A claim with variables and no key to open them, or
/// whose variables do not open, is refused: the script never runs without them.
fn open_env(claim: &Claim, key: Option<PodKey>) -> Result<Vec<(String, String)>, String> {
    let Some(sealed) = &claim.env else { return Ok(Vec::new()) };
    let key = key.ok_or("the claim carries sealed variables, and this pod made no key to open them (launch --claim-key)")?;
    key.open(sealed, &claim.skilljob_uid).map_err(|e| format!("the claim's variables cannot be opened: {e}"))
}

/// The run a claim names, fenced as a command line's: `interpreter script
/// args...`, the timeout the smaller of the claim's and `--timeout`, and
/// for a run granted egress the proxy variables a cold run's pod has, and
/// its granted variables (opened from the claim) after them.
fn claimed_launch(claim: Claim, granted: Vec<(String, String)>, args: &LaunchArgs, cwd: PathBuf, shutdown: Shutdown) -> Launch {
    let timeout = u64::from(claim.timeout_secs).min(args.timeout).clamp(1, crate::core::limits::MAX_TIMEOUT_SECS);
    let proxy = claim.proxy.as_deref().map(crate::egress::proxy_env).unwrap_or_default();
    let env = proxy.into_iter().map(|(n, v)| (n.to_string(), v)).chain(granted).collect();
    Launch {
        program: PathBuf::from(claim.interpreter),
        args: std::iter::once(claim.script).chain(claim.args).map(OsString::from).collect(),
        allow_env: args.allow_env.clone(),
        env,
        timeout: Duration::from_secs(timeout),
        cwd,
        cancel: Some(shutdown),
        fetched: fetch_times(),
    }
}

/// What [`check_claimed_pod`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct ClaimedPod<'a> {
    /// `/proc` of the run container (its own PID namespace).
    pub proc_root: &'a Path,
    pub own_pid: u32,
    /// `--empty-dir`s.
    pub empty_dirs: &'a [PathBuf],
    /// The work directory (the launcher's cwd), where the sidecar put the inputs.
    pub work: &'a Path,
    /// `--package-dir`.
    pub package_dir: &'a Path,
}

/// Everything checked before a claimed run starts; the error (the result's
/// error) names what was found. The cheap checks first, the inputs'
/// digests last.
pub fn check_claimed_pod(claim: &Claim, pod: &ClaimedPod<'_>) -> Result<(), String> {
    check_alone(pod.proc_root, pod.own_pid).map_err(|e| tampered(&e))?;
    for dir in pod.empty_dirs {
        check_empty(dir).map_err(|e| tampered(&e))?;
    }
    check_command(claim, pod.package_dir).map_err(|e| tampered(&e))?;
    check_work(pod.work, &claim.inputs).map_err(|e| tampered(&e))
}

/// The interpreter is absolute; the script lies under the package
/// directory, with no `.` or `..` on the way.
pub fn check_command(claim: &Claim, package_dir: &Path) -> Result<(), String> {
    if !claim.interpreter.starts_with('/') {
        return Err(format!("the interpreter {:?} is not an absolute path", claim.interpreter));
    }
    let script = Path::new(&claim.script);
    let plain = claim.script.split('/').skip(1).all(|s| !s.is_empty() && s != "." && s != "..")
        && script.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !plain || !script.starts_with(package_dir) || script == package_dir {
        return Err(format!("the script {} is not under the package directory {}", claim.script, package_dir.display()));
    }
    Ok(())
}

/// The verdict of a claimed run that never started: `why`, empty streams,
/// exit status 127.
fn refuse(why: &str) -> Verdict {
    let result = LaunchResult { outcome: RunOutcome::default(), error: Some(why.to_string()), times: None };
    Verdict { result, stdout: Vec::new(), stderr: Vec::new() }
}

/// The launcher's inputs.
#[derive(Debug, Clone)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Names of the variables passed through from the container's environment.
    pub allow_env: Vec<String>,
    /// Variables set for the script whatever the container's environment
    /// says (a claimed run's proxy variables, which its pod was made without).
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    pub cwd: PathBuf,
    /// Stops the run (SIGKILL to its group) when triggered; the outcome says `cancelled`.
    pub cancel: Option<Shutdown>,
    /// When the fetch container worked, reported on with the script's own times.
    pub fetched: Option<FetchTimes>,
}

/// The fetch container's times, left beside this launcher in the tools
/// volume (`None` when it left none: an older fetch, or a test).
fn fetch_times() -> Option<FetchTimes> {
    let path = std::env::current_exe().ok()?.parent()?.join(FETCH_TIMES_FILE);
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The exit status the launcher ends with: the script's own code, 128+N for
/// a signal, 124 for a timeout (as `timeout(1)`), 143 (SIGTERM's) for a
/// cancelled run, 127 when nothing started.
pub fn exit_status(result: &LaunchResult) -> i32 {
    if result.outcome.cancelled {
        return 128 + libc::SIGTERM;
    }
    if result.outcome.timed_out {
        return 124;
    }
    match (result.outcome.exit_code, result.outcome.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 127,
    }
}

/// Run the script; its verdict (result and streams) for the sidecar.
pub async fn launch(spec: Launch, lookup: &dyn Fn(&str) -> Option<String>) -> Verdict {
    let mut exec = ExecSpec::new(spec.program.clone(), spec.cwd.clone());
    exec.args = spec.args.clone();
    exec.env = spec
        .allow_env
        .iter()
        .filter(|name| !spec.env.iter().any(|(n, _)| n == *name))
        .filter_map(|name| lookup(name).map(|v| (OsString::from(name), OsString::from(v))))
        .chain(spec.env.iter().map(|(n, v)| (OsString::from(n), OsString::from(v))))
        .collect();
    exec.timeout = spec.timeout;
    exec.cancel = spec.cancel.clone();
    // The container already runs as a non-root uid with limits set by the
    // pod; switching uids is neither possible nor needed. RLIMIT_NPROC is
    // left alone: it counts every process of this uid on the node.
    exec.run_as = RunAs::Inherit;
    exec.limits = ResourceLimits { nproc: None, ..ResourceLimits::default() };
    let script_start_unix_nano = unix_nanos_now();
    let executed = execute(exec).await;
    end_stragglers();
    let times = Some(PodTimes { fetch: spec.fetched, script_start_unix_nano, script_end_unix_nano: unix_nanos_now() });
    match executed {
        Ok(out) => Verdict { result: LaunchResult { outcome: out.outcome, error: None, times }, stdout: out.stdout, stderr: out.stderr },
        Err(err) => Verdict {
            result: LaunchResult { outcome: RunOutcome::default(), error: Some(describe(&err)), times },
            stdout: Vec::new(),
            stderr: err.to_string().into_bytes(),
        },
    }
}

/// As the container's PID 1, kill every process left in its PID namespace
/// (a `setsid` grandchild escapes the script's process group) before the
/// result is written. The result then describes a run with nothing left
/// running, so the controller may record the verdict as soon as the result
/// is stored, without waiting for the kubelet to report the container's
/// end; and the work files the sidecar uploads can no longer change. Only
/// as PID 1: anywhere else `kill(-1)` would reach every process of the uid.
fn end_stragglers() {
    if std::process::id() != 1 {
        return;
    }
    // SAFETY: plain syscall; from PID 1, -1 means every other process of
    // this PID namespace that we may signal (the script's, same uid).
    let rc = unsafe { libc::kill(-1, libc::SIGKILL) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
        tracing::warn!(err = %std::io::Error::last_os_error(), "could not kill the script's leftover processes");
    }
}

fn describe(err: &ExecError) -> String {
    format!("the script could not be started: {err}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifacts::ClaimInput;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        launch: LaunchArgs,
    }

    fn parse(args: &[&str]) -> Result<LaunchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("launch").chain(args.iter().copied())).map(|c| c.launch)
    }

    fn claim(script: &str, inputs: Vec<ClaimInput>) -> Claim {
        Claim {
            skilljob_uid: "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60".into(),
            interpreter: "/usr/bin/python3".into(),
            script: script.into(),
            args: vec!["a b".into(), "$(id)".into()],
            timeout_secs: 30,
            inputs,
            proxy: None,
            env: None,
        }
    }

    #[test]
    fn a_command_is_needed_unless_a_claim_brings_it() {
        let base = ["--timeout", "60"];
        assert!(parse(&base).is_err(), "no command, no claim");
        let given = parse(&[&base[..], &["--", "/bin/true", "x"]].concat()).unwrap();
        assert_eq!(given.command, vec![OsString::from("/bin/true"), OsString::from("x")]);
        let claimed = parse(&[&base[..], &["--claim-dir", "/claim", "--package-dir", "/package", "--empty-dir", "/tmp"]].concat()).unwrap();
        assert_eq!((claimed.claim_dir.as_deref(), claimed.empty_dirs.len()), (Some(Path::new("/claim")), 1));
        assert_eq!(claimed.proc_root, Path::new("/proc"));
        assert!(claimed.command.is_empty());
        // A claim and a command: which would run? Refused.
        assert!(parse(&[&base[..], &["--claim-dir", "/claim", "--package-dir", "/package", "--", "/bin/true"]].concat()).is_err());
        // The package directory goes with the claim, and the claim with it.
        assert!(parse(&[&base[..], &["--claim-dir", "/claim"]].concat()).is_err());
        assert!(parse(&[&base[..], &["--package-dir", "/package", "--", "/bin/true"]].concat()).is_err());
        assert!(parse(&[&base[..], &["--empty-dir", "/tmp", "--", "/bin/true"]].concat()).is_err());
    }

    #[test]
    fn the_claimed_run_is_interpreter_script_args_with_the_smaller_timeout() {
        let args = parse(&["--timeout", "60", "--allow-env", "HOME", "--claim-dir", "/c", "--package-dir", "/p"]).unwrap();
        let spec = claimed_launch(claim("/p/s.py", vec![]), vec![], &args, PathBuf::from("/work"), Shutdown::new());
        assert_eq!(spec.program, Path::new("/usr/bin/python3"));
        assert_eq!(spec.args, ["/p/s.py", "a b", "$(id)"].map(OsString::from));
        assert_eq!(
            (spec.timeout, spec.allow_env.as_slice(), spec.cwd.as_path()),
            (Duration::from_secs(30), &["HOME".to_string()][..], Path::new("/work"))
        );
        assert!(spec.env.is_empty(), "no proxy in the claim, no proxy variable: {:?}", spec.env);
        let long = Claim { timeout_secs: 300, ..claim("/p/s.py", vec![]) };
        assert_eq!(
            claimed_launch(long, vec![], &args, PathBuf::from("/work"), Shutdown::new()).timeout,
            Duration::from_secs(60),
            "--timeout caps it"
        );
        let url = "http://job:team.3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60.abc@10.96.0.9:3128";
        let egress = Claim { proxy: Some(url.into()), ..claim("/p/s.py", vec![]) };
        let spec = claimed_launch(egress, vec![], &args, PathBuf::from("/work"), Shutdown::new());
        let want: Vec<(String, String)> = crate::egress::proxy_env(url).into_iter().map(|(n, v)| (n.to_string(), v)).collect();
        assert_eq!(spec.env, want, "a cold run's proxy variables, from the claim");
        assert!(spec.env.iter().any(|(n, v)| n == "HTTPS_PROXY" && v == url));
    }

    #[test]
    fn the_script_must_lie_under_the_package_directory() {
        let pkg = Path::new("/package");
        for ok in ["/package/scripts/x.py", "/package/x"] {
            assert_eq!(check_command(&claim(ok, vec![]), pkg), Ok(()), "{ok}");
        }
        for bad in
            ["/etc/passwd", "/package", "/package/", "/packagex/y.py", "/package/../etc/x", "/package/./x", "/package//x", "/skill/x.py"]
        {
            let err = check_command(&claim(bad, vec![]), pkg).unwrap_err();
            assert!(err.contains("not under the package directory /package"), "{bad}: {err}");
        }
        assert_eq!(check_command(&claim("/skill/x.py", vec![]), Path::new("/skill")), Ok(()));
        let relative = Claim { interpreter: "python3".into(), ..claim("/package/x", vec![]) };
        assert!(check_command(&relative, pkg).unwrap_err().contains("not an absolute path"));
    }

    /// The process check over a fake proc directory: a real one needs the
    /// launcher alone in a PID namespace (tests/launch_claim.rs runs it
    /// there when bubblewrap is installed).
    #[test]
    fn every_check_runs_before_the_claimed_run_and_names_what_it_found() {
        let t = tempfile::tempdir().unwrap();
        let dir = |n: &str| {
            let p = t.path().join(n);
            std::fs::create_dir_all(&p).unwrap();
            p
        };
        let (proc, tmp, work, package) = (dir("proc"), dir("tmp"), dir("work"), dir("package"));
        std::fs::write(work.join("in.txt"), b"in").unwrap();
        let c = claim(
            &format!("{}/x.py", package.display()),
            vec![ClaimInput { path: "in.txt".into(), digest: crate::artifacts::sha256_digest(b"in") }],
        );
        let empty = [tmp.clone()];
        let pod = ClaimedPod { proc_root: &proc, own_pid: 1, empty_dirs: &empty, work: &work, package_dir: &package };
        assert_eq!(check_claimed_pod(&c, &pod), Ok(()));
        let refused = |what: &str| {
            let err = check_claimed_pod(&c, &pod).unwrap_err();
            assert!(err.starts_with("the warm pod was tampered with before its claim: "), "{err}");
            assert!(err.contains(what), "{what}: {err}");
        };
        std::fs::create_dir(proc.join("77")).unwrap();
        refused("pid 77");
        std::fs::remove_dir(proc.join("77")).unwrap();
        std::fs::write(tmp.join("left"), b"").unwrap();
        refused("holds left");
        std::fs::remove_file(tmp.join("left")).unwrap();
        std::fs::write(work.join("in.txt"), b"changed").unwrap();
        refused("the claim says");
        std::fs::write(work.join("in.txt"), b"in").unwrap();
        let outside = Claim { script: "/usr/bin/x.py".into(), ..c.clone() };
        assert!(check_claimed_pod(&outside, &pod).unwrap_err().contains("not under the package directory"));
        assert_eq!(check_claimed_pod(&c, &pod), Ok(()), "all clean again");
    }

    #[test]
    fn a_refused_claim_is_a_not_started_verdict() {
        let verdict = refuse("the warm pod was tampered with before its claim: x");
        assert_eq!(exit_status(&verdict.result), 127);
        assert_eq!(verdict.result.error.as_deref(), Some("the warm pod was tampered with before its claim: x"));
        assert!(verdict.stdout.is_empty() && verdict.stderr.is_empty());
    }

    #[tokio::test]
    async fn the_wait_for_the_claim_ends_with_the_file_or_the_shutdown() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join(CLAIM_FILE);
        let stop = Shutdown::new();
        let waiting = wait_for_file(&file, &stop);
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        std::fs::write(&file, b"{}").unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap());
        let other = t.path().join("never");
        let stopped = Shutdown::new();
        stopped.trigger();
        assert!(!wait_for_file(&other.join(CLAIM_FILE), &stopped).await);
    }
}
