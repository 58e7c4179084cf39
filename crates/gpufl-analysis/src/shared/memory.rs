//! Memory over time from `mem` records: each device's live bytes (allocations not yet freed,
//! matched by address; a free of an address never seen allocated is ignored), the peak and the
//! lines holding memory at it (by allocating line: the user line of the allocation's stack,
//! [`Ctx::stack_loc`]), each line's growth and churn across the session, and the out-of-memory
//! post-mortem (the failed request, its line, the live memory by line at that moment, what was
//! freed just before). The memory rules (`out-of-memory`, `memory-leak`, `memory-peak`) read it.

use crate::ids::LocIx;
use crate::model::MemRow;
use crate::shared::Ctx;
use gpufl_trace::MemOp;
use std::collections::HashMap;

/// Frees counted as "freed just before" a failed allocation: within this long before it, ns.
pub const FREED_BEFORE_NS: u64 = 1_000_000_000;
/// Points of a device's memory-over-time series, at most (the series keeps the maximum of each
/// bucket, so the peak is never smoothed away).
pub const MAX_SERIES_POINTS: usize = 200;

/// What an allocation is for, read from its stack's frames (the first that applies):
/// - **optimizer state**: a frame of an optimizer (`torch/optim/`, `…/optim/…`, `optax`);
/// - **gradients**: inside the backward pass (`torch/autograd/`, `Tensor.backward`, the autograd
///   engine's native frames) — gradients and the buffers backward needs;
/// - **weights**: moving or loading a model (`Module.to` / `cuda` / `_apply`, `load_state_dict`,
///   `from_pretrained`, parameter initialisation);
/// - **activations**: inside a module's `forward`;
/// - **other**: everything else (the program's own tensors: inputs, buffers).
///
/// With a caching allocator (PyTorch), the allocation is the segment the allocator reserved from
/// CUDA, named by what first needed it.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Activations,
    Gradients,
    OptimizerState,
    Weights,
    Other,
}

impl Role {
    /// Its name in JSON (`optimizer_state`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Activations => "activations",
            Role::Gradients => "gradients",
            Role::OptimizerState => "optimizer_state",
            Role::Weights => "weights",
            Role::Other => "other",
        }
    }

    /// Its name in prose (`optimizer state`).
    pub fn label(self) -> &'static str {
        match self {
            Role::Activations => "activations",
            Role::Gradients => "gradients (backward)",
            Role::OptimizerState => "optimizer state",
            Role::Weights => "weights",
            Role::Other => "other",
        }
    }
}

/// The role of an allocation with this stack ([`Role`]).
pub fn role_of(cx: &Ctx, stack: Option<crate::ids::StackIx>) -> Role {
    let Some(frames) = stack.and_then(|s| cx.m.stack(s)) else {
        return Role::Other;
    };
    let (mut backward, mut weights, mut forward) = (false, false, false);
    for &id in frames {
        let Some(fr) = cx.m.frame(id) else { continue };
        let file = fr.file.unwrap_or("");
        // Python 3.11+ names functions by their qualified name (`Module._apply`,
        // `Module.to.<locals>.convert`): the function is its last part.
        let func = fr.func.unwrap_or("");
        let func = if fr.kind == gpufl_trace::FrameKind::Python {
            func.rsplit('.').next().unwrap_or(func)
        } else {
            func
        };
        if file.contains("/torch/optim/")
            || file.contains("/optim/")
            || file.contains("/optimizers/")
            || file.contains("/optax/")
        {
            return Role::OptimizerState;
        }
        if file.contains("/torch/autograd/")
            || (func == "backward" && file.ends_with("torch/_tensor.py"))
            || func.contains("autograd::Engine")
        {
            backward = true;
        }
        if matches!(
            func,
            "load_state_dict"
                | "_load_from_state_dict"
                | "from_pretrained"
                | "_move_model_to_device"
                | "reset_parameters"
                | "_init_weights"
                | "init_weights"
        ) || (file.ends_with("torch/nn/modules/module.py")
            && matches!(
                func,
                "_apply" | "to" | "cuda" | "half" | "bfloat16" | "float"
            ))
            || file.ends_with("torch/nn/parameter.py")
        {
            weights = true;
        }
        if func == "forward"
            || (file.ends_with("torch/nn/modules/module.py") && func == "_call_impl")
        {
            forward = true;
        }
    }
    if backward {
        Role::Gradients
    } else if weights {
        Role::Weights
    } else if forward {
        Role::Activations
    } else {
        Role::Other
    }
}

