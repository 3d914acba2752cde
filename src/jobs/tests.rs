//! Job store tests: every rule its own test, every limit at its edge (at the
//! cap passes, one over fails with the specific error).

use super::fsops::{digest_label, save_record};
use super::*;
use crate::api::outcome::RunOutcome;
use crate::core::limits::{JOBS_RETAINED, MAX_DEPTH as JOB_MAX_DEPTH, MAX_FILES as JOB_FILES};
use sha2::{Digest, Sha256};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::thread;

const MIB: u64 = 1024 * 1024;

fn small() -> JobLimits {
    JobLimits { upload_chunk: 16, file_bytes: 40, job_bytes: 100, files: 5, retained: 3, read_chunk: 8, durable: true }
}

fn open_store(limits: JobLimits) -> (tempfile::TempDir, JobStore) {
    let root = tempfile::tempdir().unwrap();
    let (store, report) = JobStore::open(root.path(), limits).unwrap();
    assert_eq!(report, OpenReport::default());
    (root, store)
}

fn reopen(root: &tempfile::TempDir, limits: JobLimits) -> (JobStore, OpenReport) {
    JobStore::open(root.path(), limits).unwrap()
}

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// What a runner reports at the end of a run, flat, as the tests write it.
#[derive(Debug, Clone, Default, PartialEq)]
struct RunFinish {
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    stdout_bytes: u64,
    stderr_bytes: u64,
    stdout_truncated: bool,
    stderr_truncated: bool,
    note: Option<String>,
}

impl RunFinish {
    fn outcome(&self) -> RunOutcome {
        RunOutcome {
            exit_code: self.exit_code,
            signal: self.signal,
            timed_out: self.timed_out,
            stdout_bytes: self.stdout_bytes,
            stderr_bytes: self.stderr_bytes,
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
            ..RunOutcome::default()
        }
    }
}

trait FinishFlat {
    fn finish_flat(&self, id: &str, f: RunFinish, stdout: &[u8], stderr: &[u8]) -> Result<JobRecord>;
}

impl FinishFlat for JobStore {
    fn finish_flat(&self, id: &str, f: RunFinish, stdout: &[u8], stderr: &[u8]) -> Result<JobRecord> {
        self.finish_run(id, &f.outcome(), f.note.clone(), stdout, stderr)
    }
}

fn exit(code: i32) -> RunFinish {
    RunFinish { exit_code: Some(code), ..RunFinish::default() }
}

/// A job with `in.txt` uploaded and a finished run (exit 0).
fn finished_job(store: &JobStore) -> (String, PathBuf) {
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "in.txt", 0, b"input").unwrap();
    let work = store.begin_run(&id, "scripts/run.py", &["in.txt".into()], None).unwrap();
    store.finish_flat(&id, exit(0), b"out", b"err").unwrap();
    (id, work)
}

fn job_dir(root: &tempfile::TempDir, id: &str) -> PathBuf {
    root.path().join("jobs").join(id)
}

// -- ids and paths -------------------------------------------------------------

#[test]
fn a_nested_skill_name_is_never_a_path() {
    // `serve --layout recursive` serves names like `a/b`: a job keeps the
    // name in its record and lives under its random id, so `a/b` can
    // neither escape the store nor meet the jobs of skills `a` and `b`.
    let (root, store) = open_store(small());
    let nested = store.create("a/b", "local").unwrap();
    let a = store.create("a", "local").unwrap();
    let b = store.create("../b", "local").unwrap();
    for job in [&nested, &a, &b] {
        assert!(job_dir(&root, &job.id).is_dir());
        assert_eq!(job.id.len(), 32, "{}", job.id);
    }
    let mut on_disk: Vec<String> =
        std::fs::read_dir(root.path().join("jobs")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    on_disk.sort();
    let mut ids = vec![nested.id.clone(), a.id.clone(), b.id.clone()];
    ids.sort();
    assert_eq!(on_disk, ids, "nothing but the job ids under jobs/");
    assert!(!root.path().join("a").exists() && !root.path().join("b").exists());
    assert_eq!(store.get(&nested.id).unwrap().skill, "a/b");
    assert_eq!(store.get(&a.id).unwrap().skill, "a");
}

#[test]
fn bad_job_ids_are_refused_by_every_call() {
    let (_root, store) = open_store(small());
    let valid = store.create("demo", "local").unwrap().id;
    let bad = [
        "",
        "0123456789abcdef0123456789abcde",   // 31
        "0123456789abcdef0123456789abcdef0", // 33
        "0123456789ABCDEF0123456789ABCDEF",
        "0123456789abcdef0123456789abcdeg",
        "../../../../etc/passwd",
        "0123456789abcdef/../../etcpasswd",
        "01234567-89ab-cdef-0123-456789abcdef",
        "..",
        ".tmp-0123456789abcdef0123456789ab",
    ];
    for id in bad {
        let is_bad = |r: Result<(), JobError>| matches!(r, Err(JobError::BadId(_)));
        assert!(is_bad(store.get(id).map(drop)), "get {id:?}");
        assert!(is_bad(store.upload(id, "a.txt", 0, b"x").map(drop)), "upload {id:?}");
        assert!(is_bad(store.begin_run(id, "s", &[], None).map(drop)), "begin_run {id:?}");
        assert!(is_bad(store.finish_flat(id, exit(0), b"", b"").map(drop)), "finish_run {id:?}");
        assert!(is_bad(store.outputs(id).map(drop)), "outputs {id:?}");
        assert!(is_bad(store.read(id, ReadTarget::Stdout, 0, 1).map(drop)), "read {id:?}");
        assert!(is_bad(store.delete(id)), "delete {id:?}");
        assert!(is_bad(store.work_dir(id).map(drop)), "work_dir {id:?}");
    }
    assert!(store.get(&valid).is_ok());
    let msg = store.get("NOPE").unwrap_err().to_string();
    assert!(msg.contains("32 lowercase hex"), "{msg}");
}

#[test]
fn unknown_job_is_not_found() {
    let (_root, store) = open_store(small());
    let id = "0123456789abcdef0123456789abcdef";
    assert!(matches!(store.get(id), Err(JobError::NotFound(_))));
    assert!(matches!(store.delete(id), Err(JobError::NotFound(_))));
    assert!(matches!(store.begin_run(id, "s", &[], None), Err(JobError::NotFound(_))));
}

const HOSTILE: &[&str] =
    &["..", "../x", "a/../../b", "/etc/passwd", "%2e%2e/x", "a%2fb", "a\0b", "a\\b", "..\\..\\x", "", "a//b", "./a", "C:x", "a\nb"];

#[test]
fn hostile_paths_are_refused_before_any_filesystem_access() {
    let (_root, store) = open_store(small());
    // No such job: a path refused as a path (not "not found") proves the
    // string check ran before the job directory was looked at.
    let ghost = "0123456789abcdef0123456789abcdef";
    for raw in HOSTILE {
        assert!(matches!(store.upload(ghost, raw, 0, b"x"), Err(JobError::BadPath { .. })), "upload {raw:?}");
        assert!(matches!(store.read(ghost, ReadTarget::File(raw.to_string()), 0, 1), Err(JobError::BadPath { .. })), "read {raw:?}");
    }
    // And on a real job nothing is written anywhere.
    let id = store.create("demo", "local").unwrap().id;
    for raw in HOSTILE {
        assert!(matches!(store.upload(&id, raw, 0, b"x"), Err(JobError::BadPath { .. })), "upload {raw:?}");
    }
    assert!(store.get(&id).unwrap().inputs.is_empty());
    assert_eq!(std::fs::read_dir(store.work_dir(&id).unwrap()).unwrap().count(), 0);
    // The message escapes control characters instead of echoing them.
    let msg = store.upload(&id, "a\nb", 0, b"x").unwrap_err().to_string();
    assert!(!msg.contains('\n'), "{msg}");
}

#[test]
fn upload_path_depth_edge() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    let at_cap = vec!["d"; JOB_MAX_DEPTH].join("/");
    store.upload(&id, &at_cap, 0, b"x").unwrap();
    let over = vec!["e"; JOB_MAX_DEPTH + 1].join("/");
    assert!(matches!(store.upload(&id, &over, 0, b"x"), Err(JobError::PathTooDeep { depth: 33, max: 32, .. })));
}

