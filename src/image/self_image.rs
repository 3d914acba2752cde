//! The operator's own image: the running binary on an empty base, with
//! exactly the shared libraries it links, the CA bundle, a minimal
//! `/etc/passwd`/`/etc/group` for uid/gid 65532 (`nonroot`), no shell, and
//! `User 65532:65532`, `Entrypoint ["/usr/local/bin/skill-operator"]`.
//!
//! # Which libraries (decision)
//! We read the ELF ourselves (`object`): `PT_INTERP` (the dynamic loader)
//! and `DT_NEEDED`, transitively, each name resolved the way glibc's
//! loader does for a process with a clean environment: `DT_RPATH` (only
//! without `DT_RUNPATH`), `DT_RUNPATH` (`$ORIGIN` expanded),
//! `/etc/ld.so.cache` (its baseline entries, never the `glibc-hwcaps`
//! ones: those are picked per CPU, and the image must run on every CPU of
//! its architecture), then the default directories. Candidates must match
//! the binary's ELF class and machine. Why not run `ld.so --list` on the
//! binary: it executes the host's loader (it may not even exist where
//! this runs, e.g. inside the operator image, which has no ldd), it
//! follows `LD_LIBRARY_PATH` and hwcaps of this CPU, and its output format
//! is not an interface. The test compares our answer with the loader's.
//!
//! Each file is stored as a regular file at the path the loader will look
//! for (the `PT_INTERP` path, the resolved library paths), content read
//! through any host symlinks; no symlinks in the image.
//!
//! # Determinism
//! The same binary, libraries and CA bundle give the same digest: the
//! layer is deterministic ([`super::layer`]) and the config has no clock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{Dyn, FileHeader, ProgramHeader};
use object::{Endianness, FileKind, ReadCache, ReadRef};

use super::archive::Archived;
use super::base::resolve_empty;
use super::base::{BaseSpec, Platform};
use super::compose::{compose, documents, ComposeSpec, Composed, ConfigPatch, SbomInput};
use super::error::{blocking, ImageError, Result};
use super::layer::{Layer, LayerOptions, LayerTree, Source};
use super::limits::{DEFAULT_USER, MAX_LD_CACHE_BYTES, MAX_SHARED_LIBS, NONROOT_ID};
use super::remote::Remote;

/// Where the project publishes the operator image (the chart's default
/// `image.repository`; tests/chart checks the two agree).
pub const RELEASE_REPOSITORY: &str = "ghcr.io/skill-operator/skill-operator";
/// Where the project publishes the chart, as an OCI artifact.
pub const RELEASE_CHART: &str = "oci://ghcr.io/skill-operator/charts/skill-operator";

/// The config label that sets an archive's image apart from the pushed one.
pub const LABEL_LOADED: &str = "dev.skill-operator.image.loaded";

/// Where the binary goes in the image.
pub const BINARY_PATH: &str = "/usr/local/bin/skill-operator";
/// The CA bundle path (Debian's, which rustls-native-certs and OpenSSL read).
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What goes into the operator image.
#[derive(Debug, Clone)]
pub struct SelfImageOptions {
    /// The binary ([`std::env::current_exe`] by default).
    pub binary: PathBuf,
    /// The CA bundle to copy to [`CA_BUNDLE`].
    pub ca_bundle: PathBuf,
    /// Host root the libraries are looked up in (`/`; a sysroot for tests).
    pub root: PathBuf,
    pub layer: LayerOptions,
}

impl SelfImageOptions {
    pub fn current() -> Result<Self> {
        let binary = std::env::current_exe().map_err(|e| ImageError::read("/proc/self/exe", e))?;
        Ok(SelfImageOptions { binary, ca_bundle: CA_BUNDLE.into(), root: "/".into(), layer: LayerOptions::default() })
    }
}

/// An ELF file's loader needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfInfo {
    pub class64: bool,
    pub machine: u16,
    pub interpreter: Option<String>,
    pub needed: Vec<String>,
    pub rpath: Vec<String>,
    pub runpath: Vec<String>,
}

