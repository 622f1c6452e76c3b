//! The zip container of torch.save files, read as an index of entries.
//!
//! This module owns the zip structures reshard needs: the end-of-central-
//! directory record (zip64 included), the central directory, and each entry's
//! local header, checked against each other and against the file length. It
//! reads entries' bytes only on request ([`ZipIndex::read_entry`], used for
//! the small `data.pkl`, `byteorder`, ...); storages stay in place and later
//! stages read them by offset. It knows nothing of pickles or tensors.
//!
//! It is written here rather than taken from the `zip` crate so that every
//! offset and length from the file goes through checked arithmetic and a
//! limit before anything is allocated, and so that the same code runs on a
//! file and on a byte slice (the fuzz target).

use std::collections::HashMap;
use std::io::{self, Read};

use super::PytorchError;

/// Most entries an archive may have (torch writes one per storage plus a few).
pub const MAX_ENTRIES: u64 = 1_000_000;
/// Largest central directory read into memory.
pub const MAX_CENTRAL_DIRECTORY: u64 = 256 << 20;
/// Most an entry read into memory may inflate, per compressed byte. torch
/// stores its entries uncompressed; a re-zipped pickle compresses about 5 to
/// 10 times. Deflate can reach 1032 to 1, which only a bomb needs.
pub const MAX_INFLATE_RATIO: u64 = 64;
/// Entries up to this size may inflate at any ratio: 1 MiB is too small to
/// matter.
pub const INFLATE_RATIO_FLOOR: u64 = 1 << 20;

const EOCD_SIG: u32 = 0x0605_4b50;
const EOCD64_SIG: u32 = 0x0606_4b50;
const EOCD64_LOCATOR_SIG: u32 = 0x0706_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
const EOCD_LEN: u64 = 22;
const CENTRAL_LEN: usize = 46;
const LOCAL_LEN: usize = 30;

/// Positioned reads from a file or a byte slice.
pub trait ReadAt {
    /// Fills `buf` from `offset`; a short source is `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let src = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(buf.len())?))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl ReadAt for std::fs::File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        crate::platform::read_exact_at(self, buf, offset)
    }
}

/// How an entry's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Stored,
    Deflated,
}

/// One entry of the archive, with its data located and bounds-checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub method: Method,
    pub crc32: u32,
    pub compressed_size: u64,
    pub size: u64,
    /// Absolute offset of the entry's (possibly compressed) bytes.
    pub data_start: u64,
}

/// The entries of a zip archive by name.
#[derive(Debug, Default)]
pub struct ZipIndex {
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
}

fn zip_err(reason: impl Into<String>) -> PytorchError {
    PytorchError::Zip {
        reason: reason.into(),
    }
}

fn read_vec<R: ReadAt + ?Sized>(
    src: &R,
    offset: u64,
    len: usize,
    what: &str,
) -> Result<Vec<u8>, PytorchError> {
    let mut buf = vec![0; len];
    src.read_exact_at(&mut buf, offset).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            zip_err(format!(
                "{what} at byte {offset} runs past the end of the file"
            ))
        } else {
            PytorchError::Io { source: e }
        }
    })?;
    Ok(buf)
}

/// Little-endian field readers over a fixed-size record.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn u16(&self, at: usize) -> u16 {
        match self.0.get(at..at + 2) {
            Some(b) => u16::from_le_bytes([b[0], b[1]]),
            None => 0,
        }
    }
    fn u32(&self, at: usize) -> u32 {
        match self.0.get(at..at + 4) {
            Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            None => 0,
        }
    }
    fn u64(&self, at: usize) -> u64 {
        match self
            .0
            .get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
        {
            Some(b) => u64::from_le_bytes(b),
            None => 0,
        }
    }
}

/// Where the central directory is and how many entries it holds.
struct Directory {
    offset: u64,
    size: u64,
    count: u64,
}

