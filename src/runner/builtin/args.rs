//! The command line of `skill-operator sandbox-exec`: exactly the bubblewrap
//! options [`crate::runner::sandbox::bwrap_args`] writes, with bubblewrap's
//! meaning, so one argv builder serves both backends and a preview names
//! the same sandbox whichever carries it out. Anything else is refused:
//! a flag this sandbox would silently ignore is a hole in the fence.

use std::ffi::{OsStr, OsString};
use std::os::fd::RawFd;
use std::path::PathBuf;

/// One filesystem step, carried out in order below the new root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `--symlink TARGET LINK`
    Symlink { target: PathBuf, link: PathBuf },
    /// `--proc DEST`: a procfs of the sandbox's own PID namespace.
    Proc(PathBuf),
    /// `--dev DEST`: a small tmpfs with the harmless device nodes bound in.
    Dev(PathBuf),
    /// `--size N --tmpfs DEST`
    Tmpfs { dest: PathBuf, size: Option<u64> },
    /// `--ro-bind`, `--ro-bind-try` (`must_exist: false`), `--bind` (`writable`).
    Bind { src: PathBuf, dest: PathBuf, writable: bool, must_exist: bool },
    /// `--ro-bind-fd FD DEST`: bind what an open descriptor names.
    BindFd { fd: RawFd, dest: PathBuf },
    /// `--remount-ro DEST`
    RemountRo(PathBuf),
}

/// Everything the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub ops: Vec<Op>,
    pub status_fd: Option<RawFd>,
    pub chdir: Option<PathBuf>,
    /// The program and its arguments (after `--`).
    pub argv: Vec<OsString>,
}

