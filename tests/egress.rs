//! The egress proxy against real sockets on loopback: its own upstream
//! servers (plain HTTP, HTTPS with a test CA, echo, byte source) and a
//! resolver the tests control. Each test names the rule it proves; without
//! that rule its assertion fails (an allowed byte would come back, a
//! handshake would complete, a connection would stay open).

#[path = "egress/support.rs"]
mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use skill_operator::egress::identity::authorization_value;
use skill_operator::egress::tls::{build_client_hello, ALERT_UNRECOGNIZED_NAME};
use skill_operator::egress::{proxy_token, JobBudget, JobId, JobRegistry, ProxyConfig};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn no_files() -> Files {
    Arc::new(HashMap::new())
}

/// Ping through a tunnel to the echo server.
async fn echoes(s: &mut TcpStream, msg: &[u8]) -> bool {
    if s.write_all(msg).await.is_err() {
        return false;
    }
    let mut back = vec![0u8; msg.len()];
    matches!(tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back)).await, Ok(Ok(_))) && back == msg
}

/// What a refused ClientHello gets: the alert, then end of stream.
async fn alert_then_eof(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    got
}

#[tokio::test]
async fn connect_to_an_allowed_host_completes_tls_end_to_end() {
    let pki = pki();
    let (up, seen) = https_upstream(pki.server.clone(), no_files()).await;
    let mut cfg = test_config();
    cfg.tls_ports = vec![up.port()];
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);

    let (stream, reply) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let mut tls = tls_over(stream, pki.client.clone(), "allowed.test").await.expect("TLS through the tunnel");
    tls.write_all(b"GET /hi HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await.unwrap();
    let mut page = String::new();
    tls.read_to_string(&mut page).await.unwrap();
    assert!(page.contains("hello host=allowed.test path=/hi"), "{page}");
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
    assert_eq!(h.resolver.calls("allowed.test"), 1);
    drop(tls);
    wait_for(|| h.count("allowed", "ok") == 1).await;
    h.stop().await;
}