impl ZipIndex {
    /// Reads the central directory of the `file_len`-byte archive in `src`
    /// and checks every entry's local header.
    pub fn read<R: ReadAt + ?Sized>(src: &R, file_len: u64) -> Result<ZipIndex, PytorchError> {
        let dir = find_directory(src, file_len)?;
        if dir.count > MAX_ENTRIES {
            return Err(PytorchError::TooManyEntries {
                count: dir.count,
                max: MAX_ENTRIES,
            });
        }
        if dir.size > MAX_CENTRAL_DIRECTORY {
            return Err(zip_err(format!(
                "central directory of {} bytes is larger than the limit of {MAX_CENTRAL_DIRECTORY}",
                dir.size
            )));
        }
        if dir
            .offset
            .checked_add(dir.size)
            .is_none_or(|end| end > file_len)
        {
            return Err(zip_err(
                "central directory runs past the end of the file (truncated?)",
            ));
        }
        // The directory size bounds this allocation (checked above).
        let cd = read_vec(src, dir.offset, dir.size as usize, "central directory")?;
        let mut index = ZipIndex::default();
        let mut pos = 0usize;
        for _ in 0..dir.count {
            let (entry, next) = parse_central(&cd, pos)?;
            pos = next;
            let entry = locate(src, file_len, entry)?;
            if index
                .by_name
                .insert(entry.name.clone(), index.entries.len())
                .is_some()
            {
                return Err(zip_err(format!("entry {:?} appears twice", entry.name)));
            }
            index.entries.push(entry);
        }
        Ok(index)
    }

    /// All entries in central-directory order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.by_name.get(name).and_then(|&i| self.entries.get(i))
    }

    /// Reads and decompresses a whole entry of at most `max` bytes and checks
    /// its CRC-32. A deflated entry is checked against [`MAX_INFLATE_RATIO`]
    /// before anything is inflated, inflated into a buffer of exactly its
    /// declared size (reserved with `try_reserve`), and must inflate to
    /// exactly that size.
    pub fn read_entry<R: ReadAt + ?Sized>(
        src: &R,
        entry: &Entry,
        max: u64,
    ) -> Result<Vec<u8>, PytorchError> {
        if entry.size > max {
            return Err(PytorchError::EntryTooLarge {
                name: entry.name.clone(),
                len: entry.size,
                max,
            });
        }
        // Both sizes are bounded by `max` (and the file length) here.
        let raw_len = match entry.method {
            Method::Stored => entry.size,
            Method::Deflated => entry.compressed_size,
        };
        let raw_len =
            usize::try_from(raw_len).map_err(|_| zip_err("entry too large for memory"))?;
        let raw = read_vec(src, entry.data_start, raw_len, "entry data")?;
        let bytes = match entry.method {
            Method::Stored => raw,
            Method::Deflated => {
                let ratio_max = entry.compressed_size.saturating_mul(MAX_INFLATE_RATIO);
                if entry.size > INFLATE_RATIO_FLOOR && entry.size > ratio_max {
                    return Err(PytorchError::InflateRatio {
                        name: entry.name.clone(),
                        size: entry.size,
                        compressed: entry.compressed_size,
                        max: MAX_INFLATE_RATIO,
                    });
                }
                // The declared size is bounded by `max` and by the ratio to
                // bytes that exist in the file.
                let mut out = Vec::new();
                out.try_reserve_exact(entry.size as usize)
                    .map_err(|_| zip_err(format!("entry {:?}: out of memory", entry.name)))?;
                let mut decoder =
                    flate2::read::DeflateDecoder::new(&raw[..]).take(entry.size.saturating_add(1));
                decoder.read_to_end(&mut out).map_err(|e| {
                    zip_err(format!("entry {:?} does not inflate: {e}", entry.name))
                })?;
                if out.len() as u64 != entry.size {
                    return Err(zip_err(format!(
                        "entry {:?} inflates to {} bytes, not the {} its directory says",
                        entry.name,
                        out.len(),
                        entry.size
                    )));
                }
                out
            }
        };
        let mut crc = flate2::Crc::new();
        crc.update(&bytes);
        if crc.sum() != entry.crc32 {
            return Err(PytorchError::CrcMismatch {
                name: entry.name.clone(),
                expected: entry.crc32,
                actual: crc.sum(),
            });
        }
        Ok(bytes)
    }
}

