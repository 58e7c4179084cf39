//! The processes the recorders on this node report: the feed socket, the table of their last
//! statuses, and their metrics.
//!
//! Cardinality: at most [`MAX_PROCS`] processes at once (a full table refuses new ones and counts
//! them), each with at most `feed::MAX_GPUS` GPUs, `feed::TOP_LINES` line series and
//! `feed::MAX_CALLS` call series; a process
//! leaves the table once its recorder has been silent for the stale period. An ended process
//! stays for that period too, so scrapes see its last totals and its `ended` status.
//!
//! A process that runs in a Kubernetes pod carries `pod`, `namespace` and `container` labels
//! ([`super::k8s`]), looked up once, when it first reports.

use super::k8s::{Lookup, Pod};
use super::text::{Kind, Page};
use gpufl_trace::feed::{self, Status};
use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Processes tracked at once.
pub const MAX_PROCS: usize = 256;
/// Statuses kept per process for the busy ratio (about one a second).
const RATIO_WINDOW: usize = 10;

/// One process's last status and what the exporter adds to it.
struct Proc {
    status: Status,
    /// (uptime, per-GPU busy seconds) of the last statuses, oldest first.
    history: VecDeque<(f64, Vec<(u32, f64)>)>,
    seen: Instant,
    /// Its pod, when it runs in one.
    pod: Option<Pod>,
}

/// The table of processes, keyed by the pid the kernel reports for the sender.
pub struct Table {
    procs: HashMap<u32, Proc>,
    stale: Duration,
    k8s: Lookup,
    pub datagrams: u64,
    pub rejected: u64,
    pub refused_full: u64,
}

impl Table {
    /// A table whose processes' pods are looked up on this host.
    pub fn new(stale: Duration) -> Table {
        Table::with_lookup(stale, Lookup::host())
    }

    /// A table whose processes' pods are looked up through `k8s`.
    pub fn with_lookup(stale: Duration, k8s: Lookup) -> Table {
        Table {
            procs: HashMap::new(),
            stale,
            k8s,
            datagrams: 0,
            rejected: 0,
            refused_full: 0,
        }
    }

    /// A datagram from process `pid` (the kernel's view; the datagram's own pid when the kernel
    /// could not say).
    pub fn take(&mut self, bytes: &[u8], cred_pid: Option<u32>, now: Instant) {
        let status = match Status::decode(bytes) {
            Ok(s) => s,
            Err(_) => {
                self.rejected += 1;
                return;
            }
        };
        self.datagrams += 1;
        let kernel_pid = cred_pid.filter(|&p| p != 0);
        let pid = kernel_pid.unwrap_or(status.pid);
        self.expire(now);
        if !self.procs.contains_key(&pid) && self.procs.len() >= MAX_PROCS {
            self.refused_full += 1;
            return;
        }
        // Only a pid of our PID namespace (the kernel's) names the process in /proc.
        let k8s = &self.k8s;
        let pod_of = || kernel_pid.and_then(|p| k8s.of(p));
        let p = self.procs.entry(pid).or_insert_with(|| Proc {
            status: status.clone(),
            history: VecDeque::new(),
            seen: now,
            pod: pod_of(),
        });
        // A new session under the same pid (pid reuse, or a second recording): start afresh.
        if p.status.session != status.session || status.uptime_s < p.status.uptime_s {
            p.history.clear();
            p.pod = pod_of();
        }
        p.history.push_back((
            status.uptime_s,
            status.gpus.iter().map(|g| (g.dev, g.busy_s)).collect(),
        ));
        while p.history.len() > RATIO_WINDOW {
            p.history.pop_front();
        }
        p.status = status;
        p.seen = now;
    }