/// Reads `PT_INTERP`, `DT_NEEDED`, `DT_RPATH` and `DT_RUNPATH` without
/// reading the whole file (a debug build is hundreds of MiB).
pub fn elf_info(path: &Path) -> Result<ElfInfo> {
    let f = fs::File::open(path).map_err(|e| ImageError::read(path, e))?;
    let cache = ReadCache::new(f);
    let bad = |detail: String| ImageError::Elf { path: path.into(), detail };
    match FileKind::parse(&cache).map_err(|e| bad(e.to_string()))? {
        FileKind::Elf64 => parse_elf::<elf::FileHeader64<Endianness>, _>(&cache, true).map_err(|e| bad(e.to_string())),
        FileKind::Elf32 => parse_elf::<elf::FileHeader32<Endianness>, _>(&cache, false).map_err(|e| bad(e.to_string())),
        other => Err(bad(format!("not an ELF file ({other:?})"))),
    }
}

fn parse_elf<'data, H: FileHeader<Endian = Endianness>, R: ReadRef<'data>>(data: R, class64: bool) -> object::Result<ElfInfo> {
    let header = H::parse(data)?;
    let endian = header.endian()?;
    let mut interpreter = None;
    for ph in header.program_headers(endian, data)? {
        if let Some(i) = ph.interpreter(endian, data)? {
            interpreter = Some(String::from_utf8_lossy(i).into_owned());
        }
    }
    let sections = header.sections(endian, data)?;
    let mut needed = Vec::new();
    let mut rpath = Vec::new();
    let mut runpath = Vec::new();
    if let Some((dynamic, link)) = sections.dynamic(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        for d in dynamic {
            let tag = d.tag(endian);
            if tag == elf::DT_NULL {
                break;
            }
            let s = || d.string(endian, strings).map(|s| String::from_utf8_lossy(s).into_owned());
            match tag {
                elf::DT_NEEDED => needed.push(s()?),
                elf::DT_RPATH => rpath.extend(s()?.split(':').filter(|p| !p.is_empty()).map(str::to_string)),
                elf::DT_RUNPATH => runpath.extend(s()?.split(':').filter(|p| !p.is_empty()).map(str::to_string)),
                _ => {}
            }
        }
    }
    Ok(ElfInfo { class64, machine: header.e_machine(endian), interpreter, needed, rpath, runpath })
}

/// glibc's multiarch triplet and ld.so.cache "required" flags per machine.
fn arch_of(machine: u16, class64: bool) -> Option<(&'static str, i32)> {
    Some(match (machine, class64) {
        (elf::EM_X86_64, true) => ("x86_64-linux-gnu", 0x0303),
        (elf::EM_AARCH64, true) => ("aarch64-linux-gnu", 0x0a03),
        (elf::EM_RISCV, true) => ("riscv64-linux-gnu", 0x1003),
        (elf::EM_PPC64, true) => ("powerpc64le-linux-gnu", 0x0503),
        (elf::EM_S390, true) => ("s390x-linux-gnu", 0x0403),
        (elf::EM_386, false) => ("i386-linux-gnu", 0x0003),
        (elf::EM_ARM, false) => ("arm-linux-gnueabihf", 0x0903),
        _ => return None,
    })
}

