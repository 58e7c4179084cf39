//! The store's queries of the dashboard's sessions list as SQLite runs them, and PostgreSQL where
//! `GPUFL_TEST_PG_URL` names one (`scripts/services.sh`); the rows are written with plain SQL, the
//! reads go through the store (`Db::sessions_page`) with filters parsed as the page parses them.

use axum::extract::Query;
use axum::http::Uri;
use gpufl_server::store::Db;
use gpufl_server::web::sessions::{Filters, SessionsQuery};
use gpufl_server::web::url_encode;

/// What axum's `Query` makes of `pairs` as a query string.
fn query(pairs: &[(&str, &str)]) -> SessionsQuery {
    let s: String = pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", url_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let uri: Uri = format!("/sessions?{s}").parse().unwrap();
    Query::<SessionsQuery>::try_from_uri(&uri).unwrap().0
}

/// The SQL as SQLite runs it (and PostgreSQL, where `GPUFL_TEST_PG_URL` names one:
/// `scripts/services.sh`): search with wildcards in the text, filters, sort, paging.
#[tokio::test]
async fn the_queries_run_on_sqlite_and_postgres() {
    let dir = tempfile::tempdir().unwrap();
    queries_on(&format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("t.db").display()
    ))
    .await;
    if let Ok(base) = std::env::var("GPUFL_TEST_PG_URL") {
        let name = format!("gpufl_t_sessions_{}", std::process::id());
        let out = std::process::Command::new("psql")
            .arg(&base)
            .args(["-qc", &format!("CREATE DATABASE {name}")])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let at = base.rfind('/').unwrap();
        queries_on(&format!("{}/{name}", &base[..at])).await;
    }
}

async fn queries_on(url: &str) {
    let db = Db::open(url).await.unwrap();
    for p in ["p", "other"] {
        sqlx::query("INSERT INTO projects (id, name, created_ns) VALUES ($1, $1, 0)")
            .bind(p)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let sessions = [
        (
            "p",
            "s1",
            "Train",
            "python train.py --lr 50%",
            "In-loop sync",
            3,
            10,
        ),
        (
            "p",
            "s2",
            "train",
            "python train.py --lr 5",
            "Blocking copy",
            2,
            20,
        ),
        ("p", "s3", "eval_x", "python eval.py", "GPU idle", 1, 30),
        ("p", "s4", "evalXx", "python eval.py", "", 0, 40),
        (
            "other",
            "s5",
            "train",
            "python train.py",
            "In-loop sync",
            3,
            50,
        ),
    ];
    for (p, id, app, cmd, top, sev, start) in sessions {
        sqlx::query(
            "INSERT INTO sessions (project_id, id, state, created_ns, app, host, command, \
             top_insight, top_severity, start_ns, ingest_state) \
             VALUES ($1, $2, 'complete', 0, $3, 'h', $4, $5, $6, $7, 'ready')",
        )
        .bind(p)
        .bind(id)
        .bind(app)
        .bind(cmd)
        .bind(top)
        .bind(sev as i64)
        .bind(start as i64)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let ids = |pairs: &'static [(&'static str, &'static str)]| {
        let db = db.clone();
        async move {
            let f = Filters::parse(&query(pairs)).unwrap();
            db.sessions_page("p", &f)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(ids(&[]).await, ["s4", "s3", "s2", "s1"]);
    // Case-insensitive, in the command and the top insight too; another project's never.
    assert_eq!(ids(&[("q", "TRAIN")]).await, ["s2", "s1"]);
    assert_eq!(ids(&[("q", "in-loop")]).await, ["s1"]);
    // `%` and `_` are text, not wildcards.
    assert_eq!(ids(&[("q", "50%")]).await, ["s1"]);
    assert_eq!(ids(&[("q", "5%")]).await, Vec::<String>::new());
    assert_eq!(ids(&[("q", "eval_")]).await, ["s3"]);
    assert_eq!(
        ids(&[("q", "'; DROP TABLE sessions; --")]).await,
        Vec::<String>::new()
    );
    assert_eq!(ids(&[("severity", "MEDIUM")]).await, ["s2", "s1"]);
    assert_eq!(ids(&[("app", "train")]).await, ["s2"]);
    assert_eq!(
        ids(&[("sort", "app"), ("dir", "asc")]).await,
        ["s3", "s4", "s1", "s2"]
    );
    assert_eq!(
        ids(&[("sort", "severity"), ("limit", "2"), ("offset", "1")]).await,
        ["s2", "s3"]
    );
}
