//! Rule `ecc-errors`: device-memory errors reported by the GPU's ECC (NVML's volatile counters in
//! `telemetry` records, counted since the driver loaded).
//!
//! - **Uncorrected** errors: any sample with `ecc_uncorr > 0` makes a HIGH insight (data may have
//!   been corrupted, or a CUDA context killed), whether they happened before or during the session.
//! - **Corrected** errors only: a LOW insight when `ecc_corr` grew during the session (one-off
//!   corrected errors are normal; a rising count can precede uncorrectable ones).
//! - **Impact:** 0 (not time); **location:** the device (no source line). GPUs without ECC, or with
//!   ECC off, have no counters and never fire.

use crate::insight::Insight;
use crate::shared::Ctx;
use crate::telemetry::Series;
use crate::userframe::SourceLoc;
use serde::Serialize;

pub(crate) const RULE: &str = "ecc-errors";

/// The rule's own figures: the counters at the first and last sample that had them, and their
/// largest values (volatile counters only grow until the driver reloads).
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct Data {
    pub device: u32,
    pub corrected_first: u64,
    pub corrected_last: u64,
    pub uncorrected_first: u64,
    pub uncorrected_max: u64,
    /// Growth during the session (`last - first`, 0 if the counter went down).
    pub corrected_new: u64,
    pub uncorrected_new: u64,
}

const FIX_UNCORRECTED: &str = "Treat the GPU as faulty until checked: results computed on it may be wrong. \
Look at `nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT` and the kernel log (Xid 48, 63, 64, 94, 95), \
drain it, reset it (a pending row remap or page retirement takes effect at reset), rerun the affected work, \
and have it replaced if errors come back.";
const FIX_CORRECTED: &str = "Corrected errors cost nothing yet, but a count that keeps rising can precede \
uncorrectable ones: watch it (`nvidia-smi -q -d ECC`, DCGM), and check row remapping / page retirement.";

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    cx.m.telemetry()
        .iter()
        .filter_map(|s| device(cx, s))
        .collect()
}

fn device(cx: &Ctx, s: &Series) -> Option<Insight> {
    let c: Vec<(u64, u64)> = s
        .samples()
        .filter_map(|t| Some((t.ecc_corr?, t.ecc_uncorr?)))
        .collect();
    let (&first, &last) = (c.first()?, c.last()?);
    let unc_max = c.iter().map(|x| x.1).max().unwrap_or(0);
    let data = Data {
        device: s.device,
        corrected_first: first.0,
        corrected_last: last.0,
        uncorrected_first: first.1,
        uncorrected_max: unc_max,
        corrected_new: last.0.saturating_sub(first.0),
        uncorrected_new: unc_max.saturating_sub(first.1),
    };
    let (title, detail, fix) = if unc_max > 0 {
        (
            format!(
                "Uncorrected ECC errors on GPU {} · {unc_max} ({} during this session)",
                s.device, data.uncorrected_new
            ),
            format!(
                "NVML's volatile counters (since the driver loaded): {unc_max} uncorrected, {} corrected; \
                 {} uncorrected and {} corrected were already counted when the session started",
                last.0, first.1, first.0
            ),
            FIX_UNCORRECTED,
        )
    } else if data.corrected_new > 0 {
        (
            format!(
                "Corrected ECC errors on GPU {} · +{} during this session",
                s.device, data.corrected_new
            ),
            format!(
                "NVML's volatile corrected count went from {} to {} while recording; no uncorrected errors",
                first.0, last.0
            ),
            FIX_CORRECTED,
        )
    } else {
        return None;
    };
    Some(
        Insight::new(RULE, SourceLoc::device(s.device), title, detail, fix)
            .count(unc_max.max(data.corrected_new))
            .window(cx.wall_ns)
            .data(data),
    )
}
