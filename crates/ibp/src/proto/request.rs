//! IBP request lines: a total parser and an encoder (`docs/ibp-protocol.md` §2).
//!
//! `Request::parse` takes one line (with or without its `\n`) and either returns
//! a fully range-checked request or a [`ParseError`] that maps to the status code
//! the reference depot answers with. It never panics and never allocates more
//! than the line's length.

use std::fmt;

use super::chksum::{ChksumType, NetChksum};
use super::limits::{
    MAX_CHKSUM_BLOCK, MAX_FIELDS, MAX_KEY_BYTES, MAX_LINE_BYTES, MAX_PASSWORD_BYTES,
};
use super::status::StatusCode;
use crate::caps::{Capability, Key, valid_rid};

/// Protocol version token at the start of every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `0`, "IBP 1.3" (`IBPv031`): ALLOCATE and STATUS carry no RID.
    V13,
    /// `1`, "IBP 1.4" (`IBPv040`).
    V14,
}

impl Version {
    fn number(self) -> u8 {
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
    fn encode(self) -> u32 {
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
    fn encode(&self) -> String {
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

/// ALLOCATE fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocate {
    /// Request version; V13 has no RID.
    pub version: Version,
    /// Resource id (`"0"` = depot chooses). `None` in the v1.3 form.
    pub rid: Option<String>,
    /// Soft or hard.
    pub reliability: Reliability,
    /// Allocation type.
    pub alloc_type: AllocType,
    /// Relative seconds; `-1` = the resource maximum.
    pub duration: i64,
    /// Maximum size in bytes.
    pub size: u64,
    /// Server-side timeout.
    pub timeout: Timeout,
}

/// MANAGE sub-commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManageOp {
    /// `IBP_PROBE` (40); `cap_type` is sent but ignored.
    Probe {
        /// Cap type number as sent (LoRS sends 0).
        cap_type: u32,
    },
    /// `IBP_INCR` (41) of the read (1) or write (2) reference count.
    Incr {
        /// 1 = read, 2 = write; anything else is rejected by the depot.
        cap_type: u32,
    },
    /// `IBP_DECR` (42).
    Decr {
        /// 1 = read, 2 = write.
        cap_type: u32,
    },
    /// `IBP_CHNG` (43): new max size (0 = unchanged), duration (relative
    /// seconds; negative = unchanged), reliability (-1 = unchanged).
    Change {
        /// Cap type number as sent.
        cap_type: u32,
        /// New maximum size; 0 keeps it.
        max_size: u64,
        /// New relative duration; negative keeps it; -1 and below.
        duration: i64,
        /// 1 soft, 2 hard, -1 unchanged.
        reliability: i64,
    },
    /// `IBP_TRUNCATE` (45): set the max size, cutting data beyond it.
    Truncate {
        /// New size.
        size: u64,
    },
}

/// STATUS sub-commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusOp {
    /// `IBP_ST_INQ` (1). `rid` is `None` in the v1.3 form.
    Inquire {
        /// Resource id (`"0"` = the whole depot).
        rid: Option<String>,
        /// STATUS password.
        password: String,
    },
    /// `IBP_ST_CHANGE` (2): parsed so the depot can refuse it cleanly; a second
    /// line with the new limits follows on the wire.
    Change {
        /// Resource id.
        rid: Option<String>,
        /// STATUS password.
        password: String,
    },
    /// `IBP_ST_RES` (3): list resource ids.
    Resources,
    /// `IBP_ST_VERSION` (5): human-readable version report.
    Version,
}

/// One parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `1` ALLOCATE.
    Allocate(Allocate),
    /// `2` STORE: append `length` bytes.
    Store {
        /// Version token.
        version: Version,
        /// Write key.
        key: KeyToken,
        /// Typekey (ignored by the depot).
        typekey: String,
        /// Bytes that follow.
        length: u64,
        /// Server-side timeout.
        timeout: Timeout,
    },
    /// `13` WRITE: write `length` bytes at `offset`.
    Write {
        /// Version token.
        version: Version,
        /// Write key.
        key: KeyToken,
        /// Typekey.
        typekey: String,
        /// Where to write.
        offset: u64,
        /// Bytes that follow.
        length: u64,
        /// Server-side timeout.
        timeout: Timeout,
    },
    /// `8` LOAD: read `length` bytes at `offset`.
    Load {
        /// Version token.
        version: Version,
        /// Read key.
        key: KeyToken,
        /// Typekey.
        typekey: String,
        /// Where to read.
        offset: u64,
        /// How much.
        length: u64,
        /// Server-side timeout.
        timeout: Timeout,
    },
    /// `5` SEND: third-party copy to another allocation (appended there).
    Send {
        /// Version token.
        version: Version,
        /// Source read key.
        key: KeyToken,
        /// Destination write capability.
        dest: Capability,
        /// Source typekey.
        typekey: String,
        /// Source offset.
        offset: u64,
        /// Bytes to copy.
        length: u64,
        /// Source-side timeout.
        timeout: Timeout,
        /// Timeout the source gives the destination depot.
        dest_timeout: Timeout,
        /// Client-side timeout (unused by depots).
        client_timeout: Timeout,
    },
    /// `9` MANAGE.
    Manage {
        /// Version token.
        version: Version,
        /// Key (manage key; any key for PROBE on our depot).
        key: KeyToken,
        /// Typekey.
        typekey: String,
        /// Sub-command.
        op: ManageOp,
        /// Server-side timeout.
        timeout: Timeout,
    },
    /// LStore's checksummed STORE (`28`), WRITE (`27`) and LOAD (`24`): `req`
    /// is the plain request; its data phase carries a digest after every
    /// `chksum.block_size` bytes ([`super::chksum`]).
    Checksummed {
        /// Algorithm and block size.
        chksum: NetChksum,
        /// The `Store`, `Write` or `Load` it wraps.
        req: Box<Request>,
    },
    /// `14` ALIAS_ALLOCATE: a new set of keys for a window of the
    /// allocation whose manage key is `key` (`offset` = `length` = 0: all of
    /// it), leased for `duration` seconds (0: as long as the allocation).
    AliasAllocate {
        /// Version token.
        version: Version,
        /// The master allocation's manage key.
        key: KeyToken,
        /// Typekey.
        typekey: String,
        /// Window start.
        offset: u64,
        /// Window length; 0 = to the end.
        length: u64,
        /// Relative seconds; 0 = the master's expiry.
        duration: u64,
        /// Server-side timeout.
        timeout: Timeout,
    },
    /// `15` ALIAS_MANAGE on the alias whose manage key is `key`.
    AliasManage {
        /// Version token.
        version: Version,
        /// The alias's manage key.
        key: KeyToken,
        /// Typekey.
        typekey: String,
        /// Sub-command.
        op: AliasOp,
        /// Server-side timeout.
        timeout: Timeout,
    },
    /// `29` ALLOCATE_CHKSUM: an ALLOCATE whose allocation keeps one digest per
    /// `block_size` bytes on disk (`None`: type 0, no digests).
    AllocateChksum {
        /// Algorithm and block size.
        chksum: Option<NetChksum>,
        /// The allocation asked for (always the v1.4 form).
        alloc: Allocate,
    },
    /// `31` GET_CHKSUM: the stored block digests (manage key).
    GetChksum {
        /// Version token.
        version: Version,
        /// Manage key.
        key: KeyToken,
        /// Typekey.
        typekey: String,
        /// Only the summary line, not the digests.
        info_only: bool,
        /// Server-side timeout.
        timeout: Timeout,
    },
    /// `32` VALIDATE_CHKSUM: re-reads every block and counts those that no
    /// longer match their digest (manage key).
    ValidateChksum {
        /// Version token.
        version: Version,
        /// Manage key.
        key: KeyToken,
        /// Typekey.
        typekey: String,
        /// Store fresh digests for the blocks that do not match.
        correct: bool,
        /// Server-side timeout.
        timeout: Timeout,
    },
    /// `4` STATUS.
    Status {
        /// Version token.
        version: Version,
        /// Sub-command.
        op: StatusOp,
        /// Server-side timeout.
        timeout: Timeout,
    },
}

