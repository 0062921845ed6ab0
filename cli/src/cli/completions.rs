//! `rmm completions SHELL`: the shell completion script for `rmm`, on standard output.

use clap::CommandFactory;
use clap_complete::Shell;

use super::Cli;

/// Arguments of `rmm completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete in: bash, zsh, fish, elvish or powershell.
    ///
    /// bash: `rmm completions bash > ~/.local/share/bash-completion/completions/rmm`;
    /// zsh: into a directory on `$fpath` as `_rmm`; fish: into
    /// `~/.config/fish/completions/rmm.fish`.
    pub shell: Shell,
}

/// Writes the script to standard output.
pub fn run(args: CompletionsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "rmm", &mut script);
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(())
}
