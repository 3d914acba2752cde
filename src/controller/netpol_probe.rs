//! Whether the cluster's CNI enforces NetworkPolicy, found out instead of
//! taken on the admin's word.
//!
//! The API server admits NetworkPolicies whatever the CNI does with them,
//! and a CNI that ignores them (flannel, a bare bridge) leaves every run
//! pod free to reach the API server, the node, the controller and the
//! registry: the run policies are then a label, not a wall. So the leading
//! controller probes once at start: in its own namespace it makes a policy
//! that denies all egress and, under it, a pod that tries to reach the
//! artifact endpoint (a peer the controller itself reaches). A pod that
//! connects proves the policy is not enforced; one refused or timed out
//! proves it is. The finding goes on every SkillJob's
//! `NetworkPolicyEnforced` condition (over what `--network-policy` states),
//! into the `skill_operator_network_policy_enforced` gauge, and, when not
//! enforced, into the controller's log at error level.
//!
//! The pod side is `skill-operator probe-network --connect IP:PORT`
//! ([`pod_command`]): exit 0 when it connected, [`EXIT_BLOCKED`] when it
//! could not.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, PostParams};

use super::builders::probe::{deny_all, probe_pod, PROBE_DEADLINE_SECS, PROBE_NAME};
use super::context::Context;
use super::egress::NetworkPolicyEnforcement;

/// The probe pod's exit status when it could not connect.
pub const EXIT_BLOCKED: u8 = 3;
/// How long the probe pod waits before it tries (the CNI may program a
/// new pod's policies a moment after the pod starts), and between tries.
const SETTLE: Duration = Duration::from_secs(2);
/// Tries; all must agree for a finding.
const TRIES: usize = 3;
/// One try's connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// `skill-operator probe-network`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The peer to try, `IP:PORT`.
    #[arg(long, value_name = "IP:PORT")]
    pub connect: std::net::SocketAddr,
    /// Milliseconds before the first try and between tries.
    #[arg(long, default_value_t = SETTLE.as_millis() as u64, hide = true)]
    pub settle_ms: u64,
}

/// The pod side: every try connects → 0 (nothing stops this pod);
/// every try fails → [`EXIT_BLOCKED`]; mixed → 2 (no finding).
pub async fn pod_command(args: ProbeArgs) -> std::process::ExitCode {
    let settle = Duration::from_millis(args.settle_ms);
    tokio::time::sleep(settle).await;
    let mut connected = 0;
    for attempt in 0..TRIES {
        if attempt > 0 {
            tokio::time::sleep(settle).await;
        }
        let outcome = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(args.connect)).await;
        let ok = matches!(outcome, Ok(Ok(_)));
        eprintln!("probe-network: {} {}", args.connect, if ok { "reached" } else { "not reached" });
        connected += usize::from(ok);
    }
    match connected {
        n if n == TRIES => std::process::ExitCode::SUCCESS,
        0 => std::process::ExitCode::from(EXIT_BLOCKED),
        _ => std::process::ExitCode::from(2),
    }
}

/// What a pod's end says: the finding of the probe.
pub fn finding(pod: &Pod) -> Option<NetworkPolicyEnforcement> {
    let status = pod.status.as_ref()?;
    let ended = status.container_statuses.iter().flatten().find_map(|c| c.state.as_ref()?.terminated.as_ref());
    match (status.phase.as_deref(), ended.map(|t| t.exit_code)) {
        (_, Some(0)) => Some(NetworkPolicyEnforcement::NotEnforced),
        (_, Some(code)) if code == i32::from(EXIT_BLOCKED) => Some(NetworkPolicyEnforcement::Enforced),
        (Some("Succeeded" | "Failed"), _) | (_, Some(_)) => Some(NetworkPolicyEnforcement::Unknown),
        _ => None,
    }
}