#[tokio::test]
async fn plain_http_is_forwarded_with_host_from_the_uri_and_no_proxy_headers() {
    let (up, seen) = http_upstream(no_files()).await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let url = format!("http://allowed.test:{}/path?q=1", up.port());
    let (reply, _) = http_get(h.addr, &url, Some(&token), "Connection: keep-alive\r\n").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    // Host comes from the URI (the client's `Host: ignored.test` would pick
    // another virtual host), the credential is not passed on.
    assert_eq!(reply.body, format!("hello host=allowed.test:{} path=/path?q=1 proxy-auth=false\n", up.port()));
    assert_eq!(reply.header("connection"), Some("close"));
    assert_eq!(reply.header("keep-alive"), None);
    let head = seen.last_head.lock().unwrap().clone();
    assert!(head.starts_with("GET /path?q=1 HTTP/1.1\r\n"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("keep-alive"), "{head}");
    h.stop().await;
}

#[tokio::test]
async fn other_hosts_and_other_ports_are_refused_without_a_lookup() {
    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    h.resolver.set("other.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);

    let (_, reply) = connect(h.addr, &format!("other.test:{}", up.port()), Some(&token)).await;
    assert_eq!((reply.status, reply.refused()), (403, Some("host_not_allowed")));
    assert!(reply.body.starts_with("egress refused (host_not_allowed): other.test is not on this job's allowlist"), "{}", reply.body);
    let (_, reply) = connect(h.addr, "allowed.test:443", Some(&token)).await;
    assert_eq!((reply.status, reply.refused()), (403, Some("port_not_allowed")));
    assert!(reply.body.contains(&format!("(allowed: {})", up.port())), "{}", reply.body);
    let (reply, _) = http_get(h.addr, &format!("http://other.test:{}/", up.port()), Some(&token), "").await;
    assert_eq!(reply.refused(), Some("host_not_allowed"));
    // A refused name is never resolved: DNS is no side channel.
    assert_eq!(h.resolver.calls("other.test"), 0);
    let (mut s, reply) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    assert_eq!(reply.status, 200);
    assert!(echoes(&mut s, b"ping").await);
    h.stop().await;
}

#[tokio::test]
async fn wildcards_cover_names_below_the_suffix_only() {
    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    for name in ["a.wild.test", "a.b.wild.test", "wild.test", "badwild.test"] {
        h.resolver.set(name, &["127.0.0.1"]);
    }
    let token = h.job("a", &[&format!("*.wild.test:{}", up.port())]);
    for (name, ok) in [("a.wild.test", true), ("a.b.wild.test", true), ("wild.test", false), ("badwild.test", false)] {
        let (_, reply) = connect(h.addr, &format!("{name}:{}", up.port()), Some(&token)).await;
        assert_eq!(reply.status == 200, ok, "{name}: {reply:?}");
    }
    h.stop().await;
}

#[tokio::test]
async fn every_ip_literal_form_is_refused_and_only_the_listed_canonical_ip_passes() {
    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    let p = up.port();
    // 127.0.0.1 is listed as an IP entry: only that spelling may pass.
    let token = h.job("a", &[&format!("allowed.test:{p}"), &format!("127.0.0.1:{p}")]);
    let forms = [
        "2130706433",
        "0177.0.0.1",
        "0x7f.0.0.1",
        "0x7f000001",
        "0X7F.0X0.0X0.0X1",
        "017700000001",
        "127.1",
        "127.0.1",
        "127.0.0.1.",
        "127.000.000.001",
        "\u{ff11}\u{ff12}\u{ff17}.0.0.1",
        "127\u{3002}0\u{3002}0\u{3002}1",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::127.0.0.1]",
        "[::1]",
        "[fe80::1%25lo]",
        "[fe80::1%lo]",
        "127.0.0.2",
        "169.254.169.254",
    ];
    for form in forms {
        let (_, reply) = connect(h.addr, &format!("{form}:{p}"), Some(&token)).await;
        assert_eq!((reply.status, reply.refused()), (403, Some("ip_literal")), "{form}: {}", reply.body);
    }
    let (reply, _) = http_get(h.addr, &format!("http://2130706433:{p}/"), Some(&token), "").await;
    assert_eq!(reply.refused(), Some("ip_literal"));
    let (mut s, reply) = connect(h.addr, &format!("127.0.0.1:{p}"), Some(&token)).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(echoes(&mut s, b"listed").await);
    h.stop().await;
}

#[tokio::test]
async fn names_that_resolve_to_internal_addresses_are_refused() {
    let (up, _) = echo_upstream().await;
    let p = up.port();
    let mut cfg = test_config();
    // A pod CIDR inside the test allowance: the longer deny still wins.
    cfg.deny_cidrs = vec!["127.0.0.128/25".parse().unwrap(), "8.8.8.0/24".parse().unwrap()];
    let h = Harness::start(cfg).await;
    let table: &[(&str, &[&str], &str)] = &[
        ("metadata.test", &["169.254.169.254"], "link-local"),
        ("ten.test", &["10.0.0.7"], "private"),
        ("172.test", &["172.16.0.1"], "private"),
        ("192.test", &["192.168.1.1"], "private"),
        ("cgnat.test", &["100.64.0.1"], "CGNAT"),
        ("zero.test", &["0.0.0.0"], "unspecified"),
        ("bench.test", &["198.18.0.1"], "benchmarking"),
        ("multicast.test", &["224.0.0.1"], "multicast"),
        ("broadcast.test", &["255.255.255.255"], "broadcast"),
        ("reserved.test", &["240.0.0.1"], "reserved"),
        ("doc.test", &["192.0.2.1"], "documentation"),
        ("mapped.test", &["::ffff:10.0.0.1"], "embeds 10.0.0.1"),
        ("mapped-loop.test", &["::ffff:127.0.0.1"], "embeds 127.0.0.1"),
        ("nat64.test", &["64:ff9b::a9fe:a9fe"], "embeds 169.254.169.254"),
        ("sixtofour.test", &["2002:a9fe:a9fe::1"], "embeds 169.254.169.254"),
        ("teredo.test", &["2001:0:7f00:1::fefe:fefe"], "embeds 127.0.0.1"),
        ("compat.test", &["::8.8.4.4"], "IPv4-compatible"),
        ("ula.test", &["fd00::1"], "unique local"),
        ("linklocal6.test", &["fe80::1"], "link-local"),
        ("loop6.test", &["::1"], "loopback"),
        ("site6.test", &["fec0::1"], "reserved"),
        ("mixed.test", &["127.0.0.1", "10.0.0.1"], "10.0.0.1 is private"),
        ("podcidr.test", &["127.0.0.200"], "denied range 127.0.0.128/25"),
        ("public-denied.test", &["8.8.8.8"], "denied range 8.8.8.0/24"),
    ];
    let allow: Vec<String> = table.iter().map(|(n, _, _)| format!("{n}:{p}")).collect();
    let token = h.job("a", &allow.iter().map(String::as_str).collect::<Vec<_>>());
    for (name, ips, why) in table {
        h.resolver.set(name, ips);
        let (_, reply) = connect(h.addr, &format!("{name}:{p}"), Some(&token)).await;
        assert_eq!((reply.status, reply.refused()), (403, Some("address_denied")), "{name}: {}", reply.body);
        assert!(reply.body.contains(why), "{name}: {}", reply.body);
    }
    wait_for(|| h.count("refused", "address_denied") == table.len() as u64).await;
    h.stop().await;
}

#[tokio::test]
async fn loopback_is_refused_unless_the_allowance_lists_it() {
    let (up, seen) = echo_upstream().await;
    let h = Harness::start(ProxyConfig::new(KEY.to_vec())).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let (_, reply) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    assert_eq!(reply.refused(), Some("address_denied"));
    assert!(reply.body.contains("127.0.0.1 is loopback"), "{}", reply.body);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 0);
    h.stop().await;
}

