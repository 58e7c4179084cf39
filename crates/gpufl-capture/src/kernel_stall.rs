//! Stall reasons of a sampled launch (issue 19, part of `--kernel-detail`): CUPTI's PC Sampling
//! API, started just before one chosen launch and stopped after it, each sampled PC mapped to its
//! source line through the cubin's line table.
//!
//! What the probe (`scripts/probe/pcstartstop.cu`, H100, CUDA 13.0) showed, and this follows:
//! - PC sampling can be enabled on a context whose modules are already loaded, but then the
//!   first start takes ~0.3 s (0.7 s inside a launch callback); enabled as the context is created
//!   ([`prepare`], before its modules load; ~0.1 s) every start takes ~0.1 ms. With start/stop
//!   control an enabled but stopped context runs kernels at bare speed, so it stays enabled
//!   between samples. A stop takes 2–5 ms, reading 0.04–1.6 ms.
//! - Continuous mode leaves the kernel running at its own speed (kernel-serialized: 2.7 ms
//!   instead of 0.37); after the stop the samples are in the buffer given with the configuration.
//! - The concurrent-kernel activity records keep coming while PC sampling is enabled, but that
//!   kind cannot be turned on again while it is (`CUPTI_ERROR_NOT_COMPATIBLE`), and SASS metrics
//!   read 0 unless that kind is off: so a SASS-metrics sample (and a pause of collection) first
//!   disables PC sampling ([`disable`]).
//!
//! Only the chosen function's PCs are kept (in continuous mode kernels of other streams may be
//! sampled too). Stall reasons are CUPTI's names less `smsp__pcsamp_warps_issue_stalled_`; the
//! `…_not_issued` ones (a subset of the same samples) are left out.
//!
//! Every call here runs with kernel detail's busy flag set (its CUDA calls are hidden from the
//! recorder's callbacks).
use crate::cubin_lines::LineTable;
use crate::cupti::{self, sys, Cupti};
use crate::driver::Driver;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// Sampling period: 2^(PERIOD + 5) cycles (2^17: no samples dropped on the H100, ~22,000 in a
/// 0.35 ms kernel filling the GPU).
pub const PERIOD: u32 = 12;
/// PCs one buffer holds; more come through further reads.
const MAX_PCS: usize = 4096;
/// Reads after a stop at most (each up to [`MAX_PCS`] PCs).
const MAX_READS: usize = 16;
/// CUPTI's prefix of stall reason names.
const PREFIX: &str = "smsp__pcsamp_warps_issue_stalled_";

/// The PC Sampling API's entry points (absent from old CUPTI: then no stall reasons), from
/// CUPTI's table ([`Cupti::pc_sampling`]), and the driver's context calls ([`Driver`]).
pub struct PcApi {
    enable: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingEnableParams) -> u32,
    disable: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingDisableParams) -> u32,
    start: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingStartParams) -> u32,
    stop: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingStopParams) -> u32,
    get_data: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingGetDataParams) -> u32,
    num_reasons: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingGetNumStallReasonsParams) -> u32,
    reasons: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingGetStallReasonsParams) -> u32,
    set_config: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingConfigurationInfoParams) -> u32,
    push_ctx: unsafe extern "C" fn(*mut c_void) -> u32,
    pop_ctx: unsafe extern "C" fn(*mut *mut c_void) -> u32,
}

impl PcApi {
    /// The entry points, if this CUPTI and driver have them all.
    pub fn load(cupti: &Cupti, cuda: &Driver) -> Option<PcApi> {
        let pc = cupti.pc_sampling.as_ref()?;
        Some(PcApi {
            enable: pc.enable,
            disable: pc.disable,
            start: pc.start,
            stop: pc.stop,
            get_data: pc.get_data,
            num_reasons: pc.num_reasons,
            reasons: pc.reasons,
            set_config: pc.set_config,
            push_ctx: cuda.ctx_push_current?,
            pop_ctx: cuda.ctx_pop_current?,
        })
    }
}

