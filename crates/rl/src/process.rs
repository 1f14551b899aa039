//! What colo sets for the whole process, in one place: the program that
//! hosts colo calls [`init`] and [`init_logging`] once at its start (the
//! `colo` binary in `main`; colo-py when a rank's worker is made, and its
//! logger when the module is imported). No library constructor sets
//! process-wide state: each of these is a choice for every thread and
//! every engine in the process, so it is made before any of them exists.

use std::sync::OnceLock;

/// Sets the process-wide state colo's CPU passes rely on:
///
/// - **One libtorch intra-op thread.** Every pass splits its rows over
///   lanes of its own, each running libtorch with one intra-op thread
///   ([`colo_model::lanes`] says why lanes beat intra-op threads).
///   libtorch's count is process-wide: set once here, no pass flips it
///   back and forth (a pass that read a count changing under it would
///   split its reductions differently and lose bit-for-bit repeatability).
/// - **The lane threads started.** One thread per lane of the process's
///   share of the machine ([`colo_model::lanes::count`]), made now rather
///   than inside the first pass; a run that asks for more lanes than the
///   share gets a larger pool when it first does.
/// - **libtorch's default kept** ([`default_intra_op_threads`]), for the
///   baselines measured at it.
/// - **The CPU's features read.** `/proc/cpuinfo`, once, for
///   `dtype = "auto"` ([`cpu_has_bf16`]).
///
/// Calling it again does nothing more.
pub fn init() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        default_intra_op_threads();
        tch::set_num_threads(1);
        colo_model::lanes::start(colo_model::lanes::count(tch::Device::Cpu, 0));
        cpu_has_bf16();
    });
}

/// libtorch's own intra-op thread count, as it was before [`init`] set
/// it to 1 (`OMP_NUM_THREADS`, else the cores): for a baseline measured
/// at libtorch's default (`colo bench rollout`).
pub fn default_intra_op_threads() -> i32 {
    static DEFAULT: OnceLock<i32> = OnceLock::new();
    *DEFAULT.get_or_init(tch::get_num_threads)
}

/// Whether this machine's CPU multiplies bf16 in hardware: its flags in
/// `/proc/cpuinfo` include `avx512_bf16` or `amx_bf16`. Read once, on the
/// first call ([`init`] makes it); false where the file cannot be read.
pub fn cpu_has_bf16() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| cpu_flags_have_bf16(&info))
    })
}

/// `/proc/cpuinfo`'s first `flags` line names a bf16 matrix instruction set.
pub(crate) fn cpu_flags_have_bf16(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("flags")
                .and_then(|r| r.trim_start().strip_prefix(':'))
        })
        .is_some_and(|flags| {
            flags
                .split_whitespace()
                .any(|f| f == "avx512_bf16" || f == "amx_bf16")
        })
}

/// The variable that filters [`init_logging`]'s messages.
pub const LOG_ENV: &str = "COLO_LOG";

/// Where colo's diagnostics go (the crates log through `log`: a
/// checkpoint's unused tensors, a failed unmap, a gradient that was not
/// finite): stderr, one line each, `colo: warning: …`. Warnings and errors
/// by default; [`LOG_ENV`] takes env_logger's filters (`COLO_LOG=debug`,
/// `COLO_LOG=colo_mem=debug`, `COLO_LOG=off`). A logger already installed
/// in the process (a host's own) is left in place.
///
/// The run's own console lines (where it starts, its progress) are not
/// diagnostics: [`crate::progress::say`] prints them at every level.
pub fn init_logging() {
    use std::io::Write;
    let _ = env_logger::Builder::new()
        .filter_level(log::LevelFilter::Warn)
        .parse_env(env_logger::Env::new().filter(LOG_ENV))
        .format(|out, record| writeln!(out, "{}", log_line(record)))
        .try_init();
}

/// One diagnostic as colo prints it: `colo: warning: the message`.
fn log_line(record: &log::Record) -> String {
    let level = match record.level() {
        log::Level::Error => "error",
        log::Level::Warn => "warning",
        log::Level::Info => "info",
        log::Level::Debug => "debug",
        log::Level::Trace => "trace",
    };
    format!("colo: {level}: {}", record.args())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_flags_are_read_from_the_flags_line() {
        let zen4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\nbugs\t\t: sysret_ss_attrs\n";
        let spr = "flags\t\t: avx512f amx_bf16 amx_tile amx_int8\n";
        let skylake =
            "flags\t\t: fpu avx2 avx512f avx512bw\nbugs\t\t: avx512_bf16_is_not_a_flag_here\n";
        assert!(cpu_flags_have_bf16(zen4));
        assert!(cpu_flags_have_bf16(spr));
        assert!(!cpu_flags_have_bf16(skylake));
        assert!(!cpu_flags_have_bf16(""));
    }

    #[test]
    fn a_diagnostic_is_one_line_naming_its_level() {
        let line = log_line(
            &log::Record::builder()
                .level(log::Level::Warn)
                .args(format_args!("the pictures were not written"))
                .build(),
        );
        assert_eq!(line, "colo: warning: the pictures were not written");
    }
}
