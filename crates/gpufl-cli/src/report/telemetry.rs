//! The telemetry section of `gpufl report`: per GPU, min / mean / max of each NVML metric, the
//! share of time under throttling, the ECC counters and PCIe throughput.

use gpufl_analysis::{DeviceTelemetry, Stat};
use std::fmt::Write;

/// A table row: name, figures, unit conversion, decimals, a note after the figures.
type Row = (&'static str, Option<Stat>, fn(f64) -> f64, usize, String);

/// One table per device with samples.
pub fn render(out: &mut String, d: &DeviceTelemetry) {
    let period = if d.period_ns > 0 {
        format!(", every {:.0} ms", d.period_ns as f64 / 1e6)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  GPU {} telemetry: {} NVML sample{}{period}",
        d.device,
        d.samples,
        if d.samples == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        out,
        "    {:<24} {:>9} {:>9} {:>9}",
        "", "min", "mean", "max"
    );
    let gib = |v: f64| v / (1u64 << 30) as f64;
    let mb = |v: f64| v / 1000.0; // KB/s → MB/s
    let rows: [Row; 9] = [
        ("GPU utilization %", d.gpu_util_pct, |v| v, 0, String::new()),
        (
            "memory utilization %",
            d.mem_util_pct,
            |v| v,
            0,
            String::new(),
        ),
        (
            "memory used GiB",
            d.mem_used_bytes,
            gib,
            2,
            d.mem_total_bytes
                .map(|t| format!("  of {:.2}", gib(t as f64)))
                .unwrap_or_default(),
        ),
        ("temperature °C", d.temp_c, |v| v, 0, String::new()),
        ("power W", d.power_w, |v| v, 0, String::new()),
        (
            "SM clock MHz",
            d.sm_mhz,
            |v| v,
            0,
            d.sm_max_mhz
                .map(|m| format!("  max {m}"))
                .unwrap_or_default(),
        ),
        ("memory clock MHz", d.mem_mhz, |v| v, 0, String::new()),
        ("PCIe tx MB/s", d.pcie_tx_kbs, mb, 1, String::new()),
        ("PCIe rx MB/s", d.pcie_rx_kbs, mb, 1, String::new()),
    ];
    for (name, stat, scale, prec, extra) in rows {
        let Some(s) = stat else { continue };
        let _ = writeln!(
            out,
            "    {name:<24} {:>9.prec$} {:>9.prec$} {:>9.prec$}{extra}",
            scale(s.min),
            scale(s.mean),
            scale(s.max),
        );
    }
    if let Some(t) = &d.throttle {
        let pct = |ns: u64| {
            if t.sampled_ns == 0 {
                0.0
            } else {
                ns as f64 * 100.0 / t.sampled_ns as f64
            }
        };
        let _ = writeln!(
            out,
            "    throttled {:.1} % of the time (power {:.1} %, thermal {:.1} %, hardware slowdown {:.1} %)",
            t.throttled_share * 100.0,
            pct(t.power_ns),
            pct(t.thermal_ns),
            pct(t.hw_slowdown_ns)
        );
    }
    match &d.ecc {
        Some(e) => {
            let _ = writeln!(
                out,
                "    ECC errors (volatile): {} corrected (+{} while recording), {} uncorrected (+{})",
                e.corrected_last,
                e.corrected_last.saturating_sub(e.corrected_first),
                e.uncorrected_last,
                e.uncorrected_last.saturating_sub(e.uncorrected_first)
            );
        }
        None => {
            let _ = writeln!(out, "    ECC errors: not reported (ECC off or unsupported)");
        }
    }
}
