//! Named tensors in and out of safetensors files, single or sharded.
//!
//! Files are read into memory with the `safetensors` crate (no mmap: the
//! workspace keeps `unsafe` in its FFI crates, colo-mem and colo-kernels)
//! and each tensor is copied into a libtorch tensor, then moved to the
//! requested device and kind. Every failure names the file and, where one
//! is at fault, the tensor.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, View};
use tch::{Device, Kind, Tensor};

use crate::{Error, ModelConfig, Result};

/// The weights file of a single-file checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index that maps tensor names to shards in a sharded checkpoint.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// Tensors by their Hugging Face name, converted to one kind on one device.
///
/// The tensors are shared, not copied: [`Weights::get`] and
/// [`Weights::from_tensors`] hand out shallow clones of the same storage,
/// so a model built from a trainer's parameters uses those parameters.
#[derive(Debug, Default)]
pub struct Weights {
    tensors: HashMap<String, Tensor>,
    /// Tensors of the files that are not floating-point, with their dtype:
    /// left out of `tensors`, an error if asked for.
    not_float: HashMap<String, String>,
    /// The checkpoint directory they were read from, named in errors.
    dir: Option<PathBuf>,
}

impl Clone for Weights {
    /// Shares the tensors.
    fn clone(&self) -> Self {
        Weights {
            tensors: self
                .tensors
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
            not_float: self.not_float.clone(),
            dir: self.dir.clone(),
        }
    }
}

/// An error unless tensors can be placed on `device`: CUDA needs a GPU (and
/// the index to exist), MPS an Apple GPU.
pub fn check_device(device: Device) -> Result<()> {
    let unavailable = |reason: String| Err(Error::DeviceUnavailable { device, reason });
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(_) if !tch::Cuda::is_available() => {
            unavailable("libtorch sees no CUDA GPU (or was built without CUDA)".into())
        }
        Device::Cuda(i) if i as i64 >= tch::Cuda::device_count() => unavailable(format!(
            "only {} CUDA device(s) present",
            tch::Cuda::device_count()
        )),
        Device::Mps if !tch::utils::has_mps() => unavailable("no MPS device".into()),
        _ => Ok(()),
    }
}

impl Weights {
    /// Wraps tensors already in memory (for tests, or weights handed over
    /// from a trainer). They are used as they are: same storage, kind,
    /// device and `requires_grad`.
    pub fn from_tensors(tensors: HashMap<String, Tensor>) -> Self {
        Weights {
            tensors,
            ..Weights::default()
        }
    }

    /// Reads `model.safetensors`, or every shard that
    /// `model.safetensors.index.json` names, from a checkpoint directory,
    /// converting every tensor to `kind` on `device`.
    pub fn from_dir(dir: &Path, kind: Kind, device: Device) -> Result<Self> {
        check_device(device)?;
        let (mut tensors, mut not_float) = (HashMap::new(), HashMap::new());
        for file in weight_files(dir)? {
            read_safetensors(&file, kind, device, &mut tensors, &mut not_float)?;
        }
        Ok(Weights {
            tensors,
            not_float,
            dir: Some(dir.to_owned()),
        })
    }

    /// Freshly initialised weights for `cfg` (for tests, benchmarks and
    /// built-in toy models): matrices normal with standard deviation `std`
    /// as transformers' `initializer_range` (drawn from libtorch's global
    /// generator, `tch::manual_seed`), norms one, biases zero.
    pub fn random(cfg: &ModelConfig, std: f64, kind: Kind, device: Device) -> Result<Self> {
        check_device(device)?;
        let mut tensors = HashMap::new();
        for (name, shape) in cfg.parameter_shapes() {
            let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            let t = if name.ends_with("norm.weight") {
                Tensor::f_ones(&shape, (kind, device))?
            } else if name.ends_with(".bias") {
                Tensor::f_zeros(&shape, (kind, device))?
            } else {
                (Tensor::f_randn(&shape, (Kind::Float, device))? * std).f_to_kind(kind)?
            };
            tensors.insert(name, t);
        }
        Ok(Weights::from_tensors(tensors))
    }

