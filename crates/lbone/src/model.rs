//! What depots tell the L-Bone and what it answers. All JSON bodies reject
//! unknown fields, so a typo in a client is an error, not a silent default.

use serde::{Deserialize, Serialize};

/// Where a depot is. Every field is optional; the hint terms of LoRS
/// (`city=`, `country=`, `zip=`, `state=`, `airport=`) match these.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    /// City, e.g. `Brno`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub city: Option<String>,
    /// State or region, e.g. `TN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Country (ISO code or name), e.g. `CZ`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    /// Postal code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zip: Option<String>,
    /// Nearest airport code, e.g. `TYS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub airport: Option<String>,
    /// Degrees north.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latitude: Option<f64>,
    /// Degrees east.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longitude: Option<f64>,
    /// Free-form tags, e.g. `campus`, `10GbE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl Location {
    /// The coordinates, when both are known and valid.
    pub fn point(&self) -> Option<(f64, f64)> {
        match (self.latitude, self.longitude) {
            (Some(la), Some(lo))
                if (-90.0..=90.0).contains(&la) && (-180.0..=180.0).contains(&lo) =>
            {
                Some((la, lo))
            }
            _ => None,
        }
    }
}

/// One storage resource of a depot.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resource {
    /// Resource id (RID).
    pub rid: String,
    /// Bytes still allocatable as hard storage.
    pub hard_free: u64,
    /// Hard capacity in bytes.
    pub hard_total: u64,
    /// Bytes still allocatable as soft storage.
    pub soft_free: u64,
    /// Soft capacity in bytes.
    pub soft_total: u64,
    /// Longest lease in seconds.
    pub max_duration: u64,
    /// Allocation types offered (`byte_array`, `buffer`, `fifo`, `circular`).
    #[serde(default)]
    pub types: Vec<String>,
}

/// A depot's registration and heartbeat body (`POST /api/v1/register`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    /// Host name or address clients use (as in its capabilities).
    pub host: String,
    /// IBP port.
    pub port: u16,
    /// Its resources.
    pub resources: Vec<Resource>,
    /// Where it is.
    #[serde(default)]
    pub location: Location,
    /// Depot software and version, e.g. `lors 0.1.0`.
    #[serde(default)]
    pub version: String,
}

/// Bounds on what a registration may carry.
pub const MAX_RESOURCES: usize = 256;
/// Longest host, location field, tag or version string.
pub const MAX_TEXT: usize = 255;
/// Most tags per depot.
pub const MAX_TAGS: usize = 32;
/// Most allocation types per resource, and the longest name of one (the
/// known ones are `byte_array`, `buffer`, `fifo`, `circular`).
pub const MAX_TYPES: usize = 8;
/// Longest allocation type name.
pub const MAX_TYPE: usize = 32;
/// Largest registration body, in bytes: 256 resources with every field at
/// its bound fit.
pub const MAX_REGISTRATION: usize = 256 << 10;

/// Why a registration is refused (answered 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Not a host name or address a client could reach.
    #[error("bad host {0:?}")]
    Host(String),
    /// Port 0.
    #[error("port 0")]
    Port,
    /// No resource, or more than [`MAX_RESOURCES`].
    #[error("1 to {MAX_RESOURCES} resources, please")]
    Resources,
    /// A text field, the tags or a resource's types past their bounds.
    #[error(
        "text fields are limited to {MAX_TEXT} bytes, tags to {MAX_TAGS}, types to {MAX_TYPES} per resource"
    )]
    TooLong,
    /// An allocation type name longer than [`MAX_TYPE`].
    #[error("allocation type names are limited to {MAX_TYPE} bytes")]
    TypeName,
    /// One of latitude and longitude, or either out of range.
    #[error("latitude and longitude go together, within ±90 / ±180")]
    LatLon,
}

