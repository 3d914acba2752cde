//! Composing run images against a real `docker-registry` on loopback, onto
//! base images the tests build and push with skopeo, read back with
//! independent readers (skopeo, umoci, plain HTTP GETs, the registry's
//! access log).

#[path = "image/common.rs"]
mod common;

use std::collections::BTreeMap;

use common::*;
use skill_operator::image::compose::{
    ANNOTATION_BASE_DIGEST, ANNOTATION_BASE_NAME, ANNOTATION_DEPS_LOCK_DIGEST, ANNOTATION_PACKAGE_DIGEST,
};
use skill_operator::image::deps::{Dependency, Ecosystem};
use skill_operator::image::layer::{self, Layer, LayerOptions};
use skill_operator::image::{compose, BaseSpec, ComposeSpec, Composed, ConfigPatch, ImageError, SbomInput};

const PACKAGE_DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const LOCK_DIGEST: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
const TOOLS: &[&str] = &["skopeo", "umoci"];

fn base_files() -> Vec<(&'static str, &'static [u8])> {
    vec![("etc/os-release", b"ID=testbase\n"), ("usr/bin/tool", b"#!/bin/true\n")]
}

/// A single-arch OCI base pushed as `repo:1` (extra: skopeo flags).
async fn push_single_base(reg: &TestRegistry, repo: &str, extra: &[&str]) -> String {
    let work = tempfile::tempdir().unwrap();
    let img = BaseImageSpec {
        os: "linux",
        arch: "amd64",
        layers: vec![base_files(), vec![("etc/second", b"layer two\n")]],
        annotations: BTreeMap::new(),
    };
    write_layout(work.path(), "1", &[img], false);
    skopeo_push(work.path(), "1", &reg.reference(&format!("{repo}:1")), extra);
    reg.reference(&format!("{repo}:1"))
}

/// A two-platform index (distinct per-platform layers) plus an
/// attestation-like `unknown/unknown` entry, pushed as `repo:multi`.
async fn push_index_base(reg: &TestRegistry, repo: &str) -> String {
    let work = tempfile::tempdir().unwrap();
    let amd = BaseImageSpec {
        os: "linux",
        arch: "amd64",
        layers: vec![vec![("etc/arch", b"amd64\n"), ("usr/bin/tool", b"amd\n")]],
        annotations: BTreeMap::new(),
    };
    let arm = BaseImageSpec {
        os: "linux",
        arch: "arm64",
        layers: vec![vec![("etc/arch", b"arm64\n"), ("usr/bin/tool", b"arm\n")]],
        annotations: BTreeMap::new(),
    };
    let att = BaseImageSpec {
        os: "unknown",
        arch: "unknown",
        layers: vec![vec![("attestation.json", b"{}")]],
        annotations: BTreeMap::from([("vnd.docker.reference.type".to_string(), "attestation-manifest".to_string())]),
    };
    write_layout(work.path(), "multi", &[amd, arm, att], true);
    skopeo_push(work.path(), "multi", &reg.reference(&format!("{repo}:multi")), &["--all"]);
    reg.reference(&format!("{repo}:multi"))
}

fn layers_for(skill: &std::path::Path, deps: &std::path::Path) -> (Layer, Layer) {
    let o = LayerOptions::default();
    (
        layer::from_dir(skill, "skill", &[".git"], "skill-operator: skill package at /skill", &o).unwrap(),
        layer::from_dir(deps, "deps", &[], "skill-operator: dependencies at /deps", &o).unwrap(),
    )
}

fn spec<'a>(base: &str, repository: String, layers: Vec<&'a Layer>) -> ComposeSpec<'a> {
    let mut s = ComposeSpec::new(BaseSpec::Image(base.to_string()), repository);
    s.tag = Some("run".into());
    s.layers = layers;
    s.config = ConfigPatch {
        working_dir: Some("/skill".into()),
        env: vec![("PYTHONPATH".into(), "/deps/python".into()), ("NODE_PATH".into(), "/deps/node/node_modules".into())],
        labels: BTreeMap::from([("dev.skill-operator.skill".to_string(), "t".to_string())]),
        ..Default::default()
    };
    s.package_digest = Some(PACKAGE_DIGEST.into());
    s.deps_lock_digest = Some(LOCK_DIGEST.into());
    s.sbom = Some(SbomInput {
        dependencies: vec![Dependency {
            ecosystem: Ecosystem::Pypi,
            name: "tinypkg".into(),
            version: "1.0".into(),
            purl: "pkg:pypi/tinypkg@1.0".into(),
        }],
    });
    s
}

