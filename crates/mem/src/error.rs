//! The crate's error type. Every message names the thing (tag, address,
//! request) and the state it was found in.

use std::fmt;

/// Lifecycle state of a tag, as reported in errors and statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TagState {
    /// Physical memory is mapped; buffers can be used and allocated.
    Active,
    /// Physical memory is released; the addresses stay reserved.
    Paused,
    /// A `pause` is copying backups and unmapping (another thread's call).
    Pausing,
    /// A `resume` is mapping and restoring (another thread's call).
    Resuming,
}

impl fmt::Display for TagState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TagState::Active => "active",
            TagState::Paused => "paused",
            TagState::Pausing => "being paused",
            TagState::Resuming => "being resumed",
        })
    }
}

/// Resident bytes of one tag, carried by out-of-memory errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagBytes {
    pub tag: String,
    pub bytes: u64,
}

/// Formats `[weights: 1.0 MiB, kv_cache: 0 B]`.
pub(crate) struct PerTag<'a>(pub &'a [TagBytes]);

impl fmt::Display for PerTag<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}: {}", t.tag, crate::fmt_bytes(t.bytes))?;
        }
        f.write_str("]")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "out of device memory in phase `{phase}`: {op} of {} for tag `{tag}` would exceed the capacity of {} \
         ({} resident; per tag {})",
        crate::fmt_bytes(*requested), crate::fmt_bytes(*capacity), crate::fmt_bytes(*resident),
        PerTag(per_tag)
    )]
    OutOfMemory {
        phase: String,
        op: &'static str,
        tag: String,
        requested: u64,
        capacity: u64,
        resident: u64,
        per_tag: Vec<TagBytes>,
    },

    #[error("cannot {op} tag `{tag}`: it is {state}")]
    TagState {
        op: &'static str,
        tag: String,
        state: TagState,
    },

    #[error(
        "cannot {op} tag `{tag}`: {regions} region(s) are open on it (on this or another thread); \
         close them (drop their guards) first"
    )]
    RegionOpen {
        op: &'static str,
        tag: String,
        regions: u32,
    },
    #[error("cannot {op} tag `{tag}`: no such tag in this pool (known tags: {known})")]
    UnknownTag {
        op: &'static str,
        tag: String,
        known: String,
    },

    #[error("cannot {op} address {addr:#x}: it is not a live allocation of this pool")]
    UnknownAddress { op: &'static str, addr: u64 },

    #[error("cannot set the policy of tag `{tag}` while it is {state}")]
    PolicyChange { tag: String, state: TagState },

    #[error("tag `{tag}` appears twice in one {op} call")]
    DuplicateTag { op: &'static str, tag: String },

    #[error("invalid request: {0}")]
    Invalid(String),

    #[error("address space of the pool is exhausted: {requested} bytes requested, {reserved} reserved in all")]
    AddressSpace { requested: u64, reserved: u64 },

    #[error("`region` needs colo-mem to be libtorch's CPU allocator, but libtorch kept another one (was a higher-priority allocator registered?)")]
    AllocatorNotInstalled,

    #[error("too many pools serve regions in this process (at most {0})")]
    TooManyRegionPools(usize),

    #[error("{backend} backend: {call} failed: {msg}")]
    Backend {
        backend: &'static str,
        call: &'static str,
        msg: String,
    },

    #[error("i/o error on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A backend error from the last OS error (`errno`).
    pub(crate) fn os(backend: &'static str, call: &'static str) -> Self {
        Error::Backend {
            backend,
            call,
            msg: std::io::Error::last_os_error().to_string(),
        }
    }
}
