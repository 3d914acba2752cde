//! A bounded HTTP/1.x request-head reader (and the response-head reader
//! the plain-HTTP path needs), on `httparse`.
//!
//! Bounds: at most `max_header_bytes` and `max_headers`, all within
//! `header_timeout` counted from the first moment the connection was
//! accepted, however the bytes trickle in. So a client sending one byte
//! every 100 ms (slowloris) holds a connection for `header_timeout` and no
//! longer, and at most `max_pending` connections can be in this phase.

use tokio::time::Instant;

use super::config::{show, Limits};
use super::io::{read_some, Socket};
use super::refusal::{Reason, Refusal};

/// A parsed request head and the bytes that came after it.
#[derive(Debug)]
pub(super) struct RequestHead {
    pub method: String,
    pub target: String,
    /// Header names as sent, values as bytes.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Bytes read past the head (a request body start, an early ClientHello).
    pub rest: Vec<u8>,
}

impl RequestHead {
    /// Values of a header, any case.
    pub(super) fn header<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }
}

/// Why a head could not be read: a refusal to send, or a client that left.
#[derive(Debug)]
pub(super) enum HeadError {
    Refuse(Refusal),
    /// End of stream or a reset before a complete head: nobody to answer.
    Gone,
}

/// Read one request head within `deadline`.
pub(super) async fn read_request<S: Socket>(s: &S, limits: &Limits, deadline: Instant) -> Result<RequestHead, HeadError> {
    let mut buf = vec![0u8; limits.max_header_bytes];
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            return Err(HeadError::Refuse(Refusal::new(
                Reason::HeaderTooLarge,
                format!("the request head exceeds max_header_bytes = {}", limits.max_header_bytes),
            )));
        }
        let n = match tokio::time::timeout_at(deadline, read_some(s, &mut buf[filled..])).await {
            Err(_) => {
                return Err(HeadError::Refuse(Refusal::new(
                    Reason::HeaderTimeout,
                    format!("the request head did not arrive within header_timeout = {}", show(limits.header_timeout)),
                )))
            }
            Ok(Err(_)) | Ok(Ok(0)) => return Err(HeadError::Gone),
            Ok(Ok(n)) => n,
        };
        let scan_from = filled.saturating_sub(3);
        filled += n;
        // Parse only once the blank line is there: one parse per head.
        if !buf[scan_from..filled].windows(4).any(|w| w == b"\r\n\r\n") && !buf[scan_from..filled].windows(2).any(|w| w == b"\n\n") {
            continue;
        }
        let mut headers = vec![httparse::EMPTY_HEADER; limits.max_headers];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(len)) => {
                let (Some(method), Some(target)) = (req.method, req.path) else {
                    return Err(bad("a request line without method or target"));
                };
                let head = RequestHead {
                    method: method.to_string(),
                    target: target.to_string(),
                    headers: req.headers.iter().map(|h| (h.name.to_string(), h.value.to_vec())).collect(),
                    rest: buf[len..filled].to_vec(),
                };
                return Ok(head);
            }
            Ok(httparse::Status::Partial) => continue,
            Err(httparse::Error::TooManyHeaders) => {
                return Err(HeadError::Refuse(Refusal::new(
                    Reason::HeaderTooLarge,
                    format!("more than max_headers = {} header lines", limits.max_headers),
                )))
            }
            Err(e) => return Err(bad(&format!("not an HTTP/1.x request head ({e})"))),
        }
    }
}

fn bad(why: &str) -> HeadError {
    HeadError::Refuse(Refusal::new(Reason::BadRequest, why.to_string()))
}

/// A parsed upstream response head (plain-HTTP forwarding).
#[derive(Debug)]
pub(super) struct ResponseHead {
    pub code: u16,
    pub reason: String,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Length of the head in the buffer it was parsed from.
    pub len: usize,
}

/// Parse a response head at the start of `buf`; `Ok(None)`: need more.
pub(super) fn parse_response(buf: &[u8], max_headers: usize) -> Result<Option<ResponseHead>, String> {
    let mut headers = vec![httparse::EMPTY_HEADER; max_headers];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => Ok(Some(ResponseHead {
            code: resp.code.unwrap_or(0),
            reason: resp.reason.unwrap_or("").to_string(),
            headers: resp.headers.iter().map(|h| (h.name.to_string(), h.value.to_vec())).collect(),
            len,
        })),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Hop-by-hop headers (RFC 9110 7.6.1) plus the proxy's own, never
/// forwarded; and any header a `Connection` header names.
pub(super) fn hop_by_hop(headers: &[(String, Vec<u8>)]) -> Vec<String> {
    let mut names: Vec<String> =
        ["connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "te", "trailer", "upgrade"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("connection") {
            for token in String::from_utf8_lossy(value).split(',') {
                let token = token.trim().to_ascii_lowercase();
                // Framing headers stay: the body is forwarded byte for byte.
                if !token.is_empty() && token != "transfer-encoding" && token != "content-length" && token != "host" {
                    names.push(token);
                }
            }
        }
    }
    names
}