/// Entries of `/etc/ld.so.cache` (format `glibc-ld.so.cache1.1`): soname
/// → paths in cache order, for one flags value, baseline (hwcap 0) only.
fn read_ld_cache(root: &Path, flags: i32) -> BTreeMap<String, Vec<String>> {
    let path = root.join("etc/ld.so.cache");
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let Ok(meta) = fs::metadata(&path) else { return out };
    if meta.len() > MAX_LD_CACHE_BYTES {
        return out;
    }
    let Ok(data) = fs::read(&path) else { return out };
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    // A new-format cache may follow an old-format one ("ld.so-1.7.0").
    let Some(start) = data.windows(MAGIC.len()).position(|w| w == MAGIC) else { return out };
    let d = &data[start..];
    let u32_at = |o: usize| d.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let Some(nlibs) = u32_at(20) else { return out };
    const HEADER: usize = 48;
    const ENTRY: usize = 24;
    let string = |off: u32| -> Option<String> {
        let s = d.get(off as usize..)?;
        let end = s.iter().position(|&b| b == 0)?;
        String::from_utf8(s[..end].to_vec()).ok()
    };
    for i in 0..nlibs as usize {
        let o = HEADER + i * ENTRY;
        let (Some(f), Some(key), Some(value)) = (u32_at(o), u32_at(o + 4), u32_at(o + 8)) else { break };
        let hwcap = d.get(o + 16..o + 24).map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]));
        if f as i32 != flags || hwcap != Some(0) {
            continue;
        }
        if let (Some(k), Some(v)) = (string(key), string(value)) {
            out.entry(k).or_default().push(v);
        }
    }
    out
}

/// The files the loader needs for `binary`: (path in the image, host path).
/// The binary itself is not included.
pub fn resolve_libraries(binary: &Path, root: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let top = elf_info(binary)?;
    let mut files = BTreeMap::new();
    if top.interpreter.is_none() && top.needed.is_empty() {
        return Ok(files); // static
    }
    let (triplet, cache_flags) = arch_of(top.machine, top.class64)
        .ok_or_else(|| ImageError::Elf { path: binary.into(), detail: format!("unsupported machine {}", top.machine) })?;
    if let Some(interp) = &top.interpreter {
        files.insert(interp.clone(), host_path(root, interp));
    }
    let cache = read_ld_cache(root, cache_flags);
    let lib64 = if top.class64 { vec!["/lib64", "/usr/lib64"] } else { vec![] };
    let defaults: Vec<String> = [format!("/lib/{triplet}"), format!("/usr/lib/{triplet}")]
        .into_iter()
        .chain(lib64.into_iter().map(String::from))
        .chain(["/lib".into(), "/usr/lib".into()])
        .collect();

    let interp_name = top.interpreter.as_deref().and_then(|i| i.rsplit('/').next()).map(str::to_string);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut queue: VecDeque<(String, ElfInfo, String)> = VecDeque::new();
    queue.push_back((binary.display().to_string(), top.clone(), "/usr/local/bin".into()));
    while let Some((who, info, origin)) = queue.pop_front() {
        for name in &info.needed {
            // libc names the loader (`ld-linux-x86-64.so.2`): the loader
            // already in memory satisfies it by soname, as glibc does.
            if interp_name.as_deref() == Some(name.as_str()) || !seen.insert(name.clone()) {
                continue;
            }
            if seen.len() > MAX_SHARED_LIBS {
                return Err(ImageError::Elf { path: binary.into(), detail: format!("more than {MAX_SHARED_LIBS} shared libraries") });
            }
            let mut searched = Vec::new();
            let found = find_library(name, &info, &origin, &cache, &defaults, root, &top, &mut searched)?;
            let Some((image_path, host)) = found else {
                return Err(ImageError::LibraryNotFound { name: name.clone(), needed_by: who.clone(), searched: searched.join(", ") });
            };
            let lib_info = elf_info(&host)?;
            let lib_origin = Path::new(&image_path).parent().map(|p| p.display().to_string()).unwrap_or_else(|| "/".into());
            files.insert(image_path.clone(), host);
            queue.push_back((image_path, lib_info, lib_origin));
        }
    }
    Ok(files)
}

fn host_path(root: &Path, image_path: &str) -> PathBuf {
    root.join(image_path.trim_start_matches('/'))
}

