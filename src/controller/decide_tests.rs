//! Controller decisions, each rule on its own.

use std::path::Path;

use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use kube::api::ObjectMeta;

use super::*;
use crate::api::binding::{EnvGrant, SecretKeyRef, SkillBindingSpec, SkillBindingStatus};
use crate::api::package::RuntimeProfile;
use crate::api::package::{OciSource, PackageSource, RunResources, SkillPackageSpec};
use crate::core::discovery::{discover, Limits};

fn skill_dir(root: &Path) {
    let s = root.join("weather");
    std::fs::create_dir_all(s.join("scripts")).unwrap();
    std::fs::write(
        s.join("SKILL.md"),
        "---\nname: weather\ndescription: Forecasts.\nlicense: MIT\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/forecast.py\n      interpreter: python\n      env: [API_KEY]\n      timeout: 30\n    - script: scripts/other.js\n      interpreter: node\n  env:\n    - name: API_KEY\n---\nbody\n",
    )
    .unwrap();
    std::fs::write(s.join("scripts/forecast.py"), "print(1)").unwrap();
    std::fs::write(s.join("scripts/other.js"), "0").unwrap();
    std::fs::write(s.join("requirements.txt"), "requests==2.0").unwrap();
}

fn facts() -> (tempfile::TempDir, PackageFacts) {
    let t = tempfile::tempdir().unwrap();
    skill_dir(t.path());
    let catalog = discover(&[t.path().join("weather")], Limits::default());
    let dependencies = dependency_plan_status(crate::image::deps::plan(&t.path().join("weather")));
    (t, PackageFacts { digest: "sha256:abc".into(), catalog, requirement_files: vec!["requirements.txt".into()], dependencies })
}

fn package(runtime: Option<RuntimeProfile>) -> SkillPackage {
    let mut p = SkillPackage::new(
        "weather-1",
        SkillPackageSpec {
            source: PackageSource { oci: OciSource { reference: "r/weather:1".into(), pull_secret: None, insecure: false } },
            runtime,
        },
    );
    p.metadata.generation = Some(1);
    p
}

fn profile(allowed: &[&str]) -> RuntimeProfile {
    RuntimeProfile {
        interpreter: Interpreter::Python,
        image: Some("python@sha256:0123".into()),
        interpreter_path: None,
        allowed_scripts: allowed.iter().map(|s| s.to_string()).collect(),
        allowed_egress: vec![],
        timeout_seconds: Some(120),
        resources: RunResources::default(),
        prepare: false,
        image_mode: None,
        dependencies: None,
    }
}

fn condition<'a>(s: &'a SkillPackageStatus, t: &str) -> (&'a str, &'a str) {
    let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
    (c.status.as_str(), c.reason.as_str())
}

#[test]
fn resolved_package_reports_what_it_holds() {
    let (_t, f) = facts();
    let s = package_status(&package(Some(profile(&["scripts/forecast.py"]))), Ok(&f));
    assert_eq!(s.digest.as_deref(), Some("sha256:abc"));
    assert_eq!((s.skill_name.as_deref(), s.license.as_deref(), s.files), (Some("weather"), Some("MIT"), 4));
    assert_eq!(s.requirements, "requirements.txt");
    assert_eq!(condition(&s, "Resolved").0, "True");
    assert_eq!(condition(&s, "Validated").0, "True");
    assert_eq!(condition(&s, "Ready"), ("True", "Ready"));
    let allowed: Vec<(&str, bool)> = s.scripts.iter().map(|d| (d.script.as_str(), d.allowed)).collect();
    assert_eq!(allowed, vec![("scripts/forecast.py", true), ("scripts/other.js", false)]);
    assert_eq!(s.observed_generation, Some(1));
}

#[test]
fn unresolvable_package_is_not_ready() {
    let err = crate::controller::context::ResolveError::Pull {
        reference: "r/weather:1".into(),
        source: crate::oci::OciError::NotFound { reference: "r/weather:1".into() },
    };
    let s = package_status(&package(None), Err(&err));
    assert_eq!(condition(&s, "Resolved"), ("False", "ResolveFailed"));
    // Not found is a verdict, not a reason to wait (the gateway waits on ResolveRetrying).
    assert_eq!(condition(&s, "Ready"), ("False", "NotResolved"));
}

