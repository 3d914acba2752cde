//! The file-by-file job file set API of `oci::Registry` (`push_set_blob`,
//! `push_set_manifest`, `blob_set`, `pull_set_file`) and `delete`, against a
//! real registry. (Append to tests/registry.rs when copying.)

#[path = "oci/common.rs"]
mod common;

use std::collections::BTreeMap;

use common::TestRegistry;
use skill_operator::oci::{OciError, SetFile};

#[tokio::test]
async fn file_by_file_sets_match_whole_sets_and_delete_by_tag() {
    let reg = TestRegistry::start().await;
    let client = reg.registry();
    let files = vec![("b/two.txt".to_string(), b"two".to_vec()), ("a.txt".to_string(), b"one".to_vec())];
    let r1 = reg.reference("jobs:one");
    let mut set = Vec::new();
    for (p, d) in &files {
        let digest = client.push_set_blob(&r1, d).await.unwrap();
        set.push(SetFile { path: p.clone(), size: d.len() as u64, digest });
    }
    let ann = BTreeMap::from([("dev.skill-operator.job".to_string(), "ns/one".to_string())]);
    let digest = client.push_set_manifest(&r1, set.clone(), ann.clone()).await.unwrap();

    let read = client.blob_set(&r1).await.unwrap();
    assert_eq!(read.digest, digest);
    assert_eq!(read.annotations, ann);
    assert_eq!(read.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["a.txt", "b/two.txt"]);
    for f in &read.files {
        let data = client.pull_set_file(&r1, f).await.unwrap();
        assert_eq!(Some(&data), files.iter().find(|(p, _)| p == &f.path).map(|(_, d)| d));
    }
    let (whole_digest, whole) = client.pull_blob_set(&r1).await.unwrap();
    assert_eq!(whole_digest, digest);
    assert_eq!(whole.len(), 2);

    // The same files under another annotation: a distinct manifest, so
    // deleting one tag leaves the other.
    let r2 = reg.reference("jobs:two");
    let ann2 = BTreeMap::from([("dev.skill-operator.job".to_string(), "ns/two".to_string())]);
    let digest2 = client.push_set_manifest(&r2, set, ann2).await.unwrap();
    assert_ne!(digest, digest2);
    assert!(client.delete(&r1).await.unwrap());
    assert!(matches!(client.blob_set(&r1).await, Err(OciError::NotFound { .. })));
    assert!(!client.delete(&r1).await.unwrap());
    assert_eq!(client.blob_set(&r2).await.unwrap().digest, digest2);

    // A size that does not match the blob is caught on download.
    let mut f = read.files[0].clone();
    f.size = 2;
    let err = client.pull_set_file(&r2, &f).await.unwrap_err();
    assert!(matches!(err, OciError::SizeMismatch { .. }), "{err}");
}
