//! Where CUDA graph nodes come from (`gnode` records): CUPTI's resource callbacks tell when a
//! node is created — inside the launch or copy a stream capture turns into the node, or inside
//! an explicit `cudaGraphAdd*Node` call, on the calling thread — and when one is cloned (graph
//! instantiation clones every node; the kernels a replay runs carry the clones' ids).
//!
//! A created node's stack is captured there, like a call site's (bounded: the first
//! [`MAX_CREATED`] nodes of a session; capture happens once per node, outside the replay loop;
//! nothing while the program has paused recording), and goes to the writer through the samples'
//! queue (a full queue drops it and counts it, as for call sites); a clone goes through
//! [`clone_queue`]. The stack capture is the call sites' (its Python frame cache may allocate on a
//! frame's first sighting); the rest neither allocates nor locks.

use crate::cupti::{cb_field, sys, Cupti};
use crate::stack::{self, Sample};
use crossbeam_queue::ArrayQueue;
use std::ffi::c_void;
use std::mem::offset_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Created nodes whose stack is captured, per session at most.
pub const MAX_CREATED: u64 = 200_000;

/// A node cloned from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cloned {
    pub graph: u32,
    pub node: u64,
    pub from_graph: u32,
    pub from_node: u64,
}

/// What the resource callbacks share with the writer (the module's one static).
struct GraphNodes {
    /// Clones seen by the callbacks ([`clone_queue`]).
    cloned: OnceLock<ArrayQueue<Cloned>>,
    /// Created nodes seen (their stacks captured up to [`MAX_CREATED`]).
    created: AtomicU64,
    /// Clones lost because the queue was full.
    dropped: AtomicU64,
}

static GRAPH_NODES: GraphNodes = GraphNodes {
    cloned: OnceLock::new(),
    created: AtomicU64::new(0),
    dropped: AtomicU64::new(0),
};

/// Clones seen by the callbacks, drained by the writer.
pub fn clone_queue() -> &'static ArrayQueue<Cloned> {
    GRAPH_NODES.cloned.get_or_init(|| ArrayQueue::new(1 << 15))
}

/// Clones lost since the last call (the queue was full).
pub fn take_dropped() -> u64 {
    GRAPH_NODES.dropped.swap(0, Ordering::Relaxed)
}

/// CUPTI's ids of a graph (0 when unknown) and a node (None when CUPTI cannot give it: the node
/// id is what joins GPU work to its node).
fn ids(c: &Cupti, graph: *mut c_void, node: *mut c_void) -> Option<(u32, u64)> {
    let fn_ = c.get_graph_node_id?;
    if node.is_null() {
        return None;
    }
    let mut n = 0u64;
    // SAFETY: CUPTI's own handle from the callback data, valid during the callback.
    if unsafe { fn_(node, &mut n) } != 0 {
        return None;
    }
    let mut g = 0u32;
    if let (Some(fg), false) = (c.get_graph_id, graph.is_null()) {
        // SAFETY: as above.
        if unsafe { fg(graph, &mut g) } != 0 {
            g = 0;
        }
    }
    Some((g, n))
}

/// `CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED` / `…_CLONED`.
///
/// # Safety
/// `data` must be the `CUpti_ResourceData` CUPTI passed with one of those callback ids.
pub unsafe fn on_graph_node(c: &Cupti, python: bool, cbid: u32, data: *const c_void) {
    type R = sys::CUpti_ResourceData;
    type G = sys::CUpti_GraphData;
    // SAFETY: field offsets of CUpti_ResourceData; for graph callbacks the descriptor is a
    // CUpti_GraphData (cudarc's bindings of cupti_callbacks.h).
    let desc: *const c_void = unsafe { cb_field(data, offset_of!(R, resourceDescriptor)) };
    if desc.is_null() {
        return;
    }
    let (graph, node): (*mut c_void, *mut c_void) = unsafe {
        (
            cb_field(desc, offset_of!(G, graph)),
            cb_field(desc, offset_of!(G, node)),
        )
    };
    let Some((g, n)) = ids(c, graph, node) else {
        return;
    };
    if cbid == crate::cupti::CBID_RESOURCE_GRAPHNODE_CLONED {
        let (og, on): (*mut c_void, *mut c_void) = unsafe {
            (
                cb_field(desc, offset_of!(G, originalGraph)),
                cb_field(desc, offset_of!(G, originalNode)),
            )
        };
        // The original graph may be unset: its id is then 0 (the node alone identifies it).
        let from = ids(c, og, on);
        if let Some((fg, fnode)) = from {
            let clone = Cloned {
                graph: g,
                node: n,
                from_graph: fg,
                from_node: fnode,
            };
            if clone_queue().push(clone).is_err() {
                GRAPH_NODES.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        return;
    }
    if crate::collection::is_paused()
        || GRAPH_NODES.created.fetch_add(1, Ordering::Relaxed) >= MAX_CREATED
    {
        return;
    }
    let mut s = Sample::empty();
    s.tid = crate::procinfo::gettid();
    s.has_stack = true;
    s.graph_node = Some((g, n));
    // Nodes are made once, while a graph is captured or built, not on the replay path: a native
    // program's walk gets a synchronization's bound (a call site's 5 µs cut the first, cold walks
    // short on the H100 machine, leaving the first captured node without a line). A Python
    // program's line comes from its Python frames.
    let purpose = if python {
        stack::Purpose::Site
    } else {
        stack::Purpose::Sync
    };
    stack::capture_for(&mut s, python, purpose);
    s.ts = c.timestamp();
    s.end = s.ts;
    stack::push(s);
}

#[cfg(test)]
mod tests {
    #[test]
    fn resource_ids_are_cuptis() {
        use crate::cupti::sys::CUpti_CallbackIdResource as R;
        assert_eq!(
            crate::cupti::CBID_RESOURCE_GRAPHNODE_CREATED,
            R::CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED as u32
        );
        assert_eq!(
            crate::cupti::CBID_RESOURCE_GRAPHNODE_CLONED,
            R::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED as u32
        );
    }
}
