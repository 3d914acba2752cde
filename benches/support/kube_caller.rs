//! A caller the gateway's entry gate lets in, on a real API server: a
//! namespace with a ServiceAccount allowed `get` on skillbindings there,
//! and a token minted for it. Shared by the benchmarks that go through
//! `require_caller` with a real TokenReview and SubjectAccessReview.

use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::json;

/// A namespace with an allowed ServiceAccount, and its token.
pub(crate) async fn real_caller(client: &Client, ns: &str) -> String {
    let pp = PostParams::default();
    Api::<Namespace>::all(client.clone())
        .create(&pp, &serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap())
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    accounts.create(&pp, &serde_json::from_value(json!({ "metadata": { "name": "agent" } })).unwrap()).await.unwrap();
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "agent" },
        "rules": [{ "apiGroups": [skill_operator::api::GROUP], "resources": ["skillbindings"], "verbs": ["get"] }],
    }))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), ns).create(&pp, &role).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "agent" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent" },
        "subjects": [{ "kind": "ServiceAccount", "name": "agent", "namespace": ns }],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns).create(&pp, &binding).await.unwrap();
    // The RoleBinding takes effect a moment later (the authorizer's
    // informer); nothing to watch, so ask until it does.
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{ns}:agent")),
            resource_attributes: Some(ResourceAttributes {
                group: Some(skill_operator::api::GROUP.into()),
                namespace: Some(ns.into()),
                verb: Some("get".into()),
                resource: Some("skillbindings".into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reviews.create(&pp, &review).await.unwrap().status.is_some_and(|s| s.allowed) {
        assert!(Instant::now() < deadline, "the RoleBinding did not take effect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let request = serde_json::from_value(json!({ "spec": { "audiences": [], "expirationSeconds": 600 } })).unwrap();
    let answer = serde_json::to_value(accounts.create_token_request("agent", &pp, &request).await.unwrap()).unwrap();
    answer["status"]["token"].as_str().unwrap().to_string()
}
