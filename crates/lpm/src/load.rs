//! Route table text: the plain `PREFIX/LEN NEXTHOP` format (what `flowlane route gen`
//! writes) and the output of `ip route show` / `ip -6 route show`. Errors carry the line.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::key::{Key, Prefix};
use crate::MAX_NEXT_HOP;

/// Which text format a table is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Decide from the first route line: two fields with a number second → plain.
    Auto,
    /// `PREFIX/LEN NEXTHOP` per line; `#` comments and blank lines allowed.
    Plain,
    /// `ip route show` / `ip -6 route show` output; next hops get indices in order of first
    /// appearance, named in [`Table::legend`].
    IpRoute,
}

/// A parsed table, both families.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// IPv4 routes.
    pub v4: Vec<(Prefix<u32>, u32)>,
    /// IPv6 routes.
    pub v6: Vec<(Prefix<u128>, u32)>,
    /// For `ip route` input: what each next-hop index stands for (`via 198.18.0.1 dev
    /// eth0`, `blackhole`, …). Empty for the plain format, whose indices are the file's own.
    pub legend: Vec<String>,
}

impl Table {
    /// The name of next hop `hop`: its legend entry, or the number itself.
    pub fn hop_name(&self, hop: u32) -> String {
        self.legend
            .get(hop as usize)
            .cloned()
            .unwrap_or_else(|| hop.to_string())
    }

    /// The table in the plain format (IPv4 first), one route per line.
    pub fn to_plain(&self) -> String {
        let mut s = String::with_capacity((self.v4.len() + self.v6.len()) * 24);
        for (p, h) in &self.v4 {
            let _ = writeln!(s, "{p} {h}");
        }
        for (p, h) in &self.v6 {
            let _ = writeln!(s, "{p} {h}");
        }
        s
    }
}

/// A table text error: the 1-based line and what was wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct LoadError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong, and what was expected.
    pub message: String,
}

fn err<T>(line: usize, message: impl Into<String>) -> Result<T, LoadError> {
    Err(LoadError {
        line,
        message: message.into(),
    })
}

/// Parses a table in `format`.
pub fn parse(text: &str, format: Format) -> Result<Table, LoadError> {
    let format = match format {
        Format::Auto => detect(text),
        f => f,
    };
    match format {
        Format::Plain => parse_plain(text),
        _ => parse_ip_route(text),
    }
}

fn detect(text: &str) -> Format {
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'));
    match first.map(|l| l.split_whitespace().collect::<Vec<_>>()) {
        Some(f) if f.len() == 2 && f[1].parse::<u32>().is_ok() => Format::Plain,
        Some(_) => Format::IpRoute,
        None => Format::Plain,
    }
}

/// Either family's prefix.
enum AnyPrefix {
    V4(Prefix<u32>),
    V6(Prefix<u128>),
}

fn parse_prefix(s: &str) -> Result<AnyPrefix, String> {
    if s.contains(':') {
        s.parse::<Prefix<u128>>().map(AnyPrefix::V6)
    } else {
        s.parse::<Prefix<u32>>().map(AnyPrefix::V4)
    }
}

fn parse_plain(text: &str) -> Result<Table, LoadError> {
    let mut t = Table::default();
    let mut first_v4: HashMap<Prefix<u32>, usize> = HashMap::new();
    let mut first_v6: HashMap<Prefix<u128>, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [prefix, hop] = fields[..] else {
            return err(
                n,
                format!(
                    "expected `PREFIX/LEN NEXTHOP`, found {} fields",
                    fields.len()
                ),
            );
        };
        let hop: u32 = match hop.parse() {
            Ok(h) if h <= MAX_NEXT_HOP => h,
            _ => {
                return err(
                    n,
                    format!(
                        "next hop `{}` is not a number in 0–{MAX_NEXT_HOP}",
                        crate::excerpt(hop)
                    ),
                )
            }
        };
        match parse_prefix(prefix) {
            Ok(AnyPrefix::V4(p)) => {
                if let Some(&f) = first_v4.get(&p) {
                    return err(n, format!("duplicate prefix {p} (first on line {f})"));
                }
                first_v4.insert(p, n);
                t.v4.push((p, hop));
            }
            Ok(AnyPrefix::V6(p)) => {
                if let Some(&f) = first_v6.get(&p) {
                    return err(n, format!("duplicate prefix {p} (first on line {f})"));
                }
                first_v6.insert(p, n);
                t.v6.push((p, hop));
            }
            Err(e) => return err(n, e),
        }
    }
    Ok(t)
}

