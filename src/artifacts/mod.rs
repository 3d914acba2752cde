//! The artifact endpoint and its two pod-side clients: how a run's files get
//! into and out of a pod that can reach nothing else.
//!
//! - [`server`]: `skill-operator artifacts`, an axum service in front of an
//!   OCI registry. The gateway/controller stage a job's package and inputs
//!   there; the pod fetches them and uploads its outputs; the controller
//!   reads the outputs back and deletes everything when the SkillJob goes.
//! - [`client`]: `skill-operator fetch` (init container) and
//!   `skill-operator upload` (native sidecar), as library functions.
//!
//! # Why an endpoint at all (and not the registry directly)
//! A run pod has no DNS, no API access (its only ServiceAccount token is
//! the one below, for this endpoint's audience, and only in `fetch` and
//! `upload`) and a NetworkPolicy that allows exactly one peer: this
//! endpoint, addressed by IP. Giving the pod
//! registry credentials would let a script read every other job's files
//! (registries authorise per repository, not per tag); the endpoint instead
//! holds the registry credentials itself and lets each pod touch its own
//! job only. It also keeps registry specifics (auth flows, TLS, token
//! services) out of the pod.
//!
//! # Credentials (token scoping)
//! A job's pod proves which job it is with one of two credentials, both
//! mounted only into `fetch` and `upload`, never into the `run` container:
//! the script cannot read them, so it cannot replay them. Either is good for
//! one job: a pod cannot name another job's files even if it guesses the UID.
//!
//! - **Projected pod token** (in the cluster, `artifacts --pod-tokens`): a
//!   ServiceAccount token the kubelet projects for the pod's account
//!   [`RUN_SERVICE_ACCOUNT`], with the audience [`pod_token_audience`]`(ns,
//!   uid)` and a lifetime of [`POD_TOKEN_EXPIRATION_SECS`]. The endpoint
//!   asks the API server (a TokenReview for that audience, cached briefly:
//!   [`server::pod_tokens`]) and accepts it only when it is authenticated for
//!   exactly that job's audience, is the run account's in the job's
//!   namespace, and is bound to a pod. Why: no per-job Secret, so two API
//!   writes fewer per run (its create and delete); a bound token dies with
//!   its pod (the API server refuses it once the pod is gone); the audience
//!   names one job, so the API server itself refuses it on every other job's
//!   routes (and no one else accepts it: not even the API server, whose own
//!   audience it lacks). The API server unreachable is a 503 `unavailable`
//!   the pod's client retries, never a pass.
//! - **HMAC job token** (`serve`, tests, and any endpoint without
//!   `--pod-tokens`): `core::token::job_token(key, namespace, uid)`, which
//!   the endpoint checks without any lookup or state.
//!
//! What the pod token does not change: anyone who may create pods with the
//! `skill-operator-run` ServiceAccount in a namespace can get a token for any
//! job of that namespace (the audience is a name, not a secret), just as
//! before they could mount any job's token Secret there. Granting `create
//! pods` in a namespace trusts the grantee with that namespace's runs.
//!
//! The gateway and controller use the **operator credential**:
//! [`operator_token`]`(key)` = `job_token(key, "", "operator")`, i.e. the
//! HMAC of `"/operator"`. No job token can equal it: namespaces are never
//! empty, so a job's HMAC input `"<ns>/<uid>"` never starts with `/`. Anyone
//! holding the key can mint every token anyway, so the operator credential
//! adds no new secret: processes that have the key file derive it.
//!
//! `Authorization: Bearer <credential>`, where the credential is one of
//! - `job:<namespace>:<uid>:<token>` (what [`client`] sends; the token is
//!   the HMAC job token or the pod token of that job),
//! - `operator:<token>` (gateway, controller),
//! - a bare `<token>`: accepted when it is the route's job token, the
//!   operator token, or a pod token of the route's job.
//!
//! The named forms let the endpoint tell a forged or wrong token (401) from
//! a genuine token used on another job's route or for an action its role
//! lacks (403). Namespace and UID are checked as names first (DNS label;
//! `[A-Za-z0-9-]{1,48}`) so no `/` or `:` can shift the HMAC input.
//!
//! | route                                       | own job token | operator |
//! |---------------------------------------------|:-------------:|:--------:|
//! | `GET /v1/jobs/{ns}/{uid}/package[?digest=]` | yes           | yes      |
//! | `GET .../inputs`, `GET .../inputs/{*path}`  | yes           | yes      |
//! | `PUT .../outputs`                           | yes           | no       |
//! | `PUT .../package`, `PUT .../inputs[/{*path}]` | no          | yes      |
//! | `GET .../outputs`, `GET .../outputs/{*path}`| no            | yes      |
//! | `DELETE /v1/jobs/{ns}/{uid}`                | no            | yes      |
//! | `PUT`/`DELETE /v1/namespaces/{ns}/packages/{digest}` | no   | yes      |
//! | `GET /v1/namespaces/packages`               | no            | yes      |
//! | `PUT /v1/jobs/{ns}/{warm_uid}/claim`        | no            | yes      |
//! | `GET /v1/jobs/{ns}/{warm_uid}/claim[?wait=]`| yes           | no       |
//!
//! Warm pods ([`Claim`]): a run pod made before its run has a uid of its
//! own, a warm uid ([`is_warm_uid`]), and so a job credential of its own.
//! The operator hands it a run by storing a claim under the warm uid
//! (write-once: a second, different claim is 409 `already_claimed`); the
//! pod reads it with its own credential, waiting up to
//! [`CLAIM_WAIT_MAX_SECS`]. From then on it reads the run's inputs (`GET
//! .../inputs[/{*path}]`) and stores its outputs (`PUT .../outputs`) on the
//! run's routes with its own credential and [`CLAIM_HEADER`]` = <warm_uid>`:
//! admitted only while the claim stored for that warm uid names that run.
//!
//! `GET .../package?digest=<d>` serves the namespace package of the route's
//! `{ns}` pinned at `d` (below) to a job of that namespace: the job token is
//! checked against the route's namespace and UID as on every job route, and
//! the tag is built from the route's namespace, so a job of one namespace
//! can never read another namespace's package.
//!
//! # Storage
//! One registry repository (`--registry HOST/REPO`), three tags per job
//! (and `job_<ns>_<warm_uid>_claim`, a set of one [`CLAIM_FILE`], per
//! claimed warm pod; `DELETE` of the warm uid removes it):
//! `job_<ns>_<uid>_package` (a skill artifact as `oci::Registry::push`
//! writes it, with the job in a manifest annotation: the layer and config
//! blobs depend on the package alone, so a thousand jobs of one package
//! store it once and staging the second uploads nothing),
//! `job_<ns>_<uid>_inputs` and `job_<ns>_<uid>_outputs` (job file sets,
//! annotated with the job and the kind). Every manifest names its job, so two
//! jobs with identical files still get distinct manifests, deleting one never
//! untags the other, and a tag pointing at another job's manifest is refused
//! (502 `wrong_artifact`). `_` cannot occur in a namespace or
//! UID, so tags never collide.
//!
//! Namespace packages: a package the controller stages once for every run
//! of a namespace that pins the same SkillPackage digest (`PUT
//! /v1/namespaces/{ns}/packages/{digest}`), tagged `<ns>.<hex>`
//! ([`namespace_package_tag`]; `.` occurs in no namespace and in no job
//! tag) and annotated [`ANNOTATION_PACKAGE`] = `<ns>/<digest>`: a thousand
//! runs of one package push one manifest, not one each. `{digest}` is the
//! SkillPackage's pinned OCI manifest digest, taken on the operator
//! credential's word (the endpoint cannot tie it to the archive bytes); the
//! archive's own sha256 is announced on every GET and checked by `fetch`.
//! `GET /v1/namespaces/packages` lists them from the repository's tags
//! and `DELETE` removes one (its blobs go with garbage collection, unless
//! another manifest still names them). Every pull is verified by `oci::Registry`:
//! manifest digests, blob sizes and sha256 against the descriptors; a blob
//! changed in the registry's storage fails the request with 502
//! `digest_mismatch`. Deleting removes the manifests; blobs go with the
//! registry's garbage collection.
//!
//! # Transfer format
//! Single files travel as raw bodies (`application/octet-stream`) with an
//! `X-Content-Digest: sha256:<hex>` header; clients check size and digest
//! against it (and against the inputs manifest) while streaming to disk.
//! A PUT may carry the header too: a body whose sha256 differs is refused
//! (400 `content_digest_mismatch`, both digests named) before anything is
//! stored.
//! Batches (`PUT .../outputs`, and `PUT .../inputs` for staging many files)
//! are one uncompressed POSIX/GNU tar (`application/x-tar`) of regular files
//! (directory entries are ignored, anything else is refused):
//! - inputs: entries are the input paths as they appear under `/work`;
//! - outputs: `result/result.json`, `result/stdout`, `result/stderr`,
//!   `work/<path>` for each file under `/work`, and last `manifest.json`
//!   ([`OutputManifest`]): it lists every other entry with size and digest,
//!   plus the files not uploaded and why. The endpoint refuses the batch
//!   unless the entries and the manifest agree exactly. Its sha256 is the
//!   digest `upload` writes to the termination log, and `GET .../outputs`
//!   returns those exact bytes, so the controller can tie what the pod said
//!   to what is stored.
//!
//! Tar because it streams in both directions with known sizes up front,
//! needs no extra dependency (the `tar` crate packs skills already), and any
//! tool can produce or inspect it. The upload streams the tar straight from
//! the files (the sidecar has a 128 MiB memory limit, the same as the
//! largest batch); the endpoint streams the body to a temporary spool file
//! under an explicit byte limit (the axum body limit above 128 MiB applies
//! to the two batch routes only), then pushes one file at a time, so memory
//! per request stays at one file, never the batch.
//!
//! # Caps ([`ArtifactLimits::DEFAULT`])
//! 32 MiB per file, 128 MiB per job, 2,000 files: the package caps, so
//! whatever a run can produce fits what a skill may ship, and the 128 MiB
//! batch fits the pod's ephemeral storage. `upload` applies them itself
//! (over-cap files are reported in the manifest, not sent); the endpoint
//! applies them again (413) because a pod is not trusted; `fetch` applies
//! them to what the endpoint announces before downloading anything.

