//! Issue 9, class 1, and the standalone half of issue 12: no run reaches
//! the server or any host-local service, whatever it was granted; granted
//! egress goes through the in-process egress proxy and reaches exactly
//! the declared hosts.
//!
//! Before, a skill declaring any egress host ran with the host's network
//! namespace and its script called the server's own `/mcp`. Here the
//! script of such a skill tries, from inside its sandbox: the allowed
//! test host through the proxy (reached); the server's HTTP port and
//! another loopback service directly (no route: its namespace has only
//! its own loopback) and through the proxy (refused: port not allowed, IP
//! literal, name not allowed). A skill that declares no egress has no
//! network at all, not even the proxy. Unsandboxed, the preview says
//! egress is not enforced, and `--sandbox required` refuses.
#[path = "fence/harness.rs"]
mod harness;

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use harness::*;
use skill_operator::egress::Resolver;
use skill_operator::jobs::JobState;
use skill_operator::mcp::executor::Executor;
use skill_operator::runner::local::SandboxMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Names the test answers itself.
#[derive(Default)]
struct Names(Mutex<HashMap<String, Vec<IpAddr>>>);

impl Resolver for Names {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        let found = self.0.lock().unwrap().get(host).cloned();
        Box::pin(async move { found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "unknown test name")) })
    }
}

/// An HTTP server on loopback answering every request with `body`; counts requests.
async fn http_server(body: &'static str) -> (u16, Arc<Mutex<usize>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(Mutex::new(0usize));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            *counter.lock().unwrap() += 1;
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (port, hits)
}

