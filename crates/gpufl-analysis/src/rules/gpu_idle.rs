//! Rule `gpu-idle`: the idle gaps of each device between its GPU work, classified by what the
//! host was doing ([`crate::shared::idle`]: gaps, classes, the line of each gap, one-off pauses),
//! one insight per user line.
//!
//! - **Insights:** one per user line (classes folded: its largest class names it). A line's gaps
//!   lose their *one-off pauses* first: from the longest down, each gap longer than all the line's
//!   shorter gaps together (the wait before the first step, a lazy module load, a checkpoint) is
//!   listed in the summary's top gaps but not in the insight. **Impact:** the remaining idle time.
//!   **Window:** the span from the line's first gap to its last, one-off pauses cut out (like
//!   in-loop-sync's loop span: startup does not grow with the run). **Fires** with at least
//!   [`MIN_GAPS`] gaps, an impact of at least 1 % of the devices' active ranges (less the one-off
//!   pauses) and of at least 5 % of the window for `launch`, 10 % for `sync` (the same calls are in
//!   sync-attribution, which counts the host's blocked time: this one only reports the GPU idle
//!   they cause when it is large) and 10 % for `other` (one insight for the whole session, no
//!   line).
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::ids::LocIx;
use crate::insight::{fmt_duration, in_function, share, Insight};
use crate::shared::host::{HostActivity, HostGap, Join};
use crate::shared::idle::{
    BlockedIndex, ClassFigures, Group, IdleClass, IdleScan, FIX_LAUNCH, FIX_OTHER, FIX_SYNC,
};
use crate::shared::timeline::{location_note, LocationSource, Locator};
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use serde::Serialize;
use std::cmp::Reverse;

pub(crate) const RULE: &str = "gpu-idle";
/// Fewest gaps (one-off pauses excluded) for a line's insight.
pub const MIN_GAPS: u64 = 3;
/// Least share (percent) of the window for an insight, per class.
const MIN_SHARE_PCT: [u64; 4] = [101, 5, 10, 10];
/// Least share (percent) of the devices' active ranges (less the line's one-off pauses) for an
/// insight: a few gaps in a short burst of a long session do not make one.
const MIN_ACTIVE_PCT: u64 = 1;

/// Idle time of one class at one line (in an insight's data).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassIdle {
    pub class: IdleClass,
    /// Gaps counted (one-off pauses excluded).
    pub gaps: u64,
    pub idle_ns: u64,
    /// One-off pauses left out.
    pub one_off_gaps: u64,
    pub one_off_ns: u64,
    /// The line's span for this class, one-off pauses cut out.
    pub window_ns: u64,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    /// The class with the most idle time at this line.
    pub class: IdleClass,
    pub gaps: u64,
    pub idle_ns: u64,
    /// Longest gap counted.
    pub largest_gap_ns: u64,
    /// The classes that fired at this line.
    pub classes: Vec<ClassIdle>,
    /// `sync` class: what blocked (a sync kind such as `StreamSynchronize`, or an API name such
    /// as `cudaMemcpy`).
    pub blocking_call: Option<String>,
    /// The least precise way a gap's line was found.
    pub location_source: LocationSource,
    /// What the host was doing during the gaps (sessions with `hostcall` or `hsample` records;
    /// absent without them): the join of `shared::host`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostActivity>,
    /// When the finding moved to the host line holding most of the gaps' time: the line of the
    /// work that ended the gaps (the line the finding has without host records).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ended_at: Option<SourceLoc>,
    /// A roll-up under one user call (sessions with host records): the library lines whose
    /// launches ended the gaps, most idle first (the finding is located at the user's call).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub library_lines: Vec<LibraryLine>,
    /// A roll-up over a loop the library runs under the user's call (the decode steps of
    /// `generate()`): its steps, and the host's time per step by line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<Steps>,
}

/// The steps of the loop under a roll-up's user call ([`crate::shared::steps`]: the
/// synchronization the loop makes once per step marks them).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Steps {
    pub count: u64,
    /// The synchronization that marks a step: its library line inside the user's call.
    pub site: SourceLoc,
    /// A step's length: the call's span (the roll-up's window) over the steps, ns.
    pub step_ns: u64,
    /// The roll-up's GPU idle per step, ns.
    pub idle_ns: u64,
    /// The host's time per step during the gaps, by line (library line ← the user's call), most
    /// first (at most [`STEP_LINES`]).
    pub lines: Vec<StepLine>,
}

