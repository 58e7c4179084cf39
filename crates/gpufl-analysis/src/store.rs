//! Storage building blocks of the [`Model`](crate::Model): a chunked column (append-only, no
//! reallocation of filled chunks, so loading never holds two copies of a large column) and the map
//! from a trace file's local ids to the model's global ids.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

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
    #[cfg(test)]
    pub(crate) fn extend_from_slice(&mut self, v: &[T]) {
        self.extend_with(v, || Vec::with_capacity(CHUNK));
    }

    /// Append `v` as `extend_from_slice` does, its whole chunks after the first taken from
    /// `spares` while it has some (their pages already touched by another thread): the same
    /// chunks, the same elements.
    pub(crate) fn extend_spared(&mut self, v: &[T], spares: &Spares)
    where
        T: Spare,
    {
        self.extend_with(v, || {
            spares
                .take::<T>()
                .unwrap_or_else(|| Vec::with_capacity(CHUNK))
        });
    }

    /// Append `v`; `whole` gives an empty chunk of capacity [`CHUNK`] after the first.
    fn extend_with(&mut self, mut v: &[T], mut whole: impl FnMut() -> Vec<T>) {
        self.len += v.len();
        while !v.is_empty() {
            let c = match self.chunks.last_mut() {
                Some(c) if c.len() < CHUNK => c,
                _ => {
                    let c = if self.chunks.is_empty() {
                        Vec::with_capacity(v.len().clamp(16, CHUNK))
                    } else {
                        whole()
                    };
                    self.chunks.push(c);
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

/// Most spare chunks of each element type held at once (8 MiB of `u64`, `u32` or `u8` chunks
/// each; the element types of the model's columns).
const SPARE_BYTES: usize = 8 << 20;

/// Bytes of the element types of [`SpareLists`].
const SIZES: [usize; 3] = [8, 4, 1];

/// Empty chunks of full capacity, their pages touched (faulted in) by the threads that made them:
/// the reader's workers make them while they fold, so that the caller's join of their parts
/// into the model's columns is a copy into memory already mapped instead of a page fault every 4
/// KiB (most of the join's time before). A heuristic only: the columns are the same with or
/// without them; a column takes a chunk here when there is one, else allocates it.
#[derive(Default)]
pub(crate) struct Spares {
    lists: Mutex<SpareLists>,
}

/// The spare chunks of each element type, and the elements parts brought for which no chunk was
/// made yet.
#[derive(Default)]
pub(crate) struct SpareLists {
    u64s: Vec<Vec<u64>>,
    u32s: Vec<Vec<u32>>,
    u8s: Vec<Vec<u8>>,
    owed: [usize; 3],
    #[cfg(test)]
    /// Chunks taken (for the tests).
    pub(crate) taken: usize,
}

/// An element type of the model's columns (`u64`, `u32`, `u8`).
pub(crate) trait Spare: Copy + Default {
    /// Index of the type in [`SpareLists::owed`].
    const KIND: usize;
    fn list(l: &mut SpareLists) -> &mut Vec<Vec<Self>>;
}

impl Spare for u64 {
    const KIND: usize = 0;
    fn list(l: &mut SpareLists) -> &mut Vec<Vec<u64>> {
        &mut l.u64s
    }
}

impl Spare for u32 {
    const KIND: usize = 1;
    fn list(l: &mut SpareLists) -> &mut Vec<Vec<u32>> {
        &mut l.u32s
    }
}

impl Spare for u8 {
    const KIND: usize = 2;
    fn list(l: &mut SpareLists) -> &mut Vec<Vec<u8>> {
        &mut l.u8s
    }
}

#[cfg(test)]
impl SpareLists {
    pub(crate) fn u64s_len(&self) -> usize {
        self.u64s.len()
    }
}

impl Spares {
    pub(crate) fn lock(&self) -> MutexGuard<'_, SpareLists> {
        // Nothing is left half-done behind the lock.
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A spare chunk; else a chunk the column allocates itself is taken off what is owed.
    fn take<T: Spare>(&self) -> Option<Vec<T>> {
        let mut l = self.lock();
        let c = T::list(&mut l).pop();
        if c.is_none() {
            l.owed[T::KIND] = l.owed[T::KIND].saturating_sub(CHUNK);
        }
        #[cfg(test)]
        if c.is_some() {
            l.taken += 1;
        }
        c
    }

    /// A part of `elems` `u64`, `u32` and `u8` elements is to be joined: on a worker (`make`),
    /// make the chunks they and the parts before them will fill (as many as whole chunks' worth
    /// of elements were brought so far and not allocated by the columns themselves), within
    /// [`SPARE_BYTES`] per type; on the caller's thread, only count them (a worker makes them).
    pub(crate) fn provide(&self, elems: [usize; 3], make: bool) {
        let mut todo = [0; 3];
        {
            let mut l = self.lock();
            let held = [l.u64s.len(), l.u32s.len(), l.u8s.len()];
            for t in 0..3 {
                let cap = SPARE_BYTES / (CHUNK * SIZES[t]);
                // Past the bound, what is owed is forgotten (those chunks are allocated as they
                // are needed).
                l.owed[t] = (l.owed[t] + elems[t]).min(cap * CHUNK);
                if make {
                    todo[t] = (l.owed[t] / CHUNK).min(cap.saturating_sub(held[t]));
                    l.owed[t] -= todo[t] * CHUNK;
                }
            }
        }
        if todo == [0; 3] {
            return;
        }
        let (a, b, c) = (touched::<u64>(todo[0]), touched(todo[1]), touched(todo[2]));
        let mut l = self.lock();
        l.u64s.extend(a);
        l.u32s.extend(b);
        l.u8s.extend(c);
    }

    /// Drop the chunks left.
    pub(crate) fn clear(&self) {
        let mut l = self.lock();
        *l = SpareLists {
            #[cfg(test)]
            taken: l.taken,
            ..SpareLists::default()
        };
    }
}

/// `n` empty chunks of capacity [`CHUNK`], an element written in each of their pages.
fn touched<T: Spare>(n: usize) -> Vec<Vec<T>> {
    let step = (4096 / std::mem::size_of::<T>()).max(1);
    (0..n)
        .map(|_| {
            let mut c = Vec::<T>::with_capacity(CHUNK);
            for e in c.spare_capacity_mut().iter_mut().step_by(step) {
                e.write(T::default());
            }
            std::hint::black_box(c)
        })
        .collect()
}

/// "No value" for optional `u32` columns and unmapped ids. Outside the model's storage, "no stack"
/// is an `Option` of a [`StackIx`](crate::StackIx) (see [`crate::ids`]), not this value.
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
    fn col_extend_spared_is_extend() {
        let spares = Spares::default();
        // A part's worth of elements: chunks of every type made, within the bound.
        // Counted on the caller's thread, made on a worker.
        spares.provide([CHUNK * 2, 0, 0], false);
        assert!(spares.lock().u64s.is_empty());
        spares.provide([CHUNK + 5, CHUNK * 1000, CHUNK], true);
        {
            let l = spares.lock();
            assert_eq!((l.u64s.len(), l.u8s.len()), (3, 1));
            assert_eq!(l.u32s.len(), SPARE_BYTES / (CHUNK * 4));
            assert_eq!(l.owed, [5, 0, 0]);
            assert!(l.u64s.iter().all(|c| c.is_empty() && c.capacity() == CHUNK));
        }
        let mut a = Col::default();
        let mut b = Col::default();
        let mut i = 0u64;
        for n in [3usize, 40_000, 1, CHUNK, 70_000, 0, 5, CHUNK * 2 + 9] {
            let v: Vec<u64> = (i..i + n as u64).collect();
            i += n as u64;
            a.extend_spared(&v, &spares);
            b.extend_from_slice(&v);
        }
        assert_eq!(a.len(), b.len());
        assert!(a.iter().eq(b.iter()));
        assert!(a.chunks().map(|c| c.len()).eq(b.chunks().map(|c| c.len())));
        assert_eq!(a.heap_bytes(), b.heap_bytes());
        // Every whole chunk after the first came from the spares while there were some.
        assert_eq!(spares.lock().taken, 3);
        assert!(spares.lock().u64s.is_empty());
        spares.clear();
        assert_eq!(spares.lock().u32s.len(), 0);
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
