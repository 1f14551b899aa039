//! `colo train` with `[cluster] workers = N > 1`: the run goes to colo-py's
//! Ray controller (`python -m colo.controller`), in the project's virtual
//! environment, which `./x` sets up with torch, Ray and the `colo` package.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use colo_rl::Config;

/// The virtual environment's Python: `$VIRTUAL_ENV` (set by `./x`), else
/// the repository's `.venv` this binary was built beside.
fn python() -> PathBuf {
    let venv = std::env::var_os("VIRTUAL_ENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv"));
    venv.join("bin/python")
}

/// The environment's Python running `module`, or an error saying how to
/// set it up.
fn python_command(module: &str) -> Result<Command> {
    let py = python();
    if !py.is_file() {
        bail!(
            "{module} runs on Ray through colo's Python package, but there is no Python \
             environment at {} (run ./x once: it installs torch, Ray and colo-py)",
            py.display()
        );
    }
    let mut cmd = Command::new(py);
    cmd.args(["-W", "ignore", "-m", module]);
    Ok(cmd)
}

fn wait(mut cmd: Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status}); its error is above");
    }
    Ok(())
}

/// Runs a module of the `colo` package with `args` and waits.
pub fn python_module(module: &str, args: &[String]) -> Result<()> {
    let mut cmd = python_command(module)?;
    cmd.args(args);
    wait(cmd, module)
}

/// Runs the controller for `config_path`'s run into `out` and waits;
/// `Ok(true)` when the run stopped at the user's request (the controller
/// has said after which step, and how to resume).
///
/// Ctrl-C (and SIGTERM, SIGHUP) reach `colo` only: the controller runs in
/// a process group of its own, so the terminal's SIGINT reaches neither it
/// nor the Ray processes it starts, and `colo` passes each signal on to the
/// controller as one SIGINT. The first stops the run after the step under
/// way with a checkpoint; the second, at once (the controller kills its
/// workers and shuts down the Ray it started).
pub fn run(config_path: &Path, config: &Config, out: &Path, resume: bool) -> Result<bool> {
    use std::os::unix::process::CommandExt;

    let mut cmd = python_command("colo.controller")?;
    cmd.arg("--config")
        .arg(config_path)
        .arg("--out")
        .arg(out)
        .arg("--workers")
        .arg(config.cluster.workers.to_string());
    if let Some(a) = &config.cluster.address {
        cmd.args(["--address", a]);
    }
    if resume {
        cmd.arg("--resume");
    }
    cmd.process_group(0);
    let what = "the distributed run";
    let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let pid = child.id();
    ctrlc::set_handler(move || {
        if let Err(e) = colo_mem::os::interrupt(pid) {
            eprintln!("colo train: could not pass the interrupt on to the controller (process {pid}): {e}");
        }
    })
    .context("colo train: installing the Ctrl-C handler")?;
    let status = child
        .wait()
        .with_context(|| format!("waiting for {what}"))?;
    match status.code() {
        Some(0) => Ok(false),
        Some(130) => Ok(true),
        _ => bail!("{what} failed ({status}); its error is above"),
    }
}
