//! The built-in sandbox's seccomp filter: what bubblewrap's
//! `--disable-userns` does (no nested user namespace, the usual first step
//! of kernel attack-surface probing), and the kernel keyring, which no
//! namespace separates from the host's.
//!
//! Written as classic BPF by hand: a dozen instructions that are easier to
//! audit here than a filter compiler's output. Refused calls fail with
//! `EPERM` (the script sees an ordinary error), `clone3` with `ENOSYS` so
//! libc falls back to `clone`, whose flags a filter can read (`clone3`
//! passes them in memory, out of a filter's reach). A syscall of a foreign
//! ABI (x32 on x86-64, or another architecture) kills the process: its
//! numbers would mean other calls.

/// `AUDIT_ARCH_*` of this build, `None` where the filter is not written.
#[cfg(target_arch = "x86_64")]
const ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCH: Option<u32> = None;

/// x32 syscalls on x86-64 have this bit set in their number.
const X32_BIT: u32 = 0x4000_0000;

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const fn ret_errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA)
}

// offsets in struct seccomp_data
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// Low 32 bits of args[0] (little-endian; the namespace flags live there).
const OFF_ARG0_LO: u32 = 16;

/// Calls refused outright with EPERM.
const DENIED: &[libc::c_long] = &[libc::SYS_setns, libc::SYS_keyctl, libc::SYS_add_key, libc::SYS_request_key];

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter program, or `None` on an architecture it is not written for.
pub fn program() -> Option<Vec<libc::sock_filter>> {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let arch = ARCH?;
    let ld = |off| stmt((BPF_LD | BPF_W | BPF_ABS) as u16, off);
    let ret = |k| stmt((BPF_RET | BPF_K) as u16, k);
    let jeq = |k, jt, jf| jump((BPF_JMP | BPF_JEQ | BPF_K) as u16, k, jt, jf);

    let mut p = vec![ld(OFF_ARCH), jeq(arch, 1, 0), ret(RET_KILL), ld(OFF_NR)];
    if cfg!(target_arch = "x86_64") {
        p.push(jump((BPF_JMP | BPF_JGE | BPF_K) as u16, X32_BIT, 0, 1));
        p.push(ret(RET_KILL));
    }
    p.push(jeq(libc::SYS_clone3 as u32, 0, 1));
    p.push(ret(ret_errno(libc::ENOSYS)));
    for nr in DENIED {
        p.push(jeq(*nr as u32, 0, 1));
        p.push(ret(ret_errno(libc::EPERM)));
    }
    // unshare(flags) and clone(flags, ...): refused when flags ask for a user namespace.
    p.push(jeq(libc::SYS_unshare as u32, 1, 0));
    p.push(jeq(libc::SYS_clone as u32, 0, 3));
    p.push(ld(OFF_ARG0_LO));
    p.push(jump((BPF_JMP | BPF_JSET | BPF_K) as u16, libc::CLONE_NEWUSER as u32, 0, 1));
    p.push(ret(ret_errno(libc::EPERM)));
    p.push(ret(RET_ALLOW));
    Some(p)
}

/// Install the filter on the calling thread (inherited by everything it
/// execs and forks). Needs `no_new_privs`, which the caller has set.
///
/// # Safety
/// Async-signal-safe: meant for a freshly forked child. `prog` must come
/// from [`program`].
pub unsafe fn install(prog: &[libc::sock_filter]) -> std::io::Result<()> {
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    // SAFETY: fprog points at a live, well-formed program for the duration of the call.
    let rc =
        unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER as libc::c_ulong, &fprog as *const _ as libc::c_ulong, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jumps stay inside the program and every path ends in a return.
    #[test]
    fn every_jump_lands_inside_the_program() {
        let Some(p) = program() else { return };
        assert!(p.len() < 64, "a short filter: {} instructions", p.len());
        for (i, ins) in p.iter().enumerate() {
            if ins.code as u32 & 0x07 == libc::BPF_JMP {
                assert!(i + 1 + (ins.jt as usize) < p.len() && i + 1 + (ins.jf as usize) < p.len(), "jump at {i} leaves the program");
            }
        }
        assert_eq!(p.last().map(|i| (i.code as u32, i.k)), Some((libc::BPF_RET | libc::BPF_K, RET_ALLOW)));
    }
}
