//! What happened at each user source line: its synchronizations (count, time blocked, the
//! distribution of their durations), its copies, the kernels launched from it (from the launches
//! whose call site was recorded) and one whole stack — the longest synchronization's, else a
//! copy's or a launch's. The line detail of the server's API and the dashboard.

use crate::ids::StackIx;
use crate::userframe::{user_frame, SourceLoc};
use crate::{Config, Model};
use gpufl_trace::FrameKind;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Lines kept, at most (the most time blocked or on the GPU first).
pub const MAX_LINES: usize = 500;
/// Kernels listed per line, at most (the most GPU time first).
pub const MAX_KERNELS: usize = 20;
/// Frames of a line's stack, at most (innermost first).
pub const MAX_FRAMES: usize = 128;

/// One frame of a stack, its strings resolved (also what the server's stored documents hold and
/// its pages read back: `Deserialize`, missing fields empty).
#[derive(Serialize, Deserialize, Default, Clone, Debug, PartialEq)]
#[serde(default)]
pub struct StackFrame {
    /// `native` or `python`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// A kernel launched from the line.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct LineKernel {
    pub name: String,
    /// Launches whose call site is this line (in default mode a sample of the launches).
    pub launches: u64,
    /// Their summed GPU time, ns.
    pub total_ns: u64,
}

/// One user line.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct LineDetail {
    pub location: SourceLoc,
    pub syncs: u64,
    /// Host time blocked in them, ns (StreamWaitEvent excluded, as in the totals).
    pub sync_blocked_ns: u64,
    /// Median, 99th percentile (nearest rank) and longest synchronization, ns.
    pub sync_p50_ns: u64,
    pub sync_p99_ns: u64,
    pub sync_max_ns: u64,
    /// The distribution of the synchronizations' durations ([`log4_us_hist`]): counts below
    /// 1 µs, then in 1–4 µs, 4–16 µs, … (trailing empty buckets left out; empty without syncs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sync_hist: Vec<u64>,
    /// Memcpys and memsets issued there (with a recorded call site), their GPU time and bytes.
    pub copies: u64,
    pub copy_ns: u64,
    pub copy_bytes: u64,
    /// Launches with a recorded call site at this line, and their kernels.
    pub launches: u64,
    pub kernels: Vec<LineKernel>,
    /// The stack of the longest synchronization there, else of a copy, else of a launch.
    pub stack: Vec<StackFrame>,
}

#[derive(Default)]
struct Acc {
    loc: Option<SourceLoc>,
    sync_ns: Vec<u64>,
    blocked: u64,
    copies: u64,
    copy_ns: u64,
    copy_bytes: u64,
    launches: u64,
    kernels: HashMap<u32, (u64, u64)>,
    /// (rank: 3 sync, 2 copy, 1 launch; its duration), the stack.
    best: Option<((u8, u64), StackIx)>,
}

impl Acc {
    fn offer(&mut self, rank: (u8, u64), s: StackIx) {
        if self.best.is_none_or(|(r, _)| rank > r) {
            self.best = Some((rank, s));
        }
    }
}

fn key(l: &SourceLoc) -> (String, u32, String, String) {
    (
        l.file.clone(),
        l.line.unwrap_or(0),
        l.function.clone().unwrap_or_default(),
        l.library
            .as_ref()
            .map(|b| format!("{}:{}", b.file, b.line.unwrap_or(0)))
            .unwrap_or_default(),
    )
}

/// The frames of a stack, innermost first, at most [`MAX_FRAMES`].
pub fn stack_frames(m: &Model, s: StackIx) -> Vec<StackFrame> {
    let Some(ids) = m.stack(s) else {
        return Vec::new();
    };
    ids.iter()
        .take(MAX_FRAMES)
        .filter_map(|&f| m.frame(f))
        .map(|f| StackFrame {
            kind: match f.kind {
                FrameKind::Python => "python",
                _ => "native",
            }
            .to_string(),
            module: f.module.map(str::to_string),
            function: f.func.map(str::to_string),
            file: f.file.map(str::to_string),
            line: f.line,
            text: f.text.map(str::to_string),
        })
        .collect()
}

type Accs = HashMap<(String, u32, String, String), Acc>;