/// The probe, once: its objects made in the operator's namespace, its pod's
/// end awaited (bounded), both deleted; the finding recorded in `ctx`.
pub async fn probe(ctx: &Context, target: String) {
    let ns = ctx.config.operator_namespace.clone();
    let found = match run(ctx, &ns, &target).await {
        Ok(found) => found,
        Err(err) => {
            tracing::warn!(%err, namespace = %ns, "the NetworkPolicy probe could not run; enforcement stays as --network-policy states it");
            NetworkPolicyEnforcement::Unknown
        }
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    for deleted in [
        pods.delete(PROBE_NAME, &DeleteParams::background()).await.map(|_| ()),
        policies.delete(PROBE_NAME, &DeleteParams::background()).await.map(|_| ()),
    ] {
        if let Err(err) = deleted.or_else(|e| if is_not_found(&e) { Ok(()) } else { Err(e) }) {
            tracing::warn!(%err, "the NetworkPolicy probe's objects were not deleted");
        }
    }
    match found {
        NetworkPolicyEnforcement::NotEnforced => tracing::error!(
            target = %target,
            "NetworkPolicy is NOT enforced on this cluster: a pod under a deny-all policy reached {target}; run pods are not kept from \
             the API server, the node or other pods; only the egress proxy's refusals and the missing DNS hold. Install a CNI that \
             enforces NetworkPolicy (Calico, Cilium)"
        ),
        NetworkPolicyEnforcement::Enforced => {
            tracing::info!("NetworkPolicy is enforced: the probe pod under a deny-all policy was refused")
        }
        NetworkPolicyEnforcement::Unknown => tracing::warn!("the NetworkPolicy probe found nothing conclusive"),
    }
    ctx.network_probe.set(found);
    ctx.metrics.network_policy_enforced.set(match found {
        NetworkPolicyEnforcement::Enforced => 1,
        NetworkPolicyEnforcement::NotEnforced => 0,
        NetworkPolicyEnforcement::Unknown => -1,
    });
}

async fn run(ctx: &Context, ns: &str, target: &str) -> Result<NetworkPolicyEnforcement, kube::Error> {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    // A probe a previous controller left: gone first (its pod would not be this nonce's).
    for gone in [
        pods.delete(PROBE_NAME, &DeleteParams::background()).await.map(|_| ()),
        policies.delete(PROBE_NAME, &DeleteParams::background()).await.map(|_| ()),
    ] {
        gone.or_else(|e| if is_not_found(&e) { Ok(()) } else { Err(e) })?;
    }
    // The policy first: the pod never exists without it.
    create_again(&policies, &deny_all(ns, &nonce)).await?;
    create_again(&pods, &probe_pod(ns, &nonce, &ctx.config.operator_image, ctx.config.operator_image_pull_policy.as_deref(), target))
        .await?;
    let ended = kube::runtime::wait::await_condition(pods.clone(), PROBE_NAME, |pod: Option<&Pod>| pod.and_then(finding).is_some());
    let deadline = Duration::from_secs(PROBE_DEADLINE_SECS as u64 + 30);
    match tokio::time::timeout(deadline, ended).await {
        Ok(Ok(Some(pod))) => Ok(finding(&pod).unwrap_or(NetworkPolicyEnforcement::Unknown)),
        Ok(Ok(None)) => Ok(NetworkPolicyEnforcement::Unknown),
        Ok(Err(err)) => {
            tracing::warn!(%err, "watching the NetworkPolicy probe pod failed");
            Ok(NetworkPolicyEnforcement::Unknown)
        }
        Err(_) => Ok(NetworkPolicyEnforcement::Unknown),
    }
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

/// Create `object`, waiting out the deletion of an earlier one of the name.
async fn create_again<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for _ in 0..30 {
        match api.create(&PostParams::default(), object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => tokio::time::sleep(Duration::from_secs(1)).await,
            Err(err) => return Err(err),
        }
    }
    api.create(&PostParams::default(), object).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::super::egress::combined;
    use super::*;

    fn ended(phase: &str, code: Option<i32>) -> Pod {
        let terminated = code.map(|c| serde_json::json!({ "state": { "terminated": { "exitCode": c } }, "name": "probe", "image": "i", "imageID": "", "ready": false, "restartCount": 0 }));
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": PROBE_NAME },
            "status": { "phase": phase, "containerStatuses": terminated.into_iter().collect::<Vec<_>>() }
        }))
        .unwrap()
    }

    #[test]
    fn the_pods_end_is_the_finding_and_a_finding_beats_the_statement() {
        assert_eq!(finding(&ended("Succeeded", Some(0))), Some(NetworkPolicyEnforcement::NotEnforced));
        assert_eq!(finding(&ended("Failed", Some(3))), Some(NetworkPolicyEnforcement::Enforced));
        assert_eq!(finding(&ended("Failed", Some(2))), Some(NetworkPolicyEnforcement::Unknown), "mixed tries");
        assert_eq!(finding(&ended("Failed", None)), Some(NetworkPolicyEnforcement::Unknown), "its deadline");
        assert_eq!(finding(&ended("Running", None)), None, "still trying");
        use NetworkPolicyEnforcement::*;
        assert_eq!(combined(Enforced, NotEnforced).0, Some(false), "the admin's word loses to the probe");
        assert_eq!(combined(Unknown, NotEnforced).1, "ProbeNotEnforced");
        assert_eq!(combined(Unknown, Enforced), (Some(true), "ProbeEnforced", combined(Unknown, Enforced).2));
        assert_eq!(combined(NotEnforced, Enforced).0, Some(false), "an admin who says not enforced is believed");
        assert_eq!(combined(Enforced, Unknown).1, "Enforced");
        assert_eq!(combined(Unknown, Unknown).0, None);
    }

    #[tokio::test]
    async fn the_pod_side_reports_reached_and_refused() {
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = open.local_addr().unwrap();
        tokio::spawn(async move { while open.accept().await.is_ok() {} });
        assert_eq!(pod_command(ProbeArgs { connect: addr, settle_ms: 10 }).await, std::process::ExitCode::SUCCESS);
        // A port nothing listens on: refused every time.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert_eq!(pod_command(ProbeArgs { connect: closed, settle_ms: 10 }).await, std::process::ExitCode::from(EXIT_BLOCKED));
    }
}