    /// The tensor `name` (a shallow clone sharing its storage), which must
    /// have exactly `shape` (what the model's config implies).
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        if let Some(dtype) = self.not_float.get(name) {
            return Err(Error::NotFloat {
                name: name.to_owned(),
                dtype: dtype.clone(),
                checkpoint: self.dir.clone(),
            });
        }
        let t = self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
            checkpoint: self.dir.clone(),
        })?;
        let found: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        if found != shape {
            return Err(Error::ShapeMismatch {
                name: name.to_owned(),
                expected: shape.to_vec(),
                found,
                checkpoint: self.dir.clone(),
            });
        }
        Ok(t.shallow_clone())
    }

    /// Whether a tensor of this name is present.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name) || self.not_float.contains_key(name)
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

/// The tensors of a checkpoint read from files that a model of `cfg` does
/// not use, sorted; leaving out what transformers leaves out silently (a
/// tied head saved anyway, old checkpoints' rotary buffers).
pub fn unused(cfg: &ModelConfig, w: &Weights) -> Vec<String> {
    let used: BTreeSet<String> = cfg.parameter_shapes().into_iter().map(|(n, _)| n).collect();
    let ignored = |n: &str| {
        (n == "lm_head.weight" && cfg.tie_word_embeddings) || n.ends_with("rotary_emb.inv_freq")
    };
    let mut out: Vec<String> = (w.tensors.keys().chain(w.not_float.keys()))
        .filter(|n| !used.contains(*n) && !ignored(n))
        .cloned()
        .collect();
    out.sort_unstable();
    out
}

/// Warns once per checkpoint directory (`log::warn!`) which of its tensors a
/// model of `cfg` leaves unused (as transformers warns "Some weights of
/// the model checkpoint were not used"): a config.json with fewer layers
/// than its weights loads, but not the model the weights are.
pub(crate) fn warn_unused(cfg: &ModelConfig, w: &Weights) {
    static WARNED: std::sync::Mutex<BTreeSet<PathBuf>> = std::sync::Mutex::new(BTreeSet::new());
    let Some(dir) = &w.dir else { return };
    let names = unused(cfg, w);
    if names.is_empty() {
        return;
    }
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if !warned.insert(dir.clone()) {
        return;
    }
    let shown: Vec<&str> = names.iter().take(4).map(String::as_str).collect();
    let more = match names.len().saturating_sub(shown.len()) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    log::warn!(
        "{}: {} tensors of the checkpoint are not used by the model its config.json describes: {}{more}",
        dir.display(),
        names.len(),
        shown.join(", ")
    );
}

/// Reads every tensor of one safetensors file into `out`, as `kind` on
/// `device`.
fn read_safetensors(
    path: &Path,
    kind: Kind,
    device: Device,
    out: &mut HashMap<String, Tensor>,
    not_float: &mut HashMap<String, String>,
) -> Result<()> {
    let fail = |tensor: Option<&str>, reason: String| Error::Safetensors {
        path: path.to_owned(),
        tensor: tensor.map(str::to_owned),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| {
        let (tensor, reason) = diagnose(&bytes).unwrap_or((None, e.to_string()));
        fail(tensor.as_deref(), reason)
    })?;
    for (name, view) in file.tensors() {
        if out.contains_key(&name) || not_float.contains_key(&name) {
            return Err(fail(
                Some(&name),
                "is also in another shard of this checkpoint: which one holds it is ambiguous"
                    .into(),
            ));
        }
        let src_kind = match view.dtype() {
            Dtype::F32 => Kind::Float,
            Dtype::F16 => Kind::Half,
            Dtype::BF16 => Kind::BFloat16,
            Dtype::F64 => Kind::Double,
            // A model's weights are floating-point numbers: an integer or
            // boolean tensor is kept out, and asking for it is an error
            // (`Weights::get`), while an unused buffer does no harm.
            other => {
                not_float.insert(name, format!("{other:?}"));
                continue;
            }
        };
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let t = Tensor::f_from_data_size(view.data(), &shape, src_kind)
            .and_then(|t| t.f_to_device(device))
            .and_then(|t| t.f_to_kind(kind))
            .map_err(|e| fail(Some(&name), e.to_string()))?;
        let finite = all_finite(&t).map_err(|e| fail(Some(&name), e.to_string()))?;
        if !finite {
            let as_kind = match kind == src_kind {
                true => String::new(),
                false => format!(" (as {kind:?})"),
            };
            return Err(fail(
                Some(&name),
                format!("holds NaN or infinite values{as_kind}: the checkpoint is damaged or its training diverged"),
            ));
        }
        out.insert(name, t);
    }
    Ok(())
}