/// Live bytes held by one allocating line (None: allocations without a stack).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub loc: Option<LocIx>,
    pub bytes: u64,
    /// Allocations of the line still live.
    pub allocs: u64,
}

/// One device's memory over the session.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceMem {
    pub dev: u32,
    /// The highest live bytes and when (trace clock), and the holders then, largest first.
    pub peak_bytes: u64,
    pub peak_ts: u64,
    pub holders: Vec<Holder>,
    /// The live bytes at the peak by [`Role`], largest first.
    pub roles: Vec<(Role, u64)>,
    /// Live bytes at the end of the session.
    pub end_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
    /// (trace clock, live bytes) after each change, thinned to [`MAX_SERIES_POINTS`] (each kept
    /// point the highest of its bucket).
    pub series: Vec<(u64, u64)>,
}

/// What one allocating line did on one device across the session.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineMem {
    pub dev: u32,
    pub loc: Option<LocIx>,
    pub allocs: u64,
    /// Frees of this line's allocations.
    pub frees: u64,
    pub bytes_allocated: u64,
    /// The line's live bytes at its first and last allocation, at its highest, and at the end.
    pub first_live: u64,
    pub max_live: u64,
    pub end_live: u64,
    /// Allocations after which the line's live bytes were a new high for it.
    pub new_highs: u64,
    /// Its first and last event (allocation or free), trace clock.
    pub first_ts: u64,
    pub last_ts: u64,
}

impl LineMem {
    /// Allocations and frees per second over the line's span (0 with a single instant).
    pub fn churn_per_s(&self) -> f64 {
        let span = self.last_ts.saturating_sub(self.first_ts);
        if span == 0 {
            return 0.0;
        }
        (self.allocs + self.frees) as f64 * 1e9 / span as f64
    }

    /// Live bytes gained from its first allocation to the end.
    pub fn growth(&self) -> u64 {
        self.end_live.saturating_sub(self.first_live)
    }
}

/// A failed allocation and the memory around it.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub ts: u64,
    pub dev: u32,
    /// Bytes asked for, the device's free bytes (last telemetry sample), the function.
    pub bytes: u64,
    pub free: Option<u64>,
    pub api: Option<u32>,
    pub loc: Option<LocIx>,
    /// Live bytes of the process on the device at the failure, and by line (largest first).
    pub live_bytes: u64,
    pub holders: Vec<Holder>,
    /// Frees within [`FREED_BEFORE_NS`] before the failure, by allocating line (largest first).
    pub freed_before: Vec<Holder>,
}

/// The memory of a session.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemScan {
    pub devices: Vec<DeviceMem>,
    pub lines: Vec<LineMem>,
    pub failures: Vec<Failure>,
}

/// A live allocation.
#[derive(Clone, Copy)]
struct Live {
    bytes: u64,
    loc: Option<LocIx>,
    stack: Option<crate::ids::StackIx>,
}

/// The replay of allocations and frees in time order.
#[derive(Default)]
struct Replay {
    live: HashMap<(u32, u64), Live>,
    dev_live: HashMap<u32, u64>,
}

impl Replay {
    /// Apply one record; the allocation freed, if it was one the replay knew.
    fn apply(&mut self, r: &MemRow, loc: Option<LocIx>) -> Option<Live> {
        match r.op {
            MemOp::Alloc => {
                // An address allocated again without a free seen: the old one is gone.
                let old = self.live.insert(
                    (r.dev, r.addr),
                    Live {
                        bytes: r.bytes,
                        loc,
                        stack: r.stack,
                    },
                );
                let d = self.dev_live.entry(r.dev).or_default();
                *d = d.saturating_sub(old.map_or(0, |o| o.bytes)) + r.bytes;
                old
            }
            MemOp::Free => {
                let old = self.live.remove(&(r.dev, r.addr))?;
                let d = self.dev_live.entry(r.dev).or_default();
                *d = d.saturating_sub(old.bytes);
                Some(old)
            }
            _ => None,
        }
    }

    fn dev_bytes(&self, dev: u32) -> u64 {
        self.dev_live.get(&dev).copied().unwrap_or(0)
    }

    /// The live bytes of `dev` by line, largest first.
    fn holders(&self, dev: u32) -> Vec<Holder> {
        let mut by: HashMap<Option<LocIx>, (u64, u64)> = HashMap::new();
        for (&(d, _), l) in &self.live {
            if d == dev {
                let e = by.entry(l.loc).or_default();
                e.0 += l.bytes;
                e.1 += 1;
            }
        }
        sorted_holders(by)
    }

