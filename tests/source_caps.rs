//! The limits a SkillSource's content and its ZIP download are held to,
//! each at its edge: the skills one source may turn into packages, the
//! problems its status lists, and the bytes a capped download reads.

use std::io::Write;

use skill_operator::core::limits::{SOURCE_MAX_SKILLS, SOURCE_PROBLEMS_LISTED};
use skill_operator::download::{self, DownloadError};
use skill_operator::source::snapshot::{self, Origin};

fn zip_of(files: impl IntoIterator<Item = (String, String)>) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default();
    for (name, text) in files {
        zip.start_file(name, opts).unwrap();
        zip.write_all(text.as_bytes()).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn take(bytes: Vec<u8>) -> snapshot::Snapshot {
    snapshot::take(&Origin::Zip { bytes, digest: "sha256:test".into(), path: None }).unwrap()
}

fn skills(n: usize) -> impl Iterator<Item = (String, String)> {
    (0..n).map(|i| (format!("skills/s{i:05}/SKILL.md"), format!("---\nname: s{i:05}\ndescription: skill {i}\n---\n")))
}

#[test]
fn a_source_packages_at_most_its_skill_cap_and_says_so_past_it() {
    let at_edge = take(zip_of(skills(SOURCE_MAX_SKILLS)));
    assert_eq!(at_edge.skills.len(), SOURCE_MAX_SKILLS);
    assert!(!at_edge.problems.iter().any(|p| p.contains("skill-limit")), "{:?}", at_edge.problems);
    let over = take(zip_of(skills(SOURCE_MAX_SKILLS + 1)));
    assert_eq!(over.skills.len(), SOURCE_MAX_SKILLS, "one over the cap is not packaged");
    assert!(over.problems.iter().any(|p| p.contains("skill-limit")), "{:?}", over.problems);
}

#[test]
fn the_status_lists_at_most_its_problem_cap_and_counts_them_all() {
    let broken = |n: usize| (0..n).map(|i| (format!("skills/b{i:04}/SKILL.md"), format!("---\nname: b{i:04}\n---\nno description\n")));
    let at_edge = take(zip_of(broken(SOURCE_PROBLEMS_LISTED)));
    assert_eq!((at_edge.problems.len(), at_edge.problem_count), (SOURCE_PROBLEMS_LISTED, SOURCE_PROBLEMS_LISTED));
    let over = take(zip_of(broken(SOURCE_PROBLEMS_LISTED + 1)));
    assert_eq!((over.problems.len(), over.problem_count), (SOURCE_PROBLEMS_LISTED, SOURCE_PROBLEMS_LISTED + 1));
}

/// A one-shot HTTP/1.1 server on loopback answering every request with
/// `body`, with or without a Content-Length (then the connection's close
/// ends the body).
async fn serve(body: Vec<u8>, length: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head).await;
                let header = if length {
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())
                } else {
                    "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string()
                };
                let _ = conn.write_all(header.as_bytes()).await;
                let _ = conn.write_all(&body).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    format!("http://{addr}/file")
}

#[tokio::test]
async fn a_capped_download_reads_its_cap_and_refuses_one_byte_more() {
    const CAP: u64 = 64 * 1024;
    let client = skill_operator::tls::reqwest_builder().build().unwrap();
    for length in [true, false] {
        let url = serve(vec![7u8; CAP as usize], length).await;
        let body = download::capped(&client, &url, CAP).await.unwrap();
        assert_eq!(body.len() as u64, CAP, "Content-Length given: {length}");
        let url = serve(vec![7u8; CAP as usize + 1], length).await;
        let err = download::capped(&client, &url, CAP).await.unwrap_err();
        assert!(matches!(err, DownloadError::TooLarge(CAP)) && !err.is_transient(), "Content-Length given: {length}: {err}");
    }
}
