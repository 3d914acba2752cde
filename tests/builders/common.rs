//! Fixtures shared by the builder tests: sample parameters, the variation
//! grid, and container accessors.
#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use skill_operator::controller::builders::{
    BuildNetPolParams, BuildParams, EnvGrant, IndexAddress, JobParams, NetPolParams, PackageDelivery, Peer, RunResources,
};

pub(crate) const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
pub(crate) const NAME: &str = "report-7";
pub(crate) const NS: &str = "team-a";
pub(crate) const RUN_IMAGE: &str =
    "registry.example.com/skills/pdf@sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945";
pub(crate) const OPERATOR_IMAGE: &str =
    "ghcr.io/example/skill-operator@sha256:9b2a6f0e1c7d4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a";
pub(crate) const ARTIFACT: &str = "http://10.96.12.34:8081";
pub(crate) const PROXY: &str = "http://10.96.40.2:3128";

/// Arguments full of shell metacharacters; each must stay one argv entry.
pub(crate) fn nasty_args() -> Vec<String> {
    [
        "; rm -rf / #",
        "$(id)",
        "`uname -a`",
        "a b  c",
        "'single'",
        "\"double\"",
        "|&<>*?[]{}!",
        "line1\nline2",
        "--",
        "-c",
        "",
        "ünïcödé",
        "$HOME ${PATH}",
        "\\",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub(crate) fn owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "skill-operator.dev/v1alpha1".into(),
        kind: "SkillJob".into(),
        name: name.into(),
        uid: uid.into(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// The plainest valid job: no grants, no egress, default resources.
pub(crate) fn params() -> JobParams {
    JobParams {
        skilljob_name: NAME.into(),
        namespace: NS.into(),
        skilljob_uid: UID.into(),
        owner: owner(NAME, UID),
        run_image: RUN_IMAGE.into(),
        operator_image: OPERATOR_IMAGE.into(),
        interpreter: "/usr/bin/python3".into(),
        script: "scripts/report.py".into(),
        args: vec!["--pages".into(), "3".into()],
        env: vec![],
        timeout_secs: 60,
        resources: RunResources::default(),
        artifact_endpoint: ARTIFACT.into(),
        service_account: "skill-runner".into(),
        ..Default::default()
    }
}

/// Everything switched on: env grants, egress proxy via host alias, custom
/// resources and ids, extra labels, nasty args, pull secret.
pub(crate) fn params_full() -> JobParams {
    JobParams {
        args: nasty_args(),
        env: vec![EnvGrant::from(("GITHUB_TOKEN", "gh-credentials", "token")), EnvGrant::from(("API_BASE", "api-config", "base.url"))],
        timeout_secs: 300,
        resources: RunResources { cpu: "2".into(), memory: "1Gi".into(), ephemeral_storage: "2Gi".into() },
        artifact_endpoint: "https://artifacts.skill-system:8443/v1".into(),
        egress_proxy: Some(PROXY.into()),
        host_aliases: BTreeMap::from([("artifacts.skill-system".into(), "10.96.12.34".into())]),
        run_as_user: 10001,
        run_as_group: 10002,
        labels: BTreeMap::from([("team".into(), "a".into())]),
        image_pull_secrets: vec!["registry-creds".into()],
        ..params()
    }
}

/// A 253-character DNS subdomain (the longest SkillJob name there is).
pub(crate) fn longest_name() -> String {
    format!("{}.{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61))
}

/// The variation grid: env grants × egress × timeouts × args × names (and
/// DNS/tag images folded in), 96 parameter sets, all valid.
pub(crate) fn grid() -> Vec<JobParams> {
    let envs: Vec<Vec<EnvGrant>> =
        vec![vec![], vec![EnvGrant::from(("OPENAI_API_KEY", "llm", "key")), EnvGrant::from(("DB_URL", "db", "url"))]];
    let timeouts = [1u32, 60, 299, skill_operator::controller::builders::job::MAX_TIMEOUT_SECS];
    let argss: Vec<Vec<String>> = vec![vec![], nasty_args(), (0..64).map(|i| format!("arg{i}")).collect()];
    let names = [NAME.to_string(), longest_name()];
    let mut out = Vec::new();
    for (ei, env) in envs.iter().enumerate() {
        for egress in [false, true] {
            for &timeout in &timeouts {
                for args in &argss {
                    for (ni, name) in names.iter().enumerate() {
                        let uid = format!("{:08x}-1111-4222-8333-{:012x}", out.len(), out.len() * 7919);
                        let mut p = JobParams {
                            skilljob_name: name.clone(),
                            skilljob_uid: uid.clone(),
                            owner: owner(name, &uid),
                            env: env.clone(),
                            timeout_secs: timeout,
                            args: args.clone(),
                            egress_proxy: egress.then(|| PROXY.to_string()),
                            allow_dns: egress && ei == 1,
                            ..params()
                        };
                        if ni == 1 {
                            p.run_image = "python:3.13-slim".into();
                        }
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}

pub(crate) fn pod(job: &Job) -> &PodSpec {
    job.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

/// Every container of a pod: init containers first, then regular ones.
pub(crate) fn all_containers(spec: &PodSpec) -> Vec<&Container> {
    spec.init_containers.iter().flatten().chain(spec.containers.iter()).collect()
}

pub(crate) fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    all_containers(spec).into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no container {name}"))
}

pub(crate) fn command(c: &Container) -> Vec<&str> {
    c.command.iter().flatten().map(String::as_str).collect()
}

/// The check ids (text before the first ':') of a list of violations.
pub(crate) fn ids(violations: &[String]) -> Vec<&str> {
    violations.iter().map(|v| v.split(':').next().unwrap()).collect()
}

pub(crate) fn artifact_peer() -> Peer {
    Peer::in_namespace("skill-system", BTreeMap::from([("app.kubernetes.io/name".into(), "skill-operator".into())]), 8081)
}

pub(crate) fn proxy_peer() -> Peer {
    Peer::in_namespace("skill-system", BTreeMap::from([("app.kubernetes.io/name".into(), "egress-proxy".into())]), 3128)
}

pub(crate) fn netpol_params() -> NetPolParams {
    NetPolParams { namespace: NS.into(), labels: BTreeMap::new(), artifact: artifact_peer(), egress_proxy: None, dns: None }
}

pub(crate) fn netpol_params_egress() -> NetPolParams {
    NetPolParams { egress_proxy: Some(proxy_peer()), ..netpol_params() }
}

// ------------------------------------------------------ prepared packages

pub(crate) const PREPARED_IMAGE: &str = "127.0.0.1:5000/prepared@sha256:1111111111111111111111111111111111111111111111111111111111111111";
pub(crate) const BASE_PINNED: &str = "127.0.0.1:5000/runtime@sha256:2222222222222222222222222222222222222222222222222222222222222222";
pub(crate) const PACKAGE: &str = "weather-1";
pub(crate) const PACKAGE_UID: &str = "99999999-8888-7777-6666-555555555555";
pub(crate) const BUILD: &str = "skillbuild-0a1b2c3d4e5f";
pub(crate) const BUILD_UID: &str = "build-0a1b2c3d4e5f60718293a4b5c6d7e8f9";

/// A run of a package prepared as one composed image.
pub(crate) fn params_prepared() -> JobParams {
    JobParams { run_image: PREPARED_IMAGE.into(), delivery: PackageDelivery::InImage { env: vec!["PYTHONPATH".into()] }, ..params() }
}

/// A run of a package prepared as an image volume on its base.
pub(crate) fn params_image_volume() -> JobParams {
    JobParams {
        run_image: BASE_PINNED.into(),
        delivery: PackageDelivery::ImageVolume {
            reference: PREPARED_IMAGE.into(),
            deps: true,
            env: vec![("PYTHONPATH".into(), "/deps/python".into())],
        },
        ..params()
    }
}

pub(crate) fn package_owner() -> OwnerReference {
    OwnerReference {
        api_version: "skill-operator.dev/v1alpha1".into(),
        kind: "SkillPackage".into(),
        name: PACKAGE.into(),
        uid: PACKAGE_UID.into(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// A dependency build from a pip index on the pod network's gateway.
pub(crate) fn build_params() -> BuildParams {
    BuildParams {
        package: PACKAGE.into(),
        name: BUILD.into(),
        build_uid: BUILD_UID.into(),
        namespace: "skill-system".into(),
        owner: package_owner(),
        base_image: BASE_PINNED.into(),
        operator_image: OPERATOR_IMAGE.into(),
        artifact_endpoint: ARTIFACT.into(),
        token_secret: format!("{BUILD}-token"),
        service_account: "skill-operator-build".into(),
        pip_index_url: Some("http://10.88.0.1:8999/simple".into()),
        ..Default::default()
    }
}

/// The same with an npm registry by name (a hosts entry) and a pull secret.
pub(crate) fn build_params_full() -> BuildParams {
    BuildParams {
        pip_index_url: Some("https://pypi.mirror.example/simple".into()),
        npm_registry: Some("https://npm.mirror.example/".into()),
        host_aliases: BTreeMap::from([
            ("pypi.mirror.example".into(), "10.20.0.5".into()),
            ("npm.mirror.example".into(), "10.20.0.6".into()),
        ]),
        image_pull_secrets: vec!["registry-creds".into()],
        ..build_params()
    }
}

pub(crate) fn build_netpol_params() -> BuildNetPolParams {
    BuildNetPolParams {
        name: BUILD.into(),
        namespace: "skill-system".into(),
        package: PACKAGE.into(),
        owner: OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: BUILD.into(),
            uid: "77777777-0000-0000-0000-000000000000".into(),
            controller: Some(true),
            block_owner_deletion: Some(false),
        },
        artifact: artifact_peer(),
        indexes: vec![IndexAddress { ip: "10.88.0.1".parse().unwrap(), port: 8999 }],
    }
}
