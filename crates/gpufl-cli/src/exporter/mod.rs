//! `gpufl exporter`: Prometheus metrics for a GPU node — the devices (NVML, under dcgm-exporter's
//! names and labels) and the processes gpufl records on the node (fed by their recorders over a
//! Unix datagram socket, about once a second each). See README "Production metrics" and
//! docs/architecture.md.
//!
//! Two threads: one receives the recorders' datagrams into the process table, one serves HTTP
//! (`/metrics`). Between scrapes nothing runs but the receiver, woken by datagrams; NVML is read
//! at each scrape.

pub mod device;
pub mod k8s;
pub mod procs;
pub mod text;

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use text::{Kind, Page};

/// dcgm-exporter listens on 9400; gpufl's exporter next to it, so both can run on one node
/// (`--listen :9400` to take dcgm-exporter's place).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9401";
/// HTTP connections served at once (more wait in the listen queue).
const MAX_CONNECTIONS: usize = 8;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a missing NVML is looked for again (at a scrape).
const NVML_RETRY: Duration = Duration::from_secs(60);

#[derive(clap::Args)]
pub struct ExporterArgs {
    /// Address to serve /metrics on (`HOST:PORT` or `:PORT`).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    listen: String,
    /// The socket recorders send to. Default: $GPUFL_EXPORTER_SOCKET, else
    /// /run/gpufl/exporter.sock as root, else /tmp/gpufl-<uid>/exporter.sock.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Seconds after its last datagram that a process leaves the metrics.
    #[arg(long, default_value_t = 10)]
    stale_secs: u64,
    /// Serve only gpufl's own metrics (when dcgm-exporter runs on the node too).
    #[arg(long)]
    no_device_metrics: bool,
}

struct State {
    table: procs::Table,
    devices: Option<device::Devices>,
    devices_tried: Instant,
    host: String,
    scrapes: u64,
}

pub fn run(args: ExporterArgs) -> Result<i32> {
    let listen = if args.listen.starts_with(':') {
        format!("0.0.0.0{}", args.listen)
    } else {
        args.listen.clone()
    };
    let listener =
        TcpListener::bind(&listen).with_context(|| format!("cannot listen on {listen}"))?;
    let socket_path = args.socket.clone().unwrap_or_else(procs::default_socket);
    let sock = procs::bind(&socket_path)?;
    let devices = (!args.no_device_metrics).then(device::Devices::open);
    let local = listener.local_addr()?;
    eprintln!(
        "gpufl exporter: serving http://{local}/metrics; recorders feed {}{}",
        socket_path.display(),
        match devices.as_ref().and_then(|d| d.missing()) {
            Some(why) => format!("; no device metrics: {why}"),
            None if args.no_device_metrics => "; device metrics off".to_string(),
            None => String::new(),
        }
    );
    let state = Arc::new(Mutex::new(State {
        table: procs::Table::new(Duration::from_secs(args.stale_secs)),
        devices,
        devices_tried: Instant::now(),
        host: hostname(),
        scrapes: 0,
    }));
    {
        let state = state.clone();
        std::thread::Builder::new()
            .name("feed".into())
            .spawn(move || receive(sock, state))?;
    }
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            let _ = respond(conn, "503 Service Unavailable", "text/plain", b"busy\n");
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (st, act) = (state.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                let _ = serve(conn, &st);
                act.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::AcqRel);
        }
    }
    Ok(0)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The receiver thread: every datagram into the table.
