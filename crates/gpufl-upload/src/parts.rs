//! A file in parts: the protocol's split (part `i` holds bytes `[i × part_size, (i+1) × part_size)`,
//! the last part may be shorter), the SHA-256 of each part and of the whole, the manifest, and
//! which parts the server still needs.

use crate::error::UploadError;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

pub use gpufl_protocol::{FileManifest, Manifest, PartInfo, StatusFile, UploadStatus, PART_SIZE};

/// The largest part size taken from a server (a part is held in memory while it is sent).
pub const MAX_PART_SIZE: u64 = 64 << 20;

/// Whether `part` is to be sent: the server lacks it, or holds other bytes (another size, as the
/// shorter last part of a file that has grown since, or another hash).
pub fn needs_send(part: &PartInfo, held: &HashMap<u64, &PartInfo>) -> bool {
    match held.get(&part.index) {
        Some(h) => h.size != part.size || !h.sha256.eq_ignore_ascii_case(&part.sha256),
        None => true,
    }
}

/// The number of parts of `size` bytes in parts of `part_size` (0 for an empty file).
pub fn part_count(size: u64, part_size: u64) -> u64 {
    size.div_ceil(part_size.max(1))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Read the first `size` bytes of `input` (from its current position) in parts of `part_size`,
/// one part in `buf` at a time, and hand each to `each` with its [`PartInfo`]; the file's manifest
/// entry (named `name`) once all went through. `path` names the file in errors; an input shorter
/// than `size` is an error.
pub fn split<R: Read>(
    name: &str,
    path: &Path,
    mut input: R,
    size: u64,
    part_size: u64,
    buf: &mut Vec<u8>,
    mut each: impl FnMut(&PartInfo, &[u8]) -> Result<(), UploadError>,
) -> Result<FileManifest, UploadError> {
    let part_size = part_size.max(1);
    let parts = part_count(size, part_size);
    let mut whole = Sha256::new();
    for index in 0..parts {
        let start = index * part_size;
        let len = (size - start).min(part_size) as usize;
        buf.clear();
        buf.resize(len, 0);
        input.read_exact(buf).map_err(|e| io_error(path, e))?;
        whole.update(&buf[..]);
        let part = PartInfo {
            index,
            size: len as u64,
            sha256: sha256_hex(buf),
        };
        each(&part, buf)?;
    }
    Ok(FileManifest {
        name: name.to_string(),
        size,
        sha256: hex(&whole.finalize()),
        parts,
    })
}

fn io_error(path: &Path, e: std::io::Error) -> UploadError {
    let source = if e.kind() == std::io::ErrorKind::UnexpectedEof {
        std::io::Error::new(
            e.kind(),
            "the file is shorter than when it was opened (truncated while it was read?)",
        )
    } else {
        e
    };
    UploadError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `name` is a trace file name the server takes: `trace-` digits `.ndjson.zst`.
pub fn is_trace_name(name: &str) -> bool {
    trace_number(name).is_some()
}

/// The number of a trace file name (`trace-0012.ndjson.zst` → 12).
fn trace_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("trace-")?.strip_suffix(".ndjson.zst")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `name` is a session id the server takes: `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn is_session_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The trace files of a session directory (`trace-NNNN.ndjson.zst`, anything but a directory),
/// in the order of their numbers: (name, path).
pub fn session_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, UploadError> {
    let rd = std::fs::read_dir(dir).map_err(|source| UploadError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    for e in rd {
        let e = e.map_err(|source| UploadError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let Some(n) = trace_number(&name) else {
            continue;
        };
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        files.push((n, name, e.path()));
    }
    files.sort();
    Ok(files.into_iter().map(|(_, n, p)| (n, p)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts_of(bytes: &[u8], part_size: u64) -> (Vec<(PartInfo, Vec<u8>)>, FileManifest) {
        let mut got = Vec::new();
        let mut buf = Vec::new();
        let m = split(
            "trace-0000.ndjson.zst",
            Path::new("x"),
            bytes,
            bytes.len() as u64,
            part_size,
            &mut buf,
            |p, b| {
                got.push((p.clone(), b.to_vec()));
                Ok(())
            },
        )
        .unwrap();
        (got, m)
    }

    #[test]
    fn sha256_is_the_standard_one() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn parts_cover_the_file_in_order() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for part_size in [1u64, 7, 4096, 5000, 9_999, 10_000, 10_001, PART_SIZE] {
            let (parts, m) = parts_of(&bytes, part_size);
            assert_eq!(
                parts.len() as u64,
                part_count(bytes.len() as u64, part_size)
            );
            assert_eq!(m.parts, parts.len() as u64);
            assert_eq!(m.size, bytes.len() as u64);
            assert_eq!(m.sha256, sha256_hex(&bytes));
            for (i, (p, b)) in parts.iter().enumerate() {
                let start = i * part_size as usize;
                let end = (start + part_size as usize).min(bytes.len());
                assert_eq!(p.index, i as u64);
                assert_eq!(p.size, (end - start) as u64);
                assert_eq!(b, &bytes[start..end]);
                assert_eq!(p.sha256, sha256_hex(&bytes[start..end]));
                if i + 1 < parts.len() {
                    assert_eq!(p.size, part_size, "only the last part is shorter");
                }
            }
        }
        let (parts, m) = parts_of(&[], PART_SIZE);
        assert!(parts.is_empty());
        assert_eq!((m.size, m.parts), (0, 0));
        assert_eq!(m.sha256, sha256_hex(b""));
    }

    /// Only the first `size` bytes are read, and an input shorter than `size` is an error.
    #[test]
    fn split_reads_size_bytes() {
        let bytes = [3u8; 100];
        let mut buf = Vec::new();
        let m = split("t", Path::new("x"), &bytes[..], 60, 25, &mut buf, |_, _| {
            Ok(())
        })
        .unwrap();
        assert_eq!((m.size, m.parts), (60, 3));
        assert_eq!(m.sha256, sha256_hex(&bytes[..60]));
        let e = split(
            "t",
            Path::new("x"),
            &bytes[..],
            101,
            25,
            &mut buf,
            |_, _| Ok(()),
        );
        assert!(matches!(e, Err(UploadError::Io { .. })), "{e:?}");
    }

    #[test]
    fn the_manifest_is_the_protocols_json() {
        let m = Manifest {
            files: vec![FileManifest {
                name: "trace-0000.ndjson.zst".into(),
                size: 5,
                sha256: sha256_hex(b"hello"),
                parts: 1,
            }],
        };
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({"files": [{
                "name": "trace-0000.ndjson.zst",
                "size": 5,
                "sha256": "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
                "parts": 1
            }]})
        );
    }

    #[test]
    fn only_missing_or_different_parts_are_sent() {
        let status: UploadStatus = serde_json::from_value(serde_json::json!({
            "session": "app-1-20260101T000000Z",
            "part_size": 4,
            "state": "uploading",
            "files": [
                {"name": "trace-0000.ndjson.zst", "parts": [
                    {"index": 0, "size": 4, "sha256": sha256_hex(b"abcd")},
                    {"index": 1, "size": 4, "sha256": sha256_hex(b"XXXX")},
                    {"index": 2, "size": 2, "sha256": sha256_hex(b"ij")}
                ]},
                {"name": "trace-0001.ndjson.zst", "parts": []}
            ]
        }))
        .unwrap();
        let held = status.held("trace-0000.ndjson.zst");
        let (parts, _) = parts_of(b"abcdefghijklm", 4);
        let send: Vec<u64> = parts
            .iter()
            .filter(|(p, _)| needs_send(p, &held))
            .map(|(p, _)| p.index)
            .collect();
        // 0 is held; 1 is held with other bytes; 2 is held shorter (the file grew); 3 is new.
        assert_eq!(send, [1, 2, 3]);
        // Upper-case hex from a server is the same hash.
        let mut upper = status.clone();
        upper.files[0].parts[0].sha256 = sha256_hex(b"abcd").to_uppercase();
        assert!(!needs_send(
            &parts[0].0,
            &upper.held("trace-0000.ndjson.zst")
        ));
        assert!(status.held("trace-0001.ndjson.zst").is_empty());
        assert!(status.held("trace-0002.ndjson.zst").is_empty());
        // An absent session: no files listed.
        let absent: UploadStatus =
            serde_json::from_str(r#"{"session":"s","part_size":4194304,"state":"absent"}"#)
                .unwrap();
        assert!(needs_send(
            &parts[0].0,
            &absent.held("trace-0000.ndjson.zst")
        ));
    }

    #[test]
    fn names() {
        assert!(is_trace_name("trace-0000.ndjson.zst"));
        assert!(is_trace_name("trace-12345.ndjson.zst"));
        for bad in [
            "trace-.ndjson.zst",
            "trace-00a0.ndjson.zst",
            "trace-0000.ndjson",
            "trace-0000.ndjson.zst.tmp",
            "xtrace-0000.ndjson.zst",
            "trace-+1.ndjson.zst",
        ] {
            assert!(!is_trace_name(bad), "{bad}");
        }
        assert!(is_session_name("train-4242-20231114T221320Z"));
        assert!(is_session_name("a.b_c-1"));
        for bad in ["", ".", "..", "a b", "a/b", "é", "a\nb"] {
            assert!(!is_session_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn session_files_are_in_number_order() {
        let dir = std::env::temp_dir().join(format!("gpufl-upload-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("trace-0003.ndjson.zst")).unwrap();
        for n in [
            "trace-0010.ndjson.zst",
            "trace-0002.ndjson.zst",
            "trace-10000.ndjson.zst",
            "notes.txt",
            "trace-0001.ndjson",
        ] {
            std::fs::write(dir.join(n), b"x").unwrap();
        }
        let names: Vec<String> = session_files(&dir)
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names,
            [
                "trace-0002.ndjson.zst",
                "trace-0010.ndjson.zst",
                "trace-10000.ndjson.zst"
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
