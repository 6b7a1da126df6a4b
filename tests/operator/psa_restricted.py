"""The Pod Security Standards' `restricted` profile, as Pod Security Admission enforces it.

A stand-in for a namespace labelled `pod-security.kubernetes.io/enforce: restricted` (no API
server runs here). Written from the published standard (kubernetes.io/docs/concepts/security/
pod-security-standards, policy version "latest"): every baseline check plus the restricted
ones. A Deployment is admitted but its pods are refused by the ReplicaSet controller, so the
checks apply to the pod template.
"""

from __future__ import annotations

from typing import Any

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t"}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod.get("containers", []),
            *pod.get("ephemeralContainers", [])]


def _seccomp_ok(profile: dict[str, Any] | None) -> bool:
    return (profile or {}).get("type") in ("RuntimeDefault", "Localhost")


def violations(pod: dict[str, Any], annotations: dict[str, str] | None = None) -> list[str]:
    """What Pod Security Admission would list when refusing this pod spec (empty: admitted)."""
    found: list[str] = []
    psc = pod.get("securityContext") or {}
    containers = _containers(pod)

    # baseline
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"host namespaces ({field}=true)")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        found.append("hostProcess")
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            found.append(f"hostPath volume {volume['name']!r}")
    for sysctl in psc.get("sysctls", []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"forbidden sysctl {sysctl.get('name')}")
    selinux = psc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append("seLinuxOptions")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append("seccompProfile Unconfined (pod)")
    if (psc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        found.append("appArmorProfile Unconfined (pod)")
    for key, value in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                value == "runtime/default" or value.startswith("localhost/")):
            found.append(f"AppArmor annotation {key}={value}")

    # restricted
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"restricted volume types {sorted(kinds)} ({volume['name']!r})")
    if psc.get("runAsUser") == 0:
        found.append("runAsUser=0 (pod)")
    pod_non_root = psc.get("runAsNonRoot") is True

    for c in containers:
        name = c.get("name", "?")
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            found.append(f"privileged ({name})")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"hostProcess ({name})")
        if sc.get("procMount", "Default") != "Default":
            found.append(f"procMount ({name})")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                found.append(f"hostPort ({name})")
        c_selinux = sc.get("seLinuxOptions") or {}
        if c_selinux.get("type", "") not in SELINUX_TYPES or c_selinux.get("user") or \
                c_selinux.get("role"):
            found.append(f"seLinuxOptions ({name})")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            found.append(f"appArmorProfile Unconfined ({name})")
        caps = sc.get("capabilities") or {}
        added = set(caps.get("add") or [])
        if not added <= BASELINE_CAPABILITIES:
            found.append(f"non-default capabilities {sorted(added - BASELINE_CAPABILITIES)} "
                         f"({name})")
        if added - {"NET_BIND_SERVICE"}:
            found.append(f"capabilities added beyond NET_BIND_SERVICE ({name})")
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"capabilities must drop ALL ({name})")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"allowPrivilegeEscalation != false ({name})")
        if sc.get("runAsNonRoot") is False or not (pod_non_root or sc.get("runAsNonRoot")):
            found.append(f"runAsNonRoot != true ({name})")
        if sc.get("runAsUser") == 0:
            found.append(f"runAsUser=0 ({name})")
        own = sc.get("seccompProfile")
        if (own or {}).get("type") == "Unconfined" or not _seccomp_ok(own or psc.get(
                "seccompProfile")):
            found.append(f"seccompProfile must be RuntimeDefault or Localhost ({name})")
    return found