fn receive(sock: std::os::unix::net::UnixDatagram, state: Arc<Mutex<State>>) {
    let mut buf = vec![0u8; gpufl_trace::feed::MAX_DATAGRAM + 1];
    loop {
        match procs::recv(&sock, &mut buf) {
            Ok((n, pid)) => {
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                s.table.take(&buf[..n.min(buf.len())], pid, Instant::now());
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// One HTTP connection: one request, one response, closed.
fn serve(mut conn: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(READ_TIMEOUT))?;
    conn.set_write_timeout(Some(READ_TIMEOUT))?;
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = req.split(|&b| b == b'\n').next().unwrap_or(b"");
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return respond(conn, "405 Method Not Allowed", "text/plain", b"GET only\n");
    }
    match path {
        "/metrics" => {
            let body = {
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                scrape(&mut s)
            };
            let body = if method == "HEAD" { String::new() } else { body };
            respond(
                conn,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                body.as_bytes(),
            )
        }
        "/" => respond(
            conn,
            "200 OK",
            "text/html; charset=utf-8",
            b"<html><body><h1>gpufl exporter</h1><p><a href=\"/metrics\">/metrics</a></p></body></html>\n",
        ),
        _ => respond(conn, "404 Not Found", "text/plain", b"not found\n"),
    }
}

fn respond(mut conn: TcpStream, status: &str, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

/// The /metrics page.
fn scrape(s: &mut State) -> String {
    s.scrapes += 1;
    let now = Instant::now();
    s.table.expire(now);
    if s.devices.as_ref().is_some_and(|d| d.missing().is_some())
        && now.duration_since(s.devices_tried) >= NVML_RETRY
    {
        s.devices = Some(device::Devices::open());
        s.devices_tried = now;
    }
    let mut page = Page::default();
    let missing = match &s.devices {
        None => Some("turned off (--no-device-metrics)"),
        Some(d) => d.missing(),
    };
    let help = match missing {
        None => "1: device metrics (DCGM_FI_*) come from NVML; 0: they are missing, and `reason` says why.".to_string(),
        Some(why) => format!("0: device metrics (DCGM_FI_*) are missing: {why}. Process metrics (gpufl_process_*) are still served."),
    };
    page.family("gpufl_exporter_device_metrics", Kind::Gauge, &help);
    match missing {
        None => page.sample(
            "gpufl_exporter_device_metrics",
            &[("Hostname", &s.host), ("reason", "")],
            1.0,
        ),
        Some(why) => page.sample(
            "gpufl_exporter_device_metrics",
            &[("Hostname", &s.host), ("reason", why)],
            0.0,
        ),
    }
    let meta = [
        (
            "gpufl_exporter_processes",
            Kind::Gauge,
            "Processes whose recorders reported within the stale period.",
            s.table.len() as f64,
        ),
        (
            "gpufl_exporter_feed_datagrams_total",
            Kind::Counter,
            "Status datagrams received from recorders.",
            s.table.datagrams as f64,
        ),
        (
            "gpufl_exporter_feed_rejected_total",
            Kind::Counter,
            "Datagrams refused (not a status, too large, unknown version).",
            s.table.rejected as f64,
        ),
        (
            "gpufl_exporter_processes_refused_total",
            Kind::Counter,
            "Statuses of new processes refused because the table was full (256 processes).",
            s.table.refused_full as f64,
        ),
        (
            "gpufl_exporter_scrapes_total",
            Kind::Counter,
            "Scrapes of /metrics served.",
            s.scrapes as f64,
        ),
    ];
    for (name, kind, help, v) in meta {
        page.family(name, kind, help);
        page.sample(name, &[("Hostname", &s.host)], v);
    }
    if let Some((cpu, rss)) = self_usage() {
        page.family(
            "process_cpu_seconds_total",
            Kind::Counter,
            "Total user and system CPU time spent in seconds.",
        );
        page.sample("process_cpu_seconds_total", &[], cpu);
        page.family(
            "process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory size in bytes.",
        );
        page.sample("process_resident_memory_bytes", &[], rss);
    }
    match &mut s.devices {
        Some(d) => d.render(&mut page, &s.host),
        None => device::families(&mut page),
    }
    s.table.render(&mut page, &s.host);
    page.render()
}

/// This process's CPU seconds and resident bytes, from /proc/self/stat.
fn self_usage() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (utime, stime, rss) = parse_stat(&stat)?;
    // SAFETY: sysconf has no preconditions.
    let (hz, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (hz > 0).then(|| ((utime + stime) as f64 / hz as f64, (rss * page) as f64))
}

/// utime, stime (clock ticks) and rss (pages) of a /proc/PID/stat line.
pub fn parse_stat(stat: &str) -> Option<(u64, u64, i64)> {
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): utime is field 14, stime 15, rss 24.
    Some((
        f.get(11)?.parse().ok()?,
        f.get(12)?.parse().ok()?,
        f.get(21)?.parse().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields() {
        let line = "42 (a b) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 3 0 100 12345 99 18446744073709551615";
        assert_eq!(parse_stat(line), Some((7, 3, 99)));
    }

    #[test]
    fn a_scrape_without_nvml_says_why() {
        let mut s = State {
            table: procs::Table::new(Duration::from_secs(10)),
            devices: Some(device::Devices::Missing(
                "NVML (libnvidia-ml.so.1) unavailable: test".into(),
            )),
            devices_tried: Instant::now(),
            host: "h".into(),
            scrapes: 0,
        };
        let page = scrape(&mut s);
        assert!(page.contains("# HELP gpufl_exporter_device_metrics 0: device metrics (DCGM_FI_*) are missing: NVML (libnvidia-ml.so.1) unavailable: test."));
        assert!(page.contains("gpufl_exporter_device_metrics{Hostname=\"h\",reason=\"NVML (libnvidia-ml.so.1) unavailable: test\"} 0"));
        assert!(page.contains("# TYPE DCGM_FI_DEV_GPU_UTIL gauge"));
        assert!(page.contains("# TYPE gpufl_process_sync_seconds_total counter"));
        assert!(page.contains("gpufl_exporter_scrapes_total{Hostname=\"h\"} 1"));
    }
}
