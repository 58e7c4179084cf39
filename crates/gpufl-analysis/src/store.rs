//! Storage building blocks of the [`Model`](crate::Model): a chunked column (append-only, no
//! reallocation of filled chunks, so loading never holds two copies of a large column) and the map
//! from a trace file's local ids to the model's global ids.

use std::collections::HashMap;

/// Elements per chunk of a [`Col`]: 64 Ki (512 KiB for a `u64` column).
pub(crate) const CHUNK_BITS: u32 = 16;
const CHUNK: usize = 1 << CHUNK_BITS;

/// An append-only column stored in fixed-size chunks. The first chunk grows like a `Vec` (small
/// sessions stay small); every later chunk is allocated at its full size once, so the memory held is
/// the data plus at most one partly filled chunk, and a push never copies what is already stored.
#[derive(Debug, Clone)]
pub(crate) struct Col<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Col<T> {
    fn default() -> Self {
        Col {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Copy> Col<T> {
    #[inline]
    pub(crate) fn push(&mut self, v: T) {
        match self.chunks.last_mut() {
            Some(c) if c.len() < CHUNK => c.push(v),
            _ => {
                // The first chunk starts small; later ones are allocated whole.
                let cap = if self.chunks.is_empty() { 16 } else { CHUNK };
                let mut c = Vec::with_capacity(cap);
                c.push(v);
                self.chunks.push(c);
            }
        }
        self.len += 1;
    }

    /// Append `v`, chunk by chunk (the same chunks as pushing each element).
    pub(crate) fn extend_from_slice(&mut self, mut v: &[T]) {
        self.len += v.len();
        while !v.is_empty() {
            let c = match self.chunks.last_mut() {
                Some(c) if c.len() < CHUNK => c,
                _ => {
                    let cap = if self.chunks.is_empty() {
                        v.len().clamp(16, CHUNK)
                    } else {
                        CHUNK
                    };
                    self.chunks.push(Vec::with_capacity(cap));
                    self.chunks.last_mut().expect("just pushed")
                }
            };
            let take = (CHUNK - c.len()).min(v.len());
            if c.capacity() - c.len() < take {
                // Only the first chunk grows: as a Vec would, never past a whole chunk.
                let want = (c.capacity() * 2).max(c.len() + take).min(CHUNK);
                c.reserve_exact(want - c.len());
            }
            c.extend_from_slice(&v[..take]);
            v = &v[take..];
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, i: usize) -> T {
        self.chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = T> + Clone + '_ {
        self.chunks.iter().flat_map(|c| c.iter().copied())
    }

    /// Elements `a..b` (`a <= b <= len`).
    pub(crate) fn iter_range(&self, a: usize, b: usize) -> impl Iterator<Item = T> + Clone + '_ {
        let first = a >> CHUNK_BITS;
        let last = b.div_ceil(CHUNK).min(self.chunks.len());
        self.chunks[first.min(last)..last]
            .iter()
            .enumerate()
            .flat_map(move |(j, c)| {
                let base = (first + j) << CHUNK_BITS;
                let lo = a.saturating_sub(base).min(c.len());
                let hi = b.saturating_sub(base).min(c.len());
                c[lo..hi].iter().copied()
            })
    }

    /// The elements in their chunks, in order: columns of the same length have chunks of the
    /// same lengths (every chunk but the last is full).
    pub(crate) fn chunks(&self) -> impl Iterator<Item = &[T]> + '_ {
        self.chunks.iter().map(|c| c.as_slice())
    }

    /// Elements `a..b` (`a <= b <= len`) as slices, chunk by chunk: columns of the same length
    /// give slices of the same lengths.
    pub(crate) fn slices(&self, a: usize, b: usize) -> impl Iterator<Item = &[T]> + '_ {
        let first = a >> CHUNK_BITS;
        let last = b.div_ceil(CHUNK).min(self.chunks.len());
        self.chunks[first.min(last)..last]
            .iter()
            .enumerate()
            .map(move |(j, c)| {
                let base = (first + j) << CHUNK_BITS;
                let lo = a.saturating_sub(base).min(c.len());
                let hi = b.saturating_sub(base).min(c.len());
                &c[lo..hi]
            })
    }

    /// Chunk `c` (empty past the last): elements `c << CHUNK_BITS ..`.
    pub(crate) fn chunk(&self, c: usize) -> &[T] {
        self.chunks.get(c).map_or(&[], |c| c.as_slice())
    }

    /// Bytes of heap memory held (capacity, not length).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.capacity()).sum::<usize>() * std::mem::size_of::<T>()
            + self.chunks.capacity() * std::mem::size_of::<Vec<T>>()
    }
}

