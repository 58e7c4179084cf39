//! The paths of earlier versions, kept for the crates that name them: the contract is
//! [`crate::insight`], the rules and their table [`crate::rules`], the machinery they share
//! `crate::shared` (the CUDA graph summary and the attribution here).

pub use crate::insight::{fmt_duration, short_function, Inferred, Insight, Severity};
pub use crate::rules::RuleData;
pub use crate::rules::{collective_wait, torch_compile};
pub use crate::shared::{attribution, graphs};