async fn compose_fresh(reg: &TestRegistry, s: &ComposeSpec<'_>) -> Composed {
    compose(&reg.remote(), s).await.unwrap()
}

#[tokio::test]
async fn single_arch_compose_reads_back_with_skopeo_and_umoci() {
    if !have_tools("single_arch_compose_reads_back_with_skopeo_and_umoci", TOOLS) {
        return;
    }
    let reg = TestRegistry::start().await;
    let base = push_single_base(&reg, "base/python", &[]).await;
    let base_digest = reg.digest_of("base/python:1").await;
    let (skill, deps) = (skill_dir("alpha"), deps_dir());
    let (l1, l2) = layers_for(skill.path(), deps.path());
    let c = compose_fresh(&reg, &spec(&base, reg.reference("apps/alpha"), vec![&l1, &l2])).await;
    assert_eq!(c.reference, format!("{}@{}", reg.reference("apps/alpha"), c.digest));
    assert_eq!(reg.digest_of("apps/alpha:run").await, c.digest, "the tag points at the result");

    // The manifest, by skopeo.
    let m = skopeo_raw(&c.reference);
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    let layers = m["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 4, "two base layers + skill + deps");
    assert_eq!(layers[2]["digest"], l1.digest.as_str());
    assert_eq!(layers[3]["digest"], l2.digest.as_str());
    let a = &m["annotations"];
    assert_eq!(a[ANNOTATION_BASE_DIGEST], base_digest.as_str());
    assert_eq!(a[ANNOTATION_BASE_NAME], base.as_str());
    assert_eq!(a[ANNOTATION_PACKAGE_DIGEST], PACKAGE_DIGEST);
    assert_eq!(a[ANNOTATION_DEPS_LOCK_DIGEST], LOCK_DIGEST);

    // The config, by skopeo.
    let cfg = skopeo_config(&c.reference, "amd64");
    let diff_ids: Vec<&str> = cfg["rootfs"]["diff_ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(diff_ids.len(), 4);
    assert_eq!(&diff_ids[2..], &[l1.diff_id.as_str(), l2.diff_id.as_str()]);
    let history = cfg["history"].as_array().unwrap();
    assert_eq!(history.len(), 4);
    assert_eq!(history[2]["created"], "1970-01-01T00:00:00Z");
    assert_eq!(history[3]["created_by"], "skill-operator: dependencies at /deps");
    let inner = &cfg["config"];
    assert_eq!(inner["User"], "65532:65532");
    assert_eq!(inner["WorkingDir"], "/skill");
    let env: Vec<&str> = inner["Env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(
        env,
        vec!["PATH=/usr/bin:/bin", "PYTHONPATH=/deps/python", "NODE_PATH=/deps/node/node_modules"],
        "replaced in place, appended after"
    );
    assert_eq!(inner["Cmd"][0], "/bin/sh", "base Cmd kept");
    assert_eq!(inner["Labels"]["base.label"], "kept");
    assert_eq!(inner["Labels"][ANNOTATION_PACKAGE_DIGEST], PACKAGE_DIGEST);
    assert_eq!(inner["Labels"][ANNOTATION_BASE_DIGEST], base_digest.as_str());

    // Pulled and unpacked by skopeo + umoci: files byte for byte.
    let work = tempfile::tempdir().unwrap();
    let rootfs = pull_and_unpack(&c.reference, "amd64", work.path());
    let got = files_under(&rootfs);
    for (rel, data) in files_under(skill.path()) {
        assert_eq!(got.get(&format!("skill/{rel}")), Some(&data), "skill/{rel}");
    }
    for (rel, data) in files_under(deps.path()) {
        assert_eq!(got.get(&format!("deps/{rel}")), Some(&data), "deps/{rel}");
    }
    assert_eq!(got.get("etc/os-release").map(Vec::as_slice), Some(&b"ID=testbase\n"[..]), "base content there");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| std::fs::metadata(rootfs.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("skill/scripts/run.py"), 0o755);
    assert_eq!(mode("skill/SKILL.md"), 0o644);
    assert_eq!(mode("skill"), 0o755);

    // Our own verifier agrees the image is whole.
    let report = skill_operator::image::verify(&reg.remote(), &c.reference).await.unwrap();
    assert_eq!((report.manifests, report.layers), (1, 4));
}

#[tokio::test]
async fn identical_inputs_give_the_identical_digest_and_only_changes_are_uploaded() {
    if !have_tools("identical_inputs_give_the_identical_digest_and_only_changes_are_uploaded", TOOLS) {
        return;
    }
    let reg = TestRegistry::start().await;
    let base = push_single_base(&reg, "base/python", &[]).await;
    let (skill, deps) = (skill_dir("beta"), deps_dir());
    let repo = reg.reference("apps/beta");

    let (a1, a2) = layers_for(skill.path(), deps.path());
    let first = compose_fresh(&reg, &spec(&base, repo.clone(), vec![&a1, &a2])).await;
    let mark = reg.requests().await.len();

    // Same inputs, layers rebuilt from scratch: same digest, nothing written.
    let (b1, b2) = layers_for(skill.path(), deps.path());
    assert_eq!((a1.digest.as_str(), a2.digest.as_str()), (b1.digest.as_str(), b2.digest.as_str()));
    let second = compose_fresh(&reg, &spec(&base, repo.clone(), vec![&b1, &b2])).await;
    assert_eq!(first.digest, second.digest);
    assert_eq!(first.sbom, second.sbom);
    assert_eq!(second.uploads.writes(), 0, "{:?}", second.uploads);
    let log = reg.requests().await;
    let writes: Vec<_> = log[mark..].iter().filter(|r| r.is_write()).collect();
    assert!(writes.is_empty(), "an unchanged compose wrote to the registry: {writes:?}");
    let mark = log.len();

    // One skill file changed: only the skill layer and the new documents go up.
    std::fs::write(skill.path().join("reference.txt"), "changed\n").unwrap();
    let (c1, c2) = layers_for(skill.path(), deps.path());
    assert_ne!(c1.digest, a1.digest);
    assert_eq!(c2.digest, a2.digest);
    let third = compose_fresh(&reg, &spec(&base, repo.clone(), vec![&c1, &c2])).await;
    assert_ne!(third.digest, first.digest);
    let log = reg.requests().await;
    let uploaded: Vec<String> = log[mark..].iter().filter(|r| r.is_blob_write()).map(|r| r.path.clone()).collect();
    assert!(uploaded.iter().any(|p| p.contains(&c1.digest.replace(':', "%3A"))), "new skill layer uploaded: {uploaded:?}");
    assert!(!uploaded.iter().any(|p| p.contains(&c2.digest.replace(':', "%3A"))), "deps layer not uploaded again: {uploaded:?}");
    // skill layer, config, SBOM blob: three blobs; no mounts (base present).
    assert_eq!(uploaded.len(), 3, "{uploaded:?}");
    assert_eq!(third.uploads.blobs_uploaded, 3);
    assert!(!log[mark..].iter().any(|r| r.is_mount()));
}

#[tokio::test]
async fn base_layers_are_mounted_across_repositories_and_never_downloaded() {
    if !have_tools("base_layers_are_mounted_across_repositories_and_never_downloaded", TOOLS) {
        return;
    }
    let reg = TestRegistry::start().await;
    let base = push_single_base(&reg, "library/base", &[]).await;
    let base_manifest = skopeo_raw(&base);
    let base_layers: Vec<String> =
        base_manifest["layers"].as_array().unwrap().iter().map(|l| l["digest"].as_str().unwrap().to_string()).collect();
    let mark = reg.requests().await.len();

    let (skill, deps) = (skill_dir("gamma"), deps_dir());
    let (l1, l2) = layers_for(skill.path(), deps.path());
    let c = compose_fresh(&reg, &spec(&base, reg.reference("team/gamma"), vec![&l1, &l2])).await;
    assert_eq!(c.uploads.blobs_mounted, 2, "{:?}", c.uploads);
    assert_eq!(c.uploads.blobs_copied, 0);

    let log = reg.requests().await;
    let mounts: Vec<_> = log[mark..].iter().filter(|r| r.is_mount()).collect();
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    for m in &mounts {
        assert!(m.path.starts_with("/v2/team/gamma/blobs/uploads/") && m.path.contains("from=library%2Fbase") && m.status == 201, "{m:?}");
    }
    for d in &base_layers {
        let got: Vec<_> = log[mark..].iter().filter(|r| r.downloads_blob(d)).collect();
        assert!(got.is_empty(), "base layer {d} was downloaded: {got:?}");
    }
    // The target repository really has them: skopeo pulls the result whole.
    let work = tempfile::tempdir().unwrap();
    let rootfs = pull_and_unpack(&c.reference, "amd64", work.path());
    assert!(rootfs.join("etc/second").is_file());
}

#[tokio::test]
async fn base_on_another_registry_is_copied_through_a_stream() {
    if !have_tools("base_on_another_registry_is_copied_through_a_stream", TOOLS) {
        return;
    }
    let (src, dst) = (TestRegistry::start().await, TestRegistry::start().await);
    let base = push_single_base(&src, "base/python", &[]).await;
    let (skill, deps) = (skill_dir("delta"), deps_dir());
    let (l1, l2) = layers_for(skill.path(), deps.path());
    // One Remote that may speak plain HTTP to both.
    let mut opts = skill_operator::oci::RegistryOptions::plain_http(src.addr.clone());
    opts.plain_http.push(dst.addr.clone());
    let remote = skill_operator::image::Remote::new(opts).unwrap();
    let c = compose(&remote, &spec(&base, dst.reference("apps/delta"), vec![&l1, &l2])).await.unwrap();
    assert_eq!((c.uploads.blobs_copied, c.uploads.blobs_mounted), (2, 0), "{:?}", c.uploads);
    assert!(!dst.requests().await.iter().any(|r| r.is_mount()), "no mount across registries");
    let work = tempfile::tempdir().unwrap();
    let rootfs = pull_and_unpack(&c.reference, "amd64", work.path());
    assert_eq!(std::fs::read(rootfs.join("etc/second")).unwrap(), b"layer two\n");
    assert!(rootfs.join("skill/SKILL.md").is_file());
}

#[tokio::test]
async fn multi_platform_index_gives_one_manifest_per_platform() {
    if !have_tools("multi_platform_index_gives_one_manifest_per_platform", TOOLS) {
        return;
    }
    let reg = TestRegistry::start().await;
    let base = push_index_base(&reg, "base/multi").await;
    let base_digest = reg.digest_of("base/multi:multi").await;
    let (skill, deps) = (skill_dir("eps"), deps_dir());
    let (l1, l2) = layers_for(skill.path(), deps.path());
    let c = compose_fresh(&reg, &spec(&base, reg.reference("apps/eps"), vec![&l1, &l2])).await;
    assert_eq!(c.media_type, "application/vnd.oci.image.index.v1+json");

    let idx = skopeo_raw(&c.reference);
    assert_eq!(idx["mediaType"], "application/vnd.oci.image.index.v1+json");
    let entries = idx["manifests"].as_array().unwrap();
    let archs: Vec<&str> = entries.iter().map(|e| e["platform"]["architecture"].as_str().unwrap()).collect();
    assert_eq!(archs, vec!["amd64", "arm64"], "attestation entry skipped");
    assert_eq!(idx["annotations"][ANNOTATION_BASE_DIGEST], base_digest.as_str());

    let base_idx = skopeo_raw(&base);
    for (arch, marker) in [("amd64", &b"amd64\n"[..]), ("arm64", &b"arm64\n"[..])] {
        let cfg = skopeo_config(&c.reference, arch);
        assert_eq!(cfg["architecture"], arch);
        let d = cfg["rootfs"]["diff_ids"].as_array().unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[1], l1.diff_id.as_str());
        // Each platform manifest names its own base platform manifest.
        let entry = entries.iter().find(|e| e["platform"]["architecture"] == arch).unwrap();
        let m = skopeo_raw(&format!("{}@{}", reg.reference("apps/eps"), entry["digest"].as_str().unwrap()));
        let base_entry = base_idx["manifests"].as_array().unwrap().iter().find(|e| e["platform"]["architecture"] == arch).unwrap();
        assert_eq!(m["annotations"][ANNOTATION_BASE_DIGEST], base_entry["digest"]);
        let work = tempfile::tempdir().unwrap();
        let rootfs = pull_and_unpack(&c.reference, arch, work.path());
        assert_eq!(std::fs::read(rootfs.join("etc/arch")).unwrap(), marker, "{arch} got its own base layer");
        assert_eq!(std::fs::read(rootfs.join("skill/SKILL.md")).unwrap(), std::fs::read(skill.path().join("SKILL.md")).unwrap());
    }
    let report = skill_operator::image::verify(&reg.remote(), &c.reference).await.unwrap();
    assert_eq!((report.manifests, report.layers), (3, 6));

    // Asking for a platform the base lacks is refused, naming what it has.
    let mut s = spec(&base, reg.reference("apps/eps"), vec![&l1]);
    s.platforms = vec![skill_operator::image::Platform::linux("riscv64")];
    let err = compose(&reg.remote(), &s).await.unwrap_err();
    assert!(matches!(&err, ImageError::NoPlatform { found, .. } if found.contains("linux/arm64")), "{err}");
}

#[tokio::test]
async fn docker_schema2_base_is_converted_to_oci() {
    if !have_tools("docker_schema2_base_is_converted_to_oci", TOOLS) {
        return;
    }
    let reg = TestRegistry::start().await;
    let base = push_single_base(&reg, "base/docker", &["--format", "v2s2"]).await;
    let raw = skopeo_raw(&base);
    assert_eq!(raw["mediaType"], "application/vnd.docker.distribution.manifest.v2+json", "the base really is Docker schema 2");
    let (skill, deps) = (skill_dir("zeta"), deps_dir());
    let (l1, l2) = layers_for(skill.path(), deps.path());
    let c = compose_fresh(&reg, &spec(&base, reg.reference("apps/zeta"), vec![&l1, &l2])).await;
    let m = skopeo_raw(&c.reference);
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(m["config"]["mediaType"], "application/vnd.oci.image.config.v1+json");
    for l in m["layers"].as_array().unwrap() {
        assert_eq!(l["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip");
    }
    // Same blobs as the base (only descriptors changed).
    for (ours, theirs) in m["layers"].as_array().unwrap().iter().zip(raw["layers"].as_array().unwrap()) {
        assert_eq!(ours["digest"], theirs["digest"]);
    }
    // umoci reads OCI only: it unpacks the converted image.
    let work = tempfile::tempdir().unwrap();
    let rootfs = pull_and_unpack(&c.reference, "amd64", work.path());
    assert!(rootfs.join("etc/os-release").is_file() && rootfs.join("skill/SKILL.md").is_file());
}

/// A layer of many download chunks (8 MiB that gzip cannot shrink): the
/// verifier's hashing thread must run while the download feeds it through
/// its bounded channel. When the thread only started after the download,
/// verify waited forever once the channel was full (as it did on the
/// cluster suite's 220 MB base layer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_of_many_chunks_verifies_without_stalling() {
    if !have_tools("a_layer_of_many_chunks_verifies_without_stalling", TOOLS) {
        return;
    }
    let reg = TestRegistry::start().await;
    let base = push_single_base(&reg, "base/python", &[]).await;
    let (skill, deps) = (skill_dir("big"), deps_dir());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..(8 << 20) / 8)
        .flat_map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes()
        })
        .collect();
    std::fs::write(deps.path().join("python/tinypkg/blob.bin"), &noise).unwrap();
    let (l1, l2) = layers_for(skill.path(), deps.path());
    assert!(l2.size > 8 << 20, "the layer stays incompressible: {} bytes", l2.size);
    let c = compose_fresh(&reg, &spec(&base, reg.reference("apps/big"), vec![&l1, &l2])).await;
    let report = tokio::time::timeout(std::time::Duration::from_secs(120), skill_operator::image::verify(&reg.remote(), &c.reference))
        .await
        .expect("verify finishes (it stalled when the hashing thread started late)")
        .unwrap();
    assert_eq!(report.layers, 4);
    assert!(report.bytes > 8 << 20);
}

