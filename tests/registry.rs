//! `oci` against a real registry (`/usr/bin/docker-registry`, distribution
//! v2.8) started per test on a loopback port.

#[path = "oci/common.rs"]
mod common;

use std::collections::BTreeMap;

use common::{skill_dir, TestRegistry};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageIndex, OciImageManifest, Platform};
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};
use skill_operator::core::package::{self, Limits, PackageError};
use skill_operator::oci::{
    ArtifactFormat, OciError, OciLimits, Registry, RegistryOptions, SkillConfig, JOB_FILES_ARTIFACT_TYPE, SKILL_ARTIFACT_TYPE,
    SKILL_CONFIG_MEDIA_TYPE, SKILL_LAYER_MEDIA_TYPE,
};

fn digest_of(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

fn build(name: &str) -> (Vec<u8>, SkillConfig) {
    let d = skill_dir(name);
    let pkg = package::build_from_dir(d.path()).unwrap();
    let cfg = SkillConfig::for_package(&pkg, name, "a test skill", Some("1.0.0".into())).unwrap();
    (pkg, cfg)
}

async fn raw_manifest(reg: &TestRegistry, repo: &str, reference: &str) -> serde_json::Value {
    let url = format!("http://{}/v2/{repo}/manifests/{reference}", reg.addr);
    reqwest::Client::new()
        .get(url)
        .header("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn push_then_pull_is_byte_identical() {
    let reg = TestRegistry::start().await;
    let client = reg.registry();
    let (pkg, cfg) = build("round-trip");
    let reference = reg.reference("skills/round-trip:v1");
    let digest = client.push(&reference, &pkg, &cfg).await.unwrap();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{digest}");
    // Same package and config: same manifest digest (no timestamps).
    assert_eq!(client.push(&reference, &pkg, &cfg).await.unwrap(), digest);

    let pulled = client.pull(&reference).await.unwrap();
    assert_eq!(pulled.digest, digest);
    assert_eq!(pulled.package, pkg);
    assert_eq!(pulled.config, cfg);
    assert_eq!(pulled.format, ArtifactFormat::SkillOperator);

    // The stored manifest is the documented format.
    let m = raw_manifest(&reg, "skills/round-trip", &digest).await;
    assert_eq!(m["artifactType"], SKILL_ARTIFACT_TYPE);
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(m["config"]["mediaType"], SKILL_CONFIG_MEDIA_TYPE);
    assert_eq!(m["layers"].as_array().unwrap().len(), 1);
    assert_eq!(m["layers"][0]["mediaType"], SKILL_LAYER_MEDIA_TYPE);
    assert_eq!(m["layers"][0]["digest"], digest_of(&pkg));
    assert_eq!(m["annotations"]["org.opencontainers.image.title"], "round-trip");
    assert_eq!(m["annotations"]["org.opencontainers.image.version"], "1.0.0");
    assert!(m["annotations"].get("org.opencontainers.image.created").is_none());

    // A config that does not describe the package is refused before upload.
    let mut wrong = cfg.clone();
    wrong.files[0].sha256 = "00".repeat(32);
    let err = client.push(&reference, &pkg, &wrong).await.unwrap_err();
    assert!(matches!(err, OciError::ConfigMismatch { .. }), "{err}");
}

#[tokio::test]
async fn digest_pinning() {
    let reg = TestRegistry::start().await;
    let client = reg.registry();
    let (pkg1, cfg1) = build("pinned");
    let tag = reg.reference("skills/pinned:stable");
    let d1 = client.push(&tag, &pkg1, &cfg1).await.unwrap();

    let d = skill_dir("pinned");
    std::fs::write(d.path().join("reference.txt"), "changed\n").unwrap();
    let pkg2 = package::build_from_dir(d.path()).unwrap();
    let cfg2 = SkillConfig::for_package(&pkg2, "pinned", "a test skill", Some("1.0.1".into())).unwrap();
    let d2 = client.push(&tag, &pkg2, &cfg2).await.unwrap();
    assert_ne!(d1, d2);

    assert_eq!(client.resolve(&tag).await.unwrap(), d2);
    let by_tag = client.pull(&tag).await.unwrap();
    assert_eq!((by_tag.digest.as_str(), &by_tag.package), (d2.as_str(), &pkg2));

    let old = client.pull(&reg.reference(&format!("skills/pinned@{d1}"))).await.unwrap();
    assert_eq!(old.digest, d1);
    assert_eq!(old.package, pkg1);
    assert_eq!(old.config.version.as_deref(), Some("1.0.0"));

    let missing = format!("sha256:{}", "ab".repeat(32));
    let err = client.pull(&reg.reference(&format!("skills/pinned@{missing}"))).await.unwrap_err();
    assert!(matches!(err, OciError::NotFound { .. }), "{err}");
    let err = client.pull(&reg.reference("skills/pinned:nope")).await.unwrap_err();
    assert!(matches!(err, OciError::NotFound { .. }), "{err}");
    let err = client.pull(&reg.reference("skills/pinned@md5:abc")).await.unwrap_err();
    assert!(matches!(err, OciError::InvalidReference { .. } | OciError::UnsupportedDigest { .. }), "{err}");
}

#[tokio::test]
async fn tampering_is_detected() {
    let reg = TestRegistry::start().await;
    let client = reg.registry();
    let (pkg, cfg) = build("tamper");
    let reference = reg.reference("skills/tamper:v1");
    let digest = client.push(&reference, &pkg, &cfg).await.unwrap();

    // Same length, other bytes: the registry serves it, we refuse it.
    let layer = reg.blob_path(&digest_of(&pkg));
    let mut evil = std::fs::read(&layer).unwrap();
    let n = evil.len();
    evil[n / 2] ^= 0xff;
    std::fs::write(&layer, &evil).unwrap();
    let err = client.pull(&reference).await.unwrap_err();
    match &err {
        OciError::DigestMismatch { expected, actual, .. } => {
            assert_eq!(expected, &digest_of(&pkg));
            assert_eq!(actual, &digest_of(&evil));
        }
        e => panic!("expected a digest mismatch, got {e}"),
    }
    assert!(err.to_string().contains("tampered"), "{err}");

    // Other length: refused too (size or digest).
    let mut longer = pkg.clone();
    longer.extend_from_slice(b"trailing");
    std::fs::write(&layer, &longer).unwrap();
    let err = client.pull(&reference).await.unwrap_err();
    assert!(matches!(err, OciError::SizeMismatch { .. } | OciError::DigestMismatch { .. }), "{err}");
    std::fs::write(&layer, &pkg).unwrap();
    client.pull(&reference).await.unwrap();

    // The manifest itself, by tag: the body no longer hashes to the digest
    // the registry reports for the tag.
    let mpath = reg.blob_path(&digest);
    let mut m = std::fs::read(&mpath).unwrap();
    let i = m.windows(10).position(|w| w == b"round-trip" || w == b"tamper.tar").unwrap_or(m.len() - 3);
    m[i] ^= 0x01;
    std::fs::write(&mpath, &m).unwrap();
    let err = client.pull(&reference).await.unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
    let err = client.pull(&reg.reference(&format!("skills/tamper@{digest}"))).await.unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
}

#[tokio::test]
async fn size_caps_at_their_edges() {
    let reg = TestRegistry::start().await;
    let (pkg, cfg) = build("caps");
    let reference = reg.reference("skills/caps:v1");
    let digest = reg.registry().push(&reference, &pkg, &cfg).await.unwrap();
    let config_len = serde_json::to_vec(&cfg).unwrap().len() as u64;
    let manifest_len = {
        let url = format!("http://{}/v2/skills/caps/manifests/{digest}", reg.addr);
        let accept = "application/vnd.oci.image.manifest.v1+json";
        let body = reqwest::Client::new().get(url).header("Accept", accept).send().await.unwrap().bytes().await.unwrap();
        assert_eq!(digest_of(&body), digest);
        body.len() as u64
    };
    let pull = |limits: OciLimits| {
        let client = reg.registry_with(limits);
        let reference = reference.clone();
        async move { client.pull(&reference).await }
    };
    let d = OciLimits::DEFAULT;
    let pkg_len = pkg.len() as u64;

    pull(OciLimits { max_package_bytes: pkg_len, ..d }).await.unwrap();
    let err = pull(OciLimits { max_package_bytes: pkg_len - 1, ..d }).await.unwrap_err();
    assert!(matches!(err, OciError::TooLarge { size, limit, .. } if size == pkg_len && limit == pkg_len - 1), "{err}");

    pull(OciLimits { max_config_bytes: config_len, ..d }).await.unwrap();
    let err = pull(OciLimits { max_config_bytes: config_len - 1, ..d }).await.unwrap_err();
    assert!(matches!(err, OciError::TooLarge { .. }), "{err}");

    pull(OciLimits { max_manifest_bytes: manifest_len, ..d }).await.unwrap();
    let err = pull(OciLimits { max_manifest_bytes: manifest_len - 1, ..d }).await.unwrap_err();
    assert!(matches!(err, OciError::TooLarge { .. }), "{err}");

    // File caps inside the package apply on pull too.
    let biggest = cfg.files.iter().map(|f| f.size).max().unwrap();
    let files = |max_file_bytes| OciLimits { files: Limits { max_file_bytes, ..Limits::DEFAULT }, ..d };
    pull(files(biggest)).await.unwrap();
    let err = pull(files(biggest - 1)).await.unwrap_err();
    assert!(matches!(err, OciError::Package(PackageError::FileTooLarge { .. })), "{err}");

    // A descriptor that understates the blob: the stream is cut at the
    // declared size, never buffered past it.
    let oci = Client::new(ClientConfig { protocol: ClientProtocol::Http, ..Default::default() });
    let r: Reference = reg.reference("skills/caps:liar").parse().unwrap();
    let config_bytes = serde_json::to_vec(&cfg).unwrap();
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some("application/vnd.oci.image.manifest.v1+json".into()),
        config: OciDescriptor {
            media_type: SKILL_CONFIG_MEDIA_TYPE.into(),
            digest: digest_of(&config_bytes),
            size: config_bytes.len() as i64,
            ..Default::default()
        },
        layers: vec![OciDescriptor {
            media_type: SKILL_LAYER_MEDIA_TYPE.into(),
            digest: digest_of(&pkg),
            size: pkg_len as i64 - 100,
            ..Default::default()
        }],
        artifact_type: Some(SKILL_ARTIFACT_TYPE.into()),
        ..Default::default()
    };
    oci.push_manifest(&r, &manifest.into()).await.unwrap();
    let err = reg.registry().pull(&reg.reference("skills/caps:liar")).await.unwrap_err();
    assert!(matches!(err, OciError::SizeMismatch { .. }), "{err}");
}

/// Builds what toolhive-core's `oci/skills/packager.go` builds: tar of
/// regular files only (0644, mtime 0), gzip; an OCI image config with
/// `dev.toolhive.skills.*` labels; one manifest per platform with
/// artifactType `dev.toolhive.skills.v1` and the layer titled
/// `skill.tar.gz`; an index with the same artifactType.
/// (tar, tar.gz) of regular files, 0644, mtime 0, names as given (raw
/// header bytes, so hostile names can be written too).
fn toolhive_layer(files: &[(&str, &[u8])]) -> (Vec<u8>, Vec<u8>) {
    let mut tar = tar::Builder::new(Vec::new());
    let mut sorted = files.to_vec();
    sorted.sort();
    for (path, data) in &sorted {
        let mut h = tar::Header::new_ustar();
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        tar.append(&h, *data).unwrap();
    }
    let tar = tar.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    (tar, gz.finish().unwrap())
}

/// Returns (the digest the reference resolves to, the first platform manifest's).
async fn push_toolhive(reg: &TestRegistry, reference: &str, files: &[(&str, &[u8])], with_index: bool) -> (String, String) {
    let _ = reg;
    let oci = Client::new(ClientConfig { protocol: ClientProtocol::Http, ..Default::default() });
    let r: Reference = reference.parse().unwrap();
    let (tar, layer) = toolhive_layer(files);
    oci.push_blob(&r, layer.clone(), &digest_of(&layer)).await.unwrap();

    let mut names: Vec<&str> = files.iter().map(|(p, _)| *p).collect();
    names.sort();
    let mut entries = vec![];
    let mut first_manifest = None;
    for arch in ["amd64", "arm64"] {
        let config = serde_json::json!({
            "created": "1970-01-01T00:00:00Z",
            "architecture": arch,
            "os": "linux",
            "config": {"Labels": {
                "dev.toolhive.skills.name": "th-skill",
                "dev.toolhive.skills.description": "from ToolHive",
                "dev.toolhive.skills.version": "0.3.0",
                "dev.toolhive.skills.allowedTools": "null",
                "dev.toolhive.skills.license": "",
                "dev.toolhive.skills.files": serde_json::to_string(&names).unwrap(),
            }},
            "rootfs": {"type": "layers", "diff_ids": [digest_of(&tar)]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "toolhive package"}],
        });
        let config = serde_json::to_vec(&config).unwrap();
        oci.push_blob(&r, config.clone(), &digest_of(&config)).await.unwrap();
        let annotations = BTreeMap::from([
            ("org.opencontainers.image.created".to_string(), "1970-01-01T00:00:00Z".to_string()),
            ("dev.toolhive.skills.name".to_string(), "th-skill".to_string()),
            ("dev.toolhive.skills.description".to_string(), "from ToolHive".to_string()),
            ("dev.toolhive.skills.version".to_string(), "0.3.0".to_string()),
        ]);
        let manifest = OciImageManifest {
            schema_version: 2,
            media_type: Some("application/vnd.oci.image.manifest.v1+json".into()),
            config: OciDescriptor {
                media_type: "application/vnd.oci.image.config.v1+json".into(),
                digest: digest_of(&config),
                size: config.len() as i64,
                ..Default::default()
            },
            layers: vec![OciDescriptor {
                media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                digest: digest_of(&layer),
                size: layer.len() as i64,
                annotations: Some(BTreeMap::from([("org.opencontainers.image.title".to_string(), "skill.tar.gz".to_string())])),
                ..Default::default()
            }],
            artifact_type: Some("dev.toolhive.skills.v1".into()),
            annotations: Some(annotations),
            ..Default::default()
        };
        let body = serde_json::to_vec(&manifest).unwrap();
        let md = digest_of(&body);
        let by_digest = r.clone_with_digest(md.clone());
        if !with_index {
            oci.push_manifest_raw(&r, body, "application/vnd.oci.image.manifest.v1+json".parse().unwrap()).await.unwrap();
            return (md.clone(), md);
        }
        oci.push_manifest_raw(&by_digest, body.clone(), "application/vnd.oci.image.manifest.v1+json".parse().unwrap()).await.unwrap();
        first_manifest.get_or_insert(md.clone());
        entries.push(ImageIndexEntry {
            media_type: "application/vnd.oci.image.manifest.v1+json".into(),
            digest: md,
            size: body.len() as i64,
            platform: Some(Platform {
                architecture: arch.into(),
                os: "linux".into(),
                os_version: None,
                os_features: None,
                variant: None,
                features: None,
            }),
            annotations: None,
            artifact_type: None,
        });
    }
    let index = OciImageIndex {
        schema_version: 2,
        media_type: Some("application/vnd.oci.image.index.v1+json".into()),
        manifests: entries,
        artifact_type: Some("dev.toolhive.skills.v1".into()),
        annotations: None,
    };
    let body = serde_json::to_vec(&index).unwrap();
    let d = digest_of(&body);
    oci.push_manifest_raw(&r, body, "application/vnd.oci.image.index.v1+json".parse().unwrap()).await.unwrap();
    (d, first_manifest.unwrap())
}

