//! One module per subcommand.

pub mod depot;
