//! The Kubernetes pod, namespace and container of a recorded process, for the labels of its
//! metrics (`pod`, `namespace`, `container`: dcgm-exporter's names), read once when the process
//! first reports.
//!
//! A process runs in a pod when its cgroup path (`/proc/PID/cgroup`) passes through the kubelet's
//! `kubepods` hierarchy; that path holds the pod's UID and the container's ID (cgroupfs:
//! `/kubepods/burstable/pod<UID>/<ID>`; systemd: `…/kubepods-burstable-pod<UID with _>.slice/
//! cri-containerd-<ID>.scope`, or `docker-`, `crio-`). The names come from, in order:
//! 1. the kubelet's log links, `/var/log/containers/<pod>_<namespace>_<container>-<ID>.log`
//!    (the exporter's DaemonSet mounts `/var/log` read-only), which give all three;
//! 2. the process's environment: `POD_NAME`, `POD_NAMESPACE`, `CONTAINER_NAME` (the usual
//!    downward-API names), else `HOSTNAME` for the pod (a pod's hostname is its name), and the
//!    namespace of its service account token (`/proc/PID/root/var/run/secrets/kubernetes.io/
//!    serviceaccount/namespace`).
//!
//! Reading another process's environment and root needs the exporter to run as root with the
//! host's PID namespace (`hostPID: true`), as dcgm-exporter's DaemonSet does; what cannot be
//! read is left out (a label is absent rather than wrong).

use std::path::{Path, PathBuf};

/// Where a process runs in Kubernetes; an empty field is unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pod {
    pub pod: String,
    pub namespace: String,
    pub container: String,
}

