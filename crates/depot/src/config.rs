//! Depot configuration: a TOML file, overridable by command-line flags.
//!
//! Every field has a default, so `lors depot --data DIR` needs no file at all.
//! See `docs/depot.md` and `examples/depot.toml` for the annotated format.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Default IBP listen address (port 6714).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:6714";
/// Default resource size when none is configured: 10 GiB.
pub const DEFAULT_RESOURCE_BYTES: u64 = 10 << 30;
/// Default maximum allocation duration: 30 days, as the reference depot's mkfs.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(30 * 86_400);
/// Default STATUS password. LoRS 0.82 always sends `ibp`.
pub const DEFAULT_PASSWORD: &str = "ibp";

/// A size in bytes written as `1024`, `"64MiB"`, `"10G"` or `"1.5 TiB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

/// A duration written as `3600`, `"90s"`, `"30m"`, `"12h"`, `"30d"` or `"2w"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub Duration);

pub use lors_ibp::units::{parse_duration, parse_size};

/// A plain number, or a string with a unit (`"64MiB"`, `"30d"`).
fn number_or_text<'de, D, T>(
    d: D,
    from_number: impl FnOnce(u64) -> T,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        N(u64),
        S(String),
    }
    match Raw::deserialize(d)? {
        Raw::N(n) => Ok(from_number(n)),
        Raw::S(s) => parse(&s).map_err(serde::de::Error::custom),
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number_or_text(d, ByteSize, |s| parse_size(s).map(ByteSize))
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number_or_text(
            d,
            |n| Span(Duration::from_secs(n)),
            |s| parse_duration(s).map(Span),
        )
    }
}

/// When the depot forces acknowledged data to stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SyncPolicy {
    /// `fdatasync` the data, then the header, before every STORE/WRITE reply
    /// (survives power loss). The default.
    #[default]
    Always,
    /// Leave flushing to the OS: acknowledged data survives a depot crash or
    /// `kill -9` but not a power failure. For scratch depots and benchmarks.
    Never,
}

/// Allocation types a resource may offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TypeName {
    /// IBP_BYTEARRAY.
    ByteArray,
    /// IBP_FIFO.
    Fifo,
    /// IBP_CIRQ.
    Circular,
}

/// One storage resource (an RID): a directory and its limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// Resource id as it appears in capabilities. Must not be `0`.
    pub rid: String,
    /// Directory holding the metadata database and the data files.
    pub path: PathBuf,
    /// Total bytes this resource rents out (sum of allocation max sizes).
    #[serde(default = "default_size")]
    pub size: ByteSize,
    /// Cap on hard allocations (default: `size`).
    pub hard_size: Option<ByteSize>,
    /// Cap on soft allocations (default: `size`).
    pub soft_size: Option<ByteSize>,
    /// Longest allocation lifetime (default 30 days).
    #[serde(default = "default_max_duration")]
    pub max_duration: Span,
    /// Largest single allocation (default: `size`).
    pub max_alloc_size: Option<ByteSize>,
    /// Largest FIFO / circular-queue allocation (default 64 MiB); queue STOREs
    /// are staged in memory, so this bounds memory per queue transfer.
    #[serde(default = "default_max_queue")]
    pub max_queue_size: ByteSize,
    /// Offered types (default: all three).
    #[serde(default = "default_types")]
    pub types: Vec<TypeName>,
}

fn default_size() -> ByteSize {
    ByteSize(DEFAULT_RESOURCE_BYTES)
}
fn default_max_duration() -> Span {
    Span(DEFAULT_MAX_DURATION)
}
fn default_max_queue() -> ByteSize {
    ByteSize(64 << 20)
}
fn default_types() -> Vec<TypeName> {
    vec![TypeName::ByteArray, TypeName::Fifo, TypeName::Circular]
}

impl ResourceConfig {
    /// A resource with every default, at `path`.
    pub fn new(rid: &str, path: PathBuf) -> Self {
        ResourceConfig {
            rid: rid.to_owned(),
            path,
            size: default_size(),
            hard_size: None,
            soft_size: None,
            max_duration: default_max_duration(),
            max_alloc_size: None,
            max_queue_size: default_max_queue(),
            types: default_types(),
        }
    }
}

