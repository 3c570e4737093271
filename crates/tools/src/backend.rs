//! The frame backend a role runs on, chosen once at start-up from what the kernel and the
//! interface offer ([`flowlane_io::frame::Capabilities`]) and reported with the run, so a
//! figure always says which path carried it. A backend that is not there is refused before
//! anything opens, with the kernel's reason and what to do.

use flowlane_io::frame::{Capabilities, Refused};
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// A way frames enter or leave user space (or do not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// AF_PACKET rings (`PACKET_TX_RING`, `PACKET_RX_RING`): any interface.
    AfPacket,
    /// AF_XDP sockets: copy mode anywhere, zero-copy where the driver offers it.
    AfXdp,
    /// `BPF_PROG_TEST_RUN` on live frames: the kernel runs a program per frame, no socket.
    LiveFrames,
    /// A generated XDP program in the driver (native XDP): no user space on the path.
    XdpNative,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::AfPacket => "AF_PACKET",
            Backend::AfXdp => "AF_XDP",
            Backend::LiveFrames => "live XDP frames",
            Backend::XdpNative => "native XDP",
        }
    }

    fn answer(self, c: &Capabilities) -> Result<(), Refused> {
        match self {
            Backend::AfPacket => c.af_packet.clone(),
            Backend::AfXdp => c.af_xdp.clone(),
            Backend::LiveFrames => c.live_frames.clone(),
            // Where the kernel says what the driver does, it must do native XDP; where it
            // does not say (before Linux 6.3), attaching will tell.
            Backend::XdpNative => match c.xdp(flowlane_io::frame::xdp_act::BASIC) {
                Some(false) => Err(Refused {
                    reason: "the driver has no native XDP (its XDP features lack `basic`)".into(),
                    permission: false,
                }),
                _ => Ok(()),
            },
        }
    }

    fn hint(self) -> &'static str {
        match self {
            Backend::AfPacket => "AF_PACKET needs CAP_NET_RAW",
            Backend::AfXdp => "AF_XDP needs a kernel with CONFIG_XDP_SOCKETS and CAP_NET_RAW",
            Backend::LiveFrames => {
                "live XDP frames need Linux 5.18+, CAP_BPF and CAP_NET_ADMIN; --mode xdp or raw \
                 send without them"
            }
            Backend::XdpNative => "use --backend af-packet on this interface",
        }
    }
}

/// Which backend carried a run, on which interface, and what else the interface offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BackendReport {
    /// The interface.
    pub dev: String,
    /// The backend used.
    pub backend: Backend,
    /// For AF_XDP: how flowlane binds (`copy`; zero-copy where the driver offers it and the
    /// role asks for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub af_xdp_bind: Option<String>,
    /// Whether the driver offers AF_XDP zero-copy (`None`: not known on this kernel).
    pub zero_copy_offered: Option<bool>,
    /// The interface's receive queues (sysfs).
    pub rx_queues: Option<u32>,
    /// Its transmit queues.
    pub tx_queues: Option<u32>,
    /// The driver's XDP features by name (`None`: the kernel does not say; Linux 6.3+ does).
    pub xdp_features: Option<Vec<String>>,
    /// The other backends that are not available here, each with the kernel's reason.
    pub unavailable: Vec<String>,
}

/// Asks the kernel once what `dev` offers (in the calling thread's namespace), and checks that
/// `want` is there. The report says what was chosen and what else is missing.
pub fn choose(dev: &str, want: Backend) -> Result<BackendReport, ToolError> {
    let c = Capabilities::probe(dev).map_err(|e| {
        ToolError::usage(format!(
            "no interface `{dev}` here ({e}; see `ip link`; in a namespace, run inside it)"
        ))
    })?;
    report(dev, want, &c)
}