pub mod client;
pub mod operator;
pub mod sample_packages;
pub mod sealed;
pub mod server;
pub mod store;
pub mod verdict;

use serde::{Deserialize, Serialize};

pub use crate::oci::SetFile;

/// Subject of the operator credential (see the module docs).
pub const OPERATOR_SUBJECT: &str = "operator";

/// The per-namespace ServiceAccount run pods use (no RBAC bound to it). The
/// projected token a run's pod presents to the endpoint must be this
/// account's, in the route's namespace.
pub const RUN_SERVICE_ACCOUNT: &str = "skill-operator-run";

/// The audience of the projected ServiceAccount token a run's pod presents
/// to the endpoint: one job's alone. The API server checks it in the
/// TokenReview, so a token made for one run is refused on every other
/// job's routes, and no token of a run is accepted by the API server itself.
pub fn pod_token_audience(ns: &str, uid: &str) -> String {
    format!("artifacts.skill-operator.dev/{ns}/{uid}")
}

/// The lifetime the controller asks for a run pod's token (the API
/// server's minimum is 600 s; the kubelet rotates the file at 80%, far
/// beyond the longest run).
pub const POD_TOKEN_EXPIRATION_SECS: i64 = 3600;
const _: () = assert!(POD_TOKEN_EXPIRATION_SECS >= 600 && POD_TOKEN_EXPIRATION_SECS as u64 > 4 * crate::core::limits::MAX_TIMEOUT_SECS);
/// Sha256 of a single-file body, `sha256:<hex>`.
pub const HEADER_CONTENT_DIGEST: &str = "x-content-digest";
/// The OCI manifest digest of the file set a file was served from; pass it
/// back as `?set=` to pin later reads to the same set.
pub const HEADER_SET_DIGEST: &str = "x-set-digest";
/// Content type of batch bodies.
pub const TAR_CONTENT_TYPE: &str = "application/x-tar";

/// Entry names inside the outputs set (and the outputs tar).
pub const MANIFEST_PATH: &str = "manifest.json";
pub const RESULT_PREFIX: &str = "result/";
pub const WORK_PREFIX: &str = "work/";
/// The result files `upload` sends (next to `--result`, as the launcher writes them).
pub const RESULT_FILES: [&str; 3] = ["result.json", "stdout", "stderr"];

/// Every bound of the artifact path. Tests shrink some; the CLI uses
/// [`ArtifactLimits::DEFAULT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactLimits {
    /// Bytes per input or output file.
    pub max_file_bytes: u64,
    /// Bytes of all input files, or of all output files, of one job.
    pub max_total_bytes: u64,
    /// Input files, or output files, per job.
    pub max_files: usize,
    /// Directories implied by the file paths of one set.
    pub max_dirs: usize,
    /// The compressed package (content cap plus tar and gzip overhead).
    pub max_package_bytes: u64,
    /// `result.json`.
    pub max_result_bytes: u64,
    /// `stdout` / `stderr` each (the launcher keeps 1 MiB).
    pub max_stream_bytes: u64,
    /// The outputs `manifest.json`.
    pub max_manifest_bytes: u64,
    /// Skipped files listed by name in the manifest; the rest are counted.
    pub max_skipped_listed: usize,
    /// Directory entries `upload` looks at before it stops walking.
    pub max_walk_entries: usize,
}

