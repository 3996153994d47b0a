//! LStore's IBP 1.5 extensions to the request set (`docs/ibp-protocol.md`
//! §2.6–2.7): alias ("proxy") allocations and allocations that keep
//! per-block checksums on disk. Field orders are those the ACCRE depot
//! (`ibp_server`) parses and LStore's client (`src/ibp/op_cmd.c`) sends.

use super::{Allocate, Fields, KeyToken, ParseError, Request, Version, cmd};
use crate::proto::chksum::{ChksumType, NetChksum};
use crate::proto::limits::MAX_CHKSUM_BLOCK;

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
        /// Relative seconds; 0 = the master's expiry; negative = unchanged.
        duration: i64,
        /// The master allocation's manage key.
        master: KeyToken,
        /// Its typekey (ignored).
        master_typekey: String,
    },
}

/// `<v> 14 <mkey> <typekey> <offset> <len> <duration> <timeout>`.
pub(super) fn parse_alias_allocate(
    f: &Fields<'_>,
    version: Version,
) -> Result<Request, ParseError> {
    f.expect(8, "ALIAS_ALLOCATE")?;
    let (offset, length) = f.off_len(4)?;
    Ok(Request::AliasAllocate {
        version,
        key: f.key(2)?,
        typekey: f.typekey(3)?,
        offset,
        length,
        duration: f.uint(6, "duration")?,
        timeout: f.timeout(7)?,
    })
}

/// `<v> 15 <key> <typekey> <sub> …`.
pub(super) fn parse_alias_manage(f: &Fields<'_>, version: Version) -> Result<Request, ParseError> {
    if f.f.len() < 7 {
        return Err(ParseError::FieldCount("ALIAS_MANAGE"));
    }
    let key = f.key(2)?;
    let typekey = f.typekey(3)?;
    let n = f.f.len();
    let op = match f.int(4, "alias manage sub-command")? {
        cmd::PROBE => {
            f.expect(7, "ALIAS_MANAGE PROBE")?;
            AliasOp::Probe {
                cap_type: f.small(5, "cap type")?,
            }
        }
        sub @ (cmd::INCR | cmd::DECR) => {
            f.expect(9, "ALIAS_MANAGE INCR/DECR")?;
            let cap_type = f.small(5, "cap type")?;
            let master = f.key(6)?;
            let master_typekey = f.typekey(7)?;
            if sub == cmd::INCR {
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
        cmd::CHNG => {
            let (cap_type, base) = match n {
                11 => (None, 5),
                12 => (Some(f.small(5, "cap type")?), 6),
                _ => return Err(ParseError::FieldCount("ALIAS_MANAGE CHNG")),
            };
            let (offset, length) = f.off_len(base)?;
            AliasOp::Change {
                cap_type,
                offset,
                length,
                duration: f.int(base + 2, "duration")?,
                master: f.key(base + 3)?,
                master_typekey: f.typekey(base + 4)?,
            }
        }
        _ => return Err(ParseError::Invalid("alias manage sub-command")),
    };
    Ok(Request::AliasManage {
        version,
        key,
        typekey,
        op,
        timeout: f.timeout(n - 1)?,
    })
}

/// `<v> 29 <cstype> <blocksize> <RID> <rel> <type> <duration> <size> <timeout>`:
/// an ALLOCATE whose byte array keeps a digest per block on disk. Type 0
/// (`CHKSUM_NONE`) asks for none, and then any block size up to 2 GiB is
/// taken, as the ACCRE depot takes it.
pub(super) fn parse_allocate_chksum(f: &Fields<'_>) -> Result<Request, ParseError> {
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
    plain.push(f.f[0]);
    plain.push(f.f[1]);
    plain.extend_from_slice(&f.f[4..]);
    // The RID field is there whatever the version token says.
    let Request::Allocate(alloc) = super::parse_allocate(&Fields { f: plain }, Version::V14)?
    else {
        return Err(ParseError::BadFormat("ALLOCATE_CHKSUM"));
    };
    Ok(Request::AllocateChksum {
        chksum: kind.map(|kind| NetChksum {
            kind,
            block_size: bs.unsigned_abs(),
        }),
        alloc,
    })
}

/// `<v> 31|32 <key> <typekey> <flag> <timeout>`: GET_CHKSUM (flag = info
/// only) and VALIDATE_CHKSUM (flag = correct errors).
pub(super) fn parse_chksum_query(
    f: &Fields<'_>,
    version: Version,
    command: i64,
) -> Result<Request, ParseError> {
    f.expect(6, "GET/VALIDATE_CHKSUM")?;
    let key = f.key(2)?;
    let typekey = f.typekey(3)?;
    // The reference reads the flag as an int and refuses a negative one.
    let flag = f.small(4, "flag")? != 0;
    let timeout = f.timeout(5)?;
    Ok(if command == cmd::GET_CHKSUM {
        Request::GetChksum {
            version,
            key,
            typekey,
            info_only: flag,
            timeout,
        }
    } else {
        Request::ValidateChksum {
            version,
            key,
            typekey,
            correct: flag,
            timeout,
        }
    })
}

pub(super) fn encode_alias_op(op: &AliasOp) -> String {
    match op {
        AliasOp::Probe { cap_type } => format!("40 {cap_type}"),
        AliasOp::Incr {
            cap_type,
            master,
            master_typekey,
        } => format!("41 {cap_type} {} {master_typekey}", master.encode()),
        AliasOp::Decr {
            cap_type,
            master,
            master_typekey,
        } => format!("42 {cap_type} {} {master_typekey}", master.encode()),
        AliasOp::Change {
            cap_type,
            offset,
            length,
            duration,
            master,
            master_typekey,
        } => {
            let cap = cap_type.map(|c| format!("{c} ")).unwrap_or_default();
            format!(
                "43 {cap}{offset} {length} {duration} {} {master_typekey}",
                master.encode()
            )
        }
    }
}

pub(super) fn encode_allocate_chksum(chksum: Option<&NetChksum>, alloc: &Allocate) -> String {
    let (kind, bs) = chksum.map_or((0, 0), |c| (c.kind.number(), c.block_size));
    let plain = Request::Allocate(Allocate {
        version: Version::V14,
        ..alloc.clone()
    })
    .encode();
    // "1 1 <rest>" → "1 29 <kind> <bs> <rest>"
    let rest = plain.trim_end().splitn(3, ' ').nth(2).unwrap_or("");
    format!("1 {} {kind} {bs} {rest}", cmd::ALLOCATE_CHKSUM)
}
