//! build_job: property checks over the variation grid, then one test per
//! rule of the pod shape, then JobParams::validate.

#[path = "builders/common.rs"]
mod common;

use std::collections::BTreeMap;

use common::*;
use k8s_openapi::api::core::v1::Container;
use skill_operator::controller::builders::job::*;
use skill_operator::controller::builders::{
    build_job, hardening_violations, is_dns1123_label, is_label_value, job_name, pod_selector_labels, restricted_template_violations,
    restricted_violations, EnvGrant, Error, JobParams, LABEL_MANAGED_BY, LABEL_SKILLJOB, LABEL_SKILLJOB_UID,
};

fn q(c: &Container, kind: &str, name: &str) -> String {
    let r = c.resources.as_ref().unwrap();
    let map = if kind == "requests" { r.requests.as_ref() } else { r.limits.as_ref() };
    map.unwrap()[name].0.clone()
}

// ---------------------------------------------------------------- grid

#[test]
fn grid_params_are_valid() {
    let grid = grid();
    assert_eq!(grid.len(), 96);
    for p in &grid {
        p.validate().unwrap_or_else(|e| panic!("{}: {e}", p.skilljob_uid));
    }
}

#[test]
fn grid_pods_have_no_restricted_violations() {
    for p in grid() {
        let job = build_job(&p);
        let v = restricted_violations(pod(&job));
        assert!(v.is_empty(), "{}: {v:#?}", p.skilljob_uid);
        let v = restricted_template_violations(&job.spec.as_ref().unwrap().template);
        assert!(v.is_empty(), "{}: {v:#?}", p.skilljob_uid);
    }
}

#[test]
fn grid_pods_have_no_hardening_violations() {
    for p in grid() {
        let v = hardening_violations(pod(&build_job(&p)));
        assert!(v.is_empty(), "{}: {v:#?}", p.skilljob_uid);
    }
}

#[test]
fn grid_run_container_has_no_token_and_no_secret_volume() {
    for p in grid() {
        let job = build_job(&p);
        let spec = pod(&job);
        let secret_volumes: Vec<&str> =
            spec.volumes.iter().flatten().filter(|v| v.secret.is_some() || v.projected.is_some()).map(|v| v.name.as_str()).collect();
        assert_eq!(secret_volumes, [VOL_TOKEN]);
        let run = container(spec, CONTAINER_RUN);
        for m in run.volume_mounts.iter().flatten() {
            assert!(!secret_volumes.contains(&m.name.as_str()), "run mounts {}", m.name);
            assert!(!m.mount_path.starts_with(TOKEN_DIR), "run mounts {}", m.mount_path);
            assert!(!m.mount_path.starts_with("/var/run/secrets"), "run mounts {}", m.mount_path);
        }
        assert!(run.env_from.is_none(), "envFrom would import whole Secrets/ConfigMaps");
        assert!(run.volume_devices.is_none());
        assert_eq!(spec.automount_service_account_token, Some(false));
    }
}

#[test]
fn grid_secrets_reach_run_only_through_secret_key_ref() {
    for p in grid() {
        let job = build_job(&p);
        let run = container(pod(&job), CONTAINER_RUN);
        let env = run.env.as_ref().unwrap();
        let fixed = [
            "HOME",
            "TMPDIR",
            "PATH",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "PIP_PROXY",
            "npm_config_https_proxy",
            "npm_config_proxy",
            "NO_PROXY",
            "no_proxy",
            "NODE_USE_ENV_PROXY",
        ];
        for var in env {
            if fixed.contains(&var.name.as_str()) {
                assert!(var.value_from.is_none() && var.value.is_some(), "{}", var.name);
            } else {
                let from = var.value_from.as_ref().unwrap_or_else(|| panic!("{} has a literal value", var.name));
                let r = from.secret_key_ref.as_ref().expect("secretKeyRef");
                assert_eq!(r.optional, Some(false));
                assert!(var.value.is_none());
                assert!(from.config_map_key_ref.is_none() && from.field_ref.is_none());
                assert!(from.resource_field_ref.is_none() && from.file_key_ref.is_none());
            }
        }
        let granted: Vec<&str> = env.iter().filter(|v| v.value_from.is_some()).map(|v| v.name.as_str()).collect();
        let expected: Vec<&str> = p.env.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(granted, expected);
    }
}

