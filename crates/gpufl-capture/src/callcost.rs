//! The time the recorder's CUPTI callbacks spend on the program's threads, by kind, with
//! `GPUFL_DEBUG_COST=1` (a benchmark knob: without it nothing is timed). Written as one `info`
//! notice at the end, so that a run's own session says where its recording cost went on the
//! threads that make CUDA calls (CUPTI's own dispatch and activity records are not in it).

use std::sync::atomic::{AtomicU64, Ordering};

/// What a callback was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sync = 0,
    Hostcall,
    Site,
    Module,
    Nvtx,
    Other,
}

const KINDS: usize = 6;
const NAMES: [&str; KINDS] = [
    "synchronizations",
    "hostcalls",
    "call sites",
    "module loads",
    "NVTX",
    "other",
];

struct Cost {
    ns: [AtomicU64; KINDS],
    calls: [AtomicU64; KINDS],
}

static COST: Cost = Cost {
    ns: [const { AtomicU64::new(0) }; KINDS],
    calls: [const { AtomicU64::new(0) }; KINDS],
};

/// The kind of a callback by its domain and id.
pub(crate) fn kind_of(domain: u32, cbid: u32) -> Kind {
    use crate::cupti;
    match domain {
        crate::nvtx::DOMAIN_NVTX => Kind::Nvtx,
        cupti::DOMAIN_RESOURCE if cbid == cupti::CBID_RESOURCE_MODULE_LOADED => Kind::Module,
        cupti::DOMAIN_RUNTIME | cupti::DOMAIN_DRIVER => {
            if crate::collection::site_table().is_some_and(|t| t.kind(domain, cbid).is_some()) {
                Kind::Site
            } else if crate::collection::hostcall_table().is_some_and(|t| t.contains(domain, cbid))
            {
                Kind::Hostcall
            } else if crate::cbids::sync_kind(domain, cbid).is_some() {
                Kind::Sync
            } else {
                Kind::Other
            }
        }
        _ => Kind::Other,
    }
}

/// One callback of `kind` took `ns`.
pub(crate) fn add(kind: Kind, ns: u64) {
    COST.ns[kind as usize].fetch_add(ns, Ordering::Relaxed);
    COST.calls[kind as usize].fetch_add(1, Ordering::Relaxed);
}

/// "callback time on the program's threads: N callbacks, T ms (synchronizations n, t ms; …)",
/// the kinds by time, or None when nothing was timed.
pub(crate) fn summary() -> Option<String> {
    let mut parts: Vec<(u64, u64, &str)> = (0..KINDS)
        .map(|k| {
            (
                COST.ns[k].load(Ordering::Relaxed),
                COST.calls[k].load(Ordering::Relaxed),
                NAMES[k],
            )
        })
        .filter(|&(_, n, _)| n > 0)
        .collect();
    if parts.is_empty() {
        return None;
    }
    parts.sort_by_key(|p| std::cmp::Reverse(p.0));
    let ms = |ns: u64| ns as f64 / 1e6;
    let (ns, n) = parts
        .iter()
        .fold((0, 0), |(t, c), &(ns, n, _)| (t + ns, c + n));
    let each: Vec<String> = parts
        .iter()
        .map(|&(ns, n, what)| format!("{what} {n}, {:.1} ms", ms(ns)))
        .collect();
    Some(format!(
        "callback time on the program's threads (GPUFL_DEBUG_COST=1): {n} callbacks, {:.1} ms ({})",
        ms(ns),
        each.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_adds_up_and_leads_with_the_dearest_kind() {
        assert_eq!(kind_of(crate::nvtx::DOMAIN_NVTX, 1), Kind::Nvtx);
        assert_eq!(
            kind_of(
                crate::cupti::DOMAIN_RESOURCE,
                crate::cupti::CBID_RESOURCE_MODULE_LOADED
            ),
            Kind::Module
        );
        add(Kind::Sync, 3_000_000);
        add(Kind::Sync, 1_000_000);
        add(Kind::Module, 9_000_000);
        let s = summary().unwrap();
        assert!(
            s.contains("3 callbacks, 13.0 ms (module loads 1, 9.0 ms; synchronizations 2, 4.0 ms)"),
            "{s}"
        );
    }
}
