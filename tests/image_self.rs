//! `skill-operator image self`: the operator image pushed to a real
//! registry, pulled back with skopeo, unpacked with umoci, and the binary
//! run inside that root filesystem alone under bubblewrap.

#[path = "image/common.rs"]
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

fn image_self(reg: &TestRegistry, tag: &str) -> String {
    let out =
        run(Command::new(BIN).args(["image", "self", "--registry", &reg.reference("ops/skill-operator"), "--tag", tag, "--plain-http"]));
    out.trim().to_string()
}

#[tokio::test]
async fn self_image_runs_version_alone_under_bwrap_and_is_deterministic() {
    if !have_tools("self_image_runs_version_alone_under_bwrap_and_is_deterministic", &["skopeo", "umoci", "bwrap"]) {
        return;
    }
    let reg = TestRegistry::start().await;
    let first = image_self(&reg, "v1");
    let (repo, digest) = first.split_once('@').expect("a pinned reference");
    assert_eq!(repo, reg.reference("ops/skill-operator"));
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{first}");
    assert_eq!(reg.digest_of("ops/skill-operator:v1").await, digest);
    // The same binary gives the same digest (a second, separate process).
    assert_eq!(image_self(&reg, "v2"), first);

    let cfg = skopeo_config(&first, "amd64");
    assert_eq!(cfg["config"]["User"], "65532:65532");
    assert_eq!(cfg["config"]["Entrypoint"], serde_json::json!(["/usr/local/bin/skill-operator"]));
    assert!(cfg["config"].get("Cmd").is_none_or(|c| c.is_null()));
    let m = skopeo_raw(&first);
    assert_eq!(m["layers"].as_array().unwrap().len(), 1, "one layer on an empty base");
    assert!(m["annotations"].get("org.opencontainers.image.base.digest").is_none(), "no base");

    let work = tempfile::tempdir().unwrap();
    let rootfs = pull_and_unpack(&first, "amd64", work.path());
    assert!(!rootfs.join("bin/sh").exists() && !rootfs.join("usr/bin/sh").exists() && !rootfs.join("bin").exists(), "no shell");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    assert!(std::fs::read_to_string(rootfs.join("etc/group")).unwrap().contains("nonroot:x:65532:"));
    assert_eq!(
        std::fs::read(rootfs.join("etc/ssl/certs/ca-certificates.crt")).unwrap(),
        std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap()
    );
    assert_eq!(
        std::fs::read(rootfs.join("usr/local/bin/skill-operator")).unwrap(),
        std::fs::read(BIN).unwrap(),
        "the binary byte for byte"
    );

    // Exactly: the binary, the loader, the libraries, CA bundle, passwd/group/nsswitch.
    let files: BTreeSet<String> = files_under(&rootfs).into_keys().collect();
    let mut want: BTreeSet<String> =
        loader_list(Path::new(BIN)).into_iter().map(|(image_path, _)| image_path.trim_start_matches('/').to_string()).collect();
    for f in ["usr/local/bin/skill-operator", "etc/ssl/certs/ca-certificates.crt", "etc/passwd", "etc/group", "etc/nsswitch.conf"] {
        want.insert(f.into());
    }
    assert_eq!(files, want);

    // Nothing else present: the rootfs is /, no host binds, as uid 65532.
    let out = Command::new("bwrap")
        .arg("--bind")
        .arg(&rootfs)
        .args([
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "65532",
            "--gid",
            "65532",
            "--die-with-parent",
            "--clearenv",
        ])
        .args(["/usr/local/bin/skill-operator", "--version"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("skill-operator {}", env!("CARGO_PKG_VERSION")));
    // And there really is no shell to fall back on.
    let sh = Command::new("bwrap")
        .arg("--bind")
        .arg(&rootfs)
        .args(["/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "/bin/sh", "-c", "true"])
        .output()
        .unwrap();
    assert!(!sh.status.success());
}

/// What the dynamic loader itself resolves for `bin` (`ld.so --list`):
/// (path as listed, canonical host path). The oracle for our ELF reading.
fn loader_list(bin: &Path) -> Vec<(String, PathBuf)> {
    let interp = skill_operator::image::self_image::elf_info(bin).unwrap().interpreter.unwrap();
    let out = run(Command::new(&interp).arg("--list").arg(bin).env_clear());
    let mut v = Vec::new();
    for line in out.lines() {
        let line = line.trim();
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = match line.split_once(" => ") {
            Some((_, rest)) => rest.split(" (").next().unwrap_or(""),
            None => line.split(" (").next().unwrap_or(""),
        };
        if path.starts_with('/') {
            v.push((path.to_string(), std::fs::canonicalize(path).unwrap()));
        }
    }
    v
}

#[test]
fn our_library_resolution_matches_the_dynamic_loader() {
    let bin = Path::new(BIN);
    let ours = skill_operator::image::self_image::resolve_libraries(bin, Path::new("/")).unwrap();
    let ours: BTreeSet<(String, PathBuf)> = ours.into_iter().map(|(p, h)| (p, std::fs::canonicalize(h).unwrap())).collect();
    let theirs: BTreeSet<(String, PathBuf)> = loader_list(bin).into_iter().collect();
    assert_eq!(ours, theirs);
}

/// `image self --archive FILE`: what it prints, and the file as the real
/// readers see it (skopeo's `oci-archive:` and `docker-archive:`
/// transports, the two formats containerd's and Docker's loaders read).
fn image_self_archive(out: &Path) -> (String, String) {
    let done = Command::new(BIN).args(["image", "self", "--archive"]).arg(out).output().unwrap();
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    (String::from_utf8_lossy(&done.stdout).trim().to_string(), String::from_utf8_lossy(&done.stderr).into_owned())
}

#[tokio::test]
async fn the_archive_holds_the_pushed_layer_under_a_local_tag_and_prints_its_helm_flags() {
    if !have_tools("the_archive_holds_the_pushed_layer_under_a_local_tag_and_prints_its_helm_flags", &["skopeo"]) {
        return;
    }
    let reg = TestRegistry::start().await;
    let pushed = image_self(&reg, "v1");
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("skill-operator.tar");
    let (flags, explained) = image_self_archive(&file);

    // The flags: the chart's repository, a tag no release uses, naming the archived image's digest.
    let tag = flags.split_whitespace().find_map(|w| w.strip_prefix("image.tag=")).expect("a tag flag").to_string();
    assert!(tag.starts_with(&format!("{}-local.", env!("CARGO_PKG_VERSION"))), "{tag}");
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!(
        flags,
        format!(
            "--set image.repository={} --set image.tag={tag} --set image.digest= --set image.pullPolicy=Never --set image.architecture={arch}",
            skill_operator::image::self_image::RELEASE_REPOSITORY
        )
    );
    for line in ["kind load image-archive", "k3d image import", "minikube image load", "ctr -n k8s.io images import"] {
        assert!(explained.contains(&format!("{line} {}", file.display())), "{line}: {explained}");
    }

    // The OCI side: the pushed image's layer, its config with one label more
    // (an image of its own: a kubelet that pulled the pushed one still runs
    // this under its own name), named by the digest in its tag.
    let name = format!("{}:{tag}", skill_operator::image::self_image::RELEASE_REPOSITORY);
    let oci = format!("oci-archive:{}:{tag}", file.display());
    let from_archive = run(Command::new("skopeo").args(["inspect", "--raw"]).arg(&oci));
    let raw: serde_json::Value = serde_json::from_str(&from_archive).unwrap();
    let pushed_raw = skopeo_raw(&pushed);
    assert_eq!(raw["layers"], pushed_raw["layers"], "the same layer");
    assert_ne!(raw["config"]["digest"], pushed_raw["config"]["digest"]);
    let archived_digest = sha256(from_archive.trim_end().as_bytes());
    assert!(tag.ends_with(&archived_digest["sha256:".len()..][..12]), "{tag} names {archived_digest}");
    let config = run(Command::new("skopeo").args(["inspect", "--config"]).arg(&oci));
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    let mut pushed_config = skopeo_config(&pushed, arch);
    assert_eq!(config["config"]["Labels"][skill_operator::image::self_image::LABEL_LOADED], "archive");
    config["config"]["Labels"].as_object_mut().unwrap().remove(skill_operator::image::self_image::LABEL_LOADED);
    for c in [&mut config, &mut pushed_config] {
        c.as_object_mut().unwrap().remove("created");
    }
    assert_eq!(config, pushed_config, "nothing else differs");
    // The Docker side: manifest.json names the image; the image copies out whole.
    let inspected = run(Command::new("skopeo").args(["inspect"]).arg(format!("docker-archive:{}", file.display())));
    let inspected: serde_json::Value = serde_json::from_str(&inspected).unwrap();
    assert_eq!(inspected["Architecture"], arch);
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("docker-archive:{}:{name}", file.display()))
        .arg(format!("docker://{}", reg.reference("ops/from-docker-archive:x"))));
    let copied = skopeo_config(&reg.reference("ops/from-docker-archive:x"), arch);
    assert_eq!(copied["config"]["User"], "65532:65532");

    // Deterministic: the same binary writes the same bytes.
    let again = work.path().join("again.tar");
    assert_eq!(image_self_archive(&again).0, flags);
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&file).unwrap());
}

