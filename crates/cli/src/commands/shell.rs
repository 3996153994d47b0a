//! `lors completions` and `lors man`: what a shell and `man` need, made from
//! the same definitions as the commands, so they never drift from them.

use std::path::PathBuf;

use anyhow::Context as _;
use clap_complete::Shell;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  lors completions bash > ~/.local/share/bash-completion/completions/lors
  lors completions zsh > ~/.zfunc/_lors        # with fpath+=(~/.zfunc)
  lors completions fish > ~/.config/fish/completions/lors.fish")]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(clap::Args)]
#[command(after_help = "Examples:
  lors man --out-dir ~/.local/share/man/man1 && man lors-upload
  lors man | man -l -                           # read lors(1) now")]
pub struct ManArgs {
    /// Write lors.1 and lors-COMMAND.1 here; without it, print lors.1.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

/// Prints the completion script for `a.shell`.
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "lors", &mut out);
    super::write_stdout(&out)
}

/// Writes the manual pages: one for `lors`, one per command.
/// What a rendered page needs besides clap's rendering: example lines (the
/// indented lines of a command's notes) kept as written, not filled into
/// one paragraph; no entry for `lors help`, which has no page.
fn fix_page(roff: &str) -> String {
    let mut out = String::with_capacity(roff.len() + 64);
    let mut lines = roff.lines().peekable();
    let mut literal = false;
    while let Some(line) = lines.next() {
        if line == ".TP" && lines.peek() == Some(&"lors\\-help(1)") {
            lines.next();
            lines.next(); // its one-line description
            continue;
        }
        let example = line.starts_with("  ");
        if example && !literal {
            out.push_str(".nf\n");
            literal = true;
        } else if !example && literal {
            out.push_str(".fi\n");
            literal = false;
        }
        out.push_str(line);
        out.push('\n');
    }
    if literal {
        out.push_str(".fi\n");
    }
    out
}

pub fn man(a: ManArgs, mut cmd: clap::Command) -> anyhow::Result<()> {
    // Built, so each command carries what its arguments add (examples).
    cmd.build();
    let Some(dir) = a.out_dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        return super::write_stdout(fix_page(&String::from_utf8_lossy(&out)).as_bytes());
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut pages = vec![("lors".to_owned(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("lors-{}", sub.get_name());
        // The page's title and synopsis name the command as it is typed.
        let sub = sub
            .clone()
            .name(name.clone())
            .bin_name(format!("lors {}", sub.get_name()));
        pages.push((name, sub));
    }
    for (name, page) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(page)
            .title(name.as_str())
            .render(&mut out)?;
        let out = fix_page(&String::from_utf8_lossy(&out));
        std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!("lors: wrote manual pages to {}", dir.display());
    Ok(())
}
