//! The IBP status/error-code table (`docs/ibp-protocol.md` §5).
//!
//! Codes are wire values; we never send an enum discriminant or `Debug` text.

use std::fmt;

/// A status code as it travels on the wire: `1` is success, negatives are errors.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatusCode(i32);

macro_rules! codes {
    ($( $(#[$doc:meta])* $name:ident = $val:expr, $text:expr; )*) => {
        impl StatusCode {
            $( $(#[$doc])* pub const $name: StatusCode = StatusCode($val); )*

            /// Every code we know, with its `IBP_E_*` name.
            pub const TABLE: &'static [(StatusCode, &'static str)] = &[
                $( (StatusCode($val), $text), )*
            ];
        }
    };
}

codes! {
    /// Success.
    OK = 1, "IBP_OK";
    /// Unspecified failure.
    GENERIC = -1, "IBP_E_GENERIC";
    /// Reading from the socket failed.
    SOCK_READ = -2, "IBP_E_SOCK_READ";
    /// Writing to the socket failed.
    SOCK_WRITE = -3, "IBP_E_SOCK_WRITE";
    /// No allocation has this key (or the key is of the wrong kind, or expired).
    CAP_NOT_FOUND = -4, "IBP_E_CAP_NOT_FOUND";
    /// The capability is not a write capability.
    CAP_NOT_WRITE = -5, "IBP_E_CAP_NOT_WRITE";
    /// The capability is not a read capability.
    CAP_NOT_READ = -6, "IBP_E_CAP_NOT_READ";
    /// The capability is not a manage capability.
    CAP_NOT_MANAGE = -7, "IBP_E_CAP_NOT_MANAGE";
    /// Invalid write capability.
    INVALID_WRITE_CAP = -8, "IBP_E_INVALID_WRITE_CAP";
    /// Invalid read capability.
    INVALID_READ_CAP = -9, "IBP_E_INVALID_READ_CAP";
    /// Invalid manage capability.
    INVALID_MANAGE_CAP = -10, "IBP_E_INVALID_MANAGE_CAP";
    /// A capability or cap-type field is malformed.
    WRONG_CAP_FORMAT = -11, "IBP_E_WRONG_CAP_FORMAT";
    /// Access denied.
    CAP_ACCESS_DENIED = -12, "IBP_E_CAP_ACCESS_DENIED";
    /// Could not connect (depot-to-depot copy).
    CONNECTION = -13, "IBP_E_CONNECTION";
    /// Could not open the backing file.
    FILE_OPEN = -14, "IBP_E_FILE_OPEN";
    /// Could not read the backing file.
    FILE_READ = -15, "IBP_E_FILE_READ";
    /// Could not write the backing file (disk full, I/O error).
    FILE_WRITE = -16, "IBP_E_FILE_WRITE";
    /// Backing file access error.
    FILE_ACCESS = -17, "IBP_E_FILE_ACCESS";
    /// Seek error.
    FILE_SEEK_ERROR = -18, "IBP_E_FILE_SEEK_ERROR";
    /// Beyond the allocation's size or the depot's free space.
    WOULD_EXCEED_LIMIT = -19, "IBP_E_WOULD_EXCEED_LIMIT";
    /// The change would destroy stored data.
    WOULD_DAMAGE_DATA = -20, "IBP_E_WOULD_DAMAGE_DATA";
    /// The request line is malformed.
    BAD_FORMAT = -21, "IBP_E_BAD_FORMAT";
    /// The allocation type is not offered.
    TYPE_NOT_SUPPORTED = -22, "IBP_E_TYPE_NOT_SUPPORTED";
    /// Resource unavailable.
    RSRC_UNAVAIL = -23, "IBP_E_RSRC_UNAVAIL";
    /// Internal depot error.
    INTERNAL = -24, "IBP_E_INTERNAL";
    /// The command is not allowed here.
    INVALID_CMD = -25, "IBP_E_INVALID_CMD";
    /// The operation would block.
    WOULD_BLOCK = -26, "IBP_E_WOULD_BLOCK";
    /// Unsupported protocol version.
    PROT_VERS = -27, "IBP_E_PROT_VERS";
    /// Duration beyond the resource's maximum.
    LONG_DURATION = -28, "IBP_E_LONG_DURATION";
    /// Wrong STATUS password.
    WRONG_PASSWD = -29, "IBP_E_WRONG_PASSWD";
    /// A parameter is out of range.
    INVALID_PARAMETER = -30, "IBP_E_INVALID_PARAMETER";
    /// Invalid host parameter.
    INV_PAR_HOST = -31, "IBP_E_INV_PAR_HOST";
    /// Invalid port parameter.
    INV_PAR_PORT = -32, "IBP_E_INV_PAR_PORT";
    /// Invalid duration attribute.
    INV_PAR_ATDR = -33, "IBP_E_INV_PAR_ATDR";
    /// Invalid reliability attribute.
    INV_PAR_ATRL = -34, "IBP_E_INV_PAR_ATRL";
    /// Invalid type attribute.
    INV_PAR_ATTP = -35, "IBP_E_INV_PAR_ATTP";
    /// Invalid size parameter.
    INV_PAR_SIZE = -36, "IBP_E_INV_PAR_SIZE";
    /// Invalid pointer parameter.
    INV_PAR_PTR = -37, "IBP_E_INV_PAR_PTR";
    /// Allocation failed.
    ALLOC_FAILED = -38, "IBP_E_ALLOC_FAILED";
    /// Too many units.
    TOO_MANY_UNITS = -39, "IBP_E_TOO_MANY_UNITS";
    /// Setting a socket attribute failed.
    SET_SOCK_ATTR = -40, "IBP_E_SET_SOCK_ATTR";
    /// Getting a socket attribute failed.
    GET_SOCK_ATTR = -41, "IBP_E_GET_SOCK_ATTR";
    /// The client timed out.
    CLIENT_TIMEOUT = -42, "IBP_E_CLIENT_TIMEOUT";
    /// Unknown command number.
    UNKNOWN_FUNCTION = -43, "IBP_E_UNKNOWN_FUNCTION";
    /// Invalid IP address.
    INV_IP_ADDR = -44, "IBP_E_INV_IP_ADDR";
    /// Beyond the depot's policy (duration, size limits).
    WOULD_EXCEED_POLICY = -45, "IBP_E_WOULD_EXCEED_POLICY";
    /// The depot timed out.
    SERVER_TIMEOUT = -46, "IBP_E_SERVER_TIMEOUT";
    /// The depot is recovering.
    SERVER_RECOVERING = -47, "IBP_E_SERVER_RECOVERING";
    /// The capability is being deleted.
    CAP_DELETING = -48, "IBP_E_CAP_DELETING";
    /// Unknown resource.
    UNKNOWN_RS = -49, "IBP_E_UNKNOWN_RS";
    /// No resource has this id.
    INVALID_RID = -50, "IBP_E_INVALID_RID";
    /// Unknown NFU operation.
    NFU_UNKNOWN = -51, "IBP_E_NFU_UNKNOWN";
    /// Duplicate NFU parameter.
    NFU_DUP_PARA = -52, "IBP_E_NFU_DUP_PARA";
    /// The queue is full.
    QUEUE_FULL = -53, "IBP_E_QUEUE_FULL";
    /// Certificate authentication failed.
    CRT_AUTH_FAIL = -54, "IBP_E_CRT_AUTH_FAIL";
    /// Invalid certificate file.
    INVALID_CERT_FILE = -55, "IBP_E_INVALID_CERT_FILE";
    /// Invalid private key password.
    INVALID_PRIVATE_KEY_PASSWD = -56, "IBP_E_INVALID_PRIVATE_KEY_PASSWD";
    /// Invalid private key file.
    INVALID_PRIVATE_KEY_FILE = -57, "IBP_E_INVALID_PRIVATE_KEY_FILE";
    /// Authentication required.
    AUTHENTICATION_REQ = -58, "IBP_AUTHENTICATION_REQ";
    /// Authentication not supported.
    AUTHEN_NOT_SUPPORT = -59, "IBP_E_AUTHEN_NOT_SUPPORT";
    /// Authentication failed.
    AUTHENTICATION_FAILED = -60, "IBP_E_AUTHENTICATION_FAILED";
    /// Invalid host.
    INVALID_HOST = -61, "IBP_E_INVALID_HOST";
    /// Cannot connect.
    CANT_CONNECT = -62, "IBP_E_CANT_CONNECT";
    /// Checksum mismatch.
    CHKSUM = -63, "IBP_E_CHKSUM";
    /// Unknown checksum type.
    CHKSUM_TYPE = -64, "IBP_E_CHKSUM_TYPE";
    /// Bad checksum block size.
    CHKSUM_BLOCKSIZE = -65, "IBP_E_CHKSUM_BLOCKSIZE";
    /// The depot is out of connection slots; retry after the given delay.
    OUT_OF_SOCKETS = -66, "IBP_E_OUT_OF_SOCKETS";
}

impl StatusCode {
    /// Wraps a raw wire value (known or not).
    pub const fn from_code(code: i32) -> StatusCode {
        StatusCode(code)
    }

    /// The wire value.
    pub const fn code(self) -> i32 {
        self.0
    }

    /// Whether this is `IBP_OK`.
    pub const fn is_ok(self) -> bool {
        self.0 == 1
    }

    /// The `IBP_E_*` name, or `None` for a code outside the table.
    pub fn name(self) -> Option<&'static str> {
        Self::TABLE
            .iter()
            .find(|(c, _)| *c == self)
            .map(|(_, n)| *n)
    }

    /// A short human explanation, for error messages that say what happened.
    pub fn describe(self) -> &'static str {
        match self {
            Self::OK => "success",
            Self::CAP_NOT_FOUND => {
                "no allocation has this key (wrong, revoked or expired capability)"
            }
            Self::WOULD_EXCEED_LIMIT => "beyond the allocation's size or the depot's free space",
            Self::WOULD_DAMAGE_DATA => "the change would destroy stored data",
            Self::BAD_FORMAT => "the depot could not parse the request",
            Self::TYPE_NOT_SUPPORTED => "the depot does not offer this allocation type",
            Self::LONG_DURATION => "duration longer than the depot allows",
            Self::WRONG_PASSWD => "wrong STATUS password",
            Self::INVALID_PARAMETER => "a parameter is out of range",
            Self::UNKNOWN_FUNCTION => "the depot does not know this command",
            Self::WOULD_EXCEED_POLICY => "beyond the depot's policy",
            Self::INVALID_RID => "the depot has no resource with this id",
            Self::FILE_WRITE => "the depot could not write its disk (full or failing)",
            Self::CONNECTION | Self::CANT_CONNECT => "the depot could not reach the other depot",
            Self::OUT_OF_SOCKETS => "the depot is busy; retry later",
            Self::INVALID_CMD => "the command is not allowed on this depot",
            Self::WRONG_CAP_FORMAT => "malformed capability or cap-type field",
            Self::SERVER_TIMEOUT => "the depot timed out waiting for data",
            _ => "depot error",
        }
    }
}

impl fmt::Debug for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({})", self.0),
            None => write!(f, "StatusCode({})", self.0),
        }
    }
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{} {n}: {}", self.0, self.describe()),
            None => write!(f, "{}: unknown IBP status", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_contiguous_and_round_trips() {
        // Every code from -1 to -66 is present exactly once and maps both ways.
        for code in -66..=-1 {
            let c = StatusCode::from_code(code);
            assert!(c.name().is_some(), "missing {code}");
            let by_name = StatusCode::TABLE
                .iter()
                .find(|(_, n)| Some(*n) == c.name())
                .unwrap();
            assert_eq!(by_name.0.code(), code);
        }
        assert_eq!(StatusCode::TABLE.len(), 67);
        assert_eq!(StatusCode::CAP_NOT_FOUND.code(), -4);
        assert_eq!(StatusCode::INVALID_RID.name(), Some("IBP_E_INVALID_RID"));
        assert_eq!(StatusCode::from_code(-99).name(), None);
    }
}
