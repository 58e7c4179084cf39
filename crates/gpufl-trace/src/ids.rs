//! Typed ids of interned records. Each id is only meaningful within one session.

use serde::{Deserialize, Serialize};

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u32);

        impl $name {
            /// The id as an index into a dense table (ids are assigned 0, 1, 2, … in order of first use).
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
    };
}

typed_id!(
    /// Id of an interned string (`str` record).
    StrId
);
typed_id!(
    /// Id of an interned frame (`frame` record).
    FrameId
);
typed_id!(
    /// Id of an interned stack (`stack` record): a list of frame ids, innermost first.
    StackId
);
