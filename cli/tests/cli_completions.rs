//! `rmm completions SHELL` prints a completion script naming every subcommand; an unknown
//! shell is a usage error (exit status 2) naming the choices.

mod common;

#[test]
fn completion_scripts_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let out = common::rmm_command()
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8_lossy(&out.stdout);
        for sub in ["bench", "completions", "demo", "info", "replay"] {
            assert!(
                script.contains(sub),
                "{shell} script lacks {sub}:\n{script}"
            );
        }
    }
}

#[test]
fn an_unknown_shell_is_a_usage_error_naming_the_choices() {
    let out = common::rmm_command()
        .args(["completions", "cmd.exe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cmd.exe") && stderr.contains("bash") && stderr.contains("zsh"),
        "{stderr}"
    );
}