impl ArtifactLimits {
    pub const DEFAULT: ArtifactLimits = ArtifactLimits {
        max_file_bytes: crate::core::package::MAX_FILE_BYTES,
        max_total_bytes: crate::core::package::MAX_TOTAL_BYTES,
        max_files: crate::core::package::MAX_FILES,
        max_dirs: crate::core::package::MAX_DIRS,
        max_package_bytes: crate::oci::OciLimits::DEFAULT.max_package_bytes,
        max_result_bytes: 64 * 1024,
        max_stream_bytes: 2 * 1024 * 1024,
        max_manifest_bytes: 8 * 1024 * 1024,
        max_skipped_listed: 1_000,
        max_walk_entries: 100_000,
    };

    /// Package-style limits for the files of one input or output set (paths
    /// relative to /work).
    pub fn file_set(&self) -> crate::core::package::Limits {
        crate::core::package::Limits {
            max_file_bytes: self.max_file_bytes,
            max_total_bytes: self.max_total_bytes,
            max_files: self.max_files,
            max_dirs: self.max_dirs,
            ..crate::core::package::Limits::DEFAULT
        }
    }

    /// Largest body of a batch PUT: every file at its cap plus the result
    /// files, the manifest and tar overhead (a 512-byte header, up to 511
    /// bytes of padding and a GNU long-name record of at most 2 KiB per
    /// entry, plus slack).
    pub fn max_batch_body_bytes(&self) -> u64 {
        let entries = self.max_files as u64 + 4;
        self.max_total_bytes
            + self.max_result_bytes
            + 2 * self.max_stream_bytes
            + self.max_manifest_bytes
            + entries * (512 + 512 + 2048)
            + 1024 * 1024
    }
}

impl Default for ArtifactLimits {
    fn default() -> Self {
        ArtifactLimits::DEFAULT
    }
}

/// The operator credential's token (see the module docs).
pub fn operator_token(key: &[u8]) -> String {
    crate::core::token::job_token(key, "", OPERATOR_SUBJECT)
}

/// `Authorization` value for a job's own requests.
pub fn job_bearer(namespace: &str, uid: &str, token: &str) -> String {
    format!("Bearer job:{namespace}:{uid}:{}", token.trim())
}

/// `Authorization` value for the gateway and controller.
pub fn operator_bearer(key: &[u8]) -> String {
    format!("Bearer operator:{}", operator_token(key))
}

/// A namespace as Kubernetes allows it (RFC 1123 label).
pub fn check_namespace(ns: &str) -> Result<(), String> {
    let ok = !ns.is_empty()
        && ns.len() <= 63
        && ns.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!("namespace {ns:?} is not a Kubernetes namespace name (lowercase RFC 1123 label, at most 63 characters)"))
    }
}

/// A job UID: Kubernetes UIDs are UUIDs; allow `[A-Za-z0-9-]{1,48}` so
/// the tag `job_<ns>_<uid>_outputs` stays within 128 characters.
pub fn check_uid(uid: &str) -> Result<(), String> {
    if !uid.is_empty() && uid.len() <= 48 && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        Ok(())
    } else {
        Err(format!("job uid {uid:?} is not a UID ([A-Za-z0-9-], 1 to 48 characters)"))
    }
}

/// What a tag holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    Package,
    Inputs,
    Outputs,
    /// A warm pod's [`Claim`] (`claim.json`, the set's one file), under the warm uid.
    Claim,
    /// A warm pod's public key ([`sealed::ClaimKey`], `claim-key.json`), under the warm uid.
    ClaimKey,
}

impl ArtifactKind {
    pub const ALL: [ArtifactKind; 5] =
        [ArtifactKind::Package, ArtifactKind::Inputs, ArtifactKind::Outputs, ArtifactKind::Claim, ArtifactKind::ClaimKey];

    /// Kept under a warm pod's uid only.
    pub fn is_warm_only(self) -> bool {
        matches!(self, ArtifactKind::Claim | ArtifactKind::ClaimKey)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactKind::Package => "package",
            ArtifactKind::Inputs => "inputs",
            ArtifactKind::Outputs => "outputs",
            ArtifactKind::Claim => "claim",
            ArtifactKind::ClaimKey => "claimkey",
        }
    }
}

/// The tag of one of a job's artifacts (namespace and UID already checked).
pub fn tag(namespace: &str, uid: &str, kind: ArtifactKind) -> String {
    format!("job_{namespace}_{uid}_{}", kind.as_str())
}

/// Annotation on job file sets naming their job (`<ns>/<uid>`).
pub const ANNOTATION_JOB: &str = "dev.skill-operator.job";
/// Annotation on namespace packages naming what they are staged for
/// (`<ns>/<digest>`): as [`ANNOTATION_JOB`] does for job sets, it keeps two
/// namespaces' copies of the same bytes from sharing one manifest (and one
/// fate on delete), and a tag pointing at another namespace's copy is refused.
pub const ANNOTATION_PACKAGE: &str = "dev.skill-operator.package";

