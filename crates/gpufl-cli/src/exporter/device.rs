//! Device metrics from NVML, under dcgm-exporter's names, units and labels, read at each scrape
//! (nothing runs between scrapes). NVML (`libnvidia-ml.so.1`) is loaded at run time through
//! `nvml-wrapper`, as the recorder's telemetry does: nothing to link, and without it the exporter
//! still serves the process metrics and says why the device ones are missing.
//!
//! dcgm-exporter's default counters that NVML gives are here (its `etc/default-counters.csv`):
//! clocks, GPU and memory temperature, power and energy, PCIe replays and throughput,
//! utilization (GPU, memory copy, encoder, decoder), the last XID error, framebuffer use,
//! NVLink bandwidth and remapped rows; also throttle reasons and volatile ECC totals. Those DCGM
//! computes between samples are computed here between scrapes, as DCGM does: NVLink bandwidth
//! (KiB/s / 1000 since the previous reading, 0 at the first) and the PCIe rates (bytes/s). XIDs
//! come from NVML's critical-XID events, drained at each scrape.
//!
//! One thing runs between scrapes: NVML's PCIe byte counters are 32-bit on current drivers and
//! wrap every 4 GiB, several times a second at full PCIe speed, so a thread reads them every
//! [`PCIE_POLL`] and sums their wrapping increments into 64-bit totals ([`PcieAcc`]); the
//! scrape's rates and totals come from those.

use super::text::{Kind, Page};
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NVML_LIB: &str = "libnvidia-ml.so.1";
/// nvml.h field IDs read with `nvmlDeviceGetFieldValues`.
const FI_MEMORY_TEMP: u32 = 82;
const FI_NVLINK_DATA_TX_KIB: u32 = 138;
const FI_NVLINK_DATA_RX_KIB: u32 = 139;
const FI_PCIE_TX_BYTES: u32 = 197;
const FI_PCIE_RX_BYTES: u32 = 198;
/// `scopeId` of an NVLink field for every link of the GPU.
const ALL_LINKS: u32 = u32::MAX;
/// `nvmlEventTypeXidCriticalError`.
const EVENT_XID: u64 = 0x8;
/// XID events taken from NVML per scrape at most (the rest wait for the next scrape).
const MAX_EVENTS_PER_SCRAPE: usize = 1024;

/// How often the PCIe counters are read: a 32-bit byte counter wraps every 4 GiB, 67 ms at
/// 64 GB/s (PCIe 5.0 x16), so reads 25 ms apart see each wrap.
pub const PCIE_POLL: Duration = Duration::from_millis(25);

/// A byte counter of NVML summed into 64 bits: each reading adds its increment over the one
/// before, modulo 2^32 when NVML gave the value as 32 bits (it wraps), else as it is (a 64-bit
/// counter that went back was reset: its value is the increment). The first reading is the
/// starting total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PcieAcc {
    last: Option<u64>,
    pub total: u64,
}

impl PcieAcc {
    /// Add a reading: NVML's value and whether it is a 32-bit one.
    pub fn add(&mut self, raw: u64, narrow: bool) {
        let inc = match self.last {
            None => raw,
            Some(p) if narrow => u64::from((raw as u32).wrapping_sub(p as u32)),
            Some(p) if raw >= p => raw - p,
            Some(_) => raw,
        };
        self.total = self.total.wrapping_add(inc);
        self.last = Some(raw);
    }
}

/// Each GPU's PCIe TX and RX totals (by position in [`Live::gpus`]; None until read).
type PcieTotals = Arc<Mutex<Vec<Option<(PcieAcc, PcieAcc)>>>>;

/// The thread that reads the PCIe counters every [`PCIE_POLL`]; stopped and joined on drop.
struct PciePoller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    totals: PcieTotals,
}

impl Drop for PciePoller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type FieldValuesFn = unsafe extern "C" fn(
    sys::nvmlDevice_t,
    std::os::raw::c_int,
    *mut sys::nvmlFieldValue_t,
) -> sys::nvmlReturn_t;

impl PciePoller {
    /// Start reading the counters of these devices (NVML handles as addresses); None when NVML
    /// lacks field values or the thread cannot start.
    fn start(nvml: &Nvml, handles: Vec<usize>) -> Option<PciePoller> {
        let f: FieldValuesFn = *nvml.lib().nvmlDeviceGetFieldValues.as_ref().ok()?;
        let totals: PcieTotals = Arc::new(Mutex::new(vec![None; handles.len()]));
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (totals.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("gpufl-pcie".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    for (i, &h) in handles.iter().enumerate() {
                        let Some(v) = pcie_fields(f, h) else { continue };
                        let mut g = t.lock().unwrap_or_else(|e| e.into_inner());
                        let e = g[i].get_or_insert_with(Default::default);
                        e.0.add(v[0].0, v[0].1);
                        e.1.add(v[1].0, v[1].1);
                    }
                    std::thread::sleep(PCIE_POLL);
                }
            })
            .ok()?;
        Some(PciePoller {
            stop,
            thread: Some(thread),
            totals,
        })
    }

    /// GPU `i`'s TX and RX totals, when read.
    fn totals(&self, i: usize) -> Option<(u64, u64)> {
        let g = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        g.get(i).copied().flatten().map(|(t, r)| (t.total, r.total))
    }
}

