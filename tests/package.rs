//! `core::package`: determinism, ZIP and tar safety, caps at their edges.

#[path = "oci/common.rs"]
mod common;

use std::io::{Cursor, Read, Write};
use std::path::Path;

use common::{set_mode, skill_dir};
use skill_operator::core::package::{self, Limits, PackageError, MAX_FILES, MAX_FILE_BYTES, MAX_TOTAL_BYTES};
use zip::write::SimpleFileOptions;
use zip::CompressionMethod;

const MIB: usize = 1024 * 1024;

fn sha(b: &[u8]) -> String {
    package::digest(b)
}

fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

fn walk_set_times_and_owner(p: &Path) {
    for e in std::fs::read_dir(p).unwrap() {
        let e = e.unwrap();
        let f = std::fs::File::open(e.path()).unwrap();
        f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_234_567_890)).unwrap();
        std::os::unix::fs::chown(e.path(), Some(1000), Some(1000)).unwrap();
        if e.file_type().unwrap().is_dir() {
            walk_set_times_and_owner(&e.path());
        }
    }
}

struct ZipSpec<'a> {
    name: &'a str,
    data: &'a [u8],
    method: CompressionMethod,
    mode: u32,
}

fn file<'a>(name: &'a str, data: &'a [u8]) -> ZipSpec<'a> {
    ZipSpec { name, data, method: CompressionMethod::Deflated, mode: 0o644 }
}

fn stored<'a>(name: &'a str, data: &'a [u8]) -> ZipSpec<'a> {
    ZipSpec { name, data, method: CompressionMethod::Stored, mode: 0o644 }
}

fn make_zip(entries: &[ZipSpec<'_>]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for e in entries {
        let opts =
            SimpleFileOptions::default().compression_method(e.method).unix_permissions(e.mode).large_file(e.data.len() > 0xffff_0000);
        if e.name.ends_with('/') {
            w.add_directory(e.name, opts).unwrap();
        } else {
            w.start_file(e.name, opts).unwrap();
            w.write_all(e.data).unwrap();
        }
    }
    w.finish().unwrap().into_inner()
}

const SKILL: &[u8] = b"---\nname: z\ndescription: d\n---\nbody\n";

// ---------------------------------------------------------------- determinism

#[test]
fn same_input_gives_identical_bytes() {
    let d = skill_dir("det");
    let a = package::build_from_dir(d.path()).unwrap();
    let b = package::build_from_dir(d.path()).unwrap();
    assert_eq!(sha(&a), sha(&b));

    // A copy with other mtimes and owners, made in another order.
    let copy = tempfile::tempdir().unwrap();
    copy_tree(d.path(), copy.path());
    set_mode(&copy.path().join("scripts/run.sh"), 0o700); // still executable
    set_mode(&copy.path().join("reference.txt"), 0o600); // still not
    walk_set_times_and_owner(copy.path());
    let c = package::build_from_dir(copy.path()).unwrap();
    assert_eq!(sha(&a), sha(&c));

    // The same tree as a ZIP gives the same package.
    let mut entries = vec![];
    let skill_md = std::fs::read(d.path().join("SKILL.md")).unwrap();
    let run = std::fs::read(d.path().join("scripts/run.sh")).unwrap();
    let refr = std::fs::read(d.path().join("reference.txt")).unwrap();
    entries.push(file("reference.txt", &refr));
    entries.push(ZipSpec { mode: 0o755, ..file("scripts/run.sh", &run) });
    entries.push(file("SKILL.md", &skill_md));
    let z = package::build_from_zip(&make_zip(&entries), None).unwrap();
    assert_eq!(sha(&a), sha(&z));

    // Re-packing our own output is the identity.
    assert_eq!(package::build_from_tarball(&a, &Limits::DEFAULT).unwrap(), a);
}