#[test]
fn grid_args_are_separate_argv_entries_never_a_shell() {
    for p in grid() {
        let job = build_job(&p);
        let run = container(pod(&job), CONTAINER_RUN);
        assert!(run.args.is_none(), "everything is in command, so the image's CMD cannot interfere");
        let cmd = command(run);
        let sep = cmd.iter().position(|a| *a == "--").expect("-- separator");
        let mut tail = vec![p.interpreter.clone(), format!("/package/{}", p.script)];
        tail.extend(p.args.iter().cloned());
        assert_eq!(cmd[sep + 1..], tail.iter().map(String::as_str).collect::<Vec<_>>()[..]);
        for c in all_containers(pod(&job)) {
            let cmd = command(c);
            assert!(!["sh", "/bin/sh", "bash", "/bin/bash"].contains(&cmd[0]), "{} runs a shell", c.name);
            assert!(!cmd[..cmd.iter().position(|a| *a == "--").unwrap_or(cmd.len())].contains(&"-c"));
        }
    }
}

#[test]
fn grid_names_and_labels_are_valid() {
    for p in grid() {
        let job = build_job(&p);
        let name = job.metadata.name.as_deref().unwrap();
        assert!(is_dns1123_label(name) && name.len() <= 63, "{name}");
        assert_eq!(name, job_name(&p.skilljob_uid));
        for labels in
            [job.metadata.labels.as_ref().unwrap(), job.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.as_ref().unwrap()]
        {
            for (k, v) in labels {
                assert!(is_label_value(v), "{k}={v}");
            }
            for (k, v) in pod_selector_labels(&p.skilljob_uid) {
                assert_eq!(labels.get(&k), Some(&v));
            }
        }
    }
}

#[test]
fn grid_deadline_is_timeout_plus_slack() {
    for p in grid() {
        let job = build_job(&p);
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.active_deadline_seconds, Some(i64::from(p.timeout_secs) + DEADLINE_SLACK_SECS));
        let run = container(pod(&job), CONTAINER_RUN);
        let cmd = command(run);
        let i = cmd.iter().position(|a| *a == "--timeout").unwrap();
        assert_eq!(cmd[i + 1], p.timeout_secs.to_string());
    }
}

// ------------------------------------------------------ every container

#[test]
fn every_container_is_locked_down() {
    for p in [params(), params_full()] {
        let job = build_job(&p);
        for c in all_containers(pod(&job)) {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
            assert_eq!(sc.run_as_user, Some(p.run_as_user), "{}", c.name);
            assert_eq!(sc.run_as_group, Some(p.run_as_group), "{}", c.name);
            assert!(sc.run_as_user.unwrap() > 0 && sc.run_as_group.unwrap() > 0);
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            assert_eq!(sc.privileged, Some(false), "{}", c.name);
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
            let caps = sc.capabilities.as_ref().unwrap();
            assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]), "{}", c.name);
            assert!(caps.add.is_none(), "{}", c.name);
            assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault", "{}", c.name);
            assert!(sc.proc_mount.is_none() && sc.se_linux_options.is_none() && sc.windows_options.is_none());
            assert!(c.ports.is_none() && c.liveness_probe.is_none() && c.lifecycle.is_none());
        }
    }
}

#[test]
fn every_container_has_requests_equal_limits() {
    let job = build_job(&params_full());
    for c in all_containers(pod(&job)) {
        let r = c.resources.as_ref().unwrap();
        assert_eq!(r.requests, r.limits, "{}", c.name);
        let keys: Vec<&str> = r.limits.as_ref().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["cpu", "ephemeral-storage", "memory"], "{}", c.name);
    }
}

#[test]
fn run_resources_default_to_1cpu_512mi_1gi() {
    let job = build_job(&params());
    let run = container(pod(&job), CONTAINER_RUN);
    assert_eq!(q(run, "limits", "cpu"), "1");
    assert_eq!(q(run, "limits", "memory"), "512Mi");
    assert_eq!(q(run, "limits", "ephemeral-storage"), "1Gi");
}

#[test]
fn run_resources_follow_params() {
    let job = build_job(&params_full());
    let run = container(pod(&job), CONTAINER_RUN);
    assert_eq!(q(run, "requests", "cpu"), "2");
    assert_eq!(q(run, "requests", "memory"), "1Gi");
    assert_eq!(q(run, "requests", "ephemeral-storage"), "2Gi");
}

#[test]
fn helper_resources_are_small_and_fixed() {
    for p in [params(), params_full()] {
        let job = build_job(&p);
        for name in [CONTAINER_FETCH, CONTAINER_UPLOAD] {
            let c = container(pod(&job), name);
            assert_eq!(q(c, "limits", "cpu"), HELPER_CPU);
            assert_eq!(q(c, "limits", "memory"), HELPER_MEMORY);
            assert_eq!(q(c, "limits", "ephemeral-storage"), HELPER_EPHEMERAL);
        }
    }
}

