//! The kernel table of `gpufl report`: per device, the kernels with the most GPU time, one compact
//! line each (the whole table is in `--json`). The `local` column is local memory per thread, with
//! `+Ns` for the stack frame the module's cubin gives (e.g. `0+568s`). When the recorder counted
//! inside some of a device's kernels (`kdetail` records), four more columns: active lanes per
//! warp instruction, global load and store sectors per request over the ideal, and the share of
//! shared-memory wavefronts that are bank conflicts.

use super::style::clip;
use gpufl_analysis::kdetail::DetailSummary;
use gpufl_analysis::kernels::{distinct_names, short_name, signature, KernelRow, KernelTable};
use gpufl_analysis::{fmt_duration, Limiter};
use std::fmt::Write;

/// Kernels shown per device.
pub const TOP: usize = 10;

fn bytes(b: u64) -> String {
    if b >= 1024 {
        format!("{:.0}K", b as f64 / 1024.0)
    } else {
        format!("{b}")
    }
}

fn limiter(l: Limiter) -> &'static str {
    match l {
        Limiter::Registers => "regs",
        Limiter::SharedMemory => "smem",
        Limiter::Warps => "warps",
        Limiter::Blocks => "blocks",
    }
}

/// `blocks×threads`, with `+N` when the kernel ran in other configurations too.
fn shape(r: &KernelRow) -> String {
    let more = if r.configs > 1 {
        format!(" +{}", r.configs - 1)
    } else {
        String::new()
    };
    format!("{}×{}{more}", r.blocks, r.threads_per_block)
}

/// Local memory per thread, then `+Ns` for a stack frame from the cubin (`0+568s`): CUPTI's
/// local memory leaves the frame out, and spills go there.
fn local(local_mem: u32, stack_frame: Option<u32>) -> String {
    match stack_frame {
        Some(f) if f > 0 => format!("{local_mem}+{f}s"),
        _ => local_mem.to_string(),
    }
}

fn occupancy(r: &KernelRow) -> String {
    match &r.occupancy {
        // The limiter matters only below 100 %.
        Some(o) if o.occupancy >= 1.0 => "100%".into(),
        Some(o) => {
            let by = o.limiter().map(limiter).unwrap_or("-");
            format!("{:.0}% {by}", o.occupancy * 100.0)
        }
        None => "-".into(),
    }
}

/// `32.0/4` (sectors per request over the ideal; `*` after an assumed ideal), `-` without requests.
fn sectors(per_request: Option<f64>, ideal: Option<f64>, assumed: bool) -> String {
    match (per_request, ideal) {
        (Some(p), Some(i)) => {
            let i = if (i - i.round()).abs() < 0.05 {
                format!("{i:.0}")
            } else {
                format!("{i:.1}")
            };
            format!("{p:.1}/{i}{}", if assumed { "*" } else { "" })
        }
        _ => "-".into(),
    }
}

/// The counter columns of a row: lanes, load and store sectors, bank conflicts.
fn detail_columns(d: Option<&DetailSummary>) -> String {
    let Some(d) = d else {
        return format!("{:>5} {:>9} {:>9} {:>5}  ", "-", "-", "-", "-");
    };
    let lanes = d.lanes.map_or("-".into(), |l| format!("{l:.1}"));
    let bank = d
        .bank_conflict_share
        .map_or("-".into(), |b| format!("{:.0}%", b * 100.0));
    format!(
        "{lanes:>5} {:>9} {:>9} {bank:>5}  ",
        sectors(
            d.load_sectors_per_request,
            d.load_ideal_per_request,
            d.load_ideal_assumed
        ),
        sectors(
            d.store_sectors_per_request,
            d.store_ideal_per_request,
            d.store_ideal_assumed
        ),
    )
}

/// Width of the kernel column.
const NAME_WIDTH: usize = 60;

/// The rows' names: the short name, or where rows share it the signature without its parameters
/// (template instantiations), told apart where even those would read the same once clipped
/// ([`distinct_names`]).
fn row_names(rows: &[&KernelRow]) -> Vec<String> {
    let shorts: Vec<&str> = rows.iter().map(|r| short_name(&r.name)).collect();
    let shown: Vec<String> = rows
        .iter()
        .zip(&shorts)
        .map(|(r, short)| {
            if shorts.iter().filter(|s| *s == short).count() > 1 {
                signature(&r.name).to_string()
            } else {
                short.to_string()
            }
        })
        .collect();
    let full: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    distinct_names(&shown, &full, NAME_WIDTH)
}