// -- uploads -------------------------------------------------------------------

#[test]
fn upload_chunk_edge_real_default() {
    let (_root, store) = open_store(JobLimits::default());
    let id = store.create("demo", "local").unwrap().id;
    let at_cap = vec![7u8; MIB as usize];
    let info = store.upload(&id, "a.bin", 0, &at_cap).unwrap();
    assert_eq!(info.size, MIB);
    assert_eq!(info.sha256, sha(&at_cap));
    let over = vec![7u8; MIB as usize + 1];
    let err = store.upload(&id, "b.bin", 0, &over).unwrap_err();
    assert!(matches!(err, JobError::ChunkTooLarge { got, max } if got == MIB + 1 && max == MIB), "{err}");
    assert!(!store.work_dir(&id).unwrap().join("b.bin").exists());
}

#[test]
fn upload_chunk_edge_small() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "a", 0, &[1; 16]).unwrap();
    assert!(matches!(store.upload(&id, "a", 16, &[1; 17]), Err(JobError::ChunkTooLarge { got: 17, max: 16 })));
}

#[test]
fn file_edge_real_default_built_from_1mib_appends() {
    let (_root, store) = open_store(JobLimits::default());
    let id = store.create("demo", "local").unwrap().id;
    let chunk: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let mut whole = Sha256::new();
    let mut info = None;
    for i in 0..32u64 {
        info = Some(store.upload(&id, "big.bin", i * MIB, &chunk).unwrap());
        whole.update(&chunk);
    }
    let info = info.unwrap();
    assert_eq!(info.size, 32 * MIB);
    assert_eq!(info.sha256, digest_label(whole));
    let err = store.upload(&id, "big.bin", 32 * MIB, b"x").unwrap_err();
    assert!(matches!(err, JobError::FileTooLarge { size, max, .. } if size == 32 * MIB + 1 && max == 32 * MIB), "{err}");
    assert_eq!(std::fs::metadata(store.work_dir(&id).unwrap().join("big.bin")).unwrap().len(), 32 * MIB);
    assert_eq!(store.get(&id).unwrap().inputs[0].size, 32 * MIB);
}

#[test]
fn file_edge_small() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    for i in 0..2 {
        store.upload(&id, "f", i * 16, &[1; 16]).unwrap();
    }
    store.upload(&id, "f", 32, &[1; 8]).unwrap(); // 40 = cap
    assert!(matches!(store.upload(&id, "f", 40, &[1]), Err(JobError::FileTooLarge { size: 41, max: 40, .. })));
    // A fresh file one over the cap in one call.
    let limits = JobLimits { upload_chunk: 64, ..small() };
    let (_root2, store2) = open_store(limits);
    let id2 = store2.create("demo", "local").unwrap().id;
    store2.upload(&id2, "g", 0, &[1; 40]).unwrap();
    assert!(matches!(store2.upload(&id2, "h", 0, &[1; 41]), Err(JobError::FileTooLarge { size: 41, .. })));
}