#[test]
fn image_pull_policy_depends_on_digest_pinning() {
    let job = build_job(&params());
    for c in all_containers(pod(&job)) {
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"), "{}", c.name);
    }
    let job = build_job(&JobParams { run_image: "python:3.13-slim".into(), ..params() });
    assert_eq!(container(pod(&job), CONTAINER_RUN).image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(container(pod(&job), CONTAINER_FETCH).image_pull_policy.as_deref(), Some("IfNotPresent"));
}

// ---------------------------------------------------------------- fetch

#[test]
fn fetch_is_the_first_init_container_with_the_operator_image() {
    let p = params();
    let job = build_job(&p);
    let init = pod(&job).init_containers.as_ref().unwrap();
    assert_eq!(init[0].name, CONTAINER_FETCH);
    assert_eq!(init[0].image.as_deref(), Some(OPERATOR_IMAGE));
    assert!(init[0].restart_policy.is_none(), "fetch must run to completion, not as a sidecar");
    assert_eq!(
        command(&init[0]),
        [
            "skill-operator",
            "fetch",
            "--endpoint",
            ARTIFACT,
            "--namespace",
            "team-a",
            "--job",
            UID,
            "--package",
            "/package",
            "--work",
            "/work",
            "--token-file",
            "/var/run/skill-operator/token",
            "--tools",
            "/tools",
        ]
    );
}

#[test]
fn fetch_mounts_package_work_tools_rw_and_token_ro() {
    let job = build_job(&params());
    let fetch = container(pod(&job), CONTAINER_FETCH);
    let mounts: Vec<(&str, &str, Option<bool>)> =
        fetch.volume_mounts.iter().flatten().map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only)).collect();
    assert_eq!(
        mounts,
        [
            ("package", "/package", Some(false)),
            ("work", "/work", Some(false)),
            ("tools", "/tools", Some(false)),
            ("token", "/var/run/skill-operator", Some(true)),
        ]
    );
}

// --------------------------------------------------------------- upload

#[test]
fn upload_is_a_native_sidecar_after_fetch() {
    let job = build_job(&params());
    let init = pod(&job).init_containers.as_ref().unwrap();
    assert_eq!(init.len(), 2);
    assert_eq!(init[1].name, CONTAINER_UPLOAD);
    assert_eq!(init[1].restart_policy.as_deref(), Some("Always"));
    assert_eq!(init[1].image.as_deref(), Some(OPERATOR_IMAGE));
    assert_eq!(
        command(&init[1]),
        [
            "skill-operator",
            "upload",
            "--endpoint",
            ARTIFACT,
            "--namespace",
            "team-a",
            "--job",
            UID,
            "--work",
            "/work",
            "--result",
            "/result/result.json",
            "--token-file",
            "/var/run/skill-operator/token",
        ]
    );
}

#[test]
fn upload_reads_work_and_token_and_alone_writes_the_result() {
    let job = build_job(&params());
    let upload = container(pod(&job), CONTAINER_UPLOAD);
    let mounts: Vec<(&str, &str, Option<bool>)> =
        upload.volume_mounts.iter().flatten().map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only)).collect();
    assert_eq!(
        mounts,
        [("work", "/work", Some(true)), ("result", "/result", Some(false)), ("token", "/var/run/skill-operator", Some(true))]
    );
}

#[test]
fn upload_reports_through_a_termination_message_file() {
    let job = build_job(&params());
    let upload = container(pod(&job), CONTAINER_UPLOAD);
    assert_eq!(upload.termination_message_path.as_deref(), Some("/dev/termination-log"));
    // Its error line is in the file; a crash before it writes one leaves the log's tail.
    assert_eq!(upload.termination_message_policy.as_deref(), Some("FallbackToLogsOnError"));
    let fetch = container(pod(&job), "fetch");
    assert_eq!(fetch.termination_message_policy.as_deref(), Some("FallbackToLogsOnError"));
}

// ------------------------------------------------------------------ run

#[test]
fn run_is_the_only_main_container_and_uses_the_launcher() {
    let p = params();
    let job = build_job(&p);
    let spec = pod(&job);
    assert_eq!(spec.containers.len(), 1);
    let run = &spec.containers[0];
    assert_eq!(run.name, CONTAINER_RUN);
    assert_eq!(run.image.as_deref(), Some(RUN_IMAGE));
    assert_eq!(
        command(run),
        [
            "/tools/skill-operator",
            "launch",
            "--timeout",
            "60",
            "--allow-env",
            "HOME",
            "--allow-env",
            "TMPDIR",
            "--allow-env",
            "PATH",
            "--",
            "/usr/bin/python3",
            "/package/scripts/report.py",
            "--pages",
            "3",
        ]
    );
}

