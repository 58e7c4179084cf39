//! # gpufl-upload
//!
//! The client side of the server's upload protocol (docs/server-api.md, "Uploading a session"),
//! synchronous. Per session ([`upload_session`], or [`Uploader::upload`] to reuse connections
//! across sessions):
//!
//! 1. each `trace-NNNN.ndjson.zst` is opened and its **closed prefix** found
//!    ([`gpufl_trace::open_closed`]: up to the end of its last complete block, so a session still
//!    being recorded is sent up to there, and a later upload sends the rest);
//! 2. `GET /api/v1/uploads/{session}` says what the server holds and its `part_size`;
//! 3. each file's prefix is read in parts of `part_size` (one part in memory at a time), each part
//!    and the whole file hashed (SHA-256), and only the parts the server lacks, or holds with
//!    another size or hash, are sent (`PUT …/files/{name}/parts/{index}` with `X-Gpufl-Sha256`);
//! 4. `POST …/complete` with the manifest; the answer says whether the session was stored
//!    new, unchanged or extended.
//!
//! Requests are tried again on connection errors, 5xx and 429 (exponential backoff, or the
//! server's `Retry-After`: a server over its connection cap answers 503 with one; a server that
//! cannot be reached at all is tried for [`UploadOptions::connect_timeout`], 5 s by default); a completion
//! the server could not take as it stood (`409 incomplete`, `409 completion_raced`) starts the
//! session's upload over once; any other 4xx is final, an [`UploadError::Server`] with the server's
//! `error` code and `reason`. [`find_sessions`] finds the session directories under the paths a
//! user names.

mod error;
pub mod find;
pub mod http;
pub mod parts;

pub use error::UploadError;
pub use find::{find_sessions, is_session_dir};
pub use http::Retry;
pub use parts::{FileManifest, Manifest, PartInfo, UploadStatus};

use gpufl_protocol::Completion;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where and how to upload.
#[derive(Clone)]
pub struct UploadOptions {
    /// The server's address, `http(s)://host[:port][/prefix]` (`/api/v1` is appended unless it
    /// ends the address).
    pub server: String,
    /// An upload key (`gfl_up_…`), sent as `Authorization: Bearer KEY`.
    pub api_key: String,
    /// How many times a request is tried again after a connection error, a 5xx or a 429.
    pub retries: u32,
    /// The wait before the first retry, doubled at each further one…
    pub backoff: Duration,
    /// …up to this.
    pub max_backoff: Duration,
    /// Connect, read and write timeout of each request.
    pub timeout: Duration,
    /// How long a request keeps trying to reach a server it cannot connect to (connection
    /// refused, no route, DNS, a connect that does not complete), first attempt and retries
    /// together; then it fails. A connect attempt itself waits at most this long (and at least
    /// 1 s). Default [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
}

/// Default of [`UploadOptions::connect_timeout`]: 5 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl UploadOptions {
    /// `server` and `api_key` with the defaults: 5 retries, 1 s backoff doubling up to 30 s,
    /// 60 s timeouts, 5 s for a server that cannot be reached.
    pub fn new(server: impl Into<String>, api_key: impl Into<String>) -> Self {
        UploadOptions {
            server: server.into(),
            api_key: api_key.into(),
            retries: 5,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            timeout: Duration::from_secs(60),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// The key stays out of debug output.
impl std::fmt::Debug for UploadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadOptions")
            .field("server", &self.server)
            .field("api_key", &"…")
            .field("retries", &self.retries)
            .field("backoff", &self.backoff)
            .field("max_backoff", &self.max_backoff)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// How an upload goes, told after each step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The session's id (its directory's name).
    pub session: String,
    /// What just happened.
    pub event: Event,
    /// Bytes of the session's closed prefixes gone through so far (hashed, and sent or found on
    /// the server).
    pub done: u64,
    /// Bytes of the session's closed prefixes.
    pub total: u64,
    /// Bytes sent so far.
    pub sent: u64,
}

/// A step of an upload (see [`Progress`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The files were opened and their closed prefixes found; the server is asked what it holds.
    Started,
    /// A part went through: sent, or found on the server with the same bytes.
    Part {
        file: String,
        index: u64,
        parts: u64,
        sent: bool,
    },
    /// A request failed and will be tried again after a wait.
    Retry(Retry),
    /// Every part is on the server; the manifest is being sent.
    Completing,
}

/// What the server did with a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Stored for the first time.
    New,
    /// Complete already with the same manifest: nothing changed.
    Unchanged,
    /// More bytes than before (a session uploaded while it was recorded): analysed again.
    Extended,
    /// A word this client does not know.
    Other(String),
}

