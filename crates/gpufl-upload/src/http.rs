//! Requests to the server, with retries: connection errors, 5xx and 429 are tried again after an
//! exponential backoff (or the `Retry-After` of a 429 or 503); any other 4xx is final, with the server's
//! `error` code and `reason`.

use crate::error::UploadError;
use crate::UploadOptions;
use std::io::Read;
use std::time::Duration;

/// The longest body read from an answer (a status of a session of ~100 GB lists ~25,000 parts).
const MAX_BODY: u64 = 16 << 20;

/// The longest wait a `Retry-After` may ask for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// A request about to be tried again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// The request (`GET status`, `PUT trace-0000.ndjson.zst part 3`, …).
    pub what: String,
    /// The attempt that failed (1 for the first).
    pub attempt: u32,
    /// Retries allowed after the first attempt.
    pub retries: u32,
    /// The wait before the next attempt.
    pub wait: Duration,
    /// What failed.
    pub why: String,
}

/// The server's API root and one connection pool.
pub(crate) struct Client {
    agent: ureq::Agent,
    /// `…/api/v1`, no slash at the end.
    root: String,
    auth: String,
    retries: u32,
    backoff: Duration,
    max_backoff: Duration,
    /// The time a request may spend failing to connect ([`UploadOptions::connect_timeout`]).
    connect_timeout: Duration,
}

/// A request's body.
pub(crate) enum Body<'a> {
    None,
    Part { bytes: &'a [u8], sha256: &'a str },
    Json(&'a [u8]),
}

/// A failed attempt that may be tried again.
struct Failure {
    why: String,
    /// The answer, for an HTTP status (status, code, reason).
    answer: Option<(u16, String, String)>,
    retry_after: Option<Duration>,
    /// The server could not be reached (refused, DNS, connect timeout): bounded by the connect
    /// timeout.
    unreachable: bool,
}

/// The API root of `server`: `…/api/v1` appended unless it is there.
pub(crate) fn api_root(server: &str) -> Result<String, UploadError> {
    let s = server.trim().trim_end_matches('/');
    if s.is_empty() {
        return Err(UploadError::Options(
            "no server given (--server URL or GPUFL_SERVER)".into(),
        ));
    }
    let lower = s.to_ascii_lowercase();
    if !lower.starts_with("http://") && !lower.starts_with("https://") {
        return Err(UploadError::Options(format!(
            "the server's URL must start with http:// or https:// (got {s:?})"
        )));
    }
    Ok(if s.ends_with("/api/v1") {
        s.to_string()
    } else {
        format!("{s}/api/v1")
    })
}

/// The wait before retry `n` (0 for the first retry): `first × 2ⁿ`, at most `max`.
pub fn backoff(first: Duration, max: Duration, n: u32) -> Duration {
    first
        .saturating_mul(1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX))
        .min(max)
}

/// [`backoff`] plus up to a quarter more, so that clients that failed together do not come back
/// together.
fn jittered(first: Duration, max: Duration, n: u32) -> Duration {
    let base = backoff(first, max, n);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    base + base.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

/// A `Retry-After` in seconds (the HTTP-date form is not used by the server: None, so the backoff
/// applies), at most [`MAX_RETRY_AFTER`].
pub fn retry_after(value: &str) -> Option<Duration> {
    let secs: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// Whether a transport error may pass if tried again (a connection refused or reset, DNS, a
/// timeout); a bad URL, an unknown scheme or a proxy's misconfiguration will not.
fn transient(kind: ureq::ErrorKind) -> bool {
    use ureq::ErrorKind as K;
    matches!(
        kind,
        K::Dns | K::ConnectionFailed | K::Io | K::BadStatus | K::BadHeader | K::ProxyConnect
    )
}

/// The server's `{"error", "reason"}`, or the body's text when it is not that.
pub(crate) fn error_body(status: u16, body: &[u8]) -> (String, String) {
    match serde_json::from_slice::<gpufl_protocol::ErrorBody>(body) {
        Ok(e) => (e.error, e.reason),
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text: String = text.trim().chars().take(200).collect();
            (format!("http_{status}"), text)
        }
    }
}

fn read_body(resp: ureq::Response) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    resp.into_reader().take(MAX_BODY).read_to_end(&mut body)?;
    Ok(body)
}