/// The PCIe TX and RX counters of one device: (value, 32-bit) each; None when NVML fails them.
fn pcie_fields(f: FieldValuesFn, handle: usize) -> Option<[(u64, bool); 2]> {
    // SAFETY: a zeroed nvmlFieldValue_t is valid (plain data).
    let mut v: [sys::nvmlFieldValue_t; 2] = unsafe { std::mem::zeroed() };
    v[0].fieldId = FI_PCIE_TX_BYTES;
    v[1].fieldId = FI_PCIE_RX_BYTES;
    // SAFETY: a live device handle of the NVML instance the poller's owner keeps loaded (the
    // poller is dropped first); two initialised values NVML fills.
    let rc = unsafe { f(handle as sys::nvmlDevice_t, 2, v.as_mut_ptr()) };
    nvml_try(rc).ok()?;
    let read = |x: &sys::nvmlFieldValue_t| {
        let narrow = matches!(
            x.valueType,
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT
                | sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT
        );
        field_u64(x).map(|n| (n, narrow))
    };
    Some([read(&v[0])?, read(&v[1])?])
}

/// A cumulative counter's value and when it was read.
#[derive(Clone, Copy, Debug)]
pub struct Counted {
    pub value: u64,
    pub at: Instant,
}

/// Per-second rate of a counter between two readings; None without an earlier one, when no time
/// passed, or when the counter went back (reset or wrap).
pub fn rate(prev: Option<Counted>, now: Counted) -> Option<f64> {
    let p = prev?;
    let dt = now.at.saturating_duration_since(p.at).as_secs_f64();
    (dt > 0.0 && now.value >= p.value).then(|| (now.value - p.value) as f64 / dt)
}

/// `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` as DCGM computes it from NVML's RX + TX data counters
/// (KiB): their increase per second since the previous reading, divided by 1000; 0 at the first
/// reading, when the sum is 0, or when it went back.
pub fn nvlink_bandwidth(prev: Option<Counted>, now: Counted) -> f64 {
    if now.value == 0 {
        return 0.0;
    }
    rate(prev, now).map_or(0.0, |kib_per_s| (kib_per_s / 1000.0).trunc())
}

