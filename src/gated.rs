//! Gated tests and benchmarks: ones that need something the machine may
//! not have (an API server, a cluster, root, bubblewrap). When the
//! prerequisite is missing they call [`skip`], which prints a visible
//! `SKIPPED:` line and returns, so a skip never looks like a pass in the
//! log; with `SKILL_OPERATOR_REQUIRE_GATED=1` (set by CI on a machine that
//! has the prerequisites) it fails the test instead, so that machine proves
//! it ran them.

/// The flags a gated test or benchmark gives a `controller` it starts
/// beside an API server with no cluster around it: nobody's tokens to
/// review for `/metrics`, and no node to run the NetworkPolicy probe's pod.
pub const CONTROLLER_WITHOUT_CLUSTER: [&str; 4] = ["--metrics-auth", "none", "--network-policy-probe", "false"];

/// The variable that turns every skip into a failure.
pub const REQUIRE_GATED: &str = "SKILL_OPERATOR_REQUIRE_GATED";

/// Whether skips are failures in this run.
pub fn required() -> bool {
    std::env::var(REQUIRE_GATED).is_ok_and(|v| v == "1")
}

/// Report that `what` did not run because `why`. Panics (fails the test)
/// when [`REQUIRE_GATED`] is `1`.
#[track_caller]
pub fn skip(what: &str, why: &str) {
    if required() {
        panic!("{what} did not run ({why}), and {REQUIRE_GATED}=1 requires it to");
    }
    println!("SKIPPED: {what}: {why}");
    eprintln!("SKIPPED: {what}: {why}");
}

/// Whether this process runs as root (several fence tests need a second uid).
pub fn is_root() -> bool {
    // SAFETY: trivial getter.
    unsafe { libc::geteuid() == 0 }
}