/// "No value" for optional `u32` columns and unmapped ids.
pub(crate) const NONE: u32 = u32::MAX;

/// Maps the ids of one trace file (each file of a session restarts its interning at 0) to the
/// model's global ids. Dense for the ids a writer produces (0, 1, 2, …); ids far beyond what was seen
/// (a corrupt or hostile trace) go to a hash map instead of growing a vector to their size.
#[derive(Debug, Default)]
pub(crate) struct IdMap {
    dense: Vec<u32>,
    sparse: HashMap<u32, u32>,
    /// Ids set (bounds the dense part: at most twice this, plus a little).
    sets: usize,
}

impl IdMap {
    pub(crate) fn get(&self, local: u32) -> Option<u32> {
        // An id set in the map before the dense part grew past it is still in the map.
        let g = match self.dense.get(local as usize) {
            Some(&g) if g != NONE => g,
            _ => *self.sparse.get(&local)?,
        };
        (g != NONE).then_some(g)
    }

    pub(crate) fn set(&mut self, local: u32, global: u32) {
        let i = local as usize;
        self.sets += 1;
        if i < self.dense.len() {
            self.dense[i] = global;
        } else if i <= self.sets * 2 + 4096 {
            self.dense.resize(i + 1, NONE);
            self.dense[i] = global;
        } else {
            self.sparse.insert(local, global);
        }
    }

    /// The global id of `local`, allocating one with `alloc` the first time (a forward reference, or
    /// the definition itself).
    pub(crate) fn get_or_alloc(&mut self, local: u32, alloc: impl FnOnce() -> u32) -> u32 {
        if let Some(g) = self.get(local) {
            return g;
        }
        let g = alloc();
        self.set(local, g);
        g
    }

    pub(crate) fn clear(&mut self) {
        self.dense.clear();
        self.sparse.clear();
        self.sets = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn col_spans_chunks_and_keeps_order() {
        let mut c = Col::default();
        let n = CHUNK * 2 + 17;
        for i in 0..n {
            c.push(i as u64);
        }
        assert_eq!(c.len(), n);
        assert_eq!(c.get(0), 0);
        assert_eq!(c.get(CHUNK), CHUNK as u64);
        assert_eq!(c.get(n - 1), (n - 1) as u64);
        assert!(c.iter().enumerate().all(|(i, v)| v == i as u64));
        // Data plus at most one partly filled chunk (and the chunk table).
        assert!(c.heap_bytes() <= (3 * CHUNK) * 8 + 1024);
    }

    #[test]
    fn col_extend_is_push_by_push() {
        let mut a = Col::default();
        let mut b = Col::default();
        let mut i = 0u64;
        for n in [3usize, 40_000, 1, CHUNK, 70_000, 0, 5] {
            let v: Vec<u64> = (i..i + n as u64).collect();
            i += n as u64;
            a.extend_from_slice(&v);
            for &x in &v {
                b.push(x);
            }
        }
        assert_eq!(a.len(), b.len());
        assert!(a.iter().eq(b.iter()));
        for (x, y) in [
            (0, 0),
            (0, 3),
            (2, 40_000),
            (65_000, 70_000),
            (0, a.len()),
            (a.len(), a.len()),
        ] {
            assert!(a.iter_range(x, y).eq((x..y).map(|i| i as u64)), "{x}..{y}");
        }
        assert!(a.chunks.iter().all(|c| c.capacity() <= CHUNK));
        assert!(a.heap_bytes() <= b.heap_bytes() + CHUNK * 8);
    }

    #[test]
    fn id_map_dense_sparse_and_forward_refs() {
        let mut m = IdMap::default();
        let mut next = 0;
        let mut alloc = || {
            next += 1;
            next - 1
        };
        assert_eq!(m.get_or_alloc(0, &mut alloc), 0);
        assert_eq!(m.get_or_alloc(2, &mut alloc), 1);
        assert_eq!(m.get_or_alloc(0, &mut alloc), 0);
        // A huge id does not grow the dense table.
        assert_eq!(m.get_or_alloc(4_000_000_000, &mut alloc), 2);
        assert!(m.dense.len() < 10);
        assert_eq!(m.get(4_000_000_000), Some(2));
        assert_eq!(m.get(1), None);
        // Ids each just past the dense part cannot grow it geometrically.
        let mut id: u64 = 4096;
        while id <= u32::MAX as u64 {
            m.get_or_alloc(id as u32, &mut alloc);
            id = id * 2 + 4096;
        }
        assert!(m.dense.len() <= 2 * 32 + 4097, "{}", m.dense.len());
        m.clear();
        assert_eq!(m.get(0), None);
    }
}