/// The value of a field NVML returned, by its type; None when NVML said it failed.
pub fn field_u64(f: &sys::nvmlFieldValue_t) -> Option<u64> {
    if f.nvmlReturn != sys::nvmlReturn_enum_NVML_SUCCESS {
        return None;
    }
    // SAFETY: the union member read is the one `valueType` names.
    unsafe {
        match f.valueType {
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => Some(u64::from(f.value.uiVal)),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Some(f.value.ulVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => Some(f.value.ullVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => {
                u64::try_from(f.value.sllVal).ok()
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => u64::try_from(f.value.siVal).ok(),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => {
                Some(u64::from(f.value.usVal))
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE => {
                let d = f.value.dVal;
                (d.is_finite() && d >= 0.0).then_some(d as u64)
            }
            _ => None,
        }
    }
}

/// The memory temperature field (°C). As DCGM reads it: the unsigned member whatever type NVML
/// states (some drivers state double for an unsigned value), and nothing over 200.
pub fn memory_temp(f: &sys::nvmlFieldValue_t) -> Option<f64> {
    if f.nvmlReturn != sys::nvmlReturn_enum_NVML_SUCCESS {
        return None;
    }
    // SAFETY: every member of the union is plain data; uiVal is its first 4 bytes.
    let t = unsafe { f.value.uiVal };
    (t <= 200).then_some(f64::from(t))
}

/// dcgm-exporter's `err_msg` for an XID code (NVIDIA's XID catalogue, the common ones).
pub fn xid_message(code: u64) -> &'static str {
    match code {
        0 => "No Error",
        13 => "Graphics Engine Exception",
        31 => "GPU memory page fault",
        32 => "Invalid or corrupted push buffer stream",
        38 => "Driver firmware error",
        43 => "GPU stopped processing",
        45 => "Preemptive cleanup, due to previous errors",
        48 => "Double Bit ECC Error",
        61 => "Internal micro-controller breakpoint/warning",
        62 => "Internal micro-controller halt",
        63 => "ECC page retirement or row remapping recording event",
        64 => "ECC page retirement or row remapper recording failure",
        68 => "NVDEC0 Exception",
        69 => "Graphics Engine class error",
        74 => "NVLINK Error",
        79 => "GPU has fallen off the bus",
        92 => "High single-bit ECC error rate",
        94 => "Contained ECC error",
        95 => "Uncontained ECC error",
        119 => "GSP RPC Timeout",
        120 => "GSP Error",
        121 => "C2C Link Error",
        140 => "Unrecovered ECC Error",
        _ => "Unknown Error",
    }
}

/// The XIDs of one GPU since the exporter started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Xids {
    /// The last XID (0: none yet).
    pub last: u64,
    pub count: u64,
}

impl Xids {
    pub fn record(&mut self, code: u64) {
        self.last = code;
        self.count += 1;
    }
}

/// One GPU's values at a scrape; None where NVML does not give one on this GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading {
    pub sm_clock: Option<f64>,
    pub mem_clock: Option<f64>,
    pub gpu_temp: Option<f64>,
    pub memory_temp: Option<f64>,
    pub power_w: Option<f64>,
    pub energy_mj: Option<f64>,
    pub pcie_replays: Option<f64>,
    pub gpu_util: Option<f64>,
    pub mem_copy_util: Option<f64>,
    pub enc_util: Option<f64>,
    pub dec_util: Option<f64>,
    pub fb_free_mib: Option<f64>,
    pub fb_used_mib: Option<f64>,
    pub throttle: Option<f64>,
    pub ecc_sbe: Option<f64>,
    pub ecc_dbe: Option<f64>,
    pub pcie_tx_rate: Option<f64>,
    pub pcie_rx_rate: Option<f64>,
    pub pcie_tx_bytes: Option<f64>,
    pub pcie_rx_bytes: Option<f64>,
    pub nvlink_bandwidth: Option<f64>,
    pub nvlink_tx_bytes: Option<f64>,
    pub nvlink_rx_bytes: Option<f64>,
    pub remapped_uncorrectable: Option<f64>,
    pub remapped_correctable: Option<f64>,
    pub remap_failure: Option<f64>,
    pub remap_pending: Option<f64>,
    /// None: this GPU gives no XID events.
    pub xids: Option<Xids>,
}

/// Add a GPU's samples, under its labels (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
/// `Hostname`). The XID sample adds dcgm-exporter's `err_code` and `err_msg`.
pub fn write(page: &mut Page, labels: &[(&str, &str)], r: &Reading) {
    let samples = [
        ("DCGM_FI_DEV_SM_CLOCK", r.sm_clock),
        ("DCGM_FI_DEV_MEM_CLOCK", r.mem_clock),
        ("DCGM_FI_DEV_GPU_TEMP", r.gpu_temp),
        ("DCGM_FI_DEV_MEMORY_TEMP", r.memory_temp),
        ("DCGM_FI_DEV_POWER_USAGE", r.power_w),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", r.energy_mj),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", r.pcie_replays),
        ("DCGM_FI_DEV_GPU_UTIL", r.gpu_util),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", r.mem_copy_util),
        ("DCGM_FI_DEV_ENC_UTIL", r.enc_util),
        ("DCGM_FI_DEV_DEC_UTIL", r.dec_util),
        ("DCGM_FI_DEV_FB_FREE", r.fb_free_mib),
        ("DCGM_FI_DEV_FB_USED", r.fb_used_mib),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", r.throttle),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", r.ecc_sbe),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", r.ecc_dbe),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", r.pcie_tx_rate),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", r.pcie_rx_rate),
        ("gpufl_gpu_pcie_tx_bytes_total", r.pcie_tx_bytes),
        ("gpufl_gpu_pcie_rx_bytes_total", r.pcie_rx_bytes),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", r.nvlink_bandwidth),
        ("gpufl_gpu_nvlink_tx_bytes_total", r.nvlink_tx_bytes),
        ("gpufl_gpu_nvlink_rx_bytes_total", r.nvlink_rx_bytes),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            r.remapped_uncorrectable,
        ),
        (
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            r.remapped_correctable,
        ),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", r.remap_failure),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", r.remap_pending),
    ];
    for (name, v) in samples {
        if let Some(v) = v {
            page.sample(name, labels, v);
        }
    }
    if let Some(x) = r.xids {
        let code = x.last.to_string();
        let mut l = labels.to_vec();
        l.push(("err_code", &code));
        l.push(("err_msg", xid_message(x.last)));
        page.sample("DCGM_FI_DEV_XID_ERRORS", &l, x.last as f64);
        page.sample("gpufl_gpu_xid_errors_total", labels, x.count as f64);
    }
}

/// A GPU's labels, as dcgm-exporter writes them, and what the exporter keeps between scrapes.
pub struct Gpu {
    index: u32,
    uuid: String,
    pci_bus_id: String,
    device: String,
    model: String,
    ecc: bool,
    /// NVML's handle (an address), to match XID events to the GPU.
    handle: usize,
    /// None: no XID events from this GPU (not supported, or no event set).
    xids: Option<Xids>,
    nvlink_prev: Option<Counted>,
    pcie_prev: Option<(Counted, Counted)>,
}

