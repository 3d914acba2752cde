//! `skill_run` overhead beyond the interpreter's own start, and what the
//! run-wide limits (a cgroup per run, sized and read-only mounts) add to a
//! sandboxed run.
//!
//! For node and python: the median time of spawning the interpreter directly
//! on an empty script (and `node -e 0` / `python3 -c pass`), against the
//! median client-side latency of a confirmed `skill_run` of the same script
//! over stdio (`--confirm auto`): with the sandbox off, sandboxed without a
//! cgroup (`--cgroup off`), and sandboxed with everything. The overhead is
//! the difference of the medians. Each run's job is deleted afterwards (not
//! timed) so the retention cap never interferes.
//!
//! Then the parts on their own, as medians of repeated calls: one cgroup
//! made, limited and removed; a root server's per-run tmpfs mounted and
//! unmounted; bubblewrap starting `true` with the old mount set (unsized
//! `/tmp`, writable root and `/dev`) and with the new one (sized `/tmp` and
//! `/dev/shm`, read-only root and `/dev`).
//!
//! Then what the audit trail adds to a run (`BENCH_PARTS=audit` runs only
//! that), and the spawn helper against the server forking itself, each
//! unsandboxed and in bubblewrap (`BENCH_PARTS=helper` runs only that).
//!
//! `RUN_OVERHEAD_BASELINE_BIN=<path>` adds the same sandboxed and unsandboxed
//! runs with another build (e.g. the commit before a change), measured in
//! the same run.
//!
//! Run: `cargo bench --bench run_overhead`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn is_root() -> bool {
    skill_operator::gated::is_root()
}

