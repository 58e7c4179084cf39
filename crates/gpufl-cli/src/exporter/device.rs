//! Device metrics from NVML, under dcgm-exporter's names, units and labels, read at each scrape
//! (nothing runs between scrapes). NVML (`libnvidia-ml.so.1`) is loaded at run time through
//! `nvml-wrapper`, as the recorder's telemetry does: nothing to link, and without it the exporter
//! still serves the process metrics and says why the device ones are missing.

use super::text::{Kind, Page};
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};
use std::ffi::OsStr;

const NVML_LIB: &str = "libnvidia-ml.so.1";
/// `NVML_FI_DEV_PCIE_COUNT_TX_BYTES` / `RX_BYTES` (nvml.h): cumulative PCIe byte counters.
const FI_PCIE_TX_BYTES: u32 = 197;
const FI_PCIE_RX_BYTES: u32 = 198;

/// A GPU's labels, as dcgm-exporter writes them.
pub struct Gpu {
    index: u32,
    uuid: String,
    pci_bus_id: String,
    device: String,
    model: String,
    ecc: bool,
}

/// NVML and its GPUs, or why not.
pub enum Devices {
    Nvml { nvml: Box<Nvml>, gpus: Vec<Gpu> },
    Missing(String),
}

impl Devices {
    /// Load NVML and list its GPUs.
    pub fn open() -> Devices {
        let nvml = match Nvml::builder().lib_path(OsStr::new(NVML_LIB)).init() {
            Ok(n) => n,
            Err(e) => return Devices::Missing(format!("NVML ({NVML_LIB}) unavailable: {e}")),
        };
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => return Devices::Missing(format!("NVML cannot count GPUs: {e}")),
        };
        let gpus = (0..count)
            .filter_map(|i| {
                let d = nvml.device_by_index(i).ok()?;
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
                })
            })
            .collect();
        Devices::Nvml {
            nvml: Box::new(nvml),
            gpus,
        }
    }

    /// Why device metrics are missing, if they are.
    pub fn missing(&self) -> Option<&str> {
        match self {
            Devices::Missing(why) => Some(why),
            Devices::Nvml { gpus, .. } if gpus.is_empty() => Some("NVML lists no GPU"),
            Devices::Nvml { .. } => None,
        }
    }

    /// Read every GPU now and add its samples.
    pub fn render(&self, page: &mut Page, host: &str) {
        families(page);
        let Devices::Nvml { nvml, gpus } = self else {
            return;
        };
        for g in gpus {
            let Ok(d) = nvml.device_by_index(g.index) else {
                continue;
            };
            let gpu = g.index.to_string();
            let labels = [
                ("gpu", gpu.as_str()),
                ("UUID", g.uuid.as_str()),
                ("pci_bus_id", g.pci_bus_id.as_str()),
                ("device", g.device.as_str()),
                ("modelName", g.model.as_str()),
                ("Hostname", host),
            ];
            let mut put = |name: &'static str, v: Option<f64>| {
                if let Some(v) = v {
                    page.sample(name, &labels, v);
                }
            };
            put(
                "DCGM_FI_DEV_SM_CLOCK",
                d.clock_info(Clock::SM).ok().map(f64::from),
            );
            put(
                "DCGM_FI_DEV_MEM_CLOCK",
                d.clock_info(Clock::Memory).ok().map(f64::from),
            );
            put(
                "DCGM_FI_DEV_GPU_TEMP",
                d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
            );
            put(
                "DCGM_FI_DEV_POWER_USAGE",
                d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            );
            put(
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                d.total_energy_consumption().ok().map(|mj| mj as f64),
            );
            put(
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                d.pcie_replay_counter().ok().map(f64::from),
            );
            if let Ok(u) = d.utilization_rates() {
                put("DCGM_FI_DEV_GPU_UTIL", Some(f64::from(u.gpu)));
                put("DCGM_FI_DEV_MEM_COPY_UTIL", Some(f64::from(u.memory)));
            }
            if let Ok(m) = d.memory_info() {
                const MIB: f64 = 1024.0 * 1024.0;
                put("DCGM_FI_DEV_FB_FREE", Some((m.free as f64 / MIB).floor()));
                put("DCGM_FI_DEV_FB_USED", Some((m.used as f64 / MIB).floor()));
            }
            put(
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                throttle_reasons(nvml, &d).ok().map(|v| v as f64),
            );
            if g.ecc {
                put(
                    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                    d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                        .ok()
                        .map(|v| v as f64),
                );
                put(
                    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                    d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                        .ok()
                        .map(|v| v as f64),
                );
            }
            if let Ok(v) =
                d.field_values_for(&[FieldId(FI_PCIE_TX_BYTES), FieldId(FI_PCIE_RX_BYTES)])
            {
                let read = |i: usize| -> Option<f64> {
                    let f = v.get(i)?.as_ref().ok()?;
                    match f.value.as_ref().ok()? {
                        SampleValue::U32(x) => Some(f64::from(*x)),
                        SampleValue::U64(x) => Some(*x as f64),
                        _ => None,
                    }
                };
                put("gpufl_gpu_pcie_tx_bytes_total", read(0));
                put("gpufl_gpu_pcie_rx_bytes_total", read(1));
            }
        }
    }
}

/// HELP and TYPE of the device families. dcgm-exporter's names and units (its default counters
/// CSV); the PCIe byte counters are gpufl's own names since DCGM's `DCGM_FI_PROF_PCIE_*_BYTES` are
/// rates from the profiling module, not NVML's cumulative counters.
pub fn families(page: &mut Page) {
    use Kind::*;
    let f = [
        ("DCGM_FI_DEV_SM_CLOCK", Gauge, "SM clock frequency (in MHz)."),
        ("DCGM_FI_DEV_MEM_CLOCK", Gauge, "Memory clock frequency (in MHz)."),
        ("DCGM_FI_DEV_GPU_TEMP", Gauge, "GPU temperature (in C)."),
        ("DCGM_FI_DEV_POWER_USAGE", Gauge, "Power draw (in W)."),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", Counter, "Total energy consumption since boot (in mJ)."),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Counter, "Total number of PCIe retries."),
        ("DCGM_FI_DEV_GPU_UTIL", Gauge, "GPU utilization (in %)."),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", Gauge, "Memory utilization (in %)."),
        ("DCGM_FI_DEV_FB_FREE", Gauge, "Framebuffer memory free (in MiB)."),
        ("DCGM_FI_DEV_FB_USED", Gauge, "Framebuffer memory used (in MiB)."),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", Gauge, "Current clock throttle (clocks event) reasons, NVML's bitmask (4 SW power cap, 8 HW slowdown, 32 SW thermal, 64 HW thermal, 128 HW power brake)."),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", Counter, "Total number of single-bit volatile ECC errors (GPUs with ECC on)."),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Counter, "Total number of double-bit volatile ECC errors (GPUs with ECC on)."),
        ("gpufl_gpu_pcie_tx_bytes_total", Counter, "Bytes transmitted over PCIe (NVML's counter); rate() gives bytes/s."),
        ("gpufl_gpu_pcie_rx_bytes_total", Counter, "Bytes received over PCIe (NVML's counter); rate() gives bytes/s."),
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
