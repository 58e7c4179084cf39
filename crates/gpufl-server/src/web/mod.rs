//! The dashboard: server-rendered HTML pages from compiled-in templates (askama, escaping every
//! value by default), charts as SVG made here, one stylesheet of ours, no script at all — the
//! Content-Security-Policy every page carries forbids scripts, so a kernel name such as
//! `<script>` can only ever be shown as text. Works air-gapped (nothing is loaded from elsewhere).
//!
//! Who may look ([`Viewer`], taken by every page as an extractor): the same read keys as the API, sent as `Authorization: Bearer KEY` or, from a
//! browser, kept in an `HttpOnly`, `SameSite=Strict` cookie set by the login form. A server
//! started with an open project (`gpufl serve --local` / `--demo`, loopback only) shows that
//! project without a key. A key reaches its own project's pages only: another project's session
//! is "not found", exactly like a missing one.
//!
//! Pages (docs/dashboard.md): the sessions list (`/sessions`), a session (`/sessions/{id}`) with
//! its Insights panel, a line's detail (`/sessions/{id}/line?file=&line=`), a kernel's detail
//! (`/sessions/{id}/kernel?name=&device=`) and the comparison of two sessions (`/compare?a=&b=`).

pub mod cards;
pub mod charts;
pub mod compare;
pub mod data;
pub mod fmt;
pub mod hostview;
pub mod kernel;
pub mod line;
pub mod session;
pub mod sessions;

use crate::auth::{self, KeyKind};
use crate::AppState;
use askama::Template;
use axum::extract::{Form, FromRequestParts, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use std::sync::Arc;

/// Name of the cookie holding a read key.
pub const COOKIE: &str = "gpufl_key";

/// The policy of every dashboard response: nothing but our own stylesheet and inline SVG; no
/// script from anywhere, no form posting elsewhere, no framing.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The dashboard's routes (merged into the server's router).
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/sessions") }))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/static/gpufl.css", get(css))
        .route("/sessions", get(sessions::page))
        .route("/sessions/{id}", get(session::page))
        .route("/sessions/{id}/line", get(line::page))
        .route("/sessions/{id}/kernel", get(kernel::page))
        .route("/compare", get(compare::page))
        .layer(axum::middleware::map_response(secure_headers))
        .layer(axum::middleware::from_fn(timing))
}

/// `Server-Timing: app;dur=MS`: the time from the request to the rendered page (queries and
/// rendering; the body is a finished string by then) — what bench/dashboard_render.sh reads.
async fn timing(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let t = std::time::Instant::now();
    let mut r = next.run(req).await;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if let Ok(v) = HeaderValue::from_str(&format!("app;dur={ms:.2}")) {
        r.headers_mut().insert("server-timing", v);
    }
    r
}

async fn secure_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    r
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        include_str!("../../static/gpufl.css"),
    )
}

/// Who is looking: a project, by a read key or because the server opens it.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub project_id: String,
    pub project_name: String,
    /// Opened without a key (`--local` / `--demo`): no logout button.
    pub open: bool,
}

/// What every page's frame shows.
pub struct Nav {
    pub project: String,
    pub open: bool,
}

impl Viewer {
    pub fn nav(&self) -> Nav {
        Nav {
            project: self.project_name.clone(),
            open: self.open,
        }
    }
}

/// A page that could not be shown: rendered as an HTML page with the status.
#[derive(Debug)]
pub enum WebError {
    /// No such page / session / line / kernel in the viewer's project.
    NotFound(String),
    BadRequest(String),
    Forbidden(String),
    /// No key: to the login form, then back to this path.
    Login(String),
    Internal(String),
}

impl From<sqlx::Error> for WebError {
    fn from(e: sqlx::Error) -> Self {
        eprintln!("gpufl serve: dashboard: database: {e}");
        WebError::Internal("the database did not answer".into())
    }
}

impl From<crate::error::ApiError> for WebError {
    fn from(e: crate::error::ApiError) -> Self {
        match e.status.as_u16() {
            401 => WebError::Login(String::new()),
            403 => WebError::Forbidden(e.reason),
            404 => WebError::NotFound(e.reason),
            429 => WebError::Forbidden(format!("too many requests: {}", e.reason)),
            s if s < 500 => WebError::BadRequest(e.reason),
            _ => WebError::Internal(e.reason),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    title: &'a str,
    status: u16,
    reason: &'a str,
    nav: Option<Nav>,
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let (status, title, reason) = match &self {
            WebError::Login(next) => {
                let to = if next.is_empty() {
                    "/login".to_string()
                } else {
                    format!("/login?next={}", url_encode(next))
                };
                return Redirect::to(&to).into_response();
            }
            WebError::NotFound(r) => (StatusCode::NOT_FOUND, "Not found", r.as_str()),
            WebError::BadRequest(r) => (StatusCode::BAD_REQUEST, "Bad request", r.as_str()),
            WebError::Forbidden(r) => (StatusCode::FORBIDDEN, "Forbidden", r.as_str()),
            WebError::Internal(r) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Server error",
                r.as_str(),
            ),
        };
        let page = ErrorPage {
            title,
            status: status.as_u16(),
            reason,
            nav: None,
        };
        match page.render() {
            Ok(body) => (status, Html(body)).into_response(),
            Err(_) => (status, reason.to_string()).into_response(),
        }
    }
}