#[allow(clippy::too_many_arguments)]
fn find_library(
    name: &str,
    needer: &ElfInfo,
    origin: &str,
    cache: &BTreeMap<String, Vec<String>>,
    defaults: &[String],
    root: &Path,
    top: &ElfInfo,
    searched: &mut Vec<String>,
) -> Result<Option<(String, PathBuf)>> {
    let matches = |image_path: &str, searched: &mut Vec<String>| -> Option<(String, PathBuf)> {
        searched.push(image_path.to_string());
        let host = host_path(root, image_path);
        match elf_info(&host) {
            Ok(i) if i.class64 == top.class64 && i.machine == top.machine => Some((image_path.to_string(), host)),
            _ => None,
        }
    };
    if name.contains('/') {
        return Ok(matches(name, searched));
    }
    let expand = |dir: &str| dir.replace("$ORIGIN", origin).replace("${ORIGIN}", origin);
    let dirs_rpath: Vec<String> = if needer.runpath.is_empty() { needer.rpath.iter().map(|d| expand(d)).collect() } else { Vec::new() };
    let dirs_runpath: Vec<String> = needer.runpath.iter().map(|d| expand(d)).collect();
    for dir in dirs_rpath.iter().chain(&dirs_runpath) {
        if let Some(hit) = matches(&format!("{}/{name}", dir.trim_end_matches('/')), searched) {
            return Ok(Some(hit));
        }
    }
    for p in cache.get(name).into_iter().flatten() {
        if let Some(hit) = matches(p, searched) {
            return Ok(Some(hit));
        }
    }
    for dir in defaults {
        if let Some(hit) = matches(&format!("{dir}/{name}"), searched) {
            return Ok(Some(hit));
        }
    }
    Ok(None)
}

fn machine_platform(info: &ElfInfo) -> Platform {
    let arch = match info.machine {
        elf::EM_X86_64 => "amd64",
        elf::EM_AARCH64 => "arm64",
        elf::EM_RISCV => "riscv64",
        elf::EM_PPC64 => "ppc64le",
        elf::EM_S390 => "s390x",
        elf::EM_386 => "386",
        elf::EM_ARM => "arm",
        _ => return Platform::host(),
    };
    Platform::linux(arch)
}

/// The operator image's one layer and its platform (blocking).
pub fn self_layer(opts: &SelfImageOptions) -> Result<(Layer, Platform)> {
    let info = elf_info(&opts.binary)?;
    let libs = resolve_libraries(&opts.binary, &opts.root)?;
    let mut tree = LayerTree::new();
    tree.insert(BINARY_PATH, Source::File { path: opts.binary.clone(), executable: true })?;
    for (image_path, host) in &libs {
        let host = fs::canonicalize(host).map_err(|e| ImageError::read(host, e))?;
        tree.insert(image_path, Source::File { path: host, executable: true })?;
    }
    let ca = fs::canonicalize(&opts.ca_bundle).map_err(|e| ImageError::read(&opts.ca_bundle, e))?;
    tree.insert(CA_BUNDLE, Source::File { path: ca, executable: false })?;
    let id = NONROOT_ID;
    let passwd = format!("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{id}:{id}:nonroot:/home/nonroot:/sbin/nologin\n");
    let group = format!("root:x:0:\nnonroot:x:{id}:\n");
    tree.insert("etc/passwd", Source::Bytes { data: passwd.into_bytes(), executable: false })?;
    tree.insert("etc/group", Source::Bytes { data: group.into_bytes(), executable: false })?;
    // glibc's resolver reads this; without it, it falls back to the same
    // "files dns" but distroless ships it, and so do we.
    tree.insert("etc/nsswitch.conf", Source::Bytes { data: b"hosts: files dns\n".to_vec(), executable: false })?;
    let layer = tree.write("skill-operator image self: the binary, its shared libraries, CA certificates, passwd", &opts.layer)?;
    Ok((layer, machine_platform(&info)))
}

/// Builds and pushes the operator image to `repository` (optionally
/// tagged); returns what [`compose`] returns.
pub async fn push_self(remote: &Remote, repository: &str, tag: Option<&str>, opts: SelfImageOptions) -> Result<Composed> {
    let (layer, platform) = blocking(move || self_layer(&opts)).await?;
    let mut spec = self_spec(&layer, platform, repository);
    spec.tag = tag.map(str::to_string);
    spec.sbom = Some(SbomInput::default());
    compose(remote, &spec).await
}