#[tokio::test]
async fn pulls_toolhive_skill_artifacts() {
    let reg = TestRegistry::start().await;
    let skill_md: &[u8] = b"---\nname: th-skill\ndescription: from ToolHive\n---\nDo things.\n";
    let files: &[(&str, &[u8])] = &[("SKILL.md", skill_md), ("scripts/run.sh", b"#!/bin/sh\necho th\n"), ("docs/guide.md", b"guide")];

    for with_index in [true, false] {
        let reference = reg.reference(if with_index { "th/skill:index" } else { "th/skill:manifest" });
        let (pushed, first) = push_toolhive(&reg, &reference, files, with_index).await;
        let pulled = reg.registry().pull(&reference).await.unwrap();
        assert_eq!(pulled.digest, pushed, "digest is what the reference resolved to");
        assert_eq!(pulled.format, ArtifactFormat::ToolHive { manifest_digest: first });
        // Pinning works the same: by digest gives the same package.
        let again = reg.registry().pull(&reg.reference(&format!("th/skill@{pushed}"))).await.unwrap();
        assert_eq!(again.package, pulled.package);
        assert_eq!(pulled.config.name, "th-skill");
        assert_eq!(pulled.config.description, "from ToolHive");
        assert_eq!(pulled.config.version.as_deref(), Some("0.3.0"));
        assert_eq!(pulled.config.file_count, 3);

        // Re-packed into our form: the same bytes as packaging that tree.
        let d = tempfile::tempdir().unwrap();
        for (p, data) in files {
            let path = d.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, data).unwrap();
        }
        assert_eq!(pulled.package, package::build_from_dir(d.path()).unwrap());
        let out = tempfile::tempdir().unwrap();
        package::unpack(&pulled.package, out.path()).unwrap();
        assert_eq!(std::fs::read(out.path().join("docs/guide.md")).unwrap(), b"guide");
    }

    // A ToolHive layer with a traversal path is refused like any package.
    let evil = reg.reference("th/evil:1");
    push_toolhive(&reg, &evil, &[("SKILL.md", skill_md), ("../../escape", b"x")], true).await;
    let err = reg.registry().pull(&evil).await.unwrap_err();
    assert!(matches!(err, OciError::Package(PackageError::UnsafePath { .. })), "{err}");

    // Not a job file set.
    let err = reg.registry().pull_blob_set(&reg.reference("th/skill:index")).await.unwrap_err();
    assert!(matches!(err, OciError::UnsupportedArtifact { .. }), "{err}");
}

