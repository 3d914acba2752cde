//! The file route's contract, shared by the route ([`super::files`]), the
//! namespaces that hold an executor for it and the executor itself: where
//! the route lives, how a file's URL is spelled (MCP answers name it), and
//! what the route asks of a namespace's executor.

use futures::stream::BoxStream;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use super::executor::error::ExecError;
use crate::jobs::FileInfo;
use crate::mcp::executor::Caller;

/// Where the route is mounted.
pub const FILES_PREFIX: &str = "/files";

/// Characters escaped in a path segment of the route.
const SEGMENT: &AsciiSet = &CONTROLS.add(b' ').add(b'"').add(b'#').add(b'%').add(b'<').add(b'>').add(b'?').add(b'`').add(b'{').add(b'}');

/// The route's path for `path` in `job` of `namespace`, each segment escaped.
pub fn route_path(namespace: &str, job: &str, path: &str) -> String {
    let encoded: Vec<String> = path.split('/').map(|seg| utf8_percent_encode(seg, SEGMENT).to_string()).collect();
    format!("{FILES_PREFIX}/{namespace}/{job}/{}", encoded.join("/"))
}

/// Bytes of a file on their way through the gateway.
pub type BodyStream = BoxStream<'static, Result<bytes::Bytes, std::io::Error>>;

/// An output file as the artifact endpoint serves it.
pub struct Download {
    /// Its size, when the endpoint said (it does).
    pub size: Option<u64>,
    /// `sha256:<hex>`, when the endpoint said (it does).
    pub digest: Option<String>,
    pub body: BodyStream,
}

/// What the route asks of a namespace's executor.
#[async_trait::async_trait]
pub trait JobFiles: Send + Sync {
    /// Output file `path` of the caller's finished job.
    async fn download(&self, caller: &Caller, job: &str, path: &str) -> Result<Download, ExecError>;
    /// Replace input file `path` of the caller's draft with the `size` bytes of `body`.
    async fn upload(&self, caller: &Caller, job: &str, path: &str, size: u64, body: BodyStream) -> Result<FileInfo, ExecError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_path_escapes_each_segment() {
        assert_eq!(route_path("team-a", "skj-1", "out/a b#1.txt"), "/files/team-a/skj-1/out/a%20b%231.txt");
        assert_eq!(route_path("team-a", "skj-1", "data.bin"), "/files/team-a/skj-1/data.bin");
    }
}