#[test]
fn archive_headers_are_normalised() {
    let d = skill_dir("hdr");
    std::fs::create_dir(d.path().join("empty")).unwrap();
    set_mode(&d.path().join("reference.txt"), 0o4777 & !0o111 | 0o4000); // setuid, group/other write
    let long = "a".repeat(120);
    std::fs::write(d.path().join(&long), "long name").unwrap();
    let pkg = package::build_from_dir(d.path()).unwrap();
    // gzip header: magic, deflate, no flags, mtime 0, xfl 0, OS unknown.
    assert_eq!(&pkg[..10], &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);

    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(&pkg[..]));
    let mut seen = vec![];
    for e in ar.entries().unwrap() {
        let e = e.unwrap();
        let h = e.header();
        assert_eq!(h.mtime().unwrap(), 0);
        assert_eq!(h.uid().unwrap(), 0);
        assert_eq!(h.gid().unwrap(), 0);
        assert_eq!(h.username_bytes().unwrap_or(b""), b"");
        assert_eq!(h.groupname_bytes().unwrap_or(b""), b"");
        let p = String::from_utf8(e.path_bytes().into_owned()).unwrap();
        let mode = h.mode().unwrap();
        match p.as_str() {
            "empty/" | "scripts/" => assert_eq!(mode, 0o755),
            "scripts/run.sh" => assert_eq!(mode, 0o755),
            _ => assert_eq!(mode, 0o644, "{p}"),
        }
        seen.push(p);
    }
    assert_eq!(seen, vec!["SKILL.md", &long, "empty/", "reference.txt", "scripts/", "scripts/run.sh"]);
}