/// Append the table: a heading per device, then its top kernels by GPU time.
pub fn render(out: &mut String, t: &KernelTable) {
    let mut devices: Vec<u32> = t.rows.iter().map(|r| r.device).collect();
    devices.sort_unstable();
    devices.dedup();
    for dev in devices {
        let rows: Vec<&KernelRow> = t.rows.iter().filter(|r| r.device == dev).collect();
        let shown = rows.len().min(TOP);
        let of = if rows.len() > shown {
            format!("top {shown} of {} ", rows.len())
        } else {
            String::new()
        };
        let _ = writeln!(out, "\n  Kernels on GPU {dev} ({of}by GPU time)");
        if t.windows_only {
            let _ = writeln!(
                out,
                "    (always-on: launches and times inside the GPU activity windows only)"
            );
        }
        // The counter columns, when the recorder counted inside a kernel shown here.
        let counted = rows.iter().take(shown).any(|r| r.detail.is_some());
        let head = if counted {
            format!(
                "{:>5} {:>9} {:>9} {:>5}  ",
                "lanes", "ld sec/rq", "st sec/rq", "bank"
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "    {:>9} {:>6} {:>8} {:>9} {:>9} {:>9}  {:<16} {:>4} {:>5} {:>7}  {:<11} {head}kernel",
            "time",
            "busy",
            "launches",
            "mean",
            "p50",
            "p99",
            "blocks×threads",
            "regs",
            "smem",
            "local",
            "occupancy"
        );
        let names = row_names(&rows[..shown]);
        for (r, name) in rows.iter().take(shown).zip(&names) {
            let cols = if counted {
                detail_columns(r.detail.as_ref())
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "    {:>9} {:>5.1}% {:>8} {:>9} {:>9} {:>9}  {:<16} {:>4} {:>5} {:>7}  {:<11} {cols}{}",
                fmt_duration(r.total_ns),
                r.busy_share * 100.0,
                r.launches,
                fmt_duration(r.mean_ns),
                fmt_duration(r.p50_ns),
                fmt_duration(r.p99_ns),
                shape(r),
                r.launch.regs,
                bytes(r.launch.smem_bytes()),
                local(r.launch.local_mem, r.stack_frame),
                occupancy(r),
                clip(&crate::term::esc(name), NAME_WIDTH),
            );
            if r.graph_runs > 0 {
                // Kernels a graph replay ran: no launch call of their own.
                out.pop();
                let _ = writeln!(out, " · {} in CUDA graphs", r.graph_runs);
            }
            if let Some(src) = &r.source {
                let note = src
                    .note
                    .as_deref()
                    .map(|n| format!(" · {}", clip(&crate::term::esc(n), 160)))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "    {:>9} source {}:{}{note}",
                    "",
                    crate::term::esc(&src.file),
                    src.line
                );
            }
        }
        if counted {
            detail_notes(out, &rows);
        }
    }
}

/// Under a table with counter columns: what `*` means, and the kernels whose cubin had no line
/// info (once each).
fn detail_notes(out: &mut String, rows: &[&KernelRow]) {
    let details = || rows.iter().filter_map(|r| Some((r, r.detail.as_ref()?)));
    let _ = writeln!(
        out,
        "    (inside the kernels, from {} instrumented launch(es): lanes = active lanes per warp instruction of 32; sectors per request over the ideal; bank = shared-memory wavefronts that are bank conflicts)",
        details().map(|(_, d)| d.launches).fold(0u64, u64::saturating_add)
    );
    if details().any(|(_, d)| d.load_ideal_assumed || d.store_ideal_assumed) {
        let _ = writeln!(
            out,
            "    * ideal assumed: 4 sectors a request (32 lanes × 4 bytes); the recorder gave none"
        );
    }
    let mut no_lines: Vec<&str> = details()
        .filter(|(_, d)| !d.lineinfo)
        .map(|(r, _)| short_name(&r.name))
        .collect();
    no_lines.sort_unstable();
    no_lines.dedup();
    if !no_lines.is_empty() {
        let names: Vec<String> = no_lines
            .iter()
            .map(|n| clip(&crate::term::esc(n), 60))
            .collect();
        let _ = writeln!(
            out,
            "    no line info in {}: build with `nvcc -lineinfo` to see the lines inside {}",
            names.join(", "),
            if names.len() > 1 { "them" } else { "it" }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{local, sectors};

    #[test]
    fn sectors_per_request_over_the_ideal() {
        assert_eq!(sectors(Some(32.0), Some(4.0), false), "32.0/4");
        assert_eq!(sectors(Some(8.0), Some(4.0), true), "8.0/4*");
        assert_eq!(sectors(Some(5.0), Some(4.5), false), "5.0/4.5");
        assert_eq!(sectors(None, None, false), "-");
    }

    #[test]
    fn local_memory_then_the_stack_frame_when_known() {
        assert_eq!(local(0, None), "0");
        assert_eq!(local(64, Some(0)), "64");
        assert_eq!(local(0, Some(568)), "0+568s");
        assert_eq!(local(96, Some(2048)), "96+2048s");
    }
}