#[test]
fn run_allow_env_lists_exactly_the_container_env() {
    let job = build_job(&params_full());
    let run = container(pod(&job), CONTAINER_RUN);
    let cmd = command(run);
    let sep = cmd.iter().position(|a| *a == "--").unwrap();
    let allowed: Vec<&str> = cmd[..sep].windows(2).filter(|w| w[0] == "--allow-env").map(|w| w[1]).collect();
    let env: Vec<&str> = run.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(allowed, env);
    assert_eq!(
        env,
        [
            "HOME",
            "TMPDIR",
            "PATH",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "PIP_PROXY",
            "npm_config_https_proxy",
            "npm_config_proxy",
            "NO_PROXY",
            "no_proxy",
            "NODE_USE_ENV_PROXY",
            "GITHUB_TOKEN",
            "API_BASE"
        ]
    );
}

#[test]
fn egress_gives_every_proxy_variable_and_bypasses_nothing() {
    let job = build_job(&params_full());
    let run = container(pod(&job), CONTAINER_RUN);
    let value = |name: &str| run.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.clone());
    for name in skill_operator::egress::PROXY_URL_ENV {
        assert_eq!(value(name).as_deref(), Some(PROXY), "{name}");
    }
    assert_eq!(value("NO_PROXY").as_deref(), Some(""));
    assert_eq!(value("no_proxy").as_deref(), Some(""));
    assert_eq!(value("NODE_USE_ENV_PROXY").as_deref(), Some("1"));
    // Without egress: none of them, and no egress label on the pod.
    let plain = build_job(&params());
    let run = container(pod(&plain), CONTAINER_RUN);
    for e in run.env.iter().flatten() {
        assert!(!e.name.to_ascii_lowercase().contains("proxy") && e.name != "NODE_USE_ENV_PROXY", "{}", e.name);
    }
    let labels = plain.spec.unwrap().template.metadata.unwrap().labels.unwrap();
    assert!(!labels.contains_key(skill_operator::controller::builders::LABEL_EGRESS));
}

#[test]
fn run_mounts_package_and_tools_read_only() {
    let job = build_job(&params());
    let run = container(pod(&job), CONTAINER_RUN);
    let mounts: Vec<(&str, &str, Option<bool>)> =
        run.volume_mounts.iter().flatten().map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only)).collect();
    assert_eq!(
        mounts,
        [
            ("package", "/package", Some(true)),
            ("work", "/work", Some(false)),
            ("tmp", "/tmp", Some(false)),
            ("tools", "/tools", Some(true)),
        ]
    );
    assert_eq!(run.working_dir.as_deref(), Some("/work"));
}

#[test]
fn run_env_is_home_tmpdir_path_plus_grants() {
    let p = JobParams { env: vec![EnvGrant::from(("GITHUB_TOKEN", "gh", "token"))], ..params() };
    let job = build_job(&p);
    let env = container(pod(&job), CONTAINER_RUN).env.clone().unwrap();
    let plain: BTreeMap<&str, &str> = env.iter().filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?))).collect();
    assert_eq!(plain, BTreeMap::from([("HOME", "/tmp"), ("TMPDIR", "/tmp"), ("PATH", RUN_PATH)]));
    let grant = env.iter().find(|e| e.name == "GITHUB_TOKEN").unwrap();
    let r = grant.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((r.name.as_str(), r.key.as_str()), ("gh", "token"));
}

#[test]
fn proxy_env_only_with_egress() {
    let job = build_job(&params());
    let env = container(pod(&job), CONTAINER_RUN).env.clone().unwrap();
    assert!(!env.iter().any(|e| e.name.to_ascii_uppercase().contains("PROXY")));
    let job = build_job(&params_full());
    let env = container(pod(&job), CONTAINER_RUN).env.clone().unwrap();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        let var = env.iter().find(|e| e.name == name).unwrap();
        assert_eq!(var.value.as_deref(), Some(PROXY));
    }
}

#[test]
fn fetch_and_upload_get_no_env() {
    let job = build_job(&params_full());
    for name in [CONTAINER_FETCH, CONTAINER_UPLOAD] {
        let c = container(pod(&job), name);
        assert!(c.env.is_none() && c.env_from.is_none(), "{name}");
    }
}

// ------------------------------------------------------------------ pod

#[test]
fn pod_has_no_service_account_token_and_no_service_links() {
    let job = build_job(&params());
    let spec = pod(&job);
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.enable_service_links, Some(false));
    assert_eq!(spec.service_account_name.as_deref(), Some("skill-runner"));
    assert!(spec.service_account.is_none());
}

