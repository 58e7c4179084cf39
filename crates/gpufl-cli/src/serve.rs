//! `gpufl serve` and `gpufl admin`: the team server (crates/gpufl-server) and its projects and keys.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use gpufl_server::auth::{self, KeyKind};
use gpufl_server::ServeConfig;
use std::path::PathBuf;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8470")]
    listen: String,
    /// Home of the embedded default: the SQLite database and the raw files.
    #[arg(long, default_value = "./gpufl-data", env = "GPUFL_DATA")]
    data: PathBuf,
    /// Database: sqlite://PATH or postgres://USER:PASSWORD@HOST/DB (default: DATA/gpufl.db).
    #[arg(long, env = "GPUFL_DB")]
    db: Option<String>,
    /// Raw files: s3://BUCKET/PREFIX (endpoint and credentials from AWS_*), or a directory
    /// (default: DATA/store).
    #[arg(long, env = "GPUFL_STORE")]
    store: Option<String>,
    /// Concurrent ingest jobs in this instance (0: serve the API only).
    #[arg(long, default_value_t = 2)]
    ingest_workers: usize,
    /// Requests a second per key (0: unlimited).
    #[arg(long, default_value_t = 200.0)]
    rate_limit: f64,
    /// Requests a second per client address without a valid key (no key, an unknown or revoked
    /// one, a wrong login; 0: unlimited).
    #[arg(long, default_value_t = 10.0)]
    rate_limit_address: f64,
    /// Open connections at most (also at most the open-file limit less 128); beyond it a
    /// connection is answered 503 at once.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Seconds a client has to send a request's headers, and a kept-alive connection waits for
    /// its next request.
    #[arg(long, default_value_t = 10)]
    header_timeout_s: u64,
    /// Seconds a whole request (its body read, its answer made) may take.
    #[arg(long, default_value_t = 120)]
    request_timeout_s: u64,
    /// Largest session accepted, MiB.
    #[arg(long, default_value_t = 16384)]
    max_session_mb: u64,
    /// Memory the ingest workers may use together, MiB: each worker analyses one session within
    /// its share; a session that needs more is stored "too_large" with the reason.
    #[arg(long, default_value_t = gpufl_server::DEFAULT_INGEST_MEMORY_MB)]
    ingest_memory_mb: u64,
    /// Open the dashboard and the read API without a key, on project "local" (loopback
    /// addresses only), and load the sessions under each DIR into it (already stored ones are
    /// not sent again).
    #[arg(long, num_args = 0.., value_name = "DIR")]
    local: Option<Vec<PathBuf>>,
    /// `--local` on the bundled sessions (testdata/sessions) in a temporary data directory,
    /// project "demo".
    #[arg(long, conflicts_with = "local")]
    demo: bool,
}

/// Whether `listen` (`HOST:PORT`) names a loopback address.
fn loopback(listen: &str) -> bool {
    let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The bundled sessions: `testdata/sessions` here, else in the source tree this was built from.
fn bundled_sessions() -> Result<PathBuf> {
    let here = PathBuf::from("testdata/sessions");
    if here.is_dir() {
        return Ok(here);
    }
    let built = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/sessions"
    ));
    if built.is_dir() {
        return Ok(built);
    }
    anyhow::bail!("--demo: the bundled sessions (testdata/sessions) are not here; run it from the gpufl repository")
}

/// Send the sessions under `dirs` to the server at `addr` with a key made for it (revoked after).
fn import(addr: std::net::SocketAddr, key: auth::NewKey, dirs: Vec<PathBuf>, cfg: ServeConfig) {
    let url = format!("http://{addr}");
    let sessions = match gpufl_upload::find_sessions(&dirs) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpufl serve: --local: {e}");
            Vec::new()
        }
    };
    let opts = gpufl_upload::UploadOptions::new(url, key.secret.clone());
    let (mut ok, mut failed) = (0, 0);
    match gpufl_upload::Uploader::new(&opts) {
        Ok(up) => {
            for dir in &sessions {
                match up.upload(dir, &mut |_| {}) {
                    Ok(_) => ok += 1,
                    Err(e) => {
                        failed += 1;
                        eprintln!("gpufl serve: --local: {}: {e}", dir.display());
                    }
                }
            }
        }
        Err(e) => eprintln!("gpufl serve: --local: {e}"),
    }
    eprintln!(
        "gpufl serve: {ok} local session(s) loaded{}",
        if failed > 0 {
            format!(", {failed} failed")
        } else {
            String::new()
        }
    );
    if let Ok(rt) = gpufl_server::runtime() {
        let _ = rt.block_on(async {
            let db = gpufl_server::store::Db::open(&cfg.db_url()).await?;
            auth::revoke_key(&db, &key.id).await?;
            Ok::<_, gpufl_server::ServerError>(())
        });
    }
}