fn skills(root: &Path) {
    let dir = root.join("noop");
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        "---\nname: noop\ndescription: Does nothing, fast.\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/noop.js\n      interpreter: node\n    - script: scripts/noop.py\n      interpreter: python\n---\nNothing.\n",
    )
    .unwrap();
    std::fs::write(dir.join("scripts/noop.js"), "0;\n").unwrap();
    std::fs::write(dir.join("scripts/noop.py"), "pass\n").unwrap();
    for p in [root.to_path_buf(), dir.clone(), dir.join("scripts")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn direct(program: &str, args: &[&str], runs: usize) -> f64 {
    let mut t = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        // The same clean environment the fence gives a script (an inherited
        // NODE_EXTRA_CA_CERTS alone triples node's start-up time).
        let status = Command::new(program)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", "/tmp")
            .env("LANG", "C.UTF-8")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        t.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    median(t)
}

struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl Server {
    fn start(bin: &str, skills: &Path, data: &Path, flags: &[&str]) -> Server {
        let mut child = Command::new(bin)
            .args(["serve", "--confirm", "auto", "--skills"])
            .arg(skills)
            .arg("--data-dir")
            .arg(data)
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut s = Server { child, stdin, stdout, next: 1 };
        s.call("initialize", r#"{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}"#);
        writeln!(s.stdin, r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#).unwrap();
        s
    }

    fn call(&mut self, method: &str, params: &str) -> String {
        let id = self.next;
        self.next += 1;
        writeln!(self.stdin, r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#).unwrap();
        self.stdin.flush().unwrap();
        let prefix = format!(r#"{{"jsonrpc":"2.0","id":{id},"#);
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "server closed stdout");
            if line.starts_with(&prefix) {
                return line;
            }
        }
    }

    fn run(&mut self, script: &str) -> (f64, String) {
        let params = format!(r#"{{"name":"skill_run","arguments":{{"skill":"noop","script":"{script}"}}}}"#);
        let start = Instant::now();
        let reply = self.call("tools/call", &params);
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        assert!(reply.contains(r#"\"exitCode\":0"#), "{reply}");
        let job = reply.split(r#"\"job\":\""#).nth(1).and_then(|r| r.split('\\').next()).unwrap().to_string();
        (ms, job)
    }

    /// Median `skill_run` time of `script` over `runs` (after one warm-up).
    fn median_run(&mut self, script: &str, runs: usize) -> f64 {
        let mut times = Vec::new();
        for _ in 0..runs + 1 {
            let (ms, job) = self.run(script);
            times.push(ms);
            self.call("tools/call", &format!(r#"{{"name":"skill_job_delete","arguments":{{"job":"{job}"}}}}"#));
        }
        times.remove(0); // first run warms caches
        median(times)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stand-in OTLP/HTTP collector on loopback: answers every request 200
/// with an empty body (keep-alive), counting them. Returns its URL.
fn collector(count: std::sync::Arc<std::sync::atomic::AtomicU64>) -> String {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let count = count.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0u8; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if writer.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// What the audit trail and exported traces add to a `skill_run`: three
/// servers, sandbox off: one plain, one writing its audit records to a
/// file, one exporting every span over OTLP to a collector on loopback;
/// runs rotate between them so all see the same machine. Each iteration
/// writes four records (the run's start and verdict, the `skill_run` call
/// and the `skill_job_delete` after it) and three spans.
fn audit_cost(skills: &Path, uids: &[&str], runs: usize) {
    let flags = [&["--sandbox", "off"][..], uids].concat();
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    for d in &dirs[..3] {
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let file = dirs[3].path().join("audit.jsonl");
    let exports = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let endpoint = collector(exports.clone());
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "200");
    let mut off = Server::start(BIN, skills, dirs[0].path(), &flags);
    let audit_flags = [&flags[..], &["--audit-file", file.to_str().unwrap()][..]].concat();
    let mut audit = Server::start(BIN, skills, dirs[1].path(), &audit_flags);
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint);
    let mut traced = Server::start(BIN, skills, dirs[2].path(), &flags);
    std::env::remove_var("OTEL_EXPORTER_OTLP_ENDPOINT");
    let (mut t_off, mut t_audit, mut t_traced) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..(runs * 2 + 2) {
        for (server, times) in [(&mut off, &mut t_off), (&mut audit, &mut t_audit), (&mut traced, &mut t_traced)] {
            let (ms, job) = server.run("scripts/noop.py");
            server.call("tools/call", &format!(r#"{{"name":"skill_job_delete","arguments":{{"job":"{job}"}}}}"#));
            if i >= 2 {
                times.push(ms);
            }
        }
    }
    let records = std::fs::read_to_string(&file).unwrap().lines().count();
    let (m_off, m_audit, m_traced) = (median(t_off), median(t_audit), median(t_traced));
    let goal = |added: f64| if added <= 1.0 { "met" } else { "NOT met" };
    println!(
        "skill_run (python, sandbox off, {} runs each, rotating): neither {m_off:.2} ms; audit trail {m_audit:.2} ms ({:+.2} ms, goal <= 1 ms: {}); traces exported {m_traced:.2} ms ({:+.2} ms, goal <= 1 ms: {}); {records} records written, {} OTLP exports received",
        runs * 2,
        m_audit - m_off,
        goal(m_audit - m_off),
        m_traced - m_off,
        goal(m_traced - m_off),
        exports.load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// This build against another one, unsandboxed, python and node: two
/// servers side by side, their calls alternating, so a machine that gets
/// busier or quieter during the run weighs on both alike.
fn baseline_cost(skills: &Path, uids: &[&str], runs: usize, baseline: &str) {
    let flags = [&["--sandbox", "off"][..], uids].concat();
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    for d in &dirs {
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut this = Server::start(BIN, skills, dirs[0].path(), &flags);
    let mut base = Server::start(baseline, skills, dirs[1].path(), &flags);
    for script in ["scripts/noop.py", "scripts/noop.js"] {
        let (mut t_this, mut t_base) = (Vec::new(), Vec::new());
        for i in 0..(runs * 2 + 2) {
            for (server, times) in [(&mut this, &mut t_this), (&mut base, &mut t_base)] {
                let (ms, job) = server.run(script);
                server.call("tools/call", &format!(r#"{{"name":"skill_job_delete","arguments":{{"job":"{job}"}}}}"#));
                if i >= 2 {
                    times.push(ms);
                }
            }
        }
        let (m_this, m_base) = (median(t_this), median(t_base));
        println!(
            "skill_run {script}, sandbox off, {} runs each, alternating: this build {m_this:.2} ms, baseline build {m_base:.2} ms ({:+.2} ms, {:.3}x)",
            runs * 2,
            m_this - m_base,
            m_this / m_base
        );
    }
}

/// The spawn helper against the server forking itself (`--spawn-helper
/// false`, the named baseline), same build, unsandboxed and in bubblewrap
/// with a cgroup per run: two servers side by side and a direct start of
/// the same script, in turn, so a machine that gets busier or quieter
/// weighs on all three alike. The overhead is each median minus the
/// direct start's median from the same rounds.
fn helper_cost(skills: &Path, uids: &[&str], runs: usize) {
    let setups: [(&str, Vec<&str>); 2] = [
        ("sandbox off", [&["--sandbox", "off"][..], uids].concat()),
        ("bubblewrap, cgroup + sized mounts", vec!["--sandbox", "required", "--sandbox-backend", "bwrap", "--cgroup", "required"]),
    ];
    for (label, flags) in setups {
        let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
        for d in &dirs {
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut helper = Server::start(BIN, skills, dirs[0].path(), &flags);
        let forking = [&flags[..], &["--spawn-helper", "false"][..]].concat();
        let mut fork = Server::start(BIN, skills, dirs[1].path(), &forking);
        for (script, program) in [("scripts/noop.py", "/usr/bin/python3"), ("scripts/noop.js", "/usr/bin/node")] {
            let path = skills.join("noop").join(script);
            let (mut t_helper, mut t_fork, mut t_direct) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..(runs * 2 + 2) {
                let direct_ms = direct(program, &[path.to_str().unwrap()], 1);
                for (server, times) in [(&mut helper, &mut t_helper), (&mut fork, &mut t_fork)] {
                    let (ms, job) = server.run(script);
                    server.call("tools/call", &format!(r#"{{"name":"skill_job_delete","arguments":{{"job":"{job}"}}}}"#));
                    if i >= 2 {
                        times.push(ms);
                    }
                }
                if i >= 2 {
                    t_direct.push(direct_ms);
                }
            }
            let (m_helper, m_fork, m_direct) = (median(t_helper), median(t_fork), median(t_direct));
            println!(
                "skill_run {script}, {label}, {} rounds: direct start {m_direct:.2} ms; spawn helper {m_helper:.2} ms (overhead {:.2} ms), server forking {m_fork:.2} ms (overhead {:.2} ms): {:+.2} ms, {:.3}x",
                runs * 2,
                m_helper - m_direct,
                m_fork - m_direct,
                m_helper - m_fork,
                m_helper / m_fork
            );
        }
    }
}

fn time_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut t = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        f();
        t.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    median(t)
}

/// bubblewrap starting `true` with the old or the new mount set.
fn bwrap_true(new_mounts: bool) {
    let mut args: Vec<String> =
        ["--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"].iter().map(|s| s.to_string()).collect();
    for (target, link) in [("usr/lib", "/lib"), ("usr/lib64", "/lib64"), ("usr/bin", "/bin")] {
        args.extend(["--symlink".into(), target.into(), link.into()]);
    }
    args.extend(["--proc", "/proc", "--dev", "/dev"].iter().map(|s| s.to_string()));
    let size = skill_operator::core::limits::RUN_TMP_BYTES.to_string();
    if new_mounts {
        for t in ["/tmp", "/dev/shm"] {
            args.extend(["--size".into(), size.clone(), "--tmpfs".into(), t.into()]);
        }
        args.extend(["--remount-ro", "/dev", "--remount-ro", "/"].iter().map(|s| s.to_string()));
    } else {
        args.extend(["--tmpfs".into(), "/tmp".into()]);
    }
    args.extend(["--".into(), "/usr/bin/true".into()]);
    let status = Command::new("bwrap").args(&args).stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap();
    assert!(status.success());
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs = if quick { 3 } else { 40 };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    skills(dir.path());
    let js = dir.path().join("noop/scripts/noop.js");
    let py = dir.path().join("noop/scripts/noop.py");
    let node_file = direct("/usr/bin/node", &[js.to_str().unwrap()], runs);
    let node_e = direct("/usr/bin/node", &["-e", "0"], runs);
    let py_file = direct("/usr/bin/python3", &[py.to_str().unwrap()], runs);
    let py_c = direct("/usr/bin/python3", &["-c", "pass"], runs);
    println!("direct: node noop.js {node_file:.1} ms, node -e 0 {node_e:.1} ms, python3 noop.py {py_file:.1} ms, python3 -c pass {py_c:.1} ms ({runs} runs, medians)");

    // A root server refuses unsandboxed runs without dedicated uids.
    let uids: &[&str] = if is_root() { &["--run-as-uids", "63000-63009"] } else { &[] };
    // `BENCH_PARTS=audit`: only the audit trail's cost.
    if std::env::var("BENCH_PARTS").is_ok_and(|p| p.trim() == "audit") {
        audit_cost(dir.path(), uids, runs);
        return;
    }
    // `BENCH_PARTS=helper`: only the spawn helper against the server forking itself.
    if std::env::var("BENCH_PARTS").is_ok_and(|p| p.trim() == "helper") {
        helper_cost(dir.path(), uids, runs);
        return;
    }
    let baseline = std::env::var("RUN_OVERHEAD_BASELINE_BIN").ok();
    // `BENCH_PARTS=baseline`: only this build against the baseline build, unsandboxed.
    if std::env::var("BENCH_PARTS").is_ok_and(|p| p.trim() == "baseline") {
        let bin = baseline.as_deref().expect("BENCH_PARTS=baseline needs RUN_OVERHEAD_BASELINE_BIN");
        baseline_cost(dir.path(), uids, runs, bin);
        return;
    }
    let mut configs: Vec<(String, String, Vec<&str>)> = vec![
        ("sandbox off".into(), BIN.into(), [&["--sandbox", "off"][..], uids].concat()),
        ("bubblewrap, no cgroup".into(), BIN.into(), vec!["--sandbox", "required", "--sandbox-backend", "bwrap", "--cgroup", "off"]),
        (
            "same, favordynmods not asked for".into(),
            BIN.into(),
            vec!["--sandbox", "required", "--sandbox-backend", "bwrap", "--cgroup", "required", "--cgroup-favor-dynmods", "false"],
        ),
        (
            "bubblewrap, cgroup + sized mounts".into(),
            BIN.into(),
            vec!["--sandbox", "required", "--sandbox-backend", "bwrap", "--cgroup", "required"],
        ),
        (
            "built-in sandbox, cgroup + sized mounts".into(),
            BIN.into(),
            vec!["--sandbox", "required", "--sandbox-backend", "builtin", "--cgroup", "required"],
        ),
    ];
    if let Some(bin) = &baseline {
        configs.push(("bubblewrap, baseline build".into(), bin.clone(), vec!["--sandbox", "required"]));
    }
    let mut sandboxed: Vec<(String, f64, f64)> = Vec::new();
    for (label, bin, flags) in &configs {
        let data = tempfile::tempdir().unwrap();
        std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut server = Server::start(bin, dir.path(), data.path(), flags);
        let node = server.median_run("scripts/noop.js", runs);
        let python = server.median_run("scripts/noop.py", runs);
        println!(
            "skill_run {label:<36} node median {node:.1} ms (overhead {:.1} ms), python median {python:.1} ms (overhead {:.1} ms)",
            node - node_file,
            python - py_file
        );
        sandboxed.push((label.clone(), node, python));
    }
    audit_cost(dir.path(), uids, runs);
    helper_cost(dir.path(), uids, runs);

    // "Not asked for" runs first: from Linux 6.18 on, favordynmods stays on
    // once a server has asked for it, so only that order shows both on a
    // freshly booted host (later runs of this bench show the favoured cost twice).
    if let (Some((_, n0, p0)), Some((_, n1, p1))) = (sandboxed.get(1), sandboxed.get(2)) {
        println!("added by the cgroup per run, favordynmods not asked for: node {:+.1} ms, python {:+.1} ms", n1 - n0, p1 - p0);
    }
    if let (Some((_, n0, p0)), Some((_, n1, p1))) = (sandboxed.get(1), sandboxed.get(3)) {
        println!("added by the cgroup per run (with its watcher): node {:+.1} ms, python {:+.1} ms", n1 - n0, p1 - p0);
    }
    let row = |label: &str| sandboxed.iter().find(|(l, _, _)| l == label).map(|(_, n, p)| (*n, *p));
    if let (Some((nb, pb)), Some((n1, p1))) = (row("bubblewrap, cgroup + sized mounts"), row("built-in sandbox, cgroup + sized mounts")) {
        println!(
            "built-in sandbox vs bubblewrap, same run: node {:+.1} ms ({:.2}x), python {:+.1} ms ({:.2}x)",
            n1 - nb,
            n1 / nb,
            p1 - pb,
            p1 / pb
        );
    }
    if let (Some((_, nb, pb)), Some((_, n1, p1))) = (sandboxed.iter().find(|(l, _, _)| l == "bubblewrap, baseline build"), sandboxed.get(3))
    {
        println!("this build vs the baseline build, sandboxed: node {:+.1} ms, python {:+.1} ms", n1 - nb, p1 - pb);
    }
    if let Some(bin) = &baseline {
        baseline_cost(dir.path(), uids, runs, bin);
    }

    // The parts on their own.
    let old = time_ms(runs, || bwrap_true(false));
    let new = time_ms(runs, || bwrap_true(true));
    println!("bwrap true: old mounts {old:.2} ms, sized and read-only {new:.2} ms ({:+.2} ms)", new - old);
    use skill_operator::runner::cgroup::{Cgroups, RunLimits};
    match Cgroups::detect(None, RunLimits::default(), true) {
        Ok(cg) => {
            let mut n = 0;
            let ms = time_ms(runs, || {
                n += 1;
                cg.create(&format!("bench-{n}")).unwrap().remove();
            });
            println!("cgroup made, limited and removed: {ms:.2} ms ({})", cg.describe());
            // What a run's join costs after a quiet spell, as runs see it:
            // the first migration after idle is the one that may wait for
            // an RCU grace period.
            let mut joins = Vec::new();
            for i in 0..runs {
                let run = cg.create(&format!("join-{i}")).unwrap();
                let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                let pid = sleeper.id().to_string();
                let t = Instant::now();
                for fd in run.join_fds() {
                    let n = unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(fd.as_ref()), pid.as_ptr().cast(), pid.len()) };
                    assert_eq!(n, pid.len() as isize);
                }
                joins.push(t.elapsed().as_secs_f64() * 1000.0);
                sleeper.kill().unwrap();
                sleeper.wait().unwrap();
                run.remove();
            }
            println!(
                "a process joining a run cgroup after 50 ms of quiet: {:.2} ms (favordynmods {})",
                median(joins),
                if cg.migrations_favored() { "on" } else { "refused" }
            );
        }
        Err(why) => println!("cgroup: not available here ({why})"),
    }
    if is_root() {
        let root = tempfile::tempdir().unwrap();
        let ms = time_ms(runs, || {
            drop(skill_operator::runner::tmpfs::RunTmpfs::mount(&root.path().join("t"), (65534, 65534)).unwrap());
        });
        println!("per-run tmpfs mounted and unmounted: {ms:.2} ms");
    }
}