/// One host line's time per step.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct StepLine {
    pub location: SourceLoc,
    pub ns: u64,
}

/// Host lines listed per step.
pub const STEP_LINES: usize = 8;

/// One library line of a roll-up under a user call: the gaps its launches ended.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct LibraryLine {
    pub location: SourceLoc,
    pub gaps: u64,
    pub idle_ns: u64,
}

/// Fewest library lines under one user call for a roll-up.
pub const MIN_ROLLUP_LINES: usize = 3;

/// Run the rule over the devices' idle gaps.
pub(crate) fn run(cx: &Ctx, idle: &IdleScan) -> Vec<Insight> {
    if idle.groups.is_empty() {
        return Vec::new();
    }
    let locator = Locator::new(cx);
    let (blocked, groups, active_ns) = (&idle.blocked, &idle.groups, idle.active_ns);
    let n = cx.locs.len() + 1;
    let mut out = Vec::new();
    for slot in 0..n {
        // The classes that fire at this line.
        let mut fired: Vec<(IdleClass, ClassFigures, &Group)> = Vec::new();
        for class in [IdleClass::Launch, IdleClass::Sync, IdleClass::Other] {
            let g = &groups[class.index() * n + slot];
            if g.gaps == 0 {
                continue;
            }
            let f = g.settle(cx.m);
            let pct = MIN_SHARE_PCT[class.index()];
            if f.gaps >= MIN_GAPS
                && f.idle_ns as u128 * 100 >= f.window_ns as u128 * pct as u128
                && f.idle_ns as u128 * 100
                    >= active_ns.saturating_sub(f.one_off_ns) as u128 * MIN_ACTIVE_PCT as u128
            {
                fired.push((class, f, g));
            }
        }
        if fired.is_empty() {
            continue;
        }
        fired.sort_by_key(|f| Reverse(f.1.idle_ns));
        let loc = (slot != n - 1).then(|| LocIx::at(slot));
        out.push(insight(cx, &locator, blocked, loc, &fired));
    }
    out.extend(rollups(cx, &locator, idle));
    out
}

