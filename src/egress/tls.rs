//! A bounded TLS ClientHello reader: just enough to see the server name
//! (SNI) and whether Encrypted Client Hello is offered. Nothing is
//! decrypted or terminated; the bytes are forwarded unchanged once checked.
//!
//! Closes domain fronting (CONNECT to an allowed CDN name, then a
//! ClientHello naming another tenant of that CDN): the SNI must equal the
//! CONNECT host. With ECH the outer SNI is the provider's public name and
//! the real name is encrypted; the outer SNI must still equal the CONNECT
//! host, so a client cannot reach an ECH-fronted name under an allowed
//! one. (What an ECH inner name says behind an allowed public name cannot
//! be seen without terminating TLS: such a host's whole provider is what
//! the admin allowed.)
//!
//! The handshake message may span several TLS records (it is reassembled)
//! and is capped at [`super::config::Limits::max_client_hello_bytes`].
//! Anything malformed is refused rather than guessed at.

/// TLS record content type `handshake`.
const RECORD_HANDSHAKE: u8 = 22;
/// Handshake type `client_hello`.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Extension `server_name` (RFC 6066).
const EXT_SERVER_NAME: u16 = 0x0000;
/// Extension `encrypted_client_hello` (RFC 9849, draft 13 onwards).
pub const EXT_ECH: u16 = 0xfe0d;
/// A fatal `unrecognized_name` alert (TLS 1.2 record framing, which TLS
/// 1.3 clients accept before the handshake): sent when the name is refused.
pub const ALERT_UNRECOGNIZED_NAME: [u8; 7] = [21, 3, 3, 0, 2, 2, 112];
/// A fatal `handshake_failure` alert.
pub const ALERT_HANDSHAKE_FAILURE: [u8; 7] = [21, 3, 3, 0, 2, 2, 40];

/// What the ClientHello says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The `host_name` of the server_name extension, lower-cased.
    pub sni: Option<String>,
    /// The ECH extension is present (its outer SNI is `sni`).
    pub ech: bool,
}

/// Why the bytes are not an acceptable ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("the first bytes are not a TLS handshake record")]
    NotTls,
    #[error("the ClientHello is longer than {0} bytes")]
    TooLarge(usize),
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// Parse from the start of the client's byte stream. `Ok(None)`: more
/// bytes are needed (and may be read: the cap has not been reached).
pub fn parse(buf: &[u8], max: usize) -> Result<Option<ClientHello>, HelloError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != RECORD_HANDSHAKE {
        return Err(HelloError::NotTls);
    }
    // Reassemble the handshake bytes from consecutive handshake records.
    let mut handshake = Vec::new();
    let mut at = 0;
    let mut needed: Option<usize> = None;
    loop {
        if needed.is_some_and(|n| handshake.len() >= n) {
            break;
        }
        let Some(header) = buf.get(at..at + 5) else { return Ok(None) };
        if header[0] != RECORD_HANDSHAKE {
            return Err(if at == 0 { HelloError::NotTls } else { HelloError::Malformed("a non-handshake record inside the ClientHello") });
        }
        if header[1] != 3 {
            return Err(HelloError::Malformed("record version is not 3.x"));
        }
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if len == 0 || len > 16384 + 256 {
            return Err(HelloError::Malformed("bad record length"));
        }
        let Some(body) = buf.get(at + 5..at + 5 + len) else {
            return if at + 5 + len > max + 5 * 8 { Err(HelloError::TooLarge(max)) } else { Ok(None) };
        };
        handshake.extend_from_slice(body);
        at += 5 + len;
        if needed.is_none() && handshake.len() >= 4 {
            if handshake[0] != HANDSHAKE_CLIENT_HELLO {
                return Err(HelloError::Malformed("the first handshake message is not a ClientHello"));
            }
            let n = u32::from_be_bytes([0, handshake[1], handshake[2], handshake[3]]) as usize;
            if n > max {
                return Err(HelloError::TooLarge(max));
            }
            needed = Some(4 + n);
        }
        if handshake.len() > max + 4 {
            return Err(HelloError::TooLarge(max));
        }
    }
    let n = needed.unwrap_or(0);
    parse_body(&handshake[4..n]).map(Some)
}

/// A cursor that fails instead of panicking.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if self.buf.len() < n {
            return Err(HelloError::Malformed(what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u8(what)? as usize;
        self.take(n, what)
    }
    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u16(what)? as usize;
        self.take(n, what)
    }
}

fn parse_body(body: &[u8]) -> Result<ClientHello, HelloError> {
    let mut r = Reader { buf: body };
    r.take(2, "legacy_version")?;
    r.take(32, "random")?;
    let session = r.vec8("session_id")?;
    if session.len() > 32 {
        return Err(HelloError::Malformed("session_id longer than 32 bytes"));
    }
    let suites = r.vec16("cipher_suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::Malformed("cipher_suites"));
    }
    r.vec8("compression_methods")?;
    let mut hello = ClientHello { sni: None, ech: false };
    if r.buf.is_empty() {
        return Ok(hello); // no extensions at all: no SNI
    }
    let mut exts = Reader { buf: r.vec16("extensions")? };
    if !r.buf.is_empty() {
        return Err(HelloError::Malformed("bytes after the extensions"));
    }
    let mut seen = Vec::new();
    while !exts.buf.is_empty() {
        let kind = exts.u16("extension type")?;
        let data = exts.vec16("extension data")?;
        if seen.contains(&kind) {
            return Err(HelloError::Malformed("an extension appears twice"));
        }
        seen.push(kind);
        match kind {
            EXT_SERVER_NAME => hello.sni = Some(server_name(data)?),
            EXT_ECH => hello.ech = true,
            _ => {}
        }
    }
    Ok(hello)
}