#[test]
fn job_bytes_edge() {
    let limits = JobLimits { upload_chunk: 64, file_bytes: 60, job_bytes: 100, files: 10, ..small() };
    let (_root, store) = open_store(limits);
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "a", 0, &[1; 60]).unwrap();
    store.upload(&id, "b", 0, &[1; 40]).unwrap(); // 100 = cap
    let err = store.upload(&id, "c", 0, &[1]).unwrap_err();
    assert!(matches!(err, JobError::JobTooLarge { total: 101, max: 100 }), "{err}");
    assert!(matches!(store.upload(&id, "b", 40, &[1]), Err(JobError::JobTooLarge { total: 101, .. })));
    // Replacing counts the new size, not old + new.
    store.upload(&id, "a", 0, &[2; 59]).unwrap();
    store.upload(&id, "c", 0, &[1]).unwrap();
    let sizes: u64 = store.get(&id).unwrap().inputs.iter().map(|f| f.size).sum();
    assert_eq!(sizes, 100);
}

#[test]
fn file_count_edge_small() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    for i in 0..5 {
        store.upload(&id, &format!("f{i}"), 0, b"x").unwrap();
    }
    let err = store.upload(&id, "f5", 0, b"x").unwrap_err();
    assert!(matches!(err, JobError::TooManyFiles { count: 6, max: 5 }), "{err}");
    // At the cap an existing file can still be replaced and appended to.
    store.upload(&id, "f0", 0, b"y").unwrap();
    store.upload(&id, "f0", 1, b"z").unwrap();
    assert_eq!(store.get(&id).unwrap().inputs.len(), 5);
}

#[test]
fn file_count_edge_real_default() {
    // 2,000 real uploads take ~20 s in a debug build (each rewrites and
    // fsyncs a growing record), so the first 1,999 inputs are seeded
    // directly and the edge is crossed through `upload`.
    let (root, store) = open_store(JobLimits::default());
    let id = store.create("demo", "local").unwrap().id;
    let dir = job_dir(&root, &id);
    let mut record = store.get(&id).unwrap();
    for i in 0..JOB_FILES - 1 {
        let path = format!("d{}/f{i:04}", i % 20);
        std::fs::create_dir_all(dir.join("work").join(format!("d{}", i % 20))).unwrap();
        std::fs::write(dir.join("work").join(&path), b"").unwrap();
        record.inputs.push(FileInfo { path, size: 0, sha256: sha(b"") });
    }
    record.inputs.sort_by(|a, b| a.path.cmp(&b.path));
    save_record(&dir, &record, true).unwrap();
    store.upload(&id, "last", 0, b"").unwrap();
    assert_eq!(store.get(&id).unwrap().inputs.len(), JOB_FILES);
    assert!(matches!(store.upload(&id, "one-more", 0, b""), Err(JobError::TooManyFiles { count: 2001, max: 2000 })));
    // At the cap, existing inputs can still be replaced.
    store.upload(&id, "d0/f0000", 0, b"new").unwrap();
}

#[test]
fn wrong_append_offset_names_the_expected_one() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "a", 0, b"12345").unwrap();
    for got in [4, 6, 100] {
        let err = store.upload(&id, "a", got, b"x").unwrap_err();
        assert!(matches!(err, JobError::WrongOffset { expected: 5, got: g, .. } if g == got), "{err}");
        assert!(err.to_string().contains("expected 5"), "{err}");
    }
    // A new file can only start at 0.
    assert!(matches!(store.upload(&id, "new", 3, b"x"), Err(JobError::WrongOffset { expected: 0, got: 3, .. })));
    store.upload(&id, "a", 5, b"678").unwrap();
    assert_eq!(std::fs::read(store.work_dir(&id).unwrap().join("a")).unwrap(), b"12345678");
}

#[test]
fn offset_zero_replaces_and_hash_follows() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "a", 0, b"long content").unwrap();
    let info = store.upload(&id, "a", 0, b"short").unwrap();
    assert_eq!((info.size, info.sha256.clone()), (5, sha(b"short")));
    assert_eq!(std::fs::read(store.work_dir(&id).unwrap().join("a")).unwrap(), b"short");
    assert_eq!(store.get(&id).unwrap().inputs, vec![info]);
}

#[test]
fn append_hash_survives_restart_and_interleaving() {
    let (root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "a", 0, b"hello ").unwrap();
    store.upload(&id, "b", 0, b"other").unwrap(); // evicts a's cached hash
    let info = store.upload(&id, "a", 6, b"world").unwrap();
    assert_eq!(info.sha256, sha(b"hello world"));
    drop(store);
    let (store, _) = reopen(&root, small());
    let info = store.upload(&id, "a", 11, b"!").unwrap();
    assert_eq!(info.sha256, sha(b"hello world!"));
}

#[test]
fn append_drops_a_tail_the_record_does_not_know() {
    // A crash between writing bytes and saving the record leaves the file
    // longer than recorded; the next append at the recorded size wins.
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "a", 0, b"abc").unwrap();
    let path = store.work_dir(&id).unwrap().join("a");
    std::fs::write(&path, b"abcSTRAY").unwrap();
    let info = store.upload(&id, "a", 3, b"d").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"abcd");
    assert_eq!(info.sha256, sha(b"abcd"));
    // A file shorter than recorded cannot be appended to.
    std::fs::write(&path, b"ab").unwrap();
    assert!(matches!(store.upload(&id, "a", 4, b"e"), Err(JobError::InputOutOfSync { expected: 4, found: 2, .. })));
}

#[test]
fn uploads_create_parents_and_refuse_file_dir_clashes() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "data/in/a.csv", 0, b"1,2").unwrap();
    assert!(store.work_dir(&id).unwrap().join("data/in/a.csv").is_file());
    assert!(matches!(store.upload(&id, "data/in", 0, b"x"), Err(JobError::PathObstructed { what: "a directory", .. })));
    assert!(matches!(
        store.upload(&id, "data/in/a.csv/b", 0, b"x"),
        Err(JobError::ParentObstructed { what: "a file, not a directory", .. })
    ));
}