#[test]
fn a_bad_archive_request_says_what_to_do_and_writes_nothing() {
    let work = tempfile::tempdir().unwrap();
    let missing = work.path().join("no-such-dir/out.tar");
    let done = Command::new(BIN).args(["image", "self", "--archive"]).arg(&missing).output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success());
    assert!(err.contains("cannot write the image archive") && err.contains("check that its directory exists"), "{err}");
    assert!(done.stdout.is_empty(), "no flags for an archive that was not written");
    // An existing file is left as it was when the write fails half way: a
    // directory in its place cannot be replaced.
    let dir_in_place = work.path().join("taken");
    std::fs::create_dir(&dir_in_place).unwrap();
    std::fs::write(dir_in_place.join("keep"), b"x").unwrap();
    let done = Command::new(BIN).args(["image", "self", "--archive"]).arg(&dir_in_place).output().unwrap();
    assert!(!done.status.success());
    assert_eq!(std::fs::read(dir_in_place.join("keep")).unwrap(), b"x");
    assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 1, "no temporary file left behind");
    // Push and archive are one or the other.
    let both = Command::new(BIN).args(["image", "self", "--archive", "x.tar", "--registry", "127.0.0.1:1/x"]).output().unwrap();
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"), "{}", String::from_utf8_lossy(&both.stderr));
    let neither = Command::new(BIN).args(["image", "self"]).output().unwrap();
    assert!(String::from_utf8_lossy(&neither.stderr).contains("--registry"), "{}", String::from_utf8_lossy(&neither.stderr));
}