#[tokio::test]
async fn job_file_sets_round_trip() {
    let reg = TestRegistry::start().await;
    let client = reg.registry();
    let files = vec![
        ("out/report.json".to_string(), br#"{"ok":true}"#.to_vec()),
        ("input.csv".to_string(), b"a,b\n1,2\n".to_vec()),
        ("empty.txt".to_string(), Vec::new()),
        ("copy/of/input.csv".to_string(), b"a,b\n1,2\n".to_vec()),
        ("big.bin".to_string(), (0..3_000_000u32).map(|i| (i % 253) as u8).collect()),
    ];
    let reference = reg.reference("jobs/job-1:outputs");
    let digest = client.push_blob_set(&reference, files.clone()).await.unwrap();
    let (pulled_digest, pulled) = client.pull_blob_set(&reference).await.unwrap();
    assert_eq!(pulled_digest, digest);
    let mut expected = files.clone();
    expected.sort();
    assert_eq!(pulled, expected);

    let m = raw_manifest(&reg, "jobs/job-1", &digest).await;
    assert_eq!(m["artifactType"], JOB_FILES_ARTIFACT_TYPE);
    assert_eq!(m["config"]["mediaType"], "application/vnd.oci.empty.v1+json");
    assert_eq!(m["layers"][0]["annotations"]["org.opencontainers.image.title"], "big.bin");

    // An empty set (a job with no outputs).
    let empty = reg.reference("jobs/job-1:none");
    client.push_blob_set(&empty, vec![]).await.unwrap();
    assert!(client.pull_blob_set(&empty).await.unwrap().1.is_empty());

    // Refused before any upload: unsafe and duplicate paths, default caps.
    for bad in [
        vec![("../x".to_string(), vec![])],
        vec![("a".to_string(), vec![]), ("A".to_string(), vec![])],
        vec![("big".to_string(), vec![0u8; package::MAX_FILE_BYTES as usize + 1])],
        (0..=package::MAX_FILES).map(|i| (format!("f{i}"), vec![])).collect(),
    ] {
        let err = client.push_blob_set(&reg.reference("jobs/bad:x"), bad).await.unwrap_err();
        assert!(matches!(err, OciError::Package(_)), "{err}");
    }
    let err = client.pull(&reference).await.unwrap_err();
    assert!(matches!(err, OciError::UnsupportedArtifact { .. }), "{err}");
}

#[tokio::test]
async fn job_file_set_caps_at_their_edges() {
    let reg = TestRegistry::start().await;
    let lim = |max_files, max_file_bytes, max_total_bytes| OciLimits {
        files: Limits { max_files, max_file_bytes, max_total_bytes, ..Limits::DEFAULT },
        ..OciLimits::DEFAULT
    };
    let small = reg.registry_with(lim(3, 10, 25));
    let f = |n: &str, len: usize| (n.to_string(), vec![b'x'; len]);

    // At the edges: 3 files, 10 bytes each at most, 25 in total.
    let at = reg.reference("jobs/edge:at");
    small.push_blob_set(&at, vec![f("a", 10), f("b", 10), f("c", 5)]).await.unwrap();
    assert_eq!(small.pull_blob_set(&at).await.unwrap().1.len(), 3);

    // One past each edge: refused on push (before upload) ...
    for (what, set) in [
        ("count", vec![f("a", 1), f("b", 1), f("c", 1), f("d", 1)]),
        ("file", vec![f("a", 11)]),
        ("total", vec![f("a", 10), f("b", 10), f("c", 6)]),
    ] {
        let err = small.push_blob_set(&reg.reference("jobs/edge:over"), set.clone()).await.unwrap_err();
        assert!(matches!(err, OciError::Package(_)), "{what}: {err}");
        // ... and on pull, from the manifest, before any download.
        let r = reg.reference(&format!("jobs/edge:{what}"));
        reg.registry().push_blob_set(&r, set).await.unwrap();
        let err = small.pull_blob_set(&r).await.unwrap_err();
        let ok = match what {
            "count" => matches!(err, OciError::Package(PackageError::TooManyFiles { limit: 3 })),
            "file" => matches!(err, OciError::Package(PackageError::FileTooLarge { .. })),
            _ => matches!(err, OciError::Package(PackageError::TotalTooLarge { .. })),
        };
        assert!(ok, "{what}: {err}");
    }

    // The real 32 MiB per-file cap, through the registry.
    let big = reg.reference("jobs/edge:32mib");
    let data = vec![3u8; package::MAX_FILE_BYTES as usize];
    reg.registry().push_blob_set(&big, vec![("big.bin".into(), data.clone())]).await.unwrap();
    let (_, got) = reg.registry().pull_blob_set(&big).await.unwrap();
    assert_eq!(got[0].1.len(), data.len());
    assert!(got[0].1 == data);
}

#[tokio::test]
async fn registry_down_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let client = Registry::new(RegistryOptions::plain_http(addr.clone())).unwrap();
    let (pkg, cfg) = build("down");
    let reference = format!("{addr}/skills/down:v1");
    for err in [
        client.pull(&reference).await.unwrap_err(),
        client.push(&reference, &pkg, &cfg).await.unwrap_err(),
        client.push_blob_set(&reference, vec![("a".into(), b"x".to_vec())]).await.unwrap_err(),
    ] {
        assert!(matches!(&err, OciError::Unreachable { registry, .. } if registry == &addr), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&addr) && msg.contains("running"), "{msg}");
    }
    let err = client.pull("not a reference!").await.unwrap_err();
    assert!(matches!(err, OciError::InvalidReference { .. }), "{err}");
}