#[test]
fn uploads_never_write_through_symlinks() {
    let (_root, store) = open_store(small());
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, b"keep").unwrap();
    let id = store.create("demo", "local").unwrap().id;
    let work = store.work_dir(&id).unwrap();
    symlink(outside.path(), work.join("dir")).unwrap();
    symlink(&secret, work.join("file")).unwrap();
    std::fs::create_dir(work.join("real")).unwrap();
    symlink(outside.path(), work.join("real/nested")).unwrap();

    let err = store.upload(&id, "dir/secret", 0, b"owned").unwrap_err();
    assert!(matches!(&err, JobError::ParentObstructed { component, what: "a symlink", .. } if component == "dir"), "{err}");
    let err = store.upload(&id, "real/nested/x", 0, b"owned").unwrap_err();
    assert!(matches!(&err, JobError::ParentObstructed { component, .. } if component == "real/nested"), "{err}");
    assert!(matches!(store.upload(&id, "file", 0, b"owned"), Err(JobError::PathObstructed { what: "a symlink", .. })));
    assert_eq!(std::fs::read(&secret).unwrap(), b"keep");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);

    // An uploaded file swapped for a link before an append: refused.
    store.upload(&id, "in.txt", 0, b"abc").unwrap();
    std::fs::remove_file(work.join("in.txt")).unwrap();
    symlink(&secret, work.join("in.txt")).unwrap();
    assert!(matches!(store.upload(&id, "in.txt", 3, b"def"), Err(JobError::PathObstructed { what: "a symlink", .. })));
    assert_eq!(std::fs::read(&secret).unwrap(), b"keep");
}

#[test]
fn uploads_are_closed_once_the_job_has_run() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "a", 0, b"x").unwrap();
    store.begin_run(&id, "s", &[], None).unwrap();
    let err = store.upload(&id, "b", 0, b"x").unwrap_err();
    assert!(matches!(err, JobError::UploadsClosed { state: JobState::Running, .. }), "{err}");
    assert!(err.to_string().contains("uploads are closed once a job has run"), "{err}");
    store.finish_flat(&id, exit(0), b"", b"").unwrap();
    assert!(matches!(store.upload(&id, "a", 1, b"x"), Err(JobError::UploadsClosed { state: JobState::Succeeded, .. })));
    assert!(matches!(store.upload(&id, "a", 0, b"x"), Err(JobError::UploadsClosed { .. })));
}

// -- runs ----------------------------------------------------------------------

#[test]
fn one_run_per_job() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    let work = store.begin_run(&id, "scripts/run.py", &["a".into(), "b".into()], None).unwrap();
    assert_eq!(work, store.work_dir(&id).unwrap());
    let rec = store.get(&id).unwrap();
    assert_eq!(rec.state, JobState::Running);
    assert_eq!(rec.run.as_ref().unwrap().args, vec!["a", "b"]);
    assert!(matches!(store.begin_run(&id, "s", &[], None), Err(JobError::AlreadyRunning { .. })));
    store.finish_flat(&id, exit(0), b"", b"").unwrap();
    let err = store.begin_run(&id, "s", &[], None).unwrap_err();
    assert!(matches!(err, JobError::AlreadyRan { state: JobState::Succeeded, .. }), "{err}");
    assert!(err.to_string().contains("already ran") && err.to_string().contains("create a new job to run again"), "{err}");
}

#[test]
fn finish_maps_outcomes_to_states() {
    let (_root, store) = open_store(JobLimits { retained: 10, ..small() });
    let cases = [
        (exit(0), JobState::Succeeded),
        (exit(2), JobState::Failed),
        (RunFinish { signal: Some(9), ..RunFinish::default() }, JobState::Failed),
        (RunFinish { exit_code: Some(0), signal: Some(15), ..RunFinish::default() }, JobState::Failed),
        (RunFinish { timed_out: true, signal: Some(9), ..RunFinish::default() }, JobState::TimedOut),
        (RunFinish { note: Some("could not start".into()), ..RunFinish::default() }, JobState::Failed),
    ];
    for (finish, want) in cases {
        let id = store.create("demo", "local").unwrap().id;
        store.begin_run(&id, "s", &[], None).unwrap();
        let rec = store.finish_flat(&id, finish.clone(), b"o", b"e").unwrap();
        assert_eq!(rec.state, want, "{finish:?}");
        let run = rec.run.unwrap();
        assert_eq!(
            (run.outcome.exit_code, run.outcome.signal, run.outcome.timed_out, run.note),
            (finish.exit_code, finish.signal, finish.timed_out, finish.note)
        );
        assert!(run.finished_at_ms.is_some());
        assert_eq!(store.get(&id).unwrap().state, want);
    }
}

#[test]
fn finish_refuses_a_job_that_is_not_running() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    assert!(matches!(store.finish_flat(&id, exit(0), b"", b""), Err(JobError::NotRunning { state: JobState::Created, .. })));
    store.begin_run(&id, "s", &[], None).unwrap();
    store.finish_flat(&id, exit(0), b"", b"").unwrap();
    assert!(matches!(store.finish_flat(&id, exit(1), b"", b""), Err(JobError::NotRunning { state: JobState::Succeeded, .. })));
    assert_eq!(store.get(&id).unwrap().state, JobState::Succeeded);
}

