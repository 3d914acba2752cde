//! What the server and its spawn helper say to each other: one request per
//! script (length-prefixed, its descriptors attached to the first byte) and
//! one fixed-size reply.
//!
//! Hand-encoded rather than serde: the helper decodes it between a
//! `recvmsg` and a `clone3`, and byte strings (argv, environment, paths)
//! need not be UTF-8.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use super::super::child::{ChildLimits, ChildPlan, Rlimit};

/// The largest request: the fence's arguments (`MAX_ARGS` x `MAX_ARG_BYTES`)
/// and environment fit many times over; anything larger is not a run the
/// fence made. Defined once: the server refuses to send more, the helper
/// to read more.
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Descriptors per request: two streams, up to three cgroups, the kept
/// ones. The kernel's own cap on one message is 253 (`SCM_MAX_FD`).
pub const MAX_REQUEST_FDS: usize = 64;

/// A reply's size on the wire.
pub const REPLY_BYTES: usize = 16;

/// One script to start. The descriptors travel beside it, in this order:
/// stdout's and stderr's write ends, `cgroups` `cgroup.procs` files, then
/// one per entry of `keep`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub program: PathBuf,
    /// The whole argv, `argv[0]` included.
    pub argv: Vec<OsString>,
    /// `NAME=value` entries, the child's whole environment.
    pub envp: Vec<OsString>,
    pub cwd: PathBuf,
    pub limits: ChildLimits,
    pub switch: Option<(u32, u32)>,
    pub clear_groups: bool,
    /// How many `cgroup.procs` descriptors follow the two streams.
    pub cgroups: u32,
    /// The descriptor number each kept descriptor has in the child (the
    /// number it had in the server, so paths like `/proc/self/fd/N` and
    /// bubblewrap's `--json-status-fd N` hold).
    pub keep: Vec<i32>,
}

impl Request {
    /// How many descriptors travel with it.
    pub fn fds(&self) -> usize {
        2 + self.cgroups as usize + self.keep.len()
    }

    /// The child's set-up, with the helper's numbers for the cgroup files.
    pub fn plan(&self, cgroup_fds: Vec<i32>) -> ChildPlan {
        ChildPlan {
            limits: self.limits,
            cgroups: cgroup_fds,
            keep: self.keep.clone(),
            switch: self.switch,
            clear_groups: self.clear_groups,
        }
    }

    /// The body (without its length prefix).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        put_bytes(&mut out, self.program.as_os_str().as_bytes());
        put_list(&mut out, &self.argv);
        put_list(&mut out, &self.envp);
        put_bytes(&mut out, self.cwd.as_os_str().as_bytes());
        let l = &self.limits;
        for limit in [l.data, l.addr, l.nproc, l.fsize, l.cpu, l.nofile] {
            match limit {
                Some(r) => {
                    out.push(1);
                    out.extend_from_slice(&r.cur.to_le_bytes());
                    out.extend_from_slice(&r.max.to_le_bytes());
                }
                None => out.push(0),
            }
        }
        match self.switch {
            Some((uid, gid)) => {
                out.push(1);
                out.extend_from_slice(&uid.to_le_bytes());
                out.extend_from_slice(&gid.to_le_bytes());
            }
            None => out.push(0),
        }
        out.push(u8::from(self.clear_groups));
        out.extend_from_slice(&self.cgroups.to_le_bytes());
        out.extend_from_slice(&(self.keep.len() as u32).to_le_bytes());
        for fd in &self.keep {
            out.extend_from_slice(&fd.to_le_bytes());
        }
        out
    }

    pub fn decode(body: &[u8]) -> Result<Request, WireError> {
        let mut r = Reader { rest: body };
        let program = PathBuf::from(OsString::from_vec(r.bytes()?));
        let argv = r.list()?;
        let envp = r.list()?;
        let cwd = PathBuf::from(OsString::from_vec(r.bytes()?));
        let mut limits = [None; 6];
        for slot in limits.iter_mut() {
            if r.flag()? {
                *slot = Some(Rlimit { cur: r.u64()?, max: r.u64()? });
            }
        }
        let [data, addr, nproc, fsize, cpu, nofile] = limits;
        let switch = if r.flag()? { Some((r.u32()?, r.u32()?)) } else { None };
        let clear_groups = r.flag()?;
        let cgroups = r.u32()?;
        let keep_len = r.u32()? as usize;
        if keep_len > MAX_REQUEST_FDS {
            return Err(WireError::Malformed("too many kept descriptors"));
        }
        let mut keep = Vec::with_capacity(keep_len);
        for _ in 0..keep_len {
            let fd = r.u32()? as i32;
            if fd < 3 {
                return Err(WireError::Malformed("a kept descriptor below 3"));
            }
            keep.push(fd);
        }
        if !r.rest.is_empty() {
            return Err(WireError::Malformed("bytes after the request"));
        }
        let request = Request {
            program,
            argv,
            envp,
            cwd,
            limits: ChildLimits { data, addr, nproc, fsize, cpu, nofile },
            switch,
            clear_groups,
            cgroups,
            keep,
        };
        if request.fds() > MAX_REQUEST_FDS {
            return Err(WireError::Malformed("too many descriptors"));
        }
        Ok(request)
    }
}