    /// Drop processes silent for longer than the stale period.
    pub fn expire(&mut self, now: Instant) {
        let stale = self.stale;
        self.procs
            .retain(|_, p| now.saturating_duration_since(p.seen) <= stale);
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// The process metrics, for processes sorted by pid.
    pub fn render(&self, page: &mut Page, host: &str) {
        families(page);
        let mut pids: Vec<&u32> = self.procs.keys().collect();
        pids.sort();
        for pid in pids {
            let p = &self.procs[pid];
            let s = &p.status;
            let pid = pid.to_string();
            let mut base = vec![
                ("Hostname", host),
                ("pid", pid.as_str()),
                ("app", s.app.as_str()),
                ("job_id", s.job.as_str()),
            ];
            if let Some(pod) = &p.pod {
                base.extend(pod.labels());
            }
            fn with<'a>(
                base: &[(&'a str, &'a str)],
                extra: &[(&'a str, &'a str)],
            ) -> Vec<(&'a str, &'a str)> {
                let mut v = base.to_vec();
                v.extend_from_slice(extra);
                v
            }
            page.sample(
                "gpufl_process_recording",
                &with(
                    &base,
                    &[
                        ("status", s.status.as_str()),
                        ("session", s.session.as_str()),
                    ],
                ),
                1.0,
            );
            page.sample("gpufl_process_uptime_seconds", &base, s.uptime_s);
            page.sample("gpufl_process_sync_seconds_total", &base, s.sync_s);
            page.sample("gpufl_process_syncs_total", &base, s.syncs as f64);
            page.sample("gpufl_process_scope_records_total", &base, s.scopes as f64);
            for g in &s.gpus {
                let dev = g.dev.to_string();
                let l = with(&base, &[("gpu", dev.as_str()), ("UUID", g.uuid.as_str())]);
                page.sample("gpufl_process_gpu_busy_seconds_total", &l, g.busy_s);
                if let Some(r) = busy_ratio(&p.history, g.dev) {
                    page.sample("gpufl_process_gpu_busy_ratio", &l, r);
                }
                page.sample("gpufl_process_kernel_launches_total", &l, g.kernels as f64);
                page.sample("gpufl_process_copies_total", &l, g.copies as f64);
                page.sample("gpufl_process_gpu_sync_seconds_total", &l, g.sync_s);
                page.sample("gpufl_process_gpu_syncs_total", &l, g.syncs as f64);
                if let Some(b) = g.mem_bytes {
                    page.sample("gpufl_process_memory_allocated_bytes", &l, b as f64);
                }
                if let Some(b) = g.mem_peak_bytes {
                    page.sample("gpufl_process_memory_allocated_peak_bytes", &l, b as f64);
                }
            }
            for (i, t) in s.top.iter().enumerate() {
                let l = with(&base, &[("line", t.line.as_str())]);
                if i == 0 {
                    page.sample("gpufl_process_top_sync_seconds", &l, t.sync_s);
                }
                page.sample("gpufl_process_sync_line_seconds_total", &l, t.sync_s);
                page.sample("gpufl_process_sync_line_syncs_total", &l, t.syncs as f64);
            }
            for c in &s.hostcalls {
                let l = with(&base, &[("call", c.call.as_str())]);
                page.sample("gpufl_process_host_blocked_seconds_total", &l, c.blocked_s);
                page.sample("gpufl_process_host_blocked_calls_total", &l, c.calls as f64);
            }
        }
    }
}

/// GPU busy time over wall time across the statuses kept (about the last 10 s); over the whole
/// run while there is only one.
fn busy_ratio(h: &VecDeque<(f64, Vec<(u32, f64)>)>, dev: u32) -> Option<f64> {
    let busy = |e: &(f64, Vec<(u32, f64)>)| e.1.iter().find(|(d, _)| *d == dev).map(|x| x.1);
    let last = h.back()?;
    let (t0, b0) = match h.front() {
        Some(first) if h.len() > 1 => (first.0, busy(first).unwrap_or(0.0)),
        _ => (0.0, 0.0),
    };
    let dt = last.0 - t0;
    let b1 = busy(last)?;
    (dt > 0.0).then(|| ((b1 - b0) / dt).clamp(0.0, 1.0))
}

