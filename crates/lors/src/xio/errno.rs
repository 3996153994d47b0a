//! Errors as a program sees them: a LoRS error or an exNode file's error
//! becomes an `io::Error` of the right kind, and a kind an `errno`.

use std::io::{self, ErrorKind};

use crate::Error;
use crate::xnd::XndError;

pub(super) fn invalid(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(ErrorKind::InvalidInput, why.to_string())
}

pub(super) fn xnd_error(e: XndError) -> io::Error {
    let kind = match &e {
        XndError::Read { source, .. } | XndError::Write { source, .. } => source.kind(),
        _ => ErrorKind::InvalidData,
    };
    io::Error::new(kind, e)
}

/// A LoRS error as the error a program understands: `ENOSPC` when no depot
/// takes the data, `EIO` (`ErrorKind::Other`) when no replica can be read.
pub fn lors_error(e: Error) -> io::Error {
    io::Error::new(error_kind(&e), e)
}

fn error_kind(e: &Error) -> ErrorKind {
    match e {
        Error::NoDepots | Error::NotEnoughDepots { .. } => ErrorKind::StorageFull,
        Error::Store { last, .. } if last.code.is_some_and(|c| NO_ROOM.contains(&c)) => {
            ErrorKind::StorageFull
        }
        Error::Abandoned { cause, .. } => match error_kind(cause) {
            ErrorKind::StorageFull => ErrorKind::StorageFull,
            _ => ErrorKind::Other,
        },
        Error::Io { source, .. } => source.kind(),
        _ => ErrorKind::Other,
    }
}

/// The IBP statuses that mean a depot has no room: `ENOSPC` when the last
/// depot asked answered one of them.
const NO_ROOM: [lors_ibp::StatusCode; 3] = [
    lors_ibp::StatusCode::WOULD_EXCEED_LIMIT,
    lors_ibp::StatusCode::ALLOC_FAILED,
    lors_ibp::StatusCode::RSRC_UNAVAIL,
];

/// The `errno` value a program should see for `e` (C callers of libxio,
/// FUSE replies): the OS error if there is one, else by kind — `ENOSPC`,
/// `EROFS`, `ENOENT`, … — and `EIO` for the rest.
pub fn errno(e: &io::Error) -> i32 {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    match e.kind() {
        ErrorKind::NotFound => libc::ENOENT,
        ErrorKind::PermissionDenied => libc::EACCES,
        ErrorKind::AlreadyExists => libc::EEXIST,
        ErrorKind::InvalidInput => libc::EINVAL,
        ErrorKind::StorageFull => libc::ENOSPC,
        ErrorKind::ReadOnlyFilesystem => libc::EROFS,
        ErrorKind::Unsupported => libc::EOPNOTSUPP,
        ErrorKind::TimedOut => libc::ETIMEDOUT,
        _ => libc::EIO,
    }
}
