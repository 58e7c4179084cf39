//! The kernel page (a helper fills this in).

use super::{viewer, WebError};
use crate::AppState;
use axum::extract::State;
use axum::http::Uri;
use axum::http::HeaderMap;
use axum::response::Response;
use std::sync::Arc;

pub async fn page(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, WebError> {
    let _v = viewer(&st, &headers, &uri.to_string()).await?;
    Err(WebError::NotFound("not built yet".into()))
}
