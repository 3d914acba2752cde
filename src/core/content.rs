//! Reading skill files for clients: capped reads, text or base64, media
//! type, and `sha256:` digests for the skills extension.

use std::io::Read;
use std::path::Path;

use base64::Engine;
use sha2::{Digest, Sha256};

/// A file's bytes as handed to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContent {
    /// `utf-8` text or `base64`.
    pub encoding: Encoding,
    pub content: String,
    pub media_type: String,
    /// The file's real size.
    pub size: u64,
    /// Bytes returned (before base64).
    pub returned: u64,
    pub truncated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Utf8,
    Base64,
}

impl Encoding {
    pub fn label(self) -> &'static str {
        match self {
            Encoding::Utf8 => "utf-8",
            Encoding::Base64 => "base64",
        }
    }
}

/// The media type of a file from its name; Markdown is `text/markdown`.
pub fn media_type(path: &str) -> String {
    if path.ends_with(".md") || path.ends_with(".markdown") {
        return "text/markdown".into();
    }
    mime_guess::from_path(path).first_raw().map(str::to_string).unwrap_or_else(|| "application/octet-stream".into())
}

/// Read at most `cap` bytes of `real` (already resolved inside its skill).
/// Text when the bytes are UTF-8 without NULs (a cut multi-byte character
/// at the cap is dropped from the text), base64 otherwise.
pub fn read_for_client(real: &Path, display_path: &str, cap: u64) -> std::io::Result<FileContent> {
    let file = std::fs::File::open(real)?;
    let size = file.metadata()?.len();
    let mut bytes = Vec::with_capacity(size.min(cap) as usize);
    file.take(cap).read_to_end(&mut bytes)?;
    let truncated = size > bytes.len() as u64;
    let media_type = media_type(display_path);
    let text = match std::str::from_utf8(&bytes) {
        Ok(text) if !text.contains('\0') => Some(text.len()),
        Err(err) if truncated && err.error_len().is_none() && !bytes[..err.valid_up_to()].contains(&0) => Some(err.valid_up_to()),
        _ => None,
    };
    Ok(match text {
        Some(len) => {
            bytes.truncate(len);
            let returned = bytes.len() as u64;
            FileContent {
                encoding: Encoding::Utf8,
                content: String::from_utf8(bytes).unwrap_or_default(),
                media_type,
                size,
                returned,
                truncated,
            }
        }
        None => FileContent {
            encoding: Encoding::Base64,
            returned: bytes.len() as u64,
            content: base64::engine::general_purpose::STANDARD.encode(&bytes),
            media_type,
            size,
            truncated,
        },
    })
}

/// `sha256:<hex>` of a file, streamed.
pub fn file_digest(real: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(real)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_binary_and_caps() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("a.md");
        std::fs::write(&text, "héllo").unwrap();
        let c = read_for_client(&text, "a.md", 1024).unwrap();
        assert_eq!((c.encoding, c.content.as_str(), c.media_type.as_str(), c.truncated), (Encoding::Utf8, "héllo", "text/markdown", false));

        // Cut inside the two-byte é: the text drops the partial character.
        let c = read_for_client(&text, "a.md", 2).unwrap();
        assert_eq!((c.encoding, c.content.as_str(), c.returned, c.size, c.truncated), (Encoding::Utf8, "h", 1, 6, true));

        let bin = dir.path().join("b.png");
        std::fs::write(&bin, [0x89, b'P', b'N', b'G', 0, 1, 2]).unwrap();
        let c = read_for_client(&bin, "b.png", 1024).unwrap();
        assert_eq!((c.encoding, c.media_type.as_str()), (Encoding::Base64, "image/png"));
        assert_eq!(base64::engine::general_purpose::STANDARD.decode(&c.content).unwrap().len(), 7);

        let exact = dir.path().join("c.txt");
        std::fs::write(&exact, "x".repeat(16)).unwrap();
        assert!(!read_for_client(&exact, "c.txt", 16).unwrap().truncated);
        let c = read_for_client(&exact, "c.txt", 15).unwrap();
        assert!(c.truncated && c.returned == 15 && c.size == 16);
    }

    #[test]
    fn digest_matches_known_value() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(file_digest(&f).unwrap(), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