/// `sha256:` and 64 lowercase hex digits (the only digest form staged
/// packages are named by); `Some(hex)` when `digest` is one.
pub fn sha256_hex(digest: &str) -> Option<&str> {
    digest.strip_prefix("sha256:").filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The tag of a namespace package: `<namespace>.<hex>` for the package
/// pinned at `digest` (`sha256:<hex>`), staged once for every run of the
/// namespace. `None` unless the namespace is a namespace name (a DNS label:
/// no `.` or `_`, so the tag splits back unambiguously and never looks like
/// a job's `job_..._` tag) and the digest is `sha256:` + 64 lowercase hex.
/// At most 63 + 1 + 64 = 128 characters, the OCI tag maximum.
///
/// `digest` is the SkillPackage's pinned OCI manifest digest (what the
/// controller pins), not the sha256 of the archive bytes: the endpoint takes
/// the operator's word for that link. The archive's own sha256 is what `GET
/// .../package` announces and `fetch` verifies.
pub fn namespace_package_tag(namespace: &str, digest: &str) -> Option<String> {
    check_namespace(namespace).ok()?;
    let hex = sha256_hex(digest)?;
    Some(format!("{namespace}.{hex}"))
}

/// The inverse of [`namespace_package_tag`]: `(namespace, "sha256:<hex>")`;
/// `None` for every other tag (a job's `job_<ns>_<uid>_<kind>` never parses).
pub fn parse_namespace_package_tag(tag: &str) -> Option<(String, String)> {
    let (namespace, hex) = tag.split_once('.')?;
    let digest = format!("sha256:{hex}");
    (namespace_package_tag(namespace, &digest)?.as_str() == tag).then(|| (namespace.to_string(), digest))
}

/// The header naming the warm uid on a claimed job's routes (see [`Claim`]).
pub const CLAIM_HEADER: &str = "skill-operator-claim";

/// The one file of a stored claim, and the file the sidecar leaves for the
/// launcher in the claim directory.
pub const CLAIM_FILE: &str = "claim.json";
/// The one file of a warm pod's stored [`sealed::ClaimKey`].
pub const CLAIM_KEY_FILE: &str = "claim-key.json";

/// The most seconds `GET .../claim?wait=` holds a request open: long enough
/// that an idle warm pod asks about once a minute, short enough for every
/// proxy's idle timeout.
pub const CLAIM_WAIT_MAX_SECS: u64 = 60;
/// What a warm pod's sidecar asks for (`?wait=`): under the maximum, so a
/// slow answer is never cut by the endpoint's own bound.
pub const CLAIM_POD_WAIT_SECS: u64 = 30;
/// How often a waiting `GET .../claim` reads the store again, for a claim
/// another endpoint replica stored (one stored here answers at once).
pub const CLAIM_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest a script or interpreter path of a claim may be: a package
/// root and a package path ([`crate::core::limits::PATH_MAX_BYTES`] each).
pub const CLAIM_PATH_MAX_BYTES: usize = 2 * crate::core::limits::PATH_MAX_BYTES;
/// The largest claim body (JSON) a valid [`Claim`] serializes to: every
/// argument byte escaped (`\u0000`, six bytes), every input path at its
/// longest with each byte escaped (`\"`, two bytes), plus the field names.
pub const MAX_CLAIM_BYTES: u64 = {
    use crate::core::limits::{KIB, MAX_ARGS, MAX_ARG_BYTES, MAX_FILES, PATH_MAX_BYTES};
    (6 * MAX_ARG_BYTES
        + 8 * MAX_ARGS
        + 2 * 6 * CLAIM_PATH_MAX_BYTES
        + MAX_FILES * (2 * PATH_MAX_BYTES + 128)
        + CLAIM_PROXY_MAX_BYTES
        + sealed::SEALED_CLAIM_MAX_BYTES) as u64
        + 4 * KIB
};

/// The longest proxy URL a claim carries (`http://job:<ns>.<uid>.<mac>@<ip>:<port>`
/// is under 200 bytes with a namespace at its longest).
pub const CLAIM_PROXY_MAX_BYTES: usize = 512;

/// What a warm pod is handed when a run claims it.
///
/// A warm run pod is started ahead of demand, its package fetched, under an
/// identity of its own, a warm uid ([`is_warm_uid`]): its projected token's
/// audience is [`pod_token_audience`]`(ns, warm_uid)`. When a SkillJob takes
/// it, the operator stores the claim at the endpoint (`PUT
/// /v1/jobs/{ns}/{warm_uid}/claim`, write-once) and the pod's sidecar reads
/// it (`GET .../claim?wait=`), then reads the SkillJob's inputs and stores
/// its outputs on the SkillJob's routes with [`CLAIM_HEADER`] naming the
/// warm uid: the endpoint lets the warm pod's token there only while the
/// claim stored for that warm uid names that SkillJob. The claim holds the
/// run's command and the digests of its inputs, and for a run granted
/// egress its proxy URL: that credential is the run's own, useless from any
/// address but the claimed pod's (the controller seals that address into
/// the SkillJob's status before it stores the claim), and it goes with the
/// run. Granted variables travel only sealed to the claimed pod's own key
/// ([`sealed`]): no store or reader of the claim can open them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Claim {
    /// The SkillJob's uid: its inputs are read and its outputs stored under it.
    pub skilljob_uid: String,
    /// Absolute interpreter path in the run image.
    pub interpreter: String,
    /// Absolute script path, under the pod's package dir (`/package/...` or `/skill/...`).
    pub script: String,
    pub args: Vec<String>,
    pub timeout_secs: u32,
    /// The SkillJob's input files (path inside /work, `sha256:<hex>`), as staged.
    pub inputs: Vec<ClaimInput>,
    /// A run granted egress: its proxy URL (`http://job:<token>@<ip>:<port>`),
    /// which the launcher puts in the script's proxy variables
    /// ([`crate::egress::proxy_env`]). Absent: the run has no network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// A run granted variables: their names and values, sealed to the
    /// claimed pod's key for this SkillJob ([`sealed::seal`]); the launcher
    /// opens them. Absent: the run is granted none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<sealed::SealedEnv>,
}

/// One input file of a [`Claim`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimInput {
    /// Relative to /work, as the endpoint's input routes take it.
    pub path: String,
    /// `sha256:<64 lowercase hex>`.
    pub digest: String,
}

impl Claim {
    /// The rules every claim keeps, checked by the endpoint before it
    /// stores one and again by the pod before it runs one. The caps are the
    /// run's own ([`crate::core::fence::check_args`] for the arguments,
    /// [`crate::core::limits::MAX_TIMEOUT_SECS`]) and the input paths follow
    /// the endpoint's input routes (the path rules and the file-set caps).
    pub fn validate(&self) -> Result<(), String> {
        check_uid(&self.skilljob_uid)?;
        if is_warm_uid(&self.skilljob_uid) {
            return Err(format!("skilljobUid {:?} is a warm pod's uid, not a SkillJob's", self.skilljob_uid));
        }
        check_absolute("interpreter", &self.interpreter)?;
        if self.interpreter.chars().any(char::is_whitespace) {
            return Err(format!("interpreter {:?} contains whitespace", self.interpreter));
        }
        check_absolute("script", &self.script)?;
        crate::core::fence::check_args(&self.args).map_err(|e| e.to_string())?;
        let max = crate::core::limits::MAX_TIMEOUT_SECS;
        if self.timeout_secs == 0 || u64::from(self.timeout_secs) > max {
            return Err(format!("timeoutSecs {} is outside 1..={max}", self.timeout_secs));
        }
        let limits = ArtifactLimits::DEFAULT;
        if self.inputs.len() > limits.max_files {
            return Err(format!("{} inputs, at most {}", self.inputs.len(), limits.max_files));
        }
        for input in &self.inputs {
            crate::core::paths::RelPath::parse(&input.path).map_err(|e| format!("input path {:?}: {e}", input.path))?;
            if sha256_hex(&input.digest).is_none() {
                return Err(format!("input {:?}: digest {:?} is not sha256:<64 lowercase hex>", input.path, input.digest));
            }
        }
        // Duplicates, case and Unicode collisions, depth and directory count:
        // the rules of a staged input set (sizes are not the claim's to say).
        crate::core::package::check_file_set(self.inputs.iter().map(|i| (i.path.as_str(), 0)), &limits.file_set())
            .map_err(|e| format!("inputs: {e}"))?;
        if let Some(proxy) = &self.proxy {
            check_proxy(proxy, &self.skilljob_uid)?;
        }
        if let Some(env) = &self.env {
            env.validate().map_err(|e| format!("env: {e}"))?;
        }
        Ok(())
    }
}

