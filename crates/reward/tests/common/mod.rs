//! Helpers shared by the integration tests (each uses a part of them).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("colo-reward-{name}-"))
            .tempdir()
            .unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Writes `text` to the file `name` in it; its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}
