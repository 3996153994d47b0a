//! The field types requests share, and the two halves every command's
//! parse and encode are built from: [`Fields`] (a split request line, each
//! accessor range-checking one field) and [`Line`] (a request line being
//! written).

use std::fmt;

use super::ParseError;
use crate::caps::{Capability, Key, valid_rid};
use crate::proto::limits::{MAX_KEY_BYTES, MAX_PASSWORD_BYTES};

/// Protocol version token at the start of every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `0`, "IBP 1.3" (`IBPv031`): ALLOCATE and STATUS carry no RID.
    V13,
    /// `1`, "IBP 1.4" (`IBPv040`).
    V14,
}

impl Version {
    /// The token on the wire.
    pub fn number(self) -> u8 {
        match self {
            Version::V13 => 0,
            Version::V14 => 1,
        }
    }
}

/// Allocation reliability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reliability {
    /// `IBP_SOFT` (1): the depot may revoke it under space pressure.
    Soft,
    /// `IBP_HARD` (2): kept until it expires or is deleted.
    Hard,
}

impl Reliability {
    /// Wire number.
    pub fn number(self) -> i64 {
        match self {
            Reliability::Soft => 1,
            Reliability::Hard => 2,
        }
    }
    /// From the wire number.
    pub fn from_number(n: i64) -> Option<Self> {
        match n {
            1 => Some(Reliability::Soft),
            2 => Some(Reliability::Hard),
            _ => None,
        }
    }
}

/// Allocation type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllocType {
    /// `IBP_BYTEARRAY` (1): append with STORE, write anywhere with WRITE, read at offsets.
    ByteArray,
    /// `IBP_BUFFER` (2): legacy LoCI type; parsed, not offered by our depot.
    Buffer,
    /// `IBP_FIFO` (3): STORE enqueues, LOAD dequeues.
    Fifo,
    /// `IBP_CIRQ` (4): like FIFO but STORE overwrites the oldest bytes when full.
    Circular,
}

impl AllocType {
    /// Wire number.
    pub fn number(self) -> i64 {
        match self {
            AllocType::ByteArray => 1,
            AllocType::Buffer => 2,
            AllocType::Fifo => 3,
            AllocType::Circular => 4,
        }
    }
    /// From the wire number.
    pub fn from_number(n: i64) -> Option<Self> {
        match n {
            1 => Some(AllocType::ByteArray),
            2 => Some(AllocType::Buffer),
            3 => Some(AllocType::Fifo),
            4 => Some(AllocType::Circular),
            _ => None,
        }
    }
}

/// The server-side timeout field. `0`, and fractions below one second that old
/// LoRS clients send, mean "use the depot's default" (§2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// Let the depot decide.
    Default,
    /// Whole seconds (fractions are rounded up).
    Secs(u32),
}

impl Timeout {
    /// The field on the wire.
    pub fn encode(self) -> u32 {
        match self {
            Timeout::Default => 0,
            Timeout::Secs(s) => s,
        }
    }
}

/// A `RID#KEY` token as sent in requests.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyToken {
    /// Resource id, when present.
    pub rid: Option<String>,
    /// The secret key.
    pub key: Key,
}

impl KeyToken {
    /// The token on the wire (it shows the key).
    pub fn encode(&self) -> String {
        match &self.rid {
            Some(r) => format!("{r}#{}", self.key.expose()),
            None => self.key.expose().to_owned(),
        }
    }

    /// The token of a capability.
    pub fn of(cap: &Capability) -> KeyToken {
        KeyToken {
            rid: cap.rid.clone(),
            key: cap.key.clone(),
        }
    }
}

impl fmt::Debug for KeyToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}#{}",
            self.rid.as_deref().unwrap_or("-"),
            self.key.redacted()
        )
    }
}

/// How long an allocation or alias is to live, as the depot reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// This many seconds from now (a depot refuses 0).
    Secs(u64),
    /// As long as allowed: the resource's maximum for an allocation, its
    /// allocation's expiry for an alias.
    Longest,
}

/// The fields every request on an allocation starts with (`<version>
/// <command> <key> <typekey> …`) and its server-side timeout, which ends the
/// line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed {
    /// Version token.
    pub version: Version,
    /// The key the request uses.
    pub key: KeyToken,
    /// Typekey (the depot ignores it).
    pub typekey: String,
    /// Server-side timeout.
    pub timeout: Timeout,
}

impl Keyed {
    /// Fields 2 and 3 of `f`, and the timeout in its last field.
    pub(super) fn parse(f: &Fields<'_>, version: Version) -> Result<Keyed, ParseError> {
        Ok(Keyed {
            version,
            key: f.key(2)?,
            typekey: f.typekey(3)?,
            timeout: f.timeout(f.len() - 1)?,
        })
    }

    /// The line up to the command's own fields; the caller ends it with
    /// [`Line::end`] and `self.timeout`.
    pub(super) fn line(&self, command: super::Command) -> Line {
        let mut l = Line::new(self.version, command.number());
        l.field(self.key.encode()).field(&self.typekey);
        l
    }
}