/// Route types `ip route` prints before the destination.
const TYPES: &[&str] = &[
    "unicast",
    "local",
    "broadcast",
    "multicast",
    "blackhole",
    "unreachable",
    "prohibit",
    "throw",
    "nat",
    "anycast",
];
/// Keywords followed by one value that does not matter for forwarding.
const SKIP_VALUE: &[&str] = &[
    "proto",
    "scope",
    "src",
    "table",
    "pref",
    "expires",
    "mtu",
    "advmss",
    "rtt",
    "rttvar",
    "reordering",
    "window",
    "cwnd",
    "initcwnd",
    "initrwnd",
    "ssthresh",
    "realms",
    "rto_min",
    "hoplimit",
    "hopLimit",
    "features",
    "quickack",
    "congctl",
    "fastopen_no_cookie",
    "tos",
    "dsfield",
    "weight",
    "error",
    "from",
    "tclassid",
    "nexthop",
];

/// One route line being assembled (its `nexthop` continuation lines join it).
struct Pending {
    line: usize,
    dest: AnyPrefix,
    key: String,
    metric: u64,
}

fn parse_ip_route(text: &str) -> Result<Table, LoadError> {
    // `default` alone does not say its family; take the file's (IPv6 when every explicit
    // destination is IPv6).
    let v6_file = {
        let mut any6 = false;
        let mut any4 = false;
        for l in text.lines() {
            for tok in l.split_whitespace().filter(|t| !TYPES.contains(t)).take(1) {
                if tok.contains(':') {
                    any6 = true;
                } else if tok
                    .split('/')
                    .next()
                    .is_some_and(|a| a.parse::<Ipv4Addr>().is_ok())
                {
                    any4 = true;
                }
            }
        }
        any6 && !any4
    };
    let mut routes: Vec<Pending> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let continuation = raw.starts_with(char::is_whitespace);
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut toks = line.split_whitespace().peekable();
        if continuation && toks.peek() == Some(&"nexthop") {
            let Some(route) = routes.last_mut() else {
                return err(n, "`nexthop` line without a route before it");
            };
            toks.next();
            let hop = hop_key(&mut toks, n)?.0;
            if route.key.is_empty() {
                route.key = hop;
            } else {
                route.key = format!("{}; {hop}", route.key);
            }
            continue;
        }
        let mut kind = "unicast";
        let mut dest_tok = toks.next().unwrap_or("");
        if TYPES.contains(&dest_tok) {
            kind = dest_tok;
            dest_tok = match toks.next() {
                Some(d) => d,
                None => return err(n, format!("`{}` needs a destination", crate::excerpt(kind))),
            };
        }
        let (key, metric, via6) = hop_key(&mut toks, n)?;
        let dest = if dest_tok == "default" {
            if via6.unwrap_or(v6_file) {
                AnyPrefix::V6(Prefix::covering(0, 0))
            } else {
                AnyPrefix::V4(Prefix::covering(0, 0))
            }
        } else {
            parse_prefix(dest_tok).map_err(|e| LoadError {
                line: n,
                message: format!("{e} (expected `default` or ADDR[/LEN] first on a route line)"),
            })?
        };
        let key = if kind == "unicast" {
            key
        } else {
            kind.to_string()
        };
        routes.push(Pending {
            line: n,
            dest,
            key,
            metric,
        });
    }
    // The same destination more than once (several metrics): the lowest metric wins, as in
    // the kernel's choice; then the first listed.
    let mut t = Table::default();
    let mut legend: HashMap<String, u32> = HashMap::new();
    let mut best4: HashMap<Prefix<u32>, (u64, usize)> = HashMap::new();
    let mut best6: HashMap<Prefix<u128>, (u64, usize)> = HashMap::new();
    for (i, r) in routes.iter().enumerate() {
        match r.dest {
            AnyPrefix::V4(p) => keep_best(&mut best4, p, r.metric, i),
            AnyPrefix::V6(p) => keep_best(&mut best6, p, r.metric, i),
        }
    }
    for (i, r) in routes.iter().enumerate() {
        let chosen = match r.dest {
            AnyPrefix::V4(p) => best4.get(&p).map(|b| b.1) == Some(i),
            AnyPrefix::V6(p) => best6.get(&p).map(|b| b.1) == Some(i),
        };
        if !chosen {
            continue;
        }
        let key = if r.key.is_empty() {
            "(no next hop)".to_string()
        } else {
            r.key.clone()
        };
        let next = legend.len() as u32;
        let hop = *legend.entry(key.clone()).or_insert_with(|| {
            t.legend.push(key);
            next
        });
        if hop > MAX_NEXT_HOP {
            return err(r.line, "too many distinct next hops");
        }
        match r.dest {
            AnyPrefix::V4(p) => t.v4.push((p, hop)),
            AnyPrefix::V6(p) => t.v6.push((p, hop)),
        }
    }
    Ok(t)
}