    /// The live bytes of `dev` by role, largest first.
    fn roles(
        &self,
        dev: u32,
        role: &impl Fn(Option<crate::ids::StackIx>) -> Role,
    ) -> Vec<(Role, u64)> {
        let mut by: HashMap<Role, u64> = HashMap::new();
        for (&(d, _), l) in &self.live {
            if d == dev {
                *by.entry(role(l.stack)).or_default() += l.bytes;
            }
        }
        let mut v: Vec<(Role, u64)> = by.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

fn sorted_holders(by: HashMap<Option<LocIx>, (u64, u64)>) -> Vec<Holder> {
    let mut v: Vec<Holder> = by
        .into_iter()
        .map(|(loc, (bytes, allocs))| Holder { loc, bytes, allocs })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.loc.cmp(&b.loc)));
    v
}

/// The session's `mem` records in time order (stable: file order among equal times).
fn ordered(rows: &[MemRow]) -> Vec<&MemRow> {
    let mut v: Vec<&MemRow> = rows.iter().collect();
    v.sort_by_key(|r| r.ts);
    v
}

/// Scan the session's memory (empty without `mem` records).
pub fn scan(cx: &Ctx) -> MemScan {
    let rows = ordered(cx.m.mems());
    let loc_of = |r: &MemRow| r.stack.and_then(|s| cx.stack_loc(s));
    let roles: std::cell::RefCell<HashMap<Option<crate::ids::StackIx>, Role>> = Default::default();
    let role = |s: Option<crate::ids::StackIx>| {
        *roles
            .borrow_mut()
            .entry(s)
            .or_insert_with(|| role_of(cx, s))
    };
    scan_rows(&rows, loc_of, role)
}

/// [`scan`] over rows in time order, with the line of each row's stack.
fn scan_rows(
    rows: &[&MemRow],
    loc_of: impl Fn(&MemRow) -> Option<LocIx>,
    role: impl Fn(Option<crate::ids::StackIx>) -> Role,
) -> MemScan {
    let mut rp = Replay::default();
    let mut devs: Vec<DeviceMem> = Vec::new();
    let mut peak_at: HashMap<u32, usize> = HashMap::new();
    let mut lines: HashMap<(u32, Option<LocIx>), LineMem> = HashMap::new();
    let mut line_live: HashMap<(u32, Option<LocIx>), u64> = HashMap::new();
    let mut fail_at: Vec<usize> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let di = match devs.iter().position(|d| d.dev == r.dev) {
            Some(di) => di,
            None => {
                devs.push(DeviceMem {
                    dev: r.dev,
                    ..DeviceMem::default()
                });
                devs.len() - 1
            }
        };
        let loc = loc_of(r);
        match r.op {
            MemOp::AllocFailed => {
                fail_at.push(i);
                continue;
            }
            MemOp::Alloc | MemOp::Free => {}
            MemOp::Unknown => continue,
        }
        let freed = rp.apply(r, loc);
        let d = &mut devs[di];
        // The line whose live bytes change: the allocating line (for a free, the line that
        // allocated what it frees).
        let key = if r.op == MemOp::Alloc {
            d.allocs += 1;
            (r.dev, loc)
        } else {
            let Some(f) = freed else {
                continue;
            };
            d.frees += 1;
            (r.dev, f.loc)
        };
        if r.op == MemOp::Alloc {
            if let Some(old) = freed {
                let ol = line_live.entry((r.dev, old.loc)).or_default();
                *ol = ol.saturating_sub(old.bytes);
            }
        }
        let ll = line_live.entry(key).or_default();
        let lm = lines.entry(key).or_insert_with(|| LineMem {
            dev: r.dev,
            loc: key.1,
            first_ts: r.ts,
            ..LineMem::default()
        });
        if r.op == MemOp::Alloc {
            *ll += r.bytes;
            if lm.allocs == 0 {
                lm.first_live = *ll;
            }
            lm.allocs += 1;
            lm.bytes_allocated += r.bytes;
            if *ll > lm.max_live {
                lm.max_live = *ll;
                lm.new_highs += 1;
            }
        } else {
            *ll = ll.saturating_sub(freed.map_or(0, |f| f.bytes));
            lm.frees += 1;
        }
        lm.end_live = *ll;
        lm.last_ts = r.ts;
        let now = rp.dev_bytes(r.dev);
        d.series.push((r.ts, now));
        if now > d.peak_bytes {
            d.peak_bytes = now;
            d.peak_ts = r.ts;
            peak_at.insert(r.dev, i);
        }
        d.end_bytes = now;
    }
    let failures = post_mortems(rows, &fail_at, &loc_of);
    for d in &mut devs {
        if let Some(&i) = peak_at.get(&d.dev) {
            let rp = replay_to(rows, i, &loc_of);
            d.holders = rp.holders(d.dev);
            d.roles = rp.roles(d.dev, &role);
        }
        d.series = thin(&d.series, MAX_SERIES_POINTS);
    }
    devs.sort_by_key(|d| d.dev);
    let mut lines: Vec<LineMem> = lines.into_values().collect();
    lines.sort_by_key(|l| (l.dev, l.loc));
    MemScan {
        devices: devs,
        lines,
        failures,
    }
}