#[tokio::test]
async fn a_name_that_rebinds_is_checked_afresh_on_the_next_request() {
    let (up, seen) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    let token = h.job("a", &[&format!("rebind.test:{}", up.port())]);
    h.resolver.sequence("rebind.test", &[&["127.0.0.1"], &["169.254.169.254"]]);
    let (mut s, reply) = connect(h.addr, &format!("rebind.test:{}", up.port()), Some(&token)).await;
    assert_eq!(reply.status, 200);
    assert!(echoes(&mut s, b"first").await);
    let (_, reply) = connect(h.addr, &format!("rebind.test:{}", up.port()), Some(&token)).await;
    assert_eq!(reply.refused(), Some("address_denied"), "{reply:?}");
    assert!(reply.body.contains("169.254.169.254"), "{}", reply.body);
    assert_eq!(h.resolver.calls("rebind.test"), 2);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
    h.stop().await;
}

#[tokio::test]
async fn one_request_resolves_once_and_dials_the_address_it_checked() {
    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    let token = h.job("a", &[&format!("flip.test:{}", up.port())]);
    // A second lookup within the request would get the metadata address.
    h.resolver.sequence("flip.test", &[&["127.0.0.1"], &["169.254.169.254"]]);
    let (mut s, reply) = connect(h.addr, &format!("flip.test:{}", up.port()), Some(&token)).await;
    assert_eq!(reply.status, 200);
    assert!(echoes(&mut s, b"checked").await);
    assert_eq!(h.resolver.calls("flip.test"), 1);
    h.stop().await;
}

