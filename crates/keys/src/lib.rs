//! The keys of a serde-read config file, documented once, where they are
//! declared.
//!
//! `#[derive(Keys)]` on a serde struct (or an internally tagged enum of
//! struct variants) lists its keys as serde reads them: the name
//! (`#[serde(rename)]`), the other names (`#[serde(alias)]`), the field's
//! doc comment as its meaning, and what `#[key(...)]` adds:
//!
//! ```
//! use colo_keys::Keys;
//! use serde::Deserialize;
//!
//! #[derive(Deserialize, Keys)]
//! struct RawRollout {
//!     /// longest response
//!     #[serde(alias = "response_length")]
//!     #[key(unit = "tokens", verl = "data.max_response_length")]
//!     max_new_tokens: usize,
//!     /// sampling of evaluations
//!     #[key(table)]
//!     val_kwargs: RawValKwargs,
//! }
//!
//! #[derive(Deserialize, Keys)]
//! struct RawValKwargs {
//!     /// samples per prompt
//!     n: usize,
//! }
//!
//! let keys = RawRollout::keys();
//! assert_eq!(keys[0].aliases, ["response_length"]);
//! assert_eq!(keys[1].table.unwrap()()[0].doc, "samples per prompt");
//! ```
//!
//! - `unit`: the unit or the accepted values;
//! - `verl`: verl's name for the key;
//! - `unset`: for an optional key, what leaving it out means;
//! - `table`: the field is a table whose keys are its type's [`Keys`];
//! - on a tagged enum, `#[key(tag_doc = "…", tag_verl = "…")]` documents
//!   the tag, whose accepted values are the variants' names, and every
//!   key records the variants ([`Key::kinds`]) that have it.
//!
//! colo-rl prints `--print-config` and finds the keys of its error hints
//! from these lists, so a key cannot be documented in one place and named
//! differently in another. Why a derive and not a table: the table that
//! came before it repeated every key's name and aliases by hand, and the
//! aliases were parsed back out of its prose.

pub use colo_keys_derive::Keys;

/// One key of a table.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// As serde reads it.
    pub name: &'static str,
    /// The other names serde accepts for it.
    pub aliases: &'static [&'static str],
    /// Its doc comment, the lines joined by spaces.
    pub doc: &'static str,
    pub unit: &'static str,
    pub verl: &'static str,
    /// For an optional key, what leaving it out means ("" otherwise).
    pub unset: &'static str,
    /// In a tagged enum: the tag values (variants) that have this key;
    /// empty for a struct's key and for the tag itself.
    pub kinds: &'static [&'static str],
    /// A table's own keys.
    pub table: Option<fn() -> Vec<Key>>,
}

/// The keys of a config table, in the order they are declared.
pub trait Keys {
    fn keys() -> Vec<Key>;
}