/// The accumulator of the line a stack names (its user frame computed once per stack).
fn acc<'a>(
    m: &Model,
    cfg: &Config,
    locs: &mut HashMap<StackIx, SourceLoc>,
    accs: &'a mut Accs,
    s: StackIx,
) -> &'a mut Acc {
    let loc = locs
        .entry(s)
        .or_insert_with(|| user_frame(m, s, &cfg.filter));
    let a = accs.entry(key(loc)).or_default();
    if a.loc.is_none() {
        a.loc = Some(loc.clone());
    }
    a
}

/// Every user line with synchronizations, copies or sampled launches, most time first, at most
/// [`MAX_LINES`]. Records without a stack are left out (they name no line).
pub fn line_details(m: &Model, cfg: &Config) -> Vec<LineDetail> {
    line_details_by_stack(m, cfg)
        .into_iter()
        .map(|(mut d, s)| {
            d.stack = s.map(|s| stack_frames(m, s)).unwrap_or_default();
            d
        })
        .collect()
}

/// [`line_details`] with each line's stack left empty and its id given beside it (resolved by
/// [`stack_frames`]): for a consumer that keeps each stack once however many lines name it.
pub fn line_details_by_stack(m: &Model, cfg: &Config) -> Vec<(LineDetail, Option<StackIx>)> {
    let mut locs: HashMap<StackIx, SourceLoc> = HashMap::new();
    let mut accs: Accs = HashMap::new();
    for s in m.syncs() {
        let Some(st) = s.stack else { continue };
        let d = s.duration_ns();
        let a = acc(m, cfg, &mut locs, &mut accs, st);
        a.sync_ns.push(d);
        if s.kind.blocks_host() {
            a.blocked = a.blocked.saturating_add(d);
        }
        a.offer((3, d), st);
    }
    for c in m.copies() {
        let Some((st, _)) = c.corr.known().and_then(|c| m.callsite(c)) else {
            continue;
        };
        let d = c.end.saturating_sub(c.start);
        let a = acc(m, cfg, &mut locs, &mut accs, st);
        a.copies += 1;
        a.copy_ns = a.copy_ns.saturating_add(d);
        a.copy_bytes = a.copy_bytes.saturating_add(c.bytes);
        a.offer((2, d), st);
    }
    for k in m.kernels() {
        let Some((st, _)) = k.corr.known().and_then(|c| m.callsite(c)) else {
            continue;
        };
        let d = k.end.saturating_sub(k.start);
        let a = acc(m, cfg, &mut locs, &mut accs, st);
        a.launches += 1;
        let e = a.kernels.entry(k.name.0).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(d);
        a.offer((1, d), st);
    }
    let mut out: Vec<(u64, (LineDetail, Option<StackIx>))> = accs
        .into_values()
        .filter_map(|mut a| {
            a.sync_ns.sort_unstable();
            let n = a.sync_ns.len();
            let rank = |p: usize| -> u64 {
                if n == 0 {
                    0
                } else {
                    a.sync_ns[((p * n).div_ceil(100)).clamp(1, n) - 1]
                }
            };
            let mut kernels: Vec<LineKernel> = a
                .kernels
                .iter()
                .map(|(&name, &(launches, total_ns))| LineKernel {
                    name: m.str(gpufl_trace::StrId(name)).to_string(),
                    launches,
                    total_ns,
                })
                .collect();
            kernels.sort_by(|x, y| y.total_ns.cmp(&x.total_ns).then(x.name.cmp(&y.name)));
            kernels.truncate(MAX_KERNELS);
            let gpu: u64 = a.kernels.values().map(|v| v.1).sum::<u64>();
            let weight = a.blocked.saturating_add(a.copy_ns).saturating_add(gpu);
            let d = LineDetail {
                location: a.loc?,
                syncs: n as u64,
                sync_blocked_ns: a.blocked,
                sync_p50_ns: rank(50),
                sync_p99_ns: rank(99),
                sync_max_ns: a.sync_ns.last().copied().unwrap_or(0),
                sync_hist: log4_us_hist(&a.sync_ns),
                copies: a.copies,
                copy_ns: a.copy_ns,
                copy_bytes: a.copy_bytes,
                launches: a.launches,
                kernels,
                stack: Vec::new(),
            };
            Some((weight, (d, a.best.map(|(_, s)| s))))
        })
        .collect();
    out.sort_by(|x, y| {
        y.0.cmp(&x.0)
            .then_with(|| x.1 .0.location.file.cmp(&y.1 .0.location.file))
            .then_with(|| x.1 .0.location.line.cmp(&y.1 .0.location.line))
    });
    out.truncate(MAX_LINES);
    out.into_iter().map(|(_, d)| d).collect()
}

