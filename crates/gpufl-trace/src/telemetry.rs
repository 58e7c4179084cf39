//! The `telemetry` record: one NVML sample of one GPU, taken by the recorder's sampling thread
//! (every 100 ms by default). See `docs/trace-format.md` for the schema.

use serde::{Deserialize, Serialize};

/// One telemetry sample of one GPU. Every metric is optional: a metric the GPU, its driver or its
/// configuration does not provide (ECC off, no power sensor, a query that failed) is **absent**,
/// never 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Telemetry {
    /// When the sample was taken (just before its first query), ns on the CUPTI clock like every
    /// `start`/`end`/`ts` field.
    pub ts: u64,
    /// CUDA device ordinal (`header.gpus[].index`), matched to NVML's device by UUID.
    pub dev: u32,
    /// GPU utilization, percent: share of NVML's last sample period (1/6 s to 1 s depending on the
    /// product) during which one or more kernels ran, any process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util: Option<u32>,
    /// Memory utilization, percent: share of the same period during which device memory was read
    /// or written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_util: Option<u32>,
    /// Device memory in use, bytes (all processes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_used: Option<u64>,
    /// Device memory in all, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_total: Option<u64>,
    /// GPU core temperature, °C.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_c: Option<u32>,
    /// Board power draw, mW.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_mw: Option<u32>,
    /// SM clock, MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_mhz: Option<u32>,
    /// Memory clock, MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mhz: Option<u32>,
    /// Maximum SM clock of the device, MHz (read once per session, repeated in every sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_max_mhz: Option<u32>,
    /// NVML's clocks-event (clock-throttle) reasons: a bitmask, see [`throttle`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<u64>,
    /// Corrected ECC errors since the driver loaded (volatile counter); absent when ECC is off or
    /// not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_corr: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded (volatile counter); absent when ECC is off
    /// or not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_uncorr: Option<u64>,
    /// PCIe transmit throughput (GPU to host), KB/s (1 KB = 1000 bytes), since the previous
    /// sample of this GPU; absent in the first sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_tx_kbs: Option<u64>,
    /// PCIe receive throughput (host to GPU), KB/s, since the previous sample of this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_rx_kbs: Option<u64>,
}

/// Bits of [`Telemetry::throttle`]: NVML's `nvmlClocksEventReason*` (formerly
/// `nvmlClocksThrottleReason*`) values. Bits not listed here may be set by newer drivers and are
/// kept as recorded.
pub mod throttle {
    /// Nothing runs on the GPU: clocks are low because it is idle (not throttling).
    pub const GPU_IDLE: u64 = 0x1;
    /// Clocks limited by the applications-clocks setting (`nvidia-smi -ac`).
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    /// Software power cap: the driver lowers clocks to keep power under the power limit.
    pub const SW_POWER_CAP: u64 = 0x4;
    /// Hardware slowdown (clocks cut by half or more): temperature, power brake or an external
    /// signal.
    pub const HW_SLOWDOWN: u64 = 0x8;
    /// Clocks held to those of other GPUs of a sync-boost group.
    pub const SYNC_BOOST: u64 = 0x10;
    /// Software thermal slowdown: GPU or memory temperature above its limit.
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    /// Hardware thermal slowdown: temperature too high.
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    /// Hardware power brake: the external power brake assertion (e.g. the power supply).
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
    /// Clocks held for the display.
    pub const DISPLAY_CLOCK_SETTING: u64 = 0x100;

    /// Power throttling: [`SW_POWER_CAP`] or [`HW_POWER_BRAKE_SLOWDOWN`].
    pub const POWER: u64 = SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN;
    /// Thermal throttling: [`SW_THERMAL_SLOWDOWN`] or [`HW_THERMAL_SLOWDOWN`].
    pub const THERMAL: u64 = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN;
    /// Every reason that slows a busy GPU down against its will: power, thermal, and
    /// [`HW_SLOWDOWN`] (which NVML sets for either cause). Idle, application and display clocks
    /// and sync boost are settings, not throttling.
    pub const THROTTLING: u64 = POWER | THERMAL | HW_SLOWDOWN;
}
