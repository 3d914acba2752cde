//! The file route's work on jobs ([`crate::gateway::files`]): a finished
//! run's output file streamed from the artifact endpoint, and a whole input
//! file streamed into a draft. The job tools' rules apply unchanged (they
//! share `find`, `finished_run`, `open_draft` and `upload_check`): a job of
//! another principal or namespace is not found, a draft takes uploads until
//! its run starts, a run's files are read once it has finished.

use futures::TryStreamExt;
use kube::ResourceExt;

use super::error::{ExecError, Result};
use super::jobs::{upload_check, upload_path};
use super::KubeExecutor;
use crate::artifacts::operator::ArtifactError;
use crate::artifacts::{HEADER_CONTENT_DIGEST, WORK_PREFIX};
use crate::core::limits::FILE_ROUTE_BYTES;
use crate::core::paths::RelPath;
use crate::gateway::file_url::{BodyStream, Download, JobFiles};
use crate::jobs::{FileInfo, JobError};
use crate::mcp::executor::Caller;

impl KubeExecutor {
    /// Output file `path` of the caller's finished run `job`, as a stream.
    pub async fn file_download(&self, caller: &Caller, job: &str, path: &str) -> Result<Download> {
        let sj = self.finished_run(caller, job).await?;
        let rel = RelPath::parse(path).map_err(|source| JobError::BadPath { path: path.to_string(), source })?;
        let uid = sj.uid().ok_or_else(|| ExecError::Vanished { name: job.to_string() })?;
        let stored = format!("{WORK_PREFIX}{}", rel.as_str());
        let response = self
            .artifacts
            .output_response(&self.options.namespace, &uid, &stored)
            .await?
            .ok_or_else(|| JobError::NoSuchFile { id: job.to_string(), path: rel.to_string() })?;
        let digest = response.headers().get(HEADER_CONTENT_DIGEST).and_then(|v| v.to_str().ok()).map(str::to_string);
        let size = response.content_length();
        Ok(Download { size, digest, body: Box::pin(response.bytes_stream().map_err(std::io::Error::other)) })
    }

    /// Input file `path` of the caller's draft `job`, replaced by the
    /// `size` bytes of `body`. Every refusal the draft's record can decide
    /// comes before a byte of the body is read.
    pub async fn file_upload(&self, caller: &Caller, job: &str, path: &str, size: u64, body: BodyStream) -> Result<FileInfo> {
        let rel = upload_path(path)?;
        if size > FILE_ROUTE_BYTES {
            return Err(JobError::FileTooLarge { path: rel.to_string(), size, max: FILE_ROUTE_BYTES }.into());
        }
        let loaded = self.open_draft(caller, job).await?;
        upload_check(&loaded.draft, job, &rel, 0, size, &self.options.limits)?;
        let staged =
            self.artifacts.stage_input_stream(&self.options.namespace, job, rel.as_str(), size, reqwest::Body::wrap_stream(body)).await?;
        if staged.size != size {
            return Err(ArtifactError::Invalid {
                what: format!("stage input {rel}"),
                detail: format!("the endpoint stored {} bytes of the {size} sent", staged.size),
            }
            .into());
        }
        self.record_upload(loaded, job, FileInfo { path: rel.to_string(), size: staged.size, sha256: staged.digest }).await
    }
}

#[async_trait::async_trait]
impl JobFiles for KubeExecutor {
    async fn download(&self, caller: &Caller, job: &str, path: &str) -> Result<Download> {
        self.file_download(caller, job, path).await
    }

    async fn upload(&self, caller: &Caller, job: &str, path: &str, size: u64, body: BodyStream) -> Result<FileInfo> {
        self.file_upload(caller, job, path, size, body).await
    }
}