/// A claim's proxy URL: `http://job:<token>@<ip>:<port>`, the token one of
/// the claimed SkillJob's (the proxy checks its mac; a token of another run
/// would fail there anyway, but a claim naming one is wrong on its face),
/// the proxy an address (pods have no DNS), nothing else in it.
fn check_proxy(proxy: &str, skilljob_uid: &str) -> Result<(), String> {
    use crate::egress::identity::{parse_token, PROXY_USER};
    if proxy.len() > CLAIM_PROXY_MAX_BYTES {
        return Err(format!("proxy is longer than {CLAIM_PROXY_MAX_BYTES} bytes"));
    }
    let shape = || format!("proxy {proxy:?} is not http://{PROXY_USER}:<token>@<ip>:<port>");
    let rest =
        proxy.strip_prefix("http://").and_then(|r| r.strip_prefix(PROXY_USER)).and_then(|r| r.strip_prefix(':')).ok_or_else(shape)?;
    let (token, addr) = rest.rsplit_once('@').ok_or_else(shape)?;
    addr.parse::<std::net::SocketAddr>().map_err(|_| shape())?;
    if !token.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-') {
        return Err(shape());
    }
    let (job, _) = parse_token(token).map_err(|_| shape())?;
    if job.uid != skilljob_uid {
        return Err(format!("proxy: the credential is the run {:?}'s, not {skilljob_uid:?}'s", job.uid));
    }
    Ok(())
}

/// An absolute path of the run image: no `.` or `..` segment, no control
/// character, at most [`CLAIM_PATH_MAX_BYTES`].
fn check_absolute(what: &str, path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{what} {path:?} is not an absolute path"));
    }
    if path.len() > CLAIM_PATH_MAX_BYTES {
        return Err(format!("{what} is longer than {CLAIM_PATH_MAX_BYTES} bytes"));
    }
    if path.chars().any(char::is_control) {
        return Err(format!("{what} {path:?} contains a control character"));
    }
    if path.split('/').any(|s| s == ".." || s == ".") {
        return Err(format!("{what} {path:?} has a `.` or `..` segment"));
    }
    Ok(())
}

/// A warm pod's uid: `warm-` and 32 lowercase hex digits. It passes
/// [`check_uid`] (so its tags and token audience are a job's), and no
/// Kubernetes UID (a UUID with dashes) has this form.
pub fn is_warm_uid(uid: &str) -> bool {
    uid.strip_prefix("warm-").is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// One line of `GET /v1/namespaces/packages`: a package staged for every
/// run of `namespace` that pins `digest` (the SkillPackage's OCI manifest
/// digest, `sha256:<hex>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespacePackage {
    pub namespace: String,
    pub digest: String,
}
/// Annotation on job file sets naming their kind (`inputs`, `outputs`).
pub const ANNOTATION_KIND: &str = "dev.skill-operator.kind";

/// One line of `GET /v1/outputs/stored`: this job's outputs are stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutputsStored {
    pub namespace: String,
    pub uid: String,
}

/// `GET .../inputs`: the job's input files. `digest` is the set's OCI
/// manifest digest (pass it as `?set=` when fetching the files); `None` and
/// no files when nothing was staged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InputsManifest {
    pub digest: Option<String>,
    pub files: Vec<SetFile>,
}

/// The outputs `manifest.json` that `upload` writes as the batch's last entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutputManifest {
    /// Always 1.
    pub schema_version: u32,
    pub namespace: String,
    pub uid: String,
    /// `result.json` was there (false: the sidecar was stopped before the
    /// launcher finished, and uploaded what existed).
    pub complete: bool,
    /// Every uploaded entry (`result/...`, `work/...`), sorted by path.
    pub files: Vec<SetFile>,
    /// Files found but not uploaded, in walk order (at most
    /// [`ArtifactLimits::max_skipped_listed`]).
    pub skipped: Vec<Skipped>,
    /// Skipped files beyond those listed.
    #[serde(default)]
    pub skipped_omitted: u64,
}

impl OutputManifest {
    /// Bytes of the `work/` files.
    pub fn work_bytes(&self) -> u64 {
        self.files.iter().filter(|f| f.path.starts_with(WORK_PREFIX)).map(|f| f.size).sum()
    }

    pub fn skipped_total(&self) -> u64 {
        self.skipped.len() as u64 + self.skipped_omitted
    }
}

/// A file `upload` did not send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Skipped {
    /// As it would have been stored (`work/...`, `result/...`); names that
    /// are not UTF-8 are shown lossily.
    pub path: String,
    pub reason: SkipReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// Why a file was not uploaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipReason {
    /// A symlink: never followed (it could point at anything in the container).
    Symlink,
    /// A FIFO, socket or device.
    NotRegular,
    /// Not UTF-8, or breaks the path rules (control characters, over 1,024 bytes...).
    BadName,
    /// Differs only in case or Unicode spelling (NFC) from a file already taken.
    CaseCollision,
    /// Nested deeper than 32 levels (the directory is not descended).
    TooDeep,
    /// Over the per-file cap.
    FileTooLarge,
    /// Would pass the per-job byte cap.
    TotalTooLarge,
    /// Past the per-job file count.
    FileLimit,
    /// Would pass the directory count.
    DirLimit,
    /// The walk stopped here: too many directory entries.
    WalkLimit,
    /// Could not be read.
    Unreadable,
}