/// NVML's event set for XID events, freed before NVML shuts down (field order in [`Live`]).
struct EventSet {
    set: sys::nvmlEventSet_t,
    free: unsafe extern "C" fn(sys::nvmlEventSet_t) -> sys::nvmlReturn_t,
}

// SAFETY: NVML's calls are thread-safe; the set is used only under the exporter's state lock.
unsafe impl Send for EventSet {}

impl Drop for EventSet {
    fn drop(&mut self) {
        // SAFETY: a set NVML created and nobody uses any more.
        unsafe { (self.free)(self.set) };
    }
}

/// NVML, its GPUs, the XID event set and the PCIe counters' poller (fields drop in order: the
/// poller and the event set before NVML).
pub struct Live {
    pcie: Option<PciePoller>,
    events: Option<EventSet>,
    gpus: Vec<Gpu>,
    nvml: Nvml,
}

/// NVML and its GPUs, or why not.
pub enum Devices {
    Nvml(Box<Live>),
    Missing(String),
}

impl Devices {
    /// Load NVML, list its GPUs and register for their XID events.
    pub fn open() -> Devices {
        let nvml = match Nvml::builder().lib_path(OsStr::new(NVML_LIB)).init() {
            Ok(n) => n,
            Err(e) => return Devices::Missing(format!("NVML ({NVML_LIB}) unavailable: {e}")),
        };
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => return Devices::Missing(format!("NVML cannot count GPUs: {e}")),
        };
        let events = event_set(&nvml);
        let gpus = (0..count)
            .filter_map(|i| {
                let d = nvml.device_by_index(i).ok()?;
                // SAFETY: the handle of a live device of this NVML instance.
                let handle = unsafe { d.handle() };
                let xids = events
                    .as_ref()
                    .and_then(|set| register_xids(&nvml, handle, set.set).ok())
                    .map(|()| Xids::default());
                Some(Gpu {
                    index: i,
                    uuid: d.uuid().unwrap_or_default(),
                    pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                    device: d
                        .minor_number()
                        .map(|m| format!("nvidia{m}"))
                        .unwrap_or_default(),
                    model: d.name().unwrap_or_default(),
                    ecc: d.is_ecc_enabled().is_ok_and(|m| m.currently_enabled),
                    handle: handle as usize,
                    xids,
                    nvlink_prev: None,
                    pcie_prev: None,
                })
            })
            .collect::<Vec<Gpu>>();
        let pcie = PciePoller::start(&nvml, gpus.iter().map(|g| g.handle).collect());
        Devices::Nvml(Box::new(Live {
            pcie,
            events,
            gpus,
            nvml,
        }))
    }

    /// Why device metrics are missing, if they are.
    pub fn missing(&self) -> Option<&str> {
        match self {
            Devices::Missing(why) => Some(why),
            Devices::Nvml(l) if l.gpus.is_empty() => Some("NVML lists no GPU"),
            Devices::Nvml(_) => None,
        }
    }

    /// Read every GPU now and add its samples.
    pub fn render(&mut self, page: &mut Page, host: &str) {
        families(page);
        let Devices::Nvml(live) = self else {
            return;
        };
        let Live {
            pcie,
            events,
            gpus,
            nvml,
        } = &mut **live;
        if let Some(set) = events {
            drain_xids(nvml, set, gpus);
        }
        for (i, g) in gpus.iter_mut().enumerate() {
            let Ok(d) = nvml.device_by_index(g.index) else {
                continue;
            };
            let totals = pcie.as_ref().and_then(|p| p.totals(i));
            let r = read(nvml, &d, g, totals);
            let gpu = g.index.to_string();
            let labels = [
                ("gpu", gpu.as_str()),
                ("UUID", g.uuid.as_str()),
                ("pci_bus_id", g.pci_bus_id.as_str()),
                ("device", g.device.as_str()),
                ("modelName", g.model.as_str()),
                ("Hostname", host),
            ];
            write(page, &labels, &r);
        }
    }
}

