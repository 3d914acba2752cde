//! A SkillJob read back as the job store's shapes: the record, the run
//! outcome, the output listing. Pure functions, so the translation a
//! client sees is tested without a cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::api::job::REQUESTED_BY_ANNOTATION;
use crate::api::job::{InputFile, SkillJob, SkillJobPhase};
use crate::api::outcome::RunOutcome;
use crate::artifacts::{OutputManifest, SkipReason, WORK_PREFIX};
use crate::controller::decide::is_final;
use crate::core::owner::OwnerSeal;
use crate::jobs::{FileInfo, InputMatch, JobRecord, JobState, OutputFile, OutputListing, RunRecord, SkipKind, SkippedEntry};

use super::names::ANNOTATION_SKILL;

/// The principal a SkillJob was run for (`None`: not the gateway's).
pub fn owner<'a>(sj: &'a SkillJob, seal: &OwnerSeal) -> Option<&'a str> {
    sj.proven_owner(seal).ok().map(|(principal, _)| principal)
}

/// The run is over and the controller has confirmed it (a Cancelled phase
/// whose pod is still stopping is not over: `Complete` is still False).
pub fn is_finished(sj: &SkillJob) -> bool {
    let Some(status) = sj.status.as_ref() else { return false };
    status.phase.is_some_and(is_final) && status.conditions.iter().any(|c| c.type_ == "Complete" && c.status == "True")
}

pub fn phase_name(sj: &SkillJob) -> String {
    match sj.status.as_ref().and_then(|s| s.phase) {
        Some(phase) => format!("{phase:?}"),
        None => "Accepted".into(),
    }
}

fn ms(t: Option<&Time>) -> Option<u64> {
    t.map(|t| t.0.as_millisecond().max(0) as u64)
}

/// The job state a SkillJob's phase means. The phase is the controller's
/// verdict and wins; the outcome only tells a limit from a plain failure.
pub fn state_of(sj: &SkillJob, outcome: &RunOutcome) -> JobState {
    if !is_finished(sj) {
        return JobState::Running;
    }
    match sj.status.as_ref().and_then(|s| s.phase) {
        Some(SkillJobPhase::Succeeded) => JobState::Succeeded,
        Some(SkillJobPhase::TimedOut) => JobState::TimedOut,
        Some(SkillJobPhase::Cancelled) => JobState::Cancelled,
        Some(SkillJobPhase::Failed) | Some(SkillJobPhase::Locked) if outcome.limit_exceeded.is_some() => JobState::LimitExceeded,
        _ => JobState::Failed,
    }
}

/// The outcome as the status records it, refined by the launcher's
/// `result.json` when the run stored one (bytes written, truncation,
/// duration, which limit).
pub fn outcome_of(sj: &SkillJob, launched: Option<&RunOutcome>) -> RunOutcome {
    let mut outcome = launched.cloned().unwrap_or_default();
    let Some(status) = sj.status.as_ref() else { return outcome };
    outcome.exit_code = status.exit_code.or(outcome.exit_code);
    outcome.signal = status.signal.or(outcome.signal);
    match status.phase {
        Some(SkillJobPhase::TimedOut) => outcome.timed_out = true,
        Some(SkillJobPhase::Cancelled) => outcome.cancelled = true,
        _ => {}
    }
    for (stream, bytes, truncated) in [
        (&status.stdout, &mut outcome.stdout_bytes, &mut outcome.stdout_truncated),
        (&status.stderr, &mut outcome.stderr_bytes, &mut outcome.stderr_truncated),
    ] {
        if let Some(s) = stream {
            *bytes = (*bytes).max(s.size);
            *truncated |= s.truncated;
        }
    }
    if outcome.duration_ms == 0 {
        if let (Some(a), Some(b)) = (ms(status.started_at.as_ref()), ms(status.finished_at.as_ref())) {
            outcome.duration_ms = b.saturating_sub(a);
        }
    }
    outcome
}