#[test]
fn unpack_round_trip_and_manifest() {
    let d = skill_dir("rt");
    std::fs::create_dir(d.path().join("empty")).unwrap();
    let pkg = package::build_from_dir(d.path()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let listing = package::unpack(&pkg, out.path()).unwrap();
    assert_eq!(listing, package::manifest(&pkg).unwrap());
    assert_eq!(listing.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["SKILL.md", "reference.txt", "scripts/run.sh"]);
    for f in &listing {
        let data = std::fs::read(out.path().join(&f.path)).unwrap();
        assert_eq!(data, std::fs::read(d.path().join(&f.path)).unwrap());
        assert_eq!(format!("sha256:{}", f.sha256), sha(&data));
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| std::fs::metadata(out.path().join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("scripts/run.sh"), 0o755);
    assert_eq!(mode("SKILL.md"), 0o644);
    assert_eq!(mode("empty"), 0o755);
    assert!(listing.iter().find(|f| f.path == "scripts/run.sh").unwrap().executable);

    // Into a path that does not exist yet: created; removed again on failure.
    let parent = tempfile::tempdir().unwrap();
    let fresh = parent.path().join("fresh");
    assert_eq!(package::unpack(&pkg, &fresh).unwrap(), listing);
    let broken = &pkg[..pkg.len() / 2];
    let gone = parent.path().join("gone");
    assert!(package::unpack(broken, &gone).is_err());
    assert!(!gone.exists());

    // Not into a non-empty directory.
    let err = package::unpack(&pkg, out.path()).unwrap_err();
    assert!(matches!(err, PackageError::DestinationNotEmpty { .. }), "{err}");
}

// ------------------------------------------------------------ directory input

#[test]
fn dir_refuses_symlinks_special_files_and_missing_skill_md() {
    let d = skill_dir("bad");
    std::os::unix::fs::symlink("/etc/passwd", d.path().join("scripts/link")).unwrap();
    let err = package::build_from_dir(d.path()).unwrap_err();
    assert!(matches!(&err, PackageError::Symlink { path } if path == "scripts/link"), "{err}");
    assert!(err.to_string().contains("scripts/link"));
    std::fs::remove_file(d.path().join("scripts/link")).unwrap();

    let fifo = d.path().join("pipe");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let err = package::build_from_dir(d.path()).unwrap_err();
    assert!(matches!(&err, PackageError::SpecialFile { path, kind: "FIFO" } if path == "pipe"), "{err}");
    std::fs::remove_file(&fifo).unwrap();

    std::fs::create_dir(d.path().join(".git")).unwrap();
    std::fs::write(d.path().join(".git/HEAD"), "ref").unwrap();
    std::fs::write(d.path().join(".hidden"), "kept").unwrap();
    let files = package::manifest(&package::build_from_dir(d.path()).unwrap()).unwrap();
    assert!(files.iter().any(|f| f.path == ".hidden"));
    assert!(!files.iter().any(|f| f.path.starts_with(".git/")));

    std::fs::remove_file(d.path().join("SKILL.md")).unwrap();
    let err = package::build_from_dir(d.path()).unwrap_err();
    assert!(matches!(err, PackageError::MissingSkillMd { .. }), "{err}");
}

/// `café` as one code point (NFC) and as `e` + a combining acute (NFD).
const CAFE_NFC: &str = "caf\u{e9}.txt";
const CAFE_NFD: &str = "cafe\u{301}.txt";

/// The duplicate names both spellings, which print the same, as code points.
fn assert_unicode_duplicate(err: &PackageError) {
    assert!(matches!(err, PackageError::DuplicatePath { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("caf\\u{00e9}.txt") && text.contains("cafe\\u{0301}.txt"), "both spellings shown: {text}");
}

#[test]
fn dir_refuses_unicode_equivalent_names() {
    let d = skill_dir("nfc");
    std::fs::write(d.path().join(CAFE_NFC), "one").unwrap();
    // ext4 keeps both: the names differ byte for byte.
    package::build_from_dir(d.path()).unwrap();
    std::fs::write(d.path().join(CAFE_NFD), "two").unwrap();
    assert_unicode_duplicate(&package::build_from_dir(d.path()).unwrap_err());
    // A directory in two spellings collides the same way.
    std::fs::remove_file(d.path().join(CAFE_NFD)).unwrap();
    std::fs::create_dir(d.path().join("r\u{e9}sum\u{e9}")).unwrap();
    std::fs::write(d.path().join("r\u{e9}sum\u{e9}/a"), "a").unwrap();
    std::fs::create_dir(d.path().join("re\u{301}sume\u{301}")).unwrap();
    std::fs::write(d.path().join("re\u{301}sume\u{301}/b"), "b").unwrap();
    let err = package::build_from_dir(d.path()).unwrap_err();
    assert!(matches!(err, PackageError::DuplicatePath { .. }), "{err}");
    // Case and spelling together.
    std::fs::remove_dir_all(d.path().join("re\u{301}sume\u{301}")).unwrap();
    std::fs::write(d.path().join("CAFE\u{301}.TXT"), "three").unwrap();
    assert!(matches!(package::build_from_dir(d.path()).unwrap_err(), PackageError::DuplicatePath { .. }));
}

#[test]
fn zip_refuses_unicode_equivalent_names() {
    let z = make_zip(&[file("SKILL.md", SKILL), file(CAFE_NFC, b"1")]);
    package::build_from_zip(&z, None).unwrap();
    let z = make_zip(&[file("SKILL.md", SKILL), file(CAFE_NFC, b"1"), file(CAFE_NFD, b"2")]);
    let err = package::build_from_zip(&z, None).unwrap_err();
    assert_unicode_duplicate(&err);
    assert!(matches!(&err, PackageError::DuplicatePath { path, existing } if path == CAFE_NFD && existing == CAFE_NFC), "{err}");
    // The check on a job's file set (inputs, outputs) is the same rule.
    let lim = package::Limits::DEFAULT;
    assert_unicode_duplicate(&package::check_file_set([(CAFE_NFC, 1), (CAFE_NFD, 1)], &lim).unwrap_err());
}

// ------------------------------------------------------------------ ZIP input

#[test]
fn zip_refuses_unsafe_names() {
    for (name, what) in [
        ("../evil.sh", "traversal"),
        ("a/../../evil.sh", "traversal"),
        ("./a.txt", "dot"),
        ("/etc/passwd", "absolute"),
        ("a\\b.txt", "backslash"),
        ("C:/x.txt", "drive"),
        ("c:x.txt", "drive"),
        ("a//b.txt", "empty"),
        ("a\u{1}b", "control"),
    ] {
        let z = make_zip(&[file("SKILL.md", SKILL), file(name, b"x")]);
        let err = package::build_from_zip(&z, None).unwrap_err();
        assert!(matches!(err, PackageError::UnsafePath { .. }), "{what}: {name:?} gave {err}");
    }
    let long = "a/".repeat(16) + &"b".repeat(1000);
    let z = make_zip(&[file("SKILL.md", SKILL), file(&long, b"x")]);
    assert!(matches!(package::build_from_zip(&z, None).unwrap_err(), PackageError::PathTooLong { .. }));
    let deep = "d/".repeat(32) + "f";
    let z = make_zip(&[file("SKILL.md", SKILL), file(&deep, b"x")]);
    assert!(matches!(package::build_from_zip(&z, None).unwrap_err(), PackageError::TooDeep { .. }));
    let ok_depth = "d/".repeat(31) + "f";
    let z = make_zip(&[file("SKILL.md", SKILL), file(&ok_depth, b"x")]);
    package::build_from_zip(&z, None).unwrap();
}

#[test]
fn zip_refuses_duplicates_symlinks_and_overlaps() {
    // Exact duplicate: the writer refuses one, so rename b.txt to a.txt.
    let z = make_zip(&[file("SKILL.md", SKILL), file("a.txt", b"1"), file("b.txt", b"2")]);
    let z = replace_all(&z, b"b.txt", b"a.txt");
    let err = package::build_from_zip(&z, None).unwrap_err();
    assert!(matches!(err, PackageError::DuplicateZipNames), "{err}");

    // Case variants would collide on macOS/Windows.
    let z = make_zip(&[file("SKILL.md", SKILL), file("Read.md", b"1"), file("read.md", b"2")]);
    let err = package::build_from_zip(&z, None).unwrap_err();
    assert!(matches!(&err, PackageError::DuplicatePath { path, existing } if path == "read.md" && existing == "Read.md"), "{err}");

    // A path used as a file and as a directory.
    let z = make_zip(&[file("SKILL.md", SKILL), file("a", b"1"), file("a/b", b"2")]);
    assert!(matches!(package::build_from_zip(&z, None).unwrap_err(), PackageError::DuplicatePath { .. }));

    // Symlink entry (unix mode in the external attributes).
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    w.start_file("SKILL.md", SimpleFileOptions::default()).unwrap();
    w.write_all(SKILL).unwrap();
    w.add_symlink("link", "/etc/passwd", SimpleFileOptions::default()).unwrap();
    let z = w.finish().unwrap().into_inner();
    let err = package::build_from_zip(&z, None).unwrap_err();
    assert!(matches!(&err, PackageError::Symlink { path } if path == "link"), "{err}");

    // Overlapping entries (two central records pointing at one local entry).
    let z = make_zip(&[file("SKILL.md", SKILL), stored("a.txt", &[b'x'; 100]), stored("b.txt", &[b'y'; 100])]);
    let z = point_central_entry_at(&z, 2, 1);
    let err = package::build_from_zip(&z, None).unwrap_err();
    assert!(matches!(err, PackageError::OverlappingZipEntries { .. } | PackageError::InvalidZip { .. }), "{err}");
}

#[test]
fn zip_subfolder_rule() {
    let z = make_zip(&[
        file("README.md", b"outside"),
        file("skills/one/SKILL.md", SKILL),
        file("skills/one/run.py", b"print(1)"),
        file("__MACOSX/skills/one/._run.py", b"junk"),
    ]);
    let err = package::build_from_zip(&z, None).unwrap_err();
    match &err {
        PackageError::MissingSkillMd { found_in } => assert_eq!(found_in, &["skills/one"]),
        e => panic!("{e}"),
    }
    assert!(err.to_string().contains("--path"), "{err}");
    let pkg = package::build_from_zip(&z, Some("skills/one")).unwrap();
    let paths: Vec<_> = package::manifest(&pkg).unwrap().into_iter().map(|f| f.path).collect();
    assert_eq!(paths, ["SKILL.md", "run.py"]);
    assert_eq!(pkg, package::build_from_zip(&z, Some("/skills/one/")).unwrap());
    let err = package::build_from_zip(&z, Some("skills/two")).unwrap_err();
    assert!(matches!(err, PackageError::SubfolderNotFound { .. }), "{err}");
    let err = package::build_from_zip(&z, Some("../skills")).unwrap_err();
    assert!(matches!(err, PackageError::UnsafePath { .. }), "{err}");
}

#[test]
fn zip_file_cap_at_edge_and_lying_header() {
    let at = vec![7u8; MAX_FILE_BYTES as usize];
    let z = make_zip(&[file("SKILL.md", SKILL), stored("big.bin", &at)]);
    let pkg = package::build_from_zip(&z, None).unwrap();
    assert_eq!(package::manifest(&pkg).unwrap().iter().find(|f| f.path == "big.bin").unwrap().size, MAX_FILE_BYTES);

    let over = vec![7u8; MAX_FILE_BYTES as usize + 1];
    let z = make_zip(&[file("SKILL.md", SKILL), stored("big.bin", &over)]);
    let err = package::build_from_zip(&z, None).unwrap_err();
    assert!(matches!(&err, PackageError::FileTooLarge { path, .. } if path == "big.bin"), "{err}");

    // Headers that claim 10 bytes for a 33 MiB deflated entry: never
    // trusted. The zip crate already stops at the declared size
    // (InvalidZip); our own count of inflated bytes is the second line.
    let data: Vec<u8> = (0..MAX_FILE_BYTES as usize + MIB).map(|i| (i % 251) as u8).collect();
    let z = make_zip(&[file("SKILL.md", SKILL), file("liar.bin", &data)]);
    let z = patch_uncompressed_size(&z, "liar.bin", 10);
    let err = package::build_from_zip(&z, None).unwrap_err();
    assert!(
        matches!(&err, PackageError::FileTooLarge { path, .. } if path == "liar.bin") || matches!(&err, PackageError::InvalidZip { .. }),
        "{err}"
    );
}

#[test]
fn zip_total_cap_at_edge() {
    // 4 x 32 MiB = the 128 MiB total exactly, SKILL.md is then one too many bytes.
    let chunk = vec![1u8; MAX_FILE_BYTES as usize];
    let names = ["a.bin", "b.bin", "c.bin", "d.bin"];
    let mut entries: Vec<_> = names.iter().map(|n| stored(n, &chunk)).collect();
    let tiny_skill = b"";
    entries.push(stored("SKILL.md", tiny_skill));
    let z = make_zip(&entries);
    let pkg = package::build_from_zip(&z, None).unwrap();
    let total: u64 = package::manifest(&pkg).unwrap().iter().map(|f| f.size).sum();
    assert_eq!(total, MAX_TOTAL_BYTES);

    entries.pop();
    entries.push(stored("SKILL.md", b"x"));
    let z = make_zip(&entries);
    let err = package::build_from_zip(&z, None).unwrap_err();
    assert!(matches!(err, PackageError::TotalTooLarge { .. }), "{err}");
}

#[test]
fn zip_file_count_at_edge() {
    let names: Vec<String> = (1..MAX_FILES).map(|i| format!("f/{i:04}.txt")).collect();
    let mut entries: Vec<_> = names.iter().map(|n| stored(n, b"x")).collect();
    entries.push(stored("SKILL.md", SKILL));
    let pkg = package::build_from_zip(&make_zip(&entries), None).unwrap();
    assert_eq!(package::manifest(&pkg).unwrap().len(), MAX_FILES);

    entries.push(stored("one-more.txt", b"x"));
    let err = package::build_from_zip(&make_zip(&entries), None).unwrap_err();
    assert!(matches!(err, PackageError::TooManyFiles { limit: MAX_FILES }), "{err}");
}

#[test]
fn zip_ratio_cap_at_edge() {
    let zeros = vec![0u8; 2 * MIB];
    let z = make_zip(&[file("SKILL.md", SKILL), file("zeros.bin", &zeros)]);
    // Default limits: 2 MiB of zeros deflates ~1000:1, over 200:1.
    let err = package::build_from_zip(&z, None).unwrap_err();
    assert!(matches!(&err, PackageError::CompressionRatio { path, .. } if path == "zeros.bin"), "{err}");

    // Exact edge: allowed iff inflated <= ratio * compressed.
    let c = {
        let mut a = zip::ZipArchive::new(Cursor::new(&z)).unwrap();
        let f = a.by_name("zeros.bin").unwrap();
        f.compressed_size()
    };
    let u = zeros.len() as u64;
    let edge = u.div_ceil(c);
    let ok = Limits { max_zip_ratio: edge, ..Limits::DEFAULT };
    package::build_from_zip_with(&z, None, &ok).unwrap();
    let tight = Limits { max_zip_ratio: edge - 1, ..Limits::DEFAULT };
    assert!(matches!(package::build_from_zip_with(&z, None, &tight).unwrap_err(), PackageError::CompressionRatio { .. }));

    // The floor: up to it, any ratio passes.
    let floor_ok = Limits { zip_ratio_floor: u, max_zip_ratio: 1, ..Limits::DEFAULT };
    package::build_from_zip_with(&z, None, &floor_ok).unwrap();
    let floor_tight = Limits { zip_ratio_floor: u - 1, max_zip_ratio: 1, ..Limits::DEFAULT };
    assert!(matches!(package::build_from_zip_with(&z, None, &floor_tight).unwrap_err(), PackageError::CompressionRatio { .. }));

    // A package of the same zeros (from a directory) stays readable: no
    // ratio check on .tar.gz.
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("SKILL.md"), SKILL).unwrap();
    std::fs::write(d.path().join("zeros.bin"), &zeros).unwrap();
    let pkg = package::build_from_dir(d.path()).unwrap();
    assert!(pkg.len() * 200 < zeros.len());
    package::manifest(&pkg).unwrap();
}

// ----------------------------------------------------------- tarball unpacking

/// A raw tar entry with any name/type (the tar crate's writer refuses `..`).
fn raw_entry(b: &mut tar::Builder<Vec<u8>>, name: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>) {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    if let Some(l) = link {
        h.set_link_name(l).unwrap();
    }
    h.set_cksum();
    b.append(&h, data).unwrap();
}

fn tarball(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (n, k, d, l) in entries {
        raw_entry(&mut b, n, *k, d, *l);
    }
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    gz.finish().unwrap()
}

#[test]
fn unpack_refuses_tampered_tarballs_and_leaves_dest_empty() {
    use tar::EntryType as T;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dotdot", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("../escape.txt", T::Regular, b"x", None)])),
        ("nested dotdot", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("a/../../e", T::Regular, b"x", None)])),
        ("absolute", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("/tmp/abs.txt", T::Regular, b"x", None)])),
        ("backslash", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("a\\b", T::Regular, b"x", None)])),
        ("symlink", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("l", T::Symlink, b"", Some("/etc/passwd"))])),
        ("hardlink", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("h", T::Link, b"", Some("SKILL.md"))])),
        ("device", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("dev", T::Char, b"", None)])),
        ("fifo", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("p", T::Fifo, b"", None)])),
        ("duplicate", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("SKILL.md", T::Regular, b"again", None)])),
        ("case dup", tarball(&[("SKILL.md", T::Regular, SKILL, None), ("skill.md", T::Regular, b"x", None)])),
        ("no SKILL.md", tarball(&[("other.md", T::Regular, b"x", None)])),
        ("not gzip", b"plain text".to_vec()),
    ];
    for (what, bytes) in cases {
        let dest = tempfile::tempdir().unwrap();
        let err = package::unpack(&bytes, dest.path()).expect_err(what);
        assert!(std::fs::read_dir(dest.path()).unwrap().next().is_none(), "{what}: dest not cleaned");
        assert!(package::manifest(&bytes).is_err(), "{what}: manifest accepted it");
        let expected = match what {
            "dotdot" | "nested dotdot" | "absolute" | "backslash" => matches!(err, PackageError::UnsafePath { .. }),
            "symlink" => matches!(err, PackageError::Symlink { .. }),
            "hardlink" | "device" | "fifo" => matches!(err, PackageError::UnsupportedEntry { .. }),
            "duplicate" | "case dup" => matches!(err, PackageError::DuplicatePath { .. }),
            "no SKILL.md" => matches!(err, PackageError::MissingSkillMd { .. }),
            _ => matches!(err, PackageError::InvalidTarball { .. }),
        };
        assert!(expected, "{what}: {err}");
    }
    assert!(!std::env::temp_dir().join("escape.txt").exists());
}