/// Why a request line was rejected, and what status the depot answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Longer than [`MAX_LINE_BYTES`].
    #[error("request line longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
    /// Not ASCII text, or not `<version> <command> …`.
    #[error("malformed request: {0}")]
    BadFormat(&'static str),
    /// Version token other than 0 or 1.
    #[error("unsupported protocol version")]
    Version,
    /// A command number we do not implement.
    #[error("unknown command {0}")]
    UnknownCommand(i64),
    /// Wrong number of fields for the command.
    #[error("wrong number of fields for {0}")]
    FieldCount(&'static str),
    /// A field is out of range or of the wrong shape.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// The capability field of SEND is malformed.
    #[error("malformed destination capability")]
    Capability,
    /// A checksum type other than SHA256 (1), SHA512 (2), SHA1 (3), MD5 (4).
    #[error("unknown checksum type")]
    ChksumType,
    /// A checksum block size below 1 (or too large).
    #[error("invalid checksum block size")]
    ChksumBlockSize,
}

impl ParseError {
    /// The status code to reply with (`docs/ibp-protocol.md` §5).
    pub fn status(&self) -> StatusCode {
        match self {
            ParseError::TooLong | ParseError::BadFormat(_) | ParseError::FieldCount(_) => {
                StatusCode::BAD_FORMAT
            }
            ParseError::Version => StatusCode::PROT_VERS,
            ParseError::UnknownCommand(_) => StatusCode::UNKNOWN_FUNCTION,
            ParseError::Invalid(_) => StatusCode::INVALID_PARAMETER,
            ParseError::Capability => StatusCode::WRONG_CAP_FORMAT,
            ParseError::ChksumType => StatusCode::CHKSUM_TYPE,
            ParseError::ChksumBlockSize => StatusCode::CHKSUM_BLOCKSIZE,
        }
    }
}

/// Command numbers (§2.3).
pub mod cmd {
    /// ALLOCATE.
    pub const ALLOCATE: i64 = 1;
    /// STORE.
    pub const STORE: i64 = 2;
    /// STATUS.
    pub const STATUS: i64 = 4;
    /// SEND.
    pub const SEND: i64 = 5;
    /// LOAD.
    pub const LOAD: i64 = 8;
    /// MANAGE.
    pub const MANAGE: i64 = 9;
    /// WRITE.
    pub const WRITE: i64 = 13;
    /// LStore's alias (proxy) ALLOCATE.
    pub const ALIAS_ALLOCATE: i64 = 14;
    /// LStore's alias (proxy) MANAGE.
    pub const ALIAS_MANAGE: i64 = 15;
    /// LStore's checksummed LOAD.
    pub const LOAD_CHKSUM: i64 = 24;
    /// LStore's checksummed WRITE.
    pub const WRITE_CHKSUM: i64 = 27;
    /// LStore's checksummed STORE.
    pub const STORE_CHKSUM: i64 = 28;
    /// LStore's ALLOCATE with disk checksums.
    pub const ALLOCATE_CHKSUM: i64 = 29;
    /// LStore's GET_CHKSUM.
    pub const GET_CHKSUM: i64 = 31;
    /// LStore's VALIDATE_CHKSUM.
    pub const VALIDATE_CHKSUM: i64 = 32;
    /// MANAGE PROBE.
    pub const PROBE: i64 = 40;
    /// MANAGE INCR.
    pub const INCR: i64 = 41;
    /// MANAGE DECR.
    pub const DECR: i64 = 42;
    /// MANAGE CHNG.
    pub const CHNG: i64 = 43;
    /// MANAGE TRUNCATE.
    pub const TRUNCATE: i64 = 45;

    /// Whether command `n` is one we serve whose client sends data after the
    /// request line (STORE, WRITE and their checksummed forms).
    pub fn uploads(n: i64) -> bool {
        matches!(n, STORE | WRITE | STORE_CHKSUM | WRITE_CHKSUM)
    }

    /// Whether command `n`, one we do not serve, is known to send no data
    /// after its request line (RENAME, PHOEBUS_SEND, SPLIT/MERGE, PUSH/PULL
    /// and their checksummed forms, checksummed SEND, VEC_READ; the served
    /// 14, 15, 29, 31 and 32 are in the range too). For any other — vector WRITE, LoCI legacy and
    /// ACCRE internal commands, numbers nobody defined — we cannot tell where
    /// a data phase would end, so after the error reply the connection must
    /// close rather than read that data as commands (the reference depot
    /// closes too).
    pub fn sends_no_data(n: i64) -> bool {
        matches!(n, 14..=23 | 25 | 26 | 29..=32 | 35 | 36)
    }
}

struct Fields<'a> {
    f: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    fn int(&self, i: usize, what: &'static str) -> Result<i64, ParseError> {
        let s = self.f[i];
        if s.len() > 20 {
            return Err(ParseError::Invalid(what));
        }
        s.parse::<i64>().map_err(|_| ParseError::Invalid(what))
    }
    fn uint(&self, i: usize, what: &'static str) -> Result<u64, ParseError> {
        let s = self.f[i];
        if s.len() > 20 || s.starts_with('+') {
            return Err(ParseError::Invalid(what));
        }
        s.parse::<u64>().map_err(|_| ParseError::Invalid(what))
    }
    /// An `<offset> <length>` pair at `i`, whose end fits in 64 bits.
    fn off_len(&self, i: usize) -> Result<(u64, u64), ParseError> {
        let offset = self.uint(i, "offset")?;
        let length = self.uint(i + 1, "length")?;
        offset
            .checked_add(length)
            .ok_or(ParseError::Invalid("offset + length"))?;
        Ok((offset, length))
    }
    fn small(&self, i: usize, what: &'static str) -> Result<u32, ParseError> {
        let v = self.int(i, what)?;
        u32::try_from(v).map_err(|_| ParseError::Invalid(what))
    }
    fn timeout(&self, i: usize) -> Result<Timeout, ParseError> {
        parse_timeout(self.f[i])
    }
    fn key(&self, i: usize) -> Result<KeyToken, ParseError> {
        parse_key_token(self.f[i])
    }
    fn typekey(&self, i: usize) -> Result<String, ParseError> {
        let s = self.f[i];
        if s.len() > MAX_KEY_BYTES {
            return Err(ParseError::Invalid("typekey"));
        }
        Ok(s.to_owned())
    }
    fn rid(&self, i: usize) -> Result<String, ParseError> {
        let s = self.f[i];
        if !valid_rid(s) {
            return Err(ParseError::Invalid("resource id"));
        }
        Ok(s.to_owned())
    }
    fn password(&self, i: usize) -> Result<String, ParseError> {
        let s = self.f[i];
        if s.len() > MAX_PASSWORD_BYTES {
            return Err(ParseError::Invalid("password"));
        }
        Ok(s.to_owned())
    }
    fn expect(&self, n: usize, what: &'static str) -> Result<(), ParseError> {
        if self.f.len() == n {
            Ok(())
        } else {
            Err(ParseError::FieldCount(what))
        }
    }
}