/// Finds the end-of-central-directory record (and its zip64 form).
fn find_directory<R: ReadAt + ?Sized>(src: &R, file_len: u64) -> Result<Directory, PytorchError> {
    if file_len < EOCD_LEN {
        return Err(PytorchError::NotZip);
    }
    // The record is 22 bytes plus a comment of at most 65535 bytes.
    let tail_len = file_len.min(EOCD_LEN + 0xffff);
    let tail_start = file_len - tail_len;
    let tail = read_vec(
        src,
        tail_start,
        tail_len as usize,
        "end of central directory",
    )?;
    let at = (0..=tail.len() - EOCD_LEN as usize)
        .rev()
        .find(|&i| Fields(&tail).u32(i) == EOCD_SIG)
        .ok_or(PytorchError::NotZip)?;
    let eocd_pos = tail_start + at as u64;
    let f = Fields(&tail[at..]);
    let mut dir = Directory {
        count: u64::from(f.u16(10)),
        size: u64::from(f.u32(12)),
        offset: u64::from(f.u32(16)),
    };
    let needs_zip64 = f.u16(10) == 0xffff || f.u32(12) == 0xffff_ffff || f.u32(16) == 0xffff_ffff;
    if let Some(locator_pos) = eocd_pos.checked_sub(20) {
        let locator = read_vec(src, locator_pos, 20, "zip64 locator")?;
        if Fields(&locator).u32(0) == EOCD64_LOCATOR_SIG {
            let eocd64_pos = Fields(&locator).u64(8);
            let rec = read_vec(src, eocd64_pos, 56, "zip64 end of central directory")?;
            let r = Fields(&rec);
            if r.u32(0) != EOCD64_SIG {
                return Err(zip_err("zip64 locator points at no zip64 record"));
            }
            dir = Directory {
                count: r.u64(32),
                size: r.u64(40),
                offset: r.u64(48),
            };
        } else if needs_zip64 {
            return Err(zip_err("zip64 sizes without a zip64 record"));
        }
    }
    Ok(dir)
}

/// Parses the central-directory record at `pos` of `cd`; returns the entry
/// (with `data_start` holding the local header offset) and the next position.
fn parse_central(cd: &[u8], pos: usize) -> Result<(Entry, usize), PytorchError> {
    let fixed = pos
        .checked_add(CENTRAL_LEN)
        .and_then(|end| cd.get(pos..end))
        .ok_or_else(|| zip_err("central directory ends inside an entry"))?;
    let f = Fields(fixed);
    if f.u32(0) != CENTRAL_SIG {
        return Err(zip_err(format!(
            "bad central directory entry signature at entry offset {pos}"
        )));
    }
    let flags = f.u16(8);
    let method = f.u16(10);
    let crc32 = f.u32(16);
    let mut compressed_size = u64::from(f.u32(20));
    let mut size = u64::from(f.u32(24));
    let name_len = usize::from(f.u16(28));
    let extra_len = usize::from(f.u16(30));
    let comment_len = usize::from(f.u16(32));
    let mut header = u64::from(f.u32(42));
    let name_start = pos + CENTRAL_LEN;
    let extra_start = name_start + name_len;
    let next = extra_start + extra_len + comment_len;
    let (Some(name), Some(extra)) = (
        cd.get(name_start..extra_start),
        cd.get(extra_start..extra_start + extra_len),
    ) else {
        return Err(zip_err("central directory ends inside an entry"));
    };
    let name = String::from_utf8(name.to_vec()).map_err(|_| zip_err("entry name is not UTF-8"))?;
    // zip64 extra field: the 32-bit fields set to all ones, in this order.
    let mut ex = extra;
    while ex.len() >= 4 {
        let id = Fields(ex).u16(0);
        let len = usize::from(Fields(ex).u16(2));
        let Some(body) = ex.get(4..4 + len) else {
            break;
        };
        if id == 0x0001 {
            let mut at = 0;
            for field in [&mut size, &mut compressed_size, &mut header] {
                if *field == 0xffff_ffff {
                    if at + 8 > body.len() {
                        return Err(zip_err(format!("entry {name:?}: zip64 field too short")));
                    }
                    *field = Fields(body).u64(at);
                    at += 8;
                }
            }
        }
        ex = &ex[4 + len..];
    }
    if flags & 1 != 0 {
        return Err(PytorchError::Encrypted { name });
    }
    let method = match method {
        0 => Method::Stored,
        8 => Method::Deflated,
        other => {
            return Err(PytorchError::UnsupportedCompression {
                name,
                method: other,
            })
        }
    };
    if method == Method::Stored && compressed_size != size {
        return Err(zip_err(format!(
            "stored entry {name:?} has size {size} but compressed size {compressed_size}"
        )));
    }
    let entry = Entry {
        name,
        method,
        crc32,
        compressed_size,
        size,
        data_start: header,
    };
    Ok((entry, next))
}