#[test]
fn unpack_caps_at_edges() {
    use tar::EntryType as T;
    let lim = Limits { max_file_bytes: 1000, max_total_bytes: 2500, max_files: 3, ..Limits::DEFAULT };
    let k = vec![b'k'; 1000];
    let run = |entries: &[(&str, T, &[u8], Option<&str>)]| {
        let bytes = tarball(entries);
        let dest = tempfile::tempdir().unwrap();
        let r = package::unpack_with(&bytes, dest.path(), &lim);
        assert_eq!(r.is_ok(), package::manifest_with(&bytes, &lim).is_ok());
        r
    };
    // file cap
    run(&[("SKILL.md", T::Regular, &k, None)]).unwrap();
    let k1 = vec![b'k'; 1001];
    assert!(matches!(run(&[("SKILL.md", T::Regular, &k1, None)]).unwrap_err(), PackageError::FileTooLarge { .. }));
    // total cap: 1000 + 1000 + 500 = 2500 passes, 501 does not
    let half = vec![b'h'; 500];
    run(&[("SKILL.md", T::Regular, &k, None), ("a", T::Regular, &k, None), ("b", T::Regular, &half, None)]).unwrap();
    let half1 = vec![b'h'; 501];
    assert!(matches!(
        run(&[("SKILL.md", T::Regular, &k, None), ("a", T::Regular, &k, None), ("b", T::Regular, &half1, None)]).unwrap_err(),
        PackageError::TotalTooLarge { .. }
    ));
    // count cap
    let x: &[u8] = b"x";
    run(&[("SKILL.md", T::Regular, x, None), ("a", T::Regular, x, None), ("b", T::Regular, x, None)]).unwrap();
    assert!(matches!(
        run(&[("SKILL.md", T::Regular, x, None), ("a", T::Regular, x, None), ("b", T::Regular, x, None), ("c", T::Regular, x, None)])
            .unwrap_err(),
        PackageError::TooManyFiles { limit: 3 }
    ));
}

