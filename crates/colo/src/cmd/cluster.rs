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

/// The environment's Python, for `module`, or an error saying how to set
/// it up.
fn python_for(module: &str) -> Result<Command> {
    let py = python();
    if !py.is_file() {
        bail!(
            "{module} runs on Ray through colo's Python package, but there is no Python \
             environment at {} (run ./x once: it installs torch, Ray and colo-py)",
            py.display()
        );
    }
    let mut cmd = Command::new(py);
    cmd.args(["-W", "ignore"]);
    Ok(cmd)
}

/// The environment's Python running `module`.
fn python_command(module: &str) -> Result<Command> {
    let mut cmd = python_for(module)?;
    cmd.args(["-m", module]);
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

/// The controller's start: `colo.controller` run as `__main__`, after a
/// SIGINT handler that ends the process quietly with status 130 while it
/// imports torch and Ray (a second Ctrl-C that early), until the
/// controller installs its own.
const CONTROLLER_MAIN: &str = "import runpy, signal, sys\n\
def _early(*_):\n    \
    sys.stderr.write('colo train: stopped now, before the run had started\\n')\n    \
    sys.exit(130)\n\
signal.signal(signal.SIGINT, _early)\n\
runpy.run_module('colo.controller', run_name='__main__', alter_sys=True)\n";

/// The file in the run directory whose existence asks the distributed run
/// to stop after the step under way (the controller's `--stop-file`).
const STOP_FILE: &str = ".colo-stop";

/// Runs the controller for `config_path`'s run into `out` and waits;
/// `Ok(true)` when the run stopped at the user's request (the controller
/// has said after which step, and how to resume).
///
/// Ctrl-C (and SIGTERM, SIGHUP) reach `colo` only: the controller runs in
/// a process group of its own, so the terminal's SIGINT reaches neither it
/// nor the Ray processes it starts. The first signal writes the stop file,
/// which the controller reads between steps and the workers between
/// generation batches, even while the controller is still starting; the
/// run stops after the step under way, with a checkpoint. The second sends
/// the controller SIGINT: it kills its workers and shuts down the Ray it
/// started, ignoring further signals while it does (while it is still
/// importing torch and Ray, [`CONTROLLER_MAIN`] makes it exit quietly).
pub fn run(config_path: &Path, config: &Config, out: &Path, resume: bool) -> Result<bool> {
    use std::os::unix::process::CommandExt;

    let stop_file = out.join(STOP_FILE);
    std::fs::create_dir_all(out).with_context(|| format!("making {}", out.display()))?;
    if stop_file.exists() {
        std::fs::remove_file(&stop_file)
            .with_context(|| format!("removing an earlier run's {}", stop_file.display()))?;
    }
    let mut cmd = python_for("colo.controller")?;
    cmd.args(["-c", CONTROLLER_MAIN])
        .arg("--config")
        .arg(config_path)
        .arg("--out")
        .arg(out)
        .arg("--workers")
        .arg(config.cluster.workers().to_string())
        .arg("--stop-file")
        .arg(&stop_file);
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
    let file = stop_file.clone();
    let mut seen = 0usize;
    ctrlc::set_handler(move || {
        seen += 1;
        match seen {
            1 => match std::fs::write(&file, b"") {
                Ok(()) => eprintln!(
                    "\ncolo train: stopping after the step under way, with a checkpoint \
                 (interrupt again to stop at once)"
                ),
                Err(e) => eprintln!("\ncolo train: could not write {}: {e}", file.display()),
            },
            2 => {
                if let Err(e) = colo_mem::os::signal(pid, colo_mem::os::Signal::Interrupt) {
                    eprintln!("colo train: could not stop the controller (process {pid}): {e}");
                }
            }
            _ => eprintln!("colo train: already stopping (shutting the run's processes down)"),
        }
    })
    .context("colo train: installing the Ctrl-C handler")?;
    let status = child
        .wait()
        .with_context(|| format!("waiting for {what}"))?;
    let _ = std::fs::remove_file(&stop_file);
    match status.code() {
        Some(0) => Ok(false),
        Some(130) => Ok(true),
        _ => bail!("{what} failed ({status}); its error is above"),
    }
}
