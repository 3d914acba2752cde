//! The TCP → unix-socket forwarder, for real: the proxy serves one run on
//! a unix socket in this process; a second process in its own network
//! namespace (`unshare --net`, only a loopback) runs the forwarder on
//! 127.0.0.1 and talks through it. It reaches the allowed host through the
//! proxy, is refused another host with the proxy's reason, and cannot
//! reach the host's loopback directly. Without `unshare` (or without the
//! privilege for it) the second process runs on the host's loopback
//! instead, and the direct-reach check is skipped.
//!
//! The second process is this test binary again, running
//! `forwarder_child_process` with `EGRESS_FORWARD_CHILD` set; in a normal
//! run that test returns at once.

#[path = "egress/support.rs"]
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use skill_operator::egress::forward;
use skill_operator::egress::{JobBudget, JobId};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHILD_ENV: &str = "EGRESS_FORWARD_CHILD";
const FORWARD_PORT: u16 = 3128;

fn netns_available() -> bool {
    std::process::Command::new("unshare")
        .args(["--net", "--", "ip", "link", "set", "lo", "up"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_netns_reaches_only_the_proxy_through_the_forwarder() {
    let (up, _) = http_upstream(Arc::new(HashMap::new())).await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    h.resolver.set("other.test", &["127.0.0.1"]);
    h.job_with("run-1", &[&format!("allowed.test:{}", up.port())], None, JobBudget::default());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("egress.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let proxy = h.proxy.clone();
    let served = tokio::spawn(async move {
        proxy
            .serve_unix(listener, JobId::new("team", "run-1"), async {
                let _ = rx.await;
            })
            .await
    });

    let exe = std::env::current_exe().unwrap();
    let isolated = netns_available();
    let mut cmd = if isolated {
        let mut c = tokio::process::Command::new("unshare");
        c.args(["--net", "--", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""]).arg(&exe);
        c
    } else {
        println!("note: unshare --net is not available; the forwarder runs as a second process on the host loopback");
        tokio::process::Command::new(&exe)
    };
    let forward_port =
        if isolated { FORWARD_PORT } else { std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port() };
    cmd.args(["--exact", "forwarder_child_process", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("EGRESS_SOCKET", &socket)
        .env("EGRESS_FORWARD_PORT", forward_port.to_string())
        .env("EGRESS_UPSTREAM_PORT", up.port().to_string())
        .env("EGRESS_ISOLATED", if isolated { "1" } else { "0" })
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output()).await.expect("child timed out").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "child failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    println!(
        "child (isolated={isolated}):\n{}",
        stdout
            .lines()
            .filter(|l| l.contains("RELAYED") || l.starts_with("REFUSED") || l.starts_with("DIRECT"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(stdout.contains(&format!("RELAYED HTTP/1.1 200 OK hello host=allowed.test:{} path=/through-forwarder", up.port())), "{stdout}");
    assert!(stdout.contains("REFUSED 403 host_not_allowed"), "{stdout}");
    if isolated {
        assert!(stdout.contains("DIRECT unreachable"), "{stdout}");
    }
    h.wait_count("allowed", "ok", 1).await;
    h.wait_count("refused", "host_not_allowed", 1).await;
    assert_eq!(h.count("refused", "host_not_allowed"), 1, "one refusal, counted once");
    tx.send(()).unwrap();
    served.await.unwrap().unwrap();
    h.stop().await;
}

/// The second process (see the module docs).
#[tokio::test]
async fn forwarder_child_process() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap();
    let socket = std::path::PathBuf::from(var("EGRESS_SOCKET"));
    let port: u16 = var("EGRESS_FORWARD_PORT").parse().unwrap();
    let upstream: u16 = var("EGRESS_UPSTREAM_PORT").parse().unwrap();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(forward::forward(listener, socket, std::future::pending()));
    let proxy = format!("127.0.0.1:{port}");

    // Plain HTTP through the forwarder, as a script with http_proxy would.
    let mut s = tokio::net::TcpStream::connect(&proxy).await.unwrap();
    s.write_all(format!("GET http://allowed.test:{upstream}/through-forwarder HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let status = text.lines().next().unwrap_or_default().to_string();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().trim().to_string();
    println!("RELAYED {status} {body}");

    // A host the run may not reach: the proxy's refusal comes back through.
    let mut s = tokio::net::TcpStream::connect(&proxy).await.unwrap();
    s.write_all(format!("CONNECT other.test:{upstream} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
    let reply = read_reply(&mut s).await;
    println!("REFUSED {} {}", reply.status, reply.refused().unwrap_or("-"));

    // The host's loopback is another namespace's: nothing listens here.
    if var("EGRESS_ISOLATED") == "1" {
        match tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await {
            Ok(_) => println!("DIRECT reachable"),
            Err(e) => println!("DIRECT unreachable ({e})"),
        }
    }
}