#[tokio::test]
async fn a_tampered_layer_is_detected_on_verify_and_on_pull() {
    if !have_tools("a_tampered_layer_is_detected_on_verify_and_on_pull", TOOLS) {
        return;
    }
    let reg = TestRegistry::start().await;
    let base = push_single_base(&reg, "base/python", &[]).await;
    let (skill, deps) = (skill_dir("eta"), deps_dir());
    let (l1, l2) = layers_for(skill.path(), deps.path());
    let c = compose_fresh(&reg, &spec(&base, reg.reference("apps/eta"), vec![&l1, &l2])).await;
    skill_operator::image::verify(&reg.remote(), &c.reference).await.unwrap();

    // Same length, one byte flipped, in the registry's storage.
    let path = reg.blob_path(&l1.digest);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();

    let err = skill_operator::image::verify(&reg.remote(), &c.reference).await.unwrap_err();
    assert!(
        matches!(&err, ImageError::Registry(skill_operator::oci::OciError::DigestMismatch { expected, .. }) if *expected == l1.digest),
        "{err}"
    );
    let work = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("skopeo")
        .args(["copy", "--quiet", "--src-tls-verify=false"])
        .arg(format!("docker://{}", c.reference))
        .arg(format!("oci:{}:img", work.path().join("l").display()))
        .output()
        .unwrap();
    assert!(!out.status.success(), "skopeo pulled a tampered image");
    assert!(
        String::from_utf8_lossy(&out.stderr).to_lowercase().contains("digest did not match"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn sbom_is_attached_as_a_referrer_with_every_file_and_dependency() {
    if !have_tools("sbom_is_attached_as_a_referrer_with_every_file_and_dependency", TOOLS) {
        return;
    }
    let reg = TestRegistry::start().await;
    let base = push_single_base(&reg, "base/python", &[]).await;
    let (skill, deps) = (skill_dir("theta"), deps_dir());
    let (l1, l2) = layers_for(skill.path(), deps.path());
    let c = compose_fresh(&reg, &spec(&base, reg.reference("apps/theta"), vec![&l1, &l2])).await;
    let sbom = c.sbom.clone().unwrap();
    let hex = c.digest.trim_start_matches("sha256:");
    assert_eq!(sbom.referrers_tag, format!("sha256-{hex}"));

    // The fallback referrers index (OCI 1.1 tag schema) lists the SBOM.
    let idx = skopeo_raw(&reg.reference(&format!("apps/theta:sha256-{hex}")));
    let entries = idx["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["digest"], sbom.manifest_digest.as_str());
    assert_eq!(entries[0]["artifactType"], "application/vnd.cyclonedx+json");
    // The SBOM manifest names the image as its subject.
    let m = skopeo_raw(&reg.reference(&format!("apps/theta:sha256-{hex}.sbom")));
    assert_eq!(m["subject"]["digest"], c.digest.as_str());
    assert_eq!(m["artifactType"], "application/vnd.cyclonedx+json");
    let blob = m["layers"][0]["digest"].as_str().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&reg.blob("apps/theta", blob).await).unwrap();
    assert_eq!((doc["bomFormat"].as_str(), doc["specVersion"].as_str()), (Some("CycloneDX"), Some("1.5")));
    let comps = doc["components"].as_array().unwrap();
    let files: BTreeMap<String, String> = comps
        .iter()
        .filter(|c| c["type"] == "file")
        .map(|c| (c["name"].as_str().unwrap().to_string(), c["hashes"][0]["content"].as_str().unwrap().to_string()))
        .collect();
    for (prefix, dir) in [("skill", skill.path()), ("deps", deps.path())] {
        for (rel, data) in files_under(dir) {
            let want = sha256(&data).trim_start_matches("sha256:").to_string();
            assert_eq!(files.get(&format!("/{prefix}/{rel}")), Some(&want), "/{prefix}/{rel}");
        }
    }
    assert!(comps.iter().any(|c| c["purl"] == "pkg:pypi/tinypkg@1.0" && c["version"] == "1.0"));
}

#[tokio::test]
async fn root_or_named_users_are_refused_before_any_request() {
    let l = {
        let d = skill_dir("iota");
        layer::from_dir(d.path(), "skill", &[], "x", &LayerOptions::default()).unwrap()
    };
    for user in ["root", "0:0", "0", "65532:", "nonroot"] {
        let mut s = spec("127.0.0.1:1/base:1", "127.0.0.1:1/apps/iota".into(), vec![&l]);
        s.config.user = user.into();
        let remote = skill_operator::image::Remote::new(skill_operator::oci::RegistryOptions::plain_http("127.0.0.1:1")).unwrap();
        let err = compose(&remote, &s).await.unwrap_err();
        assert!(matches!(err, ImageError::Invalid { .. }), "{user}: {err}");
    }
}

fn cli_compose(reg: &TestRegistry, base: &str, repo: &str, package: (&str, &std::path::Path), deps: &std::path::Path) -> serde_json::Value {
    let out = run(std::process::Command::new(env!("CARGO_BIN_EXE_skill-operator"))
        .args(["image", "compose", "--plain-http", "--json", "--base", base, "--registry", &reg.reference(repo), "--tag", "cli"])
        .arg(package.0)
        .arg(package.1)
        .arg("--deps")
        .arg(deps));
    serde_json::from_str(&out).unwrap()
}

#[tokio::test]
async fn the_cli_composes_from_a_directory_or_an_archive_and_verifies() {
    if !have_tools("the_cli_composes_from_a_directory_or_an_archive_and_verifies", TOOLS) {
        return;
    }
    let reg = TestRegistry::start().await;
    let base = push_single_base(&reg, "base/python", &[]).await;
    let (skill, deps) = (skill_dir("kappa"), deps_dir());
    let from_dir = cli_compose(&reg, &base, "apps/kappa", ("--package", skill.path()), deps.path());
    let again = cli_compose(&reg, &base, "apps/kappa", ("--package", skill.path()), deps.path());
    assert_eq!(from_dir["reference"], again["reference"]);
    let u = &again["uploads"];
    assert_eq!(
        u["blobsUploaded"].as_u64().unwrap() + u["blobsMounted"].as_u64().unwrap() + u["manifestsPushed"].as_u64().unwrap(),
        0,
        "{u}"
    );

    // The same skill as a package archive gives the same skill layer, and
    // the archive's sha256 as the package digest.
    let archive = skill_operator::core::package::build_from_dir(skill.path()).unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &archive).unwrap();
    let from_archive = cli_compose(&reg, &base, "apps/kappa-archive", ("--package-archive", file.path()), deps.path());
    assert_eq!(from_archive["layers"][0]["digest"], from_dir["layers"][0]["digest"]);
    let m = skopeo_raw(from_archive["reference"].as_str().unwrap());
    assert_eq!(m["annotations"][ANNOTATION_PACKAGE_DIGEST], sha256(&archive).as_str());
    // The deps dir implies the environment.
    let cfg = skopeo_config(from_dir["reference"].as_str().unwrap(), "amd64");
    let env: Vec<&str> = cfg["config"]["Env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(env.contains(&"PYTHONPATH=/deps/python") && env.contains(&"NODE_PATH=/deps/node/node_modules"), "{env:?}");

    let verified = run(std::process::Command::new(env!("CARGO_BIN_EXE_skill-operator"))
        .args(["image", "verify", "--plain-http"])
        .arg(from_dir["reference"].as_str().unwrap()));
    let v: serde_json::Value = serde_json::from_str(&verified).unwrap();
    assert_eq!(v["layers"], 4);
}
