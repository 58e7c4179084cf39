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
    /// Largest session accepted, MiB.
    #[arg(long, default_value_t = 16384)]
    max_session_mb: u64,
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
    cfg.rate_per_key = a.rate_limit;
    cfg.limits.max_session_bytes = a.max_session_mb.saturating_mul(1 << 20);
    let rt = gpufl_server::runtime()?;
    rt.block_on(gpufl_server::serve(cfg))
        .context("gpufl serve")?;
    Ok(0)
}

pub fn admin(a: AdminArgs) -> Result<i32> {
    let mut cfg = ServeConfig::new(a.data);
    cfg.db = a.db;
    let rt = gpufl_server::runtime()?;
    rt.block_on(async move {
        std::fs::create_dir_all(&cfg.data)
            .with_context(|| format!("creating {}", cfg.data.display()))?;
        let db = gpufl_server::db::Db::open(&cfg.db_url()).await?;
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