#[tokio::test]
async fn the_proxy_never_dials_itself() {
    let h = Harness::start(test_config()).await;
    h.resolver.set("self.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("self.test:{}", h.addr.port())]);
    let (_, reply) = connect(h.addr, &format!("self.test:{}", h.addr.port()), Some(&token)).await;
    assert_eq!(reply.refused(), Some("address_denied"));
    assert!(reply.body.contains("the proxy itself"), "{}", reply.body);
    h.stop().await;
}

#[tokio::test]
async fn sni_other_than_the_connect_host_is_refused() {
    let pki = pki();
    let (up, seen) = https_upstream(pki.server.clone(), no_files()).await;
    let mut cfg = test_config();
    cfg.tls_ports = vec![up.port()];
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let (stream, reply) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    assert_eq!(reply.status, 200);
    // The certificate covers other.test too: only the SNI rule stops this.
    let err = tls_over(stream, pki.client.clone(), "other.test").await.expect_err("fronted handshake must fail");
    assert!(err.to_string().contains("UnrecognisedName") || err.to_string().contains("unrecognized"), "{err}");
    wait_for(|| h.count("refused", "sni_mismatch") == 1).await;
    assert_eq!(seen.requests.load(Ordering::SeqCst), 0);
    h.stop().await;
}

#[tokio::test]
async fn missing_sni_ech_mismatch_and_non_tls_are_refused_on_a_tls_port() {
    let (up, seen) = echo_upstream().await;
    let mut cfg = test_config();
    cfg.tls_ports = vec![up.port()];
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let authority = format!("allowed.test:{}", up.port());

    // The echo server would send any forwarded byte straight back.
    let cases: &[(Vec<u8>, &str, bool)] = &[
        (build_client_hello(None, false, 0), "sni_missing", true),
        (build_client_hello(Some("cdn.other.test"), true, 64), "ech_outer_mismatch", true),
        (build_client_hello(None, true, 0), "ech_outer_mismatch", true),
        (build_client_hello(Some("other.test"), false, 0), "sni_mismatch", true),
        (b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n".to_vec(), "not_tls", false),
    ];
    for (bytes, reason, alert) in cases {
        let (mut s, reply) = connect(h.addr, &authority, Some(&token)).await;
        assert_eq!(reply.status, 200);
        s.write_all(bytes).await.unwrap();
        let got = alert_then_eof(&mut s).await;
        let want: &[u8] = if *alert { &ALERT_UNRECOGNIZED_NAME } else { b"" };
        assert_eq!(got, want, "{reason}");
        wait_for(|| h.count("refused", reason) >= 1).await;
    }
    assert_eq!(seen.bytes.load(Ordering::SeqCst), 0);

    // ECH whose outer name is the CONNECT host passes; so does a hello in one-byte pieces.
    for hello in [build_client_hello(Some("allowed.test"), true, 0), build_client_hello(Some("allowed.test"), false, 500)] {
        let (mut s, _) = connect(h.addr, &authority, Some(&token)).await;
        for b in &hello {
            s.write_all(&[*b]).await.unwrap();
        }
        let mut back = vec![0u8; hello.len()];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(back, hello);
    }
    h.stop().await;
}

#[tokio::test]
async fn tls_on_other_ports_is_checked_and_other_protocols_pass() {
    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await; // TLS required on 443 only
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let authority = format!("allowed.test:{}", up.port());
    let (mut s, _) = connect(h.addr, &authority, Some(&token)).await;
    s.write_all(&build_client_hello(Some("other.test"), false, 0)).await.unwrap();
    assert_eq!(alert_then_eof(&mut s).await, ALERT_UNRECOGNIZED_NAME);
    let (mut s, _) = connect(h.addr, &authority, Some(&token)).await;
    assert!(echoes(&mut s, b"SSH-2.0-test\r\n").await);
    h.stop().await;
}

#[tokio::test]
async fn missing_wrong_and_other_jobs_credentials_are_refused() {
    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let a = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let b = h.job("b", &[&format!("allowed.test:{}", up.port())]);
    let authority = format!("allowed.test:{}", up.port());

    let (_, reply) = connect(h.addr, &authority, None).await;
    assert_eq!((reply.status, reply.refused()), (407, Some("proxy_auth_required")));
    assert!(reply.header("proxy-authenticate").is_some_and(|v| v.starts_with("Basic")));
    let b_mac = b.rsplit('.').next().unwrap();
    let other_key = proxy_token(&[1u8; 32], &JobId::new("team", "a"));
    let unregistered = proxy_token(&KEY, &JobId::new("team", "ghost"));
    for bad in ["garbage", "team.a.00", &format!("team.a.{b_mac}"), &other_key, &unregistered] {
        let (_, reply) = connect(h.addr, &authority, Some(bad)).await;
        assert_eq!((reply.status, reply.refused()), (407, Some("bad_credentials")), "{bad}: {}", reply.body);
    }
    let raw_reply = raw(h.addr, &format!("CONNECT {authority} HTTP/1.1\r\nProxy-Authorization: Bearer {a}\r\n\r\n")).await;
    assert_eq!(raw_reply.refused(), Some("bad_credentials"));
    let (mut s, reply) = connect(h.addr, &authority, Some(&a)).await;
    assert_eq!(reply.status, 200);
    assert!(echoes(&mut s, b"a").await);
    h.stop().await;
}

/// A run's record reaches the proxy through a watch, which can trail the
/// run's first request (a warm pod's script starts the moment its claim
/// arrives): a request with a valid credential waits up to RECORD_GRACE for
/// its record (or its pod's address), and passes once it comes. One whose
/// record never comes is refused when the grace ends; a bad credential is
/// refused at once.
#[tokio::test]
async fn a_valid_credential_waits_for_its_record_and_passes_once_it_arrives() {
    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let authority = format!("allowed.test:{}", up.port());
    let waiting = || h.proxy.metrics().waiting_for_record.get();

    // No record yet, then the record arrives while the request waits.
    let late = proxy_token(&KEY, &JobId::new("team", "late"));
    let (request, head) = (authority.clone(), late.clone());
    let addr = h.addr;
    let pending = tokio::spawn(async move { connect(addr, &request, Some(&head)).await });
    wait_for(|| waiting() == 1).await;
    h.job("late", &[&authority]);
    let (mut s, reply) = pending.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(echoes(&mut s, b"late").await);
    assert_eq!(waiting(), 0);

    // A record without the pod's address yet, then with it.
    let addressless = h.job_with("moving", &[&authority], None, JobBudget::default());
    let (request, head) = (authority.clone(), addressless.clone());
    let pending = tokio::spawn(async move { connect(addr, &request, Some(&head)).await });
    wait_for(|| waiting() == 1).await;
    h.job_with("moving", &[&authority], Some("127.0.0.1"), JobBudget::default());
    let (_, reply) = pending.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);

    // Never registered: refused once the grace is over, not before.
    let ghost = proxy_token(&KEY, &JobId::new("team", "ghost"));
    let started = Instant::now();
    let (_, reply) = connect(h.addr, &authority, Some(&ghost)).await;
    assert_eq!((reply.status, reply.refused()), (407, Some("bad_credentials")), "{}", reply.body);
    assert!(started.elapsed() >= skill_operator::egress::RECORD_GRACE, "refused before the grace ended: {:?}", started.elapsed());
    // A forged credential never waits.
    let (_, reply) = connect(h.addr, &authority, Some("team.late.00")).await;
    assert_eq!(reply.refused(), Some("bad_credentials"));
    assert_eq!(waiting(), 0, "nothing waits any more");
    h.stop().await;
}

/// A waiting request still counts as pending for its source address: a pod
/// holding a valid credential whose record has not come cannot pile up
/// connections beyond `max_pending_per_address`.
#[tokio::test]
async fn waiting_requests_count_against_the_pending_caps() {
    let mut config = test_config();
    config.limits.max_pending_per_address = 2;
    let h = Harness::start(config).await;
    let waiting = || h.proxy.metrics().waiting_for_record.get();
    let ghost = proxy_token(&KEY, &JobId::new("team", "ghost"));
    let addr = h.addr;
    let held: Vec<_> = (0..2)
        .map(|_| {
            let token = ghost.clone();
            tokio::spawn(async move { connect(addr, "allowed.test:443", Some(&token)).await })
        })
        .collect();
    wait_for(|| waiting() == 2).await;
    let (_, reply) = connect(h.addr, "allowed.test:443", Some(&ghost)).await;
    assert_eq!(reply.refused(), Some("address_busy"), "{}", reply.body);
    assert!(reply.body.contains("waiting for their run's record"), "{}", reply.body);
    for task in held {
        let (_, reply) = task.await.unwrap();
        assert_eq!(reply.refused(), Some("bad_credentials"));
    }
    h.stop().await;
}

#[tokio::test]
async fn the_right_token_from_the_wrong_source_address_is_refused() {
    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let allow = [format!("allowed.test:{}", up.port())];
    let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
    let a = h.job_with("a", &allow, Some("127.0.0.2"), JobBudget::default());
    let b = h.job_with("b", &allow, Some("127.0.0.3"), JobBudget::default());
    let pending = h.job_with("p", &allow, None, JobBudget::default());
    let authority = format!("allowed.test:{}", up.port());

    let (_, reply) = connect_with(h.addr, &authority, Some(&a), Some("127.0.0.1")).await;
    assert_eq!((reply.status, reply.refused()), (403, Some("wrong_source")), "{}", reply.body);
    // Job b's token copied into job a's pod.
    let (_, reply) = connect_with(h.addr, &authority, Some(&b), Some("127.0.0.2")).await;
    assert_eq!(reply.refused(), Some("wrong_source"));
    let (_, reply) = connect_with(h.addr, &authority, Some(&pending), Some("127.0.0.1")).await;
    assert_eq!(reply.refused(), Some("wrong_source"));
    let (mut s, reply) = connect_with(h.addr, &authority, Some(&a), Some("127.0.0.2")).await;
    assert_eq!(reply.status, 200);
    assert!(echoes(&mut s, b"from the pod").await);
    h.stop().await;
}

#[tokio::test]
async fn an_empty_allowlist_denies_everything() {
    let (up, seen) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[]);
    let (_, reply) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    assert_eq!((reply.status, reply.refused()), (403, Some("no_egress")));
    let (reply, _) = http_get(h.addr, &format!("http://allowed.test:{}/", up.port()), Some(&token), "").await;
    assert_eq!(reply.refused(), Some("no_egress"));
    // A binding that narrows to nothing gives the same.
    let allowed = skill_operator::egress::Allowlist::parse([format!("allowed.test:{}", up.port()).as_str()]).unwrap();
    let eff = skill_operator::egress::effective(&allowed, Some(&[]));
    assert!(eff.allowlist.is_empty());
    assert_eq!(seen.connections.load(Ordering::SeqCst), 0);
    h.stop().await;
}

