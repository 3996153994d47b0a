//! ALLOCATE and MANAGE (§2.2, §2.5): making an allocation, and everything
//! done to one but moving its bytes.

use super::command::sub;
use super::fields::{AllocType, Fields, Keyed, Lease, Line, Reliability, Timeout, Version};
use super::{Command, ParseError};

/// `1` ALLOCATE. v1.4: `1 1 <RID> <rel> <type> <duration> <size> <timeout>`;
/// v1.3: `0 1 <rel> <type> <duration> <size> <timeout>`.
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
    /// The lease: `-1` on the wire is [`Lease::Longest`]; `0` and other
    /// negative numbers are a zero lease, which a depot refuses.
    pub lease: Lease,
    /// Maximum size in bytes.
    pub size: u64,
    /// Server-side timeout.
    pub timeout: Timeout,
}

impl Allocate {
    pub(super) fn parse(f: &Fields<'_>, version: Version) -> Result<Allocate, ParseError> {
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
        let lease = match f.int(base + 2, "duration")? {
            -1 => Lease::Longest,
            d => Lease::Secs(u64::try_from(d).unwrap_or(0)),
        };
        Ok(Allocate {
            version,
            rid,
            reliability,
            alloc_type,
            lease,
            size: f.uint(base + 3, "size")?,
            timeout: f.timeout(base + 4)?,
        })
    }

    /// Writes the fields from the RID (when `rid`) to the size.
    pub(super) fn fields(&self, l: &mut Line, rid: bool) {
        if rid {
            l.field(self.rid.as_deref().unwrap_or("0"));
        }
        l.field(self.reliability.number())
            .field(self.alloc_type.number());
        match self.lease {
            Lease::Longest => l.field(-1),
            Lease::Secs(s) => l.field(s),
        };
        l.field(self.size);
    }

    /// The request line.
    pub fn encode(&self) -> String {
        let mut l = Line::new(self.version, Command::Allocate.number());
        self.fields(&mut l, self.version == Version::V14);
        l.end(self.timeout)
    }
}

/// `9` MANAGE: `<v> 9 <key> <typekey> <sub> … <timeout>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manage {
    /// Key (the manage key; any key for PROBE on our depot) and the common
    /// fields.
    pub at: Keyed,
    /// Sub-command.
    pub op: ManageOp,
}

/// MANAGE sub-commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManageOp {
    /// `IBP_PROBE` (40): `40 <captype> 0 0 0`; the cap type is sent but
    /// ignored.
    Probe {
        /// Cap type number as sent (LoRS sends 0).
        cap_type: u32,
    },
    /// `IBP_INCR` (41) of the read (1) or write (2) reference count.
    Incr {
        /// 1 = read, 2 = write; anything else is refused by the depot.
        cap_type: u32,
    },
    /// `IBP_DECR` (42).
    Decr {
        /// 1 = read, 2 = write.
        cap_type: u32,
    },
    /// `IBP_CHNG` (43): `43 <captype> <max size> <duration> <reliability>`,
    /// a negative duration and reliability `-1` meaning "unchanged".
    Change {
        /// Cap type number as sent.
        cap_type: u32,
        /// New maximum size. Our depot keeps the size on 0 unless strict;
        /// the reference depot takes 0 as a size.
        max_size: u64,
        /// New lease in seconds from now; `None` keeps it.
        duration: Option<u64>,
        /// New reliability; `None` keeps it.
        reliability: Option<Reliability>,
    },
    /// `IBP_TRUNCATE` (45): set the max size, cutting data beyond it.
    Truncate {
        /// New size.
        size: u64,
    },
}

impl Manage {
    pub(super) fn parse(f: &Fields<'_>, version: Version) -> Result<Manage, ParseError> {
        if f.len() < 6 {
            return Err(ParseError::FieldCount("MANAGE"));
        }
        let at = Keyed::parse(f, version)?;
        let sub = f.int(4, "manage sub-command")?;
        let op = match sub {
            sub::INCR | sub::DECR => {
                f.expect(7, "MANAGE INCR/DECR")?;
                let cap_type = f.small(5, "cap type")?;
                if sub == sub::INCR {
                    ManageOp::Incr { cap_type }
                } else {
                    ManageOp::Decr { cap_type }
                }
            }
            sub::PROBE => {
                f.expect(10, "MANAGE PROBE")?;
                // The three middle numbers are ignored but must be numbers.
                for i in 6..9 {
                    f.int(i, "probe field")?;
                }
                ManageOp::Probe {
                    cap_type: f.small(5, "cap type")?,
                }
            }
            sub::CHNG => {
                f.expect(10, "MANAGE CHNG")?;
                ManageOp::Change {
                    cap_type: f.small(5, "cap type")?,
                    max_size: f.uint(6, "size")?,
                    duration: u64::try_from(f.int(7, "duration")?).ok(),
                    reliability: match f.int(8, "reliability")? {
                        -1 => None,
                        n => Some(
                            Reliability::from_number(n)
                                .ok_or(ParseError::Invalid("reliability"))?,
                        ),
                    },
                }
            }
            sub::TRUNCATE => {
                f.expect(7, "MANAGE TRUNCATE")?;
                ManageOp::Truncate {
                    size: f.uint(5, "size")?,
                }
            }
            _ => return Err(ParseError::Invalid("manage sub-command")),
        };
        Ok(Manage { at, op })
    }

    /// The request line.
    pub fn encode(&self) -> String {
        let mut l = self.at.line(Command::Manage);
        match &self.op {
            ManageOp::Probe { cap_type } => l.field(sub::PROBE).field(cap_type).field("0 0 0"),
            ManageOp::Incr { cap_type } => l.field(sub::INCR).field(cap_type),
            ManageOp::Decr { cap_type } => l.field(sub::DECR).field(cap_type),
            ManageOp::Change {
                cap_type,
                max_size,
                duration,
                reliability,
            } => l
                .field(sub::CHNG)
                .field(cap_type)
                .field(max_size)
                .field(duration.map_or(-1, |d| i64::try_from(d).unwrap_or(i64::MAX)))
                .field(reliability.map_or(-1, Reliability::number)),
            ManageOp::Truncate { size } => l.field(sub::TRUNCATE).field(size),
        };
        l.end(self.at.timeout)
    }
}
