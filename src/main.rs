//! `skill-operator`: parse the command line and hand over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    // Logs go to stderr: over stdio, stdout belongs to the protocol.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SKILL_OPERATOR_LOG").unwrap_or_else(|_| "warn".into()))
        .init();
    let cli = skill_operator::cli::Cli::parse();
    if let Some(code) = skill_operator::cli::run_single_threaded(&cli) {
        return code;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("skill-operator: cannot start the async runtime: {err}");
            return std::process::ExitCode::from(2);
        }
    };
    runtime.block_on(run(cli))
}

async fn run(cli: skill_operator::cli::Cli) -> std::process::ExitCode {
    // Before anything else runs: a SIGTERM must never meet the default action.
    let shutdown = match skill_operator::shutdown::Shutdown::on_signals() {
        Ok(shutdown) => shutdown,
        Err(err) => {
            eprintln!("skill-operator: cannot install the signal handlers: {err}");
            return std::process::ExitCode::from(2);
        }
    };
    match skill_operator::cli::run(cli, shutdown).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("skill-operator: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}
