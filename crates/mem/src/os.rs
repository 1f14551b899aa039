//! What the operating system says about this process's memory, for
//! checking the pool's own bookkeeping (`/proc/self/status`, `smaps`,
//! `maps`). Linux only.

use crate::{Error, Result};

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.into(),
        source,
    })
}

/// A `Field:   123 kB` line of a `/proc` file, in bytes.
fn kb_field(path: &str, field: &str) -> Result<u64> {
    let text = read(path)?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':').map(str::trim))
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| Error::Invalid(format!("no field `{field}` in {path}")))
}

/// A `kB` field of `/proc/self/status` (`VmRSS`, `RssShmem`, …), in bytes.
pub fn status_bytes(field: &str) -> Result<u64> {
    kb_field("/proc/self/status", field)
}

/// The machine's memory (`MemTotal` of `/proc/meminfo`): on the host
/// backend, the size of the "device".
pub fn machine_memory_bytes() -> Result<u64> {
    kb_field("/proc/meminfo", "MemTotal")
}

/// The process's resident set size (`VmRSS`).
pub fn resident_bytes() -> Result<u64> {
    status_bytes("VmRSS")
}

/// Resident bytes of the mappings that lie inside `start..start+len`, summed
/// from `/proc/self/smaps`. This isolates one pool's memory from the rest of
/// the process.
pub fn resident_in_range(start: u64, len: u64) -> Result<u64> {
    let text = read("/proc/self/smaps")?;
    let end = start + len;
    let mut inside = false;
    let mut total = 0;
    for line in text.lines() {
        if let Some((lo, hi)) = mapping_range(line) {
            inside = lo >= start && hi <= end;
        } else if inside {
            if let Some(v) = line.strip_prefix("Rss:") {
                total += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0)
                    * 1024;
            }
        }
    }
    Ok(total)
}

/// Number of mappings of the process (lines of `/proc/self/maps`).
pub fn mapping_count() -> Result<usize> {
    Ok(read("/proc/self/maps")?.lines().count())
}

/// `lo-hi` at the start of a maps/smaps header line.
fn mapping_range(line: &str) -> Option<(u64, u64)> {
    let first = line.split_whitespace().next()?;
    let (lo, hi) = first.split_once('-')?;
    Some((
        u64::from_str_radix(lo, 16).ok()?,
        u64::from_str_radix(hi, 16).ok()?,
    ))
}

/// Ends the process at once with `code`, running no exit handlers: what a
/// second Ctrl-C does. `std::process::exit` runs the C library's `atexit`
/// handlers and static destructors (libtorch's among them) while other
/// threads may still be inside libtorch, which then crashes or panics on
/// freed state; the checkpoints already written are complete files and
/// need no handler.
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` takes any status and never returns; it only ends the
    // process (the kernel reclaims its memory and descriptors), touching
    // no memory of this process.
    unsafe { libc::_exit(code) }
}

/// A signal [`signal`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT, what Ctrl-C sends.
    Interrupt,
    /// SIGTERM, a request to end.
    Terminate,
}

impl Signal {
    /// Its number, as `ExitStatus::signal` reports it.
    pub fn number(self) -> i32 {
        match self {
            Signal::Interrupt => libc::SIGINT,
            Signal::Terminate => libc::SIGTERM,
        }
    }
}

/// Sends `sig` to the process `pid`: how `colo train` tells the
/// distributed run's controller, which runs in its own process group (so
/// that the terminal's Ctrl-C reaches only `colo`), to stop at once.
pub fn signal(pid: u32, sig: Signal) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| std::io::Error::other(format!("{pid} is not a process id")))?;
    let sig = sig.number();
    // SAFETY: `kill` reads only its two integer arguments; `pid` is
    // positive, so it names one process (never a group or every process).
    match unsafe { libc::kill(pid, sig) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_header_lines_only() {
        assert_eq!(
            mapping_range("7f00-7f10 rw-s 00000000 00:01 5 /memfd:colo"),
            Some((0x7f00, 0x7f10))
        );
        assert_eq!(mapping_range("Rss:                 4 kB"), None);
    }

    #[test]
    fn a_signal_reaches_a_child_and_non_processes_are_refused() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        signal(child.id(), Signal::Terminate).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
        let int = Signal::Interrupt;
        assert!(
            signal(0, int).is_err(),
            "0 would be the whole process group"
        );
        assert!(signal(u32::MAX, int).is_err(), "-1 would be every process");
    }

    #[test]
    fn the_machine_has_more_memory_than_this_process_uses() {
        assert!(machine_memory_bytes().unwrap() > resident_bytes().unwrap());
    }

    #[test]
    fn rss_grows_when_pages_are_touched() {
        let before = resident_bytes().unwrap();
        // black_box: an optimised build may otherwise drop the unused
        // buffer, allocation and all.
        let v = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = resident_bytes().unwrap();
        assert!(after >= before + (60 << 20), "rss {before} -> {after}");
        drop(v);
    }
}
