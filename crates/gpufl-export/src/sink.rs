//! What the walker hands a format writer: tracks, events and counter samples, with times already
//! converted to Unix ns.

use std::io;

/// One process track group: a session.
pub struct SessionMeta {
    /// The pid the output uses: the recorded pid, or a synthetic one (from 0x4000_0000) when an
    /// earlier session of the same export had that pid.
    pub pid: u32,
    /// Display name: app name, pid, host, session id.
    pub name: String,
    /// (device ordinal, device name) from the header.
    pub gpus: Vec<(u32, String)>,
}

/// A track inside a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Track {
    /// A host thread (API calls, syncs, call sites, scopes).
    Thread(u64),
    /// Threads beyond the per-session cap, or records without a thread.
    OtherThreads,
    /// The host samples of a thread (`hsample` records), beside (in Perfetto: under) its track.
    HostSamples(u64),
    /// A GPU stream (kernels, copies, memsets).
    Stream { dev: u32, stream: u32 },
    /// Streams beyond the per-session cap.
    OtherStreams,
    /// NVTX start/end ranges.
    Ranges,
    /// Always-on capture windows, pause / resume.
    Capture,
    /// Insights of gpufl-analysis.
    Insights,
    /// A GPU's allocations and frees (`mem` records).
    Memory(u32),
}

impl Track {
    /// The track's display name.
    pub fn name(&self, meta: &SessionMeta) -> String {
        match *self {
            Track::Thread(tid) => format!("thread {tid}"),
            Track::OtherThreads => "other threads".into(),
            Track::HostSamples(tid) => format!("host samples · thread {tid}"),
            Track::Stream { dev, stream } => match meta.gpus.iter().find(|g| g.0 == dev) {
                Some((_, n)) => format!("GPU {dev} ({n}) stream {stream}"),
                None => format!("GPU {dev} stream {stream}"),
            },
            Track::OtherStreams => "GPU: other streams".into(),
            Track::Ranges => "NVTX ranges".into(),
            Track::Capture => "capture windows".into(),
            Track::Insights => "gpufl insights".into(),
            Track::Memory(dev) => format!("GPU {dev} allocations"),
        }
    }

    /// Display order inside the session: insights, GPU streams, threads, the rest.
    pub fn rank(&self) -> u32 {
        match self {
            Track::Insights => 0,
            Track::Stream { .. } | Track::OtherStreams | Track::Memory(_) => 1,
            Track::Thread(_) | Track::OtherThreads | Track::HostSamples(_) => 2,
            _ => 3,
        }
    }
}

/// Event categories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cat {
    Kernel,
    Memcpy,
    Memset,
    Api,
    Sync,
    Hostcall,
    Hsample,
    Callsite,
    Scope,
    Range,
    Capture,
    Insight,
    Mem,
}

impl Cat {
    pub const ALL: [Cat; 13] = [
        Cat::Kernel,
        Cat::Memcpy,
        Cat::Memset,
        Cat::Api,
        Cat::Sync,
        Cat::Hostcall,
        Cat::Hsample,
        Cat::Callsite,
        Cat::Scope,
        Cat::Range,
        Cat::Capture,
        Cat::Insight,
        Cat::Mem,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Cat::Kernel => "kernel",
            Cat::Memcpy => "memcpy",
            Cat::Memset => "memset",
            Cat::Api => "api",
            Cat::Sync => "sync",
            Cat::Hostcall => "hostcall",
            Cat::Hsample => "hsample",
            Cat::Callsite => "callsite",
            Cat::Scope => "scope",
            Cat::Range => "range",
            Cat::Capture => "capture",
            Cat::Insight => "insight",
            Cat::Mem => "mem",
        }
    }
}

/// An argument value.
pub enum Arg<'a> {
    U(u64),
    F(f64),
    S(&'a str),
    /// A list of strings (a stack, innermost frame first).
    List(&'a [String]),
}

/// A slice (`dur` Some, possibly 0) or an instant (`dur` None).
pub struct Event<'a> {
    pub track: Track,
    pub ts: u64,
    pub dur: Option<u64>,
    pub name: &'a str,
    pub cat: Cat,
    pub args: &'a [(&'static str, Arg<'a>)],
    /// This slice starts the flow with this id.
    pub flow_out: Option<u64>,
    /// This slice ends the flow with this id.
    pub flow_in: Option<u64>,
}

/// GPU telemetry metrics, one counter track each per GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    GpuUtil,
    MemUtil,
    MemUsed,
    Temp,
    Power,
    SmClock,
    MemClock,
    PcieTx,
    PcieRx,
    /// Bytes the process holds allocated on the GPU (`mem` records), not NVML.
    MemLive,
}

impl Metric {
    /// Counter name (with its unit).
    pub fn name(self) -> &'static str {
        match self {
            Metric::GpuUtil => "GPU utilization (%)",
            Metric::MemUtil => "memory utilization (%)",
            Metric::MemUsed => "memory used (bytes)",
            Metric::Temp => "temperature (°C)",
            Metric::Power => "power (W)",
            Metric::SmClock => "SM clock (MHz)",
            Metric::MemClock => "memory clock (MHz)",
            Metric::PcieTx => "PCIe TX (KB/s)",
            Metric::PcieRx => "PCIe RX (KB/s)",
            Metric::MemLive => "memory allocated by the process (bytes)",
        }
    }
    pub fn is_bytes(self) -> bool {
        matches!(self, Metric::MemUsed | Metric::MemLive)
    }
}

/// A format writer.
pub trait Sink {
    /// A session starts (its tracks follow); sessions are numbered from 0 in call order.
    fn session(&mut self, index: u32, meta: SessionMeta) -> io::Result<()>;
    /// A slice or instant of session `sess`.
    fn event(&mut self, sess: u32, e: &Event) -> io::Result<()>;
    /// A counter sample: GPU `dev`'s `metric` at `ts`.
    fn counter(
        &mut self,
        sess: u32,
        dev: u32,
        metric: Metric,
        ts: u64,
        value: f64,
    ) -> io::Result<()>;
    /// The end: flush.
    fn finish(&mut self) -> io::Result<()>;
}
