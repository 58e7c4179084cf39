//! Typed handles of the analysis: a CUDA correlation id ([`CorrId`]), a stack of the
//! [`Model`](crate::Model) ([`StackIx`]) and a user location of the analysis's context
//! ([`LocIx`]), instead of raw `u32`s.
//!
//! [`StackIx`] and [`LocIx`] are indices into tables of the analysis, not the trace's ids: a trace
//! file's `gpufl_trace::StackId` is that file's interned id, which the model maps to its own
//! [`StackIx`] (every file of a session restarts its ids at 0). Both are 4 bytes, and so is an
//! `Option` of either (the index is stored plus one, so that 0 is free for `None`): a column or
//! a vector of `Option<StackIx>` is as compact as one of `u32` with a sentinel. The model's columns
//! keep raw `u32`s with [`crate::store::NONE`] for "no stack" (their storage is shared with the
//! other `u32` columns'); [`StackIx::from_raw`] and [`StackIx::to_raw`] convert at the accessor.

use serde::{Serialize, Serializer};
use std::fmt;
use std::num::NonZeroU32;

/// A CUDA correlation id: joins an API call to the GPU work it issued and to its call site
/// (`callsite` record). CUPTI numbers API calls in issue order within a process; 0 means none was
/// recorded ([`CorrId::known`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct CorrId(pub u32);

impl CorrId {
    /// The id, or None for 0 (no correlation id recorded; CUPTI never assigns it).
    #[inline]
    pub fn known(self) -> Option<CorrId> {
        (self.0 != 0).then_some(self)
    }
}

macro_rules! index_handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(NonZeroU32);

        impl $name {
            /// The handle of entry `index` of its table; None for `u32::MAX`, which no table of
            /// the analysis reaches.
            #[inline]
            pub const fn new(index: u32) -> Option<$name> {
                match NonZeroU32::new(index.wrapping_add(1)) {
                    Some(n) => Some($name(n)),
                    None => None,
                }
            }

            /// The handle of entry `index` of a table the analysis built (fewer than `u32::MAX`
            /// entries: their memory would not fit any machine long before).
            #[inline]
            pub(crate) fn at(index: usize) -> $name {
                u32::try_from(index)
                    .ok()
                    .and_then($name::new)
                    .expect("an analysis table has fewer than u32::MAX entries")
            }

            /// The entry's index in its table.
            #[inline]
            pub const fn index(self) -> usize {
                (self.0.get() - 1) as usize
            }

            /// From a column's raw value: its index, or [`crate::store::NONE`] for none.
            #[inline]
            #[allow(dead_code)] // not every handle has a column
            pub(crate) const fn from_raw(raw: u32) -> Option<$name> {
                $name::new(raw)
            }

            /// A column's raw value of `h`: its index, or [`crate::store::NONE`] for none.
            #[inline]
            #[allow(dead_code)] // not every handle has a column
            pub(crate) const fn to_raw(h: Option<$name>) -> u32 {
                match h {
                    Some(h) => h.0.get() - 1,
                    None => crate::store::NONE,
                }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.index())
            }
        }

        /// As its index.
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_u32(self.index() as u32)
            }
        }
    };
}

index_handle!(
    /// A stack of the [`Model`](crate::Model): an index into its stack table (see
    /// [`Model::stack`](crate::Model::stack)), the same for every trace file of the session.
    StackIx
);

index_handle!(
    /// A user location of the analysis's context: an index into its distinct locations (one per
    /// distinct [`SourceLoc`](crate::SourceLoc) of the session's stacks).
    LocIx
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NONE;

    #[test]
    fn handles_are_four_bytes_and_round_trip_the_raw_column_value() {
        assert_eq!(std::mem::size_of::<Option<StackIx>>(), 4);
        assert_eq!(std::mem::size_of::<Option<LocIx>>(), 4);
        for i in [0u32, 1, 7, u32::MAX - 1] {
            let h = StackIx::from_raw(i).expect("an index");
            assert_eq!(h.index(), i as usize);
            assert_eq!(StackIx::to_raw(Some(h)), i);
        }
        assert_eq!(StackIx::from_raw(NONE), None);
        assert_eq!(LocIx::to_raw(None), NONE);
        // Handles order as their indices.
        assert!(LocIx::at(3) < LocIx::at(4));
        assert_eq!(format!("{:?}", LocIx::at(5)), "LocIx(5)");
        assert_eq!(serde_json::to_string(&StackIx::at(9)).unwrap(), "9");
        assert_eq!(CorrId(0).known(), None);
        assert_eq!(CorrId(4).known(), Some(CorrId(4)));
    }
}
