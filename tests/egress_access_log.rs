//! The egress proxy's access log: one line per request with its fields.
//! In a test binary of its own, under a global subscriber set before any
//! event: in tests/egress.rs a subscriber of one test (`set_default`)
//! raced the other tests' threads over tracing's shared interest cache and
//! max level, and once saw no line at all.

#[path = "egress/support.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn egress_lines(&self) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().filter(|l| l.contains("egress")).map(String::from).collect()
    }
}

#[tokio::test]
async fn each_request_writes_one_access_log_line() {
    let capture = Capture::default();
    let c = capture.clone();
    let subscriber =
        tracing_subscriber::fmt().with_ansi(false).with_max_level(tracing::Level::INFO).with_writer(move || c.clone()).finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this binary");

    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let (mut s, _) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    s.write_all(b"12345").await.unwrap();
    let mut back = [0u8; 5];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back)).await.unwrap().unwrap();
    assert_eq!(&back, b"12345");
    drop(s);
    // The line is written after the request is counted: wait for the line.
    wait_for(|| capture.egress_lines().len() == 1).await;
    let (_, _) = connect(h.addr, "other.test:443", Some(&token)).await;
    wait_for(|| capture.egress_lines().len() == 2).await;
    let lines = capture.egress_lines();
    let port = up.port();
    for field in [
        "job=team/a",
        "kind=\"connect\"",
        "host=allowed.test",
        &format!("port={port}"),
        &format!("addr=127.0.0.1:{port}"),
        "up=5",
        "down=5",
        "verdict=\"allowed\"",
        "reason=\"ok\"",
        "ms=",
    ] {
        assert!(lines[0].contains(field), "{field} missing in {}", lines[0]);
    }
    for field in ["host=other.test", "verdict=\"refused\"", "reason=\"host_not_allowed\"", "addr=-"] {
        assert!(lines[1].contains(field), "{field} missing in {}", lines[1]);
    }
    assert_eq!((h.count("allowed", "ok"), h.count("refused", "host_not_allowed")), (1, 1));
    h.stop().await;
}