#[test]
fn begin_run_race_has_one_winner() {
    let (_root, store) = open_store(small());
    let store = Arc::new(store);
    for _ in 0..3 {
        let id = store.create("demo", "local").unwrap().id;
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (store, id, barrier) = (store.clone(), id.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    store.begin_run(&id, "s", &[], None)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        assert!(results.iter().filter_map(|r| r.as_ref().err()).all(|e| matches!(e, JobError::AlreadyRunning { .. })));
        store.finish_flat(&id, exit(0), b"", b"").unwrap();
        store.delete(&id).unwrap();
    }
}

// -- retention -------------------------------------------------------------------

#[test]
fn retained_cap_edge() {
    let (_root, store) = open_store(small()); // retained: 3
    let ids: Vec<String> = (0..3).map(|_| store.create("demo", "local").unwrap().id).collect();
    let err = store.create("demo", "local").unwrap_err();
    assert!(matches!(err, JobError::CapReached { max: 3 }), "{err}");
    assert!(err.to_string().contains("skill_job_delete"), "{err}");
    store.delete(&ids[0]).unwrap();
    store.create("demo", "local").unwrap();
    assert!(matches!(store.create("demo", "local"), Err(JobError::CapReached { .. })));
}

#[test]
fn retained_cap_real_default() {
    let (_root, store) = open_store(JobLimits::default());
    for _ in 0..JOBS_RETAINED {
        store.create("demo", "local").unwrap();
    }
    assert!(matches!(store.create("demo", "local"), Err(JobError::CapReached { max: 100 })));
    assert_eq!(store.list().unwrap().len(), 100);
}

#[test]
fn create_race_cannot_pass_the_cap() {
    let (_root, store) = open_store(JobLimits { retained: 5, ..small() });
    let store = Arc::new(store);
    let barrier = Arc::new(Barrier::new(12));
    let handles: Vec<_> = (0..12)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                store.create("demo", "local")
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 5);
    assert!(results.iter().filter_map(|r| r.as_ref().err()).all(|e| matches!(e, JobError::CapReached { max: 5 })));
    assert_eq!(store.list().unwrap().len(), 5);
}

#[test]
fn list_is_newest_first() {
    let (_root, store) = open_store(small());
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(store.create("demo", "local").unwrap().id);
        thread::sleep(std::time::Duration::from_millis(3));
    }
    ids.reverse();
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(listed, ids);
}

#[test]
fn delete_refuses_running_and_removes_finished() {
    let (root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.begin_run(&id, "s", &[], None).unwrap();
    let err = store.delete(&id).unwrap_err();
    assert!(matches!(err, JobError::DeleteWhileRunning { .. }), "{err}");
    assert!(job_dir(&root, &id).exists());
    store.finish_flat(&id, exit(1), b"", b"").unwrap();
    store.delete(&id).unwrap();
    assert!(!job_dir(&root, &id).exists());
    assert!(matches!(store.get(&id), Err(JobError::NotFound(_))));
    // Created jobs can be deleted too; nothing is left in jobs/.
    let id = store.create("demo", "local").unwrap().id;
    store.delete(&id).unwrap();
    assert_eq!(std::fs::read_dir(root.path().join("jobs")).unwrap().count(), 0);
}

#[test]
fn delete_does_not_follow_symlinks_in_work() {
    let (_root, store) = open_store(small());
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"keep").unwrap();
    let (id, work) = finished_job(&store);
    symlink(outside.path(), work.join("d")).unwrap();
    store.delete(&id).unwrap();
    assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"keep");
}

// -- restart, corruption, atomic writes ---------------------------------------------

#[test]
fn restart_marks_running_as_interrupted_and_never_reruns() {
    let (root, store) = open_store(small());
    let running = store.create("demo", "local").unwrap().id;
    store.begin_run(&running, "s", &[], None).unwrap();
    let created = store.create("demo", "local").unwrap().id;
    let (done, _) = finished_job(&store);
    drop(store);

    let (store, report) = reopen(&root, small());
    assert_eq!(report.interrupted, vec![running.clone()]);
    assert!(report.skipped.is_empty());
    let rec = store.get(&running).unwrap();
    assert_eq!(rec.state, JobState::Interrupted);
    let run = rec.run.unwrap();
    assert_eq!(run.note.as_deref(), Some(INTERRUPTED_NOTE));
    assert_eq!(run.finished_at_ms, None);
    assert_eq!(store.get(&created).unwrap().state, JobState::Created);
    assert_eq!(store.get(&done).unwrap().state, JobState::Succeeded);
    assert!(matches!(store.begin_run(&running, "s", &[], None), Err(JobError::AlreadyRan { state: JobState::Interrupted, .. })));
    assert!(matches!(store.upload(&running, "a", 0, b"x"), Err(JobError::UploadsClosed { .. })));
    assert!(matches!(store.read(&running, ReadTarget::Stdout, 0, 8), Err(JobError::NoStream { stream: "stdout", .. })));
    assert!(store.outputs(&running).is_ok());
    store.delete(&running).unwrap();
    drop(store);

    let (_store, report) = reopen(&root, small());
    assert_eq!(report, OpenReport::default());
}