#[derive(Args)]
pub struct AdminArgs {
    #[command(subcommand)]
    cmd: AdminCmd,
    /// Home of the embedded default (as for `gpufl serve`).
    #[arg(
        long,
        global = true,
        default_value = "./gpufl-data",
        env = "GPUFL_DATA"
    )]
    data: PathBuf,
    /// Database URL (as for `gpufl serve`).
    #[arg(long, global = true, env = "GPUFL_DB")]
    db: Option<String>,
}

#[derive(Subcommand)]
enum AdminCmd {
    /// Create a project; prints its upload key and its read key, once.
    CreateProject { name: String },
    /// Add a key to a project; prints it, once.
    CreateKey {
        project: String,
        #[arg(long, value_parser = ["upload", "read"], default_value = "upload")]
        kind: String,
    },
    /// Revoke a key by its id (printed beside it; `list-keys` shows them).
    RevokeKey { key_id: String },
    /// A project's keys: id, kind, created, revoked.
    ListKeys { project: String },
}

pub fn serve(a: ServeArgs) -> Result<i32> {
    let mut cfg = ServeConfig::new(a.data);
    cfg.listen = a.listen;
    cfg.db = a.db;
    cfg.store = a.store;
    cfg.ingest_workers = a.ingest_workers;
    cfg.ingest_memory_mb = a.ingest_memory_mb;
    cfg.rate_per_key = a.rate_limit;
    cfg.rate_per_address = a.rate_limit_address;
    cfg.net = gpufl_server::net::NetLimits {
        max_connections: a.max_connections,
        header_timeout_ms: a.header_timeout_s.saturating_mul(1000),
        request_timeout_ms: a.request_timeout_s.saturating_mul(1000),
    };
    cfg.limits.max_session_bytes = a.max_session_mb.saturating_mul(1 << 20);
    let rt = gpufl_server::runtime()?;
    let dirs = if a.demo {
        cfg.data = std::env::temp_dir().join(format!("gpufl-demo-{}", std::process::id()));
        cfg.db = None;
        cfg.store = None;
        cfg.open_project = Some("demo".into());
        vec![bundled_sessions()?]
    } else if let Some(d) = a.local {
        cfg.open_project = Some("local".into());
        d
    } else {
        Vec::new()
    };
    if cfg.open_project.is_some() && !loopback(&cfg.listen) {
        anyhow::bail!(
            "--local/--demo open the sessions without a key: listen on a loopback address (127.0.0.1:PORT), not {}",
            cfg.listen
        );
    }
    let Some(project) = cfg.open_project.clone() else {
        rt.block_on(gpufl_server::serve(cfg))
            .context("gpufl serve")?;
        return Ok(0);
    };
    // The open project and a key to load the local sessions into it, before serving.
    let key = rt.block_on(async {
        let st = gpufl_server::open(&cfg).await?;
        if auth::project_id(&st.db, &project).await.is_err() {
            auth::create_project(&st.db, &project).await?;
        }
        auth::create_key(&st.db, &project, KeyKind::Upload).await
    })?;
    let for_import = cfg.clone();
    let demo_dir = a.demo.then(|| cfg.data.clone());
    let res = rt.block_on(gpufl_server::serve_with(cfg, move |addr| {
        if dirs.is_empty() {
            return;
        }
        std::thread::spawn(move || import(addr, key, dirs, for_import));
    }));
    if let Some(d) = demo_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    res.context("gpufl serve")?;
    Ok(0)
}

pub fn admin(a: AdminArgs) -> Result<i32> {
    let mut cfg = ServeConfig::new(a.data);
    cfg.db = a.db;
    let rt = gpufl_server::runtime()?;
    rt.block_on(async move {
        std::fs::create_dir_all(&cfg.data)
            .with_context(|| format!("creating {}", cfg.data.display()))?;
        let db = gpufl_server::store::Db::open(&cfg.db_url()).await?;
        match a.cmd {
            AdminCmd::CreateProject { name } => {
                let (id, keys) = auth::create_project(&db, &name).await?;
                println!("project {} ({id})", crate::term::esc(&name));
                for k in keys {
                    println!("{} key {}  (id {})", k.kind.as_str(), k.secret, k.id);
                }
                eprintln!("gpufl: the keys are shown once; the server keeps only their hashes");
            }
            AdminCmd::CreateKey { project, kind } => {
                let kind = KeyKind::parse(&kind).unwrap_or(KeyKind::Upload);
                let k = auth::create_key(&db, &project, kind).await?;
                println!("{} key {}  (id {})", k.kind.as_str(), k.secret, k.id);
            }
            AdminCmd::RevokeKey { key_id } => {
                auth::revoke_key(&db, &key_id).await?;
                println!("revoked {}", crate::term::esc(&key_id));
            }
            AdminCmd::ListKeys { project } => {
                for (id, kind, created, revoked) in auth::list_keys(&db, &project).await? {
                    println!(
                        "{id}  {kind:6}  created {}  {}",
                        created / 1_000_000_000,
                        if revoked > 0 { "revoked" } else { "active" }
                    );
                }
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(0)
}
