//! `http load`'s configuration: client pools, phases, and the TOML scenario file that holds
//! them; URLs and source prefixes read into what the workers need.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use serde::{Deserialize, Serialize};

use crate::ToolError;

/// One URL of a pool's set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrlConfig {
    /// Path and query, e.g. `/bytes/1024` or `/index.html`.
    pub path: String,
    /// Relative weight (how often it is asked, against the others).
    #[serde(default = "one")]
    pub weight: u32,
    /// Response size asked of flowlane's server (`size=N` added to the query).
    #[serde(default)]
    pub size: Option<u64>,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// A pool of clients: its connections, addresses, URLs and pace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Its name in reports.
    #[serde(default = "default_name")]
    pub name: String,
    /// Server, `host:port` (also the Host header).
    pub target: String,
    /// URLs asked, by weight.
    pub urls: Vec<UrlConfig>,
    /// Concurrent connections.
    pub connections: usize,
    /// Requests per second for the whole pool (constant rate); none: closed loop.
    #[serde(default)]
    pub rate: Option<f64>,
    /// Closed loop: milliseconds between an answer and the next request.
    #[serde(default)]
    pub think_ms: f64,
    /// Request body bytes (sent with POST unless a method is given).
    #[serde(default)]
    pub body_size: u64,
    /// Request method (default GET, or POST with a body).
    #[serde(default)]
    pub method: Option<String>,
    /// Keep connections open between requests (off: one request per connection).
    #[serde(default = "yes")]
    pub keep_alive: bool,
    /// Source addresses: a prefix (`198.18.128.0/17`) whose addresses the connections bind
    /// in turn; it must be local (the lab routes it to `lo`: `ip route add local PREFIX dev
    /// lo`). None: the kernel chooses.
    #[serde(default)]
    pub source: Option<String>,
    /// How many addresses of the prefix to use (default: all, up to 65 536).
    #[serde(default)]
    pub source_count: Option<usize>,
    /// Connections placed on the receiving interface's RSS queues (`per_queue` each, so
    /// `connections` is `per_queue` times the queues): with 4-tuple hashing each connection
    /// binds source ports the picker chose for its queue, with 2-tuple hashing source
    /// addresses of `source`.
    #[serde(default)]
    pub placement: Option<crate::blast::Placement>,
}

fn default_name() -> String {
    "default".into()
}

/// The share of requests that may be errors when no limit is given (1 %).
pub const DEFAULT_MAX_ERROR_SHARE: f64 = 0.01;

/// What `http load` runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpLoadConfig {
    /// Client pools.
    pub pools: Vec<PoolConfig>,
    /// One worker per CPU (each pool's connections and rate split evenly).
    #[serde(default)]
    pub cpus: Vec<usize>,
    /// Rate and connections grow linearly over this many seconds.
    #[serde(default)]
    pub ramp_up_s: f64,
    /// Full rate for this many seconds (the measured phase).
    pub duration_s: f64,
    /// Rate falls to zero over this many seconds.
    #[serde(default)]
    pub ramp_down_s: f64,
    /// Answers in flight are waited for this long after the last phase.
    #[serde(default = "two")]
    pub drain_s: f64,
    /// A request without a complete answer this long after it was sent is a timeout.
    #[serde(default = "ten")]
    pub timeout_s: f64,
    /// Connects in progress at once, per worker (new connections are paced by this, so the
    /// server's accept queue does not overflow).
    #[serde(default = "window")]
    pub connect_window: usize,
    /// Status interval, seconds.
    #[serde(default = "one_f")]
    pub interval_s: f64,
    /// Busy polling, microseconds: a worker that found no work keeps polling this long before
    /// it sleeps (0: sleep at once). Spends client CPU so that the server never has to wake the
    /// client — on one host (loopback) that buys the server's throughput with the client's CPU.
    #[serde(default)]
    pub busy_poll_us: f64,
    /// The most one read (or one drop of body bytes) takes while a worker has 64 or more
    /// answers outstanding, bytes (0: the whole 64 KiB read buffer). Smaller reads free
    /// receive space sooner; on one host the server's next segments then go out in the
    /// client's system calls, on the client's CPU.
    #[serde(default)]
    pub read_size: usize,
    /// Batch waits, microseconds (0: none): in a closed loop with 64 or more answers
    /// outstanding and answers under 16 KiB, a worker about to sleep first waits up to this
    /// long (steered so the wake finds 50–80 % of what was outstanding ready), so it wakes to
    /// a batch of answers and the server never has to wake it. Fewer client
    /// wake-ups: more answers per client CPU second, and on one host more of the server's.
    #[serde(default)]
    pub batch_wait_us: f64,
    /// More errors than this (connect, reset, timeout, parse, closed early, 4xx/5xx) fail
    /// the run. Unset: `max_error_share` of the requests sent.
    #[serde(default)]
    pub max_errors: Option<u64>,
    /// Without `max_errors`: a run whose errors are more than this share (0–1) of the
    /// requests it sent fails. Unset: [`DEFAULT_MAX_ERROR_SHARE`] (1 %), so that a run
    /// whose answers are all 403s or 404s is never "passed".
    #[serde(default)]
    pub max_error_share: Option<f64>,
    /// Serve the workers' counters in the OpenMetrics text format at this address while
    /// running (`--metrics`).
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Bytes the latency histograms may take at most (`--max-memory`); unset: half of the
    /// memory available at the start (`MemAvailable`).
    #[serde(default)]
    pub max_memory: Option<u64>,
    /// This run's shard of a larger one (each pool's share of the connections, the rate and
    /// the source addresses) and a wall-clock start: from the command line only.
    #[serde(skip)]
    pub sharding: crate::shard::Sharding,
}

