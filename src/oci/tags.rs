//! Listing a repository's tags (`GET /v2/<name>/tags/list`, paginated) and
//! reading one manifest's annotations.

use futures::StreamExt;
use oci_client::RegistryOperation;
use serde::Deserialize;

use super::*;

/// Tags asked for per page of `tags/list`.
pub const TAGS_PAGE: usize = 1000;
/// The most tags one listing collects before it fails (each at most 128
/// bytes: 128 MiB at worst). A thousand SkillJobs keep about 3,000.
pub const MAX_TAGS: usize = 1_000_000;
/// Pages followed before a listing is given up (a registry whose `Link`s go round in circles).
const MAX_TAG_PAGES: usize = 10_000;
/// The largest `tags/list` page body read (a full page is under 150 KiB).
const MAX_TAGS_PAGE_BYTES: u64 = 16 * 1024 * 1024;

#[derive(Debug, Deserialize)]
struct TagsPage {
    /// distribution sends `null` for a repository whose tags are all gone.
    #[serde(default)]
    tags: Option<Vec<String>>,
}

impl Registry {
    /// Every tag of `repository` (`HOST[:PORT]/REPO`, no tag or digest),
    /// sorted. Pages of [`TAGS_PAGE`] are asked for with `?n=` and followed
    /// by their `Link: <...>; rel="next"` header (on the same registry only:
    /// the credential goes nowhere else); a registry that ignores `n` answers
    /// everything at once (distribution 2.8 does, in no particular order; the
    /// built-in store pages). A repository that does not exist yet (404
    /// `NAME_UNKNOWN` from distribution, `MANIFEST_UNKNOWN` from the built-in
    /// store) has no tags: `Ok(vec![])`.
    pub async fn list_tags(&self, repository: &str) -> Result<Vec<String>> {
        self.list_tags_paged(repository, TAGS_PAGE).await
    }

    /// [`Registry::list_tags`] asking for pages of `page` tags.
    pub async fn list_tags_paged(&self, repository: &str, page: usize) -> Result<Vec<String>> {
        let last = repository.rsplit('/').next().unwrap_or_default();
        if repository.contains('@') || last.contains(':') || !repository.contains('/') {
            return Err(OciError::InvalidReference {
                reference: repository.into(),
                reason: "give a repository without tag or digest".into(),
            });
        }
        let r = parse_ref(repository)?;
        let token = self.authenticate(&r, RegistryOperation::Pull).await?;
        let registry = r.resolve_registry().to_string();
        let scheme = if self.opts.plain_http.iter().any(|h| h == &registry) { "http" } else { "https" };
        let first = format!("{scheme}://{registry}/v2/{}/tags/list?n={}", r.repository(), page.max(1));
        let origin =
            reqwest::Url::parse(&first).map_err(|e| OciError::InvalidReference { reference: repository.into(), reason: e.to_string() })?;
        let mut url = origin.clone();
        let mut tags: Vec<String> = Vec::new();
        for _ in 0..MAX_TAG_PAGES {
            let req = self.signed(self.http.get(url.clone()), token.as_deref(), &r);
            let resp = req.send().await.map_err(|e| map_reqwest_error(&r, e))?;
            let status = resp.status();
            match status {
                s if s.is_success() => {}
                // No repository (yet): nothing was ever pushed to it, so no tags.
                reqwest::StatusCode::NOT_FOUND if url == origin => return Ok(Vec::new()),
                reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN => {
                    return Err(OciError::Auth { registry, detail: format!("HTTP {status} on {url}") })
                }
                _ => return Err(OciError::Registry { reference: r.whole(), detail: format!("HTTP {status} on {url}") }),
            }
            let next = next_link(&resp, &url);
            let body = read_capped(&r, resp, MAX_TAGS_PAGE_BYTES, "tags/list page").await?;
            let page: TagsPage = serde_json::from_slice(&body)
                .map_err(|e| OciError::Registry { reference: r.whole(), detail: format!("tags/list answer: {e}") })?;
            tags.extend(page.tags.unwrap_or_default());
            if tags.len() > MAX_TAGS {
                return Err(OciError::TooLarge {
                    what: format!("the tag list of {repository}"),
                    size: tags.len() as u64,
                    limit: MAX_TAGS as u64,
                });
            }
            match next {
                None => {
                    tags.sort();
                    tags.dedup();
                    return Ok(tags);
                }
                Some(next) if next.origin() != origin.origin() => {
                    return Err(OciError::Registry {
                        reference: r.whole(),
                        detail: format!("tags/list points its next page at another server ({next}); not following it"),
                    })
                }
                Some(next) if next == url => {
                    return Err(OciError::Registry {
                        reference: r.whole(),
                        detail: format!("tags/list points its next page at itself ({next})"),
                    })
                }
                Some(next) => url = next,
            }
        }
        Err(OciError::Registry { reference: r.whole(), detail: format!("tags/list went on past {MAX_TAG_PAGES} pages") })
    }

