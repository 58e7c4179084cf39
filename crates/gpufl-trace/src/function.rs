//! The `function` record: what a loaded module's cubin says about one GPU function.

use crate::ids::StrId;
use serde::{Deserialize, Serialize};

/// One GPU function of a loaded module, written once per function and module when the module is
/// loaded. Sizes come from the module's cubin (`.nv.info` attributes), not from CUPTI: CUDA's
/// `localMemoryPerThread` (the kernel record's `local_mem`) leaves the ABI stack frame out, and
/// that frame is where current compilers put register spills.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Function {
    /// Demangled function name: the same string id as `kernel.name` of its launches.
    pub name: StrId,
    /// CUPTI module id of the module the function was loaded with.
    pub module: u32,
    /// The function's own stack frame per thread, bytes (`EIATTR_FRAME_SIZE`: what ptxas reports
    /// as "N bytes stack frame"): register spills and local arrays of the function itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<u32>,
    /// Stack per thread the function needs with its callees, bytes (`EIATTR_MAX_STACK_SIZE`:
    /// its frame plus the deepest chain of callee frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
    /// Where the function's source is, when the recorder found it: compiler-generated kernels
    /// (Triton kernels that PyTorch Inductor generated) in the compiler's cache. Such a record may
    /// come without sizes (`module` 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<FunctionSource>,
}

/// A generated kernel's source: the file and line of its definition, and what the compiler says
/// it was generated from (Inductor's "Topologically Sorted Source Nodes … Original ATen …"
/// comment), all as recorded on the machine that ran the program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FunctionSource {
    pub file: StrId,
    pub line: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<StrId>,
}