#[test]
fn pod_never_restarts_and_shares_nothing_with_the_host() {
    let job = build_job(&params());
    let spec = pod(&job);
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!((spec.host_network, spec.host_pid, spec.host_ipc), (Some(false), Some(false), Some(false)));
    assert_eq!(spec.share_process_namespace, Some(false));
    assert!(spec.host_users.is_none());
    assert!(spec.volumes.iter().flatten().all(|v| v.host_path.is_none()));
    assert_eq!(spec.os.as_ref().unwrap().name, "linux");
    assert!(spec.ephemeral_containers.is_none());
}

#[test]
fn pod_security_context_is_non_root_with_runtime_default_seccomp() {
    let p = params_full();
    let job = build_job(&p);
    let sc = pod(&job).security_context.clone().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, Some(10001));
    assert_eq!(sc.run_as_group, Some(10002));
    assert_eq!(sc.fs_group, Some(10002));
    assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    assert!(sc.sysctls.is_none() && sc.supplemental_groups.is_none());
}

#[test]
fn pod_termination_grace_is_the_upload_budget() {
    let job = build_job(&params());
    assert_eq!(pod(&job).termination_grace_period_seconds, Some(TERMINATION_GRACE_SECS));
    assert_eq!(TERMINATION_GRACE_SECS, 30);
}

#[test]
fn volumes_are_size_limited_empty_dirs_plus_the_token() {
    let job = build_job(&params_full());
    let spec = pod(&job);
    let sizes: Vec<(&str, Option<&str>)> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()).map(|q| q.0.as_str())))
        .collect();
    assert_eq!(
        sizes,
        [
            ("package", Some("256Mi")),
            ("work", Some("2Gi")),
            ("tmp", Some("64Mi")),
            ("result", Some("16Mi")),
            ("tools", Some("128Mi")),
            ("token", None),
        ]
    );
    for v in spec.volumes.iter().flatten().filter(|v| v.empty_dir.is_some()) {
        assert!(v.empty_dir.as_ref().unwrap().medium.is_none(), "{}: disk-backed, counted as ephemeral storage", v.name);
    }
}

#[test]
fn token_volume_projects_the_pods_own_token_for_this_jobs_artifacts_alone() {
    let job = build_job(&params());
    let token = pod(&job).volumes.iter().flatten().find(|v| v.name == VOL_TOKEN).unwrap();
    assert!(token.secret.is_none(), "no per-job Secret");
    let projected = token.projected.as_ref().unwrap();
    let [source] = projected.sources.as_deref().unwrap() else { panic!("one source: {projected:?}") };
    let t = source.service_account_token.as_ref().unwrap();
    assert_eq!(t.audience.as_deref(), Some(skill_operator::artifacts::pod_token_audience(NS, UID).as_str()));
    assert_eq!(t.path, "token");
    assert_eq!(t.expiration_seconds, Some(skill_operator::artifacts::POD_TOKEN_EXPIRATION_SECS));
    assert_eq!(projected.default_mode, Some(0o440));
    // The API server would take an unnamed audience as its own: the hardening check refuses it.
    let mut spec = pod(&job).clone();
    for v in spec.volumes.iter_mut().flatten() {
        for src in v.projected.iter_mut().flat_map(|p| p.sources.iter_mut().flatten()) {
            if let Some(t) = src.service_account_token.as_mut() {
                t.audience = None;
            }
        }
    }
    assert!(hardening_violations(&spec).iter().any(|v| v.starts_with("serviceAccountToken")), "{:?}", hardening_violations(&spec));
}

#[test]
fn no_dns_by_default_fast_failing_resolver() {
    let job = build_job(&params());
    let spec = pod(&job);
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    assert_eq!(spec.dns_config.as_ref().unwrap().nameservers.as_deref(), Some(&["127.0.0.1".to_string()][..]));
}

#[test]
fn cluster_dns_only_when_allowed() {
    let job = build_job(&JobParams { allow_dns: true, egress_proxy: Some(PROXY.into()), ..params() });
    let spec = pod(&job);
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
    assert!(spec.dns_config.is_none());
}

#[test]
fn host_aliases_name_endpoints_without_dns() {
    let job = build_job(&params_full());
    let aliases = pod(&job).host_aliases.clone().unwrap();
    assert_eq!(aliases.len(), 1);
    assert_eq!(aliases[0].ip, "10.96.12.34");
    assert_eq!(aliases[0].hostnames.as_deref(), Some(&["artifacts.skill-system".to_string()][..]));
    assert!(pod(&build_job(&params())).host_aliases.is_none());
}

#[test]
fn image_pull_secrets_are_passed_through() {
    let job = build_job(&params_full());
    let secrets = pod(&job).image_pull_secrets.clone().unwrap();
    assert_eq!(secrets[0].name, "registry-creds");
    assert!(pod(&build_job(&params())).image_pull_secrets.is_none());
}