#[test]
fn unpack_stops_a_gzip_bomb_while_streaming() {
    // 40 MiB of zeros in one entry, under 100 KiB compressed: refused at
    // 32 MiB + one read, never fully inflated or written.
    let mut b = tar::Builder::new(Vec::new());
    raw_entry(&mut b, "SKILL.md", tar::EntryType::Regular, SKILL, None);
    raw_entry(&mut b, "bomb.bin", tar::EntryType::Regular, &vec![0u8; 40 * MIB], None);
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar).unwrap();
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 100 * 1024);
    let dest = tempfile::tempdir().unwrap();
    let err = package::unpack(&bomb, dest.path()).unwrap_err();
    assert!(matches!(&err, PackageError::FileTooLarge { path, .. } if path == "bomb.bin"), "{err}");
    assert!(std::fs::read_dir(dest.path()).unwrap().next().is_none());
}

#[test]
fn unpack_ignores_a_lying_tar_size() {
    // The ustar header says 10 bytes, a PAX record says 40 MiB (the tar
    // crate follows PAX): refused by the streaming count at 32 MiB.
    let mut b = tar::Builder::new(Vec::new());
    raw_entry(&mut b, "SKILL.md", tar::EntryType::Regular, SKILL, None);
    let big = 40 * MIB;
    let body = format!(" size={big}\n");
    let record = format!("{}{body}", body.len() + 2);
    assert_eq!(record.len(), body.len() + 2);
    raw_entry(&mut b, "PaxHeader/liar.bin", tar::EntryType::XHeader, record.as_bytes(), None);
    let mut h = tar::Header::new_gnu();
    h.set_path("liar.bin").unwrap();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(10);
    h.set_cksum();
    b.append(&h, &vec![0u8; big][..]).unwrap();
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let bytes = gz.finish().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let err = package::unpack(&bytes, dest.path()).unwrap_err();
    assert!(matches!(&err, PackageError::FileTooLarge { path, .. } if path == "liar.bin"), "{err}");
    let err = package::manifest(&bytes).unwrap_err();
    assert!(matches!(&err, PackageError::FileTooLarge { .. }), "{err}");
    let err = package::build_from_tarball(&bytes, &Limits::DEFAULT).unwrap_err();
    assert!(matches!(&err, PackageError::FileTooLarge { .. }), "{err}");
}