/// The step of the child's start that failed (reported with its errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Stage {
    /// The helper could not read the request, or it was malformed.
    Request = 1,
    /// `clone3` itself.
    Clone = 2,
    /// Descriptors, stdio, working directory or process group.
    Setup = 3,
    /// Signals, cgroups, uid, limits (the fence's own set-up).
    Fence = 4,
    /// `execve`.
    Exec = 5,
}

impl Stage {
    pub fn from_u32(v: u32) -> Option<Stage> {
        Some(match v {
            1 => Stage::Request,
            2 => Stage::Clone,
            3 => Stage::Setup,
            4 => Stage::Fence,
            5 => Stage::Exec,
            _ => return None,
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            Stage::Request => "reading the request",
            Stage::Clone => "forking",
            Stage::Setup => "setting up its descriptors and working directory",
            Stage::Fence => "applying the fence (cgroup, uid, limits)",
            Stage::Exec => "executing the program",
        }
    }
}

/// How a start went. A started child's pidfd travels beside `Started`; a
/// child that failed after the fork also sends its pidfd (with `Failed`)
/// so the server, its parent, reaps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Started { pid: i32 },
    Failed { stage: Stage, errno: i32, pid: i32 },
}

impl Reply {
    pub fn encode(self) -> [u8; REPLY_BYTES] {
        let (tag, pid, stage, errno) = match self {
            Reply::Started { pid } => (0u32, pid, 0u32, 0i32),
            Reply::Failed { stage, errno, pid } => (1, pid, stage as u32, errno),
        };
        let mut out = [0u8; REPLY_BYTES];
        out[0..4].copy_from_slice(&tag.to_le_bytes());
        out[4..8].copy_from_slice(&pid.to_le_bytes());
        out[8..12].copy_from_slice(&stage.to_le_bytes());
        out[12..16].copy_from_slice(&errno.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8; REPLY_BYTES]) -> Result<Reply, WireError> {
        let word = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let pid = word(4) as i32;
        match word(0) {
            0 if pid > 0 => Ok(Reply::Started { pid }),
            1 => {
                let stage = Stage::from_u32(word(8)).ok_or(WireError::Malformed("an unknown stage"))?;
                Ok(Reply::Failed { stage, errno: word(12) as i32, pid })
            }
            _ => Err(WireError::Malformed("an unknown reply")),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("the spawn request is malformed: {0}")]
    Malformed(&'static str),
    #[error("the spawn request is {0} bytes, over the {MAX_REQUEST_BYTES}-byte cap (arguments and environment too large)")]
    TooLarge(usize),
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_list(out: &mut Vec<u8>, items: &[OsString]) {
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for item in items {
        put_bytes(out, item.as_bytes());
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], WireError> {
        if self.rest.len() < n {
            return Err(WireError::Malformed("the request ends early"));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn flag(&mut self) -> Result<bool, WireError> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::Malformed("a flag that is neither 0 nor 1")),
        }
    }

    fn bytes(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.u32()? as usize;
        let b = self.take(n)?;
        if b.contains(&0) {
            // Every one of them becomes a C string.
            return Err(WireError::Malformed("a NUL byte inside a string"));
        }
        Ok(b.to_vec())
    }

    fn list(&mut self) -> Result<Vec<OsString>, WireError> {
        let n = self.u32()? as usize;
        // Each entry takes at least its 4-byte length: a count the body
        // cannot hold is refused before anything is allocated for it.
        if n > self.rest.len() / 4 {
            return Err(WireError::Malformed("a list longer than the request"));
        }
        (0..n).map(|_| self.bytes().map(OsString::from_vec)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Request {
        Request {
            program: "/usr/bin/python3".into(),
            argv: vec!["/usr/bin/python3".into(), "/proc/self/fd/9".into(), OsString::from_vec(vec![0xff, b'x'])],
            envp: vec!["PATH=/usr/bin".into(), "HOME=/tmp".into()],
            cwd: "/data/jobs/j1/work".into(),
            limits: ChildLimits {
                data: Some(Rlimit { cur: 1 << 29, max: 1 << 29 }),
                addr: None,
                nproc: Some(Rlimit { cur: 256, max: 256 }),
                fsize: None,
                cpu: Some(Rlimit { cur: 300, max: 301 }),
                nofile: Some(Rlimit { cur: 256, max: 256 }),
            },
            switch: Some((60000, 60000)),
            clear_groups: true,
            cgroups: 1,
            keep: vec![9, 12],
        }
    }

    #[test]
    fn a_request_reads_back_as_sent() {
        let r = request();
        assert_eq!(Request::decode(&r.encode()), Ok(r.clone()));
        assert_eq!(r.fds(), 5);
        let none = Request { limits: ChildLimits::default(), switch: None, clear_groups: false, keep: vec![], cgroups: 0, ..r };
        assert_eq!(Request::decode(&none.encode()), Ok(none));
    }

    #[test]
    fn every_cut_of_a_request_is_refused() {
        let body = request().encode();
        for cut in 0..body.len() {
            assert!(Request::decode(&body[..cut]).is_err(), "a request cut at {cut} of {} bytes was accepted", body.len());
        }
        let mut longer = body.clone();
        longer.push(0);
        assert_eq!(Request::decode(&longer), Err(WireError::Malformed("bytes after the request")));
    }

    #[test]
    fn strings_with_nul_and_low_or_many_descriptors_are_refused() {
        let mut r = request();
        r.argv.push(OsString::from_vec(b"a\0b".to_vec()));
        assert_eq!(Request::decode(&r.encode()), Err(WireError::Malformed("a NUL byte inside a string")));
        let r = Request { keep: vec![2], ..request() };
        assert_eq!(Request::decode(&r.encode()), Err(WireError::Malformed("a kept descriptor below 3")));
        let r = Request { keep: (3..3 + MAX_REQUEST_FDS as i32 - 2).collect(), ..request() };
        assert_eq!(Request::decode(&r.encode()), Err(WireError::Malformed("too many descriptors")));
        // A list count the body cannot hold allocates nothing.
        let mut huge = Vec::new();
        put_bytes(&mut huge, b"/bin/true");
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Request::decode(&huge), Err(WireError::Malformed("a list longer than the request")));
    }

    #[test]
    fn replies_read_back_and_nonsense_is_refused() {
        for reply in [Reply::Started { pid: 4242 }, Reply::Failed { stage: Stage::Exec, errno: libc::ENOENT, pid: 17 }] {
            assert_eq!(Reply::decode(&reply.encode()), Ok(reply));
        }
        assert!(Reply::decode(&Reply::Started { pid: 0 }.encode()).is_err(), "a start without a pid");
        let mut bad = Reply::Failed { stage: Stage::Clone, errno: 1, pid: 0 }.encode();
        bad[8] = 99;
        assert!(Reply::decode(&bad).is_err());
        bad[0] = 7;
        assert!(Reply::decode(&bad).is_err());
    }
}
