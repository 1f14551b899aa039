//! The derive lists the keys serde reads, with what their declarations say.

use colo_keys::{Key, Keys};
use serde::Deserialize;

#[allow(dead_code)]
#[derive(Deserialize, Keys)]
#[serde(rename_all = "kebab-case")]
struct Section {
    /// the first line
    /// and the second
    #[serde(alias = "old_name", alias = "older")]
    #[key(unit = "tokens", verl = "a.b.c", unset = "none")]
    new_name: Option<usize>,
    #[serde(rename = "type")]
    kind: String,
    #[serde(skip)]
    hidden: u8,
    /// a table
    #[key(table)]
    inner: Inner,
}

#[allow(dead_code)]
#[derive(Deserialize, Keys)]
struct Inner {
    /// inside
    x: f64,
}

#[allow(dead_code)]
#[derive(Deserialize, Keys)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[key(tag_doc = "which one")]
enum Choice {
    PlainOne {},
    WithField {
        /// shared
        #[key(unit = "seconds")]
        timeout: f64,
    },
    #[serde(rename = "third")]
    Other {
        timeout: f64,
        only_here: bool,
    },
}

fn find(keys: &[Key], name: &str) -> Key {
    *keys
        .iter()
        .find(|k| k.name == name)
        .unwrap_or_else(|| panic!("no key {name}"))
}

#[test]
fn a_struct_lists_its_keys_as_serde_reads_them() {
    let keys = Section::keys();
    let names: Vec<&str> = keys.iter().map(|k| k.name).collect();
    assert_eq!(names, ["new-name", "type", "inner"]);
    let k = find(&keys, "new-name");
    assert_eq!(k.aliases, ["old_name", "older"]);
    assert_eq!(k.doc, "the first line and the second");
    assert_eq!((k.unit, k.verl, k.unset), ("tokens", "a.b.c", "none"));
    assert!(k.kinds.is_empty() && k.table.is_none());
    let inner = find(&keys, "inner").table.expect("a table")();
    assert_eq!(inner.len(), 1);
    assert_eq!((inner[0].name, inner[0].doc), ("x", "inside"));
}

#[test]
fn a_tagged_enum_lists_its_tag_and_which_kinds_have_each_key() {
    let keys = Choice::keys();
    let names: Vec<&str> = keys.iter().map(|k| k.name).collect();
    assert_eq!(names, ["kind", "timeout", "only_here"]);
    let tag = find(&keys, "kind");
    assert_eq!(tag.doc, "which one");
    assert_eq!(tag.unit, "\"plain_one\", \"with_field\", \"third\"");
    let timeout = find(&keys, "timeout");
    assert_eq!(timeout.kinds, ["with_field", "third"]);
    assert_eq!((timeout.doc, timeout.unit), ("shared", "seconds"));
    assert_eq!(find(&keys, "only_here").kinds, ["third"]);
}

#[derive(Deserialize, Keys)]
struct Ranged {
    #[key(range = "> 0")]
    lr: f64,
    #[key(range = "[-1, 1)", unit = "ratio")]
    share: f64,
    #[key(range = "≥ 1")]
    workers: Option<usize>,
    #[key(table)]
    inner: RangedInner,
}

#[allow(dead_code)]
#[derive(Deserialize, Keys)]
struct RangedInner {
    #[key(range = "(0, 1]")]
    p: f64,
    on: bool,
}

#[test]
fn a_range_is_the_unit_and_checks_the_value_tables_included() {
    let keys = Ranged::keys();
    assert_eq!(find(&keys, "lr").unit, "> 0");
    assert_eq!(find(&keys, "share").unit, "ratio");
    let inner = find(&keys, "inner").table.expect("a table")();
    assert_eq!(find(&inner, "on").unit, "bool", "a bool's unit");
    let ok = || Ranged {
        lr: 1e-6,
        share: -1.0,
        workers: None,
        inner: RangedInner { p: 1.0, on: true },
    };
    assert!(ok().out_of_range().is_none());
    let bad = |r: Ranged| {
        let e = r.out_of_range().expect("out of range");
        (e.key, e.value, e.integer, e.range.text)
    };
    let nan = bad(Ranged {
        lr: f64::NAN,
        ..ok()
    });
    assert!(nan.0 == "lr" && nan.1.is_nan() && nan.3 == "> 0");
    let share = bad(Ranged { share: 1.0, ..ok() });
    assert_eq!(share, ("share".into(), 1.0, false, "[-1, 1)"));
    let workers = bad(Ranged {
        workers: Some(0),
        ..ok()
    });
    assert_eq!(workers, ("workers".into(), 0.0, true, "≥ 1"));
    let inner = bad(Ranged {
        inner: RangedInner { p: 0.0, on: true },
        ..ok()
    });
    assert_eq!(inner, ("inner.p".into(), 0.0, false, "(0, 1]"));
}

#[allow(dead_code)]
#[derive(Deserialize, Keys)]
#[key(verl = "top.actor")]
struct Prefixed {
    ppo_epochs: usize,
    #[serde(rename = "clip")]
    clip_ratio: f64,
    #[key(verl = ".optim.lr")]
    lr: f64,
    #[key(verl = "data.max_response_length")]
    max_new_tokens: usize,
    #[key(no_verl)]
    cpu_threads: usize,
    #[key(table)]
    inner: Inner,
}

#[test]
fn a_struct_verl_name_is_its_keys_prefix() {
    let verl: Vec<(&str, &str)> = Prefixed::keys().iter().map(|k| (k.name, k.verl)).collect();
    assert_eq!(
        verl,
        [
            ("ppo_epochs", "top.actor.ppo_epochs"),
            ("clip", "top.actor.clip"),
            ("lr", "top.actor.optim.lr"),
            ("max_new_tokens", "data.max_response_length"),
            ("cpu_threads", ""),
            ("inner", ""),
        ]
    );
    assert_eq!(
        find(&Section::keys(), "type").verl,
        "",
        "none without the struct's"
    );
}