#[test]
fn file_set_rules() {
    let lim = Limits::DEFAULT;
    package::check_file_set([("out/a.txt", 1), ("out/b.txt", 2)], &lim).unwrap();
    assert!(matches!(package::check_file_set([("a", 1), ("A", 1)], &lim).unwrap_err(), PackageError::DuplicatePath { .. }));
    assert!(matches!(package::check_file_set([("../a", 1)], &lim).unwrap_err(), PackageError::UnsafePath { .. }));
    package::check_file_set([("a", MAX_FILE_BYTES)], &lim).unwrap();
    assert!(matches!(package::check_file_set([("a", MAX_FILE_BYTES + 1)], &lim).unwrap_err(), PackageError::FileTooLarge { .. }));
}

// ------------------------------------------------------------------ helpers

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = hay.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

/// Central directory records, in order: (offset of the record, name).
fn central_records(z: &[u8]) -> Vec<(usize, String)> {
    let mut out = vec![];
    let mut i = 0;
    while i + 46 <= z.len() {
        if &z[i..i + 4] == b"PK\x01\x02" {
            let n = u16::from_le_bytes([z[i + 28], z[i + 29]]) as usize;
            out.push((i, String::from_utf8_lossy(&z[i + 46..i + 46 + n]).into_owned()));
            i += 46 + n;
        } else {
            i += 1;
        }
    }
    out
}

