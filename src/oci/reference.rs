//! Image references (`[host[:port]/]repo[:tag][@digest]`) read without a
//! regular expression.
//!
//! `oci_client::Reference`'s own parser compiles one large Unicode regular
//! expression on first use and keeps it for the life of the process: about
//! 5 MiB of heap in every long-running server that ever parses a reference
//! (the controller, the artifact endpoint). This reads the same grammar
//! (distribution's `reference` package) by hand and builds the `Reference`
//! with its constructors, normalised as `oci_client` normalises it
//! (`docker.io`, `library/`, `latest`). It is stricter in one place: tags
//! are ASCII, as the OCI distribution spec defines them
//! (`[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`), where the regular expression's
//! `\w` also took other Unicode letters. A test holds it to `oci_client`'s
//! answers on many generated references.

use oci_client::Reference;

/// The longest repository name (distribution's `NameTotalLengthMax`).
const NAME_MAX: usize = 255;
/// The longest tag after its first character.
const TAG_REST_MAX: usize = 127;

/// Parse `reference`, or say what is wrong with it.
pub fn parse(reference: &str) -> Result<Reference, String> {
    if reference.is_empty() {
        return Err("repository name must have at least one component".into());
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (reference, None),
    };
    if let Some(d) = digest {
        check_digest_shape(d)?;
    }
    // A tag is after the last ':' that follows the last '/' (a port's ':' comes before a '/').
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if tag.is_some_and(|t| !is_tag(t)) {
        return Err(invalid());
    }
    check_name(name)?;
    let (registry, repository) = split_domain(name);
    if repository.len() > NAME_MAX {
        return Err(format!("repository name must not be more than {NAME_MAX} characters"));
    }
    if let Some(d) = digest {
        check_digest_length(d)?;
    }
    Ok(match (tag, digest) {
        (Some(t), Some(d)) => Reference::with_tag_and_digest(registry, repository, t.into(), d.into()),
        (None, Some(d)) => Reference::with_digest(registry, repository, d.into()),
        (t, None) => Reference::with_tag(registry, repository, t.unwrap_or("latest").into()),
    })
}

fn invalid() -> String {
    "invalid reference format".into()
}

/// A tag: `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
pub fn is_tag(tag: &str) -> bool {
    let mut chars = tag.bytes();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    first_ok && rest_ok && tag.len() <= TAG_REST_MAX + 1
}

/// `[domain '/'] path-component ('/' path-component)*`; the first of two
/// or more components may be a domain instead.
fn check_name(name: &str) -> Result<(), String> {
    let parts: Vec<&str> = name.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let ok = is_path_component(part) || (i == 0 && parts.len() > 1 && is_domain(part));
        if !ok {
            return Err(invalid());
        }
    }
    Ok(())
}

/// One component of a repository name: `[a-z0-9]+ (separator [a-z0-9]+)*`
/// with separator `[_.] | __ | -*`.
pub fn is_path_component(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run between two alphanumerics.
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &b[start..i];
        let ok = matches!(sep, b"." | b"_" | b"__") || sep.iter().all(|c| *c == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `component ('.' component)* (':' [0-9]+)?`, a component being
/// `[a-zA-Z0-9]` or `[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]`.
fn is_domain(s: &str) -> bool {
    let (host, port) = match s.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (s, None),
    };
    if let Some(p) = port {
        if p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit()) {
            return false;
        }
    }
    host.split('.').all(|c| {
        let b = c.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
    })
}

/// `algorithm ':' hex{32,}`, the algorithm being components of
/// `[A-Za-z][A-Za-z0-9]*` joined by one of `-_+.`.
fn check_digest_shape(d: &str) -> Result<(), String> {
    let Some((algorithm, hex)) = d.split_once(':') else { return Err(invalid()) };
    let components_ok = algorithm.split(['-', '_', '+', '.']).all(|c| {
        let b = c.as_bytes();
        !b.is_empty() && b[0].is_ascii_alphabetic() && b.iter().all(u8::is_ascii_alphanumeric)
    });
    if !components_ok || hex.len() < 32 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(invalid());
    }
    Ok(())
}

fn check_digest_length(d: &str) -> Result<(), String> {
    let (algorithm, hex) = d.split_once(':').ok_or_else(invalid)?;
    let want = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err("unsupported digest algorithm".into()),
    };
    if hex.len() != want {
        return Err("invalid checksum digest length".into());
    }
    Ok(())
}

