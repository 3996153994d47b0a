//! Reply lines (`docs/ibp-protocol.md` §1.6), as values: the depot
//! [`encode`](Reply::encode)s them, the client [`parse`](Reply::parse)s
//! them. A line alone does not say what it answers (`1 5 \n` is a byte
//! count after a LOAD and a resource list after STATUS RES), so `parse`
//! takes the [`Shape`] the request expects.
//!
//! The bytes are the reference depot's, trailing spaces included: real
//! clients tokenize on spaces, and some compare whole lines.
//!
//! ```
//! use lors_ibp::proto::{Reply, Shape, StatusCode};
//! assert_eq!(Reply::Count(11).encode(), "1 11 \n");
//! assert_eq!(Reply::parse(Shape::Count, "1 11 \n"), Ok(Reply::Count(11)));
//! assert_eq!(
//!     Reply::parse(Shape::Count, "-4 \n"),
//!     Ok(Reply::Fail { code: StatusCode::CAP_NOT_FOUND, retry_after: None })
//! );
//! ```

use std::fmt;
use std::time::Duration;

use super::chksum::ChksumType;
use super::status::StatusCode;
use crate::caps::{CapKind, CapSet, Capability};

/// The most a busy depot may ask a client to wait (longer is read as this).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// What MANAGE PROBE reports about an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeInfo {
    /// Read reference count.
    pub read_refs: i64,
    /// Write reference count.
    pub write_refs: i64,
    /// Bytes stored (queued bytes for FIFO/circular).
    pub size: u64,
    /// Maximum size.
    pub max_size: u64,
    /// Seconds until expiry.
    pub seconds_left: i64,
    /// 1 soft, 2 hard.
    pub reliability: i64,
    /// Allocation type number.
    pub alloc_type: i64,
}

/// What ALIAS_MANAGE PROBE reports about an alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AliasProbeInfo {
    /// Read reference count.
    pub read_refs: u64,
    /// Write reference count.
    pub write_refs: u64,
    /// Where the alias's window starts in its allocation.
    pub offset: u64,
    /// The window's length (0: to the end).
    pub length: u64,
    /// Seconds of lease left.
    pub seconds_left: u64,
}

/// The v1.3 STATUS INQ line (sizes in MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusV13 {
    /// Hard storage offered.
    pub hard_mb: u64,
    /// Hard storage in use.
    pub hard_used_mb: u64,
    /// Soft storage offered.
    pub soft_mb: u64,
    /// Soft storage in use.
    pub soft_used_mb: u64,
    /// Longest lease, in seconds.
    pub max_duration: u64,
}

/// The shape of reply a request expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `1 \n`: a go-ahead, MANAGE INCR/DECR/CHNG/TRUNCATE, ALIAS_MANAGE
    /// but PROBE.
    Bare,
    /// `1 <n> \n`: bytes after STORE/WRITE/LOAD/SEND, the body length of a
    /// v1.4 STATUS INQ.
    Count,
    /// ALLOCATE and ALIAS_ALLOCATE: three capabilities.
    Caps,
    /// MANAGE PROBE.
    Probe,
    /// ALIAS_MANAGE PROBE.
    AliasProbe,
    /// GET_CHKSUM's head line.
    Chksum,
    /// VALIDATE_CHKSUM.
    BadBlocks,
    /// STATUS RES.
    Resources,
    /// v1.3 STATUS INQ: the numbers alone, no status.
    StatusV13,
    /// STATUS VERSION's head line (a report ending in `END` follows).
    Report,
}

impl Shape {
    /// Every shape.
    pub const ALL: [Shape; 10] = [
        Shape::Bare,
        Shape::Count,
        Shape::Caps,
        Shape::Probe,
        Shape::AliasProbe,
        Shape::Chksum,
        Shape::BadBlocks,
        Shape::Resources,
        Shape::StatusV13,
        Shape::Report,
    ];
}

/// One reply line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An error status; a busy depot (`-66`) says how long to wait.
    Fail {
        /// The status.
        code: StatusCode,
        /// The wait a busy depot asks for, to a tenth of a second.
        retry_after: Option<Duration>,
    },
    /// `1 \n`.
    Ok,
    /// `1 <n> \n`.
    Count(u64),
    /// `1 <read cap> <write cap> <manage cap> \n`.
    Caps(Box<CapSet>),
    /// `1 <read refs> <write refs> <size> <max size> <seconds left>
    /// <reliability> <type> \n`.
    Probe(ProbeInfo),
    /// `1 <read refs> <write refs> <offset> <length> <seconds left> \n`.
    AliasProbe(AliasProbeInfo),
    /// `1 <type> <digest bytes> <block size> <blocks> <bytes>\n` (no space
    /// before the newline, as the ACCRE depot sends it); `bytes` of binary
    /// digests follow unless only the head was asked for.
    Chksum {
        /// The digest algorithm.
        kind: ChksumType,
        /// Data bytes per digest.
        block_size: u64,
        /// Number of digests.
        blocks: u64,
        /// Bytes of digests that follow.
        bytes: u64,
    },
    /// `1 <n>\n`: blocks failing their digest.
    BadBlocks(u64),
    /// `1 <rid> <rid> … \n`.
    Resources(Vec<String>),
    /// `<hard> <hard used> <soft> <soft used> <max duration> \n`.
    StatusV13(StatusV13),
    /// `1\n`.
    Report,
}

