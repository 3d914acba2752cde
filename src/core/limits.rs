//! Every bound the project enforces, in one place, so the code, the tool
//! descriptions, the error messages, the Kubernetes builders and the docs
//! quote the same numbers. Nothing else defines a cap: a module that needs
//! one names the constant here (a test scans tool descriptions for figures
//! that are not one of these).
//!
//! The caps are limits on this process's own heap as well as on response
//! size: a skill package can be larger than the memory a hosted server may
//! use, so each read is bounded before bytes are allocated.
//!
//! Where two concepts share a value on purpose the constant is shared too:
//! a skill, a package and a job's inputs or outputs all stop at
//! [`MAX_FILES`] files of [`MAX_FILE_BYTES`] each and [`MAX_TOTAL_BYTES`]
//! in all, so whatever a run can produce fits what a skill may ship.

use std::time::Duration;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;

// ---- skills and packages ------------------------------------------------

/// Bytes of `SKILL.md` read; anything past this is not read and the skill is
/// flagged `skill-md-truncated`.
pub const SKILL_MD_READ_CAP: u64 = 256 * KIB;
/// Bytes of the frontmatter block between the two `---` lines.
pub const FRONTMATTER_CAP: usize = 64 * 1024;
/// Files per skill, per package, and per job input or output set.
pub const MAX_FILES: usize = 2_000;
/// Directories walked per skill or package.
pub const MAX_DIRS: usize = 2_000;
/// Bytes per file of a package, or per input or output file of a job.
pub const MAX_FILE_BYTES: u64 = 32 * MIB;
/// Bytes of all files of a package, or of a job's inputs, or of its outputs.
pub const MAX_TOTAL_BYTES: u64 = 128 * MIB;
/// Skills served across all roots. Real repositories hold 400-900 skills;
/// skill-mcp stops at 32.
pub const SKILLS_TOTAL: usize = 5_000;
/// Longest relative path (bytes) anywhere: read tools, packages, jobs.
pub const PATH_MAX_BYTES: usize = 1_024;
/// Deepest directory nesting walked inside a skill, a package or a job.
pub const MAX_DEPTH: usize = 32;
/// `serve --layout recursive`: deepest skill directory below a root, in
/// folders (`plugins/<p>/skills/<n>` is 4). Deeper ones are reported
/// `dir-limit`, not served.
pub const RECURSIVE_DEPTH: usize = 6;
/// A SkillSource's fetched tree (a repository or ZIP, all its skills):
/// files. The largest public skill repositories hold about 10,000.
pub const SOURCE_MAX_FILES: usize = 50_000;
/// A SkillSource's fetched tree: folders.
pub const SOURCE_MAX_DIRS: usize = 20_000;
/// A SkillSource's fetched tree: bytes of all files (each file keeps
/// [`MAX_FILE_BYTES`]: every skill becomes a package).
pub const SOURCE_MAX_TOTAL_BYTES: u64 = 512 * MIB;
/// A SkillSource ZIP as downloaded (it is held in memory while unpacked).
pub const SOURCE_ZIP_BYTES: u64 = 64 * MIB;
/// Skills one SkillSource may turn into SkillPackages.
pub const SOURCE_MAX_SKILLS: usize = 2_000;
/// Plugins of other repositories one SkillSource's marketplace may have
/// followed (each is a fetch of its own; all share the source's caps).
pub const SOURCE_MAX_FOLLOWED: usize = 256;
/// Problems a SkillSource's status lists (then a count).
pub const SOURCE_PROBLEMS_LISTED: usize = 100;
/// `serve --layout recursive`: folders listed per root while looking for
/// skills (a guard against a root that is a whole home directory).
pub const RECURSIVE_DIRS: usize = 10 * MAX_DIRS;
/// Bytes of a `.claude-plugin/marketplace.json` or `plugin.json` read.
pub const MARKETPLACE_READ_CAP: u64 = MIB;
/// Largest uncompressed-to-compressed ratio of a ZIP upload (a bomb guard).
pub const MAX_ZIP_RATIO: u64 = 200;
/// Below this many uncompressed bytes the ZIP ratio is not checked.
pub const ZIP_RATIO_FLOOR: u64 = MIB;

// ---- read tools ---------------------------------------------------------

/// `skill_file`: paths per call.
pub const FILE_PATHS_PER_CALL: usize = 8;
/// `skill_file`: bytes returned per entry (the rest is cut and flagged).
pub const FILE_ENTRY_CAP: u64 = MIB;
/// `skill_file`: bytes per call, checked from file sizes before reading.
pub const FILE_CALL_CAP: u64 = 4 * MIB;
/// `resources/read`: largest file served whole (SEP-2640's per-skill limit).
pub const RESOURCE_READ_CAP: u64 = 16 * MIB;