impl Pod {
    /// The labels to add to the process's series (those known).
    pub fn labels(&self) -> Vec<(&'static str, &str)> {
        [
            ("pod", self.pod.as_str()),
            ("namespace", self.namespace.as_str()),
            ("container", self.container.as_str()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect()
    }
}

/// Where the lookups read: the host's `/proc` and `/var/log/containers`, or a fixture's.
#[derive(Clone, Debug)]
pub struct Lookup {
    proc_root: PathBuf,
    containers_log: PathBuf,
}

/// Longest file read (cgroup, environment, service account namespace).
const MAX_READ: u64 = 256 * 1024;

impl Lookup {
    /// The host's.
    pub fn host() -> Lookup {
        Lookup::at(Path::new("/proc"), Path::new("/var/log/containers"))
    }

    pub fn at(proc_root: &Path, containers_log: &Path) -> Lookup {
        Lookup {
            proc_root: proc_root.to_path_buf(),
            containers_log: containers_log.to_path_buf(),
        }
    }

    fn read(&self, path: &Path) -> Option<Vec<u8>> {
        use std::io::Read;
        let mut out = Vec::new();
        std::fs::File::open(path)
            .ok()?
            .take(MAX_READ)
            .read_to_end(&mut out)
            .ok()?;
        Some(out)
    }

    /// The pod of process `pid` (a pid of the exporter's PID namespace), or None when it does
    /// not run in one.
    pub fn of(&self, pid: u32) -> Option<Pod> {
        let dir = self.proc_root.join(pid.to_string());
        let cgroup = self.read(&dir.join("cgroup"))?;
        let ids = cgroup_ids(&String::from_utf8_lossy(&cgroup))?;
        let mut pod = ids
            .container
            .as_deref()
            .and_then(|id| self.names_in_container_logs(id))
            .unwrap_or_default();
        if pod.pod.is_empty() || pod.namespace.is_empty() || pod.container.is_empty() {
            let env = self.read(&dir.join("environ")).unwrap_or_default();
            let var = |k: &str| environ_var(&env, k).unwrap_or_default();
            fill(&mut pod.pod, || {
                Some(var("POD_NAME"))
                    .filter(|s| !s.is_empty())
                    .or_else(|| Some(var("HOSTNAME")).filter(|s| !s.is_empty()))
            });
            fill(&mut pod.namespace, || {
                Some(var("POD_NAMESPACE"))
                    .filter(|s| !s.is_empty())
                    .or_else(|| {
                        let f =
                            dir.join("root/var/run/secrets/kubernetes.io/serviceaccount/namespace");
                        let ns = String::from_utf8_lossy(&self.read(&f)?).trim().to_string();
                        Some(ns).filter(|s| !s.is_empty())
                    })
            });
            fill(&mut pod.container, || {
                Some(var("CONTAINER_NAME")).filter(|s| !s.is_empty())
            });
        }
        Some(pod)
    }

    /// Pod, namespace and container from the kubelet's link for container `id`.
    fn names_in_container_logs(&self, id: &str) -> Option<Pod> {
        let suffix = format!("-{id}.log");
        std::fs::read_dir(&self.containers_log)
            .ok()?
            .flatten()
            .find_map(|e| parse_container_log(e.file_name().to_str()?, &suffix))
    }
}

fn fill(field: &mut String, f: impl FnOnce() -> Option<String>) {
    if field.is_empty() {
        if let Some(v) = f() {
            *field = v;
        }
    }
}

/// A pod's UID and a container's ID, as a cgroup path gives them.
#[derive(Debug, PartialEq, Eq)]
pub struct CgroupIds {
    pub pod_uid: Option<String>,
    pub container: Option<String>,
}

/// The pod UID and container ID of a `/proc/PID/cgroup` text, or None when no line passes
/// through `kubepods`. Lines are `ID:CONTROLLERS:PATH` (v1: several; v2: one `0::PATH`); the
/// unified (v2) line is preferred, then the first v1 line under kubepods.
pub fn cgroup_ids(text: &str) -> Option<CgroupIds> {
    let paths: Vec<&str> = text
        .lines()
        .filter_map(|l| Some(l.splitn(3, ':').nth(2)?.trim()))
        .filter(|p| p.contains("kubepods"))
        .collect();
    let v2 = text
        .lines()
        .find(|l| l.starts_with("0::") && l.contains("kubepods"))
        .map(|l| l[3..].trim());
    let path = v2.or_else(|| paths.first().copied())?;
    let mut pod_uid = None;
    let mut container = None;
    for seg in path.split('/') {
        let seg = seg.strip_suffix(".slice").unwrap_or(seg);
        if let Some(i) = seg.rfind("pod") {
            // `pod<UID>` (cgroupfs) or `kubepods-<qos>-pod<UID with _>` (systemd).
            let uid = seg[i + 3..].replace('_', "-");
            if uid.len() >= 32 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
                pod_uid = Some(uid);
                continue;
            }
        }
        if let Some(id) = container_id(seg) {
            container = Some(id);
        }
    }
    Some(CgroupIds { pod_uid, container })
}

/// The 64-hex container ID of a cgroup path segment: `<ID>`, or `<runtime>-<ID>.scope`
/// (`cri-containerd-`, `docker-`, `crio-`).
fn container_id(seg: &str) -> Option<String> {
    let seg = seg.strip_suffix(".scope").unwrap_or(seg);
    let id = seg.rsplit('-').next()?;
    if seg.starts_with("crio-conmon-") {
        return None;
    }
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

/// `<pod>_<namespace>_<container>-<ID>.log` (the kubelet's name) ending in `suffix`
/// (`-<ID>.log`). Pod and namespace names cannot hold `_`; a container name cannot either.
fn parse_container_log(name: &str, suffix: &str) -> Option<Pod> {
    let stem = name.strip_suffix(suffix)?;
    let mut parts = stem.splitn(3, '_');
    let (pod, namespace, container) = (parts.next()?, parts.next()?, parts.next()?);
    if pod.is_empty() || namespace.is_empty() || container.is_empty() {
        return None;
    }
    Some(Pod {
        pod: pod.into(),
        namespace: namespace.into(),
        container: container.into(),
    })
}

/// The value of `key` in a `/proc/PID/environ` (NUL-separated `K=V`).
pub fn environ_var(environ: &[u8], key: &str) -> Option<String> {
    environ.split(|&b| b == 0).find_map(|kv| {
        let rest = kv.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(rest).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k8s")
    }

    #[test]
    fn cgroup_paths_of_both_drivers_and_versions() {
        // cgroup v2, systemd driver, containerd.
        let v2 = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5f0c6e5a_1b2c_4d3e_8f9a_0b1c2d3e4f5a.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(
            cgroup_ids(&v2),
            Some(CgroupIds {
                pod_uid: Some("5f0c6e5a-1b2c-4d3e-8f9a-0b1c2d3e4f5a".into()),
                container: Some(ID.into())
            })
        );
        // cgroup v1, cgroupfs driver, docker: several controllers.
        let v1 = format!(
            "12:memory:/kubepods/besteffort/pod5f0c6e5a-1b2c-4d3e-8f9a-0b1c2d3e4f5a/{ID}\n\
             11:cpu,cpuacct:/kubepods/besteffort/pod5f0c6e5a-1b2c-4d3e-8f9a-0b1c2d3e4f5a/{ID}\n\
             1:name=systemd:/kubepods/besteffort/pod5f0c6e5a-1b2c-4d3e-8f9a-0b1c2d3e4f5a/{ID}\n"
        );
        let ids = cgroup_ids(&v1).unwrap();
        assert_eq!(ids.container.as_deref(), Some(ID));
        assert_eq!(
            ids.pod_uid.as_deref(),
            Some("5f0c6e5a-1b2c-4d3e-8f9a-0b1c2d3e4f5a")
        );
        // Guaranteed QoS (no QoS level), CRI-O, and a path seen from another cgroup namespace.
        let crio = format!(
            "0::/../../kubepods-pod5f0c6e5a_1b2c_4d3e_8f9a_0b1c2d3e4f5a.slice/crio-{ID}.scope"
        );
        assert_eq!(cgroup_ids(&crio).unwrap().container.as_deref(), Some(ID));
        // Not in a pod.
        assert_eq!(
            cgroup_ids("0::/user.slice/user-1000.slice/session-3.scope\n"),
            None
        );
        assert_eq!(cgroup_ids("0::/system.slice/docker-{ID}.scope"), None);
        assert_eq!(cgroup_ids(""), None);
    }

    #[test]
    fn log_link_names_and_environment() {
        let sfx = format!("-{ID}.log");
        assert_eq!(
            parse_container_log(&format!("trainer-7c9f-x2_ml-team_pytorch-{ID}.log"), &sfx),
            Some(Pod {
                pod: "trainer-7c9f-x2".into(),
                namespace: "ml-team".into(),
                container: "pytorch".into()
            })
        );
        assert_eq!(parse_container_log("other_ns_c-ffff.log", &sfx), None);
        let env = b"PATH=/usr/bin\0POD_NAME=p-1\0HOSTNAME=h\0EMPTY=\0";
        assert_eq!(environ_var(env, "POD_NAME").as_deref(), Some("p-1"));
        assert_eq!(environ_var(env, "HOSTNAME").as_deref(), Some("h"));
        assert_eq!(environ_var(env, "EMPTY").as_deref(), Some(""));
        assert_eq!(environ_var(env, "POD"), None);
    }

    /// tests/fixtures/k8s: a `/proc` with four processes and a `/var/log/containers`.
    /// 4242: cgroup v2 (systemd, containerd) whose container has a kubelet log link;
    /// 4243: cgroup v1 (cgroupfs, docker), no link, names from its environment;
    /// 4244: in a pod, no link, `HOSTNAME` and the service account's namespace file;
    /// 4245: not in a pod (a systemd user session), though its environment names one.
    #[test]
    fn pods_of_fixture_processes() {
        let f = fixtures();
        let l = Lookup::at(&f.join("proc"), &f.join("var/log/containers"));
        let pod = |p: &str, n: &str, c: &str| {
            Some(Pod {
                pod: p.into(),
                namespace: n.into(),
                container: c.into(),
            })
        };
        assert_eq!(l.of(4242), pod("trainer-7c9f-x2", "ml-team", "pytorch"));
        assert_eq!(l.of(4243), pod("bert-finetune-0", "research", "train"));
        assert_eq!(l.of(4244), pod("notebook-abc12", "sandbox", ""));
        assert_eq!(l.of(4245), None);
        assert_eq!(l.of(4246), None, "no such process");
        assert_eq!(
            l.of(4244).unwrap().labels(),
            [("pod", "notebook-abc12"), ("namespace", "sandbox")]
        );
    }
}