/// Render a page template.
pub fn render(t: &impl Template) -> Result<Response, WebError> {
    t.render()
        .map(|b| Html(b).into_response())
        .map_err(|e| WebError::Internal(format!("rendering: {e}")))
}

/// Percent-encode a query value or path segment (everything but unreserved characters).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn cookie_key(headers: &HeaderMap) -> Option<String> {
    for v in headers.get_all(header::COOKIE) {
        let Ok(s) = v.to_str() else { continue };
        for part in s.split(';') {
            if let Some((k, val)) = part.trim().split_once('=') {
                if k == COOKIE && !val.is_empty() {
                    return Some(val.to_string());
                }
            }
        }
    }
    None
}

async fn key_viewer(st: &AppState, key: &str) -> Result<Option<Viewer>, WebError> {
    let hash = auth::sha256_hex(key.as_bytes());
    let Some((k, project_name)) = st.db.live_key_with_project(&hash).await? else {
        return Ok(None);
    };
    if KeyKind::parse(&k.kind) != Some(KeyKind::Read) {
        return Err(WebError::Forbidden(
            "this is an upload key; the dashboard takes a project's read key (gfl_rd_…)".into(),
        ));
    }
    st.limiter.take(&k.id)?;
    Ok(Some(Viewer {
        project_id: k.project_id,
        project_name,
        open: false,
    }))
}

/// The viewer of a request: its bearer key, else its cookie's key, else the open project; none
/// sends the browser to the login form and back to `path`.
pub async fn viewer(st: &AppState, headers: &HeaderMap, path: &str) -> Result<Viewer, WebError> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|s| s.trim().to_string());
    if let Some(k) = bearer.or_else(|| cookie_key(headers)) {
        if let Some(v) = key_viewer(st, &k).await? {
            return Ok(v);
        }
    }
    if let Some((id, name)) = &st.open_project {
        return Ok(Viewer {
            project_id: id.clone(),
            project_name: name.clone(),
            open: true,
        });
    }
    Err(WebError::Login(path.to_string()))
}

/// A page's viewer, as [`viewer`] finds it for the request's path (and query).
impl FromRequestParts<Arc<AppState>> for Viewer {
    type Rejection = WebError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        st: &Arc<AppState>,
    ) -> Result<Self, WebError> {
        viewer(st, &parts.headers, &parts.uri.to_string()).await
    }
}

#[derive(Deserialize, Default)]
pub struct LoginQuery {
    next: Option<String>,
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    title: &'static str,
    nav: Option<Nav>,
    next: String,
    error: String,
}

/// A local path to go back to after logging in (never another site: `//host` and `\` refused).
fn safe_next(n: Option<&str>) -> String {
    match n {
        Some(p) if p.starts_with('/') && !p.starts_with("//") && !p.contains('\\') => p.into(),
        _ => "/sessions".into(),
    }
}

async fn login_page(q: Query<LoginQuery>) -> Result<Response, WebError> {
    render(&LoginPage {
        title: "Log in",
        nav: None,
        next: safe_next(q.next.as_deref()),
        error: String::new(),
    })
}

#[derive(Deserialize)]
pub struct LoginForm {
    key: String,
    next: Option<String>,
}

async fn login(State(st): State<Arc<AppState>>, Form(f): Form<LoginForm>) -> Response {
    let key = f.key.trim();
    let next = safe_next(f.next.as_deref());
    let refused = |error: String| {
        let mut r = render(&LoginPage {
            title: "Log in",
            nav: None,
            next: next.clone(),
            error,
        })
        .into_response();
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        r
    };
    match key_viewer(&st, key).await {
        Ok(Some(_)) => {
            let mut r = Redirect::to(&next).into_response();
            // The key is 7 + 32 characters of [a-z0-9_]: nothing to escape in the cookie.
            if key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                if let Ok(v) = HeaderValue::from_str(&format!(
                    "{COOKIE}={key}; Path=/; HttpOnly; SameSite=Strict; Max-Age=2592000"
                )) {
                    r.headers_mut().insert(header::SET_COOKIE, v);
                }
            }
            r
        }
        Ok(None) => refused("this key is not known to the server, or it was revoked".into()),
        Err(WebError::Forbidden(why)) => refused(why),
        Err(e) => e.into_response(),
    }
}

async fn logout() -> Response {
    let mut r = Redirect::to("/login").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("gpufl_key=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    r
}
