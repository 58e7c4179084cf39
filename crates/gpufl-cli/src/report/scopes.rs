//! The scopes section of `gpufl report`: one row per scope path (gpufl API scopes and NVTX
//! ranges), indented by nesting: instances, wall time, GPU busy during it, kernels launched,
//! synchronizations and the host time blocked in them ("syncs inside forward totaled X").

use crate::term::esc;
use gpufl_analysis::{RangeRollup, ScopeRollup};
use std::collections::HashSet;
use std::fmt::Write;

/// Scope rows shown at most (a JAX program opens thousands of XLA NVTX scope paths); the longest
/// by wall time are kept with their ancestors, the rest counted. `--json` has every row.
pub const MAX_SCOPE_ROWS: usize = 40;
/// Nesting levels shown by indentation; deeper rows are prefixed with their depth.
const MAX_INDENT: usize = 16;
/// Range names shown at most.
pub const MAX_RANGE_ROWS: usize = 20;

/// Indexes of the rows to show: all when they fit, else the `max` longest by wall time and their
/// ancestors, in tree order.
fn shown(scopes: &[ScopeRollup], max: usize) -> Vec<usize> {
    if scopes.len() <= max {
        return (0..scopes.len()).collect();
    }
    let mut by_wall: Vec<usize> = (0..scopes.len()).collect();
    by_wall.sort_by(|&a, &b| scopes[b].wall_ns.cmp(&scopes[a].wall_ns).then(a.cmp(&b)));
    let mut keep: HashSet<usize> = HashSet::new();
    for &i in &by_wall {
        // A row costs itself plus the ancestors not yet shown (walked up to the first shown one,
        // and no further than what could still fit: bounded whatever the depth).
        let mut new: Vec<usize> = Vec::new();
        let mut cur = Some(i);
        while let Some(j) = cur.filter(|j| *j < scopes.len() && !keep.contains(j)) {
            new.push(j);
            if keep.len() + new.len() > max {
                break;
            }
            cur = scopes[j].parent.map(|p| p as usize);
        }
        if keep.len() + new.len() > max {
            continue;
        }
        keep.extend(new);
        if keep.len() >= max {
            break;
        }
    }
    let mut v: Vec<usize> = keep.into_iter().collect();
    v.sort_unstable();
    v
}

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
    let rows = shown(scopes, MAX_SCOPE_ROWS);
    for &i in &rows {
        let s = &scopes[i];
        // Indented by depth, up to MAX_INDENT levels; deeper rows say their depth.
        let mut name = if s.depth as usize > MAX_INDENT {
            format!("{}[{}] {}", "  ".repeat(MAX_INDENT), s.depth, esc(&s.name))
        } else {
            format!("{}{}", "  ".repeat(s.depth as usize), esc(&s.name))
        };
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
    if rows.len() < scopes.len() {
        let _ = writeln!(
            out,
            "    … {} more scope paths not shown (the longest are; `gpufl report --json` lists all)",
            scopes.len() - rows.len()
        );
    }
}

/// The start/end ranges table (NVTX `nvtxRangeStart*` / `nvtxRangeEnd`), or nothing.
pub fn render_ranges(out: &mut String, ranges: &[RangeRollup]) {
    if ranges.is_empty() {
        return;
    }
    let _ = writeln!(out, "  ranges (start/end, may cross threads):");
    let _ = writeln!(
        out,
        "    {:<32} {:>7} {:>11} {:>11} {:>11} {:>7}",
        "range", "count", "wall ms", "max ms", "GPU busy ms", "x-thr"
    );
    for r in ranges.iter().take(MAX_RANGE_ROWS) {
        let _ = writeln!(
            out,
            "    {:<32} {:>7} {:>11} {:>11} {:>11} {:>7}",
            esc(&r.name),
            r.count,
            ms(r.wall_ns),
            ms(r.max_ns),
            ms(r.gpu_busy_ns),
            r.cross_thread
        );
    }
    if ranges.len() > MAX_RANGE_ROWS {
        let _ = writeln!(
            out,
            "    … {} more range names (`gpufl report --json` lists all)",
            ranges.len() - MAX_RANGE_ROWS
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(parent: Option<usize>, name: &str, depth: u32, wall: u64) -> ScopeRollup {
        ScopeRollup {
            parent: parent.map(|p| p as u32),
            name: name.to_string(),
            depth,
            count: 1,
            wall_ns: wall,
            gpu_busy_ns: 0,
            kernels: 0,
            kernels_by_launch: true,
            syncs: 0,
            sync_blocked_ns: 0,
            unclosed: 0,
            nvtx: true,
        }
    }

    #[test]
    fn long_tables_keep_the_longest_rows_with_their_ancestors() {
        // Tree order: a root with 100 small children, then a second root whose one deep child
        // is the longest of all.
        let mut v = vec![row(None, "jit_step", 0, 1_000)];
        for i in 0..100 {
            v.push(row(Some(0), &format!("op{i}"), 1, 10 + i));
        }
        v.push(row(None, "other", 0, 500));
        v.push(row(Some(101), "deep", 1, 400));
        v.push(row(Some(102), "deepest", 2, 5_000));
        let keep = shown(&v, 10);
        assert_eq!(keep.len(), 10);
        let names: Vec<&str> = keep.iter().map(|&i| v[i].name.as_str()).collect();
        // The deepest row comes with both its ancestors, in tree order after jit_step's rows.
        assert_eq!(&names[names.len() - 3..], ["other", "deep", "deepest"]);
        assert_eq!(names[0], "jit_step");
        // The other kept children of jit_step are its longest ones.
        assert!(names.contains(&"op99") && names.contains(&"op95") && !names.contains(&"op0"));
        let mut out = String::new();
        render(&mut out, &v);
        assert!(out.contains("… 64 more scope paths not shown"), "{out}");
        // Small tables are shown whole.
        assert_eq!(shown(&v[..5], 10), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_deep_chain_shows_its_longest_rows_with_bounded_work_and_indentation() {
        // 100,000 nested rows, the innermost the longest: its ancestors cannot all be shown, so
        // the rows shown are the outermost ones that fit, and the indentation stops growing.
        let n = 100_000;
        let v: Vec<ScopeRollup> = (0..n)
            .map(|i: usize| row(i.checked_sub(1), "s", i as u32, i as u64))
            .collect();
        let keep = shown(&v, MAX_SCOPE_ROWS);
        assert!(keep.len() <= MAX_SCOPE_ROWS);
        let mut out = String::new();
        render(&mut out, &v);
        let widest = out.lines().map(|l| l.len()).max().unwrap();
        assert!(widest < 200, "{widest}");
    }
}