/// A PC buffer: CUPTI's header, its PC records and their stall-reason arrays (heap, never moved
/// while CUPTI may write them).
struct Buffer {
    head: Box<sys::CUpti_PCSamplingData>,
    _pcs: Vec<sys::CUpti_PCSamplingPCData>,
    _reasons: Vec<sys::CUpti_PCSamplingStallReason>,
}

impl Buffer {
    fn new(nreasons: usize) -> Buffer {
        let nreasons = nreasons.max(1);
        let mut reasons = vec![
            sys::CUpti_PCSamplingStallReason {
                pcSamplingStallReasonIndex: 0,
                samples: 0,
            };
            MAX_PCS * nreasons
        ];
        let rbase = reasons.as_mut_ptr();
        let mut pcs: Vec<sys::CUpti_PCSamplingPCData> = (0..MAX_PCS)
            .map(|i| {
                // SAFETY: plain data; zero is a valid value of every field.
                let mut p: sys::CUpti_PCSamplingPCData = unsafe { std::mem::zeroed() };
                p.size = std::mem::size_of::<sys::CUpti_PCSamplingPCData>();
                // SAFETY: i * nreasons < reasons.len().
                p.stallReason = unsafe { rbase.add(i * nreasons) };
                p
            })
            .collect();
        // SAFETY: as above.
        let mut head: Box<sys::CUpti_PCSamplingData> = Box::new(unsafe { std::mem::zeroed() });
        head.size = std::mem::size_of::<sys::CUpti_PCSamplingData>();
        head.collectNumPcs = MAX_PCS;
        head.pPcData = pcs.as_mut_ptr();
        Buffer {
            head,
            _pcs: pcs,
            _reasons: reasons,
        }
    }
}

/// The context PC sampling is enabled on, with its buffers and reason names.
struct Enabled {
    ctx: usize,
    /// Given to CUPTI with the configuration: a stop leaves the samples here.
    config_buf: Buffer,
    /// For further reads.
    read_buf: Buffer,
    /// Reason index → gpufl's name (`None`: left out).
    names: HashMap<u32, Option<String>>,
    /// Started and not yet stopped.
    started: bool,
}

// SAFETY: the raw pointers point into this struct's own heap buffers; it is only used under
// the `enabled` mutex of [`STALLS`].
unsafe impl Send for Enabled {}

/// PC sampling stays enabled at most this long after it was enabled or last stopped, ns: enabled,
/// even stopped, it costs every launch ~2 µs (launch-bound loop, device run 9), so it goes off
/// when no stall sample came for a while ([`expire`]).
pub const WINDOW_NS: u64 = 2_000_000_000;
/// Enabled as a context is created ([`prepare`]), it waits this long for its first stall sample
/// (a top-N choice needs a tally of GPU time first; a framework loads and sets up meanwhile).
pub const STARTUP_WINDOW_NS: u64 = 30_000_000_000;

/// PC sampling's process-wide state (the module's one static).
struct Stalls {
    /// The context PC sampling is enabled on.
    enabled: Mutex<Option<Enabled>>,
    /// Monotonic time after which PC sampling is turned off (0: not enabled).
    deadline: AtomicU64,
    /// What the first stall sample saw (a debug notice): timings and CUPTI's buffer counts.
    first: Mutex<Option<String>>,
    /// The last start's timings (ms): enabling (0 when already enabled), starting.
    last_start: Mutex<(f64, f64)>,
}

static STALLS: Stalls = Stalls {
    enabled: Mutex::new(None),
    deadline: AtomicU64::new(0),
    first: Mutex::new(None),
    last_start: Mutex::new((0.0, 0.0)),
};