pub fn inputs_of(inputs: &[InputFile]) -> Vec<FileInfo> {
    let mut files: Vec<FileInfo> =
        inputs.iter().map(|i| FileInfo { path: i.path.clone(), size: i.size, sha256: i.digest.clone() }).collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// The job record of a SkillJob (its run started when it was written),
/// for a SkillJob already proven the caller's ([`owner`]).
pub fn job_record(sj: &SkillJob, outcome: &RunOutcome) -> JobRecord {
    let status = sj.status.clone().unwrap_or_default();
    let created = ms(sj.metadata.creation_timestamp.as_ref()).unwrap_or(0);
    let finished = is_finished(sj);
    let note = match status.phase {
        Some(SkillJobPhase::Succeeded) | None => None,
        _ => status.message.clone(),
    };
    JobRecord {
        id: sj.name_any(),
        skill: status.skill.clone().or_else(|| sj.annotations().get(ANNOTATION_SKILL).cloned()).unwrap_or_default(),
        owner: sj.annotations().get(REQUESTED_BY_ANNOTATION).cloned().unwrap_or_default(),
        created_at_ms: created,
        state: state_of(sj, outcome),
        inputs: inputs_of(&sj.spec.inputs),
        run: Some(RunRecord {
            script: sj.spec.script.clone(),
            args: sj.spec.args.clone(),
            started_at_ms: ms(status.started_at.as_ref()).unwrap_or(created),
            finished_at_ms: if finished { ms(status.finished_at.as_ref()).or(Some(created)) } else { None },
            outcome: outcome.clone(),
            note,
        }),
    }
}

fn skip_kind(reason: SkipReason) -> SkipKind {
    match reason {
        SkipReason::Symlink => SkipKind::Symlink,
        SkipReason::NotRegular => SkipKind::Special,
        SkipReason::BadName | SkipReason::CaseCollision => SkipKind::BadName,
        SkipReason::TooDeep => SkipKind::TooDeep,
        _ => SkipKind::Unreadable,
    }
}

fn skip_text(reason: SkipReason) -> &'static str {
    match reason {
        SkipReason::Symlink => "a symlink: never followed",
        SkipReason::NotRegular => "not a regular file",
        SkipReason::BadName => "its name is not UTF-8 or breaks the path rules",
        SkipReason::CaseCollision => "differs only in case from another output",
        SkipReason::TooDeep => "nested too deep",
        SkipReason::FileTooLarge => "over the per-file output cap; not stored",
        SkipReason::TotalTooLarge => "past the per-job output cap; not stored",
        SkipReason::FileLimit => "past the output file count; not stored",
        SkipReason::DirLimit => "past the output directory count; not stored",
        SkipReason::WalkLimit => "the output walk stopped here",
        SkipReason::Unreadable => "could not be read in the pod",
    }
}

fn input_match(inputs: &[InputFile], path: &str, digest: &str) -> InputMatch {
    match inputs.iter().find(|i| i.path == path) {
        None => InputMatch::NotAnInput,
        Some(i) if i.digest == digest => InputMatch::Unchanged,
        Some(_) => InputMatch::Changed,
    }
}

/// Everything under `/work` after the run, from the manifest the upload
/// sidecar stored (inputs included, marked as such, as `serve` lists them).
pub fn listing_from_manifest(sj: &SkillJob, manifest: &OutputManifest) -> OutputListing {
    let files: Vec<OutputFile> = manifest
        .files
        .iter()
        .filter_map(|f| f.path.strip_prefix(WORK_PREFIX).map(|p| (p, f)))
        .map(|(p, f)| OutputFile {
            path: p.to_string(),
            size: f.size,
            sha256: f.digest.clone(),
            input: input_match(&sj.spec.inputs, p, &f.digest),
            download: None,
        })
        .collect();
    let skipped: Vec<SkippedEntry> = manifest
        .skipped
        .iter()
        .map(|s| SkippedEntry {
            path: s.path.strip_prefix(WORK_PREFIX).unwrap_or(&s.path).to_string(),
            kind: skip_kind(s.reason),
            reason: skip_text(s.reason).to_string(),
        })
        .collect();
    let truncated = manifest.skipped_omitted > 0
        || manifest.skipped.iter().any(|s| matches!(s.reason, SkipReason::FileLimit | SkipReason::DirLimit | SkipReason::WalkLimit));
    OutputListing { total_bytes: files.iter().map(|f| f.size).sum(), files, skipped, truncated }
}

