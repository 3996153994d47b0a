//! The commands that move bytes: STORE, WRITE, LOAD, SEND, and LStore's
//! checksummed STORE/WRITE/LOAD (§2.4, §2.7).

use super::fields::{Fields, Keyed, Line, Timeout, Version};
use super::{Command, ParseError};
use crate::caps::Capability;
use crate::proto::chksum::{ChksumType, NetChksum};
use crate::proto::limits::MAX_CHKSUM_BLOCK;

/// `2` STORE: append `length` bytes, which follow the line.
/// `<v> 2 <key> <typekey> <length> <timeout>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    /// Write key and the common fields.
    pub at: Keyed,
    /// Bytes that follow.
    pub length: u64,
}

impl Store {
    fn parse(f: &Fields<'_>, version: Version) -> Result<Store, ParseError> {
        f.expect(6, "STORE")?;
        Ok(Store {
            at: Keyed::parse(f, version)?,
            length: f.uint(4, "length")?,
        })
    }

    fn encode_as(&self, command: Command, chksum: Option<&NetChksum>) -> String {
        let mut l = head(&self.at, command, chksum);
        l.field(self.length);
        l.end(self.at.timeout)
    }

    /// The request line.
    pub fn encode(&self) -> String {
        self.encode_as(Command::Store, None)
    }
}

/// `13` WRITE: write `length` bytes, which follow the line, at `offset`.
/// `<v> 13 <key> <typekey> <offset> <length> <timeout>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Write key and the common fields.
    pub at: Keyed,
    /// Where to write.
    pub offset: u64,
    /// Bytes that follow.
    pub length: u64,
}

/// `8` LOAD: read `length` bytes at `offset`.
/// `<v> 8 <key> <typekey> <offset> <length> <timeout>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Load {
    /// Read key and the common fields.
    pub at: Keyed,
    /// Where to read.
    pub offset: u64,
    /// How much.
    pub length: u64,
}

/// WRITE and LOAD have the same fields.
macro_rules! ranged {
    ($t:ident, $command:expr, $name:literal) => {
        impl $t {
            fn parse(f: &Fields<'_>, version: Version) -> Result<$t, ParseError> {
                f.expect(7, $name)?;
                let at = Keyed::parse(f, version)?;
                let (offset, length) = f.off_len(4)?;
                Ok($t { at, offset, length })
            }

            fn encode_as(&self, command: Command, chksum: Option<&NetChksum>) -> String {
                let mut l = head(&self.at, command, chksum);
                l.field(self.offset).field(self.length);
                l.end(self.at.timeout)
            }

            /// The request line.
            pub fn encode(&self) -> String {
                self.encode_as($command, None)
            }
        }
    };
}
ranged!(Write, Command::Write, "WRITE");
ranged!(Load, Command::Load, "LOAD");

/// The line up to the command's own fields; the checksummed forms put the
/// algorithm and block size before the key.
fn head(at: &Keyed, command: Command, chksum: Option<&NetChksum>) -> Line {
    let mut l = Line::new(at.version, command.number());
    if let Some(c) = chksum {
        l.field(c.kind.number()).field(c.block_size);
    }
    l.field(at.key.encode()).field(&at.typekey);
    l
}

/// `5` SEND: copy `length` bytes at `offset` to the end of the allocation
/// `dest` names, depot to depot.
/// `<v> 5 <key> <dest cap> <typekey> <offset> <length> <timeout> <dest timeout> <client timeout>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Send {
    /// Source read key and the common fields (its timeout is the source's).
    pub at: Keyed,
    /// Destination write capability.
    pub dest: Capability,
    /// Source offset.
    pub offset: u64,
    /// Bytes to copy.
    pub length: u64,
    /// Timeout the source gives the destination depot.
    pub dest_timeout: Timeout,
    /// Client-side timeout (unused by depots).
    pub client_timeout: Timeout,
}