/// Whether every element of the floating-point tensor `t` is finite (no
/// NaN, no infinity): what loading checks of every weight.
///
/// A NaN or an infinity makes the sum non-finite: one reduction at memory
/// speed (15–21 GiB/s on two cores here, where `isfinite` and `all` ran at
/// 0.3–0.7 GiB/s, and a float64 sum at 0.4–0.9: ~1 s against ~30 s for a
/// 7 B bf16 model). Half sums in float32, beyond its 65,504. Finite values
/// near float32's limit can overflow the sum too, so a non-finite sum is
/// confirmed element by element.
pub fn all_finite(t: &Tensor) -> std::result::Result<bool, tch::TchError> {
    let sum_kind = (t.kind() == Kind::Half).then_some(Kind::Float);
    let sum = t.f_sum(sum_kind)?.f_double_value(&[])?;
    if sum.is_finite() {
        return Ok(true);
    }
    Ok(t.f_isfinite()?.f_all()?.f_int64_value(&[])? != 0)
}

/// Why a safetensors file that the `safetensors` crate refused is bad, in
/// the user's terms (which tensor, how many bytes), when its header can be
/// read; `None` leaves the crate's own message.
fn diagnose(bytes: &[u8]) -> Option<(Option<String>, String)> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let n = usize::try_from(n).ok()?;
    let header = bytes.get(8..8usize.checked_add(n)?)?;
    check_header(header, bytes.len() - 8 - n)
}

/// Whether the safetensors file at `path` holds the bytes its header
/// describes, reading the header only (a checkpoint copied half-way is
/// found without reading gigabytes); `Err` says what is wrong.
pub fn check_length(path: &Path) -> std::result::Result<(), String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut n = [0u8; 8];
    file.read_exact(&mut n)
        .map_err(|_| "shorter than a safetensors header".to_owned())?;
    let n = u64::from_le_bytes(n);
    let rest = len.checked_sub(8).and_then(|r| r.checked_sub(n));
    let (Some(rest), Ok(n)) = (rest, usize::try_from(n)) else {
        return Err(format!(
            "its header claims {n} bytes, more than the file holds"
        ));
    };
    let mut header = vec![0u8; n];
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    let have = usize::try_from(rest).map_err(|e| e.to_string())?;
    match check_header(&header, have) {
        Some((tensor, reason)) => Err(match tensor {
            Some(t) => format!("tensor `{t}`: {reason}"),
            None => reason,
        }),
        None => Ok(()),
    }
}

/// What is wrong with a safetensors header (JSON text) given `have` bytes
/// of tensor data after it; `None` when nothing is, or it cannot be read.
fn check_header(header: &[u8], have: usize) -> Option<(Option<String>, String)> {
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let mut end = 0usize;
    for (name, info) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let dtype = info.get("dtype")?.as_str()?;
        let shape: Vec<usize> = (info.get("shape")?.as_array()?.iter())
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<_>>()?;
        let offsets = info.get("data_offsets")?.as_array()?;
        let (a, b) = (offsets.first()?.as_u64()?, offsets.get(1)?.as_u64()?);
        let (a, b) = (usize::try_from(a).ok()?, usize::try_from(b).ok()?);
        let need = (shape.iter()).try_fold(dtype_bytes(dtype)?, |acc, &d| acc.checked_mul(d))?;
        if b < a || b - a != need {
            return Some((
                Some(name.clone()),
                format!(
                    "its dtype {dtype} and shape {shape:?} need {need} bytes, but its data_offsets [{a}, {b}] hold {}",
                    b.saturating_sub(a)
                ),
            ));
        }
        end = end.max(b);
    }
    (end != have).then(|| {
        let what = match end > have {
            true => "truncated",
            false => "longer than its header describes",
        };
        let reason = format!(
            "the file is {what}: its header describes {end} bytes of tensor data, the file holds {have} after the header"
        );
        (None, reason)
    })
}

