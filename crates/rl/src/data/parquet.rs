//! Parquet datasets, verl's format: every row of every row group as a JSON
//! object, through the parquet crate's record API (nested lists and
//! structs become arrays and objects, so verl's chat prompts and
//! `reward_model.ground_truth` read as they do from JSONL).
//!
//! Codecs: uncompressed, snappy (what pyarrow and Hugging Face `datasets`
//! write unless told otherwise, verl's preprocessing scripts included) and
//! zstd (polars' default); another codec is an error naming the file and
//! the codec.

use std::fs::File;
use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::Value;

use crate::{Error, Result};

/// The magic bytes a parquet file starts (and ends) with.
pub(crate) const MAGIC: &[u8; 4] = b"PAR1";

/// Every row of the parquet file at `path`, in order.
pub(crate) fn rows(path: &Path) -> Result<Vec<Value>> {
    let unreadable = |e: parquet::errors::ParquetError| {
        let e = e.to_string();
        Error::Dataset(match e.split_once("Disabled feature at compile time: ") {
            Some((_, codec)) => format!(
                "{}: compressed with {codec}, which colo does not read: colo reads \
                 uncompressed, snappy (pyarrow's default) and zstd parquet; rewrite \
                 it with compression=\"snappy\" or convert it to JSONL",
                path.display()
            ),
            None => format!("{}: not a readable parquet file: {e}", path.display()),
        })
    };
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = SerializedFileReader::new(file).map_err(unreadable)?;
    let mut out = Vec::new();
    for row in reader.get_row_iter(None).map_err(unreadable)? {
        out.push(row.map_err(unreadable)?.to_json_value());
    }
    Ok(out)
}