impl Stored {
    fn from_word(s: &str) -> Self {
        match s {
            "new" => Stored::New,
            "unchanged" => Stored::Unchanged,
            "extended" => Stored::Extended,
            _ => Stored::Other(s.to_string()),
        }
    }

    /// The server's word for it.
    pub fn as_str(&self) -> &str {
        match self {
            Stored::New => "new",
            Stored::Unchanged => "unchanged",
            Stored::Extended => "extended",
            Stored::Other(s) => s,
        }
    }
}

/// One session uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The session's id.
    pub session: String,
    /// Its directory.
    pub dir: PathBuf,
    /// What the server did with it.
    pub stored: Stored,
    /// The server's ingest state (`pending`, `ready`).
    pub ingest: String,
    /// The manifest sent.
    pub manifest: Manifest,
    /// Bytes of the files' closed prefixes (what the server now holds of the session).
    pub bytes: u64,
    /// Bytes after the closed prefixes (a block still being written, or cut short by a crash),
    /// left for a later upload.
    pub open_bytes: u64,
    /// Bytes sent in parts.
    pub bytes_sent: u64,
    /// Parts sent.
    pub parts_sent: u64,
    /// Parts the server held already with the same bytes.
    pub parts_skipped: u64,
}

/// An upload client: the server's options and one connection pool, for any number of sessions.
pub struct Uploader {
    client: http::Client,
}

impl Uploader {
    /// A client for `opts` (checked: an http(s) URL and a key).
    pub fn new(opts: &UploadOptions) -> Result<Self, UploadError> {
        Ok(Uploader {
            client: http::Client::new(opts)?,
        })
    }