#[test]
fn an_unreachable_registry_is_retried_soon_then_less_often() {
    use super::{resolve_retry_after, RESOLVE_RETRYING};
    use std::time::Duration;
    let err = crate::controller::context::ResolveError::Pull {
        reference: "r/weather:1".into(),
        source: crate::oci::OciError::Unreachable { registry: "r".into(), detail: "connection refused".into() },
    };
    let s = package_status(&package(None), Err(&err));
    assert_eq!(condition(&s, "Ready"), ("False", RESOLVE_RETRYING));
    // The edges: a second at first, half the outage's age, 30 s at most.
    assert_eq!(resolve_retry_after(Duration::ZERO), Duration::from_secs(1));
    assert_eq!(resolve_retry_after(Duration::from_secs(2)), Duration::from_secs(1));
    assert_eq!(resolve_retry_after(Duration::from_secs(10)), Duration::from_secs(5));
    assert_eq!(resolve_retry_after(Duration::from_secs(60)), Duration::from_secs(30));
    assert_eq!(resolve_retry_after(Duration::from_secs(3600)), Duration::from_secs(30));
}

#[test]
fn without_runtime_only_instructions_are_served() {
    let (_t, f) = facts();
    let s = package_status(&package(None), Ok(&f));
    assert_eq!(condition(&s, "Ready"), ("True", "InstructionsOnly"));
    assert!(s.scripts.iter().all(|d| !d.allowed));
}

#[test]
fn allowed_scripts_must_be_declared_and_match_the_interpreter() {
    let (_t, f) = facts();
    let s = package_status(&package(Some(profile(&["scripts/forecast.py", "scripts/evil.py"]))), Ok(&f));
    assert_eq!(condition(&s, "Ready"), ("False", "ScriptNotDeclared"));
    let s = package_status(&package(Some(profile(&["scripts/other.js"]))), Ok(&f));
    let other = s.scripts.iter().find(|d| d.script == "scripts/other.js").unwrap();
    assert!(!other.allowed && other.reason.as_deref().unwrap().contains("declared for node"));
}

#[test]
fn a_package_without_a_skill_is_invalid() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("empty")).unwrap();
    let f = PackageFacts {
        digest: "sha256:x".into(),
        catalog: discover(&[t.path().join("empty")], Limits::default()),
        requirement_files: vec![],
        dependencies: Default::default(),
    };
    let s = package_status(&package(None), Ok(&f));
    assert_eq!(condition(&s, "Validated"), ("False", "InvalidPackage"));
}

#[test]
fn changing_the_runtime_resets_readiness_with_the_generation() {
    let (_t, f) = facts();
    let mut p = package(Some(profile(&["scripts/forecast.py"])));
    p.status = Some(package_status(&p, Ok(&f)));
    p.spec.runtime = Some(profile(&["scripts/nope.py"]));
    p.metadata.generation = Some(2);
    let s = package_status(&p, Ok(&f));
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.observed_generation), ("False", Some(2)));
}

fn ready_package() -> (tempfile::TempDir, SkillPackage) {
    let (t, f) = facts();
    let mut p = package(Some(profile(&["scripts/forecast.py"])));
    p.status = Some(package_status(&p, Ok(&f)));
    (t, p)
}

fn binding(name: &str, grants: &[&str]) -> SkillBinding {
    let mut b = SkillBinding::new(
        name,
        SkillBindingSpec {
            package: "weather-1".into(),
            env: grants
                .iter()
                .map(|g| EnvGrant { name: g.to_string(), secret_key_ref: SecretKeyRef { name: "s".into(), key: g.to_lowercase() } })
                .collect(),
            egress: false,
            egress_hosts: None,
            warm: None,
        },
    );
    b.metadata.namespace = Some("team".into());
    b
}

#[test]
fn binding_grants_only_requested_variables() {
    let (_t, p) = ready_package();
    let d = binding_decision(&binding("b", &["API_KEY", "UNASKED", "LD_PRELOAD"]), Some(&p), &[]);
    assert_eq!(d.ready, Ok(()));
    assert_eq!(d.effective_env, vec!["API_KEY"]);
    assert_eq!(d.ignored_env, vec!["UNASKED", "LD_PRELOAD"]);
    assert_eq!(d.skill_name.as_deref(), Some("weather"));
}

