//! Sans-I/O IBP protocol: requests, reply shapes, status codes and limits.
//!
//! The authoritative description of every command we speak is
//! `docs/ibp-protocol.md`; section numbers in comments point there.

pub mod chksum;
pub mod limits;
pub mod reply;
pub mod request;
pub mod status;
pub mod status_body;

pub use limits::*;
pub use reply::{AliasProbeInfo, ProbeInfo, Reply, ReplyError, Shape, StatusV13};
pub use request::{
    AliasAllocate, AliasManage, AliasOp, AllocType, Allocate, AllocateChksum, Checksummed,
    ChksumQuery, Command, KeyToken, Keyed, Lease, Load, Manage, ManageOp, ParseError, Plain,
    Reliability, Request, Send, Status, StatusOp, Store, Timeout, Version, Write, sends_no_data,
};
pub use status::StatusCode;
pub use status_body::{StatusBody, StatusBodyError};
