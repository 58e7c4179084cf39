//! Connections: the accept loop, its limits, and what a client sees at each
//! (docs/server-api.md, "Limits").
//!
//! - **Header timeout** ([`NetLimits::header_timeout_ms`]): a request's headers must arrive
//!   within it, and a kept-alive connection waits that long for its next request; the connection
//!   is closed otherwise (a client that opens sockets and sends nothing, or a byte a second,
//!   holds them that long at most).
//! - **Request timeout** ([`NetLimits::request_timeout_ms`]): a request (its body read and its
//!   answer made) that takes longer answers `408 request_timeout`.
//! - **Connection cap** ([`NetLimits::max_connections`], and at most the process's open-file
//!   limit less 128, so the database, the store and ingest keep descriptors): a connection beyond
//!   it is answered at once `503 too_many_connections` with `Retry-After: 1`, and closed.
//!
//! Every request carries its client's address ([`ClientAddr`]) for the per-address limits of
//! [`crate::auth`].

use crate::error::ServerError;
use axum::body::Body;
use axum::http::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// The client address of a request (an extension every request carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// Limits of the connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetLimits {
    /// Open connections at most (also bounded by the open-file limit).
    pub max_connections: usize,
    /// Time to send a request's headers, and to start the next request on a kept-alive
    /// connection, ms.
    pub header_timeout_ms: u64,
    /// Time for a whole request (body read, answer made), ms.
    pub request_timeout_ms: u64,
}

impl Default for NetLimits {
    fn default() -> Self {
        NetLimits {
            max_connections: 512,
            header_timeout_ms: 10_000,
            request_timeout_ms: 120_000,
        }
    }
}

/// The soft limit of open files of this process (`/proc/self/limits`), if it says.
pub fn open_file_limit() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    let l = s.lines().find(|l| l.starts_with("Max open files"))?;
    l["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The connection cap in effect: [`NetLimits::max_connections`], at most the open-file limit
/// less 128 (at least 16).
pub fn effective_cap(limits: &NetLimits) -> usize {
    let fd = open_file_limit().map_or(usize::MAX, |n| n.saturating_sub(128).max(16));
    limits.max_connections.max(1).min(fd)
}

/// The answer to a connection beyond the cap, written before anything is read.
fn over_cap() -> String {
    let body = r#"{"error":"too_many_connections","reason":"the server has as many connections open as it takes; retry in a second"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Serve `app` on `listener` until `shutdown` completes, then let open requests finish (10 s at
/// most).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: NetLimits,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    let cap = effective_cap(&limits);
    let refusal: Arc<[u8]> = over_cap().into_bytes().into();
    let open = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before it was taken:
                    // wait a moment rather than spin.
                    eprintln!("gpufl serve: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if open.load(Ordering::Relaxed) >= cap {
            let refusal = refusal.clone();
            tokio::spawn(async move {
                let mut stream = stream;
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    let _ = stream.write_all(&refusal).await;
                    let _ = stream.shutdown().await;
                })
                .await;
            });
            continue;
        }
        let _ = stream.set_nodelay(true);
        open.fetch_add(1, Ordering::Relaxed);
        let guard = Open(open.clone());
        let app = app.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(ClientAddr(peer));
                let mut app = app.clone();
                async move {
                    let req = req.map(Body::new);
                    tower_service::Service::call(&mut app, req).await
                }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(Duration::from_millis(limits.header_timeout_ms.max(1)))
                .max_buf_size(256 << 10);
            let conn = b.serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    let _ = stop_tx.send(true);
    let t = std::time::Instant::now();
    while open.load(Ordering::Relaxed) > 0 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One open connection, counted while it lives.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