/// Agent Skills spec: name length.
pub const SPEC_NAME_MAX: usize = 64;
/// Agent Skills spec: description length.
pub const SPEC_DESCRIPTION_MAX: usize = 1_024;
/// Agent Skills spec: compatibility length.
pub const SPEC_COMPATIBILITY_MAX: usize = 500;

/// SEP-2640: files per skill in a `skills/list` manifest.
pub const EXTENSION_FILES_MAX: usize = 512;
/// SEP-2640: bytes per skill in a `skills/list` manifest.
pub const EXTENSION_BYTES_MAX: u64 = 16 * MIB;

// ---- runs ---------------------------------------------------------------

/// Arguments per run.
pub const MAX_ARGS: usize = 64;
/// Total bytes of all arguments per run.
pub const MAX_ARG_BYTES: usize = 8 * 1024;
/// Script timeout when the declaration names none (seconds).
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// Hard ceiling on any script timeout (seconds), locally and in a Job.
pub const MAX_TIMEOUT_SECS: u64 = 300;
/// Warm run pods: a pool's most (the CRD's bound on `spec.warm.min` and `max`).
pub const WARM_POOL_MAX: u32 = 20;
/// A pool's `max` when the binding does not say.
pub const WARM_POOL_DEFAULT_MAX: u32 = 3;
/// A pool's idle timeout when the binding does not say (10 minutes).
pub const WARM_IDLE_DEFAULT_SECS: u32 = 600;
/// Warm pods a namespace may hold across its pools when neither its
/// annotation nor the controller's flag says otherwise.
pub const WARM_NAMESPACE_DEFAULT_BUDGET: u32 = 10;
/// Bytes of stdout, and of stderr, kept per run; the rest is counted and dropped.
pub const STREAM_CAP: u64 = MIB;
/// SIGTERM to the script's process group, then SIGKILL after this.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// After the script exits, its pipes are read at most this long.
pub const DRAIN: Duration = Duration::from_millis(250);
/// Slack on top of timeout + grace + drain before a run is given up on.
pub const HARD_DEADLINE_SLACK: Duration = Duration::from_secs(1);

/// Memory for the whole run (every process, shared memory included) (MCPBox).
pub const RUN_MEMORY_BYTES: u64 = 512 * MIB;
/// CPUs for the whole run.
pub const RUN_CPUS: u64 = 1;
/// Processes and threads of the whole run.
pub const RUN_PIDS: u64 = 128;
/// `RLIMIT_NPROC` of a run that has a cgroup: the cgroup counts the run
/// itself ([`RUN_PIDS`]); this per-uid backstop stays out of its way, so a
/// fork bomb meets the cgroup's limit (and is reported) first.
pub const RUN_UID_PROCS: u64 = 2 * RUN_PIDS;
/// Largest file a script may write (RLIMIT_FSIZE).
pub const RUN_FILE_BYTES: u64 = 64 * MIB;
/// Open files per process (RLIMIT_NOFILE).
pub const RUN_OPEN_FILES: u64 = 256;
/// Size of the run's private tmpfs, which holds its `/tmp` and `/dev/shm`
/// (the sandbox's root and `/dev` are read-only).
pub const RUN_TMP_BYTES: u64 = 64 * MIB;
/// The CPU bandwidth period of a run's cgroup (`cpu.max`, microseconds);
/// the quota is [`RUN_CPUS`] periods per period.
pub const RUN_CPU_PERIOD_US: u64 = 100_000;
/// How often a running script's cgroup counters (memory, processes) and
/// its `/work` usage are checked. A run that passes a limit is stopped
/// within about this long (the kernel enforces memory, processes and
/// the tmpfs size at once; this bounds how long a run may sit past a
/// limit, and how far past the job cap `/work` may grow before it stops).
pub const RUN_WATCH_INTERVAL: Duration = Duration::from_millis(100);
/// Entries (files, directories, links) a run may leave under `/work`;
/// more is over the job's disk limit (each costs an inode, and the
/// output listing stops at [`MAX_FILES`] anyway).
pub const RUN_WORK_ENTRIES: usize = 10 * MAX_FILES;
/// Dedicated uids a `--run-as-uids` range may hold.
pub const RUN_UID_RANGE_MAX: u32 = 65_536;

// ---- jobs ---------------------------------------------------------------

