//! nftables' base chains through nfnetlink (`NFT_MSG_GETCHAIN` dump), as `nft list chains`
//! reads them: which netfilter hooks hold rules a forwarded packet must pass. Read only.

use super::netlink::{attributes, message, Rtnl, NLM_F_DUMP, NLM_F_REQUEST};
use super::SysError;

/// `NFNL_SUBSYS_NFTABLES`.
const SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;

/// A chain attached to a netfilter hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseChain {
    /// `ip`, `ip6`, `inet`, `arp`, `bridge`, `netdev`, or the number.
    pub family: String,
    pub table: String,
    pub name: String,
    /// The hook's name in its family (`prerouting`, `input`, `forward`, `output`,
    /// `postrouting`, `ingress`, …).
    pub hook: String,
    pub priority: i32,
}

impl BaseChain {
    /// Whether a packet the host forwards passes it (IPv4/IPv6 prerouting, forward,
    /// postrouting; netdev ingress).
    pub fn on_forward_path(&self) -> bool {
        match self.family.as_str() {
            "ip" | "ip6" | "inet" => {
                matches!(self.hook.as_str(), "prerouting" | "forward" | "postrouting")
            }
            "netdev" => self.hook == "ingress",
            _ => false,
        }
    }
}

fn family_name(f: u8) -> String {
    match f {
        1 => "inet".into(),
        2 => "ip".into(),
        3 => "arp".into(),
        5 => "netdev".into(),
        7 => "bridge".into(),
        10 => "ip6".into(),
        n => n.to_string(),
    }
}

fn hook_name(family: u8, hook: u32) -> String {
    let inet = [
        "prerouting",
        "input",
        "forward",
        "output",
        "postrouting",
        "ingress",
    ];
    match family {
        // ip, ip6, inet, bridge share NF_INET_* numbers.
        1 | 2 | 7 | 10 => inet
            .get(hook as usize)
            .map_or(hook.to_string(), |h| h.to_string()),
        3 => ["input", "output", "forward"]
            .get(hook as usize)
            .map_or(hook.to_string(), |h| h.to_string()),
        5 => ["ingress", "egress"]
            .get(hook as usize)
            .map_or(hook.to_string(), |h| h.to_string()),
        _ => hook.to_string(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or_default()).into_owned()
}

/// One `NFT_MSG_NEWCHAIN` payload (its `nfgenmsg`, then attributes): the chain if it is a
/// base chain (has a hook), else `None`.
pub fn base_chain_of(payload: &[u8]) -> Option<BaseChain> {
    let family = *payload.first()?;
    let attrs = attributes(payload.get(4..)?);
    let get = |k: u16| attrs.iter().find(|(t, _)| *t == k).map(|(_, v)| *v);
    let hook = attributes(get(NFTA_CHAIN_HOOK)?);
    let be32 = |k: u16| -> Option<u32> {
        let v = hook.iter().find(|(t, _)| *t == k)?.1;
        Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
    };
    Some(BaseChain {
        family: family_name(family),
        table: text(get(NFTA_CHAIN_TABLE)?),
        name: text(get(NFTA_CHAIN_NAME)?),
        hook: hook_name(family, be32(NFTA_HOOK_HOOKNUM)?),
        priority: be32(NFTA_HOOK_PRIORITY).unwrap_or(0) as i32,
    })
}

/// Every base chain in the caller's network namespace. A kernel without nf_tables (the
/// module not loaded) has none: an empty list.
pub fn base_chains() -> Result<Vec<BaseChain>, SysError> {
    let nl = Rtnl::open_protocol(libc::NETLINK_NETFILTER, "netlink nftables")?;
    let seq = 1;
    // nfgenmsg: family AF_UNSPEC (all), version NFNETLINK_V0, resource id 0.
    let body = [0u8, 0, 0, 0];
    let kind = (SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN;
    let req = message(kind, NLM_F_REQUEST | NLM_F_DUMP, seq, &body);
    match nl.collect(
        &req,
        seq,
        (SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN,
        true,
        65_536,
    ) {
        Ok(v) => Ok(v.iter().filter_map(|p| base_chain_of(p)).collect()),
        Err(e)
            if matches!(
                e.source.raw_os_error(),
                Some(libc::ENOENT) | Some(libc::EPROTONOSUPPORT) | Some(libc::EOPNOTSUPP)
            ) =>
        {
            Ok(Vec::new())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::super::netlink::push_attr;
    use super::*;

    /// A chain as the kernel sends it: nfgenmsg, table, name, hook nest (big-endian).
    fn chain(family: u8, table: &str, name: &str, hook: Option<(u32, i32)>) -> Vec<u8> {
        let mut b = vec![family, 0, 0, 0];
        push_attr(&mut b, NFTA_CHAIN_TABLE, format!("{table}\0").as_bytes());
        push_attr(&mut b, NFTA_CHAIN_NAME, format!("{name}\0").as_bytes());
        if let Some((num, prio)) = hook {
            let mut h = Vec::new();
            push_attr(&mut h, NFTA_HOOK_HOOKNUM, &num.to_be_bytes());
            push_attr(&mut h, NFTA_HOOK_PRIORITY, &prio.to_be_bytes());
            push_attr(&mut b, NFTA_CHAIN_HOOK | 0x8000, &h);
        }
        b
    }

    #[test]
    fn chains_read_as_nft_lists_them() {
        let c = base_chain_of(&chain(1, "filter", "forward", Some((2, 0)))).expect("base");
        assert_eq!(
            (c.family.as_str(), c.hook.as_str(), c.table.as_str()),
            ("inet", "forward", "filter")
        );
        assert!(c.on_forward_path());
        let c = base_chain_of(&chain(2, "nat", "out", Some((3, -100)))).expect("base");
        assert_eq!((c.hook.as_str(), c.priority), ("output", -100));
        assert!(!c.on_forward_path());
        // A regular chain (no hook) is not a base chain; bytes that lie are no chain.
        assert_eq!(base_chain_of(&chain(2, "t", "jump_target", None)), None);
        assert_eq!(base_chain_of(&[2, 0]), None);
    }

    #[test]
    fn this_namespace_reads_without_error() {
        // Whatever this host holds, the dump completes (an empty list without nf_tables).
        let chains = base_chains().expect("the dump");
        assert!(chains.iter().all(|c| !c.name.is_empty()), "{chains:?}");
    }
}