/// Why a reply line is not the reply expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// The line does not start with an integer: the peer is not speaking IBP.
    NotIbp,
    /// A status other than success or an error code.
    Status(i64),
    /// A field is missing or malformed (what was expected).
    Field(&'static str),
    /// More fields than the reply has.
    Extra,
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::NotIbp => f.write_str("not an IBP reply (no status number)"),
            ReplyError::Status(s) => write!(f, "status {s} is neither success nor an error"),
            ReplyError::Field(what) => write!(f, "missing or malformed {what}"),
            ReplyError::Extra => f.write_str("more fields than the reply has"),
        }
    }
}

impl std::error::Error for ReplyError {}

impl Reply {
    /// A bare error status: `<code> \n`.
    pub fn fail(code: StatusCode) -> Reply {
        Reply::Fail {
            code,
            retry_after: None,
        }
    }

    /// The reply's bytes, newline included.
    pub fn encode(&self) -> String {
        match self {
            Reply::Fail {
                code,
                retry_after: None,
            } => format!("{} \n", code.code()),
            Reply::Fail {
                code,
                retry_after: Some(d),
            } => format!("{} {:.1}\n", code.code(), d.as_secs_f64()),
            Reply::Ok => "1 \n".to_owned(),
            Reply::Count(n) => format!("1 {n} \n"),
            Reply::Caps(c) => format!(
                "1 {} {} {} \n",
                c.read.to_url(),
                c.write.to_url(),
                c.manage.to_url()
            ),
            Reply::Probe(p) => format!(
                "1 {} {} {} {} {} {} {} \n",
                p.read_refs,
                p.write_refs,
                p.size,
                p.max_size,
                p.seconds_left,
                p.reliability,
                p.alloc_type
            ),
            Reply::AliasProbe(p) => format!(
                "1 {} {} {} {} {} \n",
                p.read_refs, p.write_refs, p.offset, p.length, p.seconds_left
            ),
            Reply::Chksum {
                kind,
                block_size,
                blocks,
                bytes,
            } => format!(
                "1 {} {} {block_size} {blocks} {bytes}\n",
                kind.number(),
                kind.hex_len() / 2
            ),
            Reply::BadBlocks(n) => format!("1 {n}\n"),
            Reply::Resources(rids) => {
                let mut s = String::from("1 ");
                for r in rids {
                    s.push_str(r);
                    s.push(' ');
                }
                s.push('\n');
                s
            }
            Reply::StatusV13(s) => format!(
                "{} {} {} {} {} \n",
                s.hard_mb, s.hard_used_mb, s.soft_mb, s.soft_used_mb, s.max_duration
            ),
            Reply::Report => "1\n".to_owned(),
        }
    }

