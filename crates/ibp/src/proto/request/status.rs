//! `4` STATUS requests (§2.8). The v1.4 INQ reply's body is a
//! [`crate::proto::StatusBody`].

use super::fields::{Fields, Line, Timeout, Version};
use super::{Command, ParseError};

/// `4` STATUS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Version token: it decides whether a RID is sent.
    pub version: Version,
    /// Sub-command.
    pub op: StatusOp,
    /// Server-side timeout.
    pub timeout: Timeout,
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

const INQ: i64 = 1;
const CHANGE: i64 = 2;
const RES: i64 = 3;
const VERSION: i64 = 5;

impl Status {
    pub(super) fn parse(f: &Fields<'_>, version: Version) -> Result<Status, ParseError> {
        let n = f.len();
        let timeout = f.timeout(n - 1)?;
        let sub = |i| f.int(i, "status sub-command");
        let refuse = || Err(ParseError::Invalid("status sub-command"));
        let op = match (version, n) {
            // 0 4 <sub> <password> <timeout>
            (Version::V13, 5) => match sub(2)? {
                INQ => StatusOp::Inquire {
                    rid: None,
                    password: f.password(3)?,
                },
                CHANGE => StatusOp::Change {
                    rid: None,
                    password: f.password(3)?,
                },
                _ => return refuse(),
            },
            // 1 4 <RID> <sub> <password> <timeout>
            (Version::V14, 6) => {
                let rid = Some(f.rid(2)?);
                let password = f.password(4)?;
                match sub(3)? {
                    INQ => StatusOp::Inquire { rid, password },
                    CHANGE => StatusOp::Change { rid, password },
                    RES => StatusOp::Resources,
                    VERSION => StatusOp::Version,
                    _ => return refuse(),
                }
            }
            // 1 4 <sub> <timeout>: the reference depot's RID-less forms.
            (Version::V14, 4) => match sub(2)? {
                RES => StatusOp::Resources,
                VERSION => StatusOp::Version,
                _ => return refuse(),
            },
            // 1 4 <sub> <password> <timeout>
            (Version::V14, 5) => match sub(2)? {
                INQ => StatusOp::Inquire {
                    rid: None,
                    password: f.password(3)?,
                },
                RES => StatusOp::Resources,
                VERSION => StatusOp::Version,
                _ => return refuse(),
            },
            _ => return Err(ParseError::FieldCount("STATUS")),
        };
        Ok(Status {
            version,
            op,
            timeout,
        })
    }

    /// The request line. A v1.3 request never carries a RID; RES and
    /// VERSION always go in the v1.4 RID-less form.
    pub fn encode(&self) -> String {
        let version = match (self.version, &self.op) {
            (Version::V13, StatusOp::Inquire { .. } | StatusOp::Change { .. }) => Version::V13,
            _ => Version::V14,
        };
        let mut l = Line::new(version, Command::Status.number());
        let (code, rid, password) = match &self.op {
            StatusOp::Inquire { rid, password } => (INQ, rid.as_deref(), Some(password)),
            StatusOp::Change { rid, password } => (CHANGE, rid.as_deref(), Some(password)),
            StatusOp::Resources => (RES, None, None),
            StatusOp::Version => (VERSION, None, None),
        };
        if let (Version::V14, Some(rid)) = (version, rid) {
            l.field(rid);
        }
        l.field(code);
        if let Some(p) = password {
            l.field(p);
        }
        l.end(self.timeout)
    }
}
