//! `lors`: the LoRS command-line tool. Thin: parse arguments, set up logging,
//! call a library, map the result to an exit code.
//!
//! Exit codes: 0 success, 1 runtime failure, 2 bad usage or configuration.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod commands;
mod exit;
mod left;
mod report;

use exit::{Interrupted, UsageError};

/// Logistical networking storage: IBP depots and the LoRS tools.
#[derive(Parser)]
#[command(name = "lors", version, about, long_about = None)]
struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole system locally: 4 depots, upload, a depot failure, download.
    Demo(commands::demo::Args),
    /// Run an IBP storage depot.
    Depot(commands::depot::Args),
    /// Run the L-Bone depot directory and its dashboard.
    Lbone(commands::lbone::Args),
    /// Store a file on depots; write its exNode.
    Upload(commands::upload::Args),
    /// Fetch a file from the depots its exNode names.
    Download(commands::download::Args),
    /// List an exNode's mappings.
    Ls(commands::ls::Args),
    /// Summarize an exNode: size, replicas, depots, leases.
    Stat(commands::stat::Args),
    /// Add replicas on other depots (copied depot to depot).
    Augment(commands::augment::Args),
    /// Remove mappings, optionally releasing their allocations.
    Trim(commands::trim::Args),
    /// Extend the leases of an exNode's allocations.
    Refresh(commands::refresh::Args),
    /// Read every replica back and check it against its checksums.
    Verify(commands::verify::Args),
    /// Keep exNodes alive and whole: refresh leases, remake lost replicas.
    Keep(commands::keep::Args),
    /// Strip capabilities to share an exNode safely.
    Modify(commands::modify::Args),
    /// Hand out read access to a file or a range of it that can be revoked.
    Share(commands::share::Args),
    /// Move a file onto other depots.
    Route(commands::route::Args),
    /// Copy an exNode; the copy holds its own references on the depots.
    Cp(commands::copies::CpArgs),
    /// Remove exNodes, freeing what no other copy names.
    Rm(commands::copies::RmArgs),
    /// Send a file to many depots at once; the depots relay to each other.
    Disseminate(commands::disseminate::Args),
    /// Serve a directory of exNodes as ordinary files (FUSE).
    Mount(commands::mount::Args),
    /// Measure, fit and predict a data mover's throughput (sweep, fit,
    /// report, predict).
    Bench(commands::bench::Args),
    /// Print a shell completion script.
    Completions(commands::shell::CompletionsArgs),
    /// Write manual pages (lors.1 and one per command).
    Man(commands::shell::ManArgs),
}

fn init_logging(verbose: u8, default: &str) {
    use tracing_subscriber::EnvFilter;
    let level = match verbose {
        0 => default,
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(report::LogWriter)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Daemons log at info by default, as operators expect; tools at warn.
    let default_level = if matches!(cli.command, Command::Depot(_) | Command::Lbone(_)) {
        "info"
    } else {
        "warn"
    };
    init_logging(cli.verbose, default_level);
    let result = match cli.command {
        Command::Demo(a) => commands::demo::run(a),
        Command::Depot(a) => commands::depot::run(a),
        Command::Lbone(a) => commands::lbone::run(a),
        Command::Upload(a) => commands::upload::run(a),
        Command::Download(a) => commands::download::run(a),
        Command::Ls(a) => commands::ls::run(a),
        Command::Stat(a) => commands::stat::run(a),
        Command::Augment(a) => commands::augment::run(a),
        Command::Trim(a) => commands::trim::run(a),
        Command::Refresh(a) => commands::refresh::run(a),
        Command::Verify(a) => commands::verify::run(a),
        Command::Keep(a) => commands::keep::run(a),
        Command::Modify(a) => commands::modify::run(a),
        Command::Share(a) => commands::share::run(a),
        Command::Route(a) => commands::route::run(a),
        Command::Cp(a) => commands::copies::cp(a),
        Command::Rm(a) => commands::copies::rm(a),
        Command::Disseminate(a) => commands::disseminate::run(a),
        Command::Mount(a) => commands::mount::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Completions(a) => commands::shell::completions(a, Cli::command()),
        Command::Man(a) => commands::shell::man(a, Cli::command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): stop quietly with the status a
        // shell shows for a program ended by SIGPIPE, as `cat` does.
        Err(e) if broken_pipe(&e) => ExitCode::from(141),
        Err(e) => {
            report::clear();
            eprintln!("lors: error: {e:#}");
            if let Some(Interrupted(code)) = e.downcast_ref::<Interrupted>() {
                ExitCode::from(*code)
            } else if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

/// Whether `e` comes from writing to a closed pipe.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Every short option means one thing, whichever command it is given
    /// to: `-q` is quiet everywhere, `-d` a lease duration, and so on.
    #[test]
    fn a_short_option_has_one_meaning_across_commands() {
        let mut seen: BTreeMap<char, (String, String)> = BTreeMap::new();
        let mut clashes = Vec::new();
        let root = Cli::command();
        for cmd in root.get_subcommands() {
            for arg in cmd.get_arguments() {
                let (Some(short), Some(long)) = (arg.get_short(), arg.get_long()) else {
                    continue;
                };
                let here = (long.to_owned(), cmd.get_name().to_owned());
                match seen.get(&short) {
                    Some((l, first)) if *l != here.0 => clashes.push(format!(
                        "-{short}: --{l} in `{first}`, --{} in `{}`",
                        here.0, here.1
                    )),
                    Some(_) => {}
                    None => {
                        seen.insert(short, here);
                    }
                }
            }
        }
        assert!(clashes.is_empty(), "{clashes:#?}");
        // The letters LoRS users type still mean what they did.
        for (short, long) in [
            ('c', "copies"),
            ('d', "duration"),
            ('s', "soft"),
            ('l', "location"),
            ('m', "mappings"),
            ('q', "quiet"),
            ('t', "threads"),
            ('b', "block-size"),
            ('o', "output"),
            ('f', "auto-name"),
            ('T', "timeout"),
            ('H', "lbone"),
            ('P', "lbone-port"),
            ('R', "resume"),
        ] {
            assert_eq!(
                seen.get(&short).map(|s| s.0.as_str()),
                Some(long),
                "-{short}"
            );
        }
    }
}