    /// Reads a reply line (with or without its newline) of the given shape.
    /// Total: every input gives a reply or an error, and every reply it
    /// gives encodes to a line it parses back to the same reply.
    pub fn parse(shape: Shape, line: &str) -> Result<Reply, ReplyError> {
        let mut f = line.split_ascii_whitespace();
        let status = f.next().ok_or(ReplyError::NotIbp)?;
        let status: i64 = status.parse().map_err(|_| ReplyError::NotIbp)?;
        if status < 0 {
            let code = i32::try_from(status).map_err(|_| ReplyError::Status(status))?;
            let code = StatusCode::from_code(code);
            // Anything after an error status but a busy depot's wait is
            // ignored, as real clients do.
            let retry_after = if code == StatusCode::OUT_OF_SOCKETS {
                f.next().and_then(parse_wait)
            } else {
                None
            };
            return Ok(Reply::Fail { code, retry_after });
        }
        if shape == Shape::StatusV13 {
            let mut n = std::iter::once(status.to_string()).chain(f.map(str::to_owned));
            let mut next = |what| {
                n.next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or(ReplyError::Field(what))
            };
            let s = StatusV13 {
                hard_mb: next("hard size")?,
                hard_used_mb: next("hard used")?,
                soft_mb: next("soft size")?,
                soft_used_mb: next("soft used")?,
                max_duration: next("max duration")?,
            };
            return match n.next() {
                Some(_) => Err(ReplyError::Extra),
                None => Ok(Reply::StatusV13(s)),
            };
        }
        if status != 1 {
            return Err(ReplyError::Status(status));
        }
        let mut fields = Fields(f);
        let reply = match shape {
            Shape::Bare => Reply::Ok,
            Shape::Report => Reply::Report,
            Shape::Count => Reply::Count(fields.num("byte count")?),
            Shape::BadBlocks => Reply::BadBlocks(fields.num("bad block count")?),
            Shape::Caps => {
                let mut cap = |kind, what| {
                    fields
                        .next(what)
                        .and_then(|s| Capability::parse(s).map_err(|_| ReplyError::Field(what)))
                        .and_then(|c| {
                            if c.kind == kind {
                                Ok(c)
                            } else {
                                Err(ReplyError::Field(what))
                            }
                        })
                };
                let read = cap(CapKind::Read, "read capability")?;
                let write = cap(CapKind::Write, "write capability")?;
                let manage = cap(CapKind::Manage, "manage capability")?;
                Reply::Caps(Box::new(CapSet {
                    read,
                    write,
                    manage,
                }))
            }
            Shape::Probe => Reply::Probe(ProbeInfo {
                read_refs: fields.num("read count")?,
                write_refs: fields.num("write count")?,
                size: fields.num("size")?,
                max_size: fields.num("max size")?,
                seconds_left: fields.num("seconds left")?,
                reliability: fields.num("reliability")?,
                alloc_type: fields.num("type")?,
            }),
            Shape::AliasProbe => Reply::AliasProbe(AliasProbeInfo {
                read_refs: fields.num("read count")?,
                write_refs: fields.num("write count")?,
                offset: fields.num("offset")?,
                length: fields.num("length")?,
                seconds_left: fields.num("seconds left")?,
            }),
            Shape::Chksum => {
                let kind = ChksumType::from_number(fields.num("checksum type")?)
                    .ok_or(ReplyError::Field("checksum type"))?;
                let digest: u64 = fields.num("digest size")?;
                if digest != kind.hex_len() as u64 / 2 {
                    return Err(ReplyError::Field("digest size"));
                }
                Reply::Chksum {
                    kind,
                    block_size: fields.num("block size")?,
                    blocks: fields.num("block count")?,
                    bytes: fields.num("digest bytes")?,
                }
            }
            Shape::Resources => {
                return Ok(Reply::Resources(fields.0.map(str::to_owned).collect()));
            }
            Shape::StatusV13 => unreachable!("answered above"),
        };
        match fields.0.next() {
            Some(_) => Err(ReplyError::Extra),
            None => Ok(reply),
        }
    }
}

/// A busy depot's wait in seconds (`1.0`), to a tenth of a second and at
/// most [`MAX_RETRY_AFTER`]; `None` if it is not a number.
fn parse_wait(s: &str) -> Option<Duration> {
    let secs: f64 = s.parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    let tenths = (secs * 10.0)
        .round()
        .min(MAX_RETRY_AFTER.as_secs_f64() * 10.0);
    // In range by the clamp above: a whole number of tenths up to 36,000.
    Some(Duration::from_millis(tenths as u64 * 100))
}

struct Fields<'a, I: Iterator<Item = &'a str>>(I);

