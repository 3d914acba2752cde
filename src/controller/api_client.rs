//! The controller's two API clients: one for requests, one for watches.
//!
//! kube's client waits for ever by default. A request whose connection went
//! silent (a peer gone without a reset, a middlebox holding it) then holds
//! its reconcile, and with it its object, for as long as the process lives;
//! a watch whose answer never began holds its whole cache the same way, and
//! one whose stream went silent is given up only by kube-runtime's idle
//! timeout, 295 s after its last event. So:
//! - requests get a read timeout just above the API server's own (it
//!   answers a request it has not finished in 60 s with a 504);
//! - watches are renewed every `--watch-timeout` seconds (kube-runtime
//!   gives one up 5 s after that without an event), and their own client
//!   gives up a connection silent for [`WATCH_SILENCE_MARGIN`] longer, which
//!   covers a watch or list whose answer never started.

use std::time::Duration;

use anyhow::Context as _;

/// How long a request may go without a byte of its answer (the API
/// server's own request timeout is 60 s).
pub const DEFAULT_API_TIMEOUT_SECS: u32 = 70;
/// How long a watch lasts before it is renewed (kube-runtime's default).
pub const DEFAULT_WATCH_TIMEOUT_SECS: u32 = 290;
/// How much longer than a watch's own timeout its connection may stay silent.
pub const WATCH_SILENCE_MARGIN: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// Seconds a request to the API server may go without an answer before it is given up and
    /// tried again: a connection that went silent never holds a reconcile for good.
    #[arg(long, default_value_t = DEFAULT_API_TIMEOUT_SECS, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub api_timeout: u32,
    /// Seconds each watch lasts before it is renewed; one silent for longer is given up, so a
    /// watch on a silently dropped connection is found within this time and a few seconds.
    #[arg(long, default_value_t = DEFAULT_WATCH_TIMEOUT_SECS, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub watch_timeout: u32,
}

/// The clients for requests and for watches, from the in-cluster config or KUBECONFIG.
pub async fn clients(args: &ApiArgs) -> anyhow::Result<(kube::Client, kube::Client)> {
    let config = kube::Config::infer().await.context("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let (requests, watches) = configs(config, args);
    let requests = kube::Client::try_from(requests).context("cannot make the API client")?;
    let watches = kube::Client::try_from(watches).context("cannot make the API client for watches")?;
    Ok((requests, watches))
}

/// The two configs: the read timeout counts from each request sent, not
/// from when its pooled connection went idle.
fn configs(config: kube::Config, args: &ApiArgs) -> (kube::Config, kube::Config) {
    let mut requests = config.clone();
    requests.read_timeout = Some(Duration::from_secs(args.api_timeout.into()));
    requests.reset_reader_on_write = true;
    let mut watches = config;
    watches.read_timeout = Some(Duration::from_secs(args.watch_timeout.into()) + WATCH_SILENCE_MARGIN);
    watches.reset_reader_on_write = true;
    (requests, watches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        api: ApiArgs,
    }

    #[test]
    fn requests_and_watches_each_get_their_bound() {
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let (requests, watches) = configs(config, &ApiArgs { api_timeout: 70, watch_timeout: 290 });
        assert_eq!(requests.read_timeout, Some(Duration::from_secs(70)));
        assert_eq!(watches.read_timeout, Some(Duration::from_secs(300)), "longer than kube-runtime's own 295 s for a silent stream");
        assert!(requests.reset_reader_on_write && watches.reset_reader_on_write);
    }

    #[test]
    fn the_flags_default_and_refuse_zero() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!((cli.api.api_timeout, cli.api.watch_timeout), (DEFAULT_API_TIMEOUT_SECS, DEFAULT_WATCH_TIMEOUT_SECS));
        assert!(Cli::try_parse_from(["x", "--api-timeout", "0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--watch-timeout", "0"]).is_err());
        let cli = Cli::try_parse_from(["x", "--api-timeout", "5", "--watch-timeout", "15"]).unwrap();
        assert_eq!((cli.api.api_timeout, cli.api.watch_timeout), (5, 15));
    }
}