#[test]
fn auth_from_docker_config() {
    use skill_operator::oci::{registry_of, Auth};
    let cfg = br#"{"auths": {
        "https://index.docker.io/v1/": {"auth": "aHViOnNlY3JldA=="},
        "ghcr.io": {"username": "u", "password": "p"},
        "registry.example:5000": {"registrytoken": "tok"}
    }}"#;
    let basic = |a: Auth| match a {
        Auth::Basic { username, password } => format!("{username}:{password}"),
        other => format!("{other:?}"),
    };
    assert_eq!(basic(Auth::from_docker_config(cfg, &registry_of("docker.io/library/x:1").unwrap()).unwrap()), "hub:secret");
    assert_eq!(basic(Auth::from_docker_config(cfg, "ghcr.io").unwrap()), "u:p");
    assert!(matches!(Auth::from_docker_config(cfg, "registry.example:5000").unwrap(), Auth::Bearer(t) if t == "tok"));
    assert!(matches!(Auth::from_docker_config(cfg, "quay.io").unwrap(), Auth::Anonymous));
    assert!(Auth::from_docker_config(b"not json", "ghcr.io").is_err());
    // Secrets never appear in Debug output.
    assert_eq!(format!("{:?}", Auth::Bearer("tok".into())), "Bearer(***)");
    assert_eq!(registry_of("127.0.0.1:5000/a/b:c").unwrap(), "127.0.0.1:5000");
}

