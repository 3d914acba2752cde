//! `skill-operator`: parse the command line and hand over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Logs go to stderr: over stdio, stdout belongs to the protocol.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SKILL_OPERATOR_LOG").unwrap_or_else(|_| "warn".into()))
        .init();
    let cli = skill_operator::cli::Cli::parse();
    match skill_operator::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("skill-operator: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}
