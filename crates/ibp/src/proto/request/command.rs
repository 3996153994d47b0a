//! The command numbers (`docs/ibp-protocol.md` §2.3), in one table.

/// Builds [`Command`] with its number and name from one list, so the two
/// cannot drift apart.
macro_rules! commands {
    ($($(#[$doc:meta])* $kind:ident = $number:literal, $name:literal;)*) => {
        /// A command we serve, by kind. The metrics and the logs index by it.
        ///
        /// ```
        /// use lors_ibp::proto::Command;
        /// assert_eq!(Command::from_number(8), Some(Command::Load));
        /// assert_eq!(Command::Load.name(), "LOAD");
        /// assert_eq!(Command::Load.number(), 8);
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Command {
            $($(#[$doc])* $kind,)*
        }

        impl Command {
            /// Every command, in number order.
            pub const ALL: &'static [Command] = &[$(Command::$kind,)*];

            /// The number on the wire.
            pub const fn number(self) -> i64 {
                match self {
                    $(Command::$kind => $number,)*
                }
            }

            /// The command a number names, if we serve it.
            pub const fn from_number(n: i64) -> Option<Command> {
                match n {
                    $($number => Some(Command::$kind),)*
                    _ => None,
                }
            }

            /// The name in the reference depot's vocabulary (`IBP_` dropped).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Command::$kind => $name,)*
                }
            }
        }
    };
}

commands! {
    /// Reserve space: three capabilities back.
    Allocate = 1, "ALLOCATE";
    /// Append bytes.
    Store = 2, "STORE";
    /// The depot's space, resources or version report.
    Status = 4, "STATUS";
    /// Copy to another depot's allocation (third party).
    Send = 5, "SEND";
    /// Read bytes.
    Load = 8, "LOAD";
    /// Probe, reference counts, lease and size changes.
    Manage = 9, "MANAGE";
    /// Write bytes at an offset.
    Write = 13, "WRITE";
    /// LStore: new keys for a window of an allocation.
    AliasAllocate = 14, "ALIAS_ALLOCATE";
    /// LStore: MANAGE for an alias.
    AliasManage = 15, "ALIAS_MANAGE";
    /// LStore: LOAD with a digest after every block.
    LoadChksum = 24, "LOAD_CHKSUM";
    /// LStore: WRITE with a digest after every block.
    WriteChksum = 27, "WRITE_CHKSUM";
    /// LStore: STORE with a digest after every block.
    StoreChksum = 28, "STORE_CHKSUM";
    /// LStore: ALLOCATE keeping per-block digests on disk.
    AllocateChksum = 29, "ALLOCATE_CHKSUM";
    /// LStore: the stored block digests.
    GetChksum = 31, "GET_CHKSUM";
    /// LStore: re-read every block against its digest.
    ValidateChksum = 32, "VALIDATE_CHKSUM";
}

impl Command {
    /// Whether the client sends data after the request line (STORE, WRITE
    /// and their checksummed forms).
    pub const fn uploads(self) -> bool {
        matches!(
            self,
            Command::Store | Command::Write | Command::StoreChksum | Command::WriteChksum
        )
    }
}

/// Whether command `n`, one we do not serve, is known to send no data after
/// its request line (RENAME, PHOEBUS_SEND, SPLIT/MERGE, PUSH/PULL and their
/// checksummed forms, checksummed SEND, VEC_READ; the served 14, 15, 29, 31
/// and 32 are in the range too). For any other — vector WRITE, LoCI legacy
/// and ACCRE internal commands, numbers nobody defined — we cannot tell where
/// a data phase would end, so after the error reply the connection must close
/// rather than read that data as commands (the reference depot closes too).
pub const fn sends_no_data(n: i64) -> bool {
    matches!(n, 14..=23 | 25 | 26 | 29..=32 | 35 | 36)
}

/// The sub-command numbers of MANAGE and ALIAS_MANAGE (§2.3).
pub(super) mod sub {
    pub const PROBE: i64 = 40;
    pub const INCR: i64 = 41;
    pub const DECR: i64 = 42;
    pub const CHNG: i64 = 43;
    pub const TRUNCATE: i64 = 45;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_are_one_to_one() {
        for (i, c) in Command::ALL.iter().enumerate() {
            assert_eq!(Command::from_number(c.number()), Some(*c));
            for d in &Command::ALL[i + 1..] {
                assert!(c.number() < d.number(), "table in number order");
                assert_ne!(c.name(), d.name());
            }
        }
        assert_eq!(Command::from_number(3), None);
    }
}