/// The replay of `rows[..=last]`.
fn replay_to(rows: &[&MemRow], last: usize, loc_of: &impl Fn(&MemRow) -> Option<LocIx>) -> Replay {
    let mut rp = Replay::default();
    for r in &rows[..=last] {
        rp.apply(r, loc_of(r));
    }
    rp
}

/// Each failed allocation with the memory around it.
fn post_mortems(
    rows: &[&MemRow],
    fail_at: &[usize],
    loc_of: &impl Fn(&MemRow) -> Option<LocIx>,
) -> Vec<Failure> {
    let mut out = Vec::new();
    for &i in fail_at {
        let r = rows[i];
        let mut rp = Replay::default();
        let mut freed: HashMap<Option<LocIx>, (u64, u64)> = HashMap::new();
        for p in &rows[..i] {
            let f = rp.apply(p, loc_of(p));
            let recent = p.dev == r.dev && r.ts.saturating_sub(p.ts) <= FREED_BEFORE_NS;
            if let (MemOp::Free, Some(f), true) = (p.op, f, recent) {
                let e = freed.entry(f.loc).or_default();
                e.0 += f.bytes;
                e.1 += 1;
            }
        }
        out.push(Failure {
            ts: r.ts,
            dev: r.dev,
            bytes: r.bytes,
            free: r.free,
            api: r.api,
            loc: loc_of(r),
            live_bytes: rp.dev_bytes(r.dev),
            holders: rp.holders(r.dev),
            freed_before: sorted_holders(freed),
        });
    }
    out
}

/// At most `n` points of a series: each bucket of consecutive points keeps its highest.
pub fn thin(series: &[(u64, u64)], n: usize) -> Vec<(u64, u64)> {
    if series.len() <= n || n == 0 {
        return series.to_vec();
    }
    let per = series.len().div_ceil(n);
    series
        .chunks(per)
        .filter_map(|c| {
            c.iter()
                .copied()
                .max_by_key(|p| (p.1, std::cmp::Reverse(p.0)))
        })
        .collect()
}

#[cfg(test)]
#[path = "memory/tests.rs"]
mod tests;

/// A holder as the memory rules report it: its line (`file:line`, "(no stack)" for allocations
/// without one), live bytes and allocations.
#[derive(serde::Serialize, Clone, Debug, PartialEq)]
pub struct HolderData {
    pub location: String,
    pub bytes: u64,
    pub allocs: u64,
}

/// The first `n` holders as reported.
pub fn holders_data(cx: &Ctx, holders: &[Holder], n: usize) -> Vec<HolderData> {
    holders
        .iter()
        .take(n)
        .map(|h| HolderData {
            location: h
                .loc
                .map_or_else(|| "(no stack)".to_string(), |l| cx.loc(l).short()),
            bytes: h.bytes,
            allocs: h.allocs,
        })
        .collect()
}

/// "train.py:10 7.5 GiB (30 allocations), …" for a finding's prose.
pub fn holders_text(h: &[HolderData]) -> String {
    h.iter()
        .map(|h| {
            format!(
                "{} {} ({} allocation{})",
                h.location,
                fmt_bytes(h.bytes),
                h.allocs,
                if h.allocs == 1 { "" } else { "s" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub use crate::text::fmt_bytes;

/// The device's memory in all, bytes: the largest `mem_total` of its telemetry, else the
/// header's `total_mem_bytes`.
pub fn device_total(cx: &Ctx, dev: u32) -> Option<u64> {
    let tele =
        cx.m.telemetry()
            .iter()
            .filter(|s| s.device == dev)
            .flat_map(|s| s.samples().filter_map(|x| x.mem_total).collect::<Vec<_>>())
            .max();
    tele.or_else(|| {
        cx.m.header()?
            .gpus
            .iter()
            .find(|g| g.index == dev && g.total_mem_bytes > 0)
            .map(|g| g.total_mem_bytes)
    })
}

/// ns from the session's first record to `ts` (negative before it).
pub fn offset_ns(cx: &Ctx, ts: u64) -> i64 {
    (ts as i128 - cx.m.time_range().0 as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}
