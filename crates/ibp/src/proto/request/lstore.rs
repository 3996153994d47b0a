//! LStore's IBP 1.5 extensions to the request set (`docs/ibp-protocol.md`
//! §2.6–2.7): alias ("proxy") allocations and allocations that keep
//! per-block checksums on disk. Field orders are those the ACCRE depot
//! (`ibp_server`) parses and LStore's client (`src/ibp/op_cmd.c`) sends.

use super::command::sub;
use super::fields::{Fields, KeyToken, Keyed, Lease, Line, Version};
use super::manage::Allocate;
use super::{Command, ParseError};
use crate::proto::chksum::{ChksumType, NetChksum};
use crate::proto::limits::MAX_CHKSUM_BLOCK;

/// `14` ALIAS_ALLOCATE: a new set of keys for a window of the allocation
/// whose manage key is `at.key` (`offset` = `length` = 0: all of it).
/// `<v> 14 <mkey> <typekey> <offset> <len> <duration> <timeout>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasAllocate {
    /// The master allocation's manage key and the common fields.
    pub at: Keyed,
    /// Window start.
    pub offset: u64,
    /// Window length; 0 = to the end.
    pub length: u64,
    /// The alias's lease (`0` on the wire is [`Lease::Longest`]: the
    /// master's expiry).
    pub lease: Lease,
}

impl AliasAllocate {
    pub(super) fn parse(f: &Fields<'_>, version: Version) -> Result<AliasAllocate, ParseError> {
        f.expect(8, "ALIAS_ALLOCATE")?;
        let (offset, length) = f.off_len(4)?;
        Ok(AliasAllocate {
            at: Keyed::parse(f, version)?,
            offset,
            length,
            lease: match f.uint(6, "duration")? {
                0 => Lease::Longest,
                d => Lease::Secs(d),
            },
        })
    }

    /// The request line.
    pub fn encode(&self) -> String {
        let mut l = self.at.line(Command::AliasAllocate);
        l.field(self.offset)
            .field(self.length)
            .field(match self.lease {
                Lease::Longest => 0,
                Lease::Secs(d) => d,
            });
        l.end(self.at.timeout)
    }
}

/// `15` ALIAS_MANAGE on the alias whose manage key is `at.key`.
/// `<v> 15 <key> <typekey> <sub> … <timeout>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasManage {
    /// The alias's manage key and the common fields.
    pub at: Keyed,
    /// Sub-command.
    pub op: AliasOp,
}

/// ALIAS_MANAGE (`15`) sub-commands. An alias's own manage key names it; the
/// ones that change it must also show the manage key of the allocation it is
/// an alias of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AliasOp {
    /// `40 <captype>`: the alias's counts, window and lease.
    Probe {
        /// Cap type as sent (ignored).
        cap_type: u32,
    },
    /// `41 <captype> <mkey> <mtypekey>`.
    Incr {
        /// 1 = read, 2 = write.
        cap_type: u32,
        /// The master allocation's manage key.
        master: KeyToken,
        /// Its typekey (ignored).
        master_typekey: String,
    },
    /// `42 <captype> <mkey> <mtypekey>`.
    Decr {
        /// 1 = read, 2 = write.
        cap_type: u32,
        /// The master allocation's manage key.
        master: KeyToken,
        /// Its typekey (ignored).
        master_typekey: String,
    },
    /// `43 [<captype>] <offset> <len> <duration> <mkey> <mtypekey>`: a new
    /// window (`len` 0 keeps it) and lease (relative seconds; 0 = the
    /// master's, negative = unchanged). The ACCRE depot reads a cap type
    /// before the offset; LStore's client does not send one. Both are taken.
    Change {
        /// The cap type, when the line carries one.
        cap_type: Option<u32>,
        /// New window start.
        offset: u64,
        /// New window length; 0 keeps the window.
        length: u64,
        /// The new lease (`0` on the wire is [`Lease::Longest`], the
        /// master's expiry); `None` (negative on the wire) keeps it.
        lease: Option<Lease>,
        /// The master allocation's manage key.
        master: KeyToken,
        /// Its typekey (ignored).
        master_typekey: String,
    },
}

impl AliasManage {
    pub(super) fn parse(f: &Fields<'_>, version: Version) -> Result<AliasManage, ParseError> {
        if f.len() < 7 {
            return Err(ParseError::FieldCount("ALIAS_MANAGE"));
        }
        let at = Keyed::parse(f, version)?;
        let op = match f.int(4, "alias manage sub-command")? {
            sub::PROBE => {
                f.expect(7, "ALIAS_MANAGE PROBE")?;
                AliasOp::Probe {
                    cap_type: f.small(5, "cap type")?,
                }
            }
            s @ (sub::INCR | sub::DECR) => {
                f.expect(9, "ALIAS_MANAGE INCR/DECR")?;
                let cap_type = f.small(5, "cap type")?;
                let master = f.key(6)?;
                let master_typekey = f.typekey(7)?;
                if s == sub::INCR {
                    AliasOp::Incr {
                        cap_type,
                        master,
                        master_typekey,
                    }
                } else {
                    AliasOp::Decr {
                        cap_type,
                        master,
                        master_typekey,
                    }
                }
            }
            sub::CHNG => {
                let (cap_type, base) = match f.len() {
                    11 => (None, 5),
                    12 => (Some(f.small(5, "cap type")?), 6),
                    _ => return Err(ParseError::FieldCount("ALIAS_MANAGE CHNG")),
                };
                let (offset, length) = f.off_len(base)?;
                AliasOp::Change {
                    cap_type,
                    offset,
                    length,
                    lease: match f.int(base + 2, "duration")? {
                        d if d < 0 => None,
                        0 => Some(Lease::Longest),
                        d => Some(Lease::Secs(d.unsigned_abs())),
                    },
                    master: f.key(base + 3)?,
                    master_typekey: f.typekey(base + 4)?,
                }
            }
            _ => return Err(ParseError::Invalid("alias manage sub-command")),
        };
        Ok(AliasManage { at, op })
    }