impl HttpLoadConfig {
    /// A pool's connections in this run: all of them, or the shard's part.
    pub fn conns(&self, p: &PoolConfig) -> usize {
        self.sharding.shard.part(p.connections).len()
    }
}

fn two() -> f64 {
    2.0
}
fn ten() -> f64 {
    10.0
}
fn one_f() -> f64 {
    1.0
}
fn window() -> usize {
    128
}

impl HttpLoadConfig {
    /// Reads a scenario file's text (TOML: the fields of this struct; `[[pools]]` tables).
    pub fn from_toml(text: &str) -> Result<HttpLoadConfig, ToolError> {
        // The error's own text quotes the whole line (a line of 3 000 bytes, quoted whole):
        // its message and where instead.
        toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(String::new(), |s| {
                let before = &text[..s.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(" at line {line}, column {col}")
            });
            ToolError::usage(format!(
                "scenario{at}: {}",
                crate::input::excerpt(e.message().trim())
            ))
        })
    }
}

/// `url` with a password in it (`user:secret@`) shown as `user:***@`: what an error may quote.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((who, host)) => {
            let user = who.split_once(':').map_or(who, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{}", &rest[end..])
        }
        None => url.to_string(),
    }
}

/// `http://host:port/path` read into (host:port, path).
pub fn split_url(url: &str) -> Result<(String, String), ToolError> {
    let shown = redacted(url);
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        ToolError::usage(format!(
            "URL {shown:?}: only http:// URLs are supported (no TLS), e.g. http://198.18.0.1:8080/bytes/64"
        ))
    })?;
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if auth.is_empty() {
        return Err(ToolError::usage(format!("URL {shown:?} names no host")));
    }
    if auth.contains('@') {
        return Err(ToolError::usage(format!(
            "URL {shown:?}: credentials in the URL are not supported (the load sends no \
             Authorization header)"
        )));
    }
    if auth.rsplit_once(':').is_some_and(|(_, p)| p == "0") {
        return Err(ToolError::usage(format!(
            "URL {shown:?}: port 0 is not a port a server listens on"
        )));
    }
    let auth = if auth.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) {
        auth.to_string()
    } else {
        format!("{auth}:80")
    };
    Ok((auth, path.to_string()))
}

/// Resolves `host:port` (no DNS beyond what the system resolver does for names).
pub fn resolve(target: &str) -> Result<SocketAddr, ToolError> {
    target
        .to_socket_addrs()
        .map_err(|e| ToolError::usage(format!("target {target:?}: {e}")))?
        .next()
        .ok_or_else(|| ToolError::usage(format!("target {target:?} has no address")))
}

