//! # gpufl-server
//!
//! `gpufl serve`: a team's sessions, uploaded with API keys, stored and analysed, answered as
//! JSON (`/api/v1`, docs/server-api.md) and as the dashboard's pages. Kept apart: [`api`] (HTTP:
//! upload and read endpoints) and [`web`] (the dashboard), both taking their caller from [`auth`]'s
//! extractors; [`ingest`] (the background analysis, independent of HTTP); [`store`] (every SQL
//! statement: SQLite embedded, PostgreSQL for scale, and the migrations) and [`blobs`] (raw files:
//! a local directory, or S3). The upload's wire types are `gpufl-protocol`'s, shared with the
//! client. Several instances on one PostgreSQL and one bucket share the work.

pub mod api;
pub mod auth;
pub mod blobs;
pub mod bounds;
pub mod error;
pub mod housekeeping;
pub mod ingest;
pub mod linedoc;
pub mod net;
pub mod runs;
pub mod store;
pub mod web;

pub use error::{ApiError, ServerError};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Notify;

/// Limits on what clients may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of one session (all its files).
    pub max_session_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_session_bytes: 16 << 30,
        }
    }
}

/// Where the server keeps things and how it answers.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: String,
    /// The embedded default's home: `gpufl.db` and `store/` (and temporary files).
    pub data: PathBuf,
    /// `sqlite://…` or `postgres://…`; default: `sqlite://DATA/gpufl.db`.
    pub db: Option<String>,
    /// `s3://bucket/prefix`, `file:///dir` or a directory; default: `DATA/store`.
    pub store: Option<String>,
    pub limits: Limits,
    /// Requests a second per key (bursts of twice that); 0: unlimited.
    pub rate_per_key: f64,
    /// Requests a second per client address that carry no key, an unknown or revoked key, or a
    /// wrong login (bursts of five times that); 0: unlimited.
    pub rate_per_address: f64,
    /// Connections: cap and timeouts.
    pub net: net::NetLimits,
    /// Concurrent ingest jobs in this instance (0: none, an API-only instance).
    pub ingest_workers: usize,
    /// Threads of one analysis.
    pub analysis_threads: usize,
    /// Memory the ingest workers may use together, MiB (each worker's analysis gets its share:
    /// docs/server-api.md, "Limits").
    pub ingest_memory_mb: u64,
    /// How often an idle ingest worker looks for work uploaded to other instances, ms.
    pub poll_ms: u64,
    /// The first wait before analysing again a session whose analysis met an error the server
    /// survived, ms (doubled at each further error: [`ingest::backoff_ns`]).
    pub ingest_retry_ms: u64,
    /// What housekeeping removes, and how often it runs.
    pub housekeeping: housekeeping::Housekeeping,
    /// A project shown without a key (dashboard and read API), created when missing: `gpufl
    /// serve --local` / `--demo`. Only for a loopback address (the CLI checks).
    pub open_project: Option<String>,
}

/// Default of [`ServeConfig::ingest_memory_mb`]: 2 GiB for all ingest workers together.
pub const DEFAULT_INGEST_MEMORY_MB: u64 = 2048;

impl ServeConfig {
    /// The memory one worker's analysis of one session may use.
    pub fn ingest_budget(&self) -> bounds::Budget {
        bounds::Budget {
            bytes: (self.ingest_memory_mb.max(16) << 20) / self.ingest_workers.max(1) as u64,
        }
    }

    pub fn new(data: PathBuf) -> Self {
        ServeConfig {
            listen: "127.0.0.1:8470".into(),
            data,
            db: None,
            store: None,
            limits: Limits::default(),
            rate_per_key: 200.0,
            rate_per_address: 10.0,
            net: net::NetLimits::default(),
            ingest_workers: 2,
            analysis_threads: 2,
            ingest_memory_mb: DEFAULT_INGEST_MEMORY_MB,
            poll_ms: 1000,
            ingest_retry_ms: 10_000,
            housekeeping: housekeeping::Housekeeping::default(),
            open_project: None,
        }
    }

    pub fn db_url(&self) -> String {
        self.db.clone().unwrap_or_else(|| {
            format!("sqlite://{}?mode=rwc", self.data.join("gpufl.db").display())
        })
    }

    pub fn store_url(&self) -> String {
        self.store
            .clone()
            .unwrap_or_else(|| self.data.join("store").display().to_string())
    }
}

