//! Capabilities: the only access control IBP has.
//!
//! A capability is a URL, `ibp://<host>:<port>/<RID>#<KEY>/<TYPEKEY>/<READ|WRITE|MANAGE>`
//! (`docs/ibp-protocol.md` §3). Whoever holds it may use it, so the secret part
//! ([`Key`]) is generated from the OS CSPRNG, compared in constant time and never
//! printed in full.

use std::fmt;
use std::str::FromStr;

use crate::proto::limits::{MAX_CAP_BYTES, MAX_KEY_BYTES, MAX_RID_BYTES};

/// Bytes of randomness in a generated key: 192 bits, as the reference depot.
pub const KEY_RANDOM_BYTES: usize = 24;

/// Which of an allocation's three capabilities this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CapKind {
    /// LOAD and SEND (source).
    Read,
    /// STORE and WRITE.
    Write,
    /// MANAGE (probe, refcounts, change, truncate).
    Manage,
}

impl CapKind {
    /// All three kinds, in the order allocations report them.
    pub const ALL: [CapKind; 3] = [CapKind::Read, CapKind::Write, CapKind::Manage];

    /// The word in the URL.
    pub fn as_str(self) -> &'static str {
        match self {
            CapKind::Read => "READ",
            CapKind::Write => "WRITE",
            CapKind::Manage => "MANAGE",
        }
    }

    /// The `IBP_READCAP`/`IBP_WRITECAP`/`IBP_MANAGECAP` number used by MANAGE.
    pub fn number(self) -> u32 {
        match self {
            CapKind::Read => 1,
            CapKind::Write => 2,
            CapKind::Manage => 3,
        }
    }

    /// Index into `[read, write, manage]` arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The secret part of a capability (the text after `RID#`).
///
/// `Debug` and `Display` show only a short prefix so keys never reach logs.
/// Equality is constant-time ([`Key::ct_eq`]).
#[derive(Clone)]
pub struct Key(String);

impl Key {
    /// A fresh key: 24 bytes from the OS CSPRNG, base64 with `-` for `/`
    /// (32 characters), the reference depot's alphabet.
    pub fn generate() -> std::io::Result<Key> {
        let mut raw = [0u8; KEY_RANDOM_BYTES];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Key(encode_key(&raw)))
    }

    /// Wraps key text received from a peer, checking its alphabet and length.
    pub fn new(text: &str) -> Option<Key> {
        valid_key_text(text).then(|| Key(text.to_owned()))
    }

    /// The full key text, for building a capability or a request line.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison: the time taken does not depend on where the
    /// keys first differ.
    pub fn ct_eq(&self, other: &Key) -> bool {
        ct_eq(self.0.as_bytes(), other.0.as_bytes())
    }

    /// A short, non-secret rendering for logs: the first 4 characters.
    pub fn redacted(&self) -> String {
        let head: String = self.0.chars().take(4).collect();
        format!("{head}…")
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.redacted())
    }
}

/// Compared in constant time, so `==` on keys (and on capabilities, which
/// hold them) never tells an attacker how much of a guess was right.
impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.ct_eq(other)
    }
}

impl Eq for Key {}

/// Consistent with `==`: equal keys are equal text.
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

/// Constant-time byte-slice equality (`subtle`; the length is not secret).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

fn encode_key(raw: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+-";
    let mut out = String::with_capacity(raw.len().div_ceil(3) * 4);
    for chunk in raw.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            let idx = (n >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(ALPHABET[idx as usize]));
        }
    }
    out
}

/// Key text: printable ASCII without space, `/` or `#`, 1..=MAX_KEY_BYTES long.
fn valid_key_text(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_KEY_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'#')
}

/// A resource id: printable ASCII without `/`, `#` or space.
pub fn valid_rid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_RID_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'#')
}

