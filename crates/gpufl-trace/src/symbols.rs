//! Reader-side tables of interned records, filled as records stream by.

use crate::ids::{FrameId, StackId, StrId};
use crate::records::{Frame, Record};

/// Strings, frames and stacks seen so far in a session.
#[derive(Debug, Default, Clone)]
pub struct Symbols {
    strings: Vec<Option<String>>,
    frames: Vec<Option<Frame>>,
    stacks: Vec<Option<Vec<FrameId>>>,
}

fn put<T>(v: &mut Vec<Option<T>>, idx: usize, val: T) {
    if v.len() <= idx {
        v.resize_with(idx + 1, || None);
    }
    v[idx] = Some(val);
}

impl Symbols {
    /// Absorb an interned record; returns true if `rec` was one (str, frame or stack).
    pub fn observe(&mut self, rec: &Record) -> bool {
        match rec {
            Record::Str(s) => put(&mut self.strings, s.id.index(), s.s.clone()),
            Record::Frame(f) => put(&mut self.frames, f.id.index(), f.clone()),
            Record::Stack(s) => put(&mut self.stacks, s.id.index(), s.frames.clone()),
            _ => return false,
        }
        true
    }

    /// The string, or "?" if it was never defined (a corrupt or truncated trace).
    pub fn str(&self, id: StrId) -> &str {
        self.strings
            .get(id.index())
            .and_then(|s| s.as_deref())
            .unwrap_or("?")
    }

    /// An optional string id resolved.
    pub fn opt_str(&self, id: Option<StrId>) -> Option<&str> {
        id.map(|id| self.str(id))
    }

    pub fn frame(&self, id: FrameId) -> Option<&Frame> {
        self.frames.get(id.index()).and_then(|f| f.as_ref())
    }

    /// Frame ids of a stack, innermost first.
    pub fn stack(&self, id: StackId) -> Option<&[FrameId]> {
        self.stacks.get(id.index()).and_then(|s| s.as_deref())
    }

    /// "function (file:line)" or "function [module+0xoff]" for display.
    pub fn describe_frame(&self, id: FrameId) -> String {
        let Some(f) = self.frame(id) else {
            return format!("<unknown frame {}>", id.0);
        };
        let func = self.opt_str(f.func).unwrap_or("??");
        match (self.opt_str(f.file), f.line) {
            (Some(file), Some(line)) => format!("{func} ({file}:{line})"),
            _ => {
                let module = self.opt_str(f.module).unwrap_or("?");
                let module = module.rsplit('/').next().unwrap_or(module);
                format!("{func} [{module}+{:#x}]", f.offset.unwrap_or(0))
            }
        }
    }
}
