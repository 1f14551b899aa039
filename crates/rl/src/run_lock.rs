//! One run at a time in a run directory. A run holds an exclusive lock on
//! `DIR/.colo.lock` from before it reads the directory until it ends, so a
//! second run into the same directory (the same command in another
//! terminal, started before the first has written a step) is refused at
//! once, naming the directory, instead of both writing its checkpoints and
//! `metrics.jsonl`; and `colo train` without `--out` skips a default
//! directory in use for the next free one. The operating system drops the
//! lock with the process, so a killed run leaves none behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use crate::{Error, Result};

/// The lock file's name in a run directory.
pub const FILE: &str = ".colo.lock";

/// A held lock; dropping it releases the directory.
#[derive(Debug)]
pub struct RunLock {
    _file: Option<File>,
}

/// Locks the run directory `out` (which exists). A file system without
/// locks (some network mounts) is said on stderr and runs unguarded.
pub fn lock(out: &Path) -> Result<RunLock> {
    let path = out.join(FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    // A lock just released may still be held for a moment: a process
    // another thread of this one is starting holds a copy of every open
    // file until it executes its program (seen once in CI: a test's second
    // run into a directory, right after its first, was refused). So a
    // busy lock is tried again for half a second before it counts.
    let mut tries = 0;
    let busy = loop {
        match file.try_lock() {
            Err(TryLockError::WouldBlock) if tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other,
        }
    };
    match busy {
        Ok(()) => Ok(RunLock { _file: Some(file) }),
        Err(TryLockError::WouldBlock) => Err(Error::RunInUse {
            dir: out.to_owned(),
        }),
        Err(TryLockError::Error(e)) => {
            log::warn!(
                "could not lock {} ({e}); nothing keeps a second run out of this directory",
                path.display()
            );
            Ok(RunLock { _file: None })
        }
    }
}

/// Whether a run holds `out`'s lock now.
pub fn in_use(out: &Path) -> bool {
    File::open(out.join(FILE)).is_ok_and(|f| matches!(f.try_lock(), Err(TryLockError::WouldBlock)))
}