/// HELP and TYPE of every process family (present even when no process reports).
pub fn families(page: &mut Page) {
    use Kind::*;
    let f = [
        ("gpufl_process_recording", Gauge, "1 for each process a gpufl recorder on this node reports; status: recording, paused, scopes-only (no GPU capture), ended."),
        ("gpufl_process_uptime_seconds", Gauge, "Seconds since the process's recorder started."),
        ("gpufl_process_sync_seconds_total", Counter, "Host time blocked in CUDA synchronizations (seconds), all GPUs."),
        ("gpufl_process_syncs_total", Counter, "CUDA synchronizations recorded."),
        ("gpufl_process_scope_records_total", Counter, "Scope and NVTX range records written."),
        ("gpufl_process_gpu_busy_seconds_total", Counter, "Time the GPU ran this process's kernels, copies or memsets, overlaps counted once (seconds); rate() is the busy ratio."),
        ("gpufl_process_gpu_busy_ratio", Gauge, "GPU busy time / wall time of this process over about the last 10 s."),
        ("gpufl_process_kernel_launches_total", Counter, "Kernels recorded (in always-on mode: inside recorded windows only)."),
        ("gpufl_process_copies_total", Counter, "Memory copies and memsets recorded."),
        ("gpufl_process_gpu_sync_seconds_total", Counter, "Host time blocked in synchronizations on this GPU's contexts (seconds)."),
        ("gpufl_process_gpu_syncs_total", Counter, "Synchronizations on this GPU's contexts."),
        ("gpufl_process_memory_allocated_bytes", Gauge, "GPU-visible memory this process holds on this GPU: its allocations not yet freed, as CUDA sees them (PyTorch: its cached segments), bytes. NVML's per-process figure adds the CUDA context."),
        ("gpufl_process_memory_allocated_peak_bytes", Gauge, "The highest gpufl_process_memory_allocated_bytes since the process's recorder started, bytes."),
        ("gpufl_process_top_sync_seconds", Gauge, "Host time blocked in syncs at the process's top sync line (the user's file:line), seconds; one series per process."),
        ("gpufl_process_sync_line_seconds_total", Counter, "Host time blocked in syncs per source line, for the process's top 3 lines (seconds)."),
        ("gpufl_process_sync_line_syncs_total", Counter, "Synchronizations per source line, for the process's top 3 lines."),
        ("gpufl_process_host_blocked_seconds_total", Counter, "Host time inside CUDA calls that held their thread (cudaFree, cudaMalloc, module loads ...; hostcall records) by call, for the process's top 8 calls (seconds)."),
        ("gpufl_process_host_blocked_calls_total", Counter, "CUDA calls that held their thread past the hostcall threshold, by call, for the process's top 8 calls."),
    ];
    for (name, kind, help) in f {
        page.family(name, kind, help);
    }
}

// ---------------------------------------------------------------------------------------------
// The socket
// ---------------------------------------------------------------------------------------------

/// The default socket: `$GPUFL_EXPORTER_SOCKET`, else the node-wide one when run as root, else the
/// user's.
pub fn default_socket() -> PathBuf {
    if let Some(p) = crate::options::exporter_socket() {
        return p;
    }
    // SAFETY: getuid/geteuid have no preconditions.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    if euid == 0 {
        PathBuf::from(feed::SYSTEM_SOCKET)
    } else {
        feed::user_socket(uid)
    }
}

/// Why the feed socket could not be opened.
#[derive(Debug)]
pub struct BindError(pub String);

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BindError {}

/// Bind the feed socket at `path`: its directory is made if missing (0700 for the per-user
/// `/tmp/gpufl-<uid>`, which must be ours; 0755 otherwise, the socket itself 0666 so every user's
/// recorder can send), a leftover socket file nobody listens on is replaced, a live one refused.
pub fn bind(path: &Path) -> Result<UnixDatagram, BindError> {
    let err = |what: &str, e: std::io::Error| BindError(format!("{what} {}: {e}", path.display()));
    let dir = path.parent().unwrap_or(Path::new("/"));
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let private = path == feed::user_socket(uid);
    if !dir.exists() {
        let mut b = std::fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(&mut b, if private { 0o700 } else { 0o755 });
        b.recursive(true)
            .create(dir)
            .map_err(|e| err("cannot create the directory of", e))?;
    }
    if private {
        use std::os::unix::fs::MetadataExt;
        let m =
            std::fs::symlink_metadata(dir).map_err(|e| err("cannot stat the directory of", e))?;
        if m.uid() != uid || m.mode() & 0o022 != 0 || !m.is_dir() {
            return Err(BindError(format!(
                "{} is not a directory of ours that only we can write: refusing to listen there",
                dir.display()
            )));
        }
    }
    if path.exists() {
        let probe = UnixDatagram::unbound().map_err(|e| err("cannot probe", e))?;
        if probe.connect(path).is_ok() {
            return Err(BindError(format!(
                "another exporter already listens on {} (--socket PATH for another)",
                path.display()
            )));
        }
        let _ = std::fs::remove_file(path);
    }
    let sock = UnixDatagram::bind(path).map_err(|e| err("cannot listen on", e))?;
    if !private {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666));
    }
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option value.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    Ok(sock)
}

