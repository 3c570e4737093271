//! The receive path's sysctls, busy polling, huge pages, the hypervisor, the clock source,
//! connection tracking.

use super::{finding, Finding, Host, Verdict};

pub(super) fn sysctl(h: &Host, id: &str, key: &str, at_least: u64, why: &str) -> Finding {
    let path = format!("proc/sys/{}", key.replace('.', "/"));
    match h
        .read(&path)
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    {
        None => finding(
            id,
            None,
            Verdict::Skip,
            format!("{key} not readable here"),
            why,
            None,
        ),
        Some(v) => finding(
            id,
            None,
            if v >= at_least {
                Verdict::Pass
            } else {
                Verdict::Warn
            },
            format!("{key} = {v} (wanted ≥ {at_least})"),
            why,
            Some(format!("sysctl -w {key}={at_least}")),
        ),
    }
}

pub(super) fn busy_poll(h: &Host) -> Finding {
    const WHY: &str = "busy polling spends CPU waiting for packets, so per-packet CPU costs and \
                       busy shares no longer compare with a run without it";
    let read = |k: &str| {
        h.read(&format!("proc/sys/net/core/{k}"))
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (read("busy_poll"), read("busy_read")) {
        (None, None) => finding(
            "net.busy_poll",
            None,
            Verdict::Skip,
            "not readable here".into(),
            WHY,
            None,
        ),
        (p, r) => {
            let on = p.unwrap_or(0) > 0 || r.unwrap_or(0) > 0;
            finding(
                "net.busy_poll",
                None,
                if on { Verdict::Warn } else { Verdict::Pass },
                format!(
                    "busy_poll = {}, busy_read = {}",
                    p.unwrap_or(0),
                    r.unwrap_or(0)
                ),
                WHY,
                Some("sysctl -w net.core.busy_poll=0 net.core.busy_read=0".into()),
            )
        }
    }
}

pub(super) fn thp(h: &Host) -> Finding {
    const WHY: &str = "flowlane asks for huge pages for its tables and rings (madvise): with \
                       transparent huge pages off, random lookups miss the TLB";
    match h.read("sys/kernel/mm/transparent_hugepage/enabled") {
        None => finding(
            "mem.thp",
            None,
            Verdict::Skip,
            "not exposed".into(),
            WHY,
            None,
        ),
        Some(v) => {
            let never = v.contains("[never]");
            finding(
                "mem.thp",
                None,
                if never { Verdict::Warn } else { Verdict::Pass },
                v,
                WHY,
                Some("echo madvise > /sys/kernel/mm/transparent_hugepage/enabled".into()),
            )
        }
    }
}

pub(super) fn vm(h: &Host) -> Finding {
    const WHY: &str = "in a virtual machine the hypervisor can take a vCPU away (steal time) and \
                       there is often no PMU: cycle counts are not available and rates wander";
    let cpuinfo = h.read("proc/cpuinfo").unwrap_or_default();
    let hyper = cpuinfo
        .lines()
        .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"));
    finding("host.vm", None, if hyper { Verdict::Warn } else { Verdict::Pass },
        if hyper { "the CPU flags say hypervisor: a virtual machine".into() } else { "no hypervisor flag".into() },
        WHY, Some("measure on bare metal, or pin the vCPUs and read BENCHMARKS.md's per-packet CPU instead of cycles".into()))
}

pub(super) fn clocksource(h: &Host) -> Finding {
    const WHY: &str = "timestamps (latency, pacing) cost a system call each on a clock source \
                       other than the TSC, and wander on an unstable one";
    match h.read("sys/devices/system/clocksource/clocksource0/current_clocksource") {
        None => finding(
            "host.clocksource",
            None,
            Verdict::Skip,
            "not exposed".into(),
            WHY,
            None,
        ),
        Some(c) => finding(
            "host.clocksource",
            None,
            if matches!(c.as_str(), "tsc" | "arch_sys_counter" | "kvm-clock") {
                Verdict::Pass
            } else {
                Verdict::Warn
            },
            c,
            WHY,
            Some("boot with clocksource=tsc tsc=reliable (where the TSC is invariant)".into()),
        ),
    }
}

pub(super) fn conntrack(h: &Host) -> Finding {
    const WHY: &str =
        "connection tracking looks up and creates an entry for every flow a forwarding \
                       test sends, in this namespace's path";
    match h.read("proc/sys/net/netfilter/nf_conntrack_count") {
        None => finding(
            "net.conntrack",
            None,
            Verdict::Pass,
            "connection tracking is not loaded here".into(),
            WHY,
            None,
        ),
        Some(n) => finding(
            "net.conntrack",
            None,
            Verdict::Warn,
            format!("nf_conntrack loaded, {n} entries"),
            WHY,
            Some("nft add rule inet raw prerouting notrack (or unload nf_conntrack)".into()),
        ),
    }
}

/// Firewall rules a forwarded packet passes: nftables base chains on the forwarding hooks
/// (asked of the kernel when the root is the live `/`) and legacy iptables tables.
pub(super) fn firewall(h: &Host) -> Finding {
    const WHY: &str = "every rule chain on the forwarding path runs for each packet a \
                       forwarding test sends, and its cost is in the router's figure";
    let legacy: Vec<String> = ["proc/net/ip_tables_names", "proc/net/ip6_tables_names"]
        .iter()
        .filter_map(|f| h.read(f))
        .flat_map(|t| {
            t.lines()
                .map(|l| format!("iptables {}", l.trim()))
                .collect::<Vec<_>>()
        })
        .filter(|l| l.len() > "iptables ".len())
        .collect();
    let live = h.root == std::path::Path::new("/");
    let chains = if live {
        match flowlane_io::nft::base_chains() {
            Ok(v) => Some(v),
            Err(e) => {
                return finding(
                    "net.firewall",
                    None,
                    Verdict::Skip,
                    format!("nftables not readable: {e}"),
                    WHY,
                    None,
                )
            }
        }
    } else {
        None
    };
    let mut on_path: Vec<String> = chains
        .iter()
        .flatten()
        .filter(|c| c.on_forward_path())
        .map(|c| format!("nft {} {} {} (hook {})", c.family, c.table, c.name, c.hook))
        .collect();
    on_path.extend(legacy);
    let seen = if on_path.is_empty() {
        if live {
            "no nftables base chain on the forwarding hooks, no iptables tables".into()
        } else {
            "no iptables tables (nftables is asked of a live kernel only)".into()
        }
    } else {
        on_path.join(", ")
    };
    finding(
        "net.firewall",
        None,
        if on_path.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Warn
        },
        seen,
        WHY,
        Some("nft list ruleset; iptables-save: remove them from the DUT's namespace, or say in the report that the figure includes them".into()),
    )
}
