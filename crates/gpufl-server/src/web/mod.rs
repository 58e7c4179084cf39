//! The dashboard: server-rendered HTML pages from compiled-in templates (askama, escaping every
//! value by default), charts as SVG made here, one stylesheet of ours, no script at all — the
//! Content-Security-Policy every page carries forbids scripts, so a kernel name such as
//! `<script>` can only ever be shown as text. Works air-gapped (nothing is loaded from elsewhere).
//!
//! Who may look ([`Viewer`], taken by every page as an extractor): the same read keys as the
//! API, sent as `Authorization: Bearer KEY` or, from a browser, through the login form, which
//! answers with an opaque login session in an `HttpOnly`, `SameSite=Strict` cookie (`Secure` when
//! served over TLS): a random id whose SHA-256 the database keeps beside the key it stands for, so
//! the cookie never holds the key and logging out ends the session on the server. The form's
//! POSTs (login, logout) are taken only from a page of this server (`Origin`, else `Referer`), and
//! the page to go back to (`next`) only if it is a path of this server that no URL parser could
//! read as another site. A server started with an open project (`gpufl serve --local` /
//! `--demo`, loopback only) shows that project without a key (to requests naming a loopback host:
//! [`crate::api`]'s guard). A key reaches its own project's pages only: another project's session
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
pub mod memory;
pub mod run;
pub mod session;
pub mod sessions;

use crate::auth::{self, KeyKind};
use crate::store::now_ns;
use crate::AppState;
use askama::Template;
use axum::extract::{Form, FromRequestParts, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use std::sync::Arc;

/// Name of the cookie holding a login session's id.
pub const COOKIE: &str = "gpufl_session";

/// How long a login session lasts, seconds.
pub const SESSION_SECS: i64 = 30 * 24 * 3600;

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
        .route("/runs/{run_id}", get(run::page))
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
        // Not `no-referrer`: with it a browser sends `Origin: null` on the form's own POSTs,
        // which [`same_origin`] must see; `same-origin` still sends nothing to other sites.
        HeaderValue::from_static("same-origin"),
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
    /// Too many requests: the reason and the seconds to wait (429 with `Retry-After`).
    RateLimited(String, u64),
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
            429 => WebError::RateLimited(e.reason, e.retry_after.unwrap_or(1)),
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
            WebError::RateLimited(r, _) => (
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests",
                r.as_str(),
            ),
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
        let mut r = match page.render() {
            Ok(body) => (status, Html(body)).into_response(),
            Err(_) => (status, reason.to_string()).into_response(),
        };
        if let WebError::RateLimited(_, secs) = &self {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*secs));
        }
        r
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