/// Bytes per element of a safetensors dtype name.
fn dtype_bytes(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
        _ => return None,
    })
}

/// The weight files of the checkpoint in `dir`: `model.safetensors`, or
/// every shard `model.safetensors.index.json` names (sorted). A directory
/// with only PyTorch's `pytorch_model.bin`, or with neither, is an error
/// that says so.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join(WEIGHTS_FILE);
    let index = dir.join(WEIGHTS_INDEX_FILE);
    if single.is_file() {
        Ok(vec![single])
    } else if index.is_file() {
        Ok(shard_files(&index)?
            .into_iter()
            .map(|f| dir.join(f))
            .collect())
    } else if dir.join("pytorch_model.bin").is_file() {
        Err(Error::Safetensors {
            path: single,
            tensor: None,
            reason: format!(
                "missing: {} has PyTorch's pytorch_model.bin, which colo does not read; \
                 save it as safetensors (transformers: model.save_pretrained(dir, safe_serialization=True))",
                dir.display()
            ),
        })
    } else if !dir.is_dir() {
        Err(Error::io(&single, std::io::ErrorKind::NotFound.into()))
    } else {
        Err(Error::MissingFile { path: single })
    }
}

/// The distinct shard file names in a safetensors index, in sorted order.
fn shard_files(index: &Path) -> Result<BTreeSet<String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: HashMap<String, String>,
    }
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let parsed: Index = serde_json::from_str(&text).map_err(|reason| Error::Json {
        path: index.to_owned(),
        reason,
    })?;
    Ok(parsed.weight_map.into_values().collect())
}

/// A tensor's bytes on the host, in the form `safetensors` serialises.
struct HostTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &HostTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn host_tensor(t: &Tensor) -> std::result::Result<HostTensor, String> {
    let kind = t.f_kind().map_err(|e| e.to_string())?;
    let dtype = match kind {
        Kind::Float => Dtype::F32,
        Kind::Half => Dtype::F16,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Double => Dtype::F64,
        Kind::Int64 => Dtype::I64,
        Kind::Int => Dtype::I32,
        Kind::Int16 => Dtype::I16,
        Kind::Int8 => Dtype::I8,
        Kind::Uint8 => Dtype::U8,
        Kind::Bool => Dtype::BOOL,
        other => return Err(format!("kind {other:?} has no safetensors dtype")),
    };
    let numel = t.numel();
    let mut data = vec![0u8; numel * kind.elt_size_in_bytes()];
    // `copy_data_u8` makes a contiguous host copy first where needed.
    t.f_copy_data_u8(&mut data, numel)
        .map_err(|e| e.to_string())?;
    Ok(HostTensor {
        dtype,
        shape: t.size().iter().map(|&d| d as usize).collect(),
        data,
    })
}

/// Writes named tensors (any device) to one safetensors file with the
/// `format: pt` metadata transformers expects.
pub fn save_safetensors(tensors: &[(String, Tensor)], path: &Path) -> Result<()> {
    let fail = |tensor: Option<&str>, reason: String| Error::Safetensors {
        path: path.to_owned(),
        tensor: tensor.map(str::to_owned),
        reason,
    };
    let host = tensors
        .iter()
        .map(|(n, t)| Ok((n.as_str(), host_tensor(t).map_err(|r| fail(Some(n), r))?)))
        .collect::<Result<Vec<_>>>()?;
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let views = host.iter().map(|(n, t)| (*n, t));
    // The crate writes a temporary file (mode 0600) and renames it into
    // place: the file gets the permissions a file created here has (the
    // umask's), as the checkpoint's other files do, so that whoever may
    // read the directory may load the model.
    let mode = std::fs::File::create(path)
        .and_then(|f| f.metadata())
        .map_err(|e| Error::io(path, e))?
        .permissions();
    safetensors::serialize_to_file(views, Some(metadata), path)
        .map_err(|e| fail(None, e.to_string()))?;
    std::fs::set_permissions(path, mode).map_err(|e| Error::io(path, e))
}