/// JSON error body of every non-2xx answer: `{"error":{"code","message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// Every error code the artifact endpoint answers with, and its HTTP status.
/// The server sends `as_str()`; clients parse it back, so both ends name the
/// same variant (a client deciding whether to retry matches on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// A warm pod's claim is stored already, and this one differs.
    AlreadyClaimed,
    BadBody,
    /// A claim that breaks [`Claim::validate`].
    BadClaim,
    /// A warm pod's key that is not a [`sealed::ClaimKey`].
    BadClaimKey,
    /// A package digest that is not `sha256:<64 lowercase hex>` (a namespace
    /// package's route or `?digest=`).
    BadDigest,
    BadJob,
    BadManifest,
    BadPackage,
    BadPath,
    BadQuery,
    BadTar,
    BodyTooLarge,
    /// The body arrived slower than the listener's minimum rate.
    BodyTooSlow,
    /// The body's sha256 is not the `X-Content-Digest` the caller sent.
    ContentDigestMismatch,
    DigestMismatch,
    FileTooLarge,
    Forbidden,
    Internal,
    ManifestMismatch,
    ManifestTooLarge,
    NotFound,
    /// A warm pod's key is published already, and this one differs.
    KeyPublished,
    RegistryAuth,
    RegistryError,
    RegistryUnavailable,
    SetChanged,
    /// Not ready yet: the sample skills are still being seeded and their
    /// SkillPackages applied (`/readyz` only).
    Starting,
    TooManyDirs,
    TooManyFiles,
    TotalTooLarge,
    Unauthorized,
    /// Something the endpoint must ask could not answer (the API server,
    /// for a pod token's TokenReview): retry.
    Unavailable,
    WrongArtifact,
}

impl ErrorCode {
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::AlreadyClaimed,
        ErrorCode::BadBody,
        ErrorCode::BadClaim,
        ErrorCode::BadClaimKey,
        ErrorCode::BadDigest,
        ErrorCode::BadJob,
        ErrorCode::BadManifest,
        ErrorCode::BadPackage,
        ErrorCode::BadPath,
        ErrorCode::BadQuery,
        ErrorCode::BadTar,
        ErrorCode::BodyTooLarge,
        ErrorCode::BodyTooSlow,
        ErrorCode::ContentDigestMismatch,
        ErrorCode::DigestMismatch,
        ErrorCode::FileTooLarge,
        ErrorCode::Forbidden,
        ErrorCode::Internal,
        ErrorCode::ManifestMismatch,
        ErrorCode::ManifestTooLarge,
        ErrorCode::NotFound,
        ErrorCode::KeyPublished,
        ErrorCode::RegistryAuth,
        ErrorCode::RegistryError,
        ErrorCode::RegistryUnavailable,
        ErrorCode::SetChanged,
        ErrorCode::Starting,
        ErrorCode::TooManyDirs,
        ErrorCode::TooManyFiles,
        ErrorCode::TotalTooLarge,
        ErrorCode::Unauthorized,
        ErrorCode::Unavailable,
        ErrorCode::WrongArtifact,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::AlreadyClaimed => "already_claimed",
            ErrorCode::BadBody => "bad_body",
            ErrorCode::BadClaim => "bad_claim",
            ErrorCode::BadClaimKey => "bad_claim_key",
            ErrorCode::BadDigest => "bad_digest",
            ErrorCode::BadJob => "bad_job",
            ErrorCode::BadManifest => "bad_manifest",
            ErrorCode::BadPackage => "bad_package",
            ErrorCode::BadPath => "bad_path",
            ErrorCode::BadQuery => "bad_query",
            ErrorCode::BadTar => "bad_tar",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::BodyTooSlow => "body_too_slow",
            ErrorCode::ContentDigestMismatch => "content_digest_mismatch",
            ErrorCode::DigestMismatch => "digest_mismatch",
            ErrorCode::FileTooLarge => "file_too_large",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Internal => "internal",
            ErrorCode::ManifestMismatch => "manifest_mismatch",
            ErrorCode::ManifestTooLarge => "manifest_too_large",
            ErrorCode::NotFound => "not_found",
            ErrorCode::KeyPublished => "key_published",
            ErrorCode::RegistryAuth => "registry_auth",
            ErrorCode::RegistryError => "registry_error",
            ErrorCode::RegistryUnavailable => "registry_unavailable",
            ErrorCode::SetChanged => "set_changed",
            ErrorCode::Starting => "starting",
            ErrorCode::TooManyDirs => "too_many_dirs",
            ErrorCode::TooManyFiles => "too_many_files",
            ErrorCode::TotalTooLarge => "total_too_large",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::WrongArtifact => "wrong_artifact",
        }
    }

    /// The HTTP status this code is sent with.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::AlreadyClaimed => 409,
            ErrorCode::BadBody => 400,
            ErrorCode::BadClaim => 400,
            ErrorCode::BadClaimKey => 400,
            ErrorCode::BadDigest => 400,
            ErrorCode::BadJob => 400,
            ErrorCode::BadManifest => 400,
            ErrorCode::BadPackage => 400,
            ErrorCode::BadPath => 400,
            ErrorCode::BadQuery => 400,
            ErrorCode::BadTar => 400,
            ErrorCode::BodyTooLarge => 413,
            ErrorCode::BodyTooSlow => 408,
            ErrorCode::ContentDigestMismatch => 400,
            ErrorCode::DigestMismatch => 502,
            ErrorCode::FileTooLarge => 413,
            ErrorCode::Forbidden => 403,
            ErrorCode::Internal => 500,
            ErrorCode::ManifestMismatch => 400,
            ErrorCode::ManifestTooLarge => 413,
            ErrorCode::NotFound => 404,
            ErrorCode::KeyPublished => 409,
            ErrorCode::RegistryAuth => 502,
            ErrorCode::RegistryError => 502,
            ErrorCode::RegistryUnavailable => 503,
            ErrorCode::SetChanged => 409,
            ErrorCode::Starting => 503,
            ErrorCode::TooManyDirs => 413,
            ErrorCode::TooManyFiles => 413,
            ErrorCode::TotalTooLarge => 413,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Unavailable => 503,
            ErrorCode::WrongArtifact => 502,
        }
    }

    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == code)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

/// `sha256:<hex>`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    crate::core::package::digest(bytes)
}

/// The line `upload` writes to the termination log: the manifest digest and
/// counts; never more than a few hundred bytes (the kubelet keeps 4 KiB).
pub fn termination_message(manifest_digest: &str, m: &OutputManifest) -> String {
    format!(
        "{manifest_digest} files={} bytes={} skipped={} complete={}",
        m.files.len(),
        m.files.iter().map(|f| f.size).sum::<u64>(),
        m.skipped_total(),
        m.complete
    )
}