#[test]
fn corrupt_records_are_skipped_and_reported() {
    let (root, store) = open_store(JobLimits { retained: 10, ..small() });
    let good = store.create("demo", "local").unwrap().id;
    let garbage = store.create("demo", "local").unwrap().id;
    let other_id = store.create("demo", "local").unwrap().id;
    let missing = store.create("demo", "local").unwrap().id;
    std::fs::write(job_dir(&root, &garbage).join("job.json"), b"{\"id\": ").unwrap();
    let mut foreign = store.get(&other_id).unwrap();
    foreign.id = good.clone();
    std::fs::write(job_dir(&root, &other_id).join("job.json"), serde_json::to_vec(&foreign).unwrap()).unwrap();
    std::fs::remove_file(job_dir(&root, &missing).join("job.json")).unwrap();
    std::fs::create_dir(root.path().join("jobs/not-a-job")).unwrap();
    drop(store);

    let (store, report) = reopen(&root, JobLimits { retained: 10, ..small() });
    let mut skipped: Vec<&str> = report.skipped.iter().map(|s| s.name.as_str()).collect();
    skipped.sort();
    let mut want = vec![garbage.as_str(), other_id.as_str(), missing.as_str(), "not-a-job"];
    want.sort();
    assert_eq!(skipped, want);
    assert!(report.skipped.iter().all(|s| !s.reason.is_empty()));
    assert_eq!(store.list().unwrap().into_iter().map(|r| r.id).collect::<Vec<_>>(), vec![good.clone()]);
    let err = store.get(&garbage).unwrap_err();
    assert!(matches!(err, JobError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("skill_job_delete"), "{err}");
    assert!(matches!(store.get(&other_id), Err(JobError::Corrupt { .. })));
    // Unreadable jobs still hold a slot, and can be deleted to free it.
    store.delete(&garbage).unwrap();
    assert!(!job_dir(&root, &garbage).exists());
}

#[test]
fn record_writes_are_atomic_and_leftovers_are_cleaned() {
    let (root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "a", 0, b"x").unwrap();
    let before = store.get(&id).unwrap();
    // Normal operation leaves no temp file behind.
    let names = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&job_dir(&root, &id)), vec!["job.json", "work"]);
    // Simulate crashes: a half-written record temp, a half-made job, a
    // half-deleted job.
    std::fs::write(job_dir(&root, &id).join("job.json.tmp-deadbeef"), b"{\"id\":\"half").unwrap();
    std::fs::write(job_dir(&root, &id).join("stdout.tmp-deadbeef"), b"partial").unwrap();
    let half_made = root.path().join("jobs/.tmp-0123456789abcdef0123456789abcdef");
    std::fs::create_dir_all(half_made.join("work")).unwrap();
    let half_deleted = root.path().join("jobs/.trash-0123456789abcdef0123456789abcdef");
    std::fs::create_dir_all(half_deleted.join("work/x")).unwrap();
    drop(store);

    let (store, report) = reopen(&root, small());
    assert!(report.skipped.is_empty() && report.interrupted.is_empty(), "{report:?}");
    assert_eq!(report.cleaned.len(), 4, "{report:?}");
    assert_eq!(store.get(&id).unwrap(), before);
    assert_eq!(names(&job_dir(&root, &id)), vec!["job.json", "work"]);
    assert_eq!(names(&root.path().join("jobs")), vec![id.clone()]);
    assert_eq!(store.list().unwrap().len(), 1);
}

#[test]
fn record_json_shape() {
    let (root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.begin_run(&id, "s", &[], None).unwrap();
    store.finish_flat(&id, RunFinish { timed_out: true, ..RunFinish::default() }, b"", b"").unwrap();
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(job_dir(&root, &id).join("job.json")).unwrap()).unwrap();
    assert_eq!(json["state"], "timed-out");
    assert_eq!(json["id"], id.as_str());
    assert_eq!(json["run"]["timedOut"], true);
    assert_eq!(serde_json::to_value(JobState::Interrupted).unwrap(), "interrupted");
}

#[test]
fn planted_record_symlink_is_refused() {
    let (root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    let elsewhere = root.path().join("elsewhere.json");
    std::fs::rename(job_dir(&root, &id).join("job.json"), &elsewhere).unwrap();
    symlink(&elsewhere, job_dir(&root, &id).join("job.json")).unwrap();
    assert!(matches!(store.get(&id), Err(JobError::Corrupt { .. })));
}

// -- reads -------------------------------------------------------------------------

#[test]
fn read_chunk_edge_real_default() {
    let (_root, store) = open_store(JobLimits::default());
    let id = store.create("demo", "local").unwrap().id;
    store.begin_run(&id, "s", &[], None).unwrap();
    let work = store.work_dir(&id).unwrap();
    let data: Vec<u8> = (0..300 * 1024u32).map(|i| (i % 256) as u8).collect();
    std::fs::write(work.join("out.bin"), &data).unwrap();
    store.finish_flat(&id, exit(0), &data, b"").unwrap();
    let file = || ReadTarget::File("out.bin".into());
    let chunk = store.read(&id, file(), 0, 256 * 1024).unwrap();
    assert_eq!(chunk.data, data[..256 * 1024]);
    assert_eq!((chunk.offset, chunk.size, chunk.eof), (0, data.len() as u64, false));
    let err = store.read(&id, file(), 0, 256 * 1024 + 1).unwrap_err();
    assert!(matches!(err, JobError::ReadTooLarge { got, max: 262_144 } if got == 262_145), "{err}");
    assert!(matches!(store.read(&id, ReadTarget::Stdout, 0, 256 * 1024 + 1), Err(JobError::ReadTooLarge { .. })));
    let rest = store.read(&id, file(), 256 * 1024, 256 * 1024).unwrap();
    assert_eq!(rest.data, data[256 * 1024..]);
    assert!(rest.eof);
}

#[test]
fn reads_at_and_past_the_end() {
    let (_root, store) = open_store(small());
    let (id, work) = finished_job(&store);
    std::fs::write(work.join("o.txt"), b"0123456789").unwrap();
    let f = || ReadTarget::File("o.txt".into());
    let last = store.read(&id, f(), 8, 8).unwrap();
    assert_eq!((last.data.as_slice(), last.eof), (&b"89"[..], true));
    for offset in [10, 11, u64::MAX] {
        let chunk = store.read(&id, f(), offset, 8).unwrap();
        assert_eq!(chunk, Chunk { data: vec![], offset, size: 10, eof: true, download: None });
    }
    let exact = store.read(&id, f(), 2, 8).unwrap();
    assert_eq!((exact.data.as_slice(), exact.eof), (&b"23456789"[..], true));
    assert_eq!(store.read(&id, f(), 0, 0).unwrap().data, b"");
}

#[test]
fn stdout_and_stderr_reads() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    assert!(matches!(store.read(&id, ReadTarget::Stdout, 0, 8), Err(JobError::NotRunYet { .. })));
    store.begin_run(&id, "s", &[], None).unwrap();
    assert!(matches!(store.read(&id, ReadTarget::Stderr, 0, 8), Err(JobError::StillRunning { .. })));
    let finish = RunFinish { exit_code: Some(0), stdout_bytes: 5000, stdout_truncated: true, ..RunFinish::default() };
    let rec = store.finish_flat(&id, finish, b"hello stdout", b"oops").unwrap();
    let run = rec.run.unwrap();
    assert_eq!((run.outcome.stdout_bytes, run.outcome.stdout_truncated, run.outcome.stderr_bytes), (5000, true, 4));
    let a = store.read(&id, ReadTarget::Stdout, 0, 8).unwrap();
    assert_eq!((a.data.as_slice(), a.size, a.eof), (&b"hello st"[..], 12, false));
    let b = store.read(&id, ReadTarget::Stdout, 8, 8).unwrap();
    assert_eq!((b.data.as_slice(), b.eof), (&b"dout"[..], true));
    let e = store.read(&id, ReadTarget::Stderr, 0, 8).unwrap();
    assert_eq!((e.data.as_slice(), e.eof), (&b"oops"[..], true));
}