// ------------------------------------------------------------------ job

#[test]
fn job_never_retries() {
    let spec = build_job(&params()).spec.unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!((spec.completions, spec.parallelism), (Some(1), Some(1)));
    assert!(spec.selector.is_none() && spec.manual_selector.is_none(), "the Job controller generates the selector");
}

#[test]
fn job_pod_failure_policy_ignores_disruptions_and_fails_on_run_exit_codes() {
    let spec = build_job(&params()).spec.unwrap();
    let rules = spec.pod_failure_policy.unwrap().rules;
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].action, "Ignore");
    let cond = &rules[0].on_pod_conditions.as_ref().unwrap()[0];
    assert_eq!((cond.type_.as_str(), cond.status.as_deref()), ("DisruptionTarget", Some("True")));
    assert!(rules[0].on_exit_codes.is_none());
    assert_eq!(rules[1].action, "FailJob");
    let codes = rules[1].on_exit_codes.as_ref().unwrap();
    assert_eq!(codes.container_name.as_deref(), Some("run"));
    assert_eq!(codes.operator, "NotIn");
    assert_eq!(codes.values, [0]);
    assert!(rules[1].on_pod_conditions.is_none());
    // podFailurePolicy requires restartPolicy Never.
    assert_eq!(spec.template.spec.unwrap().restart_policy.as_deref(), Some("Never"));
}

#[test]
fn job_deadline_and_ttl() {
    for t in [1u32, 300] {
        let spec = build_job(&JobParams { timeout_secs: t, ..params() }).spec.unwrap();
        assert_eq!(spec.active_deadline_seconds, Some(i64::from(t) + 180));
        assert_eq!(spec.ttl_seconds_after_finished, Some(3600));
    }
}

#[test]
fn job_name_derives_from_the_uid() {
    let job = build_job(&params());
    assert_eq!(job.metadata.name.as_deref(), Some("skilljob-0f1e2d3c4b5a"));
    assert_eq!(job.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(job_name("0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0"), "skilljob-0f1e2d3c4b5a");
}

#[test]
fn job_is_owned_by_the_skilljob_as_controller() {
    let job = build_job(&params());
    let refs = job.metadata.owner_references.unwrap();
    assert_eq!(refs.len(), 1);
    let r = &refs[0];
    assert_eq!((r.kind.as_str(), r.name.as_str(), r.uid.as_str()), ("SkillJob", NAME, UID));
    assert_eq!(r.controller, Some(true));
    assert_eq!(r.block_owner_deletion, Some(true));
}

#[test]
fn job_and_pod_labels() {
    let job = build_job(&params_full());
    let expected = BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), "skill-operator".to_string()),
        (LABEL_SKILLJOB.to_string(), NAME.to_string()),
        (LABEL_SKILLJOB_UID.to_string(), UID.to_string()),
        ("team".to_string(), "a".to_string()),
    ]);
    assert_eq!(job.metadata.labels.as_ref(), Some(&expected));
    let tmeta = job.spec.unwrap().template.metadata.unwrap();
    // The pods of a run with egress also say so (the controller watches them for their address).
    let mut pod_expected = expected.clone();
    pod_expected.insert(skill_operator::controller::builders::LABEL_EGRESS.to_string(), "true".to_string());
    assert_eq!(tmeta.labels.as_ref(), Some(&pod_expected));
    assert_eq!(tmeta.annotations.unwrap()["kubectl.kubernetes.io/default-container"], "run");
}

#[test]
fn long_skilljob_name_is_shortened_in_its_label_only() {
    let name = longest_name();
    let p = JobParams { skilljob_name: name.clone(), owner: owner(&name, UID), ..params() };
    p.validate().unwrap();
    let job = build_job(&p);
    let label = &job.metadata.labels.as_ref().unwrap()[LABEL_SKILLJOB];
    assert!(label.len() <= 63 && is_label_value(label));
    assert!(name.starts_with(label.as_str()));
    assert_eq!(job.metadata.owner_references.unwrap()[0].name, name);
}

// ------------------------------------------------------------- validate

fn err(p: JobParams) -> Error {
    p.validate().expect_err("should be refused")
}

#[test]
fn validate_accepts_the_samples() {
    params().validate().unwrap();
    params_full().validate().unwrap();
}

#[test]
fn validate_refuses_escaping_scripts() {
    for script in ["/etc/passwd", "../x.py", "scripts/../../x", "", "a//b"] {
        assert!(matches!(err(JobParams { script: script.into(), ..params() }), Error::InvalidScript(_)), "{script}");
    }
}

#[test]
fn validate_refuses_relative_interpreters() {
    assert!(matches!(err(JobParams { interpreter: "python3".into(), ..params() }), Error::InvalidInterpreter(_)));
}