/// The first `count` usable addresses of `prefix` (IPv4: not the network or broadcast
/// address when the prefix has them).
pub fn prefix_addresses(prefix: &str, count: Option<usize>) -> Result<Vec<IpAddr>, ToolError> {
    let bad = || {
        ToolError::usage(format!(
            "source prefix {prefix:?}: expected ADDRESS/LENGTH, e.g. 198.18.128.0/17"
        ))
    };
    let (a, l) = prefix.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = a.parse().map_err(|_| bad())?;
    let len: u32 = l.parse().map_err(|_| bad())?;
    let bits = if addr.is_ipv4() { 32 } else { 128 };
    if len > bits {
        return Err(bad());
    }
    let host_bits = bits - len;
    let size: u128 = if host_bits >= 127 {
        u128::MAX
    } else {
        1u128 << host_bits
    };
    let raw: u128 = match addr {
        IpAddr::V4(v) => u32::from(v) as u128,
        IpAddr::V6(v) => u128::from(v),
    };
    let net = if host_bits >= 128 {
        0
    } else {
        raw & !(size - 1)
    };
    let (first, usable) = if addr.is_ipv4() && host_bits >= 2 {
        (1, size - 2)
    } else {
        (0, size)
    };
    let want = count
        .unwrap_or(65_536)
        .min(usable.min(usize::MAX as u128) as usize);
    if want == 0 {
        return Err(ToolError::usage(format!(
            "source prefix {prefix:?} holds no usable address"
        )));
    }
    Ok((0..want as u128)
        .map(|i| {
            let v = net + first + i;
            match addr {
                IpAddr::V4(_) => IpAddr::from((v as u32).to_be_bytes()),
                IpAddr::V6(_) => IpAddr::from(v.to_be_bytes()),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_with_a_password_or_port_0_is_refused_without_echoing_the_password() {
        let e = split_url("http://user:secret@198.18.0.1:8080/").expect_err("refused");
        assert!(
            e.message.contains("user:***@") && !e.message.contains("secret"),
            "{}",
            e.message
        );
        let e = split_url("https://user:secret@198.18.0.1/").expect_err("refused");
        assert!(!e.message.contains("secret"), "{}", e.message);
        let e = split_url("http://127.0.0.1:0/").expect_err("refused");
        assert!(e.message.contains("port 0"), "{}", e.message);
        assert!(split_url("http://127.0.0.1:80/x").is_ok());
    }

    #[test]
    fn urls() {
        assert_eq!(
            split_url("http://h:81/a?b").ok(),
            Some(("h:81".into(), "/a?b".into()))
        );
        assert_eq!(
            split_url("http://h").ok(),
            Some(("h:80".into(), "/".into()))
        );
        assert_eq!(
            split_url("http://[2001:2::1]:8080/x").ok(),
            Some(("[2001:2::1]:8080".into(), "/x".into()))
        );
        assert!(split_url("https://h/").is_err());
        assert!(split_url("http:///x").is_err());
    }

    #[test]
    fn prefixes() {
        let v = prefix_addresses("198.18.128.0/30", None).expect("valid");
        assert_eq!(
            v,
            vec![
                "198.18.128.1".parse::<IpAddr>().expect("ip"),
                "198.18.128.2".parse().expect("ip")
            ]
        );
        assert_eq!(
            prefix_addresses("198.18.0.0/15", Some(3))
                .expect("valid")
                .len(),
            3
        );
        assert_eq!(
            prefix_addresses("2001:2::/126", None).expect("valid").len(),
            4
        );
        assert_eq!(
            prefix_addresses("198.18.0.7/32", None)
                .expect("valid")
                .len(),
            1
        );
        assert!(prefix_addresses("198.18.0.0/33", None).is_err());
        assert!(prefix_addresses("x/8", None).is_err());
    }

    #[test]
    fn the_documented_scenario_reads() {
        let doc = include_str!("../../../../docs/http.md");
        let toml = doc
            .split("```toml\n")
            .nth(1)
            .and_then(|t| t.split("```").next())
            .expect("a toml block in docs/http.md");
        let c = HttpLoadConfig::from_toml(toml).expect("the documented scenario");
        assert_eq!(c.pools.len(), 2);
        assert_eq!(c.pools[0].urls[1].size, Some(65536));
        assert_eq!(c.pools[1].rate, Some(5000.0));
    }

    #[test]
    fn scenario() {
        let c = HttpLoadConfig::from_toml(
            r#"
duration_s = 5
ramp_up_s = 1
[[pools]]
name = "web"
target = "198.18.0.1:8080"
connections = 100
rate = 1000
urls = [ { path = "/a", weight = 3, size = 64 }, { path = "/b" } ]
[[pools]]
target = "198.18.0.1:8080"
connections = 10
urls = [ { path = "/echo" } ]
body_size = 100
keep_alive = false
"#,
        )
        .expect("valid scenario");
        assert_eq!(c.pools.len(), 2);
        assert_eq!(c.pools[0].urls[0].weight, 3);
        assert_eq!(c.pools[1].name, "default");
        assert!(!c.pools[1].keep_alive);
        assert!(HttpLoadConfig::from_toml("duration_s = 1\npools = []\nbogus = 1").is_err());
    }
}