/// Writes the operator image to the archive `out` (blocking), named
/// `repository:<version>-local.<12 hex of its digest>`: a tag no release
/// uses, so a loaded archive never stands in for a published image of the
/// same version, and two different builds never share a tag.
///
/// Its layer is the pushed image's; its config carries one label more
/// ([`LABEL_LOADED`]), so it is an image of its own. Why (decision): since
/// Kubernetes 1.35 the kubelet records which image names each image was
/// pulled under, and an image it once pulled (the same binary pushed to a
/// registry) is not run under another name with `imagePullPolicy: Never`
/// ("not present"); an image no kubelet ever pulled counts as preloaded.
pub fn archive_self(repository: &str, opts: &SelfImageOptions, out: &Path) -> Result<Archived> {
    let (layer, platform) = self_layer(opts)?;
    let resolved = resolve_empty(&platform);
    let mut spec = self_spec(&layer, platform, repository);
    spec.config.labels.insert(LABEL_LOADED.to_string(), "archive".to_string());
    let docs = documents(&spec, &resolved)?;
    let digest = docs.first().map(|d| d.manifest_digest.clone()).ok_or_else(|| ImageError::invalid("no image was composed"))?;
    spec.tag = Some(local_tag(&digest));
    super::archive::write(&spec, out)
}

/// The tag [`archive_self`] gives an image of `digest`.
pub fn local_tag(digest: &str) -> String {
    let hex = digest.trim_start_matches("sha256:");
    format!("{}-local.{}", env!("CARGO_PKG_VERSION"), &hex[..hex.len().min(12)])
}

/// The operator image on the empty base: one layer, non-root, the binary
/// as its entrypoint. Push and archive share it, so they make one image.
fn self_spec<'a>(layer: &'a Layer, platform: Platform, repository: &str) -> ComposeSpec<'a> {
    let mut spec = ComposeSpec::new(BaseSpec::Empty { platform: platform.clone() }, repository);
    spec.platforms = vec![platform];
    spec.layers = vec![layer];
    spec.config = ConfigPatch {
        user: DEFAULT_USER.into(),
        working_dir: Some("/".into()),
        env: vec![("PATH".into(), "/usr/local/bin".into()), ("SSL_CERT_FILE".into(), CA_BUNDLE.into())],
        labels: BTreeMap::from([
            ("org.opencontainers.image.title".to_string(), "skill-operator".to_string()),
            ("org.opencontainers.image.version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ]),
        entrypoint: Some(vec![BINARY_PATH.into()]),
        cmd: None,
    };
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_elf() {
        let exe = std::env::current_exe().unwrap();
        let info = elf_info(&exe).unwrap();
        assert!(info.needed.iter().any(|n| n.starts_with("libc.so")), "{info:?}");
        assert!(info.interpreter.is_some());
        let libs = resolve_libraries(&exe, Path::new("/")).unwrap();
        assert!(libs.keys().any(|k| k.ends_with("/libc.so.6")), "{libs:?}");
        assert!(libs.contains_key(info.interpreter.as_deref().unwrap()));
    }

    #[test]
    fn the_charts_default_image_is_the_release_repository() {
        let values = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/charts/skill-operator/values.yaml")).unwrap();
        let values: serde_json::Value = serde_norway::from_str(&values).unwrap();
        assert_eq!(values["image"]["repository"], RELEASE_REPOSITORY);
        let chart = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/charts/skill-operator/Chart.yaml")).unwrap();
        let chart: serde_json::Value = serde_norway::from_str(&chart).unwrap();
        assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"), "the chart runs the image of this version");
        assert_eq!(local_tag("sha256:0123456789abcdef"), format!("{}-local.0123456789ab", env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn reads_the_hosts_ld_so_cache() {
        if !Path::new("/etc/ld.so.cache").exists() || std::env::consts::ARCH != "x86_64" {
            return;
        }
        let cache = read_ld_cache(Path::new("/"), 0x0303);
        let libc = cache.get("libc.so.6").expect("libc.so.6 in /etc/ld.so.cache");
        assert!(libc[0].ends_with("/libc.so.6"), "{libc:?}");
    }
}
