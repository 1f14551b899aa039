//! A sharded trainer's part of a checkpoint, read by byte range: each
//! peer reads from the safetensors files only the elements of its own flat
//! shards (see [`crate::sharding`]) and copies them into its shards a chunk
//! at a time, so no peer holds more of the checkpoint than one chunk.
//!
//! A parameter's elements come from one of two layouts:
//!
//! - **named**: one tensor a parameter (`model.safetensors`, an unsharded
//!   trainer's `optimizer.safetensors`: `{name}`, `{name}.exp_avg`, …);
//! - **flat**: a sharded trainer's `optimizer-rank-R-of-N.safetensors`
//!   files, each holding its flat shard of every saved unit
//!   (`unit.U.exp_avg`, …) as `optimizer_shards.json` lays them out. Element
//!   `q` of a saved unit lies in file `q / s` at `q % s`, `s` the saved
//!   shard length, whatever the number of peers or the padding that wrote
//!   them.
//!
//! Files are read with positioned reads (`pread`), not mapped: the
//! workspace keeps `unsafe` in its FFI crates. A file's header is parsed
//! and checked (by the `safetensors` crate) and its length held against it
//! when it is opened.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::tensor::Metadata;
use safetensors::Dtype;
use tch::{Kind, Tensor};

use crate::checkpoint::OPTIMIZER_FILE;
use crate::optimizer_shards::{ShardLayout, OPTIMIZER_SHARDS_FILE};
use crate::{Error, Result};

/// Elements read and copied at a time: the loader's buffer is at most
/// this many elements of the file's dtype (16 MiB of float32), and its
/// tensor copy as much again.
pub(crate) const CHUNK: usize = 1 << 22;

/// The longest header read (the `safetensors` crate's own limit).
const MAX_HEADER: u64 = 100_000_000;

/// What a sharded load read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardRead {
    /// Bytes of tensor data read from the checkpoint's files (headers
    /// not counted): this peer's elements of the weights and of the
    /// optimizer state.
    pub bytes_read: u64,
    /// Bytes of tensor data the files read from hold: what reading them
    /// whole would have taken.
    pub file_bytes: u64,
    /// The most bytes the loader held at once: a chunk as read and its
    /// tensor copy.
    pub peak_bytes: u64,
}

/// A safetensors file opened for reads by range.
struct Ranged {
    path: PathBuf,
    file: File,
    /// Where the tensor data starts: after the length and the header.
    data_start: u64,
    meta: Metadata,
}

impl Ranged {
    /// Opens `path`, reading its header only.
    fn open(path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::CheckpointState {
            path: path.to_owned(),
            reason,
        };
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => bad("missing file".into()),
            _ => Error::io(path, e),
        })?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut n = [0u8; 8];
        file.read_exact_at(&mut n, 0)
            .map_err(|_| bad("shorter than a safetensors header".into()))?;
        let n = u64::from_le_bytes(n);
        let data_start = (n.checked_add(8))
            .filter(|&s| s <= len && n <= MAX_HEADER)
            .ok_or_else(|| {
                bad(format!(
                    "its header claims {n} bytes, more than the file's {len}"
                ))
            })?;
        let mut header = vec![0u8; n as usize];
        file.read_exact_at(&mut header, 8)
            .map_err(|e| Error::io(path, e))?;
        let meta: Metadata = serde_json::from_slice(&header)
            .map_err(|e| bad(format!("unreadable safetensors header: {e}")))?;
        let want = (data_start.checked_add(meta.data_len() as u64))
            .ok_or_else(|| bad("its header describes more bytes than a file can hold".into()))?;
        if want != len {
            return Err(bad(format!(
                "its header describes {want} bytes, the file holds {len}: cut short or damaged"
            )));
        }
        Ok(Ranged {
            path: path.to_owned(),
            file,
            data_start,
            meta,
        })
    }

    fn data_bytes(&self) -> u64 {
        self.meta.data_len() as u64
    }

    /// Tensor `key`'s dtype as a kind, its shape and the byte offset of
    /// its data; an error naming it when it is missing or not of floats.
    fn tensor(&self, key: &str) -> Result<(Kind, Vec<usize>, u64)> {
        let info = self
            .meta
            .info(key)
            .ok_or_else(|| Error::CheckpointMissing {
                path: self.path.clone(),
                name: key.to_owned(),
            })?;
        let kind = match info.dtype {
            Dtype::F32 => Kind::Float,
            Dtype::BF16 => Kind::BFloat16,
            Dtype::F16 => Kind::Half,
            Dtype::F64 => Kind::Double,
            other => {
                return Err(Error::CheckpointState {
                    path: self.path.clone(),
                    reason: format!("tensor `{key}` is {other}, expected F32, BF16, F16 or F64"),
                })
            }
        };
        Ok((kind, info.shape.clone(), info.data_offsets.0 as u64))
    }
}