#[test]
fn files_are_withheld_until_the_run_finishes() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "in.txt", 0, b"x").unwrap();
    let f = || ReadTarget::File("in.txt".into());
    assert!(matches!(store.read(&id, f(), 0, 1), Err(JobError::NotRunYet { .. })));
    assert!(matches!(store.outputs(&id), Err(JobError::NotRunYet { .. })));
    store.begin_run(&id, "s", &[], None).unwrap();
    let err = store.read(&id, f(), 0, 1).unwrap_err();
    assert!(err.to_string().contains("the job is still running") || err.to_string().contains("still running"), "{err}");
    assert!(matches!(store.outputs(&id), Err(JobError::StillRunning { .. })));
    store.finish_flat(&id, exit(0), b"", b"").unwrap();
    assert_eq!(store.read(&id, f(), 0, 1).unwrap().data, b"x");
}

#[test]
fn read_missing_and_non_files() {
    let (_root, store) = open_store(small());
    let (id, work) = finished_job(&store);
    std::fs::create_dir(work.join("sub")).unwrap();
    assert!(matches!(store.read(&id, ReadTarget::File("nope".into()), 0, 1), Err(JobError::NoSuchFile { .. })));
    assert!(matches!(store.read(&id, ReadTarget::File("sub".into()), 0, 1), Err(JobError::NotAFile { .. })));
}

/// A finished job whose script left links pointing out of `work/`.
fn job_with_escapes(store: &JobStore) -> (String, String) {
    let (sibling, sibling_work) = finished_job(store);
    std::fs::write(sibling_work.join("private.txt"), b"sibling data").unwrap();
    let (id, work) = finished_job(store);
    symlink("/etc/passwd", work.join("out")).unwrap();
    symlink("/", work.join("d")).unwrap();
    symlink(&sibling_work, work.join("sib")).unwrap();
    symlink(sibling_work.join("private.txt"), work.join("sibfile")).unwrap();
    symlink(format!("../../{sibling}/work/private.txt"), work.join("relsib")).unwrap();
    symlink("../job.json", work.join("record")).unwrap();
    std::fs::write(work.join("real.txt"), b"real").unwrap();
    symlink("real.txt", work.join("alias")).unwrap();
    (id, sibling)
}

#[test]
fn symlink_escapes_are_refused_on_read() {
    let (_root, store) = open_store(JobLimits { retained: 10, ..small() });
    let (id, _) = job_with_escapes(&store);
    for path in ["out", "d/etc/passwd", "sib/private.txt", "sibfile", "relsib", "record"] {
        let err = store.read(&id, ReadTarget::File(path.into()), 0, 8).unwrap_err();
        assert!(matches!(err, JobError::Escapes { .. }), "{path}: {err}");
        assert!(err.to_string().contains("outside"), "{err}");
    }
    // A link that stays inside work/ is served.
    assert_eq!(store.read(&id, ReadTarget::File("alias".into()), 0, 8).unwrap().data, b"real");
}

#[test]
fn symlinks_and_special_files_are_skipped_in_the_listing() {
    let (_root, store) = open_store(JobLimits { retained: 10, files: 100, ..small() });
    let (id, _) = job_with_escapes(&store);
    let work = store.work_dir(&id).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(work.join("sock")).unwrap();
    let listing = store.outputs(&id).unwrap();
    let files: Vec<&str> = listing.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(files, vec!["in.txt", "real.txt"]);
    // Walk order is name order.
    let skipped: Vec<(&str, SkipKind)> = listing.skipped.iter().map(|s| (s.path.as_str(), s.kind)).collect();
    assert_eq!(
        skipped,
        vec![
            ("alias", SkipKind::Symlink),
            ("d", SkipKind::Symlink),
            ("out", SkipKind::Symlink),
            ("record", SkipKind::Symlink),
            ("relsib", SkipKind::Symlink),
            ("sib", SkipKind::Symlink),
            ("sibfile", SkipKind::Symlink),
            ("sock", SkipKind::Special),
        ]
    );
    let out = listing.skipped.iter().find(|s| s.path == "out").unwrap();
    assert!(out.reason.contains("not followed") && out.reason.contains("/etc/passwd"), "{}", out.reason);
    assert!(listing.skipped.iter().find(|s| s.path == "sock").unwrap().reason.contains("socket"));
    assert!(!listing.truncated);
}