fn parse_timeout(s: &str) -> Result<Timeout, ParseError> {
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

fn parse_key_token(s: &str) -> Result<KeyToken, ParseError> {
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

impl Request {
    /// Parses one request line. Trailing `\n`, `\r\n` and repeated spaces are
    /// tolerated as the reference depot tolerates them.
    pub fn parse(line: &[u8]) -> Result<Request, ParseError> {
        if line.len() > MAX_LINE_BYTES {
            return Err(ParseError::TooLong);
        }
        let text = std::str::from_utf8(line).map_err(|_| ParseError::BadFormat("not ASCII"))?;
        if !text.is_ascii() {
            return Err(ParseError::BadFormat("not ASCII"));
        }
        let text = text.trim_end_matches(['\n', '\r']);
        if text.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            return Err(ParseError::BadFormat("control character"));
        }
        let mut f = Vec::new();
        for tok in text.split_ascii_whitespace() {
            if f.len() == MAX_FIELDS {
                return Err(ParseError::BadFormat("too many fields"));
            }
            f.push(tok);
        }
        if f.len() < 2 {
            return Err(ParseError::BadFormat("expected <version> <command>"));
        }
        let fields = Fields { f };
        let version = match fields.int(0, "version") {
            Ok(0) => Version::V13,
            Ok(1) => Version::V14,
            Ok(_) => return Err(ParseError::Version),
            Err(_) => return Err(ParseError::BadFormat("version is not a number")),
        };
        let command = fields
            .int(1, "command")
            .map_err(|_| ParseError::BadFormat("command is not a number"))?;
        match command {
            cmd::ALLOCATE => parse_allocate(&fields, version),
            cmd::STORE | cmd::WRITE | cmd::LOAD => parse_rw(&fields, version, command),
            cmd::STORE_CHKSUM | cmd::WRITE_CHKSUM | cmd::LOAD_CHKSUM => {
                parse_checksummed(&fields, version, command)
            }
            cmd::SEND => {
                fields.expect(10, "SEND")?;
                let dest = Capability::parse(fields.f[3]).map_err(|_| ParseError::Capability)?;
                let (offset, length) = fields.off_len(5)?;
                Ok(Request::Send {
                    version,
                    key: fields.key(2)?,
                    dest,
                    typekey: fields.typekey(4)?,
                    offset,
                    length,
                    timeout: fields.timeout(7)?,
                    dest_timeout: fields.timeout(8)?,
                    client_timeout: fields.timeout(9)?,
                })
            }
            cmd::MANAGE => parse_manage(&fields, version),
            cmd::ALIAS_ALLOCATE => lstore::parse_alias_allocate(&fields, version),
            cmd::ALIAS_MANAGE => lstore::parse_alias_manage(&fields, version),
            cmd::ALLOCATE_CHKSUM => lstore::parse_allocate_chksum(&fields),
            cmd::GET_CHKSUM | cmd::VALIDATE_CHKSUM => {
                lstore::parse_chksum_query(&fields, version, command)
            }
            cmd::STATUS => parse_status(&fields, version),
            other => Err(ParseError::UnknownCommand(other)),
        }
    }

    /// The request line as a client sends it, ending in ` \n`.
    pub fn encode(&self) -> String {
        let mut s = match self {
            Request::Allocate(a) => {
                let head = match (&a.version, &a.rid) {
                    (Version::V14, Some(rid)) => format!("1 1 {rid}"),
                    (Version::V14, None) => "1 1 0".to_owned(),
                    (Version::V13, _) => "0 1".to_owned(),
                };
                format!(
                    "{head} {} {} {} {} {}",
                    a.reliability.number(),
                    a.alloc_type.number(),
                    a.duration,
                    a.size,
                    a.timeout.encode()
                )
            }
            Request::Store {
                version,
                key,
                typekey,
                length,
                timeout,
            } => format!(
                "{} 2 {} {typekey} {length} {}",
                version.number(),
                key.encode(),
                timeout.encode()
            ),
            Request::Write {
                version,
                key,
                typekey,
                offset,
                length,
                timeout,
            } => format!(
                "{} 13 {} {typekey} {offset} {length} {}",
                version.number(),
                key.encode(),
                timeout.encode()
            ),
            Request::Load {
                version,
                key,
                typekey,
                offset,
                length,
                timeout,
            } => format!(
                "{} 8 {} {typekey} {offset} {length} {}",
                version.number(),
                key.encode(),
                timeout.encode()
            ),
            Request::Send {
                version,
                key,
                dest,
                typekey,
                offset,
                length,
                timeout,
                dest_timeout,
                client_timeout,
            } => format!(
                "{} 5 {} {} {typekey} {offset} {length} {} {} {}",
                version.number(),
                key.encode(),
                dest.to_url(),
                timeout.encode(),
                dest_timeout.encode(),
                client_timeout.encode()
            ),
            Request::Manage {
                version,
                key,
                typekey,
                op,
                timeout,
            } => {
                let head = format!("{} 9 {} {typekey}", version.number(), key.encode());
                let body = match op {
                    ManageOp::Probe { cap_type } => format!("40 {cap_type} 0 0 0"),
                    ManageOp::Incr { cap_type } => format!("41 {cap_type}"),
                    ManageOp::Decr { cap_type } => format!("42 {cap_type}"),
                    ManageOp::Change {
                        cap_type,
                        max_size,
                        duration,
                        reliability,
                    } => {
                        format!("43 {cap_type} {max_size} {duration} {reliability}")
                    }
                    ManageOp::Truncate { size } => format!("45 {size}"),
                };
                format!("{head} {body} {}", timeout.encode())
            }
            Request::Checksummed { chksum, req } => {
                let plain = req.encode();
                let mut it = plain.trim_end().splitn(3, ' ');
                let (v, c, rest) = (it.next(), it.next(), it.next().unwrap_or(""));
                let command = match c {
                    Some("2") => cmd::STORE_CHKSUM,
                    Some("13") => cmd::WRITE_CHKSUM,
                    _ => cmd::LOAD_CHKSUM,
                };
                format!(
                    "{} {command} {} {} {rest}",
                    v.unwrap_or("1"),
                    chksum.kind.number(),
                    chksum.block_size
                )
            }
            Request::AliasAllocate {
                version,
                key,
                typekey,
                offset,
                length,
                duration,
                timeout,
            } => format!(
                "{} 14 {} {typekey} {offset} {length} {duration} {}",
                version.number(),
                key.encode(),
                timeout.encode()
            ),
            Request::AliasManage {
                version,
                key,
                typekey,
                op,
                timeout,
            } => format!(
                "{} 15 {} {typekey} {} {}",
                version.number(),
                key.encode(),
                lstore::encode_alias_op(op),
                timeout.encode()
            ),
            Request::AllocateChksum { chksum, alloc } => {
                lstore::encode_allocate_chksum(chksum.as_ref(), alloc)
            }
            Request::GetChksum {
                version,
                key,
                typekey,
                info_only: flag,
                timeout,
            }
            | Request::ValidateChksum {
                version,
                key,
                typekey,
                correct: flag,
                timeout,
            } => {
                let c = if matches!(self, Request::GetChksum { .. }) {
                    cmd::GET_CHKSUM
                } else {
                    cmd::VALIDATE_CHKSUM
                };
                format!(
                    "{} {c} {} {typekey} {} {}",
                    version.number(),
                    key.encode(),
                    u8::from(*flag),
                    timeout.encode()
                )
            }
            Request::Status {
                version,
                op,
                timeout,
            } => {
                let t = timeout.encode();
                match (version, op) {
                    (Version::V13, StatusOp::Inquire { password, .. }) => {
                        format!("0 4 1 {password} {t}")
                    }
                    (Version::V13, StatusOp::Change { password, .. }) => {
                        format!("0 4 2 {password} {t}")
                    }
                    (
                        _,
                        StatusOp::Inquire {
                            rid: Some(rid),
                            password,
                        },
                    ) => {
                        format!("1 4 {rid} 1 {password} {t}")
                    }
                    (
                        _,
                        StatusOp::Change {
                            rid: Some(rid),
                            password,
                        },
                    ) => {
                        format!("1 4 {rid} 2 {password} {t}")
                    }
                    // The RID-less v1.4 forms.
                    (
                        _,
                        StatusOp::Inquire {
                            rid: None,
                            password,
                        },
                    ) => format!("1 4 1 {password} {t}"),
                    (
                        _,
                        StatusOp::Change {
                            rid: None,
                            password,
                        },
                    ) => format!("1 4 2 {password} {t}"),
                    (_, StatusOp::Resources) => format!("1 4 3 {t}"),
                    (_, StatusOp::Version) => format!("1 4 5 {t}"),
                }
            }
        };
        s.push_str(" \n");
        s
    }

    /// The command's name, for logs and metrics.
    pub fn command_name(&self) -> &'static str {
        match self {
            Request::Allocate(_) => "ALLOCATE",
            Request::Store { .. } => "STORE",
            Request::Write { .. } => "WRITE",
            Request::Load { .. } => "LOAD",
            Request::Send { .. } => "SEND",
            Request::Manage { .. } => "MANAGE",
            Request::Status { .. } => "STATUS",
            Request::Checksummed { req, .. } => req.command_name(),
            Request::AliasAllocate { .. } => "ALIAS_ALLOCATE",
            Request::AliasManage { .. } => "ALIAS_MANAGE",
            Request::AllocateChksum { .. } => "ALLOCATE_CHKSUM",
            Request::GetChksum { .. } => "GET_CHKSUM",
            Request::ValidateChksum { .. } => "VALIDATE_CHKSUM",
        }
    }
}

