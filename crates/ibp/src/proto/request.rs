//! IBP request lines: a total parser and an encoder (`docs/ibp-protocol.md` §2).
//!
//! Each command is a struct with its parse and its encode side by side
//! ([`data`] moves bytes, [`manage`] makes and changes allocations,
//! [`status`] asks about the depot, [`lstore`] holds LStore's extensions);
//! [`Request`] is one of them. `Request::parse` takes one line (with or
//! without its `\n`) and either returns a fully range-checked request or a
//! [`ParseError`] that maps to the status code the reference depot answers
//! with. It never panics and never allocates more than the line's length.
//! Wire sentinels (`-1` for "unchanged", `0` for "the longest lease") stop
//! at the parser: past it they are `Option`s and [`Lease`]s.

mod command;
pub mod data;
mod fields;
pub mod lstore;
pub mod manage;
pub mod status;

pub use command::{Command, sends_no_data};
pub use data::{Checksummed, Load, Plain, Send, Store, Write};
use fields::Fields;
pub use fields::{AllocType, KeyToken, Keyed, Lease, Reliability, Timeout, Version};
pub use lstore::{AliasAllocate, AliasManage, AliasOp, AllocateChksum, ChksumQuery};
pub use manage::{Allocate, Manage, ManageOp};
pub use status::{Status, StatusOp};

use super::limits::{MAX_FIELDS, MAX_LINE_BYTES};
use super::status::StatusCode;

/// One parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `1` ALLOCATE.
    Allocate(Allocate),
    /// `2` STORE.
    Store(Store),
    /// `13` WRITE.
    Write(Write),
    /// `8` LOAD.
    Load(Load),
    /// `5` SEND.
    Send(Send),
    /// `9` MANAGE.
    Manage(Manage),
    /// `28`, `27`, `24`: LStore's checksummed STORE, WRITE and LOAD.
    Checksummed(Checksummed),
    /// `14` ALIAS_ALLOCATE.
    AliasAllocate(AliasAllocate),
    /// `15` ALIAS_MANAGE.
    AliasManage(AliasManage),
    /// `29` ALLOCATE_CHKSUM.
    AllocateChksum(AllocateChksum),
    /// `31` GET_CHKSUM.
    GetChksum(ChksumQuery),
    /// `32` VALIDATE_CHKSUM.
    ValidateChksum(ChksumQuery),
    /// `4` STATUS.
    Status(Status),
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
        let Some(command) = Command::from_number(command) else {
            return Err(ParseError::UnknownCommand(command));
        };
        let v = version;
        let f = &fields;
        Ok(match command {
            Command::Allocate => Request::Allocate(Allocate::parse(f, v)?),
            Command::Store | Command::Write | Command::Load => match Plain::parse(f, v, command)? {
                Plain::Store(r) => Request::Store(r),
                Plain::Write(r) => Request::Write(r),
                Plain::Load(r) => Request::Load(r),
            },
            Command::StoreChksum | Command::WriteChksum | Command::LoadChksum => {
                Request::Checksummed(Checksummed::parse(f, v, command)?)
            }
            Command::Send => Request::Send(Send::parse(f, v)?),
            Command::Manage => Request::Manage(Manage::parse(f, v)?),
            Command::AliasAllocate => Request::AliasAllocate(AliasAllocate::parse(f, v)?),
            Command::AliasManage => Request::AliasManage(AliasManage::parse(f, v)?),
            Command::AllocateChksum => Request::AllocateChksum(AllocateChksum::parse(f)?),
            Command::GetChksum => Request::GetChksum(ChksumQuery::parse(f, v)?),
            Command::ValidateChksum => Request::ValidateChksum(ChksumQuery::parse(f, v)?),
            Command::Status => Request::Status(Status::parse(f, v)?),
        })
    }

    /// The request line as a client sends it, ending in ` \n`.
    pub fn encode(&self) -> String {
        match self {
            Request::Allocate(r) => r.encode(),
            Request::Store(r) => r.encode(),
            Request::Write(r) => r.encode(),
            Request::Load(r) => r.encode(),
            Request::Send(r) => r.encode(),
            Request::Manage(r) => r.encode(),
            Request::Checksummed(r) => r.encode(),
            Request::AliasAllocate(r) => r.encode(),
            Request::AliasManage(r) => r.encode(),
            Request::AllocateChksum(r) => r.encode(),
            Request::GetChksum(r) => r.encode(Command::GetChksum),
            Request::ValidateChksum(r) => r.encode(Command::ValidateChksum),
            Request::Status(r) => r.encode(),
        }
    }

    /// The command, for logs and metrics. A checksummed STORE, WRITE or
    /// LOAD counts as the plain command: it does the same work.
    pub fn command(&self) -> Command {
        match self {
            Request::Allocate(_) => Command::Allocate,
            Request::Store(_) => Command::Store,
            Request::Write(_) => Command::Write,
            Request::Load(_) => Command::Load,
            Request::Send(_) => Command::Send,
            Request::Manage(_) => Command::Manage,
            Request::Checksummed(c) => c.req.command(),
            Request::AliasAllocate(_) => Command::AliasAllocate,
            Request::AliasManage(_) => Command::AliasManage,
            Request::AllocateChksum(_) => Command::AllocateChksum,
            Request::GetChksum(_) => Command::GetChksum,
            Request::ValidateChksum(_) => Command::ValidateChksum,
            Request::Status(_) => Command::Status,
        }
    }
}

#[cfg(test)]
mod tests;
