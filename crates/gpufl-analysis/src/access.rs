//! Reading a [`Model`]: its records as plain views, its interned strings, frames and stacks.

use crate::ids::{CorrId, StackIx};
use crate::model::Model;
use crate::store::NONE;
use crate::views::*;
use gpufl_trace::{FrameId, StrId, SyncKind};

impl Model {
    pub fn kernel(&self, i: usize) -> KernelRec {
        let c = &self.kernels;
        KernelRec {
            name: StrId(self.kernel_name_at(i)),
            start: c.start.get(i),
            end: c.end.get(i),
            dev: c.dev.get(i),
            ctx: c.ctx.get(i),
            stream: c.stream.get(i),
            corr: CorrId(c.corr.get(i)),
        }
    }

    /// Correlation id of kernel `i`.
    #[inline]
    pub(crate) fn kernel_corr(&self, i: usize) -> CorrId {
        CorrId(self.kernels.corr.get(i))
    }

    /// The kernels' correlation ids, in record order.
    pub(crate) fn kernel_corrs(&self) -> impl Iterator<Item = CorrId> + Clone + '_ {
        self.kernels.corr.iter().map(CorrId)
    }

    /// Correlation id of copy or memset `i`.
    #[inline]
    pub(crate) fn copy_corr(&self, i: usize) -> CorrId {
        CorrId(self.copies.corr.get(i))
    }

    /// Correlation id of synchronization `i`.
    #[inline]
    pub(crate) fn sync_corr(&self, i: usize) -> CorrId {
        CorrId(self.syncs.corr.get(i))
    }

    /// The stack of synchronization `i`, if one was captured.
    #[inline]
    pub(crate) fn sync_stack(&self, i: usize) -> Option<StackIx> {
        StackIx::from_raw(self.syncs.stack.get(i))
    }

    /// The synchronizations' stacks, in record order.
    pub(crate) fn sync_stacks(&self) -> impl Iterator<Item = Option<StackIx>> + Clone + '_ {
        self.syncs.stack.iter().map(StackIx::from_raw)
    }

    /// Correlation id of API call `i`.
    #[inline]
    pub(crate) fn api_corr(&self, i: usize) -> CorrId {
        CorrId(self.apis.corr.get(i))
    }

    /// The launch configuration of kernel `i` (as [`Model::kernel`] numbers them).
    pub fn kernel_config(&self, i: usize) -> LaunchConfig {
        self.configs[self.kernel_config_at(i) as usize]
    }

    /// Model string id of kernel `i`'s name.
    pub(crate) fn kernel_name_at(&self, i: usize) -> u32 {
        self.launches[self.kernels.launch.get(i) as usize].0
    }

    /// Index into `configs` of kernel `i`'s launch configuration.
    pub(crate) fn kernel_config_at(&self, i: usize) -> u32 {
        self.launches[self.kernels.launch.get(i) as usize].1
    }

    /// Model string ids of the kernels' names, in record order.
    pub(crate) fn kernel_names(&self) -> impl Iterator<Item = u32> + Clone + '_ {
        self.kernels
            .launch
            .iter()
            .map(|l| self.launches[l as usize].0)
    }

    /// Distinct launch configurations of the session's kernels.
    pub fn configs(&self) -> &[LaunchConfig] {
        &self.configs
    }

    pub fn copy(&self, i: usize) -> CopyRec {
        let c = &self.copies;
        CopyRec {
            op: copy_op_from(c.op.get(i), c.src.get(i), c.dst.get(i)),
            bytes: c.bytes.get(i),
            start: c.start.get(i),
            end: c.end.get(i),
            dev: c.dev.get(i),
            ctx: c.ctx.get(i),
            stream: c.stream.get(i),
            corr: CorrId(c.corr.get(i)),
        }
    }

    pub fn sync(&self, i: usize) -> SyncRec {
        let c = &self.syncs;
        let opt = |v: u32| (v != NONE).then_some(v);
        SyncRec {
            kind: sync_kind_from_u8(c.kind.get(i)),
            start: c.start.get(i),
            end: c.end.get(i),
            ctx: c.ctx.get(i),
            stream: opt(c.stream.get(i)),
            event: opt(c.event.get(i)),
            corr: CorrId(c.corr.get(i)),
            tid: Some(c.tid.get(i)).filter(|&t| t != u64::MAX),
            stack: StackIx::from_raw(c.stack.get(i)),
        }
    }

    pub fn api(&self, i: usize) -> ApiRec {
        let c = &self.apis;
        ApiRec {
            name: StrId(c.name.get(i)),
            cbid: c.cbid.get(i),
            start: c.start.get(i),
            end: c.end.get(i),
            tid: c.tid.get(i),
            corr: CorrId(c.corr.get(i)),
        }
    }

    /// `hostcall` record `i` (file order).
    pub fn hostcall(&self, i: usize) -> HostcallRec {
        let c = &self.hostcalls;
        let bytes = c.bytes.get(i);
        let ctx = c.ctx.get(i);
        HostcallRec {
            name: StrId(c.name.get(i)),
            start: c.start.get(i),
            end: c.end.get(i),
            tid: c.tid.get(i),
            corr: CorrId(c.corr.get(i)),
            ctx: (ctx != NONE).then_some(ctx),
            bytes: (bytes != u64::MAX).then_some(bytes),
            stack: StackIx::from_raw(c.stack.get(i)),
        }
    }

    /// `hostcall` records in the order they were read.
    pub fn hostcalls(&self) -> impl Iterator<Item = HostcallRec> + '_ {
        (0..self.hostcall_count()).map(|i| self.hostcall(i))
    }

    /// Host sample `i` (file order).
    pub fn hsample(&self, i: usize) -> HsampleRec {
        let c = &self.hsamples;
        let call = c.call.get(i);
        HsampleRec {
            ts: c.ts.get(i),
            tid: c.tid.get(i),
            state: host_state_from_u8(c.state.get(i)),
            period_ns: c.period.get(i),
            stack: StackIx::from_raw(c.stack.get(i)),
            call: (call != NONE).then_some(StrId(call)),
        }
    }

    /// Host samples in the order they were read.
    pub fn hsamples(&self) -> impl Iterator<Item = HsampleRec> + '_ {
        (0..self.hsample_count()).map(|i| self.hsample(i))
    }

    /// API calls in the order they were read.
    pub fn apis(&self) -> impl Iterator<Item = ApiRec> + '_ {
        (0..self.api_count() as usize).map(|i| self.api(i))
    }

    /// The stack captured at the API call with this correlation id (`callsite` records: copies,
    /// memsets, sampled launches), and the API's name.
    pub fn callsite(&self, corr: CorrId) -> Option<(StackIx, StrId)> {
        let i = self.callsites.partition_point(|c| c.corr < corr);
        self.callsites
            .get(i)
            .filter(|c| c.corr == corr)
            .map(|c| (c.stack, StrId(c.api)))
    }

    /// Kernels in the order they were read.
    pub fn kernels(&self) -> impl Iterator<Item = KernelRec> + '_ {
        (0..self.kernel_count()).map(|i| self.kernel(i))
    }
    /// Memcpys and memsets in the order they were read.
    pub fn copies(&self) -> impl Iterator<Item = CopyRec> + '_ {
        (0..self.copy_count()).map(|i| self.copy(i))
    }
    /// Synchronizations in the order they were read.
    pub fn syncs(&self) -> impl Iterator<Item = SyncRec> + '_ {
        (0..self.sync_count()).map(|i| self.sync(i))
    }

    /// A string of the model (ids of [`KernelRec::name`] and frames), `?` if never defined.
    pub fn str(&self, id: StrId) -> &str {
        self.strings
            .get(id.index())
            .and_then(|s| s.as_deref())
            .unwrap_or("?")
    }

    fn opt_str(&self, id: u32) -> Option<&str> {
        (id != NONE).then(|| self.str(StrId(id)))
    }

    /// Frame ids of a stack, innermost first; None if the stack was never defined.
    pub fn stack(&self, id: StackIx) -> Option<&[FrameId]> {
        self.stacks.get(id.index()).and_then(|s| s.as_deref())
    }

    /// Number of stacks (defined or only referenced).
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    /// Every stack (defined or only referenced), in index order.
    pub fn stack_ixs(&self) -> impl Iterator<Item = StackIx> + '_ {
        (0..self.stacks.len()).map(StackIx::at)
    }

    /// A frame with its strings resolved; None if it was never defined.
    pub fn frame(&self, id: FrameId) -> Option<FrameView<'_>> {
        let f = self.frames.get(id.index())?.as_ref()?;
        Some(FrameView {
            kind: f.kind,
            module: self.opt_str(f.module),
            offset: f.offset,
            func: self.opt_str(f.func),
            file: self.opt_str(f.file),
            line: (f.line != NONE).then_some(f.line),
            inlined: f.inlined,
            text: self.opt_str(f.text),
        })
    }

    /// The thread whose Python frames a stack carries, when the calling thread ran none
    /// (`stack.via_tid`: cross-thread Python attribution).
    pub fn stack_via(&self, id: StackIx) -> Option<u64> {
        self.stack_via.get(&id).copied()
    }

    /// Heap bytes held by the record columns (kernels, copies, syncs, API calls, call sites,
    /// hostcalls, host samples), capacity included.
    pub fn column_bytes(&self) -> usize {
        let k = &self.kernels;
        let c = &self.copies;
        let s = &self.syncs;
        k.start.heap_bytes()
            + k.end.heap_bytes()
            + k.corr.heap_bytes()
            + k.launch.heap_bytes()
            + k.stream.heap_bytes()
            + k.ctx.heap_bytes()
            + k.dev.heap_bytes()
            + c.start.heap_bytes()
            + c.end.heap_bytes()
            + c.bytes.heap_bytes()
            + c.corr.heap_bytes()
            + c.ctx.heap_bytes()
            + c.stream.heap_bytes()
            + c.dev.heap_bytes()
            + c.op.heap_bytes()
            + c.src.heap_bytes()
            + c.dst.heap_bytes()
            + s.start.heap_bytes()
            + s.end.heap_bytes()
            + s.tid.heap_bytes()
            + s.corr.heap_bytes()
            + s.ctx.heap_bytes()
            + s.stream.heap_bytes()
            + s.event.heap_bytes()
            + s.stack.heap_bytes()
            + s.kind.heap_bytes()
            + self.apis.start.heap_bytes()
            + self.apis.end.heap_bytes()
            + self.apis.tid.heap_bytes()
            + self.apis.corr.heap_bytes()
            + self.apis.name.heap_bytes()
            + self.apis.cbid.heap_bytes()
            + self.callsites.capacity() * std::mem::size_of::<crate::model::Callsite>()
            + self.host_column_bytes()
            + self.mems.capacity() * std::mem::size_of::<crate::model::MemRow>()
    }

    fn host_column_bytes(&self) -> usize {
        let h = &self.hostcalls;
        let s = &self.hsamples;
        h.start.heap_bytes()
            + h.end.heap_bytes()
            + h.tid.heap_bytes()
            + h.bytes.heap_bytes()
            + h.corr.heap_bytes()
            + h.name.heap_bytes()
            + h.ctx.heap_bytes()
            + h.stack.heap_bytes()
            + s.ts.heap_bytes()
            + s.tid.heap_bytes()
            + s.period.heap_bytes()
            + s.stack.heap_bytes()
            + s.call.heap_bytes()
            + s.state.heap_bytes()
    }

    pub(crate) fn sync_kind_at(&self, i: usize) -> SyncKind {
        sync_kind_from_u8(self.syncs.kind.get(i))
    }
}
