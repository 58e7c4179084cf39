//! The per-line documents ingest stores and the line pages read: `lines` (gpufl-analysis's line
//! details, at most 500, each with `stack_ref`, the index of its stack in `stacks`, instead of
//! the stack itself) and `stacks` (each stack once, its frames as indexes into a table of frames,
//! each frame once, whose strings are indexes into a table of strings, each string once). A
//! hostile session whose 500 lines' stacks of 128 frames name the same long strings costs those
//! strings once, not 64,000 times; and the strings table is bounded in bytes
//! ([`MAX_STRINGS_BYTES`]): beyond it frames lose their strings (`cut` counts them).
//!
//! Documents of an older analysis (each line with its whole `stack`) read as they were.

use gpufl_analysis::frames::{first_shown_frame, FrameParts};
use gpufl_analysis::ids::StackIx;
use gpufl_analysis::lines::LineDetail;
use gpufl_analysis::Model;
use gpufl_trace::{FrameId, FrameKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;

/// Bytes of the strings the `stacks` document holds, at most.
pub const MAX_STRINGS_BYTES: usize = 4 << 20;

/// One frame as the API and the pages show it: gpufl-analysis's.
pub use gpufl_analysis::lines::StackFrame as Frame;

/// The `stacks` document.
#[derive(Serialize, Deserialize, Default, Debug)]
#[serde(default)]
pub struct Stacks {
    pub strings: Vec<String>,
    /// `[kind (0 native, 1 python), module, function, file, line, text]`: strings as their index
    /// + 1 (0: none), line 0: none.
    pub frames: Vec<[u32; 6]>,
    /// Frame indexes, innermost first.
    pub stacks: Vec<Vec<u32>>,
    /// Strings left out for the byte bound.
    pub cut: u64,
}

impl Stacks {
    /// The frames of stack `i` (none when out of range).
    pub fn frames_of(&self, i: usize) -> Vec<Frame> {
        let s = |n: u32| -> Option<String> {
            (n > 0)
                .then(|| self.strings.get(n as usize - 1).cloned())
                .flatten()
        };
        self.stacks
            .get(i)
            .map(|fs| {
                fs.iter()
                    .filter_map(|&f| self.frames.get(f as usize))
                    .map(|f| Frame {
                        kind: if f[0] == 1 { "python" } else { "native" }.into(),
                        module: s(f[1]),
                        function: s(f[2]),
                        file: s(f[3]),
                        line: (f[4] > 0).then_some(f[4]),
                        text: s(f[5]),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct Builder<'m> {
    stacks: Stacks,
    strings: HashMap<&'m str, u32>,
    frames: HashMap<FrameId, u32>,
    by_stack: HashMap<StackIx, usize>,
    bytes: usize,
}

impl<'m> Builder<'m> {
    fn string(&mut self, s: Option<&'m str>) -> u32 {
        let Some(s) = s else { return 0 };
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        if self.bytes + s.len() > MAX_STRINGS_BYTES {
            self.stacks.cut += 1;
            return 0;
        }
        self.bytes += s.len();
        self.stacks.strings.push(s.to_string());
        let i = self.stacks.strings.len() as u32;
        self.strings.insert(s, i);
        i
    }

    fn stack(&mut self, m: &'m Model, id: StackIx) -> usize {
        if let Some(&i) = self.by_stack.get(&id) {
            return i;
        }
        let mut fs = Vec::new();
        for &f in m
            .stack(id)
            .unwrap_or_default()
            .iter()
            .take(gpufl_analysis::lines::MAX_FRAMES)
        {
            if let Some(&i) = self.frames.get(&f) {
                fs.push(i);
                continue;
            }
            let Some(v) = m.frame(f) else { continue };
            let row = [
                u32::from(v.kind == FrameKind::Python),
                self.string(v.module),
                self.string(v.func),
                self.string(v.file),
                v.line.unwrap_or(0),
                self.string(v.text),
            ];
            self.stacks.frames.push(row);
            let i = self.stacks.frames.len() as u32 - 1;
            self.frames.insert(f, i);
            fs.push(i);
        }
        self.stacks.stacks.push(fs);
        let i = self.stacks.stacks.len() - 1;
        self.by_stack.insert(id, i);
        i
    }
}

/// The `lines` and `stacks` documents (JSON) of a session's line details.
pub fn build(m: &Model, details: &[(LineDetail, Option<StackIx>)]) -> (String, String) {
    let mut b = Builder::default();
    let lines: Vec<Value> = details
        .iter()
        .map(|(d, s)| {
            let mut v = serde_json::to_value(d).unwrap_or(Value::Null);
            if let Some(o) = v.as_object_mut() {
                o.remove("stack");
                if let Some(s) = s {
                    o.insert("stack_ref".into(), Value::from(b.stack(m, *s)));
                }
            }
            v
        })
        .collect();
    (
        serde_json::to_string(&lines).unwrap_or_default(),
        serde_json::to_string(&b.stacks).unwrap_or_default(),
    )
}

/// A stack as the pages and the API show it: from its first shown frame, without the leading
/// frames of the recorder, CUPTI, the driver and the CUDA runtime's internals
/// ([`gpufl_analysis::frames::first_shown_frame`]; the documents keep every frame).
pub fn shown(mut frames: Vec<Frame>) -> Vec<Frame> {
    let from = first_shown_frame(frames.iter().map(FrameParts::from));
    frames.split_off(from)
}

/// The stack of a `lines` document's entry: its `stack_ref` resolved in `stacks`, or (a document
/// of an older analysis) its own `stack`.
pub fn stack_of(line: &Value, stacks: Option<&Stacks>) -> Vec<Frame> {
    if let (Some(i), Some(s)) = (line.get("stack_ref").and_then(Value::as_u64), stacks) {
        return s.frames_of(i as usize);
    }
    line.get("stack")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}