/// Counts of durations (ns) in power-of-4 buckets from 1 µs: bucket 0 below 1 µs, bucket `i ≥ 1`
/// from `4^(i-1)` to `4^i` µs; trailing empty buckets left out (at most 24 buckets).
pub fn log4_us_hist(durations_ns: &[u64]) -> Vec<u64> {
    let mut n = vec![0u64; 24];
    for &d in durations_ns {
        let us = d / 1000;
        let b = if us == 0 {
            0
        } else {
            1 + (us.ilog2() / 2) as usize
        };
        n[b.min(23)] += 1;
    }
    while n.last() == Some(&0) {
        n.pop();
    }
    n
}

/// Files whose line texts [`source_texts`] keeps, at most.
pub const MAX_SOURCE_FILES: usize = 2000;
/// Lines kept per file, at most.
pub const MAX_SOURCE_LINES: usize = 200;
/// Lines kept in all, at most.
pub const MAX_SOURCE_TOTAL: usize = 20_000;
/// Characters kept of a line's text.
pub const MAX_SOURCE_TEXT: usize = 240;
/// Lines around a line of [`LineDetail`] that [`source_texts`] keeps first.
pub const SOURCE_CONTEXT: u32 = 12;

/// The texts of a file's lines that the recorder stored.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct SourceFile {
    pub file: String,
    /// `(line, text)`, line increasing.
    pub lines: Vec<(u32, String)>,
}