/// With host records: the `launch` gaps ended by work that several library lines issued under one
/// user call (transformers' lines under `model.generate(...)`), as one finding at the user's call
/// with the join over all of them, so that the host's time under the call reads in one place.
fn rollups(cx: &Ctx, locator: &Locator, idle: &IdleScan) -> Vec<Insight> {
    let h = cx.host();
    if h.is_empty() {
        return Vec::new();
    }
    let n = cx.locs.len() + 1;
    // (the user call's file and line, its library lines with their launch gaps)
    type Lines<'g> = Vec<(LocIx, &'g Group)>;
    let mut by_call: Vec<((String, Option<u32>), Lines)> = Vec::new();
    for slot in 0..n - 1 {
        let l = LocIx::at(slot);
        let loc = cx.loc(l);
        if loc.library.is_none() || loc.is_unattributed() {
            continue;
        }
        let g = &idle.groups[IdleClass::Launch.index() * n + slot];
        if g.gaps == 0 {
            continue;
        }
        let key = (loc.file.clone(), loc.line);
        match by_call.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push((l, g)),
            None => by_call.push((key, vec![(l, g)])),
        }
    }
    let mut out = Vec::new();
    for (_, lines) in by_call {
        if lines.len() < MIN_ROLLUP_LINES {
            continue;
        }
        let mut gaps_host: Vec<HostGap> = Vec::new();
        let (mut gaps, mut idle_ns, mut one_off) = (0u64, 0u64, 0u64);
        let (mut first, mut last, mut largest) = (u64::MAX, 0u64, 0u64);
        let mut libs: Vec<LibraryLine> = Vec::new();
        for (l, g) in &lines {
            let f = g.settle(cx.m);
            gaps += f.gaps;
            idle_ns += f.idle_ns;
            one_off += f.one_off_ns;
            largest = largest.max(f.largest);
            first = first.min(g.first_start);
            last = last.max(g.last_end);
            gaps_host.extend(g.host_gaps(f.one_off_gaps).0);
            libs.push(LibraryLine {
                location: locator.source_loc(Some(*l)),
                gaps: f.gaps,
                idle_ns: f.idle_ns,
            });
        }
        let window = cx
            .gpu_span(first, last)
            .saturating_sub(one_off)
            .max(idle_ns);
        let pct = MIN_SHARE_PCT[IdleClass::Launch.index()];
        if gaps < MIN_GAPS
            || (idle_ns as u128 * 100) < window as u128 * pct as u128
            || (idle_ns as u128 * 100)
                < idle.active_ns.saturating_sub(one_off) as u128 * MIN_ACTIVE_PCT as u128
        {
            continue;
        }
        libs.sort_by_key(|k| Reverse(k.idle_ns));
        let j = h.explain(cx, locator, &gaps_host, None);
        let mut location = cx.loc(lines[0].0).clone();
        location.library = None;
        let call = location.short();
        let steps = loop_steps(cx, &location, &j, idle_ns, window);
        let top: Vec<String> = libs
            .iter()
            .take(3)
            .map(|k| {
                let at = k
                    .location
                    .library
                    .as_ref()
                    .map_or_else(|| k.location.short(), |lib| lib.user_short());
                format!("{at} {}", fmt_duration(k.idle_ns))
            })
            .collect();
        let doing = j
            .activity
            .overhead
            .as_ref()
            .map(|o| {
                format!(
                    "framework overhead {:.0}% over {} lines",
                    o.share * 100.0,
                    o.lines
                )
            })
            .or_else(|| j.activity.lines.first().map(|l| l.text()))
            .unwrap_or_else(|| "not seen".to_string());
        let title = format!(
            "GPU idle × {gaps} under {call} · {} before the launches of {} library lines; host: {doing} ({:.1}% of the call's span)",
            fmt_duration(idle_ns),
            libs.len(),
            share(idle_ns, window) * 100.0
        );
        let per_step = steps.as_ref().map_or_else(String::new, |st| {
            let top: Vec<String> = st
                .lines
                .iter()
                .take(3)
                .map(|l| format!("{} {}", l.location.short(), fmt_duration(l.ns)))
                .collect();
            format!(
                "; per step ({} steps, one sync at {}{} each): {}, the GPU idle {} of it; host per step: {}",
                st.count,
                st.site
                    .library
                    .as_ref()
                    .map_or_else(|| st.site.short(), |l| l.short()),
                st.site
                    .library
                    .as_ref()
                    .and_then(|l| l.function.as_deref())
                    .map(|f| format!(" in {}", crate::text::short_function(f)))
                    .unwrap_or_default(),
                fmt_duration(st.step_ns),
                fmt_duration(st.idle_ns),
                top.join(", ")
            )
        });
        let detail = format!(
            "{gaps} gaps ({} in all, longest {}) ended by work that {} library lines issued under the call at {call}{} \
             (most: {}); {}{per_step}",
            fmt_duration(idle_ns),
            fmt_duration(largest),
            libs.len(),
            in_function(&location),
            top.join(", "),
            j.activity.sentence("the launching thread")
        );
        let fix = j
            .fix(cx.program)
            .unwrap_or_else(|| cx.fix(&FIX_LAUNCH).to_string());
        out.push(
            Insight::new(RULE, location, title, detail, fix)
                .count(gaps)
                .impact(idle_ns, window, cx.wall_ns)
                .gpu_idle(idle_ns)
                .data(Data {
                    class: IdleClass::Launch,
                    gaps,
                    idle_ns,
                    largest_gap_ns: largest,
                    classes: Vec::new(),
                    blocking_call: None,
                    location_source: lines
                        .iter()
                        .filter_map(|(_, g)| g.src)
                        .max()
                        .unwrap_or(LocationSource::None),
                    host: Some(j.activity),
                    gap_ended_at: None,
                    library_lines: libs,
                    steps,
                }),
        );
    }
    out
}

/// The steps of the loop under the user's call at `call`, with the roll-up's idle and the join's
/// host lines divided over them.
fn loop_steps(cx: &Ctx, call: &SourceLoc, j: &Join, idle_ns: u64, window: u64) -> Option<Steps> {
    let st = crate::shared::steps::under_call(cx, &call.file, call.line)?;
    let n = st.count;
    let lines = j
        .by_loc
        .iter()
        .filter(|(l, _)| !cx.loc(*l).is_unattributed())
        .take(STEP_LINES)
        .map(|(l, ns)| StepLine {
            location: cx.loc(*l).clone(),
            ns: ns / n,
        })
        .collect();
    Some(Steps {
        count: n,
        site: cx.loc(st.loc).clone(),
        step_ns: window / n,
        idle_ns: idle_ns / n,
        lines,
    })
}