/// A request line being written: fields joined by one space, ending in
/// ` \n` as the reference clients end them.
pub(super) struct Line(String);

impl Line {
    pub(super) fn new(version: Version, command: i64) -> Line {
        Line(format!("{} {command}", version.number()))
    }

    pub(super) fn field(&mut self, v: impl fmt::Display) -> &mut Line {
        use fmt::Write;
        let _ = write!(self.0, " {v}");
        self
    }

    pub(super) fn end(mut self, timeout: Timeout) -> String {
        self.field(timeout.encode());
        self.0.push_str(" \n");
        self.0
    }
}

pub(super) struct Fields<'a> {
    pub(super) f: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    pub(super) fn len(&self) -> usize {
        self.f.len()
    }
    pub(super) fn int(&self, i: usize, what: &'static str) -> Result<i64, ParseError> {
        let s = self.f[i];
        if s.len() > 20 {
            return Err(ParseError::Invalid(what));
        }
        s.parse::<i64>().map_err(|_| ParseError::Invalid(what))
    }
    pub(super) fn uint(&self, i: usize, what: &'static str) -> Result<u64, ParseError> {
        let s = self.f[i];
        if s.len() > 20 || s.starts_with('+') {
            return Err(ParseError::Invalid(what));
        }
        s.parse::<u64>().map_err(|_| ParseError::Invalid(what))
    }
    /// An `<offset> <length>` pair at `i`, whose end fits in 64 bits.
    pub(super) fn off_len(&self, i: usize) -> Result<(u64, u64), ParseError> {
        let offset = self.uint(i, "offset")?;
        let length = self.uint(i + 1, "length")?;
        offset
            .checked_add(length)
            .ok_or(ParseError::Invalid("offset + length"))?;
        Ok((offset, length))
    }
    pub(super) fn small(&self, i: usize, what: &'static str) -> Result<u32, ParseError> {
        let v = self.int(i, what)?;
        u32::try_from(v).map_err(|_| ParseError::Invalid(what))
    }
    pub(super) fn timeout(&self, i: usize) -> Result<Timeout, ParseError> {
        parse_timeout(self.f[i])
    }
    pub(super) fn key(&self, i: usize) -> Result<KeyToken, ParseError> {
        parse_key_token(self.f[i])
    }
    pub(super) fn typekey(&self, i: usize) -> Result<String, ParseError> {
        let s = self.f[i];
        if s.len() > MAX_KEY_BYTES {
            return Err(ParseError::Invalid("typekey"));
        }
        Ok(s.to_owned())
    }
    pub(super) fn rid(&self, i: usize) -> Result<String, ParseError> {
        let s = self.f[i];
        if !valid_rid(s) {
            return Err(ParseError::Invalid("resource id"));
        }
        Ok(s.to_owned())
    }
    pub(super) fn password(&self, i: usize) -> Result<String, ParseError> {
        let s = self.f[i];
        if s.len() > MAX_PASSWORD_BYTES {
            return Err(ParseError::Invalid("password"));
        }
        Ok(s.to_owned())
    }
    pub(super) fn expect(&self, n: usize, what: &'static str) -> Result<(), ParseError> {
        if self.f.len() == n {
            Ok(())
        } else {
            Err(ParseError::FieldCount(what))
        }
    }
}

pub(super) fn parse_timeout(s: &str) -> Result<Timeout, ParseError> {
    if s.len() > 24 {
        return Err(ParseError::Invalid("timeout"));
    }
    if let Ok(v) = s.parse::<u64>() {
        return Ok(match v {
            0 => Timeout::Default,
            v => Timeout::Secs(u32::try_from(v).unwrap_or(u32::MAX)),
        });
    }
    // Old LoRS builds send fractions such as `0.5`; the reference depot takes
    // them as "default". Only plain decimal fractions are accepted.
    let (int, frac) = s.split_once('.').ok_or(ParseError::Invalid("timeout"))?;
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || !digits(frac) || (int.is_empty() && frac.is_empty()) {
        return Err(ParseError::Invalid("timeout"));
    }
    let whole: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| ParseError::Invalid("timeout"))?
    };
    let has_frac = frac.bytes().any(|b| b != b'0');
    Ok(match whole {
        0 => Timeout::Default,
        w => {
            Timeout::Secs(u32::try_from(w.saturating_add(u64::from(has_frac))).unwrap_or(u32::MAX))
        }
    })
}

pub(super) fn parse_key_token(s: &str) -> Result<KeyToken, ParseError> {
    if s.len() > MAX_KEY_BYTES {
        return Err(ParseError::Invalid("key"));
    }
    let (rid, key) = match s.split_once('#') {
        Some((r, k)) => {
            if !valid_rid(r) {
                return Err(ParseError::Invalid("key"));
            }
            (Some(r.to_owned()), k)
        }
        None => (None, s),
    };
    let key = Key::new(key).ok_or(ParseError::Invalid("key"))?;
    Ok(KeyToken { rid, key })
}
