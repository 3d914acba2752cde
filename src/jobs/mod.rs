//! The job store: one directory per job, holding the inputs a client
//! uploaded, the single run of a script over them, and what that run left
//! behind. Synchronous and filesystem-only; the MCP tools and the runners
//! call into it. It lives outside `core` because it is state on disk with a
//! lifecycle, not a rule.
//!
//! # Layout
//!
//! ```text
//! <root>/jobs/<id>/job.json   the record (JobRecord), replaced atomically
//! <root>/jobs/<id>/work/      inputs; the script's cwd (/work); outputs
//! <root>/jobs/<id>/stdout     captured streams, written by finish_run
//! <root>/jobs/<id>/stderr
//! <root>/jobs/<id>/outputs.json  the output listing, made once when the run ends
//! ```
//!
//! `jobs/` is `0711` and every job directory `0700` (the server's): a run's
//! uid may pass through to its own work directory while it runs (the
//! runner hands that directory to it and takes it back), never list the
//! jobs or open another job's files.
//!
//! A job is born in a `.tmp-<uuid>` directory and renamed into place, and is
//! deleted by renaming it to `.trash-<uuid>` first, so a crash never leaves a
//! half-made or half-deleted job under a real id; [`JobStore::open`] sweeps
//! both kinds of leftover, and the `job.json.tmp-*` files an interrupted
//! record write leaves behind.
//!
//! # Why the lifecycle is what it is
//!
//! `Created -> Running -> Succeeded | Failed | TimedOut`, or `Interrupted`.
//!
//! - **One run per job.** A run mutates `work/`: the script may rewrite or
//!   delete its inputs. A second run would start from whatever the first left
//!   behind, so "the same job run twice" would not mean "the same inputs run
//!   twice", and outputs of the two runs could not be told apart. A job is
//!   therefore the record of exactly one run; running again means a new job.
//! - **Uploads are closed once a job has run.** For the same reason: an upload
//!   after the run would mix client bytes into the script's outputs, and the
//!   job record would no longer say which files the script produced. Closing
//!   uploads at `begin_run` also means nothing but the script writes to
//!   `work/` from then on.
//! - **Interrupted runs are never re-run.** A job found `Running` when the
//!   store opens was cut off by a restart. Its script may have had side
//!   effects (network, partial outputs), and tool calls are not idempotent, so
//!   silently running it again could do them twice. It is marked
//!   `Interrupted` with a note and left for the client to inspect; running
//!   again is an explicit new job.
//! - **A running job's files are withheld.** While the script runs it can
//!   swap a checked file for a symlink between our check and our open; once
//!   the runner has reported the end of the run (and so has stopped the
//!   script) nothing writes to `work/` any more and the checks hold.
//!   The runner must therefore call [`JobStore::finish_run`] only after the
//!   script's process group is gone; if it cannot confirm that, it should
//!   leave the job `Running` (files stay withheld, delete is refused).
//!
//! # Symlinks and other hostile entries
//!
//! The script is third-party code with write access to `work/`: it can plant
//! `out -> /etc/passwd`, `d -> /`, or a link into a sibling job. So:
//!
//! - every client path passes [`RelPath::parse`] before any filesystem access
//!   (no `..`, no absolute paths, no percent escapes, no NUL, no backslash);
//! - every read of a work file goes through [`resolve_inside`] against the
//!   real `work/` directory: the real path, symlinks followed, must stay
//!   inside it and be a regular file, otherwise the read is refused. A link
//!   to another file *inside* `work/` is served;
//! - the output listing never follows a symlink: links, FIFOs, sockets and
//!   devices are reported as skipped with a reason;
//! - uploads never write through a symlink: every parent directory inside
//!   `work/` is checked with `lstat` and refused if it is a link, a new file
//!   is made with `create_new` (which does not follow a final symlink), and
//!   an appended file is checked by comparing the opened handle's inode with
//!   the `lstat` of its name;
//! - the store's own files (`job.json`, `stdout`, `stderr`) are opened only if
//!   `lstat` says they are regular files and the opened handle is that file.
//!
//! # Concurrency
//!
//! One mutex serialises every state transition (create, upload, begin/finish
//! run, delete), so two `begin_run` calls on one job cannot both succeed and
//! concurrent `create` calls cannot pass the retained-jobs cap. Reads of a
//! finished job take no lock: a finished state is final and record writes
//! are atomic renames.

mod error;
mod fsops;
mod outputs;
mod store;
mod types;

pub use error::{JobError, Result};
pub use store::JobStore;
pub use types::*;

/// Note put on a job found running when the store opens.
pub const INTERRUPTED_NOTE: &str = "the server restarted during this run; it was not re-run";

const RECORD: &str = "job.json";
const WORK: &str = "work";
const STDOUT: &str = "stdout";
const STDERR: &str = "stderr";
const OUTPUTS: &str = "outputs.json";
const NEW_JOB_PREFIX: &str = ".tmp-";
const TRASH_PREFIX: &str = ".trash-";

#[cfg(test)]
mod tests;