#[test]
fn outputs_hash_files_and_mark_inputs() {
    let (_root, store) = open_store(small());
    let id = store.create("demo", "local").unwrap().id;
    store.upload(&id, "keep.txt", 0, b"same").unwrap();
    store.upload(&id, "edit.txt", 0, b"before").unwrap();
    store.upload(&id, "gone.txt", 0, b"bye").unwrap();
    let work = store.begin_run(&id, "s", &[], None).unwrap();
    std::fs::write(work.join("edit.txt"), b"after!").unwrap();
    std::fs::remove_file(work.join("gone.txt")).unwrap();
    std::fs::create_dir_all(work.join("out/deep")).unwrap();
    std::fs::write(work.join("out/deep/result.csv"), b"a,b\n").unwrap();
    store.finish_flat(&id, exit(0), b"", b"").unwrap();
    let listing = store.outputs(&id).unwrap();
    let got: Vec<(&str, u64, &str, InputMatch)> =
        listing.files.iter().map(|f| (f.path.as_str(), f.size, f.sha256.as_str(), f.input)).collect();
    let (h_after, h_csv, h_same) = (sha(b"after!"), sha(b"a,b\n"), sha(b"same"));
    assert_eq!(
        got,
        vec![
            ("edit.txt", 6, h_after.as_str(), InputMatch::Changed),
            ("keep.txt", 4, h_same.as_str(), InputMatch::Unchanged),
            ("out/deep/result.csv", 4, h_csv.as_str(), InputMatch::NotAnInput),
        ]
    );
    assert_eq!(listing.total_bytes, 14);
    assert!(listing.skipped.is_empty() && !listing.truncated);
    // Every listed path reads back.
    for f in &listing.files {
        assert_eq!(store.read(&id, ReadTarget::File(f.path.clone()), 0, 8).unwrap().size, f.size);
    }
}

#[test]
fn outputs_stop_at_the_file_cap() {
    let (_root, store) = open_store(small()); // files: 5
    let id = store.create("demo", "local").unwrap().id;
    let work = store.begin_run(&id, "s", &[], None).unwrap();
    for i in 0..5 {
        std::fs::write(work.join(format!("f{i}")), b"x").unwrap();
    }
    store.finish_flat(&id, exit(0), b"", b"").unwrap();
    let at_cap = store.outputs(&id).unwrap();
    assert_eq!((at_cap.files.len(), at_cap.truncated), (5, false));
    std::fs::write(work.join("f5"), b"x").unwrap();
    let over = store.scan_outputs(&id).unwrap();
    assert_eq!((over.files.len(), over.truncated), (5, true));
    // The listing made once is the one served: it is stored, never redone.
    assert_eq!(store.outputs(&id).unwrap(), at_cap);
}

#[test]
fn outputs_report_unaddressable_names_and_deep_trees() {
    let (_root, store) = open_store(JobLimits { files: 100, ..small() });
    let (id, work) = finished_job(&store);
    std::fs::write(work.join("a\\b"), b"x").unwrap();
    std::fs::write(work.join("100%"), b"x").unwrap();
    let deep = (0..JOB_MAX_DEPTH).fold(work.clone(), |p, i| p.join(format!("{i}")));
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.parent().unwrap().join("at-cap.txt"), b"x").unwrap();
    let listing = store.outputs(&id).unwrap();
    let bad: Vec<&str> = listing.skipped.iter().filter(|s| s.kind == SkipKind::BadName).map(|s| s.path.as_str()).collect();
    assert_eq!(bad, vec!["100%", "a\\b"]);
    let too_deep: Vec<&SkippedEntry> = listing.skipped.iter().filter(|s| s.kind == SkipKind::TooDeep).collect();
    assert_eq!(too_deep.len(), 1);
    assert_eq!(too_deep[0].path.split('/').count(), JOB_MAX_DEPTH);
    let at_cap = listing.files.iter().find(|f| f.path.ends_with("at-cap.txt")).unwrap();
    assert_eq!(at_cap.path.split('/').count(), JOB_MAX_DEPTH);
    store.read(&id, ReadTarget::File(at_cap.path.clone()), 0, 1).unwrap();
}

#[test]
fn stream_files_planted_as_symlinks_are_refused() {
    let (root, store) = open_store(small());
    let (id, _) = finished_job(&store);
    let stdout = job_dir(&root, &id).join("stdout");
    std::fs::remove_file(&stdout).unwrap();
    symlink("/etc/passwd", &stdout).unwrap();
    assert!(matches!(store.read(&id, ReadTarget::Stdout, 0, 8), Err(JobError::Io { .. })));
}

#[test]
fn planted_job_and_work_symlinks_are_refused() {
    let (root, store) = open_store(small());
    let outside = tempfile::tempdir().unwrap();
    // work/ replaced by a link out of the job.
    let (id, work) = finished_job(&store);
    std::fs::remove_dir_all(&work).unwrap();
    symlink(outside.path(), &work).unwrap();
    assert!(matches!(store.work_dir(&id), Err(JobError::Corrupt { .. })));
    assert!(matches!(store.outputs(&id), Err(JobError::Corrupt { .. })));
    assert!(matches!(store.read(&id, ReadTarget::File("x".into()), 0, 1), Err(JobError::Corrupt { .. })));
    // A job id that is a link to a directory elsewhere.
    let fake = "fedcba9876543210fedcba9876543210";
    symlink(job_dir(&root, &id), job_dir(&root, fake)).unwrap();
    assert!(matches!(store.get(fake), Err(JobError::Corrupt { .. })));
    assert!(matches!(store.begin_run(fake, "s", &[], None), Err(JobError::Corrupt { .. })));
}
