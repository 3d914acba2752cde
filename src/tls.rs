//! TLS trust for every HTTP client of this binary.
//!
//! The roots are the system's CA bundle. A machine (or container image)
//! without one is not an error until TLS is used: building a client must
//! never fail or panic for it (the in-pod `fetch` talks plain HTTP to an IP
//! and once panicked with "No CA certificates were loaded from the
//! system"). Such a machine gets clients that trust nothing: a TLS
//! connection then fails with an unknown-issuer error, and [`NO_ROOTS`]
//! says why.

use std::sync::OnceLock;

/// Said next to a TLS failure on a machine without a CA bundle.
pub const NO_ROOTS: &str =
    "this machine has no CA bundle, so no TLS peer can be verified (use plain HTTP to an address, or give the image ca-certificates)";

/// A certificate whose private key was destroyed when it was made: trusting
/// only it is trusting nothing. oci-client takes a "these roots only" list
/// only when it is non-empty, so this stands in for the empty list.
const TRUSTS_NOTHING: &str = "-----BEGIN CERTIFICATE-----
MIIBpjCCAU2gAwIBAgIUcX+GzmR9+5daI0isVqG6j/DMiHcwCgYIKoZIzj0EAwIw
KDEmMCQGA1UEAwwdc2tpbGwtb3BlcmF0b3IgdHJ1c3RzIG5vdGhpbmcwIBcNMjYx
MjAxMTEzMTI3WhgPMjEyNjExMDcxMTMxMjdaMCgxJjAkBgNVBAMMHXNraWxsLW9w
ZXJhdG9yIHRydXN0cyBub3RoaW5nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE
Ym8qLdwR6SlvNqdbxMgai4GsicB1TZlSo9SGOsl7vzg+F0RMfLNGsuKC3BaaNJKv
VwdIhsBz2riKm1R5aLd0+aNTMFEwHQYDVR0OBBYEFMD1L+0ui9kMLruq1TTEAu7F
MilBMB8GA1UdIwQYMBaAFMD1L+0ui9kMLruq1TTEAu7FMilBMA8GA1UdEwEB/wQF
MAMBAf8wCgYIKoZIzj0EAwIDRwAwRAIgUcjA/vOxnLEjrqnV3Uw5/7skzMsfAw6x
NgjDYpXqhccCIEBtUMQ1AvjvnYLgK2eFTRulBmBXeI+sWShhtFr6oB5F
-----END CERTIFICATE-----
";

/// reqwest is built without a crypto provider of its own (this crate uses
/// ring, like kube), so any reqwest client needs a process default: this
/// installs ring unless one is installed already. [`crate::oci::Registry::new`]
/// calls it; call it before building other reqwest clients.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Whether the system's CA bundle loads (checked once per process).
pub fn system_roots() -> bool {
    static ROOTS: OnceLock<bool> = OnceLock::new();
    *ROOTS.get_or_init(|| {
        install_crypto_provider();
        let ok = reqwest::Client::builder().build().is_ok();
        if !ok {
            tracing::info!("{NO_ROOTS}");
        }
        ok
    })
}

/// A reqwest builder with the right trust: the system's, or none.
pub fn reqwest_builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    let builder = reqwest::Client::builder();
    if system_roots() {
        builder
    } else {
        builder.tls_certs_only(Vec::<reqwest::Certificate>::new())
    }
}

/// An oci-client configuration with the right trust: the system's, or none.
pub fn oci_client_config(mut config: oci_client::client::ClientConfig) -> oci_client::client::ClientConfig {
    if !system_roots() {
        config.tls_certs_only = vec![oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data: TRUSTS_NOTHING.as_bytes().to_vec(),
        }];
    }
    config
}

/// A client for calls that need nothing special.
pub fn default_client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest_builder().build()
}