/// distribution's `splitDomain`: the first component is the registry when
/// it looks like a host (a '.', a ':' or `localhost`), else Docker Hub.
fn split_domain(name: &str) -> (String, String) {
    let (mut domain, mut rest) = match name.split_once('/') {
        Some((left, right)) if left.contains(['.', ':']) || left == "localhost" => (left.to_string(), right.to_string()),
        _ => ("docker.io".to_string(), name.to_string()),
    };
    if domain == "index.docker.io" {
        domain = "docker.io".into();
    }
    if domain == "docker.io" && !rest.contains('/') {
        rest = format!("library/{rest}");
    }
    (domain, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether both accept it (and then read it alike), failing when they disagree.
    fn same(input: &str) -> bool {
        let theirs: Result<Reference, _> = input.parse();
        let ours = parse(input);
        match (&theirs, &ours) {
            (Ok(t), Ok(o)) => assert_eq!(
                (t.registry(), t.repository(), t.tag(), t.digest()),
                (o.registry(), o.repository(), o.tag(), o.digest()),
                "{input:?}"
            ),
            (Err(_), Err(_)) => {}
            _ => panic!("{input:?}: oci_client says {theirs:?}, this parser {ours:?}"),
        }
        ours.is_ok()
    }

    #[test]
    fn reads_references_as_oci_client_does() {
        let hex64 = "f".repeat(64);
        for input in [
            "busybox",
            "test.com:tag",
            "test.com:5000",
            "test.com/repo:tag",
            "test:5000/repo",
            "test:5000/repo:tag",
            &format!("test:5000/repo@sha256:{hex64}"),
            &format!("test:5000/repo:tag@sha256:{hex64}"),
            "lowercase:Uppercase",
            "Uppercase:tag",
            "sub-dom1.foo.com/bar/baz/quux",
            "sub-dom1.foo.com/bar/baz/quux:some-long-tag",
            "b.gcr.io/test.example.com/my-app:test.example.com",
            "xn--n3h.com/myimage:xn--n3h.com",
            &format!("xn--7o8h.com/myimage:xn--7o8h.com@sha512:{}", "f".repeat(128)),
            "foo_bar.com:8080",
            "foo/foo_bar.com:8080",
            "opensuse/leap:15.3",
            "localhost/repo",
            "localhost:5000/a/b/c:v1",
            "127.0.0.1:5001/skills/csv-stats:1.0.0",
            "index.docker.io/nginx",
            "",
            ":justtag",
            &format!("@sha256:{hex64}"),
            "repo@sha256:ffffffffffffffffffffffffffffffffff",
            &format!("validname@invaliddigest:{hex64}"),
            "Uppercase/repo",
            "a//b",
            "a/",
            "/a",
            "a:",
            "a:-tag",
            "a__b",
            "a___b",
            "a--b",
            "a.-b",
            "-a.com/b",
            "a-.com/b",
            "a.com:/b",
            "a.com:x/b",
            &format!("a:{}", "t".repeat(128)),
            &format!("a:{}", "t".repeat(129)),
            &format!("{}/b", "a".repeat(300)),
            "a/".repeat(128).trim_end_matches('/'),
            "a/".repeat(129).trim_end_matches('/'),
            &format!("a@sha256:{}", "F".repeat(64)),
            &format!("a@sha256:{}", "f".repeat(63)),
            &format!("a@sha256+b.c:{}", "f".repeat(64)),
            "a b",
            "a:b:c",
            "a.com:5000:tag",
        ] {
            let _ = same(input);
        }
    }

    /// Many generated strings over the grammar's alphabet: the same
    /// verdict and the same parts as `oci_client` for every one.
    #[test]
    fn agrees_with_oci_client_on_generated_references() {
        const ALPHABET: &[u8] = b"aaabbb999Z.-_:/@";
        let hexes = ["sha256:".to_string() + &"0".repeat(64), "sha512:".to_string() + &"a".repeat(128), "md5:abc".to_string()];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut accepted = 0;
        for _ in 0..20_000 {
            let len = (next() % 14) as usize;
            let mut s: String = (0..len).map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize] as char).collect();
            if next() % 4 == 0 {
                s.push('@');
                s.push_str(&hexes[(next() % 3) as usize]);
            }
            if same(&s) {
                accepted += 1;
            }
        }
        // Both verdicts are well represented, or the comparison proves little.
        assert!((2_000..18_000).contains(&accepted), "{accepted} of 20,000 accepted");
    }

    #[test]
    fn non_ascii_tags_are_refused() {
        assert!(parse("repo:tëst").is_err());
        assert!("repo:tëst".parse::<Reference>().is_ok(), "the regular expression's \\w takes it");
    }
}
