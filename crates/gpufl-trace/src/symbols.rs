//! Reader-side tables of interned records, filled as records stream by.

use crate::ids::{FrameId, StackId, StrId};
use crate::records::{Frame, Record};
use std::collections::HashMap;

/// Strings, frames and stacks seen so far in a session.
#[derive(Debug, Default, Clone)]
pub struct Symbols {
    strings: Table<String>,
    frames: Table<Frame>,
    stacks: Table<Vec<FrameId>>,
}

/// An id → value table that stays proportional to what it holds, whatever the ids: dense for the
/// ids a writer assigns (0, 1, 2, … in order), a hash map for ids far beyond the dense part (a
/// corrupt or hostile trace: one `str` record with id 4294967295 must not allocate 4 G slots).
#[derive(Debug, Clone)]
struct Table<T> {
    dense: Vec<Option<T>>,
    sparse: HashMap<u32, T>,
    /// Values put (an upper bound of those held).
    puts: usize,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            dense: Vec::new(),
            sparse: HashMap::new(),
            puts: 0,
        }
    }
}

impl<T> Table<T> {
    fn put(&mut self, id: u32, val: T) {
        let i = id as usize;
        self.puts += 1;
        if i < self.dense.len() {
            self.dense[i] = Some(val);
        } else if i <= self.puts * 2 + 4096 {
            // The dense part stays within twice the number of values put (plus a little), so
            // its size is bounded by the records read, whatever the ids.
            self.dense.resize_with(i + 1, || None);
            self.dense[i] = Some(val);
        } else {
            self.sparse.insert(id, val);
        }
    }

    fn get(&self, id: u32) -> Option<&T> {
        // An id put in the map before the dense part grew past it is still in the map.
        match self.dense.get(id as usize) {
            Some(Some(v)) => Some(v),
            _ => self.sparse.get(&id),
        }
    }
}

impl Symbols {
    /// Absorb an interned record; returns true if `rec` was one (str, frame or stack).
    pub fn observe(&mut self, rec: &Record) -> bool {
        match rec {
            Record::Str(s) => self.strings.put(s.id.0, s.s.clone()),
            Record::Frame(f) => self.frames.put(f.id.0, f.clone()),
            Record::Stack(s) => self.stacks.put(s.id.0, s.frames.clone()),
            _ => return false,
        }
        true
    }

    /// The string, or "?" if it was never defined (a corrupt or truncated trace).
    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id.0).map_or("?", |s| s.as_str())
    }

    /// An optional string id resolved.
    pub fn opt_str(&self, id: Option<StrId>) -> Option<&str> {
        id.map(|id| self.str(id))
    }

    pub fn frame(&self, id: FrameId) -> Option<&Frame> {
        self.frames.get(id.0)
    }

    /// Frame ids of a stack, innermost first.
    pub fn stack(&self, id: StackId) -> Option<&[FrameId]> {
        self.stacks.get(id.0).map(|s| s.as_slice())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::StrRecord;

    #[test]
    fn huge_ids_do_not_grow_a_dense_table() {
        let mut s = Symbols::default();
        let rec = |id: u32, t: &str| {
            Record::Str(StrRecord {
                id: StrId(id),
                s: t.into(),
            })
        };
        s.observe(&rec(u32::MAX, "last"));
        s.observe(&rec(200_000_000, "far"));
        s.observe(&rec(0, "first"));
        s.observe(&rec(3, "three"));
        assert!(s.strings.dense.len() < 10, "{}", s.strings.dense.len());
        assert_eq!(s.str(StrId(u32::MAX)), "last");
        assert_eq!(s.str(StrId(200_000_000)), "far");
        assert_eq!(s.str(StrId(0)), "first");
        assert_eq!(s.str(StrId(3)), "three");
        assert_eq!(s.str(StrId(1)), "?");
        // Ids the dense part grows past are still found.
        s.observe(&rec(5000, "mid"));
        s.observe(&rec(9000, "later"));
        assert_eq!(s.str(StrId(5000)), "mid");
        assert_eq!(s.str(StrId(9000)), "later");
        assert_eq!(s.str(StrId(u32::MAX)), "last");
        // Ids that each land just past the dense part cannot make it grow geometrically.
        let mut t = Symbols::default();
        let mut id = 0u64;
        for _ in 0..64 {
            id = id * 2 + 4096;
            if id > u32::MAX as u64 {
                break;
            }
            t.observe(&rec(id as u32, "x"));
        }
        assert!(
            t.strings.dense.len() <= 2 * 64 + 4097,
            "{}",
            t.strings.dense.len()
        );
    }
}