/// Bytes per upload call, and of all inline inputs of one `skill_run` call.
pub const JOB_UPLOAD_CHUNK: u64 = MIB;
/// Jobs kept per server (and SkillJobs per namespace, through the gateway).
pub const JOBS_RETAINED: usize = 100;
/// Bytes returned per read call.
pub const JOB_READ_CHUNK: u64 = 256 * KIB;
/// Largest `job.json` read back (2,000 inputs with 1 KiB paths fit easily).
pub const JOB_RECORD_CAP: u64 = 8 * MIB;
/// Bytes of outputs hashed per run when they are listed; files past the
/// budget are listed with their size and without a digest.
pub const OUTPUT_HASH_BUDGET: u64 = MAX_TOTAL_BYTES;

// ---- preparation (prepared run images) ---------------------------------

/// Wall-clock limit of the dependency build: the launcher runs `image deps`
/// as its script, so the run ceiling applies.
pub const BUILD_TIMEOUT_SECS: u64 = MAX_TIMEOUT_SECS;
/// CPU of the build container (requests = limits).
pub const BUILD_CPU: &str = "1";
/// Memory of the build container: pip and npm resolving a large tree.
pub const BUILD_MEMORY: &str = "1Gi";
/// Ephemeral storage of the build container, and the size of its `/work`
/// (the installed tree; at most [`MAX_TOTAL_BYTES`] of it comes back).
pub const BUILD_EPHEMERAL: &str = "1Gi";
/// Bytes of the build's stderr quoted in a `PreparationFailed` message.
pub const BUILD_LOG_TAIL_BYTES: usize = 4 * 1024;
/// How long a finished build Job stays (`kubectl logs` on a failed one).
pub const BUILD_TTL_SECS: i32 = 3600;
/// Prepared images whose package annotation a controller remembers having
/// checked (the check before a run is one registry GET per new image).
pub const VERIFIED_IMAGES_KEPT: usize = 1024;
// ---- the egress proxy's CiliumNetworkPolicy (--egress-cilium-fqdn-policy) --

/// Host entries (names, wildcards, IPs) the union of every SkillPackage's
/// `runtime.allowedEgress` may hold in the policy; past it the policy allows
/// DNS only (fail closed) and the controller says why.
pub const CILIUM_FQDN_MAX_HOSTS: usize = 1_000;
/// Ports in one Cilium PortRule (the CRD schema's `maxItems`).
pub const CILIUM_PORTS_PER_RULE: usize = 40;
/// After the API server answered that the CiliumNetworkPolicy resource is
/// not there, how long before the controller tries again.
pub const CILIUM_CRD_RECHECK: Duration = Duration::from_secs(300);
/// An applied policy is applied again after this long even when nothing
/// changed, so an edit or deletion by someone else does not last.
pub const CILIUM_REAPPLY: Duration = Duration::from_secs(600);

// ---- the HTTP endpoint ----------------------------------------------------

/// MCP sessions (2025-11-25 and older) held at once; past it the oldest
/// idle session is closed, and when none is idle a new one is refused.
pub const HTTP_SESSIONS_MAX: usize = 256;
/// A session idle this long is closed.
pub const HTTP_SESSION_IDLE: Duration = Duration::from_secs(300);
/// Messages queued per session stream before the sender waits.
pub const HTTP_SESSION_QUEUE: usize = 16;
/// Random bytes of a generated bearer token.
pub const HTTP_TOKEN_BYTES: usize = 32;
/// The largest MCP request body over HTTP (`serve` and the gateway): one
/// upload chunk in base64 (a third larger) plus the JSON-RPC envelope.
pub const MCP_BODY_LIMIT: u64 = JOB_UPLOAD_CHUNK.div_ceil(3) * 4 + 64 * KIB;

// ---- every HTTP listener (src/listener) -----------------------------------

/// Time for a request head (request line and headers) to arrive: from the
/// accept for a connection's first request, from the head's first byte for
/// later ones. A slowloris client is cut here (408).
pub const LISTEN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A kept-alive connection with no next request for this long is closed
/// (between requests only: a streaming response is never cut by it).
pub const LISTEN_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A request body may take this long plus its size at [`LISTEN_BODY_MIN_RATE`]
/// (a 128 MiB upload: 10 s + 2,048 s); slower is cut (408).
pub const LISTEN_BODY_GRACE: Duration = Duration::from_secs(10);
/// The slowest average a request body may arrive at, bytes per second.
pub const LISTEN_BODY_MIN_RATE: u64 = 64 * KIB;
/// Connections open at once on one listener; past it a new one is answered 503 and closed.
pub const LISTEN_MAX_CONNECTIONS: usize = 4_096;
/// Connections open at once from one client address on one listener (a run
/// pod is one address: one script cannot hold the whole listener). Behind a
/// proxy every client is the proxy's address: raise it there.
pub const LISTEN_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// Bytes of a request head, request line included; past it 431.
pub const LISTEN_MAX_HEAD_BYTES: usize = 32 * 1024;
/// Header lines of a request head; past it 431.
pub const LISTEN_MAX_HEADERS: usize = 100;

