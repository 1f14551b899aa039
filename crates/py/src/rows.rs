//! Lists of rows from Python — token ids, per-token numbers — read with
//! messages in Python's terms. pyo3's own conversion names Rust's types
//! ("Can't extract `str` to `Vec`", "can't convert negative int to
//! unsigned"); these say which argument, which row and item, what it was
//! and what was expected.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::collective::type_name;

/// `obj` as rows of token ids (ints in 0..2³²); `arg` names the argument.
pub(crate) fn token_rows(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<Vec<u32>>> {
    if let Ok(rows) = obj.extract::<Vec<Vec<u32>>>() {
        return Ok(rows);
    }
    Err(diagnose(
        obj,
        arg,
        "a list of token-id lists (ints ≥ 0)",
        |x| x.extract::<u32>().is_ok(),
    ))
}

/// `obj` as rows of numbers (one per response token); `arg` names it.
pub(crate) fn number_rows(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<Vec<f32>>> {
    if let Ok(rows) = obj.extract::<Vec<Vec<f32>>>() {
        return Ok(rows);
    }
    Err(diagnose(obj, arg, "a list of lists of numbers", |x| {
        x.extract::<f32>().is_ok()
    }))
}

/// The first place where `obj` is not a list of lists of items that `ok`
/// accepts, as a ValueError naming it.
fn diagnose(
    obj: &Bound<'_, PyAny>,
    arg: &str,
    expected: &str,
    ok: impl Fn(&Bound<'_, PyAny>) -> bool,
) -> PyErr {
    let what = |x: &Bound<'_, PyAny>| {
        let t = type_name(x);
        let a = match t.starts_with(['a', 'e', 'i', 'o', 'u']) {
            true => "an",
            false => "a",
        };
        match x.repr() {
            Ok(r) if r.to_string().chars().count() <= 40 => format!("{r} ({a} {t})"),
            _ => format!("{a} {t}"),
        }
    };
    let fail = |at: String| PyValueError::new_err(format!("{arg}: expected {expected}; {at}"));
    let rows = match sequence(obj) {
        Some(rows) => rows,
        None => return fail(format!("got {}", what(obj))),
    };
    for (i, row) in rows.iter().enumerate() {
        let Some(items) = sequence(row) else {
            return fail(format!("row {i} is {}", what(row)));
        };
        if let Some((j, x)) = items.iter().enumerate().find(|(_, x)| !ok(x)) {
            return fail(format!("row {i}, item {j} is {}", what(x)));
        }
    }
    fail(format!("got {}", what(obj)))
}

/// The items of a list or tuple (not of a str, which iterates too).
fn sequence<'py>(obj: &Bound<'py, PyAny>) -> Option<Vec<Bound<'py, PyAny>>> {
    use pyo3::types::{PyList, PyTuple};
    if let Ok(l) = obj.cast::<PyList>() {
        return Some(l.iter().collect());
    }
    obj.cast::<PyTuple>().ok().map(|t| t.iter().collect())
}
