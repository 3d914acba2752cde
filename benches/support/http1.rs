//! A minimal HTTP/1.1 keep-alive client for load loops: one connection,
//! one request at a time, the request bytes built once.
//!
//! Why not reqwest in the timed loops: on a 2-core machine the load
//! generator shares the cores with the server it measures, and reqwest
//! (URL parsing, a header map and a hand-off to its connection task per
//! request, a lossy UTF-8 pass over every body) took about a third of the
//! machine's CPU in a profile of the listing benchmark, CPU the server
//! then did not have. This client reads the answer and hands back its
//! status and decoded body; the caller checks the body as before.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Header lines a response may carry, more than any server here sends.
const MAX_HEADERS: usize = 32;

pub(crate) struct Connection {
    stream: TcpStream,
    /// Bytes read but not yet consumed (the next response's start, in
    /// principle; a server answering one request at a time leaves none).
    buf: Vec<u8>,
}

/// One answer: status and body (de-chunked).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

/// `POST path` with the given headers and body, as the bytes to send on
/// every iteration (Host, Content-Length and keep-alive added).
pub(crate) fn post(host: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {}\r\n", body.len()).into_bytes();
    for (name, value) in headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl Connection {
    pub(crate) async fn open(addr: std::net::SocketAddr) -> io::Result<Connection> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Connection { stream, buf: Vec::with_capacity(64 * 1024) })
    }

    /// Sends `request` (from [`post`]) and reads its whole answer.
    pub(crate) async fn send(&mut self, request: &[u8]) -> io::Result<Answer> {
        self.stream.write_all(request).await?;
        let (status, head_len, framing) = loop {
            if let Some(head) = self.head()? {
                break head;
            }
            self.fill().await?;
        };
        self.buf.drain(..head_len);
        let body = match framing {
            Framing::Length(n) => {
                while self.buf.len() < n {
                    self.fill().await?;
                }
                self.buf.drain(..n).collect()
            }
            Framing::Chunked => self.chunked().await?,
        };
        Ok(Answer { status, body })
    }

    async fn fill(&mut self) -> io::Result<()> {
        self.buf.reserve(64 * 1024);
        if self.stream.read_buf(&mut self.buf).await? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed the connection mid-answer"));
        }
        Ok(())
    }

    /// The status, the head's length and the body's framing, once the whole
    /// head has arrived.
    fn head(&self) -> io::Result<Option<(u16, usize, Framing)>> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        let len = match response.parse(&self.buf).map_err(|e| bad(format!("response head: {e}")))? {
            httparse::Status::Partial => return Ok(None),
            httparse::Status::Complete(len) => len,
        };
        let status = response.code.ok_or_else(|| bad("response without a status"))?;
        let mut framing = None;
        for h in response.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse().ok());
                framing = Some(Framing::Length(n.ok_or_else(|| bad("unreadable content-length"))?));
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") && h.value.eq_ignore_ascii_case(b"chunked") {
                framing = Some(Framing::Chunked);
            }
        }
        // A keep-alive answer without either would end only at close.
        Ok(Some((status, len, framing.ok_or_else(|| bad("answer with neither content-length nor chunked framing"))?)))
    }

    async fn chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = memchr::memmem::find(&self.buf, b"\r\n") {
                    break i;
                }
                self.fill().await?;
            };
            let size_text = std::str::from_utf8(&self.buf[..line_end]).map_err(|_| bad("chunk size not ASCII"))?;
            let size_text = size_text.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_text, 16).map_err(|_| bad(format!("chunk size {size_text:?}")))?;
            // The chunk, its CRLF; the last chunk (0) is followed by an
            // empty trailer line.
            let need = line_end + 2 + size + 2;
            while self.buf.len() < need {
                self.fill().await?;
            }
            body.extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
            self.buf.drain(..need);
            if size == 0 {
                return Ok(body);
            }
        }
    }
}

enum Framing {
    Length(usize),
    Chunked,
}