#[test]
fn two_bindings_of_one_skill_name_are_both_refused() {
    let (_t, p) = ready_package();
    let siblings = vec![("a".to_string(), "weather".to_string()), ("b".to_string(), "weather".to_string())];
    for name in ["a", "b"] {
        let d = binding_decision(&binding(name, &[]), Some(&p), &siblings);
        assert_eq!(d.ready.unwrap_err().0, "DuplicateSkillName", "{name}");
    }
    let alone = vec![("a".to_string(), "weather".to_string())];
    assert_eq!(binding_decision(&binding("a", &[]), Some(&p), &alone).ready, Ok(()));
}

#[test]
fn binding_needs_a_ready_package() {
    assert_eq!(binding_decision(&binding("b", &[]), None, &[]).ready.unwrap_err().0, "PackageNotFound");
    let p = package(None);
    assert_eq!(binding_decision(&binding("b", &[]), Some(&p), &[]).ready.unwrap_err().0, "PackageNotReady");
}

fn ready_binding(grants: &[&str]) -> SkillBinding {
    let (_t, p) = ready_package();
    let mut b = binding("b", grants);
    let d = binding_decision(&b, Some(&p), &[]);
    let mut status =
        SkillBindingStatus { effective_env: d.effective_env, ignored_env: d.ignored_env, skill_name: d.skill_name, ..Default::default() };
    set_condition(&mut status.conditions, "Ready", true, "Ready", "ok", Some(1));
    b.status = Some(status);
    b
}

fn job(script: &str, args: &[&str], timeout: Option<u32>) -> SkillJobSpec {
    SkillJobSpec {
        binding: "b".into(),
        script: script.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        inputs: vec![],
        timeout_seconds: timeout,
    }
}

#[test]
fn admission_follows_the_fence() {
    let (_t, p) = ready_package();
    let b = ready_binding(&["API_KEY"]);
    let a = admit(&job("scripts/forecast.py", &["; rm -rf /", "$(id)"], None), Some(&b), Some(&p)).unwrap();
    assert_eq!(a.args, vec!["; rm -rf /", "$(id)"]);
    assert_eq!(a.env, vec![("API_KEY".to_string(), "s".to_string(), "api_key".to_string())]);
    assert_eq!(a.timeout_secs, 30, "the declaration's 30 s is below the profile's 120 s");
    assert_eq!(a.interpreter_path, "/usr/local/bin/python3");
    assert_eq!(admit(&job("scripts/forecast.py", &[], Some(10)), Some(&b), Some(&p)).unwrap().timeout_secs, 10);
    assert_eq!(admit(&job("scripts/forecast.py", &[], Some(300)), Some(&b), Some(&p)).unwrap().timeout_secs, 30);
    let e = admit(&job("scripts/undeclared.py", &[], None), Some(&b), Some(&p)).unwrap_err();
    assert_eq!(e.reason(), "NotDeclared");
    assert!(e.to_string().contains("must be declared"));
    assert_eq!(admit(&job("scripts/other.js", &[], None), Some(&b), Some(&p)).unwrap_err().reason(), "NotAllowed");
    let many: Vec<String> = (0..65).map(|i| i.to_string()).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(
        admit(&job("scripts/forecast.py", &many, None), Some(&b), Some(&p)).unwrap_err().to_string(),
        Refusal::TooManyArgs { count: 65 }.to_string()
    );
    assert_eq!(admit(&job("scripts/forecast.py", &[], None), None, Some(&p)).unwrap_err().reason(), "BindingNotFound");
    assert_eq!(admit(&job("scripts/forecast.py", &[], None), Some(&binding("b", &[])), Some(&p)).unwrap_err().reason(), "BindingNotReady");
    let (_t, f) = facts();
    let mut no_runtime = package(None);
    no_runtime.status = Some(package_status(&no_runtime, Ok(&f)));
    assert_eq!(admit(&job("scripts/forecast.py", &[], None), Some(&b), Some(&no_runtime)).unwrap_err().reason(), "NoRuntime");
}