/// An error line for the termination log, cut below 4 KiB.
pub fn termination_error(message: &str) -> String {
    let mut s = format!("error: {message}");
    if s.len() > 3 * 1024 {
        let mut cut = 3 * 1024;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s.replace('\n', " ")
}

#[cfg(test)]
mod namespace_package_tests {
    use super::*;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    #[test]
    fn a_namespace_package_tag_is_namespace_dot_hex_and_parses_back() {
        let d = format!("sha256:{}", "0123456789abcdef".repeat(4));
        let tag = namespace_package_tag("team-a", &d).unwrap();
        assert_eq!(tag, format!("team-a.{}", "0123456789abcdef".repeat(4)));
        assert_eq!(parse_namespace_package_tag(&tag), Some(("team-a".to_string(), d.clone())));
        for ns in ["a", "0", "a-b", "default", "kube-system"] {
            let tag = namespace_package_tag(ns, &d).unwrap();
            assert_eq!(parse_namespace_package_tag(&tag), Some((ns.to_string(), d.clone())), "{ns}");
        }
    }

    #[test]
    fn a_63_character_namespace_makes_a_128_character_tag() {
        let ns = format!("a{}", "b".repeat(61) + "c");
        assert_eq!(ns.len(), 63);
        let tag = namespace_package_tag(&ns, &digest('f')).unwrap();
        assert_eq!(tag.len(), 128, "the OCI tag maximum");
        assert_eq!(parse_namespace_package_tag(&tag), Some((ns.clone(), digest('f'))));
        let long = format!("{ns}d");
        assert_eq!(namespace_package_tag(&long, &digest('f')), None, "64 characters is no namespace");
        assert_eq!(parse_namespace_package_tag(&format!("{long}.{}", "f".repeat(64))), None);
    }

    #[test]
    fn bad_namespaces_and_digests_make_no_tag() {
        let d = digest('a');
        for ns in ["", "Team", "team_a", "team.a", "-a", "a-", "a/b", "a:b", "ä"] {
            assert_eq!(namespace_package_tag(ns, &d), None, "{ns:?}");
        }
        for bad in [
            String::new(),
            "sha256:".into(),
            format!("sha256:{}", "a".repeat(63)),
            format!("sha256:{}", "a".repeat(65)),
            format!("sha256:{}", "A".repeat(64)),
            format!("sha256:{}g", "a".repeat(63)),
            format!("sha512:{}", "a".repeat(64)),
            format!("SHA256:{}", "a".repeat(64)),
            format!("sha256-{}", "a".repeat(64)),
            "a".repeat(64),
            format!(" sha256:{}", "a".repeat(64)),
            format!("sha256:{}\n", "a".repeat(64)),
        ] {
            assert_eq!(namespace_package_tag("team", &bad), None, "{bad:?}");
        }
    }

    #[test]
    fn other_tags_never_parse() {
        let hex = "a".repeat(64);
        for tag in [
            tag("team-a", "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60", ArtifactKind::Package),
            tag("team-a", "uid", ArtifactKind::Inputs),
            format!("job_team-a.{hex}"),
            "latest".into(),
            "readyz-probe".into(),
            format!("team-a.{}", "A".repeat(64)),
            format!("team-a.{}", &hex[1..]),
            format!("team-a.{hex}.x"),
            format!("team-a..{hex}"),
            format!(".{hex}"),
            format!("Team.{hex}"),
            "team-a.".into(),
            "team-a".into(),
        ] {
            assert_eq!(parse_namespace_package_tag(&tag), None, "{tag}");
        }
    }

    #[test]
    fn namespace_packages_serialize_as_namespace_and_digest() {
        let p = NamespacePackage { namespace: "team".into(), digest: digest('b') };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v, serde_json::json!({ "namespace": "team", "digest": digest('b') }));
        assert_eq!(serde_json::from_value::<NamespacePackage>(v).unwrap(), p);
    }
}

#[cfg(test)]
mod claim_tests {
    use super::*;
    use crate::core::limits::{MAX_ARGS, MAX_ARG_BYTES, MAX_FILES, MAX_TIMEOUT_SECS, PATH_MAX_BYTES};

    fn claim() -> Claim {
        Claim {
            skilljob_uid: "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60".into(),
            interpreter: "/usr/bin/python3".into(),
            script: "/package/scripts/stats.py".into(),
            args: vec!["data.csv".into()],
            timeout_secs: 60,
            inputs: vec![ClaimInput { path: "data.csv".into(), digest: format!("sha256:{}", "a".repeat(64)) }],
            proxy: None,
            env: None,
        }
    }

    fn refused(c: Claim, what: &str) {
        let err = c.validate().expect_err(what);
        assert!(err.contains(what), "{what}: {err}");
    }

    #[test]
    fn warm_uids_are_warm_and_32_lowercase_hex_and_pass_as_job_uids() {
        let uid = format!("warm-{}", "0123456789abcdef".repeat(2));
        assert!(is_warm_uid(&uid));
        assert!(check_uid(&uid).is_ok());
        assert!(tag("team-a", &uid, ArtifactKind::Claim).len() <= 128);
        for bad in [
            "warm-".to_string(),
            format!("warm-{}", "a".repeat(31)),
            format!("warm-{}", "a".repeat(33)),
            format!("warm-{}", "A".repeat(32)),
            format!("warm-{}g", "a".repeat(31)),
            format!("Warm-{}", "a".repeat(32)),
            format!("cold-{}", "a".repeat(32)),
            "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60".into(),
        ] {
            assert!(!is_warm_uid(&bad), "{bad}");
        }
    }