/// Reads an entry's local header, checks its name against the central
/// directory, and sets `data_start`, checking the data lies inside the file.
fn locate<R: ReadAt + ?Sized>(
    src: &R,
    file_len: u64,
    mut entry: Entry,
) -> Result<Entry, PytorchError> {
    let header = entry.data_start;
    let fixed = read_vec(src, header, LOCAL_LEN, "local header")?;
    let f = Fields(&fixed);
    if f.u32(0) != LOCAL_SIG {
        return Err(zip_err(format!(
            "entry {:?}: no local header at byte {header}",
            entry.name
        )));
    }
    let name_len = f.u16(26);
    let extra_len = f.u16(28);
    // The 30 fixed bytes were read, so `header + 30` is inside the file.
    let name_at = header.saturating_add(LOCAL_LEN as u64);
    let local_name = read_vec(src, name_at, usize::from(name_len), "local header name")?;
    if local_name != entry.name.as_bytes() {
        return Err(PytorchError::EntryNameMismatch {
            central: entry.name,
            local: String::from_utf8_lossy(&local_name).into_owned(),
        });
    }
    let data_start = name_at.saturating_add(u64::from(name_len) + u64::from(extra_len));
    let end = data_start.checked_add(entry.compressed_size);
    if end.is_none_or(|end| end > file_len) {
        return Err(PytorchError::EntryPastEnd {
            name: entry.name,
            end: end.unwrap_or(u64::MAX),
            file_len,
        });
    }
    entry.data_start = data_start;
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Write};

    use super::*;

    fn archive(method: ::zip::CompressionMethod) -> Vec<u8> {
        let mut w = ::zip::ZipWriter::new(Cursor::new(Vec::new()));
        let opts = ::zip::write::SimpleFileOptions::default().compression_method(method);
        w.start_file("a/data.pkl", opts).unwrap();
        w.write_all(b"hello hello hello").unwrap();
        w.start_file("a/data/0", opts).unwrap();
        w.write_all(&[7; 100]).unwrap();
        w.finish().unwrap().into_inner()
    }

    #[test]
    fn stored_entries_are_located_in_place() {
        let bytes = archive(::zip::CompressionMethod::Stored);
        let index = ZipIndex::read(&bytes[..], bytes.len() as u64).unwrap();
        let e = index.get("a/data/0").unwrap();
        assert_eq!(e.method, Method::Stored);
        let start = e.data_start as usize;
        assert_eq!(&bytes[start..start + 100], &[7; 100][..]);
        let pkl = ZipIndex::read_entry(&bytes[..], index.get("a/data.pkl").unwrap(), 1000).unwrap();
        assert_eq!(pkl, b"hello hello hello");
    }

    #[test]
    fn deflated_entries_inflate_and_check_crc() {
        let bytes = archive(::zip::CompressionMethod::Deflated);
        let index = ZipIndex::read(&bytes[..], bytes.len() as u64).unwrap();
        let e = index.get("a/data.pkl").unwrap();
        assert_eq!(e.method, Method::Deflated);
        assert_eq!(
            ZipIndex::read_entry(&bytes[..], e, 1000).unwrap(),
            b"hello hello hello"
        );
        assert!(matches!(
            ZipIndex::read_entry(&bytes[..], e, 3),
            Err(PytorchError::EntryTooLarge { .. })
        ));
    }

    #[test]
    fn corrupt_stored_bytes_fail_the_crc() {
        let mut bytes = archive(::zip::CompressionMethod::Stored);
        let index = ZipIndex::read(&bytes[..], bytes.len() as u64).unwrap();
        let e = index.get("a/data.pkl").unwrap().clone();
        bytes[e.data_start as usize] ^= 1;
        let err = ZipIndex::read_entry(&bytes[..], &e, 1000).unwrap_err();
        assert!(matches!(err, PytorchError::CrcMismatch { .. }), "{err}");
    }

    #[test]
    fn local_name_must_match_central_name() {
        let mut bytes = archive(::zip::CompressionMethod::Stored);
        // The first local header's name starts at byte 30: "a/data.pkl".
        bytes[30] = b'b';
        let err = ZipIndex::read(&bytes[..], bytes.len() as u64).unwrap_err();
        assert!(
            matches!(err, PytorchError::EntryNameMismatch { .. }),
            "{err}"
        );
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = archive(::zip::CompressionMethod::Stored);
        for cut in 0..bytes.len() {
            assert!(
                ZipIndex::read(&bytes[..cut], cut as u64).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn every_single_byte_corruption_is_handled() {
        let bytes = archive(::zip::CompressionMethod::Deflated);
        for i in 0..bytes.len() {
            for v in [0u8, 0xff, bytes[i] ^ 0x80] {
                let mut b = bytes.clone();
                b[i] = v;
                if let Ok(index) = ZipIndex::read(&b[..], b.len() as u64) {
                    for e in index.entries() {
                        let _ = ZipIndex::read_entry(&b[..], e, 1 << 20);
                    }
                }
            }
        }
    }
}