const PROBE: &str = r#"import json, socket, sys, urllib.request, urllib.error
allowed, server, other = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out = {}
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} {e.read().decode().strip()}"
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
def direct(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
def connect(target):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        return s.recv(4096).decode().split("\r\n")[0] + " " + s.recv(4096).decode().strip()
    except OSError as e:
        return type(e).__name__
out["allowed"] = get(f"http://allowed.test:{allowed}/hello")
out["direct_server"] = direct(server)
out["direct_other"] = direct(other)
out["direct_allowed"] = direct(allowed)
out["proxy_server_port"] = get(f"http://allowed.test:{server}/mcp")
out["proxy_connect_server_port"] = connect(f"allowed.test:{server}")
out["proxy_ip_literal"] = get(f"http://127.0.0.1:{allowed}/hello")
out["proxy_other_name"] = get(f"http://other.test:{allowed}/hello")
out["proxy_localhost"] = get(f"http://localhost:{server}/mcp")
print(json.dumps(out))
"#;

fn host(egress: &str) -> String {
    format!("  version: 1\n  run:\n    - script: scripts/probe.py\n      interpreter: python\n      timeout: 60\n  egress: {egress}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_egress_reaches_the_allowed_host_and_nothing_else() {
    if !bwrap_works() {
        skill_operator::gated::skip(module_path!(), "needs bubblewrap");
        return;
    }
    let (allowed, allowed_hits) = http_server("hello from the allowed host").await;
    // Stand-ins for the server's own endpoint and another host-local service.
    let (server, server_hits) = http_server("the server's /mcp").await;
    let (other, other_hits) = http_server("another loopback service").await;
    let world = World::new();
    world.skill("net", &host(&format!("[\"allowed.test:{allowed}\"]")), &[("scripts/probe.py", PROBE)]);
    let names = Arc::new(Names::default());
    for n in ["allowed.test", "other.test", "localhost"] {
        names.0.lock().unwrap().insert(n.into(), vec!["127.0.0.1".parse().unwrap()]);
    }
    let resolver: Arc<dyn Resolver> = names.clone();
    let exec = world
        .executor(|o| {
            // The test host lives on loopback: allow that address on purpose
            // (ProxyConfig's test allowance); the allowlist still names one host:port.
            o.runner.egress.allow_cidrs = vec!["127.0.0.1/32".parse().unwrap()];
            o.runner.egress.resolver = Some(resolver);
        })
        .await;
    let plan = world.plan("net", "scripts/probe.py", &[&allowed.to_string(), &server.to_string(), &other.to_string()]);
    let preview = exec.describe(&plan, None).await.unwrap();
    assert!(preview.network.starts_with(&format!("only through the egress proxy, to allowed.test:{allowed}")), "{}", preview.network);
    for name in
        ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "NO_PROXY", "NODE_USE_ENV_PROXY", "PIP_PROXY", "npm_config_https_proxy"]
    {
        assert!(preview.env.iter().any(|n| n == name), "{name} handed over: {:?}", preview.env);
    }
    let report = run(&exec, plan, vec![]).await;
    assert_eq!(report.record.state, JobState::Succeeded, "{}", text(&report.stderr));
    let got: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&report.stdout)));
    println!("{}", serde_json::to_string_pretty(&got).unwrap());
    let s = |k: &str| got[k].as_str().unwrap_or_default().to_string();
    assert_eq!(s("allowed"), "hello from the allowed host");
    for k in ["direct_server", "direct_other", "direct_allowed"] {
        assert_eq!(s(k), "ConnectionRefusedError", "{k}: the sandbox has no route to the host's loopback");
    }
    assert!(s("proxy_server_port").starts_with("HTTP 403") && s("proxy_server_port").contains("port"), "{}", s("proxy_server_port"));
    assert!(s("proxy_connect_server_port").starts_with("HTTP/1.1 403"), "{}", s("proxy_connect_server_port"));
    assert!(s("proxy_ip_literal").starts_with("HTTP 403"), "{}", s("proxy_ip_literal"));
    assert!(
        s("proxy_other_name").starts_with("HTTP 403") && s("proxy_other_name").contains("host_not_allowed"),
        "{}",
        s("proxy_other_name")
    );
    assert!(s("proxy_localhost").starts_with("HTTP 403"), "{}", s("proxy_localhost"));
    assert_eq!(*allowed_hits.lock().unwrap(), 1, "exactly the one allowed request reached the allowed host");
    assert_eq!(*server_hits.lock().unwrap(), 0, "nothing reached the server's port");
    assert_eq!(*other_hits.lock().unwrap(), 0, "nothing reached the other loopback service");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_declared_egress_means_no_network_at_all() {
    if !bwrap_works() {
        skill_operator::gated::skip(module_path!(), "needs bubblewrap");
        return;
    }
    let (server, hits) = http_server("the server's /mcp").await;
    let world = World::new();
    world.skill("quiet", &host("[]"), &[("scripts/probe.py", PROBE)]);
    let exec = world.executor(|o| o.runner.egress.allow_cidrs = vec!["127.0.0.1/32".parse().unwrap()]).await;
    let plan = world.plan("quiet", "scripts/probe.py", &[&server.to_string(), &server.to_string(), &server.to_string()]);
    assert!(!plan.egress_granted);
    let preview = exec.describe(&plan, None).await.unwrap();
    assert_eq!(preview.network, "none (own network namespace)");
    assert!(!preview.env.iter().any(|n| n.to_ascii_lowercase().contains("proxy")), "{:?}", preview.env);
    let report = run(&exec, plan, vec![]).await;
    let got: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&report.stdout)));
    for k in ["direct_server", "direct_other", "direct_allowed", "proxy_connect_server_port"] {
        assert_eq!(got[k], "ConnectionRefusedError", "{k}: {got}");
    }
    assert_eq!(*hits.lock().unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsandboxed_egress_is_said_to_be_unenforced() {
    let world = World::new();
    world.skill("net", &host("[\"api.example.com\"]"), &[("scripts/probe.py", PROBE)]);
    let plan = world.plan("net", "scripts/probe.py", &[]);
    let off = world
        .executor(|o| {
            o.runner.sandbox = SandboxMode::Off;
            o.runner.run_as_uids = Some("62900-62909".parse().unwrap());
        })
        .await;
    let preview = off.describe(&plan, None).await.unwrap();
    assert!(preview.network.contains("egress is NOT enforced"), "{}", preview.network);
    assert_eq!(preview.sandbox, "off");
}