/// What every request and job shares.
pub struct AppState {
    pub db: store::Db,
    pub blobs: blobs::Blobs,
    pub limits: Limits,
    pub limiter: auth::RateLimiter,
    /// Failed authentications per client address.
    pub fail_limiter: auth::RateLimiter,
    /// A whole request's time, at most.
    pub request_timeout: std::time::Duration,
    pub ingest_wake: Notify,
    /// This instance's name in claims (`host:pid:random`).
    pub instance: String,
    pub tmp_dir: PathBuf,
    pub analysis_threads: usize,
    /// What one worker's analysis of one session may use.
    pub ingest_budget: bounds::Budget,
    pub poll_ms: u64,
    pub ingest_retry_ms: u64,
    pub housekeeping: housekeeping::Housekeeping,
    /// The project opened without a key: (id, name).
    pub open_project: Option<(String, String)>,
    /// Completions hashing stored files at once, server-wide.
    pub hashing: tokio::sync::Semaphore,
}

/// Open the database (migrating it) and the store.
pub async fn open(cfg: &ServeConfig) -> Result<Arc<AppState>, ServerError> {
    std::fs::create_dir_all(&cfg.data)
        .map_err(|e| ServerError::io(format!("creating {}", cfg.data.display()), e))?;
    let db = store::Db::open(&cfg.db_url()).await?;
    let blobs = blobs::Blobs::open(&cfg.store_url())?;
    let tmp_dir = cfg.data.join("tmp");
    std::fs::create_dir_all(&tmp_dir)
        .map_err(|e| ServerError::io(format!("creating {}", tmp_dir.display()), e))?;
    let open_project = match &cfg.open_project {
        Some(name) => {
            let id = match auth::project_id(&db, name).await {
                Ok(id) => id,
                Err(_) => auth::create_project(&db, name).await?.0,
            };
            Some((id, name.clone()))
        }
        None => None,
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    Ok(Arc::new(AppState {
        db,
        blobs,
        limits: cfg.limits,
        limiter: auth::RateLimiter::new(cfg.rate_per_key, cfg.rate_per_key * 2.0),
        fail_limiter: auth::RateLimiter::new(cfg.rate_per_address, cfg.rate_per_address * 5.0),
        request_timeout: std::time::Duration::from_millis(cfg.net.request_timeout_ms.max(1)),
        ingest_wake: Notify::new(),
        instance: format!("{host}:{}:{}", std::process::id(), auth::random_hex(4)),
        tmp_dir,
        analysis_threads: cfg.analysis_threads.max(1),
        ingest_budget: cfg.ingest_budget(),
        poll_ms: cfg.poll_ms.max(10),
        ingest_retry_ms: cfg.ingest_retry_ms,
        housekeeping: cfg.housekeeping,
        open_project,
        hashing: tokio::sync::Semaphore::new(2),
    }))
}

/// Serve until ctrl-c / SIGTERM. Prints the address it listens on (port 0 picks one).
pub async fn serve(cfg: ServeConfig) -> Result<(), ServerError> {
    serve_with(cfg, |_| {}).await
}

/// [`serve`], calling `ready` with the address once the server listens (before it answers).
pub async fn serve_with(
    cfg: ServeConfig,
    ready: impl FnOnce(SocketAddr) + Send + 'static,
) -> Result<(), ServerError> {
    let st = open(&cfg).await?;
    let requeued = ingest::requeue_old(&st.db).await?;
    let orphans = ingest::requeue_dead_local(&st.db, &st.instance).await?;
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| ServerError::io(format!("listening on {}", cfg.listen), e))?;
    let addr: SocketAddr = listener
        .local_addr()
        .map_err(|e| ServerError::io("local address", e))?;
    eprintln!(
        "gpufl serve: listening on http://{addr} (database {}, store {}, {} ingest worker(s), {} MiB each, {} connections at most{})",
        redact(&cfg.db_url()),
        st.blobs.describe,
        cfg.ingest_workers,
        st.ingest_budget.bytes >> 20,
        net::effective_cap(&cfg.net),
        if requeued + orphans > 0 {
            format!(
                ", {requeued} session(s) to analyse again, {orphans} left by a stopped instance"
            )
        } else {
            String::new()
        }
    );
    if let Some((_, name)) = &st.open_project {
        eprintln!(
            "gpufl serve: project {name:?} is open without a key: dashboard at http://{addr}/sessions"
        );
    }
    for _ in 0..cfg.ingest_workers {
        tokio::spawn(ingest::worker(st.clone()));
    }
    tokio::spawn(housekeeping::task(st.clone()));
    ready(addr);
    let app = api::router(st);
    net::serve(listener, app, cfg.net, shutdown_signal()).await
}

/// A database URL without its password.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let cred = &url[s + 3..at];
            let user = cred.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// A runtime for the CLI's blocking entry points.
pub fn runtime() -> Result<tokio::runtime::Runtime, ServerError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ServerError::io("starting the async runtime", e))
}
