//! Which correlation ids get a flow arrow, found in the first pass: a launch side (an `api` or
//! `callsite` record) and a GPU side (`kernel`, `memcpy`, `memset`) both present in the session.
//! Bits per correlation id in chunks of 65,536 ids, allocated on first use, at most
//! [`MAX_CHUNKS`] chunks (a session's correlation ids are dense from 1; ids in chunks beyond the
//! cap get no arrow, and the export says how many records lost theirs).

use std::collections::HashMap;

/// Chunks of 65,536 correlation ids (one byte each: 64 KiB a chunk); 1024 chunks cover ids up to
/// 67 M and cost at most 64 MiB.
pub const MAX_CHUNKS: usize = 1024;

const GPU: u8 = 1;
const API: u8 = 2;
const SITE: u8 = 4;
const SRC_DONE: u8 = 8;
const DST_DONE: u8 = 16;

/// Per-correlation-id bits of one session.
#[derive(Default)]
pub struct Links {
    chunks: HashMap<u16, Box<[u8]>>,
    /// Records whose correlation id fell in no chunk (the cap was reached).
    pub over_cap: u64,
}

/// The flow end a record is, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    None,
    Source,
    Target,
}

impl Links {
    fn slot(&mut self, corr: u32, create: bool) -> Option<&mut u8> {
        let hi = (corr >> 16) as u16;
        let lo = (corr & 0xffff) as usize;
        if !self.chunks.contains_key(&hi) {
            if !create || self.chunks.len() >= MAX_CHUNKS {
                return None;
            }
            self.chunks
                .insert(hi, vec![0u8; 1 << 16].into_boxed_slice());
        }
        self.chunks.get_mut(&hi).map(|c| &mut c[lo])
    }

    fn mark(&mut self, corr: u32, bit: u8) {
        match self.slot(corr, true) {
            Some(b) => *b |= bit,
            None => self.over_cap += 1,
        }
    }

    /// First pass: a kernel, copy or memset with this id.
    pub fn gpu(&mut self, corr: u32) {
        self.mark(corr, GPU)
    }
    /// First pass: an `api` record with this id.
    pub fn api(&mut self, corr: u32) {
        self.mark(corr, API)
    }
    /// First pass: a `callsite` record with this id.
    pub fn site(&mut self, corr: u32) {
        self.mark(corr, SITE)
    }

    /// Second pass: an `api` record. The first one of a launch whose GPU work exists is the flow's
    /// source.
    pub fn take_api(&mut self, corr: u32) -> End {
        match self.slot(corr, false) {
            Some(b) if *b & GPU != 0 && *b & API != 0 && *b & SRC_DONE == 0 => {
                *b |= SRC_DONE;
                End::Source
            }
            _ => End::None,
        }
    }

    /// Second pass: a `callsite` record: the source when the launch has no `api` record.
    pub fn take_site(&mut self, corr: u32) -> End {
        match self.slot(corr, false) {
            Some(b) if *b & GPU != 0 && *b & API == 0 && *b & SITE != 0 && *b & SRC_DONE == 0 => {
                *b |= SRC_DONE;
                End::Source
            }
            _ => End::None,
        }
    }

    /// Second pass: GPU work. The first record of a launch with a source is the flow's target
    /// (a graph launch's further kernels share its id and get no arrow).
    pub fn take_gpu(&mut self, corr: u32) -> End {
        match self.slot(corr, false) {
            Some(b) if *b & (API | SITE) != 0 && *b & GPU != 0 && *b & DST_DONE == 0 => {
                *b |= DST_DONE;
                End::Target
            }
            _ => End::None,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.chunks.len() << 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_one_target_per_launch() {
        let mut l = Links::default();
        l.gpu(7);
        l.gpu(7); // a graph launch: two kernels
        l.api(7);
        l.site(7);
        l.api(8); // no GPU work
        l.gpu(9); // no launch record
        assert_eq!(l.take_site(7), End::None, "the api record is the source");
        assert_eq!(l.take_api(7), End::Source);
        assert_eq!(l.take_api(7), End::None);
        assert_eq!(l.take_gpu(7), End::Target);
        assert_eq!(l.take_gpu(7), End::None);
        assert_eq!(l.take_api(8), End::None);
        assert_eq!(l.take_gpu(9), End::None);
        assert_eq!(l.take_gpu(12345678), End::None);
    }

    #[test]
    fn chunks_are_capped() {
        let mut l = Links::default();
        for i in 0..(MAX_CHUNKS as u32 + 10) {
            l.gpu(i << 16);
        }
        assert_eq!(l.over_cap, 10);
        assert!(l.bytes() <= MAX_CHUNKS << 16);
    }
}