// ---- the gateway --------------------------------------------------------

/// Namespaces one gateway replica serves at once; past it a new namespace
/// is answered 503 (held ones keep working).
pub const GATEWAY_NAMESPACES_MAX: usize = 10_000;
/// MCP sessions (2025-11-25 and older) per namespace.
pub const GATEWAY_SESSIONS_PER_NAMESPACE: usize = 1_024;
/// Quiet time after a binding or package change before the namespaces it
/// touches are rebuilt (a `kubectl apply` of many bindings is one rebuild).
pub const GATEWAY_REBUILD_DEBOUNCE: Duration = Duration::from_millis(200);
/// How long a call waits for a binding the controller has not decided on
/// yet (just applied, or changed) before it is answered without it.
pub const GATEWAY_SETTLE_WAIT: Duration = Duration::from_secs(15);
/// The largest file the gateway's file route (`/files/{namespace}/{job}/{path}`)
/// moves in one request, up or down: the per-file cap of a job's inputs and
/// outputs. Files over [`JOB_UPLOAD_CHUNK`] need it (an MCP call carries at
/// most that much).
pub const FILE_ROUTE_BYTES: u64 = MAX_FILE_BYTES;
/// How often a client polling an MCP task (`tasks/get`) is asked to poll:
/// a run lasts seconds to minutes, and each poll reads its SkillJob.
pub const TASK_POLL_INTERVAL: Duration = Duration::from_secs(2);

// ---- rate limits per principal (src/mcp/ratelimit.rs) --------------------

/// Principals one server (a `serve` process, or one gateway namespace)
/// tracks buckets for at once; past it a principal it does not track yet is
/// refused as over its limit (fail closed) until idle buckets age out.
pub const RATE_PRINCIPALS_MAX: usize = 10_000;
/// Checks between two sweeps of buckets that have refilled (and so hold
/// nothing a fresh bucket would not): keeps memory at the principals seen
/// within one refill time, not every principal ever seen.
pub const RATE_SWEEP_EVERY: u64 = 4_096;
/// How long a `tools/call` refused by its caller's `calls` limit is held
/// before its answer goes back (never longer than its retry-after). A
/// caller that retries at once, as an agent in a loop does, is paced to one
/// call per hold per connection instead of taking the server's cores from
/// everyone else; a caller that honours retryAfterSeconds waits longer anyway.
pub const RATE_REFUSAL_HOLD: Duration = Duration::from_millis(25);
/// What a call refused because its server's limits are unknown (fail
/// closed) is told to wait: about how long the gateway takes to notice the
/// Namespace watch working again ([`RATE_NAMESPACE_RECHECK`]).
pub const RATE_CLOSED_RETRY: Duration = Duration::from_secs(5);
/// How long the gateway's Namespace watch may fail before the limits it
/// read are called unknown: a watch restarts now and then (an expired
/// resourceVersion, a rolled API server) and those seconds change nothing.
pub const RATE_NAMESPACE_STALE_AFTER: Duration = Duration::from_secs(30);
/// How often every served namespace's limits are looked at again, changed
/// or not (a failing watch sends no change to wake anyone).
pub const RATE_NAMESPACE_RECHECK: Duration = Duration::from_secs(5);
/// The longest value of the Namespace annotation setting a namespace's
/// rate limits (`gateway::ratelimits::ANNOTATION`) that is read.
pub const RATE_LIMITS_ANNOTATION_MAX: usize = 256;

// ---- the artifact endpoint's built-in store (`artifacts --store DIR`) -----