fn insight(
    cx: &Ctx,
    locator: &Locator,
    blocked: &BlockedIndex,
    loc: Option<LocIx>,
    fired: &[(IdleClass, ClassFigures, &Group)],
) -> Insight {
    let class = fired[0].0;
    let idle: u64 = fired.iter().map(|f| f.1.idle_ns).sum();
    let gaps: u64 = fired.iter().map(|f| f.1.gaps).sum();
    let window = fired
        .iter()
        .map(|f| f.1.window_ns)
        .max()
        .unwrap_or(0)
        .max(idle);
    let one_off_n: u64 = fired.iter().map(|f| f.1.one_off_gaps).sum();
    let one_off: u64 = fired.iter().map(|f| f.1.one_off_ns).sum();
    let largest = fired.iter().map(|f| f.1.largest).max().unwrap_or(0);
    let src = fired
        .iter()
        .filter_map(|f| f.2.src)
        .max()
        .unwrap_or(LocationSource::None);
    let blocking_call = fired
        .iter()
        .find(|f| f.0 == IdleClass::Sync)
        .and_then(|f| f.2.blocker)
        .map(|(_, b)| blocked.label(cx, b));
    let location = locator.source_loc(loc);
    let pct = share(idle, window) * 100.0;
    let at = if loc.is_none() {
        String::new()
    } else {
        format!(" @ {}", location.short())
    };
    let span = if loc.is_none() {
        "its span"
    } else {
        "the line's span"
    };
    let who = if class == IdleClass::Sync {
        "the blocked thread"
    } else {
        "the launching thread"
    };
    let host = host_join(cx, locator, loc, fired);
    let title = match class {
        IdleClass::Sync => format!(
            "GPU idle × {gaps}{at} · {} while the host was blocked in {} ({pct:.1}% of {span})",
            fmt_duration(idle),
            blocking_call.as_deref().unwrap_or("a sync"),
        ),
        IdleClass::Other => format!(
            "GPU idle × {gaps} · {} with work already queued ({pct:.1}% of its span)",
            fmt_duration(idle)
        ),
        _ => format!(
            "GPU idle × {gaps}{at} · {} waiting for the host to issue work ({pct:.1}% of {span})",
            fmt_duration(idle)
        ),
    };
    let what = match class {
        IdleClass::Sync => "the blocking copy",
        _ => "these calls",
    };
    let mut detail = match class {
        IdleClass::Sync => format!(
            "{gaps} gaps ({} in all, longest {}) while the thread that issued the next GPU work was blocked in {} at {}{}: \
             the GPU was waiting on something other than its own work (a host callback, another device or process, a \
             pageable copy staged by the host); sync-attribution lists the same calls' host time",
            fmt_duration(idle),
            fmt_duration(largest),
            blocking_call.as_deref().unwrap_or("a sync"),
            location.short(),
            in_function(&location)
        ),
        IdleClass::Other => format!(
            "{gaps} gaps ({} in all, longest {}) that no host activity explains: the next work had already been issued \
             and no sync of its thread covered the gap",
            fmt_duration(idle),
            fmt_duration(largest)
        ),
        _ => format!(
            "{gaps} gaps ({} in all, longest {}) ended by work issued at {}{}: the host called it only after the GPU \
             had run out of work (slow launches, CPU work or a sync before the call)",
            fmt_duration(idle),
            fmt_duration(largest),
            location.short(),
            in_function(&location)
        ),
    };
    if fired.len() > 1 {
        let parts: Vec<String> = fired
            .iter()
            .map(|f| format!("{:?} {}", f.0, fmt_duration(f.1.idle_ns)).to_lowercase())
            .collect();
        detail += &format!(" (by class: {})", parts.join(", "));
    }
    if one_off_n > 0 {
        detail += &format!(
            "; {one_off_n} one-off pause{} ({}, e.g. startup) left out",
            if one_off_n == 1 { "" } else { "s" },
            fmt_duration(one_off)
        );
    }
    if loc.is_some() || class != IdleClass::Other {
        detail += &location_note(src, what);
    }
    let fix = match class {
        IdleClass::Sync => &FIX_SYNC,
        IdleClass::Other => &FIX_OTHER,
        _ => &FIX_LAUNCH,
    };
    let mut fix = cx.fix(fix).to_string();
    let (mut location, mut title, mut gap_ended_at) = (location, title, None);
    if let Some((j, off)) = &host {
        detail += &format!("; {}", j.activity.sentence(who));
        if let Some(o) = off {
            detail += &format!("; {o}");
        }
        let doing = match (&j.line, j.compiling) {
            (Some(t), _) => Some((Some(t.loc), t.phrase.clone(), t.share)),
            (None, Some(c)) => Some((
                loc,
                c.label().to_string(),
                share(j.activity.compile_ns, j.activity.gap_ns),
            )),
            _ => None,
        };
        if let Some((hl, phrase, sh)) = doing {
            let new_loc = hl.map_or_else(|| location.clone(), |l| locator.source_loc(l));
            let moved = hl.is_some() && hl != loc;
            let at = if hl.is_none() {
                String::new()
            } else {
                format!(" @ {}", new_loc.short())
            };
            title = format!(
                "GPU idle × {gaps}{at} · {} while {who} was {phrase} ({:.0}% of the gaps' time; {pct:.1}% of {span})",
                fmt_duration(idle),
                sh * 100.0
            );
            if moved {
                detail += &format!(
                    "; located at the host line that holds {:.0}% of the gaps' time, the gaps ended at {}",
                    sh * 100.0,
                    location.short()
                );
                gap_ended_at = Some(std::mem::replace(&mut location, new_loc));
            }
            if let Some(f) = j.fix(cx.program) {
                fix = f;
            }
        } else if let Some([a, b]) = &j.pair {
            title = format!(
                "GPU idle × {gaps}{at} · {} while {who} was {} @ {} ({:.0}%) and {} @ {} ({:.0}%; {pct:.1}% of {span})",
                fmt_duration(idle),
                a.1,
                locator.source_loc(a.0).short(),
                a.2 * 100.0,
                b.1,
                locator.source_loc(b.0).short(),
                b.2 * 100.0
            );
        }
    }
    Insight::new(RULE, location, title, detail, fix)
        .count(gaps)
        .impact(idle, window, cx.wall_ns)
        .gpu_idle(idle)
        .data(Data {
            class,
            gaps,
            idle_ns: idle,
            largest_gap_ns: largest,
            classes: fired
                .iter()
                .map(|f| ClassIdle {
                    class: f.0,
                    gaps: f.1.gaps,
                    idle_ns: f.1.idle_ns,
                    one_off_gaps: f.1.one_off_gaps,
                    one_off_ns: f.1.one_off_ns,
                    window_ns: f.1.window_ns,
                })
                .collect(),
            blocking_call,
            location_source: src,
            host: host.map(|(j, _)| j.activity),
            gap_ended_at,
            library_lines: Vec::new(),
            steps: None,
        })
}

