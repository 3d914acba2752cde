//! `skill-operator sandbox-init` (hidden): the first program of a sandbox
//! whose run has granted egress. It binds the egress forwarder on the
//! sandbox's own loopback (`--forward 127.0.0.1:3128=/run/.../egress.sock`),
//! then runs the script as its child and exits with the script's status
//! (a signal `N` as `128 + N`, as bubblewrap reports it).
//!
//! Why a parent and not an `exec`: the forwarder must keep running while
//! the script does, in the sandbox's network namespace (the only place
//! `127.0.0.1:3128` means the sandbox's loopback). The listener is bound
//! before the script starts, so the script never meets a proxy address
//! that is not listening yet. It holds nothing secret: the environment is
//! the script's own, and the socket is one the script could open itself;
//! the proxy on the far end decides everything. If the script kills it,
//! the script only loses its network.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitCode;

/// The hidden subcommand's flags.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// `ADDR=SOCKET`: listen on ADDR (inside the sandbox) and relay every connection to the unix socket SOCKET.
    #[arg(long = "forward", value_name = "ADDR=SOCKET")]
    pub forward: Vec<String>,
    /// The program to run and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<OsString>,
}

/// Why `sandbox-init` could not start the script.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("--forward {0:?}: expected ADDR=SOCKET, e.g. 127.0.0.1:3128=/run/skill-operator/egress.sock")]
    BadForward(String),
    #[error("cannot listen on {addr} inside the sandbox: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot start {program:?}: {source}")]
    Spawn { program: OsString, source: std::io::Error },
}

fn parse_forward(text: &str) -> Result<(SocketAddr, PathBuf), InitError> {
    let (addr, socket) = text.split_once('=').ok_or_else(|| InitError::BadForward(text.to_string()))?;
    let addr: SocketAddr = addr.parse().map_err(|_| InitError::BadForward(text.to_string()))?;
    if socket.is_empty() {
        return Err(InitError::BadForward(text.to_string()));
    }
    Ok((addr, PathBuf::from(socket)))
}

/// Run the subcommand: the script's exit status, or 127 (with the reason
/// on stderr) when it could not be started.
pub async fn command(args: InitArgs) -> ExitCode {
    match run(args).await {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("skill-operator sandbox-init: {err}");
            ExitCode::from(127)
        }
    }
}

async fn run(args: InitArgs) -> Result<u8, InitError> {
    let never = std::future::pending::<()>;
    for text in &args.forward {
        let (addr, socket) = parse_forward(text)?;
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| InitError::Listen { addr, source })?;
        tokio::spawn(crate::egress::forward::forward(listener, socket, never()));
    }
    let (program, rest) = args.command.split_first().ok_or_else(|| InitError::Spawn {
        program: OsString::new(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no program given"),
    })?;
    let mut child =
        tokio::process::Command::new(program).args(rest).spawn().map_err(|source| InitError::Spawn { program: program.clone(), source })?;
    let status = loop {
        match child.wait().await {
            Ok(status) => break status,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(InitError::Spawn { program: program.clone(), source }),
        }
    };
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(signal)) => (128 + signal).clamp(0, 255) as u8,
        (None, None) => 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_specs() {
        let (addr, socket) = parse_forward("127.0.0.1:3128=/run/x.sock").unwrap();
        assert_eq!((addr.port(), socket), (3128, PathBuf::from("/run/x.sock")));
        assert!(parse_forward("127.0.0.1:3128").is_err());
        assert!(parse_forward("localhost:1=/x").is_err());
        assert!(parse_forward("127.0.0.1:1=").is_err());
    }
}