/// A parsed capability URL.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Capability {
    /// Host as written in the URL (name, IPv4, or bracketed IPv6 without brackets).
    pub host: String,
    /// Depot port.
    pub port: u16,
    /// Resource id, when the key has the `RID#KEY` form.
    pub rid: Option<String>,
    /// The secret key.
    pub key: Key,
    /// The typekey field (ours: the allocation id in decimal).
    pub typekey: String,
    /// Which capability this is.
    pub kind: CapKind,
}

/// Why a capability URL was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapParseError {
    /// The URL is longer than [`MAX_CAP_BYTES`].
    #[error("capability is longer than {MAX_CAP_BYTES} bytes")]
    TooLong,
    /// It does not start with `ibp://`.
    #[error("capability must start with ibp://")]
    Scheme,
    /// It does not have the four `/`-separated parts.
    #[error("capability must look like ibp://host:port/RID#KEY/TYPEKEY/READ|WRITE|MANAGE")]
    Shape,
    /// Bad host or port.
    #[error("capability has a bad host:port")]
    Address,
    /// Bad key or RID.
    #[error("capability has a malformed key")]
    Key,
    /// The last part is not READ, WRITE or MANAGE.
    #[error("capability type must be READ, WRITE or MANAGE")]
    Kind,
}

impl Capability {
    /// Builds a capability for one of our allocations.
    pub fn new(host: &str, port: u16, rid: &str, key: Key, typekey: u64, kind: CapKind) -> Self {
        Capability {
            host: host.to_owned(),
            port,
            rid: Some(rid.to_owned()),
            key,
            typekey: typekey.to_string(),
            kind,
        }
    }

    /// The `host:port` to connect to (IPv6 hosts in brackets).
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The key token sent in requests: `RID#KEY`, or the bare key for
    /// capabilities that carry no RID (LoCI 1.3).
    pub fn key_token(&self) -> String {
        match &self.rid {
            Some(rid) => format!("{rid}#{}", self.key.expose()),
            None => self.key.expose().to_owned(),
        }
    }

    /// The full URL, secret included. Use only to hand the capability to its owner.
    pub fn to_url(&self) -> String {
        format!(
            "ibp://{}/{}/{}/{}",
            self.address(),
            self.key_token(),
            self.typekey,
            self.kind.as_str()
        )
    }

    /// Parses a capability URL with the limits of [`crate::proto::limits`].
    pub fn parse(s: &str) -> Result<Capability, CapParseError> {
        if s.len() > MAX_CAP_BYTES {
            return Err(CapParseError::TooLong);
        }
        let rest = s.strip_prefix("ibp://").ok_or(CapParseError::Scheme)?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [hostport, key, typekey, kind] = parts[..] else {
            return Err(CapParseError::Shape);
        };
        let (host, port) = split_host_port(hostport).ok_or(CapParseError::Address)?;
        let (rid, key) = match key.split_once('#') {
            Some((rid, k)) => {
                if !valid_rid(rid) {
                    return Err(CapParseError::Key);
                }
                (Some(rid.to_owned()), k)
            }
            None => (None, key),
        };
        let key = Key::new(key).ok_or(CapParseError::Key)?;
        if typekey.is_empty()
            || typekey.len() > MAX_KEY_BYTES
            || !typekey.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(CapParseError::Key);
        }
        let kind = match kind {
            "READ" => CapKind::Read,
            "WRITE" => CapKind::Write,
            "MANAGE" => CapKind::Manage,
            _ => return Err(CapParseError::Kind),
        };
        Ok(Capability {
            host: host.to_owned(),
            port,
            rid,
            key,
            typekey: typekey.to_owned(),
            kind,
        })
    }
}

/// Splits `host:port` or `[v6]:port`.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        (h, p)
    } else {
        s.rsplit_once(':')?
    };
    let valid_host = !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'));
    let port: u16 = port.parse().ok()?;
    (valid_host && port != 0).then_some((host, port))
}