/// The whole depot configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// IBP listen address (default `0.0.0.0:6714`; port 0 picks a free one).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Host (and optional `:port`) written into capabilities. Default: the
    /// listen IP, or the machine's host name when listening on all interfaces.
    pub advertise: Option<String>,
    /// Optional Prometheus metrics listen address (serves `/metrics`).
    pub metrics_listen: Option<SocketAddr>,
    /// STATUS password (default `ibp`).
    #[serde(default = "default_password")]
    pub password: String,
    /// Also accept `ibp` for STATUS INQ whatever `password` is, because LoRS
    /// 0.82 always sends it (default true).
    #[serde(default = "yes")]
    pub accept_default_password: bool,
    /// Most simultaneous client connections; more get `-66` (busy).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Close a connection idle this long between commands (default 60 s).
    #[serde(default = "default_idle")]
    pub idle_timeout: Span,
    /// Abort a data phase with no progress for this long (default 60 s).
    /// A request's own timeout field may raise it, up to `max_client_timeout`.
    #[serde(default = "default_idle")]
    pub io_timeout: Span,
    /// The longest inactivity deadline a client may ask for in a request's
    /// timeout field (default 300 s). Longer requests get this much.
    #[serde(default = "default_max_client_timeout")]
    pub max_client_timeout: Span,
    /// Most connections one client address may hold open (default 160); more
    /// get `-66` (busy), as over `max_connections`.
    #[serde(default = "default_connections_per_client")]
    pub max_connections_per_client: usize,
    /// Most data phases (STORE, WRITE, queue LOAD) one client address may run
    /// at once (default 128); more wait, up to their I/O deadline, for a slot.
    #[serde(default = "default_transfers_per_client")]
    pub max_transfers_per_client: usize,
    /// Most transfer-buffer memory one client address may hold at once
    /// (default: a quarter of `buffer_memory`), so the rest stays free for
    /// other clients. Buffers are held only while a client's bytes flow.
    pub max_buffer_per_client: Option<ByteSize>,
    /// Most allocations the depot holds at once (default 1,000,000; each
    /// keeps about 1 KiB of memory); more get `-45` (policy).
    #[serde(default = "default_max_allocations")]
    pub max_allocations: usize,
    /// How often the expiry worker runs at most (default 1 s).
    #[serde(default = "default_reap")]
    pub reap_interval: Span,
    /// Memory for in-flight transfer buffers across all connections.
    #[serde(default = "default_buffer_memory")]
    pub buffer_memory: ByteSize,
    /// fsync policy.
    #[serde(default)]
    pub sync: SyncPolicy,
    /// Refuse what the reference (ACCRE) depot refuses where ours is lenient,
    /// so clients can be tested against the strictest behaviour: MANAGE CHNG
    /// with max size 0 ("keep" here) or below the current max size answers
    /// `-20` (default false).
    #[serde(default)]
    pub strict: bool,
    /// Answer ALIAS_ALLOCATE and ALIAS_MANAGE (ACCRE/LStore extensions) with
    /// `-43` IBP_E_UNKNOWN_FUNCTION, as a LoRS 0.82-era depot does, so
    /// clients can be tested against one (default true: aliases served).
    #[serde(default = "yes")]
    pub aliases: bool,
    /// Storage resources; at least one.
    #[serde(default, rename = "resource")]
    pub resources: Vec<ResourceConfig>,
}

fn default_listen() -> SocketAddr {
    DEFAULT_LISTEN.parse().expect("constant address parses")
}
fn default_password() -> String {
    DEFAULT_PASSWORD.to_owned()
}
fn yes() -> bool {
    true
}
fn default_max_connections() -> usize {
    1024
}
fn default_idle() -> Span {
    Span(Duration::from_secs(60))
}
fn default_max_client_timeout() -> Span {
    Span(Duration::from_secs(300))
}
// A client 188 ms away whose TCP buffers are not tuned needs about 70
// connections, each moving one 32 KiB window per round trip, to fill a
// 100 Mbit/s link, and its tools open up to 128 (a download's distance,
// `lors::download::MAX_AUTO_CONNECTIONS`); the rest is room for others.
fn default_connections_per_client() -> usize {
    160
}
fn default_transfers_per_client() -> usize {
    128
}
fn default_max_allocations() -> usize {
    1_000_000
}
fn default_reap() -> Span {
    Span(Duration::from_secs(1))
}
fn default_buffer_memory() -> ByteSize {
    ByteSize(256 << 20)
}

impl Default for Config {
    fn default() -> Self {
        toml::from_str("").expect("an empty config takes every default")
    }
}

impl Config {
    /// Parses a TOML document.
    pub fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Transfer-buffer bytes one client address may hold (the configured
    /// `max_buffer_per_client`, or a quarter of `buffer_memory`).
    pub fn buffer_per_client(&self) -> u64 {
        self.max_buffer_per_client
            .map_or((self.buffer_memory.0 / 4).max(2 << 20), |b| b.0)
    }

    /// Checks cross-field rules; returns a message that says what to fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.resources.is_empty() {
            return Err(
                "no storage resource configured: pass --data DIR or add a [[resource]] section"
                    .into(),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for r in &self.resources {
            if r.rid == "0" || !lors_ibp::caps::valid_rid(&r.rid) {
                return Err(format!(
                    "resource id {:?} is invalid: use a short name or number other than 0",
                    r.rid
                ));
            }
            if !seen.insert(&r.rid) {
                return Err(format!("resource id {:?} appears twice", r.rid));
            }
            if r.size.0 == 0 {
                return Err(format!("resource {:?} has size 0", r.rid));
            }
            if r.types.is_empty() {
                return Err(format!("resource {:?} offers no allocation type", r.rid));
            }
        }
        if self.max_connections == 0 {
            return Err("max_connections must be at least 1".into());
        }
        if self.buffer_memory.0 < (4 << 20) {
            return Err("buffer_memory must be at least 4MiB".into());
        }
        if self.max_connections_per_client == 0 || self.max_transfers_per_client == 0 {
            return Err(
                "max_connections_per_client and max_transfers_per_client must be at least 1".into(),
            );
        }
        let share = self.buffer_per_client();
        if share < (2 << 20) || share > self.buffer_memory.0 {
            return Err(format!(
                "max_buffer_per_client must be between 2MiB and buffer_memory ({} bytes)",
                self.buffer_memory.0
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_config_parses_and_validates() {
        let text = include_str!("../../../examples/depot.toml");
        let cfg = Config::from_toml(text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.resources.len(), 2);
    }

    #[test]
    fn unknown_fields_are_rejected_with_their_name() {
        let err = Config::from_toml("lisen = \"0.0.0.0:1\"").unwrap_err();
        assert!(err.contains("lisen"), "{err}");
    }
}