impl Client {
    pub(crate) fn new(opts: &UploadOptions) -> Result<Self, UploadError> {
        let root = api_root(&opts.server)?;
        if opts.api_key.trim().is_empty() {
            return Err(UploadError::Options(
                "no API key given (--api-key KEY or GPUFL_API_KEY)".into(),
            ));
        }
        let connect = opts
            .connect_timeout
            .max(Duration::from_secs(1))
            .min(opts.timeout);
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(connect)
            .timeout_read(opts.timeout)
            .timeout_write(opts.timeout)
            // A redirect is reported, not followed: the key goes to the address given only.
            .redirects(0)
            .user_agent(concat!("gpufl-upload/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Client {
            agent,
            root,
            auth: format!("Bearer {}", opts.api_key.trim()),
            retries: opts.retries,
            backoff: opts.backoff,
            max_backoff: opts.max_backoff,
            connect_timeout: opts.connect_timeout,
        })
    }

    /// `method` on `root + path` with `body`, tried again as the module says; the answer's body
    /// (of a 2xx). `on_retry` hears of each retry before its wait.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Body<'_>,
        what: &str,
        on_retry: &mut dyn FnMut(&Retry),
    ) -> Result<Vec<u8>, UploadError> {
        let url = format!("{}{path}", self.root);
        let start = std::time::Instant::now();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let failure = match self.attempt(method, &url, &body, what)? {
                Ok(body) => return Ok(body),
                Err(f) => f,
            };
            let mut wait = failure
                .retry_after
                .unwrap_or_else(|| jittered(self.backoff, self.max_backoff, attempt - 1));
            // A server that cannot be reached is tried for the connect timeout, no longer.
            let mut out_of_time = false;
            if failure.unreachable {
                let left = self.connect_timeout.saturating_sub(start.elapsed());
                out_of_time = left.is_zero();
                wait = wait.min(left);
            }
            if attempt > self.retries || out_of_time {
                let why = if out_of_time {
                    format!(
                        "{} (gave up after {:.1} s: connect timeout {} s)",
                        failure.why,
                        start.elapsed().as_secs_f64(),
                        self.connect_timeout.as_secs_f64()
                    )
                } else {
                    failure.why
                };
                return Err(match failure.answer {
                    Some((status, code, reason)) => UploadError::Server {
                        what: what.to_string(),
                        status,
                        code,
                        reason: format!("{reason} (after {attempt} attempts)"),
                    },
                    None => UploadError::Transport {
                        what: what.to_string(),
                        attempts: attempt,
                        why,
                    },
                });
            }
            on_retry(&Retry {
                what: what.to_string(),
                attempt,
                retries: self.retries,
                wait,
                why: failure.why,
            });
            std::thread::sleep(wait);
        }
    }

    /// One attempt: Ok(Ok(body)) for a 2xx, Ok(Err(failure)) for what may be tried again, Err for
    /// a final error.
    fn attempt(
        &self,
        method: &str,
        url: &str,
        body: &Body<'_>,
        what: &str,
    ) -> Result<Result<Vec<u8>, Failure>, UploadError> {
        let req = self
            .agent
            .request(method, url)
            .set("Authorization", &self.auth)
            .set("Accept", "application/json");
        let res = match body {
            Body::None => req.call(),
            Body::Part { bytes, sha256 } => req
                .set("Content-Type", "application/octet-stream")
                .set("X-Gpufl-Sha256", sha256)
                .send_bytes(bytes),
            Body::Json(bytes) => req
                .set("Content-Type", "application/json")
                .send_bytes(bytes),
        };
        match res {
            Ok(resp) if (300..400).contains(&resp.status()) => {
                let to = resp.header("Location").unwrap_or("?").to_string();
                Err(UploadError::Protocol {
                    what: what.to_string(),
                    why: format!(
                        "{} {}, redirected to {to}: give the address it names as the server",
                        resp.status(),
                        resp.status_text()
                    ),
                })
            }
            Ok(resp) => Ok(read_body(resp).map_err(|e| Failure {
                why: format!("reading the answer: {e}"),
                answer: None,
                retry_after: None,
                unreachable: false,
            })),
            Err(ureq::Error::Status(status, resp)) => {
                let after = resp.header("Retry-After").and_then(retry_after);
                let body = read_body(resp).unwrap_or_default();
                let (code, reason) = error_body(status, &body);
                if status == 429 || status >= 500 {
                    Ok(Err(Failure {
                        why: format!("{status} {code}: {reason}"),
                        answer: Some((status, code, reason)),
                        retry_after: if matches!(status, 429 | 503) {
                            after
                        } else {
                            None
                        },
                        unreachable: false,
                    }))
                } else {
                    Err(UploadError::Server {
                        what: what.to_string(),
                        status,
                        code,
                        reason,
                    })
                }
            }
            Err(ureq::Error::Transport(t)) => {
                let why = t.to_string();
                if transient(t.kind()) {
                    Ok(Err(Failure {
                        why,
                        answer: None,
                        retry_after: None,
                        unreachable: matches!(
                            t.kind(),
                            ureq::ErrorKind::Dns | ureq::ErrorKind::ConnectionFailed
                        ),
                    }))
                } else {
                    Err(UploadError::Transport {
                        what: what.to_string(),
                        attempts: 1,
                        why,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_root() {
        for s in [
            "http://h:8080",
            "http://h:8080/",
            "http://h:8080/api/v1",
            "http://h:8080/api/v1/",
            " http://h:8080 ",
        ] {
            assert_eq!(api_root(s).unwrap(), "http://h:8080/api/v1", "{s}");
        }
        assert_eq!(
            api_root("https://x.example/gpufl").unwrap(),
            "https://x.example/gpufl/api/v1"
        );
        assert_eq!(
            api_root("HTTPS://x.example").unwrap(),
            "HTTPS://x.example/api/v1"
        );
        for bad in ["", "  ", "h:8080", "ftp://h", "/api/v1"] {
            assert!(
                matches!(api_root(bad), Err(UploadError::Options(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_bound() {
        let s = Duration::from_secs;
        let waits: Vec<Duration> = (0..8).map(|n| backoff(s(1), s(30), n)).collect();
        assert_eq!(waits, [s(1), s(2), s(4), s(8), s(16), s(30), s(30), s(30)]);
        assert_eq!(backoff(s(1), s(30), 1000), s(30));
        assert_eq!(backoff(Duration::MAX, s(30), 3), s(30));
        for n in 0..10 {
            let j = jittered(s(1), s(30), n);
            let b = backoff(s(1), s(30), n);
            assert!(j >= b && j <= b + b / 4, "{j:?} for {b:?}");
        }
    }

    #[test]
    fn retry_after_in_seconds() {
        assert_eq!(retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(retry_after("86400"), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(retry_after("-1"), None);
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            error_body(
                409,
                br#"{"error":"part_conflict","reason":"part 3 is stored with other bytes"}"#
            ),
            (
                "part_conflict".to_string(),
                "part 3 is stored with other bytes".to_string()
            )
        );
        assert_eq!(
            error_body(502, b"<html>Bad Gateway</html>\n"),
            (
                "http_502".to_string(),
                "<html>Bad Gateway</html>".to_string()
            )
        );
        let long = vec![b'x'; 10_000];
        assert_eq!(error_body(500, &long).1.len(), 200);
    }

    #[test]
    fn transient_transport_errors() {
        assert!(transient(ureq::ErrorKind::ConnectionFailed));
        assert!(transient(ureq::ErrorKind::Io));
        assert!(!transient(ureq::ErrorKind::InvalidUrl));
        assert!(!transient(ureq::ErrorKind::UnknownScheme));
    }
}