/// The controller's package cache can lag its binding cache: a Ready binding
/// beside a cached package with no status yet (or a stale, not-Ready one)
/// must leave the SkillJob Pending, not fail it as "no scripts declared".
#[test]
fn a_package_not_ready_in_the_cache_makes_the_skilljob_wait() {
    let b = ready_binding(&[]);
    let run = job("scripts/forecast.py", &[], None);
    let bare = package(Some(profile(&["scripts/forecast.py"])));
    let e = admit(&run, Some(&b), Some(&bare)).unwrap_err();
    assert_eq!(e.reason(), "PackageNotReady");
    assert!(e.is_transient(), "waiting for the package's status may change the answer");
    assert!(e.to_string().contains("SkillPackage `weather-1`"), "{e}");

    let (_t, mut resolving) = ready_package();
    let status = resolving.status.as_mut().unwrap();
    set_condition(&mut status.conditions, "Ready", false, "Retrying", "registry down", Some(1));
    let e = admit(&run, Some(&b), Some(&resolving)).unwrap_err();
    assert_eq!((e.reason(), e.is_transient()), ("PackageNotReady", true));

    let (_t, ready) = ready_package();
    assert!(admit(&run, Some(&b), Some(&ready)).is_ok(), "the same package once its status is Ready runs");
}

#[test]
fn ungranted_variables_never_reach_the_job() {
    let (_t, p) = ready_package();
    let b = ready_binding(&[]);
    assert!(admit(&job("scripts/forecast.py", &[], None), Some(&b), Some(&p)).unwrap().env.is_empty());
}