#[tokio::test]
async fn basic_auth_registry() {
    use skill_operator::oci::Auth;
    // user "tester", password "s3cret" (bcrypt cost 4).
    let reg = TestRegistry::start_with_htpasswd("tester:$2b$04$Z.ZW/OHOlXPvxw5oVvfPkOGTR58bjAaX.qrTERRFtIMz6BCjjEDQy").await;
    let with = |auth: Auth| Registry::new(RegistryOptions { auth, ..RegistryOptions::plain_http(reg.addr.clone()) }).unwrap();
    let good = with(Auth::Basic { username: "tester".into(), password: "s3cret".into() });
    let (pkg, cfg) = build("private");
    let reference = reg.reference("skills/private:v1");

    let err = with(Auth::Anonymous).push(&reference, &pkg, &cfg).await.unwrap_err();
    assert!(matches!(err, OciError::Auth { .. }), "{err}");
    let digest = good.push(&reference, &pkg, &cfg).await.unwrap();
    let pulled = good.pull(&reference).await.unwrap();
    assert_eq!((pulled.digest, pulled.package), (digest, pkg));
    good.push_blob_set(&reg.reference("jobs/private:in"), vec![("a.txt".into(), b"a".to_vec())]).await.unwrap();
    assert_eq!(good.pull_blob_set(&reg.reference("jobs/private:in")).await.unwrap().1.len(), 1);

    let bad = with(Auth::Basic { username: "tester".into(), password: "wrong".into() });
    let err = bad.pull(&reference).await.unwrap_err();
    assert!(matches!(err, OciError::Auth { .. }), "{err}");
    let err = with(Auth::Anonymous).pull(&reference).await.unwrap_err();
    assert!(matches!(err, OciError::Auth { .. }), "{err}");
}