/// The listing from the SkillJob's status alone (no manifest stored: the
/// status names the files the script made or changed).
pub fn listing_from_status(sj: &SkillJob) -> OutputListing {
    let files: Vec<OutputFile> = sj
        .status
        .iter()
        .flat_map(|s| s.outputs.iter())
        .map(|f| OutputFile {
            path: f.path.clone(),
            size: f.size,
            sha256: f.digest.clone(),
            input: input_match(&sj.spec.inputs, &f.path, &f.digest),
            download: None,
        })
        .collect();
    OutputListing { total_bytes: files.iter().map(|f| f.size).sum(), files, skipped: Vec::new(), truncated: false }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::job::{SkillJobSpec, SkillJobStatus, StreamRef};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn job(phase: SkillJobPhase, complete: bool) -> SkillJob {
        let mut sj = SkillJob::new(
            "skj-0",
            SkillJobSpec {
                binding: "b".into(),
                script: "scripts/a.sh".into(),
                args: vec!["x".into()],
                inputs: vec![InputFile { path: "in.txt".into(), digest: "sha256:aa".into(), size: 2 }],
                timeout_seconds: Some(5),
            },
        );
        sj.status = Some(SkillJobStatus {
            phase: Some(phase),
            exit_code: Some(if phase == SkillJobPhase::Succeeded { 0 } else { 3 }),
            stdout: Some(StreamRef { digest: "sha256:bb".into(), size: 2_000_000, truncated: true }),
            conditions: vec![Condition {
                type_: "Complete".into(),
                status: if complete { "True" } else { "False" }.into(),
                reason: "R".into(),
                message: "m".into(),
                last_transition_time: crate::api::conditions::now(),
                observed_generation: None,
            }],
            ..Default::default()
        });
        sj
    }

    #[test]
    fn the_phase_decides_the_state_and_a_stopping_cancel_is_still_running() {
        let o = RunOutcome::default();
        assert_eq!(state_of(&job(SkillJobPhase::Succeeded, true), &o), JobState::Succeeded);
        assert_eq!(state_of(&job(SkillJobPhase::TimedOut, true), &o), JobState::TimedOut);
        assert_eq!(state_of(&job(SkillJobPhase::Cancelled, false), &o), JobState::Running, "the pod is still stopping");
        assert_eq!(state_of(&job(SkillJobPhase::Cancelled, true), &o), JobState::Cancelled);
        assert_eq!(state_of(&job(SkillJobPhase::Running, false), &o), JobState::Running);
        let limit = RunOutcome { limit_exceeded: Some(crate::api::outcome::LimitHit::Memory), ..RunOutcome::default() };
        assert_eq!(state_of(&job(SkillJobPhase::Failed, true), &limit), JobState::LimitExceeded);
        // Exit 0 in a Failed phase (the upload failed) is still a failure.
        let zero = RunOutcome { exit_code: Some(0), ..RunOutcome::default() };
        assert_eq!(state_of(&job(SkillJobPhase::Failed, true), &zero), JobState::Failed);
    }

    #[test]
    fn the_outcome_carries_status_truncation_and_the_record_the_inputs() {
        let sj = job(SkillJobPhase::TimedOut, true);
        let o = outcome_of(&sj, None);
        assert!(o.timed_out && o.stdout_truncated && o.stdout_bytes == 2_000_000 && o.exit_code == Some(3));
        let r = job_record(&sj, &o);
        assert_eq!(r.inputs, vec![FileInfo { path: "in.txt".into(), size: 2, sha256: "sha256:aa".into() }]);
        assert_eq!(r.run.as_ref().unwrap().script, "scripts/a.sh");
        assert!(r.run.as_ref().unwrap().finished_at_ms.is_some());
    }

    #[test]
    fn the_manifest_listing_marks_inputs_and_skips() {
        let sj = job(SkillJobPhase::Succeeded, true);
        let f = |p: &str, d: &str| crate::artifacts::SetFile { path: p.into(), size: 2, digest: d.into() };
        let manifest = OutputManifest {
            schema_version: 1,
            namespace: "n".into(),
            uid: "u".into(),
            complete: true,
            files: vec![f("result/stdout", "sha256:bb"), f("work/in.txt", "sha256:aa"), f("work/out.txt", "sha256:cc")],
            skipped: vec![crate::artifacts::Skipped { path: "work/link".into(), reason: SkipReason::Symlink, size: None }],
            skipped_omitted: 0,
        };
        let l = listing_from_manifest(&sj, &manifest);
        let got: Vec<(&str, InputMatch)> = l.files.iter().map(|f| (f.path.as_str(), f.input)).collect();
        assert_eq!(got, vec![("in.txt", InputMatch::Unchanged), ("out.txt", InputMatch::NotAnInput)]);
        assert_eq!((l.skipped[0].path.as_str(), l.skipped[0].kind, l.total_bytes, l.truncated), ("link", SkipKind::Symlink, 4, false));
    }
}
