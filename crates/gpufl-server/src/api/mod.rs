//! HTTP: the router of `/api/v1`.

pub mod read;
pub mod upload;

use crate::error::ApiError;
use crate::AppState;
use axum::http::StatusCode;
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
        .with_state(st)
}