    #[test]
    fn a_claim_is_camel_case_json_and_unknown_fields_are_refused() {
        let v = serde_json::to_value(claim()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "skilljobUid": "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60",
                "interpreter": "/usr/bin/python3",
                "script": "/package/scripts/stats.py",
                "args": ["data.csv"],
                "timeoutSecs": 60,
                "inputs": [{"path": "data.csv", "digest": format!("sha256:{}", "a".repeat(64))}],
            })
        );
        let mut extra = v.clone();
        extra["env"] = serde_json::json!({"A": "b"});
        assert!(serde_json::from_value::<Claim>(extra).is_err());
        assert_eq!(serde_json::from_value::<Claim>(v).unwrap(), claim());
    }

    #[test]
    fn each_rule_of_a_claim_at_its_edge() {
        assert_eq!(claim().validate(), Ok(()));
        // Arguments: the run's own caps, exactly allowed and one over.
        assert_eq!(Claim { args: vec!["a".into(); MAX_ARGS], ..claim() }.validate(), Ok(()));
        refused(Claim { args: vec!["a".into(); MAX_ARGS + 1], ..claim() }, "arguments");
        assert_eq!(Claim { args: vec!["x".repeat(MAX_ARG_BYTES)], ..claim() }.validate(), Ok(()));
        refused(Claim { args: vec!["x".repeat(MAX_ARG_BYTES + 1)], ..claim() }, "bytes");
        refused(Claim { args: vec!["a\0b".into()], ..claim() }, "NUL");
        // The timeout.
        assert_eq!(Claim { timeout_secs: 1, ..claim() }.validate(), Ok(()));
        assert_eq!(Claim { timeout_secs: MAX_TIMEOUT_SECS as u32, ..claim() }.validate(), Ok(()));
        refused(Claim { timeout_secs: 0, ..claim() }, "timeoutSecs 0");
        refused(Claim { timeout_secs: MAX_TIMEOUT_SECS as u32 + 1, ..claim() }, "timeoutSecs");
        // The interpreter and the script.
        refused(Claim { interpreter: "python3".into(), ..claim() }, "not an absolute path");
        refused(Claim { interpreter: "/usr/bin/python3 -S".into(), ..claim() }, "whitespace");
        refused(Claim { interpreter: "/usr/bin/../bin/python3".into(), ..claim() }, "`..`");
        refused(Claim { interpreter: "/usr/bin/py\nthon".into(), ..claim() }, "control");
        refused(Claim { script: "scripts/stats.py".into(), ..claim() }, "not an absolute path");
        refused(Claim { script: "/package/../etc/passwd".into(), ..claim() }, "`..`");
        refused(Claim { script: "/package/./x.py".into(), ..claim() }, "`..`");
        refused(Claim { script: "/package/x\u{7}.py".into(), ..claim() }, "control");
        assert_eq!(Claim { script: "/package/my script.py".into(), ..claim() }.validate(), Ok(()), "a space is a name");
        refused(Claim { script: format!("/package/{}", "a".repeat(CLAIM_PATH_MAX_BYTES)), ..claim() }, "longer than");
        // The uid.
        refused(Claim { skilljob_uid: "a/b".into(), ..claim() }, "not a UID");
        refused(Claim { skilljob_uid: String::new(), ..claim() }, "not a UID");
        refused(Claim { skilljob_uid: format!("warm-{}", "a".repeat(32)), ..claim() }, "warm pod's uid");
        // The inputs: the input routes' path rules and caps.
        let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let input = |path: &str| ClaimInput { path: path.into(), digest: digest('b') };
        for bad in ["../x", "/etc/passwd", "a//b", "./a", "a/", ""] {
            refused(Claim { inputs: vec![input(bad)], ..claim() }, "input path");
        }
        refused(Claim { inputs: vec![input("a.txt"), input("a.txt")], ..claim() }, "inputs");
        refused(Claim { inputs: vec![input("A.txt"), input("a.txt")], ..claim() }, "inputs");
        refused(Claim { inputs: vec![ClaimInput { path: "a".into(), digest: "sha256:abc".into() }], ..claim() }, "digest");
        refused(Claim { inputs: vec![ClaimInput { path: "a".into(), digest: digest('A') }], ..claim() }, "digest");
        let many = |n: usize| (0..n).map(|i| input(&format!("f{i}"))).collect::<Vec<_>>();
        assert_eq!(Claim { inputs: many(MAX_FILES), ..claim() }.validate(), Ok(()));
        refused(Claim { inputs: many(MAX_FILES + 1), ..claim() }, "inputs");
    }

    /// The endpoint's body limit for a claim is what the largest valid one needs.
    #[test]
    fn the_largest_valid_claim_fits_max_claim_bytes() {
        let path = |i: usize| {
            let name = format!("{i:04}\"");
            format!("{}{name}", "\"".repeat(PATH_MAX_BYTES - name.len()))
        };
        let big = Claim {
            skilljob_uid: "a".repeat(48),
            interpreter: format!("/{}", "\"".repeat(CLAIM_PATH_MAX_BYTES - 1)),
            script: format!("/{}", "\"".repeat(CLAIM_PATH_MAX_BYTES - 1)),
            args: (0..MAX_ARGS).map(|_| "\u{1}".repeat(MAX_ARG_BYTES / MAX_ARGS)).collect(),
            timeout_secs: MAX_TIMEOUT_SECS as u32,
            inputs: (0..MAX_FILES).map(|i| ClaimInput { path: path(i), digest: format!("sha256:{}", "f".repeat(64)) }).collect(),
            // The longest namespace, at the longest address.
            proxy: Some(crate::egress::proxy_url(
                "[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535",
                &[7u8; 32],
                &crate::egress::JobId::new("n".repeat(63), "a".repeat(48)),
            )),
            // The most variables a claim carries, sealed.
            env: Some({
                let key = sealed::PodKey::generate().unwrap().public();
                let value = "x".repeat(sealed::SEALED_ENV_MAX_BYTES - 10);
                sealed::seal(&key, &"a".repeat(48), &[("V".to_string(), value)]).unwrap()
            }),
        };
        assert_eq!(big.validate(), Ok(()));
        let bytes = serde_json::to_vec(&big).unwrap().len() as u64;
        assert!(bytes <= MAX_CLAIM_BYTES, "{bytes} > {MAX_CLAIM_BYTES}");
    }

    #[test]
    fn a_claims_proxy_is_the_claimed_runs_credential_at_an_address() {
        let c = claim();
        let job = crate::egress::JobId::new("team-a", &c.skilljob_uid);
        let url = crate::egress::proxy_url("10.96.0.9:3128", &[7u8; 32], &job);
        let with = Claim { proxy: Some(url.clone()), ..c.clone() };
        with.validate().unwrap();
        // Absent stays absent on the wire (an older pod reads it).
        assert!(serde_json::to_value(&c).unwrap().get("proxy").is_none());
        assert_eq!(serde_json::from_value::<Claim>(serde_json::to_value(&with).unwrap()).unwrap(), with);

        let other = crate::egress::proxy_url("10.96.0.9:3128", &[7u8; 32], &crate::egress::JobId::new("team-a", "another-run"));
        refused(Claim { proxy: Some(other), ..c.clone() }, "the credential is the run");
        for bad in [
            url.replace("http://", "https://"),
            url.replace("job:", "root:"),
            url.replace("10.96.0.9:3128", "proxy.svc:3128"),
            url.replace(":3128", ""),
            url.replace('@', "@evil@"),
            format!("{url}/path"),
            url.replace("team-a.", "Team-A."),
            "http://job:@10.0.0.1:3128".to_string(),
        ] {
            refused(Claim { proxy: Some(bad.clone()), ..c.clone() }, "is not http://job:<token>@<ip>:<port>");
        }
        refused(Claim { proxy: Some(format!("{url}{}", "0".repeat(CLAIM_PROXY_MAX_BYTES))), ..c.clone() }, "longer than");
    }
}