fn keep_best<K: Key>(
    best: &mut HashMap<Prefix<K>, (u64, usize)>,
    p: Prefix<K>,
    metric: u64,
    i: usize,
) {
    let e = best.entry(p).or_insert((metric, i));
    if metric < e.0 {
        *e = (metric, i);
    }
}

/// Reads `via ADDR`, `dev NAME`, `metric N`, `nhid N` and skips the rest; returns the
/// next-hop key (`via A dev D`), the metric, and the family of `via` if there was one.
fn hop_key<'a>(
    toks: &mut std::iter::Peekable<impl Iterator<Item = &'a str>>,
    n: usize,
) -> Result<(String, u64, Option<bool>), LoadError> {
    let mut via: Option<&str> = None;
    let mut dev: Option<&str> = None;
    let mut nhid: Option<&str> = None;
    let mut metric = 0u64;
    while let Some(tok) = toks.next() {
        match tok {
            "via" => {
                let mut v = toks.next();
                if matches!(v, Some("inet") | Some("inet6")) {
                    v = toks.next();
                }
                let Some(v) =
                    v.filter(|v| v.parse::<Ipv4Addr>().is_ok() || v.parse::<Ipv6Addr>().is_ok())
                else {
                    return err(n, "`via` needs an IPv4 or IPv6 address after it");
                };
                via = Some(v);
            }
            "dev" | "oif" => match toks.next() {
                Some(d) => dev = Some(d),
                None => return err(n, "`dev` needs an interface name after it"),
            },
            "nhid" => nhid = toks.next(),
            "metric" | "priority" => {
                metric = match toks.next().and_then(|m| m.parse().ok()) {
                    Some(m) => m,
                    None => return err(n, "`metric` needs a number after it"),
                }
            }
            "encap" => break, // encapsulation details run to the end of the line
            t if SKIP_VALUE.contains(&t) => {
                toks.next();
            }
            _ => {} // flags: onlink, linkdown, dead, pervasive, offload, rt_trap, ...
        }
    }
    let mut key = String::new();
    if let Some(v) = via {
        key.push_str("via ");
        key.push_str(v);
    }
    if let Some(d) = dev {
        if !key.is_empty() {
            key.push(' ');
        }
        key.push_str("dev ");
        key.push_str(d);
    }
    if key.is_empty() {
        if let Some(id) = nhid {
            key = format!("nhid {id}");
        }
    }
    Ok((key, metric, via.map(|v| v.contains(':'))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_round_trip_and_errors() {
        let t = parse(
            "# a table\n198.18.0.0/15 3\n\n2001:2::/48 7 # lab\n0.0.0.0/0 0\n",
            Format::Auto,
        )
        .expect("test input is valid");
        assert_eq!(t.v4.len(), 2);
        assert_eq!(t.v6.len(), 1);
        assert_eq!(
            parse(&t.to_plain(), Format::Plain).expect("test input is valid"),
            t
        );
        let e = parse("198.18.0.0/15 1\n198.18.0.0/33 1\n", Format::Plain)
            .expect_err("input is invalid");
        assert_eq!(e.line, 2);
        assert!(
            e.to_string().starts_with("line 2: bad prefix length"),
            "{e}"
        );
        let e = parse("198.18.0.0/15 1\n\n198.18.0.0/15 2\n", Format::Plain)
            .expect_err("input is invalid");
        assert_eq!(
            e.to_string(),
            "line 3: duplicate prefix 198.18.0.0/15 (first on line 1)"
        );
        let e = parse("198.18.1.0/15 1\n", Format::Plain).expect_err("input is invalid");
        assert!(e.message.contains("198.18.0.0/15"), "{e}");
        let e = parse("198.18.0.0/15 4294967295\n", Format::Plain).expect_err("input is invalid");
        assert!(e.message.contains("next hop"), "{e}");
        let e = parse("198.18.0.0/15\n", Format::Plain).expect_err("input is invalid");
        assert!(e.message.contains("found 1 fields"), "{e}");
    }

    #[test]
    fn ip_route_output() {
        let text = "\
default via 198.18.0.1 dev eth0 proto dhcp src 198.18.0.5 metric 100
default via 198.18.0.9 dev eth1 metric 50
198.18.0.0/24 dev eth0 proto kernel scope link src 198.18.0.5 metric 100
198.19.0.0/16 via 198.18.0.1 dev eth0
blackhole 198.19.7.0/24
unreachable 198.19.8.0/24 metric 5
198.18.3.4 dev eth1 scope link
198.19.9.0/24 proto static metric 20
\tnexthop via 198.18.0.1 dev eth0 weight 1
\tnexthop via 198.18.0.9 dev eth1 weight 1
";
        let t = parse(text, Format::Auto).expect("test input is valid");
        let get = |s: &str| {
            let p: Prefix<u32> = s.parse().expect("test input is valid");
            t.v4.iter().find(|r| r.0 == p).map(|r| t.hop_name(r.1))
        };
        assert_eq!(
            get("0.0.0.0/0").as_deref(),
            Some("via 198.18.0.9 dev eth1"),
            "lowest metric wins"
        );
        assert_eq!(get("198.18.0.0/24").as_deref(), Some("dev eth0"));
        assert_eq!(
            get("198.19.0.0/16").as_deref(),
            Some("via 198.18.0.1 dev eth0")
        );
        assert_eq!(get("198.19.7.0/24").as_deref(), Some("blackhole"));
        assert_eq!(get("198.19.8.0/24").as_deref(), Some("unreachable"));
        assert_eq!(get("198.18.3.4/32").as_deref(), Some("dev eth1"));
        assert_eq!(
            get("198.19.9.0/24").as_deref(),
            Some("via 198.18.0.1 dev eth0; via 198.18.0.9 dev eth1")
        );
        assert_eq!(t.v4.len(), 7);
        // Same next hop, same index.
        let i1 =
            t.v4.iter()
                .find(|r| r.0.to_string() == "198.19.0.0/16")
                .expect("test input is valid")
                .1;
        assert_eq!(t.hop_name(i1), "via 198.18.0.1 dev eth0");

        let v6 = "\
2001:2::/64 dev fl0 proto kernel metric 256 pref medium
fe80::/64 dev fl0 proto kernel metric 256 pref medium
default via fe80::1 dev fl0 proto ra metric 1024 expires 1797sec hoplimit 64 pref medium
";
        let t = parse(v6, Format::Auto).expect("test input is valid");
        assert_eq!(t.v6.len(), 3);
        assert!(t
            .v6
            .iter()
            .any(|r| r.0.is_empty() && t.hop_name(r.1) == "via fe80::1 dev fl0"));
        let e = parse(
            "default via 198.18.0.1 dev eth0\nbogus dev eth0\n",
            Format::IpRoute,
        )
        .expect_err("input is invalid");
        assert_eq!(e.line, 2);
        let e = parse("198.18.0.0/24 via\n", Format::IpRoute).expect_err("input is invalid");
        assert!(e.to_string().starts_with("line 1: `via` needs"), "{e}");
        let e = parse("\tnexthop via 198.18.0.1 dev eth0\n", Format::IpRoute)
            .expect_err("input is invalid");
        assert_eq!(e.line, 1);
    }
}