fn extend(by: u64) {
    STALLS.deadline.store(
        crate::clock::mono_ns().saturating_add(by),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Whether PC sampling is enabled and its window ended by `now` (monotonic ns): one atomic load.
#[inline]
pub fn expired(now: u64) -> bool {
    let d = STALLS.deadline.load(std::sync::atomic::Ordering::Relaxed);
    d != 0 && now > d
}

/// The first stall sample's debug line, once.
pub fn take_first() -> Option<String> {
    STALLS.first.lock().ok()?.take()
}

fn ms(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// gpufl's name of a CUPTI stall reason: the prefix dropped, lowercase; `None` for the
/// `_not_issued` variants (a subset of the same samples) and for names that are not stall
/// reasons.
pub fn reason_name(cupti_name: &str) -> Option<String> {
    let r = cupti_name.strip_prefix(PREFIX)?;
    if r.is_empty() || r.ends_with("_not_issued") {
        return None;
    }
    Some(r.to_ascii_lowercase())
}

fn err(c: &Cupti, what: &str, rc: u32) -> String {
    format!("{what}: {}", c.result_string(rc))
}

/// Enable PC sampling on `ctx` (current on this thread) and configure it.
fn enable(c: &Cupti, api: &PcApi, ctx: *mut c_void) -> Result<Enabled, String> {
    let mut en: sys::CUpti_PCSamplingEnableParams = unsafe { std::mem::zeroed() };
    en.size = sys::PCSamplingEnableParamsSize as usize;
    en.ctx = ctx.cast();
    // SAFETY: valid params.
    let rc = unsafe { (api.enable)(&mut en) };
    if rc != cupti::SUCCESS {
        return Err(err(c, "cuptiPCSamplingEnable", rc));
    }
    let undo = |e: String| {
        let mut d: sys::CUpti_PCSamplingDisableParams = unsafe { std::mem::zeroed() };
        d.size = sys::PCSamplingDisableParamsSize as usize;
        d.ctx = ctx.cast();
        // SAFETY: valid params.
        unsafe { (api.disable)(&mut d) };
        e
    };
    let mut n = 0usize;
    let mut nr: sys::CUpti_PCSamplingGetNumStallReasonsParams = unsafe { std::mem::zeroed() };
    nr.size = sys::PCSamplingGetNumStallReasonsParamsSize as usize;
    nr.ctx = ctx.cast();
    nr.numStallReasons = &mut n;
    // SAFETY: valid params.
    let rc = unsafe { (api.num_reasons)(&mut nr) };
    if rc != cupti::SUCCESS || n == 0 || n > 4096 {
        return Err(undo(format!(
            "cuptiPCSamplingGetNumStallReasons: {} ({n} reasons)",
            c.result_string(rc)
        )));
    }
    let mut indices = vec![0u32; n];
    let mut storage = vec![[0 as c_char; sys::CUPTI_STALL_REASON_STRING_SIZE as usize]; n];
    let mut ptrs: Vec<*mut c_char> = storage.iter_mut().map(|s| s.as_mut_ptr()).collect();
    let mut sr: sys::CUpti_PCSamplingGetStallReasonsParams = unsafe { std::mem::zeroed() };
    sr.size = sys::PCSamplingGetStallReasonsParamsSize as usize;
    sr.ctx = ctx.cast();
    sr.numStallReasons = n;
    sr.stallReasonIndex = indices.as_mut_ptr();
    sr.stallReasons = ptrs.as_mut_ptr();
    // SAFETY: n indices and n strings of CUPTI_STALL_REASON_STRING_SIZE bytes.
    let rc = unsafe { (api.reasons)(&mut sr) };
    if rc != cupti::SUCCESS {
        return Err(undo(err(c, "cuptiPCSamplingGetStallReasons", rc)));
    }
    let names: HashMap<u32, Option<String>> = indices
        .iter()
        .zip(&storage)
        .map(|(&i, s)| {
            let len = s.iter().position(|&b| b == 0).unwrap_or(s.len());
            let bytes: Vec<u8> = s[..len].iter().map(|&b| b as u8).collect();
            (i, reason_name(&String::from_utf8_lossy(&bytes)))
        })
        .collect();
    let mut e = Enabled {
        ctx: ctx as usize,
        config_buf: Buffer::new(n),
        read_buf: Buffer::new(n),
        names,
        started: false,
    };
    type A = sys::CUpti_PCSamplingConfigurationAttributeType;
    let mut cfg: Vec<sys::CUpti_PCSamplingConfigurationInfo> = Vec::new();
    let mut add = |t: A, f: &dyn Fn(&mut sys::CUpti_PCSamplingConfigurationInfo)| {
        let mut i: sys::CUpti_PCSamplingConfigurationInfo = unsafe { std::mem::zeroed() };
        i.attributeType = t;
        f(&mut i);
        cfg.push(i);
    };
    let idx = indices.as_mut_ptr();
    add(
        A::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_STALL_REASON,
        &|i| {
            i.attributeData.stallReasonData.stallReasonCount = n;
            i.attributeData.stallReasonData.pStallReasonIndex = idx;
        },
    );
    let head: *mut sys::CUpti_PCSamplingData = &mut *e.config_buf.head;
    add(
        A::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_DATA_BUFFER,
        &|i| i.attributeData.samplingDataBufferData.samplingDataBuffer = head.cast(),
    );
    add(
        A::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_COLLECTION_MODE,
        &|i| {
            i.attributeData.collectionModeData.collectionMode =
                sys::CUpti_PCSamplingCollectionMode::CUPTI_PC_SAMPLING_COLLECTION_MODE_CONTINUOUS
        },
    );
    add(
        A::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_PERIOD,
        &|i| i.attributeData.samplingPeriodData.samplingPeriod = PERIOD,
    );
    add(
        A::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SCRATCH_BUFFER_SIZE,
        &|i| i.attributeData.scratchBufferSizeData.scratchBufferSize = 16 << 20,
    );
    add(
        A::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_ENABLE_START_STOP_CONTROL,
        &|i| {
            i.attributeData
                .enableStartStopControlData
                .enableStartStopControl = 1
        },
    );
    let mut cp: sys::CUpti_PCSamplingConfigurationInfoParams = unsafe { std::mem::zeroed() };
    cp.size = sys::PCSamplingConfigurationInfoParamsSize as usize;
    cp.ctx = ctx.cast();
    cp.numAttributes = cfg.len();
    cp.pPCSamplingConfigurationInfo = cfg.as_mut_ptr();
    // SAFETY: valid params; `indices` and the buffers outlive the call (CUPTI copies the
    // indices; the buffer is kept in `e` until disabled).
    let rc = unsafe { (api.set_config)(&mut cp) };
    if rc != cupti::SUCCESS {
        return Err(undo(err(c, "cuptiPCSamplingSetConfigurationAttribute", rc)));
    }
    Ok(e)
}

fn disable_locked(api: &PcApi, st: &mut Option<Enabled>, current: *mut c_void) {
    STALLS
        .deadline
        .store(0, std::sync::atomic::Ordering::Relaxed);
    let Some(mut e) = st.take() else { return };
    let ctx = e.ctx as *mut c_void;
    let other = ctx != current;
    // SAFETY: plain driver calls; the context was live when enabled and CUPTI's calls on a
    // destroyed one fail without harm.
    unsafe {
        if other && (api.push_ctx)(ctx) != 0 {
            // The context is gone (or cannot be made current): CUPTI may still hold the
            // configuration's buffer, so it is never freed.
            std::mem::forget(e);
            return;
        }
        if e.started {
            let mut sp: sys::CUpti_PCSamplingStopParams = std::mem::zeroed();
            sp.size = sys::PCSamplingStopParamsSize as usize;
            sp.ctx = ctx.cast();
            (api.stop)(&mut sp);
            e.started = false;
        }
        let mut d: sys::CUpti_PCSamplingDisableParams = std::mem::zeroed();
        d.size = sys::PCSamplingDisableParamsSize as usize;
        d.ctx = ctx.cast();
        (api.disable)(&mut d);
        if other {
            let mut prev = std::ptr::null_mut();
            (api.pop_ctx)(&mut prev);
        }
    }
}

/// Turn PC sampling off wherever it is enabled (before a SASS-metrics sample, a pause, the
/// end). `current`: the context current on this thread (null: none known).
pub fn disable(api: &PcApi, current: *mut c_void) {
    let mut st = STALLS.enabled.lock().unwrap_or_else(|e| e.into_inner());
    disable_locked(api, &mut st, current);
}

/// Enable PC sampling on a new context (current on this thread), stopped, unless it is enabled
/// on another one already.
pub fn prepare(c: &Cupti, api: &PcApi, ctx: *mut c_void) -> Result<(), String> {
    let mut st = STALLS.enabled.lock().unwrap_or_else(|e| e.into_inner());
    if st.is_none() {
        *st = Some(enable(c, api, ctx)?);
        extend(STARTUP_WINDOW_NS);
    }
    Ok(())
}

/// Start sampling on `ctx` (current on this thread), enabling it there first if needed.
pub fn start(c: &Cupti, api: &PcApi, ctx: *mut c_void) -> Result<(), String> {
    let mut st = STALLS.enabled.lock().unwrap_or_else(|e| e.into_inner());
    if st.as_ref().is_some_and(|e| e.ctx != ctx as usize) {
        disable_locked(api, &mut st, ctx);
    }
    let t0 = std::time::Instant::now();
    if st.is_none() {
        *st = Some(enable(c, api, ctx)?);
    }
    let t_enable = ms(t0);
    let t1 = std::time::Instant::now();
    let Some(e) = st.as_mut() else {
        return Err("PC sampling state lost".into());
    };
    let mut sp: sys::CUpti_PCSamplingStartParams = unsafe { std::mem::zeroed() };
    sp.size = sys::PCSamplingStartParamsSize as usize;
    sp.ctx = ctx.cast();
    // SAFETY: valid params.
    let rc = unsafe { (api.start)(&mut sp) };
    if rc != cupti::SUCCESS {
        let m = err(c, "cuptiPCSamplingStart", rc);
        disable_locked(api, &mut st, ctx);
        return Err(m);
    }
    e.started = true;
    STALLS
        .deadline
        .store(u64::MAX, std::sync::atomic::Ordering::Relaxed); // not while started
    if let Ok(mut l) = STALLS.last_start.lock() {
        *l = (t_enable, ms(t1));
    }
    Ok(())
}

/// Stall-reason samples of one function in one sample, per source line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StallCounts {
    pub name: String,
    /// (file, line) → (samples, by reason).
    pub lines: BTreeMap<(String, u32), (u64, BTreeMap<String, u64>)>,
    pub unmapped: u64,
    /// The unmapped samples by reason.
    pub unmapped_by: BTreeMap<String, u64>,
    pub total: u64,
}

/// One sampled PC as CUPTI gives it.
pub struct PcSample<'a> {
    pub crc: u32,
    pub function: &'a [u8],
    pub pc: u64,
    /// (reason index, samples).
    pub reasons: &'a [(u32, u32)],
}

/// Fold sampled PCs of the function whose key is `key` into per-line stall counts.
pub fn fold<'a>(
    key: u64,
    names: &HashMap<u32, Option<String>>,
    pcs: impl IntoIterator<Item = PcSample<'a>>,
    tables: &BTreeMap<u32, Arc<LineTable>>,
) -> Option<StallCounts> {
    let mut out: Option<StallCounts> = None;
    for p in pcs {
        if crate::kernel_detail::key(p.function) != key {
            continue;
        }
        let s = out.get_or_insert_with(|| StallCounts {
            name: String::from_utf8_lossy(p.function).into_owned(),
            ..StallCounts::default()
        });
        let mut samples = 0u64;
        let mut by: Vec<(&str, u64)> = Vec::new();
        for &(i, n) in p.reasons {
            if let Some(Some(r)) = names.get(&i) {
                if n > 0 {
                    samples += n as u64;
                    by.push((r, n as u64));
                }
            }
        }
        if samples == 0 {
            continue;
        }
        s.total += samples;
        let name = String::from_utf8_lossy(p.function);
        match tables.get(&p.crc).and_then(|t| t.lookup(&name, p.pc)) {
            Some((file, line)) => {
                let l = s.lines.entry((file.to_string(), line)).or_default();
                l.0 += samples;
                for (r, n) in by {
                    *l.1.entry(r.to_string()).or_default() += n;
                }
            }
            None => {
                s.unmapped += samples;
                for (r, n) in by {
                    *s.unmapped_by.entry(r.to_string()).or_default() += n;
                }
            }
        }
    }
    out
}