/// `Registry::list_tags` against distribution: a repository never pushed
/// to (404 NAME_UNKNOWN) has no tags; pages are followed by their `Link`
/// until every tag is in, whatever the page size.
#[tokio::test]
async fn list_tags_follows_pages_and_an_unknown_repository_has_none() {
    let reg = TestRegistry::start().await;
    let client = reg.registry();
    let repo = reg.reference("jobs");
    assert_eq!(client.list_tags(&repo).await.unwrap(), Vec::<String>::new());
    // distribution's own answer for it.
    let resp = reqwest::get(format!("http://{}/v2/jobs/tags/list", reg.addr)).await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    assert!(resp.text().await.unwrap().contains("NAME_UNKNOWN"));

    let (pkg, cfg) = build("tagged");
    let mut want: Vec<String> = (0..7).map(|i| format!("t{i}")).collect();
    want.push(format!("team-a.{}", "a".repeat(64)));
    want.push("job_team-a_uid_package".into());
    for tag in &want {
        // One manifest per tag (deleting one below must not untag the others).
        let one = BTreeMap::from([("test.tag".to_string(), tag.clone())]);
        client.push_annotated(&format!("{repo}:{tag}"), &pkg, &cfg, one).await.unwrap();
    }
    want.sort();
    // (distribution 2.8 answers every tag at once, unsorted, `n` or not; v3 pages.)
    for page in [1, 2, 3, 9, 10, skill_operator::oci::TAGS_PAGE] {
        assert_eq!(client.list_tags_paged(&repo, page).await.unwrap(), want, "pages of {page}");
    }
    // Another repository's tags are not this one's.
    assert!(client.list_tags(&reg.reference("other")).await.unwrap().is_empty());
    // Deleting a manifest takes its tag out of the list.
    client.delete(&format!("{repo}:t3")).await.unwrap();
    want.retain(|t| t != "t3");
    assert_eq!(client.list_tags_paged(&repo, 4).await.unwrap(), want);
    // A tag or digest is no repository.
    for bad in [format!("{repo}:t1"), format!("{repo}@sha256:{}", "a".repeat(64))] {
        assert!(matches!(client.list_tags(&bad).await.unwrap_err(), OciError::InvalidReference { .. }), "{bad}");
    }
}

#[tokio::test]
async fn list_tags_of_a_registry_that_is_down_is_a_clear_error() {
    let mut reg = TestRegistry::start().await;
    let client = reg.registry();
    let repo = reg.reference("jobs");
    reg.stop();
    let err = client.list_tags(&repo).await.unwrap_err();
    assert!(matches!(err, OciError::Unreachable { .. }), "{err}");
}