/// Every (file, line) with a text among the session's frames (all frames of all stacks, each
/// line once, the first frame's text), per file — what the line detail shows around a line.
/// Bounded: [`MAX_SOURCE_FILES`] files, [`MAX_SOURCE_LINES`] lines each, [`MAX_SOURCE_TOTAL`] in
/// all, texts cut to [`MAX_SOURCE_TEXT`] characters. The files of `focus` (line details, most
/// time first) come first, and in them the lines within [`SOURCE_CONTEXT`] of a focus line; then
/// the other files by name, their first lines.
pub fn source_texts(m: &Model, focus: &[LineDetail]) -> Vec<SourceFile> {
    let none = crate::store::NONE;
    let mut by_file: HashMap<&str, BTreeMap<u32, &str>> = HashMap::new();
    for f in m.frames.iter().flatten() {
        if f.text == none || f.file == none || f.line == none {
            continue;
        }
        let file = m.str(gpufl_trace::StrId(f.file));
        let text = m.str(gpufl_trace::StrId(f.text));
        by_file
            .entry(file)
            .or_default()
            .entry(f.line)
            .or_insert(text);
    }
    // Focus lines per file, files in focus order.
    let mut order: Vec<&str> = Vec::new();
    let mut hits: HashMap<&str, Vec<u32>> = HashMap::new();
    for d in focus {
        let (Some(line), Some(file)) = (
            d.location.line,
            by_file.get_key_value(d.location.file.as_str()),
        ) else {
            continue;
        };
        let e = hits.entry(*file.0).or_default();
        if e.is_empty() {
            order.push(file.0);
        }
        e.push(line);
    }
    let mut rest: Vec<&str> = by_file
        .keys()
        .filter(|f| !hits.contains_key(*f))
        .copied()
        .collect();
    rest.sort_unstable();
    order.extend(rest);
    let mut out = Vec::new();
    let mut total = 0usize;
    for file in order.into_iter().take(MAX_SOURCE_FILES) {
        let room = MAX_SOURCE_LINES.min(MAX_SOURCE_TOTAL - total);
        if room == 0 {
            break;
        }
        let lines = &by_file[file];
        let mut keep: Vec<u32> = if lines.len() <= room {
            lines.keys().copied().collect()
        } else {
            // Nearest a focus line first (ties: lower line), then the others in line order.
            let focus = hits.get(file).map(Vec::as_slice).unwrap_or(&[]);
            let dist = |l: u32| {
                focus
                    .iter()
                    .map(|&h| h.abs_diff(l))
                    .min()
                    .filter(|&d| d <= SOURCE_CONTEXT)
                    .unwrap_or(u32::MAX)
            };
            let mut all: Vec<(u32, u32)> = lines.keys().map(|&l| (dist(l), l)).collect();
            all.sort_unstable();
            all.truncate(room);
            let mut v: Vec<u32> = all.into_iter().map(|(_, l)| l).collect();
            v.sort_unstable();
            v
        };
        keep.truncate(room);
        total += keep.len();
        out.push(SourceFile {
            file: file.to_string(),
            lines: keep
                .into_iter()
                .map(|l| (l, lines[&l].chars().take(MAX_SOURCE_TEXT).collect()))
                .collect(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_durations_in_power_of_four_buckets_from_a_microsecond() {
        assert_eq!(log4_us_hist(&[]), Vec::<u64>::new());
        // 999 ns, 1 µs, 3.9 µs, 4 µs, 15 µs, 16 µs, 1 s (2^19.9 µs: bucket 10).
        let h = log4_us_hist(&[999, 1_000, 3_999, 4_000, 15_999, 16_000, 1_000_000_000]);
        assert_eq!(h, vec![1, 2, 2, 1, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(log4_us_hist(&[u64::MAX]).len(), 24);
        assert_eq!(log4_us_hist(&[0, 0]), vec![2]);
    }

    fn detail_at(file: &str, line: u32) -> LineDetail {
        LineDetail {
            location: SourceLoc {
                file: file.into(),
                line: Some(line),
                function: None,
                origin: crate::userframe::FrameOrigin::Python,
                text: None,
                library: None,
            },
            syncs: 0,
            sync_blocked_ns: 0,
            sync_p50_ns: 0,
            sync_p99_ns: 0,
            sync_max_ns: 0,
            sync_hist: Vec::new(),
            copies: 0,
            copy_ns: 0,
            copy_bytes: 0,
            launches: 0,
            kernels: Vec::new(),
            stack: Vec::new(),
        }
    }

    #[test]
    fn source_texts_of_every_frame_bounded_around_the_lines_that_matter() {
        use gpufl_trace::{Frame, FrameId, Record, StrId, StrRecord};
        let str_rec = |id: u32, s: String| Record::Str(StrRecord { id: StrId(id), s });
        // Strings: 0 big.py, 1 small.py, 2 a long text; 10.. the texts of big.py's lines.
        let mut recs = vec![
            str_rec(0, "/w/big.py".into()),
            str_rec(1, "/w/small.py".into()),
            str_rec(2, "x".repeat(1000)),
        ];
        let frame = |id: u32, file: u32, line: u32, text: Option<u32>| {
            Record::Frame(Frame {
                id: FrameId(id),
                kind: gpufl_trace::FrameKind::Python,
                module: None,
                offset: None,
                func: None,
                file: Some(StrId(file)),
                line: Some(line),
                inlined: false,
                text: text.map(StrId),
            })
        };
        for l in 1..=300u32 {
            recs.push(str_rec(10 + l, format!("line {l}")));
            recs.push(frame(l, 0, l, Some(10 + l)));
        }
        // The same line again (another frame): kept once, the first text.
        recs.push(frame(1000, 0, 5, Some(2)));
        // small.py: one line with a long text, one without text.
        recs.push(frame(1001, 1, 7, Some(2)));
        recs.push(frame(1002, 1, 8, None));
        let m = Model::load(recs);
        let got = source_texts(
            &m,
            &[detail_at("/w/big.py", 290), detail_at("/nowhere.py", 1)],
        );
        assert_eq!(got.len(), 2);
        let big = &got[0];
        assert_eq!(big.file, "/w/big.py");
        assert_eq!(big.lines.len(), MAX_SOURCE_LINES);
        let kept: Vec<u32> = big.lines.iter().map(|l| l.0).collect();
        assert!(kept.windows(2).all(|w| w[0] < w[1]));
        // Every line around the focus line, then the file's first lines.
        for l in 290 - SOURCE_CONTEXT..=300 {
            assert!(kept.contains(&l), "{l}");
        }
        assert!(kept.contains(&1) && !kept.contains(&250));
        assert_eq!(big.lines[4], (5, "line 5".to_string()));
        let small = &got[1];
        assert_eq!(small.file, "/w/small.py");
        assert_eq!(small.lines.len(), 1);
        assert_eq!(small.lines[0].0, 7);
        assert_eq!(small.lines[0].1.chars().count(), MAX_SOURCE_TEXT);
        // Without focus: files by name, their first lines.
        let got = source_texts(&m, &[]);
        assert_eq!(
            got[0].lines.last().map(|l| l.0),
            Some(MAX_SOURCE_LINES as u32)
        );
    }
}
