//! A streaming, deterministic gzip writer and a hashing byte counter.
//!
//! The gzip member is the same shape as skill packages
//! (`crate::core::package`): a 10-byte header with mtime 0, no name or
//! comment, XFL 0 and OS 255 (unknown), then raw deflate from
//! `miniz_oxide` at [`DEFLATE_LEVEL`], then CRC-32 and ISIZE. `miniz_oxide`
//! is called directly, not through flate2, whose backend (miniz_oxide,
//! zlib, zlib-ng) depends on cargo feature unification and would change
//! the bytes. Output depends only on the input bytes (the compressor
//! buffers internally, so how the input is split into writes does not
//! matter) and on the `miniz_oxide` version pinned by Cargo.lock.

use std::io::{self, Write};

use miniz_oxide::deflate::core::{compress, create_comp_flags_from_zip_params, CompressorOxide, TDEFLFlush, TDEFLStatus};
use sha2::{Digest, Sha256};

use super::limits::{DEFLATE_LEVEL, IO_CHUNK_BYTES};

/// ID1 ID2 CM=deflate FLG=0 MTIME=0 XFL=0 OS=255.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];

/// Compresses everything written into one gzip member on `inner`.
/// [`GzipWriter::finish`] must be called; dropping it leaves a truncated
/// member.
pub struct GzipWriter<W: Write> {
    inner: W,
    // Boxed: the compressor state is ~300 KiB.
    compressor: Box<CompressorOxide>,
    out: Vec<u8>,
    crc: crc32fast::Hasher,
    isize: u32,
    header_written: bool,
}

impl<W: Write> GzipWriter<W> {
    pub fn new(inner: W) -> Self {
        // window_bits < 0: raw deflate (we write the gzip framing ourselves).
        let flags = create_comp_flags_from_zip_params(DEFLATE_LEVEL.into(), -15, 0);
        GzipWriter {
            inner,
            compressor: Box::new(CompressorOxide::new(flags)),
            out: vec![0; IO_CHUNK_BYTES],
            crc: crc32fast::Hasher::new(),
            isize: 0,
            header_written: false,
        }
    }

    fn header(&mut self) -> io::Result<()> {
        if !self.header_written {
            self.inner.write_all(&GZIP_HEADER)?;
            self.header_written = true;
        }
        Ok(())
    }

    fn run(&mut self, mut input: &[u8], flush: TDEFLFlush) -> io::Result<()> {
        loop {
            let (status, consumed, produced) = compress(&mut self.compressor, input, &mut self.out, flush);
            self.inner.write_all(&self.out[..produced])?;
            input = &input[consumed.min(input.len())..];
            match status {
                TDEFLStatus::Done => return Ok(()),
                TDEFLStatus::Okay => {
                    // More output pending (the buffer filled) or, when
                    // finishing, the end block not written yet: go again.
                    if input.is_empty() && produced < self.out.len() && !matches!(flush, TDEFLFlush::Finish) {
                        return Ok(());
                    }
                }
                other => return Err(io::Error::other(format!("deflate failed: {other:?}"))),
            }
        }
    }

    /// Ends the deflate stream, writes CRC-32 and ISIZE, and returns the
    /// inner writer (flushed).
    pub fn finish(mut self) -> io::Result<W> {
        self.header()?;
        self.run(&[], TDEFLFlush::Finish)?;
        let crc = self.crc.clone().finalize();
        self.inner.write_all(&crc.to_le_bytes())?;
        self.inner.write_all(&self.isize.to_le_bytes())?;
        self.inner.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for GzipWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.header()?;
        self.crc.update(buf);
        // ISIZE is the input size modulo 2^32 (RFC 1952).
        self.isize = self.isize.wrapping_add(buf.len() as u32);
        self.run(buf, TDEFLFlush::None)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        // No sync flush: it would put the write pattern into the bytes.
        self.inner.flush()
    }
}

/// Passes bytes through, hashing (sha256) and counting them.
pub struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    count: u64,
    /// Refuse to pass more than this many bytes.
    limit: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W, limit: u64) -> Self {
        HashingWriter { inner, hasher: Sha256::new(), count: 0, limit }
    }

    /// (`sha256:<hex>`, byte count, inner writer).
    pub fn finish(self) -> (String, u64, W) {
        (format!("sha256:{}", hex::encode(self.hasher.finalize())), self.count, self.inner)
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.count + buf.len() as u64 > self.limit {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, LimitHit));
        }
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The error a [`HashingWriter`] returns when its limit is hit, so callers
/// can tell a cap from a disk error.
#[derive(Debug)]
pub struct LimitHit;

impl std::fmt::Display for LimitHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("layer size limit reached")
    }
}

impl std::error::Error for LimitHit {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gz(chunks: &[&[u8]]) -> Vec<u8> {
        let mut w = GzipWriter::new(Vec::new());
        for c in chunks {
            w.write_all(c).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn round_trips_through_flate2_and_ignores_write_boundaries() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let one = gz(&[&data]);
        let many = gz(&data.chunks(777).collect::<Vec<_>>());
        assert_eq!(one, many, "same bytes whatever the write pattern");
        assert_eq!(&one[..10], &GZIP_HEADER);
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(one.as_slice()).read_to_end(&mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn empty_input_is_a_valid_member() {
        let out = gz(&[]);
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(out.as_slice()).read_to_end(&mut back).unwrap();
        assert!(back.is_empty());
    }

    #[test]
    fn same_output_as_the_package_gzip_for_the_same_input() {
        // Skill packages use compress_to_vec at the same level; a layer of
        // the same tar must come out identical.
        let data = b"hello world ".repeat(10_000);
        let mut expected = GZIP_HEADER.to_vec();
        expected.extend(miniz_oxide::deflate::compress_to_vec(&data, DEFLATE_LEVEL));
        expected.extend(crc32fast::hash(&data).to_le_bytes());
        expected.extend((data.len() as u32).to_le_bytes());
        assert_eq!(gz(&[&data]), expected);
    }
}