/// Receive one datagram into `buf`: its length and the sender's pid as the kernel reports it
/// (`SCM_CREDENTIALS`; None when absent). Blocks until one arrives.
pub fn recv(sock: &UnixDatagram, buf: &mut [u8]) -> std::io::Result<(usize, Option<u32>)> {
    // Room for one ucred control message, 8-byte aligned.
    let mut ctrl = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&ctrl) as _;
    // SAFETY: as above.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_TRUNC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut pid = None;
    // SAFETY: walking the control messages the kernel wrote into `ctrl`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred = (libc::CMSG_DATA(c) as *const libc::ucred).read_unaligned();
                pid = u32::try_from(cred.pid).ok();
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    // MSG_TRUNC: the real length, so an oversized datagram is refused rather than read cut.
    Ok((n as usize, pid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufl_trace::feed::{CallStatus, GpuStatus, LineStatus};

    fn status(pid: u32, uptime: f64, busy: f64) -> Vec<u8> {
        Status {
            v: feed::FEED_VERSION,
            pid,
            app: "train".into(),
            job: "77".into(),
            session: "train-1".into(),
            status: "recording".into(),
            uptime_s: uptime,
            sync_s: 2.5,
            syncs: 10,
            gpus: vec![GpuStatus {
                dev: 0,
                uuid: "GPU-x".into(),
                busy_s: busy,
                kernels: 100,
                mem_bytes: Some(3 << 30),
                mem_peak_bytes: Some(4 << 30),
                ..GpuStatus::default()
            }],
            top: vec![
                LineStatus {
                    line: "train.py:42".into(),
                    sync_s: 2.0,
                    syncs: 8,
                },
                LineStatus {
                    line: "train.py:7".into(),
                    sync_s: 0.5,
                    syncs: 2,
                },
            ],
            hostcalls: vec![CallStatus {
                call: "cudaFree".into(),
                blocked_s: 0.75,
                calls: 300,
            }],
            ..Status::default()
        }
        .encode()
    }

    /// A lookup that finds no process (tests must not depend on the host's /proc).
    fn no_k8s() -> Lookup {
        Lookup::at(
            Path::new("/nonexistent/proc"),
            Path::new("/nonexistent/log"),
        )
    }

    #[test]
    fn table_renders_processes_and_expires_them() {
        let t0 = Instant::now();
        let mut t = Table::with_lookup(Duration::from_secs(10), no_k8s());
        t.take(&status(5, 1.0, 0.2), Some(900), t0);
        t.take(&status(5, 3.0, 1.2), Some(900), t0 + Duration::from_secs(2));
        t.take(b"garbage", Some(901), t0);
        assert_eq!((t.len(), t.datagrams, t.rejected), (1, 2, 1));
        let mut p = Page::default();
        t.render(&mut p, "h");
        let text = p.render();
        let base = "Hostname=\"h\",pid=\"900\",app=\"train\",job_id=\"77\"";
        for line in [
            format!("gpufl_process_sync_seconds_total{{{base}}} 2.5"),
            format!("gpufl_process_gpu_busy_ratio{{{base},gpu=\"0\",UUID=\"GPU-x\"}} 0.5"),
            format!("gpufl_process_kernel_launches_total{{{base},gpu=\"0\",UUID=\"GPU-x\"}} 100"),
            format!("gpufl_process_top_sync_seconds{{{base},line=\"train.py:42\"}} 2"),
            format!("gpufl_process_sync_line_syncs_total{{{base},line=\"train.py:7\"}} 2"),
            format!("gpufl_process_recording{{{base},status=\"recording\",session=\"train-1\"}} 1"),
            format!("gpufl_process_host_blocked_seconds_total{{{base},call=\"cudaFree\"}} 0.75"),
            format!("gpufl_process_host_blocked_calls_total{{{base},call=\"cudaFree\"}} 300"),
            format!("gpufl_process_memory_allocated_bytes{{{base},gpu=\"0\",UUID=\"GPU-x\"}} 3221225472"),
            format!("gpufl_process_memory_allocated_peak_bytes{{{base},gpu=\"0\",UUID=\"GPU-x\"}} 4294967296"),
        ] {
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        assert_eq!(text.matches("gpufl_process_top_sync_seconds{").count(), 1);
        t.expire(t0 + Duration::from_secs(13));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn the_table_is_bounded() {
        let t0 = Instant::now();
        let mut t = Table::with_lookup(Duration::from_secs(10), no_k8s());
        for pid in 0..(MAX_PROCS as u32 + 10) {
            t.take(&status(pid, 1.0, 0.1), Some(pid + 1), t0);
        }
        assert_eq!(t.len(), MAX_PROCS);
        assert_eq!(t.refused_full, 10);
    }

    /// Processes in pods (tests/fixtures/k8s, see `k8s::tests`) carry pod, namespace and
    /// container on every series; one outside a pod, or known only by the pid it sent, none.
    #[test]
    fn processes_in_pods_carry_their_pod() {
        let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k8s");
        let lookup = Lookup::at(&f.join("proc"), &f.join("var/log/containers"));
        let t0 = Instant::now();
        let mut t = Table::with_lookup(Duration::from_secs(10), lookup);
        t.take(&status(1, 1.0, 0.2), Some(4242), t0);
        t.take(&status(2, 1.0, 0.2), Some(4245), t0);
        t.take(&status(4243, 1.0, 0.2), None, t0);
        let mut p = Page::default();
        t.render(&mut p, "h");
        let text = p.render();
        let pod = "pod=\"trainer-7c9f-x2\",namespace=\"ml-team\",container=\"pytorch\"";
        for line in [
            format!("gpufl_process_sync_seconds_total{{Hostname=\"h\",pid=\"4242\",app=\"train\",job_id=\"77\",{pod}}} 2.5"),
            format!("gpufl_process_gpu_busy_seconds_total{{Hostname=\"h\",pid=\"4242\",app=\"train\",job_id=\"77\",{pod},gpu=\"0\",UUID=\"GPU-x\"}} 0.2"),
            format!("gpufl_process_top_sync_seconds{{Hostname=\"h\",pid=\"4242\",app=\"train\",job_id=\"77\",{pod},line=\"train.py:42\"}} 2"),
            "gpufl_process_sync_seconds_total{Hostname=\"h\",pid=\"4245\",app=\"train\",job_id=\"77\"} 2.5".to_string(),
            // The pid in the datagram is not looked up in /proc (another PID namespace's).
            "gpufl_process_sync_seconds_total{Hostname=\"h\",pid=\"4243\",app=\"train\",job_id=\"77\"} 2.5".to_string(),
        ] {
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
    }

    #[test]
    fn credentials_name_the_sender() {
        let dir = std::env::temp_dir().join(format!("gpufl-exp-test-{}", std::process::id()));
        let path = dir.join("e.sock");
        let sock = bind(&path).unwrap();
        assert!(bind(&path).is_err(), "a live socket is not replaced");
        let tx = UnixDatagram::unbound().unwrap();
        tx.send_to(b"{}", &path).unwrap();
        let mut buf = [0u8; 64];
        let (n, pid) = recv(&sock, &mut buf).unwrap();
        assert_eq!((n, pid), (2, Some(std::process::id())));
        drop(sock);
        assert!(bind(&path).is_ok(), "a dead socket file is replaced");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
