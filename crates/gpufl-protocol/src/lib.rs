//! # gpufl-protocol
//!
//! The upload protocol's wire types (docs/server-api.md, "Uploading a session"), declared once
//! for both sides: the client (`gpufl-upload`) writes manifests and reads the status and the
//! completion's answer, the server (`gpufl-server`) does the reverse. Field order is the order of
//! the JSON the server has always written (a completion's keys are in name order, as serde_json
//! wrote them from a `json!` map).

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Bytes of one part as the server splits files (the last part of a file may be shorter). The
/// server says its part size in its status answer; a client splits by that.
pub const PART_SIZE: u64 = 4 << 20;

/// One part of a file, as the status answer lists it and as it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartInfo {
    pub index: u64,
    pub size: u64,
    /// SHA-256 of the part's bytes, lower-case hex.
    pub sha256: String,
}

/// One file of the completion's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileManifest {
    /// `trace-NNNN.ndjson.zst`.
    pub name: String,
    /// Bytes sent of the file (its closed prefix).
    pub size: u64,
    /// SHA-256 of those bytes, lower-case hex.
    pub sha256: String,
    /// Number of parts.
    pub parts: u64,
}

impl FileManifest {
    /// The size of part `i` of the file in parts of [`PART_SIZE`].
    pub fn part_len(&self, i: u64) -> u64 {
        (self.size - i * PART_SIZE).min(PART_SIZE)
    }
}

/// The body of `POST /api/v1/uploads/{session}/complete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub files: Vec<FileManifest>,
}

/// The answer to `GET /api/v1/uploads/{session}`: what the server holds of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadStatus {
    #[serde(default)]
    pub session: String,
    pub part_size: u64,
    /// `absent`, `uploading` or `complete`.
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub files: Vec<StatusFile>,
}

/// A file the server holds parts of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusFile {
    pub name: String,
    #[serde(default)]
    pub parts: Vec<PartInfo>,
}

impl UploadStatus {
    /// The parts the server holds of file `name`, by index.
    pub fn held(&self, name: &str) -> HashMap<u64, &PartInfo> {
        self.files
            .iter()
            .filter(|f| f.name == name)
            .flat_map(|f| f.parts.iter())
            .map(|p| (p.index, p))
            .collect()
    }
}

/// The answer to `PUT …/files/{name}/parts/{index}`: whether the bytes were stored (false: the
/// same part was there already).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartStored {
    pub stored: bool,
}

/// The answer to `POST …/complete` (keys in name order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// The session's analysis: `pending`, `running`, `ready`, `corrupt`.
    #[serde(default)]
    pub ingest: String,
    #[serde(default)]
    pub session: String,
    /// `complete`.
    #[serde(default)]
    pub state: String,
    /// `new`, `unchanged` or `extended`.
    pub stored: String,
}

/// Every answer other than 2xx: a stable code and a reason for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default)]
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_is_the_protocols() {
        let m = Manifest {
            files: vec![FileManifest {
                name: "trace-0000.ndjson.zst".into(),
                size: PART_SIZE + 1,
                sha256: "ab".into(),
                parts: 2,
            }],
        };
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            format!(
                r#"{{"files":[{{"name":"trace-0000.ndjson.zst","size":{},"sha256":"ab","parts":2}}]}}"#,
                PART_SIZE + 1
            )
        );
        assert_eq!(
            (m.files[0].part_len(0), m.files[0].part_len(1)),
            (PART_SIZE, 1)
        );
        let extra = r#"{"files":[],"more":1}"#;
        assert!(serde_json::from_str::<Manifest>(extra).is_err());
        let s = UploadStatus {
            session: "s".into(),
            part_size: PART_SIZE,
            state: "uploading".into(),
            files: vec![StatusFile {
                name: "trace-0000.ndjson.zst".into(),
                parts: vec![PartInfo {
                    index: 0,
                    size: 3,
                    sha256: "cd".into(),
                }],
            }],
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"session":"s","part_size":4194304,"state":"uploading","files":[{"name":"trace-0000.ndjson.zst","parts":[{"index":0,"size":3,"sha256":"cd"}]}]}"#
        );
        let c = Completion {
            ingest: "pending".into(),
            session: "s".into(),
            state: "complete".into(),
            stored: "new".into(),
        };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"ingest":"pending","session":"s","state":"complete","stored":"new"}"#
        );
        assert_eq!(
            serde_json::to_string(&PartStored { stored: true }).unwrap(),
            r#"{"stored":true}"#
        );
        let e = ErrorBody {
            error: "not_found".into(),
            reason: "no".into(),
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"error":"not_found","reason":"no"}"#
        );
    }
}
