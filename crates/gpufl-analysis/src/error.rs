//! Errors of the analysis crate. Loading and analysing never fail (odd input becomes warnings);
//! only configuration can be wrong.

/// A configuration error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnalysisError {
    /// An empty include or exclude pattern would match every frame.
    #[error("empty frame pattern: an empty --include/--exclude pattern would match every frame")]
    EmptyPattern,
}
