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