fn parse_rw(fields: &Fields<'_>, version: Version, command: i64) -> Result<Request, ParseError> {
    if command == cmd::STORE {
        fields.expect(6, "STORE")?;
        return Ok(Request::Store {
            version,
            key: fields.key(2)?,
            typekey: fields.typekey(3)?,
            length: fields.uint(4, "length")?,
            timeout: fields.timeout(5)?,
        });
    }
    let write = command == cmd::WRITE;
    fields.expect(7, if write { "WRITE" } else { "LOAD" })?;
    let key = fields.key(2)?;
    let typekey = fields.typekey(3)?;
    let (offset, length) = fields.off_len(4)?;
    let timeout = fields.timeout(6)?;
    Ok(if write {
        Request::Write {
            version,
            key,
            typekey,
            offset,
            length,
            timeout,
        }
    } else {
        Request::Load {
            version,
            key,
            typekey,
            offset,
            length,
            timeout,
        }
    })
}

/// `<v> 28|27|24 <type> <blocksize> <the STORE/WRITE/LOAD fields…>`.
fn parse_checksummed(
    fields: &Fields<'_>,
    version: Version,
    command: i64,
) -> Result<Request, ParseError> {
    if fields.f.len() < 4 {
        return Err(ParseError::FieldCount("checksummed request"));
    }
    let kind = fields
        .int(2, "checksum type")
        .ok()
        .and_then(ChksumType::from_number)
        .ok_or(ParseError::ChksumType)?;
    let block_size = fields
        .uint(3, "checksum block size")
        .ok()
        .filter(|b| (1..=MAX_CHKSUM_BLOCK).contains(b))
        .ok_or(ParseError::ChksumBlockSize)?;
    let plain = match command {
        cmd::STORE_CHKSUM => cmd::STORE,
        cmd::WRITE_CHKSUM => cmd::WRITE,
        _ => cmd::LOAD,
    };
    let mut f = Vec::with_capacity(fields.f.len() - 2);
    f.push(fields.f[0]);
    f.push(fields.f[1]);
    f.extend_from_slice(&fields.f[4..]);
    let req = parse_rw(&Fields { f }, version, plain)?;
    Ok(Request::Checksummed {
        chksum: NetChksum { kind, block_size },
        req: Box::new(req),
    })
}