fn cookie_value(headers: &HeaderMap) -> Option<String> {
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

/// The viewer a read key stands for; None for a key that is not known (or revoked); an upload
/// key is refused.
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

/// The viewer a login session's cookie stands for (its key still valid), if any.
async fn cookie_viewer(st: &AppState, token: &str) -> Result<Option<Viewer>, WebError> {
    let hash = auth::sha256_hex(token.as_bytes());
    let Some((k, project_name)) = st.db.web_session(&hash, now_ns()).await? else {
        return Ok(None);
    };
    st.limiter.take(&k.id)?;
    Ok(Some(Viewer {
        project_id: k.project_id,
        project_name,
        open: false,
    }))
}

/// The viewer of a request: its bearer key, else its login session, else the open project; none
/// sends the browser to the login form and back to `path`. A key or login session that is not
/// known counts against the client's address ([`auth::failed`]).
pub async fn viewer(
    st: &AppState,
    headers: &HeaderMap,
    client: &str,
    path: &str,
) -> Result<Viewer, WebError> {
    let refused = || {
        WebError::from(auth::failed(
            st,
            client,
            crate::error::ApiError::new(StatusCode::UNAUTHORIZED, "unknown_key", "not known"),
        ))
    };
    if let Some(k) = auth::bearer(headers) {
        match key_viewer(st, &k).await? {
            Some(v) => return Ok(v),
            None => {
                if let e @ WebError::RateLimited(..) = refused() {
                    return Err(e);
                }
            }
        }
    } else if let Some(t) = cookie_value(headers) {
        match cookie_viewer(st, &t).await? {
            Some(v) => return Ok(v),
            None => {
                if let e @ WebError::RateLimited(..) = refused() {
                    return Err(e);
                }
            }
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
        let client = auth::client_key(parts);
        viewer(st, &parts.headers, &client, &parts.uri.to_string()).await
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

/// A path of this server to go back to after logging in; anything else is `/sessions`. Taken
/// only of printable ASCII without `\\` (a browser removes tabs and newlines from a URL and reads
/// `\\` as `/`: `/\t/evil.example` would be `//evil.example`, another site), starting with one
/// `/` only.
pub fn safe_next(n: Option<&str>) -> String {
    match n {
        Some(p)
            if p.starts_with('/')
                && !p.starts_with("//")
                && p.bytes().all(|b| (0x21..0x7f).contains(&b) && b != b'\\') =>
        {
            p.into()
        }
        _ => "/sessions".into(),
    }
}

/// Whether a POST comes from a page of this server: its `Origin` (else its `Referer`'s origin)
/// is `http(s)://` and the request's own `Host`.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let origin = match headers.get(header::ORIGIN) {
        Some(o) => o.to_str().unwrap_or("").to_string(),
        None => match headers
            .get(header::REFERER)
            .and_then(|r| r.to_str().ok())
            .and_then(|r| url::Url::parse(r).ok())
        {
            Some(u) => u.origin().ascii_serialization(),
            None => return false,
        },
    };
    origin == format!("http://{host}") || origin == format!("https://{host}")
}

/// Whether the browser reached this server over TLS (directly, or through a proxy that says so).
fn over_tls(headers: &HeaderMap) -> bool {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    h("x-forwarded-proto") == "https" || h("origin").starts_with("https://")
}

fn cross_site() -> WebError {
    WebError::Forbidden(
        "this form is taken only from a page of this server (the request's Origin is another site, or missing)".into(),
    )
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

async fn login(
    State(st): State<Arc<AppState>>,
    parts: axum::http::request::Parts,
    Form(f): Form<LoginForm>,
) -> Response {
    if !same_origin(&parts.headers) {
        return cross_site().into_response();
    }
    let key = f.key.trim();
    let next = safe_next(f.next.as_deref());
    let client = auth::client_key(&parts);
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
    let limited = |why: &str| -> Option<Response> {
        let e = auth::failed(
            &st,
            &client,
            crate::error::ApiError::new(StatusCode::UNAUTHORIZED, "unknown_key", why),
        );
        (e.status == StatusCode::TOO_MANY_REQUESTS).then(|| WebError::from(e).into_response())
    };
    match key_viewer(&st, key).await {
        Ok(Some(_)) => {
            let token = auth::random_hex(32);
            let now = now_ns();
            let Ok(Some(k)) = st.db.live_key(&auth::sha256_hex(key.as_bytes())).await else {
                return WebError::Internal("the database did not answer".into()).into_response();
            };
            if let Err(e) = st
                .db
                .insert_web_session(
                    &auth::sha256_hex(token.as_bytes()),
                    &k.id,
                    now,
                    now + SESSION_SECS * 1_000_000_000,
                )
                .await
            {
                return WebError::from(e).into_response();
            }
            let mut r = Redirect::to(&next).into_response();
            let secure = if over_tls(&parts.headers) {
                "; Secure"
            } else {
                ""
            };
            if let Ok(v) = HeaderValue::from_str(&format!(
                "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_SECS}{secure}"
            )) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Ok(None) => limited("unknown key").unwrap_or_else(|| {
            refused("this key is not known to the server, or it was revoked".into())
        }),
        Err(WebError::Forbidden(why)) => limited(&why).unwrap_or_else(|| refused(why)),
        Err(e) => e.into_response(),
    }
}

/// Log out: the login session ends on the server too (its cookie no longer opens anything).
async fn logout(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !same_origin(&headers) {
        return cross_site().into_response();
    }
    if let Some(t) = cookie_value(&headers) {
        if let Err(e) = st
            .db
            .delete_web_session(&auth::sha256_hex(t.as_bytes()))
            .await
        {
            return WebError::from(e).into_response();
        }
    }
    let mut r = Redirect::to("/login").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("gpufl_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    r
}
