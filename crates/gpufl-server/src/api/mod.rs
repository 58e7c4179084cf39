//! HTTP: the router of `/api/v1`, and the guard every request passes ([`guard`]).

pub mod read;
pub mod upload;

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use std::sync::Arc;

pub fn router(st: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/uploads/{session}", get(upload::status))
        .route(
            "/uploads/{session}/files/{name}/parts/{index}",
            put(upload::put_part),
        )
        .route("/uploads/{session}/complete", post(upload::complete))
        .route("/sessions", get(read::list))
        .route("/sessions/{id}", get(read::one))
        .route("/sessions/{id}/insights", get(read::insights))
        .route("/sessions/{id}/lines", get(read::line))
        .route("/sessions/{id}/kernels", get(read::kernels))
        .route("/sessions/{id}/telemetry", get(read::telemetry))
        .route("/sessions/{id}/files", get(read::files))
        .route("/sessions/{id}/files/{name}", get(read::file));
    Router::new()
        .nest("/api/v1", v1)
        .route("/healthz", get(|| async { "ok" }))
        .merge(crate::web::router())
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no_route",
                "no such endpoint (see /api/v1)",
            )
        })
        // Bodies are bounded by each handler (parts, manifests); this is the outer cap.
        .layer(axum::extract::DefaultBodyLimit::max(
            gpufl_protocol::PART_SIZE as usize + 4096,
        ))
        .layer(axum::middleware::from_fn_with_state(st.clone(), guard))
        .with_state(st)
}

/// Whether `host` (a `Host` header: name or address, and a port) names this machine's loopback:
/// `localhost` (or a name under it), `127.0.0.0/8`, `[::1]`.
pub fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A query string holding a NUL or another control character once decoded (which no parameter
/// of the API or the dashboard takes, and PostgreSQL refuses in text).
fn query_has_control(q: &str) -> bool {
    url::form_urlencoded::parse(q.as_bytes())
        .any(|(k, v)| k.chars().chain(v.chars()).any(|c| c.is_control()))
}

/// What every request passes, whatever its route:
///
/// - with an open project (`--local`, `--demo`), a `Host` that is not a loopback name is refused
///   (`421 bad_host`): a page elsewhere that rebinds its name to 127.0.0.1 reads nothing;
/// - a query holding a control character is refused (`400 bad_query`);
/// - a request taking longer than the request timeout answers `408 request_timeout`;
/// - an error that is not the API's JSON (a 405, a path that does not decode, a body over the
///   cap) is made one: `{"error", "reason"}` — for every path under `/api/`, and every 405;
/// - every API response says `X-Content-Type-Options: nosniff` and `Cache-Control: no-store`.
pub async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let api = req.uri().path().starts_with("/api/");
    if st.open_project.is_some() {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !loopback_host(host) {
            return finish(
                api,
                ApiError::new(
                    StatusCode::MISDIRECTED_REQUEST,
                    "bad_host",
                    "this server opens its project without a key, so it answers only requests \
                     naming a loopback host (localhost, 127.0.0.1, [::1])",
                )
                .into_response(),
            )
            .await;
        }
    }
    if req.uri().query().is_some_and(query_has_control) {
        let e = ApiError::bad(
            "bad_query",
            "a query parameter holds a control character (a NUL, a newline, …)",
        );
        return if api {
            finish(api, e.into_response()).await
        } else {
            crate::web::WebError::BadRequest(e.reason).into_response()
        };
    }
    let r = match tokio::time::timeout(st.request_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the request took more than {} s (its body sent too slowly?)",
                st.request_timeout.as_secs()
            ),
        )
        .into_response(),
    };
    finish(api, r).await
}

/// The stable code of an error status that a handler did not answer itself.
fn code_of(status: StatusCode) -> &'static str {
    match status.as_u16() {
        404 => "no_route",
        405 => "method_not_allowed",
        408 => "request_timeout",
        411 => "length_required",
        413 => "too_large",
        415 => "unsupported_media_type",
        422 => "unprocessable",
        429 => "rate_limited",
        s if s >= 500 => "unavailable",
        _ => "bad_request",
    }
}

fn is_json(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// An error response made the API's JSON (see [`guard`]), the API's headers added.
async fn finish(api: bool, r: Response) -> Response {
    let status = r.status();
    let mut r = if (api || status == StatusCode::METHOD_NOT_ALLOWED)
        && (status.is_client_error() || status.is_server_error())
        && !is_json(r.headers())
    {
        let retry = r.headers().get(header::RETRY_AFTER).cloned();
        let allow = r.headers().get(header::ALLOW).cloned();
        let body = axum::body::to_bytes(r.into_body(), 4096)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body).trim().to_string();
        let reason = if text.is_empty() {
            status
                .canonical_reason()
                .unwrap_or("refused")
                .to_ascii_lowercase()
        } else {
            text
        };
        let mut e = ApiError::new(status, code_of(status), reason).into_response();
        for (h, v) in [(header::RETRY_AFTER, retry), (header::ALLOW, allow)] {
            if let Some(v) = v {
                e.headers_mut().insert(h, v);
            }
        }
        e
    } else {
        r
    };
    if api {
        let h = r.headers_mut();
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names() {
        for h in [
            "localhost",
            "localhost:8470",
            "127.0.0.1:8470",
            "127.1.2.3",
            "[::1]:8470",
            "LOCALHOST.",
            "app.localhost:1",
        ] {
            assert!(loopback_host(h), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:8470",
            "",
            "10.0.0.1:8470",
            "localhost.evil.example",
            "[::2]:1",
            "127.0.0.1.evil.example",
        ] {
            assert!(!loopback_host(h), "{h}");
        }
    }

    #[test]
    fn control_characters_in_queries() {
        assert!(query_has_control("a=%00"));
        assert!(query_has_control("q=a%0Ab"));
        assert!(!query_has_control("q=a%20b&file=%2Fx.py"));
    }
}