impl Send {
    pub(super) fn parse(f: &Fields<'_>, version: Version) -> Result<Send, ParseError> {
        f.expect(10, "SEND")?;
        let dest = Capability::parse(f.f[3]).map_err(|_| ParseError::Capability)?;
        let (offset, length) = f.off_len(5)?;
        Ok(Send {
            at: Keyed {
                version,
                key: f.key(2)?,
                typekey: f.typekey(4)?,
                timeout: f.timeout(7)?,
            },
            dest,
            offset,
            length,
            dest_timeout: f.timeout(8)?,
            client_timeout: f.timeout(9)?,
        })
    }

    /// The request line.
    pub fn encode(&self) -> String {
        let mut l = Line::new(self.at.version, Command::Send.number());
        l.field(self.at.key.encode())
            .field(self.dest.to_url())
            .field(&self.at.typekey)
            .field(self.offset)
            .field(self.length)
            .field(self.at.timeout.encode())
            .field(self.dest_timeout.encode());
        l.end(self.client_timeout)
    }
}

/// A STORE, WRITE or LOAD, the requests LStore checksums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plain {
    /// STORE.
    Store(Store),
    /// WRITE.
    Write(Write),
    /// LOAD.
    Load(Load),
}

impl Plain {
    /// The common fields.
    pub fn at(&self) -> &Keyed {
        match self {
            Plain::Store(r) => &r.at,
            Plain::Write(r) => &r.at,
            Plain::Load(r) => &r.at,
        }
    }

    /// The plain command.
    pub fn command(&self) -> Command {
        match self {
            Plain::Store(_) => Command::Store,
            Plain::Write(_) => Command::Write,
            Plain::Load(_) => Command::Load,
        }
    }

    pub(super) fn parse(
        f: &Fields<'_>,
        version: Version,
        command: Command,
    ) -> Result<Plain, ParseError> {
        Ok(match command {
            Command::Store => Plain::Store(Store::parse(f, version)?),
            Command::Write => Plain::Write(Write::parse(f, version)?),
            _ => Plain::Load(Load::parse(f, version)?),
        })
    }
}

/// LStore's checksummed STORE (`28`), WRITE (`27`) and LOAD (`24`): the
/// plain request whose data phase carries a digest after every
/// `chksum.block_size` bytes ([`crate::proto::chksum`]).
/// `<v> 28|27|24 <type> <block size> <the STORE/WRITE/LOAD fields…>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksummed {
    /// Algorithm and block size.
    pub chksum: NetChksum,
    /// The request it wraps.
    pub req: Plain,
}

impl Checksummed {
    /// The checksummed command.
    pub fn command(&self) -> Command {
        match self.req {
            Plain::Store(_) => Command::StoreChksum,
            Plain::Write(_) => Command::WriteChksum,
            Plain::Load(_) => Command::LoadChksum,
        }
    }

    pub(super) fn parse(
        f: &Fields<'_>,
        version: Version,
        command: Command,
    ) -> Result<Checksummed, ParseError> {
        if f.len() < 4 {
            return Err(ParseError::FieldCount("checksummed request"));
        }
        let kind = f
            .int(2, "checksum type")
            .ok()
            .and_then(ChksumType::from_number)
            .ok_or(ParseError::ChksumType)?;
        let block_size = f
            .uint(3, "checksum block size")
            .ok()
            .filter(|b| (1..=MAX_CHKSUM_BLOCK).contains(b))
            .ok_or(ParseError::ChksumBlockSize)?;
        let plain = match command {
            Command::StoreChksum => Command::Store,
            Command::WriteChksum => Command::Write,
            _ => Command::Load,
        };
        let mut rest = Vec::with_capacity(f.len() - 2);
        rest.extend_from_slice(&f.f[..2]);
        rest.extend_from_slice(&f.f[4..]);
        Ok(Checksummed {
            chksum: NetChksum { kind, block_size },
            req: Plain::parse(&Fields { f: rest }, version, plain)?,
        })
    }

    /// The request line.
    pub fn encode(&self) -> String {
        let (command, c) = (self.command(), Some(&self.chksum));
        match &self.req {
            Plain::Store(r) => r.encode_as(command, c),
            Plain::Write(r) => r.encode_as(command, c),
            Plain::Load(r) => r.encode_as(command, c),
        }
    }
}