impl Registration {
    /// `host:port`, the depot's identity in the directory.
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Checks the bounds and that the host is usable.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !valid_host(&self.host) {
            return Err(Invalid::Host(self.host.clone()));
        }
        if self.port == 0 {
            return Err(Invalid::Port);
        }
        if self.resources.is_empty() || self.resources.len() > MAX_RESOURCES {
            return Err(Invalid::Resources);
        }
        let l = &self.location;
        let texts = [&l.city, &l.state, &l.country, &l.zip, &l.airport];
        if texts
            .iter()
            .filter_map(|t| t.as_ref())
            .any(|t| t.len() > MAX_TEXT)
            || l.tags.len() > MAX_TAGS
            || l.tags.iter().any(|t| t.len() > MAX_TEXT)
            || self.version.len() > MAX_TEXT
            || self
                .resources
                .iter()
                .any(|r| r.rid.len() > MAX_TEXT || r.types.len() > MAX_TYPES)
        {
            return Err(Invalid::TooLong);
        }
        if (self.resources.iter())
            .flat_map(|r| &r.types)
            .any(|t| t.len() > MAX_TYPE)
        {
            return Err(Invalid::TypeName);
        }
        if l.latitude.is_some() != l.longitude.is_some()
            || (l.latitude.is_some() && l.point().is_none())
        {
            return Err(Invalid::LatLon);
        }
        Ok(())
    }

    /// Largest hard space any one resource offers.
    pub fn hard_free(&self) -> u64 {
        self.resources
            .iter()
            .map(|r| r.hard_free)
            .max()
            .unwrap_or(0)
    }

    /// Largest soft space any one resource offers.
    pub fn soft_free(&self) -> u64 {
        self.resources
            .iter()
            .map(|r| r.soft_free)
            .max()
            .unwrap_or(0)
    }
}

/// A depot as the directory stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct DepotRecord {
    /// What it last said.
    pub reg: Registration,
    /// When it first registered (Unix seconds).
    pub first_seen: i64,
    /// When it last registered or heartbeat (Unix seconds).
    pub last_seen: i64,
}

/// A depot in an answer (`GET /api/v1/depots`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DepotView {
    /// `host:port`.
    pub addr: String,
    /// Online (heartbeat within the window) or offline.
    pub online: bool,
    /// Seconds since the last heartbeat.
    pub age: i64,
    /// Registration.
    pub depot: Registration,
    /// Great-circle distance from the query's point, km.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distance_km: Option<f64>,
    /// Forecast bandwidth for the asking client's network, bytes/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<f64>,
}

/// A client's measured transfer rate (`POST /api/v1/rates`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateReport {
    /// `host:port` of the depot.
    pub depot: String,
    /// Bytes per second achieved; 0 when the depot could not be reached.
    pub bytes_per_sec: f64,
}

/// Several reports at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateReports {
    /// The reports.
    pub rates: Vec<RateReport>,
}

/// A depot leaving the directory on a clean stop (`POST /api/v1/deregister`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Departure {
    /// Host name or address, as registered.
    pub host: String,
    /// IBP port, as registered.
    pub port: u16,
}

impl Departure {
    /// `host:port`, as [`Registration::addr`] names the same depot.
    pub fn addr(&self) -> String {
        Registration {
            host: self.host.clone(),
            port: self.port,
            ..Registration::default()
        }
        .addr()
    }
}

/// Whether `host` is something a client can connect to: an IPv4 or IPv6
/// address, or a DNS name (dot-separated labels of letters, digits, `-`
/// and `_`, none empty or starting or ending with `-`).
///
/// ```
/// use lors_lbone::model::valid_host;
/// assert!(valid_host("depot1.example.org"));
/// assert!(valid_host("127.0.0.1") && valid_host("::1") && valid_host("fe80::1"));
/// for bad in [":", "..", "a:b:c", "", "-a.org", "a..b", "a b"] {
///     assert!(!valid_host(bad), "{bad:?}");
/// }
/// ```
pub fn valid_host(host: &str) -> bool {
    if host.is_empty() || host.len() > MAX_TEXT {
        return false;
    }
    if host.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The directory at one minute, for the dashboard's history
/// (`GET /api/v1/history`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Start of the minute (Unix seconds).
    pub t: i64,
    /// Depots listed.
    pub depots: u64,
    /// Of those, online.
    pub online: u64,
    /// Hard space of the online depots.
    pub hard_total: u64,
    /// Free hard space of the online depots.
    pub hard_free: u64,
    /// Sum of the rates (bytes/s) clients reported in the minute.
    pub reported_sum: f64,
    /// How many rates clients reported in the minute.
    pub reports: u64,
}

/// The answer to `GET /api/v1/history`: a day of [`Sample`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// Seconds between samples.
    pub step: i64,
    /// Oldest first.
    pub samples: Vec<Sample>,
}

/// The answer to `POST /api/v1/register`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// Always true (a refusal is an error answer).
    pub ok: bool,
    /// How often the directory expects a heartbeat.
    pub heartbeat_seconds: u64,
}

/// The answer to `POST /api/v1/deregister`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    /// Always true.
    pub ok: bool,
    /// Whether the directory listed the depot.
    pub removed: bool,
}

/// The answer to `POST /api/v1/rates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// Always true.
    pub ok: bool,
    /// How many reports named a listed depot and were kept.
    pub recorded: usize,
}

/// The answer to `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Healthy {
    /// Always true: the server answers.
    pub ok: bool,
}
