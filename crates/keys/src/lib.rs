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
//! - `unit`: the unit or the accepted values (`bool` for a `bool`);
//! - `verl`: verl's name for the key. On the struct, verl's name of its
//!   table: a key's is then the table's and its own (`actor.ppo_epochs`),
//!   unless the key says `verl = ".optim.lr"` (within the table's), an
//!   absolute name, or `no_verl` (verl has none);
//! - `unset`: for an optional key, what leaving it out means;
//! - `table`: the field is a table whose keys are its type's [`Keys`];
//! - `range`: the values the key accepts, `> 0`, `≥ 1`, `[0, 1]`, `(0, 1]`
//!   (and the unit, unless `unit` says another): [`Keys::out_of_range`]
//!   checks every such key of the table and of its tables;
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

    /// The first key, in declaration order and tables' keys in place,
    /// whose value is outside its `range`.
    fn out_of_range(&self) -> Option<OutOfRange> {
        None
    }
}

/// A key's declared `range`: `lo`..`hi`, each bound open or closed.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    pub lo: f64,
    pub lo_open: bool,
    pub hi: f64,
    pub hi_open: bool,
    /// As declared: `> 0`, `[0, 1]`.
    pub text: &'static str,
}

/// A value outside its key's [`Range`].
#[derive(Debug, Clone)]
pub struct OutOfRange {
    /// The key's dotted path from the checked table.
    pub key: String,
    pub value: f64,
    /// Whether the key holds whole numbers.
    pub integer: bool,
    pub range: Range,
}

impl Range {
    /// `None` when `v` (unset: no value) is within the range.
    pub fn check(&self, key: &str, v: &impl Ranged) -> Option<OutOfRange> {
        let value = v.value()?;
        let above = if self.lo_open {
            value > self.lo
        } else {
            value >= self.lo
        };
        let below = if self.hi_open {
            value < self.hi
        } else {
            value <= self.hi
        };
        (!(value.is_finite() && above && below)).then(|| OutOfRange {
            key: key.to_owned(),
            value,
            integer: v.integer(),
            range: *self,
        })
    }
}

impl OutOfRange {
    /// The error as found in table `name` of the checked one.
    pub fn within(mut self, name: &str) -> Self {
        self.key = format!("{name}.{}", self.key);
        self
    }
}

/// A value a `range` can check: a number, or an optional one.
pub trait Ranged {
    /// `None` for an unset optional key.
    fn value(&self) -> Option<f64>;
    fn integer(&self) -> bool;
}

macro_rules! ranged {
    ($($t:ty: $integer:expr),*) => {$(
        impl Ranged for $t {
            fn value(&self) -> Option<f64> {
                Some(*self as f64)
            }
            fn integer(&self) -> bool {
                $integer
            }
        }
    )*};
}
ranged!(f64: false, f32: false, usize: true, u64: true, u32: true, i64: true);

impl<T: Ranged> Ranged for Option<T> {
    fn value(&self) -> Option<f64> {
        self.as_ref()?.value()
    }
    fn integer(&self) -> bool {
        self.as_ref().is_some_and(T::integer)
    }
}
