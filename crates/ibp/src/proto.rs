//! Sans-I/O IBP protocol: requests, reply shapes, status codes and limits.
//!
//! The authoritative description of every command we speak is
//! `docs/ibp-protocol.md`; section numbers in comments point there.

pub mod chksum;
pub mod limits;
pub mod request;
pub mod status;

pub use limits::*;
pub use request::cmd;
pub use request::{
    AliasOp, AllocType, Allocate, KeyToken, ManageOp, ParseError, Reliability, Request, StatusOp,
    Timeout, Version,
};
pub use status::StatusCode;

/// Formats a bare status reply the way the reference depot does: the number,
/// a space and a newline (`"-4 \n"`). Real clients tokenize on spaces, and some
/// compare the whole line, so the trailing space is kept.
pub fn status_line(code: StatusCode) -> String {
    format!("{} \n", code.code())
}

/// Splits a reply line into its status and the remaining fields.
///
/// Returns `None` when the first token is not an integer: the peer is not
/// speaking IBP.
pub fn split_reply(line: &str) -> Option<(i32, Vec<&str>)> {
    let mut it = line.split_ascii_whitespace();
    let status = it.next()?.parse::<i32>().ok()?;
    Some((status, it.collect()))
}