#[test]
fn validate_refuses_bad_timeouts() {
    for t in [0, MAX_TIMEOUT_SECS + 1] {
        assert_eq!(err(JobParams { timeout_secs: t, ..params() }), Error::InvalidTimeout(t));
    }
}

#[test]
fn validate_refuses_too_many_or_too_big_args() {
    let many: Vec<String> = (0..=MAX_ARGS).map(|i| i.to_string()).collect();
    assert!(matches!(err(JobParams { args: many, ..params() }), Error::InvalidArgs(_)));
    assert!(matches!(err(JobParams { args: vec!["x".repeat(MAX_ARG_BYTES + 1)], ..params() }), Error::InvalidArgs(_)));
    assert!(matches!(err(JobParams { args: vec!["a\0b".into()], ..params() }), Error::InvalidArgs(_)));
}

#[test]
fn validate_refuses_reserved_duplicate_and_malformed_env() {
    for name in
        ["PATH", "HOME", "LD_PRELOAD", "NODE_OPTIONS", "HTTPS_PROXY", "KUBERNETES_SERVICE_HOST", "SKILL_OPERATOR_X", "1X", "A-B", ""]
    {
        let p = JobParams { env: vec![EnvGrant::from((name, "s", "k"))], ..params() };
        assert!(matches!(err(p), Error::InvalidEnv { .. }), "{name}");
    }
    let dup = JobParams { env: vec![EnvGrant::from(("A", "s", "k")), EnvGrant::from(("A", "t", "k"))], ..params() };
    assert!(matches!(err(dup), Error::InvalidEnv { problem: "is granted twice", .. }));
    let bad_secret = JobParams { env: vec![EnvGrant::from(("A", "Bad_Secret", "k"))], ..params() };
    assert!(matches!(err(bad_secret), Error::InvalidEnv { .. }));
}

#[test]
fn validate_refuses_root_ids() {
    assert!(matches!(err(JobParams { run_as_user: 0, ..params() }), Error::RootId { field: "run_as_user", .. }));
    assert!(matches!(err(JobParams { run_as_group: 0, ..params() }), Error::RootId { field: "run_as_group", .. }));
}

#[test]
fn validate_refuses_bad_quantities() {
    for (cpu, mem, eph) in [("0", "1Gi", "1Gi"), ("1", "lots", "1Gi"), ("1", "1Gi", "-1Gi")] {
        let p = JobParams { resources: RunResources { cpu: cpu.into(), memory: mem.into(), ephemeral_storage: eph.into() }, ..params() };
        assert!(matches!(err(p), Error::InvalidQuantity { .. }), "{cpu} {mem} {eph}");
    }
}

#[test]
fn validate_refuses_endpoints_that_need_dns() {
    let p = JobParams { artifact_endpoint: "http://skill-operator.skill-system.svc:8081".into(), ..params() };
    assert!(matches!(err(p.clone()), Error::NeedsDns { field: "artifact_endpoint", .. }));
    let aliased = JobParams { host_aliases: BTreeMap::from([("skill-operator.skill-system.svc".into(), "10.96.0.9".into())]), ..p.clone() };
    aliased.validate().unwrap();
    JobParams { allow_dns: true, ..p }.validate().unwrap();
    let proxy = JobParams { egress_proxy: Some("http://egress-proxy:3128".into()), ..params() };
    assert!(matches!(err(proxy), Error::NeedsDns { field: "egress_proxy", .. }));
    assert!(matches!(err(JobParams { artifact_endpoint: "ftp://10.0.0.1".into(), ..params() }), Error::InvalidUrl { .. }));
}

#[test]
fn validate_refuses_a_foreign_owner() {
    let p = JobParams { owner: owner(NAME, "ffffffff-ffff-4fff-8fff-ffffffffffff"), ..params() };
    assert!(matches!(err(p), Error::OwnerMismatch { .. }));
    let mut o = owner(NAME, UID);
    o.kind = "Pod".into();
    assert!(matches!(err(JobParams { owner: o, ..params() }), Error::OwnerMismatch { .. }));
}

#[test]
fn validate_refuses_reserved_or_malformed_labels() {
    let reserved = JobParams { labels: BTreeMap::from([(LABEL_SKILLJOB_UID.into(), "x".into())]), ..params() };
    assert!(matches!(err(reserved), Error::InvalidLabel { .. }));
    let bad = JobParams { labels: BTreeMap::from([("ok".into(), "-bad-".into())]), ..params() };
    assert!(matches!(err(bad), Error::InvalidLabel { .. }));
}