/// One GPU's reading now (and its counters kept for the next scrape's rates).
fn read(nvml: &Nvml, d: &Device, g: &mut Gpu, pcie_totals: Option<(u64, u64)>) -> Reading {
    let now = Instant::now();
    let mut r = Reading {
        sm_clock: d.clock_info(Clock::SM).ok().map(f64::from),
        mem_clock: d.clock_info(Clock::Memory).ok().map(f64::from),
        gpu_temp: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
        power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        energy_mj: d.total_energy_consumption().ok().map(|mj| mj as f64),
        pcie_replays: d.pcie_replay_counter().ok().map(f64::from),
        enc_util: d
            .encoder_utilization()
            .ok()
            .map(|u| f64::from(u.utilization)),
        dec_util: d
            .decoder_utilization()
            .ok()
            .map(|u| f64::from(u.utilization)),
        throttle: throttle_reasons(nvml, d).ok().map(|v| v as f64),
        xids: g.xids,
        ..Reading::default()
    };
    if let Ok(u) = d.utilization_rates() {
        r.gpu_util = Some(f64::from(u.gpu));
        r.mem_copy_util = Some(f64::from(u.memory));
    }
    if let Ok(m) = d.memory_info() {
        const MIB: f64 = 1024.0 * 1024.0;
        r.fb_free_mib = Some((m.free as f64 / MIB).floor());
        r.fb_used_mib = Some((m.used as f64 / MIB).floor());
    }
    if g.ecc {
        let total = |e| d.total_ecc_errors(e, EccCounter::Volatile).ok();
        r.ecc_sbe = total(MemoryError::Corrected).map(|v| v as f64);
        r.ecc_dbe = total(MemoryError::Uncorrected).map(|v| v as f64);
    }
    if let Some(v) = remapped_rows(nvml, d) {
        r.remapped_correctable = Some(f64::from(v[0]));
        r.remapped_uncorrectable = Some(f64::from(v[1]));
        r.remap_pending = Some(f64::from(v[2].min(1)));
        r.remap_failure = Some(f64::from(v[3].min(1)));
    }
    let f = field_values(
        nvml,
        d,
        &[
            (FI_MEMORY_TEMP, 0),
            (FI_NVLINK_DATA_TX_KIB, ALL_LINKS),
            (FI_NVLINK_DATA_RX_KIB, ALL_LINKS),
        ],
    );
    if let Some(f) = f {
        r.memory_temp = memory_temp(&f[0]);
        if let (Some(tx), Some(rx)) = (field_u64(&f[1]), field_u64(&f[2])) {
            let sum = Counted {
                value: tx.saturating_add(rx),
                at: now,
            };
            r.nvlink_bandwidth = Some(nvlink_bandwidth(g.nvlink_prev, sum));
            r.nvlink_tx_bytes = Some(tx as f64 * 1024.0);
            r.nvlink_rx_bytes = Some(rx as f64 * 1024.0);
            g.nvlink_prev = Some(sum);
        }
    }
    let (tx, rx) = pcie_totals.unzip();
    pcie(&mut r, g, tx, rx, now, d);
    r
}

/// PCIe byte counters and rates: the rate since the previous scrape from the poller's 64-bit
/// totals of NVML's counters; at the first scrape, or without those counters, NVML's throughput
/// sample (KB/s over 20 ms).
fn pcie(r: &mut Reading, g: &mut Gpu, tx: Option<u64>, rx: Option<u64>, now: Instant, d: &Device) {
    let sample = |c| d.pcie_throughput(c).ok().map(|kb| f64::from(kb) * 1024.0);
    match (tx, rx) {
        (Some(tx), Some(rx)) => {
            let (tx, rx) = (
                Counted { value: tx, at: now },
                Counted { value: rx, at: now },
            );
            let prev = g.pcie_prev.replace((tx, rx));
            r.pcie_tx_bytes = Some(tx.value as f64);
            r.pcie_rx_bytes = Some(rx.value as f64);
            r.pcie_tx_rate = rate(prev.map(|p| p.0), tx).or_else(|| sample(PcieUtilCounter::Send));
            r.pcie_rx_rate =
                rate(prev.map(|p| p.1), rx).or_else(|| sample(PcieUtilCounter::Receive));
        }
        _ => {
            r.pcie_tx_rate = sample(PcieUtilCounter::Send);
            r.pcie_rx_rate = sample(PcieUtilCounter::Receive);
        }
    }
}

/// `nvmlDeviceGetFieldValues` for (field, scope) pairs; None when the call itself fails (each
/// value then says whether it was read).
fn field_values(nvml: &Nvml, d: &Device, ids: &[(u32, u32)]) -> Option<Vec<sys::nvmlFieldValue_t>> {
    let f = nvml.lib().nvmlDeviceGetFieldValues.as_ref().ok()?;
    let mut v: Vec<sys::nvmlFieldValue_t> = ids
        .iter()
        .map(|&(id, scope)| {
            // SAFETY: a zeroed nvmlFieldValue_t is valid (plain data).
            let mut f: sys::nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            f.fieldId = id;
            f.scopeId = scope;
            f
        })
        .collect();
    // SAFETY: the device handle is live; `v` holds `v.len()` initialised values NVML fills.
    let rc = unsafe { f(d.handle(), v.len() as i32, v.as_mut_ptr()) };
    nvml_try(rc).ok()?;
    Some(v)
}