/// Elements `elem..elem + len` of tensor `key` in file `file`, of `kind`,
/// whose data starts at byte `at` of the file's data.
#[derive(Debug, Clone)]
pub(crate) struct Span {
    file: usize,
    key: String,
    kind: Kind,
    at: u64,
    elem: usize,
    len: usize,
}

/// Where a parameter's elements lie in a checkpoint's files.
enum Layout {
    /// One tensor a parameter, `{name}` or `{name}.{what}`, in whichever
    /// of the files holds it (one file, or the shards a
    /// `model.safetensors.index.json` names).
    Named,
    /// A sharded optimizer state: each parameter's saved unit, its offset
    /// in it and its shape; `shard` elements of each unit a file.
    Flat {
        at: HashMap<String, (usize, usize, Vec<usize>)>,
        shard: Vec<usize>,
    },
}

/// Reads parameters' elements, by range, out of a checkpoint's files.
pub(crate) struct SliceReader {
    files: Vec<Ranged>,
    layout: Layout,
    /// The file errors about the layout name.
    layout_path: PathBuf,
    pub(crate) read: ShardRead,
}

impl SliceReader {
    /// The weights of the checkpoint in `dir`: `model.safetensors`, or
    /// the files `model.safetensors.index.json` names when there is no
    /// such file (a Hugging Face checkpoint saved in shards).
    pub(crate) fn weights(dir: &Path) -> Result<Self> {
        use colo_model::weights::{weight_files, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
        let paths = weight_files(dir)?;
        if paths == [dir.join(WEIGHTS_FILE)] {
            return Self::named(&paths[0]);
        }
        let index = dir.join(WEIGHTS_INDEX_FILE);
        let files = (paths.iter())
            .map(|f| Ranged::open(f))
            .collect::<Result<Vec<_>>>()?;
        // A tensor in two shards is refused, as colo-model's whole load
        // refuses it: which one holds it would be a guess.
        let mut holder: HashMap<String, &Path> = HashMap::new();
        for f in &files {
            for name in f.meta.tensors().into_keys() {
                if let Some(first) = holder.insert(name.clone(), &f.path) {
                    return Err(Error::CheckpointState {
                        path: f.path.clone(),
                        reason: format!(
                            "`{name}` is also in {}: which shard holds it is ambiguous",
                            first.display()
                        ),
                    });
                }
            }
        }
        Ok(SliceReader {
            read: ShardRead {
                file_bytes: files.iter().map(Ranged::data_bytes).sum(),
                ..Default::default()
            },
            files,
            layout: Layout::Named,
            layout_path: index,
        })
    }

    /// The optimizer state of the checkpoint in `dir`: an unsharded
    /// trainer's `optimizer.safetensors` when there is one, else a sharded
    /// trainer's files as `optimizer_shards.json` lays them out.
    pub(crate) fn optimizer(dir: &Path) -> Result<Self> {
        let whole = dir.join(OPTIMIZER_FILE);
        if whole.exists() || !dir.join(OPTIMIZER_SHARDS_FILE).exists() {
            return Self::named(&whole);
        }
        let layout = ShardLayout::read(dir)?;
        let files = (layout.files(dir).iter())
            .map(|f| Ranged::open(f))
            .collect::<Result<Vec<_>>>()?;
        let mut at = HashMap::new();
        let mut shard = Vec::with_capacity(layout.units.len());
        for (u, unit) in layout.units.iter().enumerate() {
            let mut offset = 0usize;
            for (name, shape) in unit.params.iter().zip(&unit.shapes) {
                // (`ShardLayout::read` refused negative dimensions and sizes
                // past i64; the sums are checked all the same.)
                let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
                let numel = (shape.iter()).try_fold(1usize, |a, &d| a.checked_mul(d));
                at.insert(name.clone(), (u, offset, shape));
                offset = numel
                    .and_then(|n| offset.checked_add(n))
                    .ok_or_else(|| too_large(&dir.join(OPTIMIZER_SHARDS_FILE)))?;
            }
            shard.push((unit.padded / layout.world as i64) as usize);
        }
        let mut reader = SliceReader {
            files,
            layout: Layout::Flat { at, shard },
            layout_path: dir.join(OPTIMIZER_SHARDS_FILE),
            read: ShardRead::default(),
        };
        reader.read.file_bytes = reader.files.iter().map(Ranged::data_bytes).sum();
        Ok(reader)
    }

    fn named(path: &Path) -> Result<Self> {
        let file = Ranged::open(path)?;
        Ok(SliceReader {
            read: ShardRead {
                file_bytes: file.data_bytes(),
                ..Default::default()
            },
            files: vec![file],
            layout: Layout::Named,
            layout_path: path.to_owned(),
        })
    }

    /// Whether the checkpoint holds `what` (`""` for the weight itself,
    /// `exp_avg`, `exp_avg_sq`, `master`) of parameter `name`.
    pub(crate) fn has(&self, name: &str, what: &str) -> bool {
        match &self.layout {
            Layout::Named => self.holder(&named_key(name, what)).is_some(),
            Layout::Flat { at, .. } => at.get(name).is_some_and(|(u, _, _)| {
                let key = format!("unit.{u}.{what}");
                self.files.iter().any(|f| f.meta.info(&key).is_some())
            }),
        }
    }

    /// Where elements `start..start + len` of parameter `name`'s `what`
    /// (a parameter of `shape`) lie, checked against the files' headers.
    pub(crate) fn locate(
        &self,
        name: &str,
        what: &str,
        shape: &[i64],
        start: usize,
        len: usize,
    ) -> Result<Vec<Span>> {
        let expected: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let wrong_shape = |path: &Path, found: Vec<usize>| Error::CheckpointShape {
            path: path.to_owned(),
            name: named_key(name, what),
            expected: expected.clone(),
            found,
        };
        match &self.layout {
            Layout::Named => {
                let key = named_key(name, what);
                let file = self.holder(&key).ok_or_else(|| Error::CheckpointMissing {
                    path: self.layout_path.clone(),
                    name: key.clone(),
                })?;
                let (kind, found, at) = self.files[file].tensor(&key)?;
                if found != expected {
                    return Err(wrong_shape(&self.files[file].path, found));
                }
                Ok(vec![Span {
                    file,
                    key,
                    kind,
                    at,
                    elem: start,
                    len,
                }])
            }
            Layout::Flat { at, shard } => {
                let Some((u, offset, found)) = at.get(name) else {
                    return Err(Error::CheckpointMissing {
                        path: self.layout_path.clone(),
                        name: named_key(name, what),
                    });
                };
                if *found != expected {
                    return Err(wrong_shape(&self.layout_path, found.clone()));
                }
                let (s, key) = (shard[*u], format!("unit.{u}.{what}"));
                let mut spans = Vec::new();
                let q_end =
                    (offset.checked_add(start)).and_then(|q| Some((q, q.checked_add(len)?)));
                let (mut q, end) = q_end.ok_or_else(|| too_large(&self.layout_path))?;
                while q < end {
                    let (file, elem) = (q / s, q % s);
                    let take = (s - elem).min(end - q);
                    let f = &self.files[file];
                    let (kind, found, at) = f.tensor(&key)?;
                    if found != [s] {
                        return Err(Error::CheckpointState {
                            path: f.path.clone(),
                            reason: format!(
                                "`{key}` has shape {found:?}, expected a flat tensor of {s} \
                                 elements (`{}`)",
                                OPTIMIZER_SHARDS_FILE
                            ),
                        });
                    }
                    spans.push(Span {
                        file,
                        key: key.clone(),
                        kind,
                        at,
                        elem,
                        len: take,
                    });
                    q += take;
                }
                Ok(spans)
            }
        }
    }

    /// The first of the files that holds tensor `key`.
    fn holder(&self, key: &str) -> Option<usize> {
        (self.files.iter()).position(|f| f.meta.info(key).is_some())
    }

    /// Reads `spans` one after the other into `dst` (1-D, as many elements
    /// as the spans hold), a chunk at a time, converting to `dst`'s kind.
    /// A non-finite value is an error naming the tensor: training never
    /// writes one, so the file is damaged.
    pub(crate) fn copy(&mut self, spans: &[Span], dst: &Tensor) -> Result<()> {
        let mut to = 0i64;
        for span in spans {
            let f = &self.files[span.file];
            let elt = span.kind.elt_size_in_bytes();
            let mut done = 0usize;
            while done < span.len {
                let take = (span.len - done).min(CHUNK);
                let bytes = take.checked_mul(elt).ok_or_else(|| too_large(&f.path))?;
                let mut buf = vec![0u8; bytes];
                let offset = (span.elem.checked_add(done))
                    .and_then(|e| e.checked_mul(elt))
                    .and_then(|e| f.data_start.checked_add(span.at)?.checked_add(e as u64))
                    .ok_or_else(|| too_large(&f.path))?;
                f.file
                    .read_exact_at(&mut buf, offset)
                    .map_err(|e| Error::io(&f.path, e))?;
                let t = Tensor::f_from_data_size(&buf, &[take as i64], span.kind)?;
                let bytes = buf.len() as u64;
                self.read.bytes_read += bytes;
                self.read.peak_bytes = self.read.peak_bytes.max(2 * bytes);
                drop(buf);
                if !colo_model::weights::all_finite(&t)? {
                    return Err(Error::CheckpointState {
                        path: f.path.clone(),
                        reason: format!(
                            "tensor `{}` holds NaN or infinite values: the file is damaged or \
                             the training that wrote it diverged",
                            span.key
                        ),
                    });
                }
                dst.f_narrow(0, to, take as i64)?.f_copy_(&t)?;
                to += take as i64;
                done += take;
            }
        }
        Ok(())
    }
}

/// An offset or size past the integers' range: a damaged file or layout.
fn too_large(path: &Path) -> Error {
    Error::CheckpointState {
        path: path.to_owned(),
        reason: "an offset or size past what this machine's integers hold: the file is damaged"
            .into(),
    }
}

/// Parameter `name`'s tensor of `what` under its unsharded name.
fn named_key(name: &str, what: &str) -> String {
    match what {
        "" => name.to_owned(),
        _ => format!("{name}.{what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with `a` (2×3 bf16, 0..6) and `b` (5 float32, 10..15).
    fn file(dir: &Path) -> PathBuf {
        let path = dir.join("t.safetensors");
        let a = Tensor::arange(6, (Kind::BFloat16, tch::Device::Cpu)).view([2, 3]);
        let b = Tensor::arange_start(10, 15, (Kind::Float, tch::Device::Cpu));
        Tensor::write_safetensors(&[("a", a), ("b", b)], &path).unwrap();
        path
    }

    #[test]
    fn a_range_reads_only_its_bytes_in_the_kind_asked() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = SliceReader::named(&file(dir.path())).unwrap();
        assert_eq!(r.read.file_bytes, 6 * 2 + 5 * 4);
        let spans = r.locate("b", "", &[5], 1, 3).unwrap();
        let dst = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
        r.copy(&spans, &dst).unwrap();
        assert_eq!(Vec::<f32>::try_from(&dst).unwrap(), [11.0, 12.0, 13.0]);
        assert_eq!(r.read.bytes_read, 12);
        let spans = r.locate("a", "", &[2, 3], 4, 2).unwrap();
        let dst = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        r.copy(&spans, &dst).unwrap();
        assert_eq!(Vec::<f32>::try_from(&dst).unwrap(), [4.0, 5.0]);
        assert_eq!(r.read.bytes_read, 12 + 4);
        // A wrong shape or a missing tensor names it.
        let err = r.locate("a", "", &[3, 2], 0, 1).unwrap_err().to_string();
        assert!(err.contains("`a`"), "{err}");
        let err = r.locate("a", "exp_avg", &[2, 3], 0, 1).unwrap_err();
        assert!(err.to_string().contains("`a.exp_avg`"), "{err}");
    }

    /// The weight files are found as colo-model finds them: PyTorch's
    /// `pytorch_model.bin` alone is named, as is an empty directory's
    /// missing `model.safetensors`.
    #[test]
    fn weights_without_safetensors_are_refused_saying_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let err = SliceReader::weights(dir.path()).err().unwrap().to_string();
        assert!(err.contains("model.safetensors"), "{err}");
        std::fs::write(dir.path().join("pytorch_model.bin"), b"").unwrap();
        let err = SliceReader::weights(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("pytorch_model.bin") && err.contains("safe_serialization"),
            "{err}"
        );
    }

    /// A tensor two shards of a split checkpoint both hold is refused,
    /// naming it and both files.
    #[test]
    fn a_tensor_in_two_shards_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let t = || Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        let (a, b) = ("model-1.safetensors", "model-2.safetensors");
        Tensor::write_safetensors(&[("x", t()), ("y", t())], dir.path().join(a)).unwrap();
        Tensor::write_safetensors(&[("y", t())], dir.path().join(b)).unwrap();
        let index = format!(r#"{{"weight_map": {{"x": "{a}", "y": "{b}"}}}}"#);
        std::fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();
        let err = SliceReader::weights(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("`y`") && err.contains(a) && err.contains(b),
            "{err}"
        );
    }

    #[test]
    fn a_file_cut_short_or_holding_nan_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path());
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let err = SliceReader::named(&path).err().unwrap().to_string();
        assert!(err.contains("cut short"), "{err}");
        let nan = Tensor::from_slice(&[1.0f32, f32::NAN]);
        Tensor::write_safetensors(&[("c", nan)], &path).unwrap();
        let mut r = SliceReader::named(&path).unwrap();
        let spans = r.locate("c", "", &[2], 0, 2).unwrap();
        let dst = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        let err = r.copy(&spans, &dst).unwrap_err().to_string();
        assert!(err.contains("`c`") && err.contains("NaN"), "{err}");
    }

    #[test]
    fn a_range_across_shard_files_reads_each_part_and_a_wrong_length_is_refused() {
        use crate::optimizer_shards::{shard_file, UnitLayout};
        let dir = tempfile::tempdir().unwrap();
        let layout = ShardLayout {
            world: 2,
            units: vec![UnitLayout {
                params: vec!["p".into()],
                shapes: vec![vec![5]],
                padded: 6,
            }],
        };
        let json = serde_json::to_string(&layout).unwrap();
        std::fs::write(dir.path().join(OPTIMIZER_SHARDS_FILE), json).unwrap();
        let write = |rank: i64, len: i64| {
            let t = Tensor::arange_start(3 * rank, 3 * rank + len, (Kind::Float, tch::Device::Cpu));
            let path = dir.path().join(shard_file(rank as usize, 2));
            Tensor::write_safetensors(&[("unit.0.exp_avg", t)], path).unwrap();
        };
        write(0, 3);
        write(1, 3);
        let mut r = SliceReader::optimizer(dir.path()).unwrap();
        assert!(r.has("p", "exp_avg") && !r.has("p", "master") && !r.has("q", "exp_avg"));
        // Elements 2..5 of `p`: the last of file 0, the first two of file 1.
        let spans = r.locate("p", "exp_avg", &[5], 2, 3).unwrap();
        assert_eq!(spans.len(), 2);
        let dst = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
        r.copy(&spans, &dst).unwrap();
        assert_eq!(Vec::<f32>::try_from(&dst).unwrap(), [2.0, 3.0, 4.0]);
        assert_eq!(r.read.bytes_read, 12);
        write(1, 4);
        let r = SliceReader::optimizer(dir.path()).unwrap();
        let err = r
            .locate("p", "exp_avg", &[5], 2, 3)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("optimizer-rank-1-of-2") && err.contains("flat tensor of 3"),
            "{err}"
        );
        let err = r
            .locate("p", "exp_avg", &[6], 0, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`p.exp_avg`"), "{err}");
    }
}