fn parse_allocate(f: &Fields<'_>, version: Version) -> Result<Request, ParseError> {
    // v1.4: 1 1 <RID> <rel> <type> <duration> <size> <timeout>
    // v1.3: 0 1 <rel> <type> <duration> <size> <timeout>
    let (rid, base) = match version {
        Version::V14 => {
            f.expect(8, "ALLOCATE")?;
            (Some(f.rid(2)?), 3)
        }
        Version::V13 => {
            f.expect(7, "ALLOCATE")?;
            (None, 2)
        }
    };
    let reliability = Reliability::from_number(f.int(base, "reliability")?)
        .ok_or(ParseError::Invalid("reliability"))?;
    let alloc_type =
        AllocType::from_number(f.int(base + 1, "type")?).ok_or(ParseError::Invalid("type"))?;
    Ok(Request::Allocate(Allocate {
        version,
        rid,
        reliability,
        alloc_type,
        duration: f.int(base + 2, "duration")?,
        size: f.uint(base + 3, "size")?,
        timeout: f.timeout(base + 4)?,
    }))
}

fn parse_manage(f: &Fields<'_>, version: Version) -> Result<Request, ParseError> {
    // <ver> 9 <key> <typekey> <sub> ... <timeout>
    if f.f.len() < 6 {
        return Err(ParseError::FieldCount("MANAGE"));
    }
    let key = f.key(2)?;
    let typekey = f.typekey(3)?;
    let sub = f.int(4, "manage sub-command")?;
    let n = f.f.len();
    let op = match sub {
        cmd::INCR | cmd::DECR => {
            f.expect(7, "MANAGE INCR/DECR")?;
            let cap_type = f.small(5, "cap type")?;
            if sub == cmd::INCR {
                ManageOp::Incr { cap_type }
            } else {
                ManageOp::Decr { cap_type }
            }
        }
        cmd::PROBE => {
            f.expect(10, "MANAGE PROBE")?;
            // The three middle numbers are ignored but must be numbers.
            for i in 6..9 {
                f.int(i, "probe field")?;
            }
            ManageOp::Probe {
                cap_type: f.small(5, "cap type")?,
            }
        }
        cmd::CHNG => {
            f.expect(10, "MANAGE CHNG")?;
            ManageOp::Change {
                cap_type: f.small(5, "cap type")?,
                max_size: f.uint(6, "size")?,
                duration: f.int(7, "duration")?,
                reliability: f.int(8, "reliability")?,
            }
        }
        cmd::TRUNCATE => {
            f.expect(7, "MANAGE TRUNCATE")?;
            ManageOp::Truncate {
                size: f.uint(5, "size")?,
            }
        }
        _ => return Err(ParseError::Invalid("manage sub-command")),
    };
    Ok(Request::Manage {
        version,
        key,
        typekey,
        op,
        timeout: f.timeout(n - 1)?,
    })
}

