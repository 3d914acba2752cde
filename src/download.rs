//! One HTTP GET read whole under a byte cap: what a catalog refresh and a
//! SkillSource ZIP both download. Callers build the client from
//! [`crate::tls::reqwest_builder`] (the process's trust) with their own
//! timeouts, and map [`DownloadError`] onto their own errors.

/// Why a capped GET gave no body.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The request or the body failed: the error with its causes, and why
    /// TLS cannot work on a machine without a CA bundle.
    #[error("{0}")]
    Request(String),
    #[error("answered {0}")]
    Status(reqwest::StatusCode),
    /// Longer than the cap (by its Content-Length, or while read).
    #[error("larger than {0} bytes")]
    TooLarge(u64),
}

impl DownloadError {
    /// Whether trying again later may succeed (the server, not the content).
    pub fn is_transient(&self) -> bool {
        match self {
            DownloadError::Request(_) => true,
            DownloadError::Status(s) => s.is_server_error() || *s == reqwest::StatusCode::TOO_MANY_REQUESTS,
            DownloadError::TooLarge(_) => false,
        }
    }
}

/// GETs `url` with `client`; the body, at most `cap` bytes.
pub async fn capped(client: &reqwest::Client, url: &str, cap: u64) -> Result<Vec<u8>, DownloadError> {
    let failed = |e: reqwest::Error| DownloadError::Request(describe(&e));
    let mut response = client.get(url).send().await.map_err(failed)?;
    if !response.status().is_success() {
        return Err(DownloadError::Status(response.status()));
    }
    if response.content_length().is_some_and(|n| n > cap) {
        return Err(DownloadError::TooLarge(cap));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if bytes.len() as u64 + chunk.len() as u64 > cap {
            return Err(DownloadError::TooLarge(cap));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// A reqwest error with its causes, and the missing-CA-bundle hint where it applies.
pub fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    if !crate::tls::system_roots() {
        text.push_str(&format!(" ({})", crate::tls::NO_ROOTS));
    }
    text
}