fn job_with(conditions: &[(&str, &str, Option<&str>)], active: i32) -> Job {
    Job {
        metadata: ObjectMeta::default(),
        spec: None,
        status: Some(JobStatus {
            active: Some(active),
            conditions: Some(
                conditions
                    .iter()
                    .map(|(t, s, r)| JobCondition {
                        type_: t.to_string(),
                        status: s.to_string(),
                        reason: r.map(String::from),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
    }
}

#[test]
fn job_phases() {
    assert_eq!(job_phase(&Job::default()), SkillJobPhase::Pending);
    assert_eq!(job_phase(&job_with(&[], 1)), SkillJobPhase::Running);
    assert_eq!(job_phase(&job_with(&[("Complete", "True", None)], 0)), SkillJobPhase::Succeeded);
    assert_eq!(job_phase(&job_with(&[("Failed", "True", Some("DeadlineExceeded"))], 0)), SkillJobPhase::TimedOut);
    assert_eq!(job_phase(&job_with(&[("Failed", "True", Some("PodFailurePolicy"))], 0)), SkillJobPhase::Failed);
    assert_eq!(job_phase(&job_with(&[("Failed", "False", None)], 1)), SkillJobPhase::Running);
    assert!(is_final(SkillJobPhase::Locked) && !is_final(SkillJobPhase::Running));
}

#[test]
fn namespace_pss_label() {
    let mut labels = std::collections::BTreeMap::new();
    assert!(!namespace_is_restricted(None));
    labels.insert(PSS_ENFORCE_LABEL.to_string(), "baseline".to_string());
    assert!(!namespace_is_restricted(Some(&labels)));
    labels.insert(PSS_ENFORCE_LABEL.to_string(), "restricted".to_string());
    assert!(namespace_is_restricted(Some(&labels)));
}

#[test]
fn references_are_pinned_to_the_resolved_digest() {
    assert_eq!(pinned_reference("reg:5000/skills/pdf:1.0", "sha256:ab"), "reg:5000/skills/pdf@sha256:ab");
    assert_eq!(pinned_reference("reg:5000/skills/pdf", "sha256:ab"), "reg:5000/skills/pdf@sha256:ab");
    assert_eq!(pinned_reference("reg/skills/pdf@sha256:old", "sha256:ab"), "reg/skills/pdf@sha256:ab");
    assert_eq!(pinned_reference("reg/pdf:1@sha256:old", "sha256:ab"), "reg/pdf@sha256:ab");
}

mod inputs {
    use crate::api::job::InputFile;
    use crate::artifacts::SetFile;
    use crate::controller::decide::inputs_mismatch;

    fn named(path: &str, digest: char, size: u64) -> InputFile {
        InputFile { path: path.into(), digest: format!("sha256:{}", digest.to_string().repeat(64)), size }
    }

    fn staged(path: &str, digest: char, size: u64) -> SetFile {
        SetFile { path: path.into(), digest: format!("sha256:{}", digest.to_string().repeat(64)), size }
    }

    #[test]
    fn the_same_files_match() {
        assert_eq!(
            inputs_mismatch(&[named("a.csv", 'a', 3), named("d/b.txt", 'b', 5)], &[staged("d/b.txt", 'b', 5), staged("a.csv", 'a', 3)]),
            None
        );
        assert_eq!(inputs_mismatch(&[], &[]), None);
    }

    #[test]
    fn a_missing_file_is_named() {
        let why = inputs_mismatch(&[named("a.csv", 'a', 3)], &[]).unwrap();
        assert!(why.contains("a.csv is not staged"), "{why}");
    }

    #[test]
    fn other_content_under_the_same_path_is_refused() {
        let why = inputs_mismatch(&[named("a.csv", 'a', 3)], &[staged("a.csv", 'c', 3)]).unwrap();
        assert!(why.contains("a.csv differs"), "{why}");
        let why = inputs_mismatch(&[named("a.csv", 'a', 3)], &[staged("a.csv", 'a', 4)]).unwrap();
        assert!(why.contains("a.csv differs"), "{why}");
    }

    #[test]
    fn an_unnamed_staged_file_is_refused() {
        let why = inputs_mismatch(&[named("a.csv", 'a', 3)], &[staged("a.csv", 'a', 3), staged("extra.sh", 'e', 9)]).unwrap();
        assert!(why.contains("extra.sh is staged but not named"), "{why}");
    }
}

mod verdicts {
    use super::super::{run_verdict, ContainerEnd, RunFacts};
    use crate::api::job::SkillJobPhase;
    use crate::api::outcome::{LaunchResult, LimitHit, RunOutcome};

    fn launched(f: impl FnOnce(&mut RunOutcome)) -> RunFacts {
        let mut outcome = RunOutcome::default();
        f(&mut outcome);
        RunFacts { launch: Some(LaunchResult { outcome, error: None, times: None }), outputs_stored: true, ..Default::default() }
    }

    #[test]
    fn a_launcher_timeout_is_timed_out_not_a_failure_with_124() {
        // Issue 8: result.json said timedOut, the SkillJob said Failed, exit 124.
        let mut facts = launched(|o| {
            o.exit_code = Some(124);
            o.timed_out = true
        });
        facts.run = Some(ContainerEnd { exit_code: 124, ..Default::default() });
        facts.job_failed = Some("PodFailurePolicy".into());
        let v = run_verdict(&facts);
        assert_eq!((v.phase, v.reason), (SkillJobPhase::TimedOut, "TimedOut"));
        assert!(v.message.contains("timeout"), "{}", v.message);
    }

    #[test]
    fn the_job_deadline_is_timed_out_too() {
        let facts = RunFacts { job_failed: Some("DeadlineExceeded".into()), ..Default::default() };
        assert_eq!(run_verdict(&facts).phase, SkillJobPhase::TimedOut);
        let mut cancelled = launched(|o| o.cancelled = true);
        cancelled.job_failed = Some("DeadlineExceeded".into());
        assert_eq!(run_verdict(&cancelled).phase, SkillJobPhase::TimedOut, "the deadline's SIGTERM looks like a cancel to the launcher");
    }

    #[test]
    fn outcomes_map_once() {
        assert_eq!(run_verdict(&launched(|o| o.exit_code = Some(0))).phase, SkillJobPhase::Succeeded);
        let failed = run_verdict(&launched(|o| o.exit_code = Some(3)));
        assert_eq!((failed.phase, failed.exit_code, failed.message.as_str()), (SkillJobPhase::Failed, Some(3), "the script exited 3"));
        assert_eq!(run_verdict(&launched(|o| o.cancelled = true)).phase, SkillJobPhase::Cancelled);
        let over = run_verdict(&launched(|o| o.limit_exceeded = Some(LimitHit::Memory)));
        assert_eq!((over.phase, over.reason), (SkillJobPhase::Failed, "LimitExceeded"));
    }

    #[test]
    fn a_failed_helper_names_its_own_error() {
        // Issue 8: the fetch container panicked and the SkillJob said only "see the Job's events".
        let facts = RunFacts {
            fetch: Some(ContainerEnd {
                exit_code: 2,
                message: Some("\nerror: cannot reach http://10.0.0.9:8443: connection refused\n".into()),
                ..Default::default()
            }),
            job_failed: Some("BackoffLimitExceeded".into()),
            ..Default::default()
        };
        let v = run_verdict(&facts);
        assert_eq!((v.phase, v.reason), (SkillJobPhase::Failed, "FetchFailed"));
        assert!(v.message.ends_with("error: cannot reach http://10.0.0.9:8443: connection refused"), "{}", v.message);
        let mut exited = launched(|o| o.exit_code = Some(0));
        exited.outputs_stored = false;
        exited.upload = Some(ContainerEnd { exit_code: 1, message: Some("error: the endpoint answered 413".into()), ..Default::default() });
        let v = run_verdict(&exited);
        assert_eq!((v.phase, v.reason), (SkillJobPhase::Failed, "OutputsNotStored"));
        assert!(v.message.contains("413"), "{}", v.message);
        let oom = RunFacts {
            run: Some(ContainerEnd { exit_code: 137, reason: Some("OOMKilled".into()), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(run_verdict(&oom).reason, "LimitExceeded");
    }
}

mod preparation {
    //! Readiness of prepared packages, the mode choice, image volume
    //! support and what a run of a prepared package gets.

    use super::*;
    use crate::api::package::{ImageMode, PreparationStatus, PrepareMode};
    use crate::controller::builders::job::PackageDelivery;
    use crate::controller::prepare::Progress;

    const IMAGE: &str = "127.0.0.1:5000/prepared@sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const BASE: &str = "127.0.0.1:5000/runtime@sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn prepared_profile() -> RuntimeProfile {
        RuntimeProfile { prepare: true, image: None, ..profile(&["scripts/forecast.py"]) }
    }

    /// A prepared package, as the reconciler leaves it after a good compose.
    fn prepared(mode: ImageMode) -> (tempfile::TempDir, SkillPackage) {
        let (t, f) = facts();
        let mut p = package(Some(prepared_profile()));
        let mut s = package_status(&p, Ok(&f));
        s.image = Some(IMAGE.into());
        s.image_mode = Some(mode);
        s.base_image = Some(BASE.into());
        s.preparation = Some(PreparationStatus {
            key: Some("sha256:k1".into()),
            prepared_key: Some("sha256:k1".into()),
            package_digest: Some("sha256:abc".into()),
            env: vec!["PYTHONPATH=/deps/python".into()],
            ..Default::default()
        });
        apply_preparation(&mut s, &Progress::Prepared { message: "ok".into() }, Some(1));
        p.status = Some(s);
        (t, p)
    }

    #[test]
    fn a_prepared_package_is_ready_and_says_from_which_image() {
        let (_t, p) = prepared(ImageMode::Composed);
        let s = p.status.as_ref().unwrap();
        assert_eq!(condition(s, "Ready"), ("True", "Ready"));
        assert_eq!(condition(s, "Prepared"), ("True", "Prepared"));
        assert_eq!(condition(s, "Preparing").0, "False");
        assert_eq!(condition(s, "PreparationFailed").0, "False");
        assert!(s.conditions.iter().any(|c| c.type_ == "Ready" && c.message.contains(IMAGE)));
    }

    #[test]
    fn preparing_holds_readiness_back() {
        let (_t, f) = facts();
        let p = package(Some(prepared_profile()));
        let mut s = package_status(&p, Ok(&f));
        assert_eq!(condition(&s, "Ready").0, "True", "the profile itself is fine");
        apply_preparation(&mut s, &Progress::Preparing { reason: "Building", message: "the build runs".into() }, Some(1));
        assert_eq!(condition(&s, "Ready"), ("False", "Preparing"));
        assert_eq!(condition(&s, "Preparing"), ("True", "Building"));
        assert_eq!(condition(&s, "Prepared").0, "False");
    }

    #[test]
    fn a_failed_preparation_keeps_the_last_good_image_but_is_not_ready() {
        let (_t, mut p) = prepared(ImageMode::Composed);
        let mut s = p.status.clone().unwrap();
        apply_preparation(&mut s, &Progress::Failed { reason: "NoWheel".into(), message: "no wheel of x\n--- tail".into() }, Some(2));
        assert_eq!(s.image.as_deref(), Some(IMAGE), "the last good image stays recorded");
        assert_eq!(condition(&s, "Ready"), ("False", "PreparationFailed"));
        assert_eq!(condition(&s, "PreparationFailed"), ("True", "NoWheel"));
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(ready.message.contains("last good image") && !ready.message.contains("tail"), "{}", ready.message);
        p.status = Some(s);
        p.metadata.generation = Some(2);
        assert!(matches!(delivery(&p), Err(AdmitRefusal::NotPrepared(_))), "a failed attempt's package does not run");
    }

    #[test]
    fn a_changed_profile_resets_readiness_until_the_image_is_prepared_for_it() {
        let (_t, f) = facts();
        let (_t2, mut p) = prepared(ImageMode::Composed);
        assert!(delivery(&p).is_ok());
        // The admin changes the profile: a new generation the preparation has not seen.
        p.spec.runtime = Some(RuntimeProfile { image: Some("python:3.13-slim".into()), ..prepared_profile() });
        p.metadata.generation = Some(2);
        assert!(matches!(delivery(&p), Err(AdmitRefusal::NotPrepared(_))), "the old image must not run the new profile");
        // Resolved again for generation 2, and the step found a new key: Preparing.
        let mut s = package_status(&p, Ok(&f));
        if let Some(prep) = s.preparation.as_mut() {
            prep.key = Some("sha256:k2".into());
        }
        apply_preparation(&mut s, &Progress::Preparing { reason: "BuildStarted", message: "started".into() }, Some(2));
        assert_eq!(condition(&s, "Ready"), ("False", "Preparing"));
        p.status = Some(s);
        assert!(matches!(delivery(&p), Err(AdmitRefusal::NotPrepared(_))));
    }

    #[test]
    fn runs_of_a_composed_package_start_from_its_image_and_pass_the_deps_env() {
        let (_t, p) = prepared(ImageMode::Composed);
        let (image, d) = delivery(&p).unwrap();
        assert_eq!(image, IMAGE);
        assert_eq!(d, PackageDelivery::InImage { env: vec!["PYTHONPATH".into()] });
        let a = admit(&job("scripts/forecast.py", &[], None), Some(&ready_binding(&[])), Some(&p)).unwrap();
        assert_eq!((a.image.as_str(), &a.delivery), (IMAGE, &d));
    }

    #[test]
    fn runs_of_an_image_volume_package_start_from_the_base() {
        let (_t, p) = prepared(ImageMode::ImageVolume);
        let (image, d) = delivery(&p).unwrap();
        assert_eq!(image, BASE);
        assert_eq!(
            d,
            PackageDelivery::ImageVolume { reference: IMAGE.into(), deps: true, env: vec![("PYTHONPATH".into(), "/deps/python".into())] }
        );
    }

    #[test]
    fn an_image_for_another_package_digest_or_key_does_not_run() {
        let (_t, mut p) = prepared(ImageMode::Composed);
        p.status.as_mut().unwrap().preparation.as_mut().unwrap().package_digest = Some("sha256:other".into());
        assert!(matches!(delivery(&p), Err(AdmitRefusal::NotPrepared(_))));
        let (_t, mut p) = prepared(ImageMode::Composed);
        p.status.as_mut().unwrap().preparation.as_mut().unwrap().key = Some("sha256:k2".into());
        assert!(matches!(delivery(&p), Err(AdmitRefusal::NotPrepared(_))));
    }

    #[test]
    fn only_the_known_dependency_variables_reach_a_run() {
        let (_t, mut p) = prepared(ImageMode::ImageVolume);
        p.status.as_mut().unwrap().preparation.as_mut().unwrap().env =
            vec!["PYTHONPATH=/work".into(), "LD_PRELOAD=/work/x.so".into(), "NODE_PATH=/deps/node/node_modules".into()];
        let (_, d) = delivery(&p).unwrap();
        assert_eq!(
            d,
            PackageDelivery::ImageVolume {
                reference: IMAGE.into(),
                deps: true,
                env: vec![("NODE_PATH".into(), "/deps/node/node_modules".into())]
            }
        );
    }

    #[test]
    fn without_prepare_runs_fetch_the_package_and_need_an_image() {
        let (_t, p) = ready_package();
        assert_eq!(delivery(&p).unwrap(), ("python@sha256:0123".to_string(), PackageDelivery::Fetched));
        let (_t, f) = facts();
        let no_image = package(Some(RuntimeProfile { image: None, ..profile(&["scripts/forecast.py"]) }));
        let s = package_status(&no_image, Ok(&f));
        assert_eq!(condition(&s, "Ready"), ("False", "NoRunImage"));
        assert_eq!(s.image_mode, Some(ImageMode::Fetched));
    }

    #[test]
    fn the_annotation_asks_for_preparation_too() {
        let mut p = package(Some(profile(&["scripts/forecast.py"])));
        assert!(!p.wants_preparation());
        p.metadata.annotations = Some([(crate::api::package::PREPARE_ANNOTATION.to_string(), "true".to_string())].into());
        assert!(p.wants_preparation());
        p.metadata.annotations = Some([(crate::api::package::PREPARE_ANNOTATION.to_string(), "false".to_string())].into());
        assert!(!p.wants_preparation());
        let instructions_only = package(None);
        assert!(!instructions_only.wants_preparation(), "nothing to prepare without a runtime");
    }

    #[test]
    fn dropping_prepare_drops_the_preparation_conditions() {
        let (_t, f) = facts();
        let (_t2, mut p) = prepared(ImageMode::Composed);
        p.spec.runtime = Some(profile(&["scripts/forecast.py"]));
        p.metadata.generation = Some(2);
        let s = package_status(&p, Ok(&f));
        assert!(s.conditions.iter().all(|c| !PREPARATION_CONDITIONS.contains(&c.type_.as_str())));
        assert_eq!(s.image_mode, Some(ImageMode::Fetched));
    }

    #[test]
    fn the_mode_follows_the_profile_then_the_flag() {
        let yes: Result<(), String> = Ok(());
        let no: Result<(), String> = Err("containerd 1.6".into());
        assert_eq!(image_mode(None, PrepareMode::Composed, &yes), Ok(ImageMode::Composed));
        assert_eq!(image_mode(None, PrepareMode::Auto, &yes), Ok(ImageMode::ImageVolume));
        assert_eq!(image_mode(None, PrepareMode::Auto, &no), Ok(ImageMode::Composed));
        assert_eq!(image_mode(Some(PrepareMode::Composed), PrepareMode::ImageVolume, &yes), Ok(ImageMode::Composed));
        assert_eq!(image_mode(Some(PrepareMode::ImageVolume), PrepareMode::Composed, &yes), Ok(ImageMode::ImageVolume));
        assert_eq!(image_mode(Some(PrepareMode::ImageVolume), PrepareMode::Composed, &no), Err("containerd 1.6".into()));
    }

    #[test]
    fn image_volume_support_needs_the_server_and_every_node() {
        let rt = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ok = rt(&["containerd://2.1.1", "cri-o://1.31.0"]);
        assert_eq!(image_volume_support(ImageVolumes::Auto, Some((1, 35)), Ok(&ok)), Ok(()));
        assert_eq!(image_volume_support(ImageVolumes::Auto, Some((1, 36)), Ok(&rt(&["containerd://2.2.0"]))), Ok(()));
        // This machine's cluster: 1.36 with containerd 1.6.
        let here = image_volume_support(ImageVolumes::Auto, Some((1, 36)), Ok(&rt(&["containerd://1.6.20"])));
        assert!(here.as_ref().unwrap_err().contains("containerd://1.6.20"), "{here:?}");
        assert!(image_volume_support(ImageVolumes::Auto, Some((1, 36)), Ok(&rt(&["containerd://2.2.0", "containerd://2.0.4"]))).is_err());
        assert!(image_volume_support(ImageVolumes::Auto, Some((1, 34)), Ok(&ok)).unwrap_err().contains("off by default"));
        assert!(image_volume_support(ImageVolumes::Auto, Some((1, 31)), Ok(&ok)).unwrap_err().contains("1.33"));
        assert!(image_volume_support(ImageVolumes::Auto, None, Ok(&ok)).is_err());
        assert!(image_volume_support(ImageVolumes::Auto, Some((1, 36)), Err("forbidden".into())).unwrap_err().contains("list` on nodes"));
        assert!(image_volume_support(ImageVolumes::Auto, Some((1, 36)), Ok(&rt(&["docker://28.0"]))).is_err());
        assert!(image_volume_support(ImageVolumes::Auto, Some((1, 36)), Ok(&[])).is_err());
        assert_eq!(image_volume_support(ImageVolumes::On, None, Err("x".into())), Ok(()));
        assert!(image_volume_support(ImageVolumes::Off, Some((1, 36)), Ok(&ok)).is_err());
    }

    #[test]
    fn the_dependency_plan_is_recorded_or_refused() {
        let (_t, f) = facts();
        let s = package_status(&package(Some(prepared_profile())), Ok(&f));
        let d = s.dependencies.unwrap();
        assert!(d.python && !d.node && d.lock_digest.is_some() && d.refused.is_none());
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("package.json"), "{}").unwrap();
        let refused = dependency_plan_status(crate::image::deps::plan(t.path()));
        assert!(refused.refused.unwrap().contains("package-lock.json"));
    }
}