/// The report for `want` from a probe's answers, or why `want` cannot run.
pub fn report(dev: &str, want: Backend, c: &Capabilities) -> Result<BackendReport, ToolError> {
    if let Err(r) = &want.answer(c) {
        let msg = format!(
            "{} is not available on {dev}: {r} ({})",
            want.name(),
            want.hint()
        );
        return Err(if r.permission {
            ToolError::privilege(msg)
        } else {
            ToolError::runtime(msg)
        });
    }
    let unavailable = [
        Backend::AfPacket,
        Backend::AfXdp,
        Backend::LiveFrames,
        Backend::XdpNative,
    ]
    .into_iter()
    .filter_map(|b| match b.answer(c) {
        Err(r) => Some(format!("{}: {r}", b.name())),
        Ok(()) => None,
    })
    .collect();
    Ok(BackendReport {
        dev: dev.to_string(),
        backend: want,
        // The kernel binds zero-copy where the driver offers it (the feature probed here),
        // copy mode otherwise.
        af_xdp_bind: (want == Backend::AfXdp).then(|| {
            if c.xdp(flowlane_io::frame::xdp_act::XSK_ZEROCOPY) == Some(true) {
                "zero-copy".to_string()
            } else {
                "copy".to_string()
            }
        }),
        zero_copy_offered: c.xdp(flowlane_io::frame::xdp_act::XSK_ZEROCOPY),
        rx_queues: c.queues.map(|q| q.0),
        tx_queues: c.queues.map(|q| q.1),
        xdp_features: c.xdp_features.as_ref().ok().map(|_| {
            c.xdp_feature_names()
                .iter()
                .map(|s| s.to_string())
                .collect()
        }),
        unavailable,
    })
}

/// Attaches XDP program `prog` (the `what`) to `dev` in native mode — a BPF link, detached
/// when dropped — and says how to fix what usually stops it: privileges, or an XDP program
/// already on the interface (a lab made with `--steer rss` steers with one).
pub fn attach_native(
    prog: &std::os::fd::OwnedFd,
    ifindex: u32,
    dev: &str,
    what: &str,
) -> Result<std::os::fd::OwnedFd, ToolError> {
    flowlane_io::bpf::attach_xdp(prog, ifindex, flowlane_io::netdev::XDP_FLAGS_DRV_MODE).map_err(
        |e| {
            let msg = format!("cannot attach the {what} to {dev} in native mode: {e}");
            match e.source.kind() {
                std::io::ErrorKind::PermissionDenied => ToolError::privilege(format!(
                    "{msg} (needs CAP_BPF and CAP_NET_ADMIN: run as root)"
                )),
                std::io::ErrorKind::ResourceBusy => ToolError::usage(format!(
                    "{msg}: {dev} already has an XDP program (`ip link show {dev}` names it; a \
                     lab made with --steer rss steers with one): detach it, or use a lab with \
                     --steer rps or none"
                )),
                _ => ToolError::runtime(msg),
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn caps(live: Result<(), Refused>) -> Capabilities {
        Capabilities {
            ifindex: 3,
            queues: Some((2, 2)),
            af_packet: Ok(()),
            af_xdp: Ok(()),
            xdp_features: Ok(0b111),
            live_frames: live,
        }
    }

    #[test]
    fn a_missing_backend_is_refused_with_its_reason_and_kind() {
        let denied = Refused {
            reason: "bpf(BPF_PROG_LOAD): Operation not permitted".into(),
            permission: true,
        };
        let e = report("v0", Backend::LiveFrames, &caps(Err(denied.clone()))).expect_err("no");
        assert_eq!(e.kind, ErrorKind::Privilege);
        assert!(e.message.contains("Operation not permitted") && e.message.contains("5.18"));
        let old = Refused {
            permission: false,
            ..denied
        };
        let e = report("v0", Backend::LiveFrames, &caps(Err(old.clone()))).expect_err("no");
        assert_eq!(e.kind, ErrorKind::Runtime);
        // Another backend still runs, and the report names what is missing.
        let r = report("v0", Backend::AfXdp, &caps(Err(old))).expect("af_xdp");
        assert_eq!(r.af_xdp_bind.as_deref(), Some("copy"));
        assert_eq!(r.zero_copy_offered, Some(false));
        assert_eq!(r.unavailable.len(), 1);
        assert!(r.unavailable[0].starts_with("live XDP frames:"));
        assert_eq!(
            r.xdp_features.as_deref(),
            Some(&["basic".to_string(), "redirect".into(), "ndo-xmit".into()][..])
        );
        assert_eq!((r.rx_queues, r.tx_queues), (Some(2), Some(2)));
    }

    #[test]
    fn loopback_has_af_packet_as_root() {
        match choose("lo", Backend::AfPacket) {
            Ok(r) => assert_eq!(r.backend, Backend::AfPacket),
            Err(e) => assert_eq!(e.kind, ErrorKind::Privilege, "{e}"),
        }
        assert_eq!(
            choose("no-such-if0", Backend::AfPacket)
                .expect_err("no such interface")
                .kind,
            ErrorKind::Usage
        );
    }
}