impl<'a, I: Iterator<Item = &'a str>> Fields<'a, I> {
    fn next(&mut self, what: &'static str) -> Result<&'a str, ReplyError> {
        self.0.next().ok_or(ReplyError::Field(what))
    }

    fn num<T: std::str::FromStr>(&mut self, what: &'static str) -> Result<T, ReplyError> {
        self.next(what)?
            .parse()
            .map_err(|_| ReplyError::Field(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_depots_lines_parse() {
        // Lines observed on the wire (docs/ibp-protocol.md, [verified live]).
        let p = Reply::parse(Shape::Probe, "1 1 0 11 1024 3600 2 1 \n").unwrap();
        assert_eq!(
            p,
            Reply::Probe(ProbeInfo {
                read_refs: 1,
                write_refs: 0,
                size: 11,
                max_size: 1024,
                seconds_left: 3600,
                reliability: 2,
                alloc_type: 1
            })
        );
        assert_eq!(p.encode(), "1 1 0 11 1024 3600 2 1 \n");
        let v13 = Reply::parse(Shape::StatusV13, "100 0 100 0 3600 \n").unwrap();
        assert_eq!(v13.encode(), "100 0 100 0 3600 \n");
        assert_eq!(
            Reply::parse(Shape::Count, "1 128 \n"),
            Ok(Reply::Count(128))
        );
        assert_eq!(Reply::parse(Shape::Report, "1\n"), Ok(Reply::Report));
        assert_eq!(
            Reply::parse(Shape::Resources, "1 0 1 2 \n"),
            Ok(Reply::Resources(vec!["0".into(), "1".into(), "2".into()]))
        );
        let fail = Reply::parse(Shape::Caps, "-4 \n").unwrap();
        assert_eq!(fail, Reply::fail(StatusCode::CAP_NOT_FOUND));
        assert_eq!(fail.encode(), "-4 \n");
        let busy = Reply::parse(Shape::Bare, "-66 1.0\n").unwrap();
        assert_eq!(
            busy,
            Reply::Fail {
                code: StatusCode::OUT_OF_SOCKETS,
                retry_after: Some(Duration::from_secs(1))
            }
        );
        assert_eq!(busy.encode(), "-66 1.0\n");
        let chk = Reply::parse(Shape::Chksum, "1 1 32 65536 3 96\n").unwrap();
        assert_eq!(chk.encode(), "1 1 32 65536 3 96\n");
    }

    #[test]
    fn capabilities_come_back_as_sent_and_of_the_right_kinds() {
        let line =
            "1 ibp://h:6714/1#rk/42/READ ibp://h:6714/1#wk/42/WRITE ibp://h:6714/1#mk/42/MANAGE \n";
        let r = Reply::parse(Shape::Caps, line).unwrap();
        assert_eq!(r.encode(), line);
        let swapped =
            "1 ibp://h:6714/1#wk/42/WRITE ibp://h:6714/1#rk/42/READ ibp://h:6714/1#mk/42/MANAGE \n";
        assert_eq!(
            Reply::parse(Shape::Caps, swapped),
            Err(ReplyError::Field("read capability"))
        );
    }

    #[test]
    fn wrong_lines_are_errors_not_panics() {
        let cases: [(Shape, &str, ReplyError); 9] = [
            (Shape::Count, "", ReplyError::NotIbp),
            (Shape::Count, "HTTP/1.1 400\n", ReplyError::NotIbp),
            (Shape::Count, "2 5 \n", ReplyError::Status(2)),
            (Shape::Count, "1 \n", ReplyError::Field("byte count")),
            (Shape::Count, "1 -5 \n", ReplyError::Field("byte count")),
            (Shape::Count, "1 5 6\n", ReplyError::Extra),
            (Shape::Bare, "1 x\n", ReplyError::Extra),
            (Shape::Probe, "1 1 0 11\n", ReplyError::Field("max size")),
            (
                Shape::Chksum,
                "1 1 20 4 1 32\n",
                ReplyError::Field("digest size"),
            ),
        ];
        for (shape, line, want) in cases {
            assert_eq!(Reply::parse(shape, line), Err(want), "{line:?}");
        }
        assert_eq!(
            Reply::parse(Shape::Bare, "-99999999999999999999 \n"),
            Err(ReplyError::NotIbp)
        );
        assert_eq!(
            Reply::parse(Shape::Bare, "-9999999999 \n"),
            Err(ReplyError::Status(-9_999_999_999))
        );
        // A busy depot's odd waits: clamped, rounded, or ignored.
        for (wait, want) in [
            ("1e9", Some(MAX_RETRY_AFTER)),
            ("0.04", Some(Duration::ZERO)),
            ("0.25", Some(Duration::from_millis(300))),
            ("NaN", None),
            ("-1", None),
            ("x", None),
        ] {
            let r = Reply::parse(Shape::Bare, &format!("-66 {wait}\n")).unwrap();
            assert_eq!(
                r,
                Reply::Fail {
                    code: StatusCode::OUT_OF_SOCKETS,
                    retry_after: want
                },
                "{wait}"
            );
        }
    }

    /// The property the fuzz target checks on arbitrary input.
    #[test]
    fn whatever_parses_round_trips() {
        let lines = [
            "1 \n",
            "1 0 \n",
            "1 18446744073709551615 \n",
            "1 -1 -1 0 0 -5 9 9 \n",
            "1 a b c \n",
            "-66 3599.96\n",
            "-66 0.05\n",
            "-1 junk after\n",
            "0 0 0 0 0\n",
            "1 3 64 1 1 64\n",
            "1\t7\r\n",
        ];
        for line in lines {
            for shape in Shape::ALL {
                if let Ok(r) = Reply::parse(shape, line) {
                    assert_eq!(
                        Reply::parse(shape, &r.encode()),
                        Ok(r),
                        "{shape:?} {line:?}"
                    );
                }
            }
        }
    }
}
