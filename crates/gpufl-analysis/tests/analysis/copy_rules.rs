//! Tests of the streams-seed rules (see the module list in analysis.rs).

#[allow(unused_imports)]
use super::*;