impl FromStr for Capability {
    type Err = CapParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Capability::parse(s)
    }
}

impl fmt::Debug for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is redacted: Debug output ends up in logs.
        write!(
            f,
            "ibp://{}/{}#{}/{}/{}",
            self.address(),
            self.rid.as_deref().unwrap_or("-"),
            self.key.redacted(),
            self.typekey,
            self.kind.as_str()
        )
    }
}

/// The three capabilities ALLOCATE returns.
#[derive(Clone, PartialEq, Eq)]
pub struct CapSet {
    /// Read capability.
    pub read: Capability,
    /// Write capability.
    pub write: Capability,
    /// Manage capability.
    pub manage: Capability,
}

impl CapSet {
    /// The capability of one kind.
    pub fn get(&self, kind: CapKind) -> &Capability {
        match kind {
            CapKind::Read => &self.read,
            CapKind::Write => &self.write,
            CapKind::Manage => &self.manage,
        }
    }
}

impl fmt::Debug for CapSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries([&self.read, &self.write, &self.manage])
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_32_chars_of_the_reference_alphabet_and_distinct() {
        let a = Key::generate().unwrap();
        let b = Key::generate().unwrap();
        assert_eq!(a.expose().len(), 32);
        assert!(
            a.expose()
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'-')
        );
        assert!(!a.ct_eq(&b));
        assert!(a.ct_eq(&a.clone()));
        // `==` is the constant-time comparison.
        assert_ne!(a, b);
        assert_eq!(a, a.clone());
        assert_ne!(a, Key::new(&a.expose()[..31]).unwrap());
    }

    #[test]
    fn parses_the_reference_depot_capability() {
        let url =
            "ibp://127.0.0.1:16714/1#Ir4icCr0r-lX1D3CH6jTYOLr8HjUwheK/14571742334203452377/MANAGE";
        let cap = Capability::parse(url).unwrap();
        assert_eq!(cap.host, "127.0.0.1");
        assert_eq!(cap.port, 16714);
        assert_eq!(cap.rid.as_deref(), Some("1"));
        assert_eq!(cap.kind, CapKind::Manage);
        assert_eq!(cap.typekey, "14571742334203452377");
        assert_eq!(cap.to_url(), url);
        assert_eq!(cap.key_token(), "1#Ir4icCr0r-lX1D3CH6jTYOLr8HjUwheK");
    }

    #[test]
    fn debug_never_shows_the_whole_key() {
        let url = "ibp://h:1/1#SECRETSECRETSECRET/5/READ";
        let cap = Capability::parse(url).unwrap();
        assert!(!format!("{cap:?}").contains("SECRETSECRET"));
    }

    #[test]
    fn parses_ipv6_and_loci_forms() {
        let cap = Capability::parse("ibp://[::1]:6714/0#IBP-abc/77/READ").unwrap();
        assert_eq!(cap.host, "::1");
        assert_eq!(cap.address(), "[::1]:6714");
        let cap = Capability::parse("ibp://h:6714/IBP-1234/99/WRITE").unwrap();
        assert_eq!(cap.rid, None);
        assert_eq!(cap.key_token(), "IBP-1234");
    }

    #[test]
    fn rejects_malformed_capabilities() {
        for bad in [
            "http://h:1/1#k/1/READ",
            "ibp://h:1/1#k/1",
            "ibp://h:1/1#k/1/READ/x",
            "ibp://h/1#k/1/READ",
            "ibp://h:0/1#k/1/READ",
            "ibp://h:99999/1#k/1/READ",
            "ibp://h:1/1#/1/READ",
            "ibp://h:1/1#k/1/read",
            "ibp://h h:1/1#k/1/READ",
            "ibp://h:1/1#k k/1/READ",
        ] {
            assert!(Capability::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Capability::parse(&format!("ibp://h:1/1#{}/1/READ", "a".repeat(2000))),
            Err(CapParseError::TooLong)
        );
    }
}