/// `nvmlDeviceGetRemappedRows`: correctable, uncorrectable, pending, failure.
fn remapped_rows(nvml: &Nvml, d: &Device) -> Option<[u32; 4]> {
    let f = nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok()?;
    let mut v = [0u32; 4];
    let [a, b, c, e] = &mut v;
    // SAFETY: a live handle and four out-parameters.
    let rc = unsafe { f(d.handle(), a, b, c, e) };
    nvml_try(rc).ok()?;
    Some(v)
}

/// A new event set, or None (an NVML without events: no XID metrics).
fn event_set(nvml: &Nvml) -> Option<EventSet> {
    let lib = nvml.lib();
    let create = lib.nvmlEventSetCreate.as_ref().ok()?;
    let free = *lib.nvmlEventSetFree.as_ref().ok()?;
    lib.nvmlEventSetWait_v2.as_ref().ok()?;
    let mut set: sys::nvmlEventSet_t = std::ptr::null_mut();
    // SAFETY: one out-parameter.
    nvml_try(unsafe { create(&mut set) }).ok()?;
    Some(EventSet { set, free })
}

/// Register a GPU's critical XID events in `set`.
fn register_xids(
    nvml: &Nvml,
    handle: sys::nvmlDevice_t,
    set: sys::nvmlEventSet_t,
) -> Result<(), NvmlError> {
    let f = nvml
        .lib()
        .nvmlDeviceRegisterEvents
        .as_ref()
        .map_err(|_| NvmlError::FunctionNotFound)?;
    // SAFETY: a live handle and a live set.
    nvml_try(unsafe { f(handle, EVENT_XID, set) })
}

/// Take the XID events NVML holds now (no waiting) into their GPUs.
fn drain_xids(nvml: &Nvml, set: &EventSet, gpus: &mut [Gpu]) {
    let Ok(wait) = nvml.lib().nvmlEventSetWait_v2.as_ref() else {
        return;
    };
    for _ in 0..MAX_EVENTS_PER_SCRAPE {
        // SAFETY: zeroed event data is valid (plain data).
        let mut e: sys::nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: a live set and one out-parameter; a 0 ms timeout returns at once.
        if unsafe { wait(set.set, &mut e, 0) } != sys::nvmlReturn_enum_NVML_SUCCESS {
            return;
        }
        if e.eventType & EVENT_XID == 0 {
            continue;
        }
        if let Some(x) = gpus
            .iter_mut()
            .find(|g| g.handle == e.device as usize)
            .and_then(|g| g.xids.as_mut())
        {
            x.record(e.eventData);
        }
    }
}

/// HELP and TYPE of the device families: dcgm-exporter's names, types and units (its default
/// counters CSV; the PCIe rates are its `DCGM_FI_PROF_PCIE_*_BYTES`), and gpufl's own counters
/// for what `rate()`/`increase()` wants.
pub fn families(page: &mut Page) {
    use Kind::*;
    let f = [
        ("DCGM_FI_DEV_SM_CLOCK", Gauge, "SM clock frequency (in MHz)."),
        ("DCGM_FI_DEV_MEM_CLOCK", Gauge, "Memory clock frequency (in MHz)."),
        ("DCGM_FI_DEV_GPU_TEMP", Gauge, "GPU temperature (in C)."),
        ("DCGM_FI_DEV_MEMORY_TEMP", Gauge, "Memory temperature (in C)."),
        ("DCGM_FI_DEV_POWER_USAGE", Gauge, "Power draw (in W)."),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", Counter, "Total energy consumption since boot (in mJ)."),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Counter, "Total number of PCIe retries."),
        ("DCGM_FI_DEV_GPU_UTIL", Gauge, "GPU utilization (in %)."),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", Gauge, "Memory utilization (in %)."),
        ("DCGM_FI_DEV_ENC_UTIL", Gauge, "Encoder utilization (in %)."),
        ("DCGM_FI_DEV_DEC_UTIL", Gauge, "Decoder utilization (in %)."),
        ("DCGM_FI_DEV_FB_FREE", Gauge, "Framebuffer memory free (in MiB)."),
        ("DCGM_FI_DEV_FB_USED", Gauge, "Framebuffer memory used (in MiB)."),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", Gauge, "Current clock throttle (clocks event) reasons, NVML's bitmask (4 SW power cap, 8 HW slowdown, 32 SW thermal, 64 HW thermal, 128 HW power brake)."),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", Counter, "Total number of single-bit volatile ECC errors (GPUs with ECC on)."),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Counter, "Total number of double-bit volatile ECC errors (GPUs with ECC on)."),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", Gauge, "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second (NVML's byte counter, read every 25 ms, since the previous scrape; at the first, NVML's 20 ms sample)."),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", Gauge, "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second (NVML's byte counter, read every 25 ms, since the previous scrape; at the first, NVML's 20 ms sample)."),
        ("gpufl_gpu_pcie_tx_bytes_total", Counter, "Bytes transmitted over PCIe (NVML's counter); rate() gives bytes/s."),
        ("gpufl_gpu_pcie_rx_bytes_total", Counter, "Bytes received over PCIe (NVML's counter); rate() gives bytes/s."),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", Counter, "Total number of NVLink bandwidth counters for all lanes: as DCGM computes it, NVLink data received + transmitted over all links since the previous reading (scrape), in KiB/s / 1000; 0 at the first scrape. A rate, though dcgm-exporter types it counter."),
        ("gpufl_gpu_nvlink_tx_bytes_total", Counter, "NVLink data bytes transmitted, all links (NVML's counter, KiB granularity); rate() gives bytes/s."),
        ("gpufl_gpu_nvlink_rx_bytes_total", Counter, "NVLink data bytes received, all links (NVML's counter, KiB granularity); rate() gives bytes/s."),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", Counter, "Number of remapped rows for uncorrectable errors."),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", Counter, "Number of remapped rows for correctable errors."),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", Gauge, "Whether remapping of rows has failed (1: the GPU needs service)."),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", Gauge, "Whether remapping of rows is pending (1: a GPU reset applies it)."),
        ("DCGM_FI_DEV_XID_ERRORS", Gauge, "Value of the last XID error encountered (0 until one since the exporter started; err_code and err_msg name it)."),
        ("gpufl_gpu_xid_errors_total", Counter, "XID errors (NVML's critical XID events) since the exporter started; increase() > 0: an XID in the window, DCGM_FI_DEV_XID_ERRORS says which."),
    ];
    for (name, kind, help) in f {
        page.family(name, kind, help);
    }
}