#[test]
fn validate_refuses_bad_names_and_uids() {
    assert!(matches!(err(JobParams { namespace: "Team_A".into(), ..params() }), Error::InvalidName { .. }));
    assert!(matches!(err(JobParams { service_account: "".into(), ..params() }), Error::Missing { .. }));
    let p = JobParams { skilljob_uid: "not-a-uid".into(), owner: owner(NAME, "not-a-uid"), ..params() };
    assert!(matches!(err(p), Error::InvalidUid(_)));
    assert!(matches!(err(JobParams { run_image: "".into(), ..params() }), Error::InvalidImage { .. }));
    assert!(matches!(err(JobParams { operator_image: "a b".into(), ..params() }), Error::InvalidImage { .. }));
}

/// The operator image's pull policy: the operator's own when given (an
/// image loaded onto the nodes is never pulled), else by its reference;
/// anything but the kubelet's three policies is refused.
#[test]
fn the_operator_images_pull_policy_is_the_operators_own_and_only_a_kubelet_policy() {
    let policies = |p: &JobParams| -> Vec<(String, Option<String>)> {
        let job = build_job(p);
        let spec = pod(&job);
        spec.init_containers
            .iter()
            .flatten()
            .filter(|c| c.image.as_deref() == Some(p.operator_image.as_str()))
            .map(|c| (c.name.clone(), c.image_pull_policy.clone()))
            .collect()
    };
    let pinned = policies(&params());
    assert!(!pinned.is_empty() && pinned.iter().all(|(_, p)| p.as_deref() == Some("IfNotPresent")), "{pinned:?}");
    let tagged = JobParams { operator_image: "ghcr.io/skill-operator/skill-operator:0.1.0-local.0123456789ab".into(), ..params() };
    assert!(policies(&tagged).iter().all(|(_, p)| p.as_deref() == Some("Always")), "a tag is pulled again by default");
    let loaded = JobParams { operator_pull_policy: Some("Never".into()), ..tagged };
    let never = policies(&loaded);
    assert!(!never.is_empty() && never.iter().all(|(_, p)| p.as_deref() == Some("Never")), "{never:?}");
    for bad in ["Sometimes", "never", "", "Never\n"] {
        let e = err(JobParams { operator_pull_policy: Some(bad.into()), ..params() });
        assert!(matches!(e, Error::InvalidImage { field: "operator_pull_policy", .. }), "{bad:?}: {e}");
    }
}

#[test]
fn validate_error_messages_say_what_to_fix() {
    let msg = err(JobParams { artifact_endpoint: "http://svc:80".into(), ..params() }).to_string();
    assert!(msg.contains("host_aliases") && msg.contains("ClusterIP"), "{msg}");
}

// ---------------------------------------------------------------- staged package

const STAGED: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn a_namespace_staged_package_is_what_fetch_asks_for_and_what_the_job_names() {
    let p = JobParams { staged_package: Some(STAGED.into()), ..params() };
    p.validate().unwrap();
    let job = build_job(&p);
    let fetch = container(pod(&job), "fetch");
    let argv: Vec<&str> = fetch.command.iter().chain(fetch.args.iter()).flatten().map(String::as_str).collect();
    assert!(argv.windows(2).any(|w| w == ["--staged-package", STAGED]), "{argv:?}");
    assert_eq!(job.metadata.annotations.as_ref().unwrap()[ANNOTATION_PACKAGE_DIGEST], STAGED);
    // The run container never gets it: only fetch talks to the endpoint.
    let run = container(pod(&job), "run");
    assert!(!run.command.iter().chain(run.args.iter()).flatten().any(|a| a.contains(STAGED)));
    // Without one, the job's own copy: no flag, no annotation.
    let own = build_job(&params());
    assert!(own.metadata.annotations.is_none());
    let fetch = container(pod(&own), "fetch");
    assert!(!fetch.command.iter().flatten().any(|a| a == "--staged-package"));
}

#[test]
fn a_staged_package_must_be_a_sha256_digest_of_a_fetched_run() {
    for bad in [
        "sha256:abc",
        "sha512:0123",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "",
        STAGED.to_uppercase().as_str(),
    ] {
        let err = JobParams { staged_package: Some(bad.into()), ..params() }.validate().unwrap_err();
        assert!(matches!(err, Error::InvalidStagedPackage { .. }), "{bad:?}: {err}");
        assert!(err.to_string().contains("sha256:<64 lowercase hex>"), "{err}");
    }
    let err = JobParams { staged_package: Some(STAGED.into()), ..params_prepared() }.validate().unwrap_err();
    assert!(matches!(err, Error::InvalidStagedPackage { .. }), "{err}");
    assert!(err.to_string().contains("prepared image holds its package"), "{err}");
}
