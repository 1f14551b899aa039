//! The one way into the C++ side: a call that reports failure as a status
//! and a message written into a buffer it is given (`csrc/shim_error.h`).

use std::ffi::{c_char, CStr};

use crate::{Error, Result};

/// `csrc/shim_error.h`'s `kRefused`: the kernel's own checks failed.
const REFUSED: i32 = 2;

/// Runs `f`, a shim call given a message buffer and its length, and turns
/// its status into a `Result` naming `kernel`.
pub(crate) fn call(kernel: &'static str, f: impl FnOnce(*mut c_char, usize) -> i32) -> Result<()> {
    let mut err = [0 as c_char; 512];
    let status = f(err.as_mut_ptr(), err.len());
    if status == 0 {
        return Ok(());
    }
    // SAFETY: the shim wrote a NUL-terminated message into the buffer
    // before returning a nonzero status (`colo_shim::fail`); the buffer was
    // zeroed, so it is NUL-terminated even if it did not.
    let msg = unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Err(match status {
        REFUSED => Error::Refused { kernel, msg },
        _ => Error::Libtorch { kernel, msg },
    })
}
