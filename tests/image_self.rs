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