    /// The request line.
    pub fn encode(&self) -> String {
        let mut l = self.at.line(Command::AliasManage);
        match &self.op {
            AliasOp::Probe { cap_type } => l.field(sub::PROBE).field(cap_type),
            AliasOp::Incr {
                cap_type,
                master,
                master_typekey,
            } => l
                .field(sub::INCR)
                .field(cap_type)
                .field(master.encode())
                .field(master_typekey),
            AliasOp::Decr {
                cap_type,
                master,
                master_typekey,
            } => l
                .field(sub::DECR)
                .field(cap_type)
                .field(master.encode())
                .field(master_typekey),
            AliasOp::Change {
                cap_type,
                offset,
                length,
                lease,
                master,
                master_typekey,
            } => {
                l.field(sub::CHNG);
                if let Some(c) = cap_type {
                    l.field(c);
                }
                l.field(offset).field(length);
                match lease {
                    None => l.field(-1),
                    Some(Lease::Longest) => l.field(0),
                    Some(Lease::Secs(d)) => l.field(i64::try_from(*d).unwrap_or(i64::MAX)),
                };
                l.field(master.encode()).field(master_typekey)
            }
        };
        l.end(self.at.timeout)
    }
}

/// `29` ALLOCATE_CHKSUM: an ALLOCATE whose byte array keeps one digest per
/// `block_size` bytes on disk.
/// `<v> 29 <cstype> <blocksize> <RID> <rel> <type> <duration> <size> <timeout>`.
/// Type 0 (`CHKSUM_NONE`) asks for none, and then any block size up to
/// 2 GiB is taken, as the ACCRE depot takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateChksum {
    /// Algorithm and block size (`None`: type 0, no digests).
    pub chksum: Option<NetChksum>,
    /// The allocation asked for (always the v1.4 form).
    pub alloc: Allocate,
}

impl AllocateChksum {
    pub(super) fn parse(f: &Fields<'_>) -> Result<AllocateChksum, ParseError> {
        f.expect(10, "ALLOCATE_CHKSUM")?;
        let kind = match f.int(2, "checksum type") {
            Ok(0) => None,
            Ok(n) => Some(ChksumType::from_number(n).ok_or(ParseError::ChksumType)?),
            Err(_) => return Err(ParseError::ChksumType),
        };
        let bs = f
            .int(3, "checksum block size")
            .map_err(|_| ParseError::ChksumBlockSize)?;
        if bs > MAX_CHKSUM_BLOCK as i64 || (kind.is_some() && bs < 1) {
            return Err(ParseError::ChksumBlockSize);
        }
        let mut plain = Vec::with_capacity(8);
        plain.extend_from_slice(&f.f[..2]);
        plain.extend_from_slice(&f.f[4..]);
        // The RID field is there whatever the version token says.
        let alloc = Allocate::parse(&Fields { f: plain }, Version::V14)?;
        Ok(AllocateChksum {
            chksum: kind.map(|kind| NetChksum {
                kind,
                block_size: bs.unsigned_abs(),
            }),
            alloc,
        })
    }

    /// The request line (always v1.4).
    pub fn encode(&self) -> String {
        let (kind, bs) = self
            .chksum
            .as_ref()
            .map_or((0, 0), |c| (c.kind.number(), c.block_size));
        let mut l = Line::new(Version::V14, Command::AllocateChksum.number());
        l.field(kind).field(bs);
        self.alloc.fields(&mut l, true);
        l.end(self.alloc.timeout)
    }
}

/// `31` GET_CHKSUM (the flag: only the summary line, not the digests) and
/// `32` VALIDATE_CHKSUM (the flag: store fresh digests for the blocks that
/// fail theirs), both with the manage key.
/// `<v> 31|32 <key> <typekey> <flag> <timeout>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChksumQuery {
    /// Manage key and the common fields.
    pub at: Keyed,
    /// GET_CHKSUM: info only; VALIDATE_CHKSUM: correct.
    pub flag: bool,
}

impl ChksumQuery {
    pub(super) fn parse(f: &Fields<'_>, version: Version) -> Result<ChksumQuery, ParseError> {
        f.expect(6, "GET/VALIDATE_CHKSUM")?;
        let key = f.key(2)?;
        let typekey = f.typekey(3)?;
        // The reference reads the flag as an int and refuses a negative one.
        let flag = f.small(4, "flag")? != 0;
        Ok(ChksumQuery {
            at: Keyed {
                version,
                key,
                typekey,
                timeout: f.timeout(5)?,
            },
            flag,
        })
    }

    /// The request line for `command` (GET_CHKSUM or VALIDATE_CHKSUM).
    pub fn encode(&self, command: Command) -> String {
        let mut l = self.at.line(command);
        l.field(u8::from(self.flag));
        l.end(self.at.timeout)
    }
}