/// One PC copied out of CUPTI's buffer: cubin CRC (low 32 bits), function, PC offset, (reason
/// index, samples).
type RawPc = (u32, Vec<u8>, u64, Vec<(u32, u32)>);

/// Copy a buffer's PCs out (CUPTI's pointers are valid until the buffer is reused).
fn take(buf: &mut Buffer, into: &mut Vec<RawPc>) {
    let n = buf.head.totalNumPcs.min(MAX_PCS);
    for i in 0..n {
        // SAFETY: CUPTI filled the first totalNumPcs records of pPcData.
        let p = unsafe { &*buf.head.pPcData.add(i) };
        let function = if p.functionName.is_null() {
            Vec::new()
        } else {
            // SAFETY: CUPTI's NUL-terminated name.
            unsafe { CStr::from_ptr(p.functionName) }
                .to_bytes()
                .to_vec()
        };
        let nr = p.stallReasonCount.min(4096);
        let reasons = (0..nr)
            .map(|j| {
                // SAFETY: CUPTI filled stallReasonCount entries of the array we gave.
                let r = unsafe { &*p.stallReason.add(j) };
                (r.pcSamplingStallReasonIndex, r.samples)
            })
            .collect();
        into.push((p.cubinCrc as u32, function, p.pcOffset, reasons));
    }
    buf.head.totalNumPcs = 0;
    buf.head.totalSamples = 0;
    buf.head.remainingNumPcs = 0;
}

