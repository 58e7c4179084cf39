//! The scopes section of `gpufl report`: one row per scope path (gpufl API scopes and NVTX
//! ranges), indented by nesting: instances, wall time, GPU busy during it, kernels launched,
//! synchronizations and the host time blocked in them ("syncs inside forward totaled X").

use gpufl_analysis::ScopeRollup;
use std::fmt::Write;

fn ms(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e6)
}

/// The table, or nothing when the session has no scopes.
pub fn render(out: &mut String, scopes: &[ScopeRollup]) {
    if scopes.is_empty() {
        return;
    }
    let by_launch = scopes.iter().all(|s| s.kernels_by_launch);
    let _ = writeln!(
        out,
        "  scopes{}:",
        if by_launch {
            ""
        } else {
            " (kernels: started on the GPU inside the scope; no API records to tell launches)"
        }
    );
    let _ = writeln!(
        out,
        "    {:<32} {:>7} {:>11} {:>11} {:>8} {:>7} {:>12}",
        "scope", "count", "wall ms", "GPU busy ms", "kernels", "syncs", "blocked ms"
    );
    for s in scopes {
        let mut name = format!("{}{}", "  ".repeat(s.depth as usize), s.name);
        if s.nvtx {
            name.push_str(" (nvtx)");
        }
        if s.unclosed > 0 {
            name.push_str(" (unclosed)");
        }
        let _ = writeln!(
            out,
            "    {:<32} {:>7} {:>11} {:>11} {:>8} {:>7} {:>12}",
            name,
            s.count,
            ms(s.wall_ns),
            ms(s.gpu_busy_ns),
            s.kernels,
            s.syncs,
            ms(s.sync_blocked_ns)
        );
    }
}