/// The one `host_name` of a server_name extension.
fn server_name(data: &[u8]) -> Result<String, HelloError> {
    let mut r = Reader { buf: data };
    let mut list = Reader { buf: r.vec16("server_name_list")? };
    if !r.buf.is_empty() {
        return Err(HelloError::Malformed("bytes after server_name_list"));
    }
    let mut name = None;
    while !list.buf.is_empty() {
        let kind = list.u8("name_type")?;
        let value = list.vec16("server name")?;
        if kind != 0 {
            continue; // unknown name types are ignored (RFC 6066)
        }
        if name.is_some() {
            return Err(HelloError::Malformed("more than one host_name"));
        }
        if value.is_empty() || !value.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.') {
            return Err(HelloError::Malformed("host_name is not an LDH name"));
        }
        name = Some(String::from_utf8_lossy(value).to_ascii_lowercase());
    }
    name.ok_or(HelloError::Malformed("server_name without a host_name"))
}

/// Build a ClientHello (for tests and the benchmark): `sni`, optional ECH
/// extension, padded with `extra` bytes of an unknown extension.
pub fn build_client_hello(sni: Option<&str>, ech: bool, extra: usize) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let mut entry = vec![0u8];
        entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
        entry.extend_from_slice(name.as_bytes());
        let mut data = (entry.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&entry);
        exts.extend_from_slice(&EXT_SERVER_NAME.to_be_bytes());
        exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
        exts.extend_from_slice(&data);
    }
    if ech {
        let payload = [0u8; 32];
        exts.extend_from_slice(&EXT_ECH.to_be_bytes());
        exts.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        exts.extend_from_slice(&payload);
    }
    if extra > 0 {
        exts.extend_from_slice(&0xfafau16.to_be_bytes());
        exts.extend_from_slice(&(extra as u16).to_be_bytes());
        exts.extend(std::iter::repeat_n(0u8, extra));
    }
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01]);
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![HANDSHAKE_CLIENT_HELLO];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut out = Vec::new();
    for chunk in hs.chunks(16384) {
        out.extend_from_slice(&[RECORD_HANDSHAKE, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 16384;

    #[test]
    fn reads_sni_and_ech() {
        let h = build_client_hello(Some("Allowed.Test"), false, 0);
        assert_eq!(parse(&h, MAX), Ok(Some(ClientHello { sni: Some("allowed.test".into()), ech: false })));
        let h = build_client_hello(Some("cdn.test"), true, 0);
        assert_eq!(parse(&h, MAX), Ok(Some(ClientHello { sni: Some("cdn.test".into()), ech: true })));
        let h = build_client_hello(None, false, 0);
        assert_eq!(parse(&h, MAX), Ok(Some(ClientHello { sni: None, ech: false })));
    }

    #[test]
    fn every_prefix_asks_for_more() {
        let h = build_client_hello(Some("allowed.test"), false, 300);
        for n in 0..h.len() {
            assert_eq!(parse(&h[..n], MAX), Ok(None), "prefix {n}");
        }
    }

    #[test]
    fn reassembles_across_records() {
        let h = build_client_hello(Some("allowed.test"), false, 100);
        // Re-frame the handshake bytes as records of 10 bytes each.
        let hs = &h[5..];
        let mut framed = Vec::new();
        for chunk in hs.chunks(10) {
            framed.extend_from_slice(&[22, 3, 1, 0, chunk.len() as u8]);
            framed.extend_from_slice(chunk);
        }
        assert_eq!(parse(&framed, MAX).unwrap().unwrap().sni.as_deref(), Some("allowed.test"));
    }

    #[test]
    fn refuses_what_it_cannot_vouch_for() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n", MAX), Err(HelloError::NotTls));
        assert_eq!(parse(&[0x80, 0x2e, 0x01], MAX), Err(HelloError::NotTls));
        let big = build_client_hello(Some("allowed.test"), false, 20000);
        assert_eq!(parse(&big, MAX), Err(HelloError::TooLarge(MAX)));
        // Two host names.
        let two = [0, 12, 0, 0, 3, b'a', b'.', b'b', 0, 0, 3, b'c', b'.', b'd'];
        assert_eq!(server_name(&two), Err(HelloError::Malformed("more than one host_name")));
        assert_eq!(server_name(&two[..9]).map_err(|_| ()), Err(()));
        // An extensions length that runs past the message.
        let mut h = build_client_hello(Some("allowed.test"), false, 0);
        h[50] = 0xff;
        h[51] = 0xff;
        assert!(matches!(parse(&h, MAX), Err(HelloError::Malformed(_))));
        // Not a ClientHello.
        let mut h = build_client_hello(Some("allowed.test"), false, 0);
        h[5] = 2;
        assert!(matches!(parse(&h, MAX), Err(HelloError::Malformed(_))));
        // A duplicated extension.
        let mut exts = build_client_hello(Some("x.test"), true, 0);
        let ech_at = exts.windows(2).rposition(|w| w == [0xfe, 0x0d]).unwrap();
        exts[ech_at] = 0x00;
        exts[ech_at + 1] = 0x00;
        assert!(matches!(parse(&exts, MAX), Err(HelloError::Malformed(_))));
    }
}
