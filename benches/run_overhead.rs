//! `skill_run` overhead beyond the interpreter's own start.
//!
//! For node and python: the median time of spawning the interpreter directly
//! on an empty script (and `node -e 0` / `python3 -c pass`), against the
//! median client-side latency of a confirmed `skill_run` of the same script
//! over stdio (`--confirm auto`), with the sandbox off and with bubblewrap.
//! The overhead is the difference of the medians. Each run's job is deleted
//! afterwards (not timed) so the retention cap never interferes.
//!
//! Run: `cargo bench --bench run_overhead`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
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
    fn start(skills: &Path, data: &Path, sandbox: &str) -> Server {
        let mut child = Command::new(BIN)
            .args(["serve", "--confirm", "auto", "--sandbox", sandbox, "--skills"])
            .arg(skills)
            .arg("--data-dir")
            .arg(data)
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
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs = if quick { 3 } else { 40 };
    let dir = tempfile::tempdir().unwrap();
    skills(dir.path());
    let js = dir.path().join("noop/scripts/noop.js");
    let py = dir.path().join("noop/scripts/noop.py");
    let node_file = direct("/usr/bin/node", &[js.to_str().unwrap()], runs);
    let node_e = direct("/usr/bin/node", &["-e", "0"], runs);
    let py_file = direct("/usr/bin/python3", &[py.to_str().unwrap()], runs);
    let py_c = direct("/usr/bin/python3", &["-c", "pass"], runs);
    println!("direct: node noop.js {node_file:.1} ms, node -e 0 {node_e:.1} ms, python3 noop.py {py_file:.1} ms, python3 -c pass {py_c:.1} ms ({runs} runs, medians)");
    for sandbox in ["off", "auto"] {
        let data = tempfile::tempdir().unwrap();
        let mut server = Server::start(dir.path(), data.path(), sandbox);
        for (script, base) in [("scripts/noop.js", node_file), ("scripts/noop.py", py_file)] {
            let mut times = Vec::new();
            for _ in 0..runs + 1 {
                let (ms, job) = server.run(script);
                times.push(ms);
                server.call("tools/call", &format!(r#"{{"name":"skill_job_delete","arguments":{{"job":"{job}"}}}}"#));
            }
            times.remove(0); // first run warms caches
            let m = median(times);
            println!("skill_run sandbox={sandbox:<4} {script:<16} median {m:.1} ms, overhead beyond the interpreter {:.1} ms", m - base);
        }
    }
}