/// Largest blob the store accepts: the compressed package layer (the
/// content cap plus tar and gzip overhead), which is also what
/// `oci::OciLimits` lets a pull download. Every job file is smaller.
pub const STORE_BLOB_MAX_BYTES: u64 = MAX_TOTAL_BYTES + 8 * MIB;
/// Largest manifest or index body (distribution's own limit).
pub const STORE_MANIFEST_MAX_BYTES: u64 = 4 * MIB;
/// Blob uploads open at once; past it a new one is refused (429) until
/// one finishes or is given up.
pub const STORE_UPLOADS_MAX: usize = 256;
/// An upload with no request for this long is given up and its bytes freed.
pub const STORE_UPLOAD_IDLE: Duration = Duration::from_secs(600);
/// How often blobs no manifest names are swept.
pub const STORE_GC_INTERVAL: Duration = Duration::from_secs(600);
/// A blob younger than this (written, or found present by a push) is never
/// swept: a push uploads blobs before the manifest that names them.
pub const STORE_GC_GRACE: Duration = Duration::from_secs(3600);

// The caps that must agree, checked when the crate compiles: a job's
// outputs fit what a package may ship, inline inputs are one upload call,
// the default timeout is under the ceiling.
const _: () = assert!(MAX_FILE_BYTES <= MAX_TOTAL_BYTES);
const _: () = assert!(JOB_UPLOAD_CHUNK <= MAX_FILE_BYTES);
const _: () = assert!(FILE_ROUTE_BYTES > JOB_UPLOAD_CHUNK && FILE_ROUTE_BYTES <= MAX_FILE_BYTES);
const _: () = assert!(MCP_BODY_LIMIT > JOB_UPLOAD_CHUNK.div_ceil(3) * 4);
const _: () = assert!(DEFAULT_TIMEOUT_SECS <= MAX_TIMEOUT_SECS);
const _: () = assert!(OUTPUT_HASH_BUDGET >= MAX_TOTAL_BYTES);
const _: () = assert!(BUILD_TIMEOUT_SECS <= MAX_TIMEOUT_SECS);
const _: () = assert!(RUN_PIDS >= 8 && RUN_CPUS >= 1);
const _: () = assert!(STORE_GC_GRACE.as_secs() > STORE_UPLOAD_IDLE.as_secs());

/// Renders a byte count the way the docs write it: `1 MiB`, `256 KiB`, `8192 bytes`.
pub fn bytes_text(n: u64) -> String {
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} bytes")
    }
}

/// Renders a count with thousands separators, as the docs write it: `2,000`.
pub fn count_text(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Every figure a person may read in a tool description or message, as it
/// is written there. A description that names a figure not in this list
/// typed it by hand; the test in `mcp` refuses that.
pub fn figures() -> Vec<String> {
    let mut out = Vec::new();
    for b in [
        SKILL_MD_READ_CAP,
        MAX_FILE_BYTES,
        MAX_TOTAL_BYTES,
        FILE_ENTRY_CAP,
        FILE_CALL_CAP,
        RESOURCE_READ_CAP,
        STREAM_CAP,
        MAX_ARG_BYTES as u64,
        JOB_UPLOAD_CHUNK,
        JOB_READ_CHUNK,
        RUN_MEMORY_BYTES,
        RUN_FILE_BYTES,
        RUN_TMP_BYTES,
    ] {
        out.push(bytes_text(b));
        out.push(b.to_string());
    }
    for n in [
        MAX_FILES,
        MAX_DIRS,
        FILE_PATHS_PER_CALL,
        MAX_ARGS,
        JOBS_RETAINED,
        PATH_MAX_BYTES,
        MAX_DEPTH,
        SEARCH_RESULTS_DEFAULT,
        SEARCH_RESULTS_MAX,
    ] {
        out.push(count_text(n));
        out.push(n.to_string());
    }
    for s in [DEFAULT_TIMEOUT_SECS, MAX_TIMEOUT_SECS, RUN_PIDS, RUN_CPUS, RUN_OPEN_FILES] {
        out.push(s.to_string());
    }
    out
}

/// `skill_search`: the query's length (characters) and the words of it
/// that count, and the most results one call returns (its default: 10).
pub const SEARCH_QUERY_MAX_CHARS: usize = 200;
pub const SEARCH_QUERY_MAX_WORDS: usize = 16;
pub const SEARCH_RESULTS_MAX: usize = 50;
pub const SEARCH_RESULTS_DEFAULT: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_render_as_the_docs_write_them() {
        assert_eq!(bytes_text(MIB), "1 MiB");
        assert_eq!(bytes_text(256 * KIB), "256 KiB");
        assert_eq!(bytes_text(8 * 1024), "8 KiB");
        assert_eq!(bytes_text(1000), "1000 bytes");
        assert_eq!(count_text(2_000), "2,000");
        assert_eq!(count_text(100), "100");
        assert_eq!(count_text(1_234_567), "1,234,567");
    }
}