/// A command line this sandbox does not carry out, in words.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("unknown option {0:?}: the built-in sandbox takes only the options skill-operator itself writes")]
    Unknown(OsString),
    #[error("{0} needs {1} argument(s)")]
    Missing(&'static str, usize),
    #[error("{flag}: {value:?} is not a number")]
    Number { flag: &'static str, value: OsString },
    #[error("{flag}: {path:?} is not an absolute path without `..`")]
    Relative { flag: &'static str, path: PathBuf },
    #[error("--size must come right before --tmpfs")]
    DanglingSize,
    #[error("the namespace options must all be given (--unshare-all --unshare-user --disable-userns --cap-drop ALL --die-with-parent --new-session): this sandbox has no weaker shape")]
    Weaker,
    #[error("no program after --")]
    NoProgram,
}

/// Options that only restate this sandbox's one shape: they must all be
/// present (a caller that left one out expects a sandbox this is not).
const SHAPE: &[&str] = &["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"];

pub fn parse(args: &[OsString]) -> Result<Plan, ArgsError> {
    let mut plan = Plan { ops: Vec::new(), status_fd: None, chdir: None, argv: Vec::new() };
    let mut shape: Vec<&str> = Vec::new();
    let mut cap_drop_all = false;
    let mut size: Option<u64> = None;
    let mut i = 0;
    let take = |i: &mut usize, flag: &'static str, n: usize| -> Result<Vec<&OsStr>, ArgsError> {
        let got: Vec<&OsStr> = args.get(*i + 1..*i + 1 + n).ok_or(ArgsError::Missing(flag, n))?.iter().map(|a| a.as_os_str()).collect();
        *i += n;
        Ok(got)
    };
    let abs = |flag: &'static str, p: &OsStr| -> Result<PathBuf, ArgsError> {
        let path = PathBuf::from(p);
        if path.is_absolute() && !path.components().any(|c| c == std::path::Component::ParentDir) {
            Ok(path)
        } else {
            Err(ArgsError::Relative { flag, path })
        }
    };
    let number = |flag: &'static str, v: &OsStr| -> Result<u64, ArgsError> {
        v.to_str().and_then(|s| s.parse::<u64>().ok()).ok_or_else(|| ArgsError::Number { flag, value: v.to_owned() })
    };
    while i < args.len() {
        let flag = args[i].to_str().ok_or_else(|| ArgsError::Unknown(args[i].clone()))?;
        if size.is_some() && flag != "--tmpfs" {
            return Err(ArgsError::DanglingSize);
        }
        match flag {
            "--" => {
                plan.argv = args[i + 1..].to_vec();
                break;
            }
            f if SHAPE.contains(&f) => shape.push(SHAPE[SHAPE.iter().position(|s| *s == f).unwrap_or(0)]),
            "--cap-drop" => {
                let v = take(&mut i, "--cap-drop", 1)?;
                if v[0] != "ALL" {
                    return Err(ArgsError::Unknown(v[0].to_owned()));
                }
                cap_drop_all = true;
            }
            "--symlink" => {
                let v = take(&mut i, "--symlink", 2)?;
                plan.ops.push(Op::Symlink { target: PathBuf::from(v[0]), link: abs("--symlink", v[1])? });
            }
            "--proc" => plan.ops.push(Op::Proc(abs("--proc", take(&mut i, "--proc", 1)?[0])?)),
            "--dev" => plan.ops.push(Op::Dev(abs("--dev", take(&mut i, "--dev", 1)?[0])?)),
            "--size" => size = Some(number("--size", take(&mut i, "--size", 1)?[0])?),
            "--tmpfs" => {
                let dest = abs("--tmpfs", take(&mut i, "--tmpfs", 1)?[0])?;
                plan.ops.push(Op::Tmpfs { dest, size: size.take() });
            }
            "--ro-bind" | "--ro-bind-try" | "--bind" => {
                let name: &'static str = match flag {
                    "--ro-bind" => "--ro-bind",
                    "--ro-bind-try" => "--ro-bind-try",
                    _ => "--bind",
                };
                let v = take(&mut i, name, 2)?;
                plan.ops.push(Op::Bind {
                    src: abs(name, v[0])?,
                    dest: abs(name, v[1])?,
                    writable: name == "--bind",
                    must_exist: name != "--ro-bind-try",
                });
            }
            "--ro-bind-fd" => {
                let v = take(&mut i, "--ro-bind-fd", 2)?;
                let fd = number("--ro-bind-fd", v[0])?;
                let fd = RawFd::try_from(fd).map_err(|_| ArgsError::Number { flag: "--ro-bind-fd", value: v[0].to_owned() })?;
                plan.ops.push(Op::BindFd { fd, dest: abs("--ro-bind-fd", v[1])? });
            }
            "--remount-ro" => plan.ops.push(Op::RemountRo(abs("--remount-ro", take(&mut i, "--remount-ro", 1)?[0])?)),
            "--json-status-fd" => {
                let v = take(&mut i, "--json-status-fd", 1)?;
                let fd = number("--json-status-fd", v[0])?;
                plan.status_fd =
                    Some(RawFd::try_from(fd).map_err(|_| ArgsError::Number { flag: "--json-status-fd", value: v[0].to_owned() })?);
            }
            "--chdir" => plan.chdir = Some(abs("--chdir", take(&mut i, "--chdir", 1)?[0])?),
            _ => return Err(ArgsError::Unknown(args[i].clone())),
        }
        i += 1;
    }
    if size.is_some() {
        return Err(ArgsError::DanglingSize);
    }
    if !cap_drop_all || SHAPE.iter().any(|s| !shape.contains(s)) {
        return Err(ArgsError::Weaker);
    }
    if plan.argv.is_empty() {
        return Err(ArgsError::NoProgram);
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    const FULL: &[&str] =
        &["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent", "--new-session"];

    fn with(extra: &[&str]) -> Vec<OsString> {
        let mut v = os(FULL);
        v.extend(os(extra));
        v
    }

    #[test]
    fn reads_every_option_the_argv_builder_writes() {
        let plan = parse(&with(&[
            "--symlink",
            "usr/lib",
            "/lib",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            "1024",
            "--tmpfs",
            "/tmp",
            "--ro-bind",
            "/usr",
            "/usr",
            "--ro-bind-try",
            "/etc/ld.so.cache",
            "/etc/ld.so.cache",
            "--bind",
            "/w",
            "/work",
            "--ro-bind-fd",
            "7",
            "/exe",
            "--remount-ro",
            "/",
            "--json-status-fd",
            "9",
            "--chdir",
            "/work",
            "--",
            "/usr/bin/python3",
            "-c",
            "--proc",
        ]))
        .expect("parses");
        assert_eq!(plan.ops.len(), 9);
        assert_eq!(plan.ops[3], Op::Tmpfs { dest: "/tmp".into(), size: Some(1024) });
        assert_eq!(
            plan.ops[5],
            Op::Bind { src: "/etc/ld.so.cache".into(), dest: "/etc/ld.so.cache".into(), writable: false, must_exist: false }
        );
        assert_eq!(plan.ops[6], Op::Bind { src: "/w".into(), dest: "/work".into(), writable: true, must_exist: true });
        assert_eq!(plan.status_fd, Some(9));
        assert_eq!(plan.chdir, Some("/work".into()));
        assert_eq!(plan.argv, os(&["/usr/bin/python3", "-c", "--proc"]), "everything after -- is the program's");
    }

    /// Whatever the argv builder writes, in its fullest shape, this parser
    /// takes: a flag added there and not here fails this test, not a run.
    #[test]
    fn takes_the_argv_builders_fullest_output() {
        use crate::runner::process::ExecSpec;
        use crate::runner::sandbox::{bwrap_args, SandboxSpec};
        let mut sb = SandboxSpec::builtin(7).with_network(true).ro_bind("/usr").rw_bind("/tmp");
        sb.fd_binds.push((7, "/run/exe".into()));
        sb.symlinks.push(("usr/lib".into(), "/lib-test".into()));
        sb.wrapper = vec!["/usr/bin/env".into(), "--".into()];
        sb.status_fd = Some(9);
        let mut spec = ExecSpec::new("/usr/bin/true", "/tmp");
        spec.args = vec!["--help".into(), "--".into()];
        let argv = bwrap_args(&sb, &spec.inside()).expect("a valid spec");
        let plan = parse(&argv).expect("the built-in sandbox takes every option bwrap_args writes");
        assert_eq!(plan.argv, os(&["/usr/bin/env", "--", "/usr/bin/true", "--help", "--"]));
        assert_eq!(plan.status_fd, Some(9));
        assert!(plan.ops.contains(&Op::BindFd { fd: 7, dest: "/run/exe".into() }));
        assert!(plan.ops.iter().any(|op| matches!(op, Op::RemountRo(p) if p.as_os_str() == "/")));
    }

    #[test]
    fn refuses_what_it_would_not_carry_out() {
        assert!(matches!(parse(&with(&["--share-net", "--", "/bin/true"])), Err(ArgsError::Unknown(_))));
        assert!(matches!(parse(&with(&["--cap-add", "ALL", "--", "/bin/true"])), Err(ArgsError::Unknown(_))));
        assert_eq!(parse(&with(&["--bind", "/a", "--", "/bin/true"])), Err(ArgsError::Relative { flag: "--bind", path: "--".into() }));
        assert_eq!(
            parse(&with(&["--bind", "relative", "/x", "--", "/bin/true"])),
            Err(ArgsError::Relative { flag: "--bind", path: "relative".into() })
        );
        assert_eq!(
            parse(&with(&["--bind", "/a", "/x/../etc", "--", "/bin/true"])),
            Err(ArgsError::Relative { flag: "--bind", path: "/x/../etc".into() })
        );
        assert_eq!(parse(&with(&["--size", "10", "--proc", "/proc", "--", "/bin/true"])), Err(ArgsError::DanglingSize));
        assert_eq!(parse(&with(&["--size", "ten", "--tmpfs", "/tmp"])), Err(ArgsError::Number { flag: "--size", value: "ten".into() }));
        assert_eq!(parse(&with(&["--chdir"])), Err(ArgsError::Missing("--chdir", 1)));
        assert_eq!(parse(&with(&["--"])), Err(ArgsError::NoProgram));
    }

    #[test]
    fn every_namespace_option_is_required() {
        for (left_out, flag) in FULL.iter().enumerate() {
            if *flag == "ALL" {
                continue;
            }
            let mut v: Vec<&str> = FULL.to_vec();
            v.remove(left_out);
            if *flag == "--cap-drop" {
                v.retain(|a| *a != "ALL");
            }
            v.extend(["--", "/bin/true"]);
            assert_eq!(parse(&os(&v)), Err(ArgsError::Weaker), "without {flag}");
        }
    }
}