/// The release pipeline's script against a real registry: image and chart
/// pushed, the chart pulled back pinning exactly the pushed digest, notes
/// naming both; a tag that is not the chart's version and a registry that
/// refuses stop it with what to do, and nothing of a stopped release is
/// pushed after the failure.
#[tokio::test]
async fn release_sh_publishes_the_image_and_a_chart_pinned_to_it() {
    let helm = concat!(env!("CARGO_MANIFEST_DIR"), "/target/test-deps/bin/helm");
    if !have_tools("release_sh_publishes_the_image_and_a_chart_pinned_to_it", &["skopeo", helm]) {
        return;
    }
    let reg = TestRegistry::start().await;
    let work = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/release.sh");
    let release = |registry: &str, out: &Path, tag: Option<&str>| {
        let mut cmd = Command::new("bash");
        cmd.arg(script).args(["--registry", registry, "--plain-http", "--out"]).arg(out).env("SKILL_OPERATOR_BIN", BIN).env("HELM", helm);
        match tag {
            Some(t) => cmd.env("RELEASE_TAG", t),
            None => cmd.env_remove("RELEASE_TAG"),
        };
        cmd.output().unwrap()
    };
    let registry = reg.reference("proj");
    let out = work.path().join("out");
    let done = release(&registry, &out, None);
    assert!(done.status.success(), "{}\n{}", String::from_utf8_lossy(&done.stdout), String::from_utf8_lossy(&done.stderr));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("release.json")).unwrap()).unwrap();
    let digest = r["imageDigest"].as_str().unwrap();
    assert_eq!(reg.digest_of(&format!("proj/skill-operator:{}", env!("CARGO_PKG_VERSION"))).await, digest);
    assert_eq!(image_self(&reg, "again").split_once('@').unwrap().1, digest, "the release's image is this binary's");
    assert!(r["sbomDigest"].as_str().unwrap().starts_with("sha256:"), "{r}");
    let notes = std::fs::read_to_string(out.join("release-notes.md")).unwrap();
    for want in [digest, r["chartDigest"].as_str().unwrap(), r["sbomDigest"].as_str().unwrap()] {
        assert!(notes.contains(want), "the notes lack {want}: {notes}");
    }
    // The chart as a user pulls it: its values pin the image, its render runs it.
    let pulled = work.path().join("pulled");
    let version = r["chartVersion"].as_str().unwrap();
    run(Command::new(helm)
        .args([
            "pull",
            &format!("oci://{registry}/charts/skill-operator"),
            "--version",
            version,
            "--plain-http",
            "--untar",
            "--destination",
        ])
        .arg(&pulled));
    let rendered = run(Command::new(helm).args(["template", "skills"]).arg(pulled.join("skill-operator")).args(["-n", "skill-operator"]));
    assert!(rendered.contains(&format!("--operator-image={registry}/skill-operator@{digest}")), "the pulled chart runs another image");
    assert!(rendered.contains(&format!("image: {registry}/skill-operator@{digest}")));

    // A tag that is not the chart's version: refused before anything is pushed.
    let before = reg.requests().await.iter().filter(|q| q.is_write()).count();
    let wrong = release(&reg.reference("other"), &work.path().join("wrong"), Some("v9.9.9"));
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("tag v9.9.9 does not match the chart version") && err.contains("bump charts/skill-operator/Chart.yaml"), "{err}");
    assert_eq!(reg.requests().await.iter().filter(|q| q.is_write()).count(), before, "nothing pushed");
    // A registry that is not there: the image push fails, no chart, no notes.
    let refused = release("127.0.0.1:9/nowhere", &work.path().join("refused"), None);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("pushing the image to 127.0.0.1:9/nowhere/skill-operator failed") && err.contains("nothing else was pushed"),
        "{err}"
    );
    let left: Vec<String> = std::fs::read_dir(work.path().join("refused"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(!left.iter().any(|f| f.ends_with(".tgz") || f.starts_with("release")), "a stopped release left {left:?}");
}