    /// Upload the session in `dir` (see the crate's documentation); `progress` hears of each step.
    /// A completion refused because the server no longer holds every part (`409 incomplete`: an
    /// upload it removed meanwhile) or because another completion of the session raced it
    /// (`409 completion_raced`) starts the upload over once, from the status.
    pub fn upload(
        &self,
        dir: &Path,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Outcome, UploadError> {
        match self.upload_once(dir, progress) {
            Err(e) if e.worth_starting_over() => self.upload_once(dir, progress),
            r => r,
        }
    }

    fn upload_once(
        &self,
        dir: &Path,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Outcome, UploadError> {
        let session = session_id(dir)?;
        let names = parts::session_files(dir)?;
        if names.is_empty() {
            return Err(UploadError::NotASession(dir.to_path_buf()));
        }
        // Every file is opened (and its closed prefix fixed) before anything is sent: a rolling
        // session may delete its oldest file meanwhile, an open file stays readable.
        let mut files = Vec::new();
        let (mut total, mut open_bytes) = (0u64, 0u64);
        for (name, path) in names {
            let f = gpufl_trace::open_closed(&path)?;
            total += f.closed;
            open_bytes += f.len.saturating_sub(f.closed);
            files.push((name, path, f));
        }
        if total == 0 {
            return Err(UploadError::NothingClosed(dir.to_path_buf()));
        }
        let mut p = Progress {
            session: session.clone(),
            event: Event::Started,
            done: 0,
            total,
            sent: 0,
        };
        progress(p.clone());

        let what = "GET status".to_string();
        let body = self.client.call(
            "GET",
            &format!("/uploads/{session}"),
            http::Body::None,
            &what,
            &mut |r| {
                progress(Progress {
                    event: Event::Retry(r.clone()),
                    ..p.clone()
                })
            },
        )?;
        let status: UploadStatus =
            serde_json::from_slice(&body).map_err(|e| UploadError::Protocol {
                what: what.clone(),
                why: format!("not the status JSON: {e}"),
            })?;
        if status.part_size == 0 || status.part_size > parts::MAX_PART_SIZE {
            return Err(UploadError::Protocol {
                what,
                why: format!(
                    "part_size {} is outside 1 byte to {} MiB",
                    status.part_size,
                    parts::MAX_PART_SIZE >> 20
                ),
            });
        }

        let mut manifest = Manifest { files: Vec::new() };
        let (mut parts_sent, mut parts_skipped) = (0u64, 0u64);
        let mut buf = Vec::with_capacity(status.part_size as usize);
        for (name, path, mut f) in files {
            // A file with no closed block yet (the newest file of a rolling session, just
            // opened) waits for a later upload.
            if f.closed == 0 {
                continue;
            }
            let held = status.held(&name);
            let count = parts::part_count(f.closed, status.part_size);
            std::io::Seek::rewind(&mut f.file).map_err(|source| UploadError::Io {
                path: path.clone(),
                source,
            })?;
            let entry = parts::split(
                &name,
                &path,
                &mut f.file,
                f.closed,
                status.part_size,
                &mut buf,
                |part, bytes| {
                    let send = parts::needs_send(part, &held);
                    if send {
                        let what = format!("PUT {name} part {}", part.index);
                        self.client.call(
                            "PUT",
                            &format!("/uploads/{session}/files/{name}/parts/{}", part.index),
                            http::Body::Part {
                                bytes,
                                sha256: &part.sha256,
                            },
                            &what,
                            &mut |r| {
                                progress(Progress {
                                    event: Event::Retry(r.clone()),
                                    ..p.clone()
                                })
                            },
                        )?;
                        parts_sent += 1;
                        p.sent += part.size;
                    } else {
                        parts_skipped += 1;
                    }
                    p.done += part.size;
                    p.event = Event::Part {
                        file: name.clone(),
                        index: part.index,
                        parts: count,
                        sent: send,
                    };
                    progress(p.clone());
                    Ok(())
                },
            )?;
            manifest.files.push(entry);
        }

        p.event = Event::Completing;
        progress(p.clone());
        let what = "POST complete".to_string();
        let json = serde_json::to_vec(&manifest).map_err(|e| UploadError::Protocol {
            what: what.clone(),
            why: e.to_string(),
        })?;
        let body = self.client.call(
            "POST",
            &format!("/uploads/{session}/complete"),
            http::Body::Json(&json),
            &what,
            &mut |r| {
                progress(Progress {
                    event: Event::Retry(r.clone()),
                    ..p.clone()
                })
            },
        )?;
        let done = completion(&body).map_err(|why| UploadError::Protocol { what, why })?;
        Ok(Outcome {
            session,
            dir: dir.to_path_buf(),
            stored: Stored::from_word(&done.stored),
            ingest: done.ingest,
            manifest,
            bytes: total,
            open_bytes,
            bytes_sent: p.sent,
            parts_sent,
            parts_skipped,
        })
    }
}

/// Upload the session in `dir` to the server of `opts` (one [`Uploader`] for one session).
pub fn upload_session(
    dir: &Path,
    opts: &UploadOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Outcome, UploadError> {
    Uploader::new(opts)?.upload(dir, progress)
}

/// The session id of a session directory: its name (of the directory itself when `dir` is `.` or
/// ends in `..`), which the server takes only of `[A-Za-z0-9._-]`.
pub fn session_id(dir: &Path) -> Result<String, UploadError> {
    let named = match dir.file_name() {
        Some(n) => PathBuf::from(n),
        None => std::fs::canonicalize(dir)
            .map_err(|source| UploadError::Io {
                path: dir.to_path_buf(),
                source,
            })?
            .file_name()
            .map(PathBuf::from)
            .unwrap_or_default(),
    };
    match named.to_str() {
        Some(s) if parts::is_session_name(s) => Ok(s.to_string()),
        _ => Err(UploadError::BadSessionName(dir.to_path_buf())),
    }
}

fn completion(body: &[u8]) -> Result<Completion, String> {
    serde_json::from_slice(body).map_err(|e| format!("not the completion JSON: {e}"))
}

/// A byte count as people read it (`512 B`, `4.6 KiB`, `1.2 MiB`, `3.05 GiB`).
pub fn human_size(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let f = b as f64;
    if f < KIB {
        format!("{b} B")
    } else if f < KIB * KIB {
        format!("{:.1} KiB", f / KIB)
    } else if f < KIB * KIB * KIB {
        format!("{:.1} MiB", f / KIB / KIB)
    } else {
        format!("{:.2} GiB", f / KIB / KIB / KIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_answers() {
        let c = completion(
            br#"{"session":"s","state":"complete","stored":"extended","ingest":"pending"}"#,
        )
        .unwrap();
        assert_eq!(Stored::from_word(&c.stored), Stored::Extended);
        assert_eq!(c.ingest, "pending");
        assert_eq!(Stored::from_word("new"), Stored::New);
        assert_eq!(Stored::from_word("unchanged").as_str(), "unchanged");
        assert_eq!(
            Stored::from_word("merged"),
            Stored::Other("merged".to_string())
        );
        assert!(completion(b"<html>").is_err());
    }

    #[test]
    fn session_ids() {
        assert_eq!(
            session_id(Path::new("/x/train-4242-20231114T221320Z")).unwrap(),
            "train-4242-20231114T221320Z"
        );
        assert_eq!(
            session_id(Path::new("rel/train-1-20231114T221320Z/")).unwrap(),
            "train-1-20231114T221320Z"
        );
        assert!(matches!(
            session_id(Path::new("/x/my session")),
            Err(UploadError::BadSessionName(_))
        ));
        assert!(matches!(
            session_id(Path::new("/")),
            Err(UploadError::BadSessionName(_))
        ));
    }

    #[test]
    fn options_are_checked_and_the_key_kept_out_of_debug() {
        let o = UploadOptions::new("http://127.0.0.1:9", "gfl_up_secret");
        assert!(!format!("{o:?}").contains("secret"));
        assert!(Uploader::new(&o).is_ok());
        let e = Uploader::new(&UploadOptions::new("http://127.0.0.1:9", " "));
        assert!(matches!(e, Err(UploadError::Options(_))));
        let e = Uploader::new(&UploadOptions::new("127.0.0.1:9", "k"));
        assert!(matches!(e, Err(UploadError::Options(_))));
    }

    /// A server that does not answer (a closed port on this machine): the status request is tried
    /// `retries` more times, each retry told, then a transport error.
    #[test]
    fn an_unreachable_server_is_retried_then_given_up() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut opts = UploadOptions::new(format!("http://127.0.0.1:{port}"), "gfl_up_x");
        opts.retries = 2;
        opts.backoff = Duration::from_millis(1);
        opts.timeout = Duration::from_secs(5);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/sessions/stream_sync_loop-665-20261122T061858Z");
        let mut events = Vec::new();
        let e = upload_session(&dir, &opts, &mut |p| events.push(p)).unwrap_err();
        assert!(
            matches!(&e, UploadError::Transport { attempts: 3, what, .. } if what == "GET status"),
            "{e:?}"
        );
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[0].event, Event::Started);
        assert_eq!(events[0].total, 608);
        for (i, p) in events[1..].iter().enumerate() {
            let Event::Retry(r) = &p.event else {
                panic!("{p:?}")
            };
            assert_eq!((r.attempt, r.retries), (i as u32 + 1, 2));
        }
    }

    /// A server that refuses connections is tried for the connect timeout, not for the whole
    /// backoff (1 + 2 + 4 + 8 + 16 s with 5 retries).
    #[test]
    fn an_unreachable_server_is_given_up_at_the_connect_timeout() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut opts = UploadOptions::new(format!("http://127.0.0.1:{port}"), "gfl_up_x");
        assert_eq!(opts.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        opts.connect_timeout = Duration::from_millis(1500);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/sessions/stream_sync_loop-665-20261122T061858Z");
        let t = std::time::Instant::now();
        let e = upload_session(&dir, &opts, &mut |_| {}).unwrap_err();
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(1400) && took < Duration::from_secs(3),
            "{took:?}"
        );
        let UploadError::Transport { attempts, why, .. } = &e else {
            panic!("{e:?}")
        };
        assert!((2..=3).contains(attempts), "{e:?}");
        assert!(why.contains("connect timeout 1.5 s"), "{why}");
    }

    /// What is sent of a session whose last file ends in a block still being written: its closed
    /// prefix, in parts, with the whole prefix's hash in the manifest (the bytes of a real bundled
    /// session, cut inside its last block).
    #[test]
    fn a_session_being_recorded_is_split_up_to_its_closed_prefix() {
        let name = "torch_compile_recompile-1287-20261126T044458Z";
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions");
        let whole = std::fs::read(src.join(name).join("trace-0000.ndjson.zst")).unwrap();
        let root = std::env::temp_dir().join(format!("gpufl-upload-open-{}", std::process::id()));
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace-0000.ndjson.zst");
        let cut = &whole[..whole.len() - 100];
        std::fs::write(&path, cut).unwrap();
        let mut f = gpufl_trace::open_closed(&path).unwrap();
        assert_eq!(f.len, cut.len() as u64);
        assert!(
            f.closed > 0 && f.closed < f.len,
            "{} of {}",
            f.closed,
            f.len
        );
        // The closed prefix is whole blocks: it is closed to its own end.
        let copy = root.join("closed.ndjson.zst");
        std::fs::write(&copy, &whole[..f.closed as usize]).unwrap();
        assert_eq!(gpufl_trace::closed_len(&copy).unwrap(), f.closed);
        std::io::Seek::rewind(&mut f.file).unwrap();
        let mut buf = Vec::new();
        let mut seen = Vec::new();
        let part_size = 16 << 10;
        let entry = parts::split(
            "trace-0000.ndjson.zst",
            &path,
            &mut f.file,
            f.closed,
            part_size,
            &mut buf,
            |p, b| {
                assert_eq!(p.size, b.len() as u64);
                assert!(p.size > 0 && p.size <= part_size);
                seen.push(p.index);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(entry.size, f.closed);
        assert_eq!(entry.sha256, parts::sha256_hex(&whole[..f.closed as usize]));
        assert_eq!(entry.parts, f.closed.div_ceil(part_size));
        assert_eq!(seen, (0..entry.parts).collect::<Vec<_>>());
        assert_eq!(session_id(&dir).unwrap(), name);
        let _ = std::fs::remove_dir_all(&root);
    }
}
