//! The errors that decide the exit status: a usage error (2), a command
//! stopped by a signal (the shell's status for it).

/// An error that should exit with status 2 (bad usage/configuration).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UsageError {}

/// A command stopped by a signal after tidying up: exits with the status a
/// shell shows for that signal (130 for SIGINT, 143 for SIGTERM).
#[derive(Debug)]
pub struct Interrupted(pub u8);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = if self.0 == 143 { "SIGTERM" } else { "SIGINT" };
        write!(f, "interrupted ({name})")
    }
}
impl std::error::Error for Interrupted {}
