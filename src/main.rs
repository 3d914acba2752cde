//! `skill-operator`: parse the command line and hand over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = skill_operator::cli::Cli::parse();
    // Kept until the end of main: dropping it flushes the last spans.
    let _telemetry = skill_operator::telemetry::init(cli.service_name());
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