/// The join of the fired classes' gaps with the host (None without host records), and a note on
/// the one-off pauses left out when compilation held them.
fn host_join(
    cx: &Ctx,
    locator: &Locator,
    loc: Option<LocIx>,
    fired: &[(IdleClass, ClassFigures, &Group)],
) -> Option<(Join, Option<String>)> {
    let h = cx.host();
    if h.is_empty() {
        return None;
    }
    let (mut gaps, mut off): (Vec<HostGap>, Vec<HostGap>) = (Vec::new(), Vec::new());
    for f in fired {
        let (g, o) = f.2.host_gaps(f.1.one_off_gaps);
        gaps.extend(g);
        off.extend(o);
    }
    let join = h.explain(cx, locator, &gaps, loc);
    let note = (!off.is_empty())
        .then(|| h.explain(cx, locator, &off, loc))
        .and_then(|o| {
            let c = o.compiling?;
            let at = o
                .line
                .map(|t| format!(" at {}", locator.source_loc(t.loc).short()))
                .unwrap_or_default();
            Some(format!(
                "the one-off pause{} left out {} {}{at} ({:.0}% of {})",
                if off.len() == 1 { "" } else { "s" },
                if off.len() == 1 { "was" } else { "were" },
                c.label(),
                share(o.activity.compile_ns, o.activity.gap_ns) * 100.0,
                fmt_duration(o.activity.gap_ns)
            ))
        });
    Some((join, note))
}
