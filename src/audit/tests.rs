use std::os::unix::fs::PermissionsExt;

use serde_json::Value;

use super::*;
use crate::mcp::executor::Caller;

fn buffered(source: &'static str) -> (Audit, SharedBuffer) {
    let buffer = SharedBuffer::default();
    (Audit::new(source, vec![Sink::buffer(buffer.clone())]), buffer)
}

#[test]
fn a_record_is_one_versioned_line_without_empty_fields() {
    let (audit, buffer) = buffered("serve");
    let caller = Caller { uid: Some("u-1".into()), groups: vec!["devs".into()], ..Caller::named("alice") };
    audit.record(
        Record::new(Event::RunVerdict, Outcome::Ok)
            .caller(&caller)
            .skill("tool")
            .script("scripts/a.py")
            .args_digest(digest_json(&["x"]))
            .exit_code(Some(0))
            .duration_ms(12),
    );
    let records = buffer.records();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r["schema"], SCHEMA);
    assert_eq!(r["source"], "serve");
    assert_eq!(r["event"], "run.verdict");
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["principal"], serde_json::json!({"name": "alice", "uid": "u-1", "groups": ["devs"]}));
    assert_eq!(r["exitCode"], 0);
    assert_eq!(r["durationMs"], 12);
    assert_eq!(r["argsDigest"], digest_json(&["x"]));
    // RFC 3339, UTC, milliseconds: 2026-12-03T09:00:00.123Z
    let time = r["time"].as_str().unwrap();
    assert!(time.ends_with('Z') && time.len() == 24 && time.as_bytes()[19] == b'.', "{time}");
    for absent in ["namespace", "job", "skilljobUid", "host", "inputs", "code", "reason"] {
        assert!(r.get(absent).is_none(), "an empty {absent} is left out: {r}");
    }
}

#[test]
fn the_digest_names_the_arguments_without_showing_them() {
    let secret = ["--token", "s3cr3t-value"];
    let d = digest_json(&secret);
    assert!(d.starts_with("sha256:") && d.len() == 7 + 64, "{d}");
    assert!(!d.contains("s3cr3t"));
    assert_eq!(d, digest_json(&secret), "the same call, the same digest");
    assert_ne!(d, digest_json(&["--token", "s3cr3t-valuf"]), "another call, another digest");
}

#[test]
fn a_namespace_server_stamps_its_namespace_unless_the_record_names_one() {
    let (audit, buffer) = buffered("gateway");
    let team = audit.for_namespace("team-a");
    team.record(Record::new(Event::ToolCall, Outcome::Ok));
    team.record(Record::new(Event::Egress, Outcome::Ok).namespace("team-b"));
    audit.record(Record::new(Event::ToolCall, Outcome::Ok));
    let ns: Vec<Value> = buffer.records().iter().map(|r| r["namespace"].clone()).collect();
    assert_eq!(ns, vec![Value::from("team-a"), Value::from("team-b"), Value::Null]);
}

#[test]
fn off_writes_nothing_and_no_sinks_is_off() {
    assert!(!Audit::off().enabled());
    assert!(!Audit::new("serve", Vec::new()).enabled());
    let flags = AuditArgs { file: None, no_stdout: false };
    assert!(!flags.open("serve", false).unwrap().enabled(), "stdio, no file: nothing to write to");
    assert!(flags.open("serve", true).unwrap().enabled());
    assert!(!AuditArgs { file: None, no_stdout: true }.open("gateway", true).unwrap().enabled());
}

#[test]
fn the_file_sink_appends_private_lines_and_says_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    std::fs::write(&path, "{\"earlier\":true}\n").unwrap();
    let flags = AuditArgs { file: Some(path.clone()), no_stdout: true };
    flags.open("serve", true).unwrap().record(Record::new(Event::ToolCall, Outcome::Refused).code("forbidden"));
    flags.open("serve", true).unwrap().record(Record::new(Event::ToolCall, Outcome::Ok));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "appended, never truncated: {text}");
    assert_eq!(lines[0], "{\"earlier\":true}");
    let second: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(second["code"], "forbidden");

    let fresh = dir.path().join("fresh.jsonl");
    AuditArgs { file: Some(fresh.clone()), no_stdout: true }.open("serve", true).unwrap();
    assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o600, "records name principals");

    let missing = dir.path().join("no-such-dir/audit.jsonl");
    let err = AuditArgs { file: Some(missing), no_stdout: true }.open("serve", true).unwrap_err();
    assert!(err.to_string().contains("no-such-dir") && err.to_string().contains("directory exists"), "{err}");
}

#[test]
fn concurrent_writers_never_interleave_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let audit = AuditArgs { file: Some(path.clone()), no_stdout: true }.open("gateway", true).unwrap();
    let long = "r".repeat(8192);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (audit, long) = (audit.clone(), long.clone());
            s.spawn(move || {
                for i in 0..200 {
                    audit.record(Record::new(Event::ToolCall, Outcome::Ok).job(format!("{t}-{i}")).reason(long.clone()));
                }
            });
        }
    });
    let text = std::fs::read_to_string(&path).unwrap();
    let parsed: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("every line is one whole record")).collect();
    assert_eq!(parsed.len(), 8 * 200);
    let mut jobs: Vec<&str> = parsed.iter().map(|r| r["job"].as_str().unwrap()).collect();
    jobs.sort_unstable();
    jobs.dedup();
    assert_eq!(jobs.len(), 8 * 200, "no record lost or doubled");
}