    /// The manifest a reference resolves to: `(digest, annotations)`, read
    /// with the usual bounded, hashed GET and nothing else downloaded.
    pub async fn manifest_annotations(&self, reference: &str) -> Result<(String, BTreeMap<String, String>)> {
        let r = parse_ref(reference)?;
        let token = self.authenticate(&r, RegistryOperation::Pull).await?;
        let (body, digest) = self.fetch_manifest(&r, token.as_deref()).await?;
        let m = parse_manifest(reference, &body)?;
        Ok((digest, m.annotations))
    }
}

/// The `rel="next"` target of a `Link` header, resolved against `base`.
fn next_link(resp: &reqwest::Response, base: &reqwest::Url) -> Option<reqwest::Url> {
    resp.headers().get_all(reqwest::header::LINK).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).find_map(|link| {
        let (target, params) = link.trim().split_once(';')?;
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        let next = params.split(';').any(|p| {
            let p = p.trim().replace(' ', "");
            p.eq_ignore_ascii_case("rel=\"next\"") || p.eq_ignore_ascii_case("rel=next")
        });
        next.then(|| base.join(target).ok()).flatten()
    })
}

async fn read_capped(r: &oci_client::Reference, resp: reqwest::Response, limit: u64, what: &str) -> Result<Vec<u8>> {
    if let Some(len) = resp.content_length().filter(|n| *n > limit) {
        return Err(OciError::TooLarge { what: what.into(), size: len, limit });
    }
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| map_reqwest_error(r, e))?;
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Err(OciError::TooLarge { what: what.into(), size: body.len() as u64 + chunk.len() as u64, limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::next_link;

    fn link(values: &[&str]) -> Option<String> {
        let mut b = http::Response::builder();
        for v in values {
            b = b.header("link", *v);
        }
        let resp = reqwest::Response::from(b.body(Vec::<u8>::new()).unwrap());
        let base = reqwest::Url::parse("http://127.0.0.1:5000/v2/jobs/tags/list?n=2").unwrap();
        next_link(&resp, &base).map(|u| u.to_string())
    }

    #[test]
    fn the_next_page_is_the_rel_next_link_resolved_against_the_page() {
        assert_eq!(link(&[]), None);
        assert_eq!(
            link(&[r#"</v2/jobs/tags/list?last=b&n=2>; rel="next""#]).as_deref(),
            Some("http://127.0.0.1:5000/v2/jobs/tags/list?last=b&n=2")
        );
        assert_eq!(
            link(&[r#"<http://127.0.0.1:5000/v2/jobs/tags/list?last=c&n=2>;rel=next"#]).as_deref(),
            Some("http://127.0.0.1:5000/v2/jobs/tags/list?last=c&n=2")
        );
        assert_eq!(link(&[r#"</v2/x>; rel="prev""#]), None);
        assert_eq!(link(&[r#"</v2/x>; rel="prev", </v2/y>; rel="next""#]).as_deref(), Some("http://127.0.0.1:5000/v2/y"));
        assert_eq!(link(&[r#"</v2/x>; rel="prev""#, r#"</v2/z>; rel = "next""#]).as_deref(), Some("http://127.0.0.1:5000/v2/z"));
        assert_eq!(link(&["garbage"]), None);
        // Another server is resolved as given; list_tags refuses to follow it.
        assert_eq!(link(&[r#"<https://elsewhere.example/v2/x>; rel="next""#]).as_deref(), Some("https://elsewhere.example/v2/x"));
    }
}
