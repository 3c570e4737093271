//! `flowlane completions SHELL` and `flowlane man`: shell completion scripts and a man page,
//! generated from the same command definitions that parse the arguments (clap_complete,
//! clap_mangen), so they never drift from what the binary takes.

use std::io::Write;
use std::process::ExitCode;

use anyhow::anyhow;
use clap::{Args, CommandFactory, ValueEnum};

use crate::{CmdResult, Failure};

/// Print a shell completion script (bash, zsh, fish, elvish or powershell).
///
/// Examples:
///   flowlane completions bash > /etc/bash_completion.d/flowlane
///   flowlane completions zsh > "${fpath[1]}/_flowlane"
///   flowlane completions fish > ~/.config/fish/completions/flowlane.fish
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
    Elvish,
    Powershell,
}

/// Print the man page (roff) of flowlane and its subcommands.
///
/// Examples:
///   flowlane man > /usr/local/share/man/man1/flowlane.1 && man flowlane
///   flowlane man | man -l -
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ManArgs {}

pub fn completions(a: CompletionsArgs) -> CmdResult {
    use clap_complete::Shell as S;
    let shell = match a.shell {
        Shell::Bash => S::Bash,
        Shell::Zsh => S::Zsh,
        Shell::Fish => S::Fish,
        Shell::Elvish => S::Elvish,
        Shell::Powershell => S::PowerShell,
    };
    let mut cmd = crate::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "flowlane", &mut out);
    write_out(&out)
}

pub fn man(_: ManArgs) -> CmdResult {
    let cmd = crate::Cli::command();
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut out)
        .map_err(|e| Failure::runtime(anyhow!("rendering the man page: {e}")))?;
    // One section per subcommand after the main page, as `git help` pages do.
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("flowlane-{}", sub.get_name());
        clap_mangen::Man::new(sub.clone().name(name))
            .render(&mut out)
            .map_err(|e| Failure::runtime(anyhow!("rendering the man page: {e}")))?;
    }
    write_out(&out)
}

fn write_out(bytes: &[u8]) -> CmdResult {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::runtime(anyhow!("writing to stdout: {e}")))?;
    Ok(ExitCode::SUCCESS)
}