fn parse_status(f: &Fields<'_>, version: Version) -> Result<Request, ParseError> {
    let n = f.f.len();
    let timeout = f.timeout(n - 1)?;
    let op = match (version, n) {
        // 0 4 <sub> <password> <timeout>
        (Version::V13, 5) => match f.int(2, "status sub-command")? {
            1 => StatusOp::Inquire {
                rid: None,
                password: f.password(3)?,
            },
            2 => StatusOp::Change {
                rid: None,
                password: f.password(3)?,
            },
            _ => return Err(ParseError::Invalid("status sub-command")),
        },
        // 1 4 <RID> <sub> <password> <timeout>
        (Version::V14, 6) => {
            let rid = Some(f.rid(2)?);
            let password = f.password(4)?;
            match f.int(3, "status sub-command")? {
                1 => StatusOp::Inquire { rid, password },
                2 => StatusOp::Change { rid, password },
                3 => StatusOp::Resources,
                5 => StatusOp::Version,
                _ => return Err(ParseError::Invalid("status sub-command")),
            }
        }
        // 1 4 <sub> <timeout>: the reference depot's RID-less forms.
        (Version::V14, 4) => match f.int(2, "status sub-command")? {
            3 => StatusOp::Resources,
            5 => StatusOp::Version,
            _ => return Err(ParseError::Invalid("status sub-command")),
        },
        // 1 4 <sub> <password> <timeout>
        (Version::V14, 5) => match f.int(2, "status sub-command")? {
            1 => StatusOp::Inquire {
                rid: None,
                password: f.password(3)?,
            },
            3 => StatusOp::Resources,
            5 => StatusOp::Version,
            _ => return Err(ParseError::Invalid("status sub-command")),
        },
        _ => return Err(ParseError::FieldCount("STATUS")),
    };
    Ok(Request::Status {
        version,
        op,
        timeout,
    })
}

mod lstore;
pub use lstore::AliasOp;

#[cfg(test)]
mod tests;
