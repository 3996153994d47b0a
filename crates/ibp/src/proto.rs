//! Sans-I/O IBP protocol: requests, reply shapes, status codes and limits.
//!
//! The authoritative description of every command we speak is
//! `docs/ibp-protocol.md`; section numbers in comments point there.

pub mod chksum;
pub mod limits;
pub mod reply;
pub mod request;
pub mod status;

pub use limits::*;
pub use reply::{AliasProbeInfo, ProbeInfo, Reply, ReplyError, Shape, StatusV13};
pub use request::cmd;
pub use request::{
    AliasOp, AllocType, Allocate, KeyToken, ManageOp, ParseError, Reliability, Request, StatusOp,
    Timeout, Version,
};
pub use status::StatusCode;