/// Stop sampling on `ctx` (current on this thread, after the sampled launch finished) and read
/// the samples of the function whose key is `key`. PC sampling stays enabled, stopped.
pub fn stop_and_read(
    c: &Cupti,
    api: &PcApi,
    ctx: *mut c_void,
    key: u64,
    tables: &BTreeMap<u32, Arc<LineTable>>,
) -> Result<(Option<StallCounts>, u64), String> {
    let mut st = STALLS.enabled.lock().unwrap_or_else(|e| e.into_inner());
    let Some(e) = st.as_mut().filter(|e| e.ctx == ctx as usize && e.started) else {
        return Ok((None, 0));
    };
    let mut sp: sys::CUpti_PCSamplingStopParams = unsafe { std::mem::zeroed() };
    sp.size = sys::PCSamplingStopParamsSize as usize;
    sp.ctx = ctx.cast();
    let t0 = std::time::Instant::now();
    // SAFETY: valid params.
    let rc = unsafe { (api.stop)(&mut sp) };
    let t_stop = ms(t0);
    e.started = false;
    extend(WINDOW_NS);
    if rc != cupti::SUCCESS {
        let m = err(c, "cuptiPCSamplingStop", rc);
        disable_locked(api, &mut st, ctx);
        return Err(m);
    }
    let mut raw = Vec::new();
    let h = &e.config_buf.head;
    let mut diag = format!(
        "stop {t_stop:.3} ms; configuration buffer: {} PCs, {} samples, {} dropped, {} outside user kernels, hardware buffer full {}",
        { h.totalNumPcs },
        { h.totalSamples },
        { h.droppedSamples },
        { h.nonUsrKernelsTotalSamples },
        { h.hardwareBufferFull }
    );
    take(&mut e.config_buf, &mut raw);
    for _ in 0..MAX_READS {
        let mut gd: sys::CUpti_PCSamplingGetDataParams = unsafe { std::mem::zeroed() };
        // CUPTI_PCSAMPLING_STRUCT_SIZE(…, pcSamplingData): the last field ends the struct.
        gd.size = std::mem::size_of::<sys::CUpti_PCSamplingGetDataParams>();
        gd.ctx = ctx.cast();
        gd.pcSamplingData = (&mut *e.read_buf.head as *mut sys::CUpti_PCSamplingData).cast();
        // SAFETY: valid params over our buffer.
        let rc = unsafe { (api.get_data)(&mut gd) };
        diag.push_str(&format!(
            "; read: rc {rc}, {} PCs, {} samples",
            { e.read_buf.head.totalNumPcs },
            { e.read_buf.head.totalSamples }
        ));
        if rc != cupti::SUCCESS {
            break;
        }
        let more = e.read_buf.head.remainingNumPcs > 0;
        take(&mut e.read_buf, &mut raw);
        if !more {
            break;
        }
    }
    let pcs = raw.len() as u64;
    if let Ok(mut f) = STALLS.first.lock() {
        if f.is_none() {
            let (en, stt) = STALLS.last_start.lock().map(|l| *l).unwrap_or_default();
            let fns: std::collections::BTreeSet<String> = raw
                .iter()
                .take(64)
                .map(|r| String::from_utf8_lossy(&r.1).into_owned())
                .collect();
            *f = Some(format!(
                "first stall sample: enable {en:.3} ms, start {stt:.3} ms, {diag}; functions {fns:?}"
            ));
        }
    }
    let folded = fold(
        key,
        &e.names,
        raw.iter().map(|(crc, f, pc, r)| PcSample {
            crc: *crc,
            function: f,
            pc: *pc,
            reasons: r,
        }),
        tables,
    );
    Ok((folded, pcs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_names_drop_the_prefix_and_the_not_issued_subset() {
        assert_eq!(
            reason_name("smsp__pcsamp_warps_issue_stalled_long_scoreboard").as_deref(),
            Some("long_scoreboard")
        );
        assert_eq!(
            reason_name("smsp__pcsamp_warps_issue_stalled_MIO_Throttle").as_deref(),
            Some("mio_throttle")
        );
        assert_eq!(
            reason_name("smsp__pcsamp_warps_issue_stalled_long_scoreboard_not_issued"),
            None
        );
        assert_eq!(reason_name("smsp__pcsamp_sample_count"), None);
        assert_eq!(reason_name("smsp__pcsamp_warps_issue_stalled_"), None);
    }

    #[test]
    fn samples_fold_per_line_for_the_chosen_function_only() {
        let names: HashMap<u32, Option<String>> = [
            (1, Some("long_scoreboard".to_string())),
            (2, None), // long_scoreboard_not_issued
            (3, Some("selected".to_string())),
        ]
        .into_iter()
        .collect();
        let k = crate::kernel_detail::key(b"_Z1fv");
        let tables = BTreeMap::new(); // no line table: unmapped
        let r1 = [(1, 30), (2, 20), (3, 5)];
        let r2 = [(1, 7), (9, 100)];
        let r3 = [(1, 1000)];
        let pcs = vec![
            PcSample {
                crc: 1,
                function: b"_Z1fv",
                pc: 16,
                reasons: &r1,
            },
            PcSample {
                crc: 1,
                function: b"_Z1fv",
                pc: 32,
                reasons: &r2,
            },
            PcSample {
                crc: 1,
                function: b"_Z1gv",
                pc: 16,
                reasons: &r3,
            },
        ];
        let s = fold(k, &names, pcs, &tables).unwrap();
        assert_eq!(s.name, "_Z1fv");
        assert_eq!(
            s.total, 42,
            "not_issued and unknown reasons are not counted; _Z1gv left out"
        );
        assert_eq!(s.unmapped, 42);
        assert_eq!(s.unmapped_by["long_scoreboard"], 37);
        assert_eq!(s.unmapped_by["selected"], 5);
        assert!(s.lines.is_empty());
        assert!(fold(crate::kernel_detail::key(b"_Z1hv"), &names, vec![], &tables).is_none());
    }
}