/// The clocks-event reasons with every bit the driver sets (nvml-wrapper's own call drops the
/// bits it does not know): `nvmlDeviceGetCurrentClocksEventReasons`, or its older name. The same
/// call as the recorder's telemetry (gpufl-capture `telemetry.rs`).
fn throttle_reasons(nvml: &Nvml, d: &Device) -> Result<u64, NvmlError> {
    let lib = nvml.lib();
    // SAFETY: the handle belongs to this live NVML instance.
    let h = unsafe { d.handle() };
    let mut v: std::os::raw::c_ulonglong = 0;
    // SAFETY: both functions take (nvmlDevice_t, unsigned long long *) and write one value.
    let rc = if let Ok(f) = lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref() {
        unsafe { f(h, &mut v) }
    } else if let Ok(f) = lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref() {
        unsafe { f(h, &mut v) }
    } else {
        return Err(NvmlError::FunctionNotFound);
    };
    nvml_try(rc)?;
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fv(
        ty: sys::nvmlValueType_t,
        ret: sys::nvmlReturn_t,
        set: impl FnOnce(&mut sys::nvmlValue_t),
    ) -> sys::nvmlFieldValue_t {
        // SAFETY: plain data.
        let mut f: sys::nvmlFieldValue_t = unsafe { std::mem::zeroed() };
        f.valueType = ty;
        f.nvmlReturn = ret;
        set(&mut f.value);
        f
    }

    #[test]
    fn pcie_totals_sum_the_wrapping_increments() {
        let mut a = PcieAcc::default();
        a.add(4_000_000_000, true);
        assert_eq!(a.total, 4_000_000_000, "the first reading starts the total");
        // 27 GB/s for 25 ms: 675 MB, past 2^32.
        a.add((4_000_000_000u64 + 675_000_000) % (1 << 32), true);
        assert_eq!(a.total, 4_675_000_000);
        for _ in 0..40 {
            let next = (a.total + 675_000_000) % (1 << 32);
            a.add(next, true);
        }
        assert_eq!(
            a.total,
            4_675_000_000 + 40 * 675_000_000,
            "a second of wraps"
        );
        // A 64-bit counter does not wrap; one that went back was reset.
        let mut b = PcieAcc::default();
        b.add(1 << 40, false);
        b.add((1 << 40) + 5, false);
        assert_eq!(b.total, (1 << 40) + 5);
        b.add(3, false);
        assert_eq!(b.total, (1 << 40) + 8);
    }

    #[test]
    fn field_values_by_type() {
        use sys::*;
        let ok = nvmlReturn_enum_NVML_SUCCESS;
        let ull = fv(
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            ok,
            |v| v.ullVal = 1 << 40,
        );
        assert_eq!(field_u64(&ull), Some(1 << 40));
        let ui = fv(nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT, ok, |v| {
            v.uiVal = 7
        });
        assert_eq!(field_u64(&ui), Some(7));
        let neg = fv(
            nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG,
            ok,
            |v| v.sllVal = -1,
        );
        assert_eq!(field_u64(&neg), None);
        let d = fv(nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE, ok, |v| {
            v.dVal = 12.9
        });
        assert_eq!(field_u64(&d), Some(12));
        let failed = fv(nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT, 3, |v| {
            v.uiVal = 7
        });
        assert_eq!(field_u64(&failed), None);
        // Memory temperature: the unsigned member even when NVML states double, as DCGM reads it.
        let t = fv(nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE, ok, |v| {
            v.uiVal = 61
        });
        assert_eq!(memory_temp(&t), Some(61.0));
        let hot = fv(nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT, ok, |v| {
            v.uiVal = 201
        });
        assert_eq!(memory_temp(&hot), None);
        assert_eq!(memory_temp(&failed), None);
    }

    #[test]
    fn rates_between_readings() {
        let t0 = Instant::now();
        let c = |value, ms| Counted {
            value,
            at: t0 + Duration::from_millis(ms),
        };
        assert_eq!(rate(None, c(100, 0)), None);
        assert_eq!(rate(Some(c(100, 0)), c(100_100, 2000)), Some(50_000.0));
        assert_eq!(rate(Some(c(100, 0)), c(50, 2000)), None, "went back");
        assert_eq!(rate(Some(c(100, 0)), c(200, 0)), None, "no time");
        // DCGM's NVLink figure: KiB/s / 1000, 0 first; 30 GB/s of data for 15 s.
        let kib = 30_000_000_000u64 / 1024;
        assert_eq!(nvlink_bandwidth(None, c(5, 0)), 0.0);
        assert_eq!(
            nvlink_bandwidth(Some(c(1_000, 0)), c(1_000 + kib * 15, 15_000)),
            29_296.0
        );
        assert_eq!(nvlink_bandwidth(Some(c(1_000, 0)), c(0, 15_000)), 0.0);
    }

    #[test]
    fn a_reading_under_dcgm_exporters_names() {
        let mut page = Page::default();
        families(&mut page);
        let labels = [
            ("gpu", "0"),
            ("UUID", "GPU-1"),
            ("pci_bus_id", "00000000:19:00.0"),
            ("device", "nvidia0"),
            ("modelName", "NVIDIA H100 80GB HBM3"),
            ("Hostname", "n1"),
        ];
        let mut xids = Xids::default();
        let r = Reading {
            gpu_temp: Some(34.0),
            memory_temp: Some(41.0),
            enc_util: Some(0.0),
            dec_util: Some(12.0),
            pcie_tx_rate: Some(1.5e9),
            nvlink_bandwidth: Some(29_296.0),
            remapped_correctable: Some(0.0),
            remapped_uncorrectable: Some(2.0),
            remap_failure: Some(0.0),
            remap_pending: Some(1.0),
            xids: Some(xids),
            ..Reading::default()
        };
        write(&mut page, &labels, &r);
        xids.record(13);
        xids.record(79);
        write(
            &mut page,
            &[("gpu", "1"), ("Hostname", "n1")],
            &Reading {
                xids: Some(xids),
                ..Reading::default()
            },
        );
        let text = page.render();
        let l = "gpu=\"0\",UUID=\"GPU-1\",pci_bus_id=\"00000000:19:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"n1\"";
        for line in [
            "# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge".to_string(),
            "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter".to_string(),
            "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge".to_string(),
            "# TYPE DCGM_FI_DEV_XID_ERRORS gauge".to_string(),
            format!("DCGM_FI_DEV_GPU_TEMP{{{l}}} 34"),
            format!("DCGM_FI_DEV_MEMORY_TEMP{{{l}}} 41"),
            format!("DCGM_FI_DEV_ENC_UTIL{{{l}}} 0"),
            format!("DCGM_FI_DEV_DEC_UTIL{{{l}}} 12"),
            format!("DCGM_FI_PROF_PCIE_TX_BYTES{{{l}}} 1500000000"),
            format!("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{l}}} 29296"),
            format!("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{l}}} 2"),
            format!("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{l}}} 0"),
            format!("DCGM_FI_DEV_ROW_REMAP_FAILURE{{{l}}} 0"),
            format!("DCGM_FI_DEV_ROW_REMAP_PENDING{{{l}}} 1"),
            format!("DCGM_FI_DEV_XID_ERRORS{{{l},err_code=\"0\",err_msg=\"No Error\"}} 0"),
            format!("gpufl_gpu_xid_errors_total{{{l}}} 0"),
            "DCGM_FI_DEV_XID_ERRORS{gpu=\"1\",Hostname=\"n1\",err_code=\"79\",err_msg=\"GPU has fallen off the bus\"} 79".to_string(),
            "gpufl_gpu_xid_errors_total{gpu=\"1\",Hostname=\"n1\"} 2".to_string(),
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} missing in\n{text}");
        }
        // What NVML did not give is absent, not 0.
        assert!(!text.contains("DCGM_FI_DEV_SM_CLOCK{"));
        assert!(!text.contains("DCGM_FI_PROF_PCIE_RX_BYTES{"));
        assert_eq!(xid_message(48), "Double Bit ECC Error");
        assert_eq!(xid_message(9999), "Unknown Error");
    }
}