#[tokio::test]
async fn a_unix_socket_is_the_identity_of_its_run() {
    let (up, _) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    h.resolver.set("other.test", &["127.0.0.1"]);
    h.job_with("run-1", &[&format!("allowed.test:{}", up.port())], None, JobBudget::default());
    let served = h.serve_unix("run-1");
    let path = served.path.clone();
    let ask = |authority: String| {
        let path = path.clone();
        async move {
            let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
            s.write_all(format!("CONNECT {authority} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
            let reply = read_reply(&mut s).await;
            (s, reply)
        }
    };
    let (mut s, reply) = ask(format!("allowed.test:{}", up.port())).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    s.write_all(b"unix").await.unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"unix");
    let (_, reply) = ask(format!("other.test:{}", up.port())).await;
    assert_eq!(reply.refused(), Some("host_not_allowed"));
    h.registry.remove(&JobId::new("team", "run-1"));
    let (_, reply) = ask(format!("allowed.test:{}", up.port())).await;
    assert_eq!(reply.refused(), Some("job_gone"));
    served.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn the_byte_budget_cuts_a_tunnel_and_refuses_the_next() {
    let src = source_upstream(1_000_000).await;
    let (echo, seen) = echo_upstream().await;
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let allow = [format!("allowed.test:{}", src.port()), format!("allowed.test:{}", echo.port())];
    let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
    let down = h.job_with("down", &allow, Some("127.0.0.1"), JobBudget { max_bytes_down: Some(100_000), ..Default::default() });
    let (mut s, reply) = connect(h.addr, &format!("allowed.test:{}", src.port()), Some(&down)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(drain(&mut s).await, 100_000);
    wait_for(|| h.count("cut", "byte_budget") == 1).await;
    let (_, reply) = connect(h.addr, &format!("allowed.test:{}", src.port()), Some(&down)).await;
    assert_eq!((reply.status, reply.refused()), (403, Some("byte_budget")));
    assert!(reply.body.contains("max_bytes_down"), "{}", reply.body);

    let up = h.job_with("up", &allow, Some("127.0.0.1"), JobBudget { max_bytes_up: Some(1000), ..Default::default() });
    let (mut s, _) = connect(h.addr, &format!("allowed.test:{}", echo.port()), Some(&up)).await;
    let _ = s.write_all(&[b'z'; 5000]).await;
    drain(&mut s).await;
    wait_for(|| h.count("cut", "byte_budget") == 2).await;
    wait_for(|| seen.bytes.load(Ordering::SeqCst) == 1000).await;
    h.stop().await;
}

#[tokio::test]
async fn a_job_holds_at_most_its_connection_cap_and_the_proxy_its_tunnel_cap() {
    let (up, _) = echo_upstream().await;
    let mut cfg = test_config();
    cfg.limits.max_tunnels = 3;
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let allow = [format!("allowed.test:{}", up.port())];
    let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
    let a = h.job_with("a", &allow, Some("127.0.0.1"), JobBudget { max_connections: Some(2), ..Default::default() });
    let b = h.job("b", &allow);
    let authority = format!("allowed.test:{}", up.port());
    let (mut s1, r1) = connect(h.addr, &authority, Some(&a)).await;
    let (mut s2, r2) = connect(h.addr, &authority, Some(&a)).await;
    assert_eq!((r1.status, r2.status), (200, 200));
    assert!(echoes(&mut s1, b"1").await && echoes(&mut s2, b"2").await);
    let (_, r3) = connect(h.addr, &authority, Some(&a)).await;
    assert_eq!((r3.status, r3.refused()), (403, Some("job_connection_limit")));
    assert!(r3.body.contains("max_connections = 2"), "{}", r3.body);
    // Another job still gets the third tunnel; a fourth exceeds the proxy's cap.
    let (_s3, r) = connect(h.addr, &authority, Some(&b)).await;
    assert_eq!(r.status, 200);
    let (_, r) = connect(h.addr, &authority, Some(&b)).await;
    assert_eq!((r.status, r.refused()), (503, Some("proxy_busy")));
    // Closing one frees the job's slot.
    drop(s1);
    let entry = h.registry.job(&JobId::new("team", "a")).unwrap();
    wait_for(|| entry.usage.active() == 1).await;
    let (mut s4, r4) = connect(h.addr, &authority, Some(&a)).await;
    assert_eq!(r4.status, 200);
    assert!(echoes(&mut s4, b"4").await);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_tunnel_is_cut_at_the_idle_timeout() {
    let (up, _) = echo_upstream().await;
    let mut cfg = test_config();
    cfg.limits.idle_timeout = Duration::from_secs(30);
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let (mut s, _) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    assert!(echoes(&mut s, b"ping").await);
    let last = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(600), s.read_to_end(&mut rest)).await.expect("the idle tunnel must be cut").unwrap();
    let idle = last.elapsed();
    assert!(idle >= Duration::from_secs(30) && idle < Duration::from_secs(31), "{idle:?}");
    wait_for(|| h.count("cut", "idle_timeout") == 1).await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_busy_tunnel_is_cut_at_its_lifetime() {
    let (up, _) = echo_upstream().await;
    let mut cfg = test_config();
    cfg.limits.idle_timeout = Duration::from_secs(30);
    cfg.limits.tunnel_lifetime = Duration::from_secs(60);
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let (mut s, _) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    let start = Instant::now();
    let mut pings = 0;
    while echoes(&mut s, b"tick").await {
        pings += 1;
        assert!(start.elapsed() < Duration::from_secs(120), "the lifetime never fired");
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let lived = start.elapsed();
    assert!(lived >= Duration::from_secs(60) && lived <= Duration::from_secs(71), "{lived:?} after {pings} pings");
    wait_for(|| h.count("cut", "lifetime") == 1).await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn slowloris_is_cut_at_the_header_deadline() {
    let mut cfg = test_config();
    cfg.limits.header_timeout = Duration::from_secs(2);
    let h = Harness::start(cfg).await;
    let token = h.job("a", &["allowed.test"]);
    let head = format!(
        "CONNECT allowed.test:443 HTTP/1.1\r\nProxy-Authorization: {}\r\nX-Pad: {}\r\n\r\n",
        authorization_value(&token),
        "p".repeat(100)
    );
    let stream = TcpStream::connect(h.addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        for b in head.as_bytes() {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let reply = read_reply(&mut rd).await;
    let at = start.elapsed();
    assert_eq!((reply.status, reply.refused()), (408, Some("header_timeout")), "{reply:?}");
    assert!(at >= Duration::from_secs(2) && at < Duration::from_millis(2200), "{at:?}");
    assert!(reply.body.contains("header_timeout = 2 s"), "{}", reply.body);
    // And the proxy closes its end (after a short drain), long before the head would be complete.
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut rest)).await.expect("closed").unwrap();
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
    writer.abort();
    wait_for(|| h.count("refused", "header_timeout") == 1).await;
    h.stop().await;
}

#[tokio::test]
async fn an_oversized_head_is_refused() {
    let h = Harness::start(test_config()).await;
    let reply = raw(h.addr, &format!("CONNECT a.test:443 HTTP/1.1\r\nX-Big: {}\r\n\r\n", "b".repeat(20_000))).await;
    assert_eq!((reply.status, reply.refused()), (431, Some("header_too_large")));
    let many: String = (0..100).map(|i| format!("X-{i}: v\r\n")).collect();
    let reply = raw(h.addr, &format!("CONNECT a.test:443 HTTP/1.1\r\n{many}\r\n")).await;
    assert_eq!(reply.refused(), Some("header_too_large"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_client_hello_that_never_comes_is_cut() {
    let (up, _) = echo_upstream().await;
    let mut cfg = test_config();
    cfg.tls_ports = vec![up.port()];
    cfg.limits.client_hello_timeout = Duration::from_secs(5);
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let (mut s, _) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    let start = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut rest)).await.expect("cut at the hello deadline").unwrap();
    assert!(start.elapsed() >= Duration::from_secs(5) && start.elapsed() < Duration::from_secs(6));
    wait_for(|| h.count("refused", "client_hello_timeout") == 1).await;
    h.stop().await;
}

#[tokio::test]
async fn malformed_and_non_proxy_requests_are_refused() {
    let h = Harness::start(test_config()).await;
    let token = h.job("a", &["allowed.test"]);
    let auth = format!("Proxy-Authorization: {}\r\n", authorization_value(&token));
    for (req, status, code) in [
        (format!("GET /relative HTTP/1.1\r\nHost: a\r\n{auth}\r\n"), 400, "not_proxy_request"),
        (format!("GET https://allowed.test/ HTTP/1.1\r\n{auth}\r\n"), 400, "use_connect"),
        (format!("GET http://user@allowed.test/ HTTP/1.1\r\n{auth}\r\n"), 403, "bad_host"),
        (format!("CONNECT allowed.test HTTP/1.1\r\n{auth}\r\n"), 403, "bad_port"),
        (format!("CONNECT allowed.test:99999 HTTP/1.1\r\n{auth}\r\n"), 403, "bad_port"),
        ("NOT HTTP AT ALL\r\n\r\n".to_string(), 400, "bad_request"),
    ] {
        let reply = raw(h.addr, &req).await;
        assert_eq!((reply.status, reply.refused()), (status, Some(code)), "{req:?}: {}", reply.body);
        assert!(reply.body.starts_with(&format!("egress refused ({code}): ")) && reply.body.ends_with('\n'));
    }
    h.stop().await;
}

#[tokio::test]
async fn upstream_failures_are_502() {
    let h = Harness::start(test_config()).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let token = h.job("a", &[&format!("allowed.test:{closed}"), &format!("nxdomain.test:{closed}")]);
    let (_, reply) = connect(h.addr, &format!("allowed.test:{closed}"), Some(&token)).await;
    assert_eq!((reply.status, reply.refused()), (502, Some("connect_failed")));
    let (_, reply) = connect(h.addr, &format!("nxdomain.test:{closed}"), Some(&token)).await;
    assert_eq!((reply.status, reply.refused()), (502, Some("resolve_failed")));
    wait_for(|| h.count("failed", "connect_failed") == 1).await;
    h.stop().await;
}

#[tokio::test]
async fn counters_register_in_an_embedders_registry() {
    let h = Harness::start(test_config()).await;
    let _ = raw(h.addr, "CONNECT a.test:443 HTTP/1.1\r\n\r\n").await;
    wait_for(|| h.count("refused", "proxy_auth_required") == 1).await;
    let mut registry = prometheus_client::registry::Registry::with_prefix("skill_operator");
    h.proxy.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains(r#"skill_operator_egress_requests_total{verdict="refused",reason="proxy_auth_required"} 1"#), "{text}");
    assert!(text.contains("skill_operator_egress_tunnels 0"), "{text}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_tunnels_finish_for_the_grace_then_cuts_them() {
    let (up, _) = echo_upstream().await;
    let mut cfg = test_config();
    cfg.limits.shutdown_grace = Duration::from_secs(5);
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("a", &[&format!("allowed.test:{}", up.port())]);
    let (mut s, _) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    assert!(echoes(&mut s, b"before").await);
    let metrics = h.proxy.metrics().clone();
    let start = Instant::now();
    let stopping = tokio::spawn(h.stop());
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Still open during the grace.
    assert!(echoes(&mut s, b"during").await);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut rest)).await.expect("cut after the grace").unwrap();
    assert!(start.elapsed() >= Duration::from_secs(5) && start.elapsed() < Duration::from_secs(6), "{:?}", start.elapsed());
    stopping.await.unwrap();
    assert_eq!(metrics.requests_with("cut", "shutting_down"), 1);
}

/// Each connection leaves one `egress` record once it ends: the job, the
/// host and port asked for, the verdict and reason, bytes each way.
#[tokio::test]
async fn every_connection_is_in_the_audit_trail_with_its_verdict_and_bytes() {
    use skill_operator::audit::{Audit, SharedBuffer, Sink};
    let (up, _) = http_upstream(no_files()).await;
    let buffer = SharedBuffer::default();
    let mut cfg = test_config();
    cfg.audit = Audit::new("egress-proxy", vec![Sink::buffer(buffer.clone())]);
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job("uid-a", &[&format!("allowed.test:{}", up.port())]);
    let (reply, _) = http_get(h.addr, &format!("http://allowed.test:{}/x", up.port()), Some(&token), "").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let (_, reply) = connect(h.addr, "elsewhere.test:443", Some(&token)).await;
    assert_eq!(reply.refused(), Some("host_not_allowed"));
    wait_for(|| buffer.records().len() == 2).await;
    let mut records = buffer.records();
    records.sort_by_key(|r| r["outcome"].as_str().map(str::to_string));
    let (allowed, refused) = (&records[0], &records[1]);
    for r in &records {
        assert_eq!((r["event"].as_str(), r["source"].as_str()), (Some("egress"), Some("egress-proxy")));
        assert_eq!((r["namespace"].as_str(), r["skilljobUid"].as_str()), (Some("team"), Some("uid-a")), "{r}");
    }
    assert_eq!((allowed["outcome"].as_str(), allowed["code"].as_str()), (Some("ok"), Some("ok")), "{allowed}");
    assert_eq!((allowed["host"].as_str(), allowed["port"].as_u64()), (Some("allowed.test"), Some(u64::from(up.port()))));
    assert!(allowed["bytesUp"].as_u64().unwrap() > 0 && allowed["bytesDown"].as_u64().unwrap() > 0, "{allowed}");
    assert_eq!((refused["outcome"].as_str(), refused["code"].as_str()), (Some("refused"), Some("host_not_allowed")), "{refused}");
    assert_eq!((refused["host"].as_str(), refused["port"].as_u64()), (Some("elsewhere.test"), Some(443)));
    assert_eq!(refused["bytesUp"], 0);
    assert!(!serde_json::to_string(&records).unwrap().contains(&token), "the credential never reaches the trail");
    h.stop().await;
}