/// Makes central record `which` point at the local header of record `target`.
fn point_central_entry_at(z: &[u8], which: usize, target: usize) -> Vec<u8> {
    let recs = central_records(z);
    let mut out = z.to_vec();
    let off = recs[target].0 + 42;
    let local = [out[off], out[off + 1], out[off + 2], out[off + 3]];
    let dst = recs[which].0 + 42;
    out[dst..dst + 4].copy_from_slice(&local);
    out
}

/// Rewrites the declared uncompressed size of `name` in its local and
/// central headers.
fn patch_uncompressed_size(z: &[u8], name: &str, size: u32) -> Vec<u8> {
    let mut out = z.to_vec();
    let (rec, _) = central_records(z).into_iter().find(|(_, n)| n == name).unwrap();
    out[rec + 24..rec + 28].copy_from_slice(&size.to_le_bytes());
    let local = u32::from_le_bytes([z[rec + 42], z[rec + 43], z[rec + 44], z[rec + 45]]) as usize;
    assert_eq!(&z[local..local + 4], b"PK\x03\x04");
    out[local + 22..local + 26].copy_from_slice(&size.to_le_bytes());
    out
}

#[allow(dead_code)]
fn read_all(mut r: impl Read) -> Vec<u8> {
    let mut v = vec![];
    r.read_to_end(&mut v).unwrap();
    v
}
