//! Rule `no-copy-compute-overlap` (being written: see docs/insights.md).

use super::{Ctx, Insight};
use serde::Serialize;

pub(crate) const RULE: &str = "no-copy-compute-overlap";

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, Default)]
pub struct Data {}

pub(crate) fn run(_cx: &Ctx) -> Vec<Insight> {
    let _ = RULE;
    Vec::new()
}
