//! The cross-rank analysis of a run on the server: when a session whose header names a run
//! (`run_id`, the sessions of one `gpufl record` of several processes) has been analysed, the
//! run's members analysed so far are read again together and gpufl-analysis's run analysis
//! ([`gpufl_analysis::analyze_run`]: ranks side by side, collective waits, stragglers) is stored
//! for the run (`runs`), the analysis over the most members kept. The dashboard's run page reads it.

use crate::bounds::Bounded;
use crate::error::ServerError;
use crate::ingest::fetch_files;
use crate::AppState;
use gpufl_analysis::{analyze_on, analyze_run, Analysis, Config, Model, RunMember};
use gpufl_protocol::Manifest;
use std::path::{Path, PathBuf};

/// Members read together for a run's analysis, at most (each within the ingest budget).
pub const MAX_MEMBERS: usize = 16;

/// Analyse run `run_id` of `project` over its members analysed so far (`ready`), in a directory
/// under `tmp` removed after; nothing when fewer than two are.
pub async fn analyse_run(
    st: &AppState,
    project: &str,
    run_id: &str,
    tmp: &Path,
) -> Result<(), ServerError> {
    let members: Vec<_> = st
        .db
        .run_members(project, run_id)
        .await?
        .into_iter()
        .filter(|m| m.ingest == "ready")
        .take(MAX_MEMBERS)
        .collect();
    if members.len() < 2 {
        return Ok(());
    }
    let dir = tmp.join("run");
    let result = async {
        let mut dirs = Vec::new();
        for m in &members {
            let manifest: Manifest = serde_json::from_str(&m.manifest).map_err(|e| {
                ServerError::Inconsistent(format!("{}: its manifest does not read: {e}", m.id))
            })?;
            dirs.push(fetch_files(st, project, &m.id, &manifest, &dir).await?);
        }
        let (threads, budget) = (st.analysis_threads, st.ingest_budget);
        let body = tokio::task::spawn_blocking(move || run_json(&dirs, threads, budget))
            .await
            .map_err(|e| ServerError::Inconsistent(format!("the run analysis failed: {e}")))??;
        st.db
            .save_run(project, run_id, members.len() as i64, &body)
            .await?;
        Ok(())
    }
    .await;
    let _ = tokio::fs::remove_dir_all(&dir).await;
    result
}

/// Read and analyse each session directory, then the run over them: its JSON.
fn run_json(
    dirs: &[PathBuf],
    threads: usize,
    budget: crate::bounds::Budget,
) -> Result<String, ServerError> {
    let cfg = Config::default();
    let mut loaded: Vec<(String, Model, Analysis)> = Vec::new();
    for d in dirs {
        let reader = gpufl_trace::ParSessionReader::open_with(d, budget.read_limits(), threads)
            .map_err(|e| ServerError::Inconsistent(format!("{}: {e}", d.display())))?;
        let mut reader = Bounded::new(reader, budget.records());
        let mut model = Model::load_items(&mut reader);
        if reader.over() {
            return Err(ServerError::Inconsistent(format!(
                "{}: too large to read again for the run analysis",
                d.display()
            )));
        }
        model.add_warnings(reader.inner().warnings());
        let a = analyze_on(&model, &cfg, threads);
        let name = d
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        loaded.push((name, model, a));
    }
    let members: Vec<RunMember> = loaded
        .iter()
        .map(|(name, model, analysis)| RunMember {
            name: name.clone(),
            model,
            analysis,
        })
        .collect();
    let run = analyze_run(&members, &cfg);
    serde_json::to_string(&run)
        .map_err(|e| ServerError::Inconsistent(format!("the run analysis as JSON: {e}")))
}
