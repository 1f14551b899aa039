//! `#[derive(Keys)]`: see colo-keys. Reads serde's attributes (`rename`,
//! `rename_all`, `alias`, `skip`, `tag`) so that the listed keys are the
//! ones serde reads.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::{parse_macro_input, Attribute, Data, DeriveInput, Error, Fields, LitStr, Result};

#[proc_macro_derive(Keys, attributes(key))]
pub fn derive_keys(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(Error::into_compile_error)
        .into()
}

/// What the attributes of a field (or a container) say.
#[derive(Default)]
struct Notes {
    rename: Option<String>,
    rename_all: Option<String>,
    tag: Option<String>,
    aliases: Vec<String>,
    skip: bool,
    doc: Vec<String>,
    unit: String,
    verl: String,
    unset: String,
    range: String,
    table: bool,
    no_verl: bool,
    tag_doc: String,
    tag_unit: String,
    tag_verl: String,
}

/// One key as the derive emits it.
struct KeyOut {
    name: String,
    notes: Notes,
    kinds: Vec<String>,
    ty: Option<syn::Type>,
    ident: Option<syn::Ident>,
}

fn expand(input: &DeriveInput) -> Result<Tokens> {
    let container = notes(&input.attrs)?;
    let keys = match &input.data {
        Data::Struct(s) => fields(&s.fields, &container, None)?,
        Data::Enum(e) => {
            let Some(tag) = &container.tag else {
                return Err(Error::new_spanned(
                    &input.ident,
                    "Keys on an enum needs #[serde(tag = \"…\")]",
                ));
            };
            let mut keys: Vec<KeyOut> = Vec::new();
            let mut kinds = Vec::new();
            for v in &e.variants {
                let vn = notes(&v.attrs)?;
                let kind = match vn.rename {
                    Some(r) => r,
                    None => renamed(&v.ident.to_string(), container.rename_all.as_deref())
                        .map_err(|m| Error::new_spanned(&input.ident, m))?,
                };
                kinds.push(kind.clone());
                for k in fields(&v.fields, &Notes::default(), Some(&kind))? {
                    match keys.iter_mut().find(|o| o.name == k.name) {
                        Some(o) => o.kinds.push(kind.clone()),
                        None => keys.push(k),
                    }
                }
            }
            let unit = match container.tag_unit.is_empty() {
                false => container.tag_unit.clone(),
                true => kinds
                    .iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            let tag_key = KeyOut {
                name: tag.clone(),
                notes: Notes {
                    doc: vec![container.tag_doc.clone()],
                    unit,
                    verl: container.tag_verl.clone(),
                    ..Notes::default()
                },
                kinds: Vec::new(),
                ty: None,
                ident: None,
            };
            std::iter::once(tag_key).chain(keys).collect()
        }
        Data::Union(u) => {
            return Err(Error::new_spanned(u.union_token, "Keys on a union"));
        }
    };
    let items = keys.iter().map(key_tokens);
    let checks = match &input.data {
        Data::Struct(_) => keys.iter().map(check_tokens).collect::<Result<Vec<_>>>()?,
        _ => Vec::new(),
    };
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::colo_keys::Keys for #ident #ty_generics #where_clause {
            fn keys() -> ::std::vec::Vec<::colo_keys::Key> {
                ::std::vec![#(#items),*]
            }
            fn out_of_range(&self) -> ::std::option::Option<::colo_keys::OutOfRange> {
                #(#checks)*
                ::std::option::Option::None
            }
        }
    })
}

/// The keys of named fields; `kind` is the enum variant they belong to.
fn fields(fields: &Fields, container: &Notes, kind: Option<&str>) -> Result<Vec<KeyOut>> {
    let mut out = Vec::new();
    for f in fields.iter() {
        let Some(ident) = &f.ident else {
            return Err(Error::new_spanned(f, "Keys needs named fields"));
        };
        let mut notes = notes(&f.attrs)?;
        if notes.unit.is_empty() && matches!(&f.ty, syn::Type::Path(p) if p.path.is_ident("bool")) {
            notes.unit = "bool".to_owned();
        }
        if notes.skip {
            continue;
        }
        let name = match &notes.rename {
            Some(r) => r.clone(),
            None => renamed(&ident.to_string(), container.rename_all.as_deref())
                .map_err(|m| Error::new_spanned(ident, m))?,
        };
        notes.verl =
            verl_name(&container.verl, &notes, &name).map_err(|m| Error::new_spanned(ident, m))?;
        out.push(KeyOut {
            name,
            ty: notes.table.then(|| f.ty.clone()),
            ident: Some(ident.clone()),
            notes,
            kinds: kind.map(str::to_owned).into_iter().collect(),
        });
    }
    Ok(out)
}

/// A field's verl name: its `verl`, `.x` relative to the struct's
/// `#[key(verl = "…")]`; without one, the struct's and the field's name
/// (none for a table, with `no_verl`, or in a struct without a verl name).
fn verl_name(prefix: &str, n: &Notes, name: &str) -> std::result::Result<String, &'static str> {
    match (n.verl.strip_prefix('.'), prefix) {
        (Some(_), "") => {
            Err("a relative verl name (\".x\") needs the struct's #[key(verl = \"…\")]")
        }
        (Some(rest), p) => Ok(format!("{p}.{rest}")),
        (None, _) if !n.verl.is_empty() => Ok(n.verl.clone()),
        _ if n.no_verl || n.table || prefix.is_empty() => Ok(String::new()),
        _ => Ok(format!("{prefix}.{name}")),
    }
}

fn key_tokens(k: &KeyOut) -> Tokens {
    let n = &k.notes;
    let (name, aliases, kinds) = (&k.name, &n.aliases, &k.kinds);
    let doc = n
        .doc
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let (unit, verl, unset) = (&n.unit, &n.verl, &n.unset);
    let table = match &k.ty {
        Some(ty) => quote!(::std::option::Option::Some(<#ty as ::colo_keys::Keys>::keys)),
        None => quote!(::std::option::Option::None),
    };
    quote! {
        ::colo_keys::Key {
            name: #name,
            aliases: &[#(#aliases),*],
            doc: #doc,
            unit: #unit,
            verl: #verl,
            unset: #unset,
            kinds: &[#(#kinds),*],
            table: #table,
        }
    }
}

/// The check of a struct field's `range`, or of its table's keys.
fn check_tokens(k: &KeyOut) -> Result<Tokens> {
    let (Some(field), name) = (&k.ident, &k.name) else {
        return Ok(Tokens::new());
    };
    if k.notes.table {
        return Ok(quote! {
            if let ::std::option::Option::Some(e) = ::colo_keys::Keys::out_of_range(&self.#field) {
                return ::std::option::Option::Some(e.within(#name));
            }
        });
    }
    if k.notes.range.is_empty() {
        return Ok(Tokens::new());
    }
    let text = &k.notes.range;
    let (lo, lo_open, hi, hi_open) =
        bounds(text).map_err(|m| Error::new_spanned(field, format!("range {text:?}: {m}")))?;
    // A negative literal is a minus and a literal.
    let number = |v: f64| match v < 0.0 {
        true => {
            let v = -v;
            quote!(-#v)
        }
        false => quote!(#v),
    };
    let lo = number(lo);
    let hi = hi.map_or(quote!(f64::INFINITY), number);
    Ok(quote! {
        let range = ::colo_keys::Range {
            lo: #lo, lo_open: #lo_open, hi: #hi, hi_open: #hi_open, text: #text,
        };
        if let ::std::option::Option::Some(e) = range.check(#name, &self.#field) {
            return ::std::option::Option::Some(e);
        }
    })
}

/// `> a`, `≥ a`, `[a, b]`, `(a, b]`, `[a, b)`, `(a, b)` as `(lo, lo_open,
/// hi, hi_open)`, `hi` `None` for no upper bound.
fn bounds(text: &str) -> std::result::Result<(f64, bool, Option<f64>, bool), String> {
    let num = |s: &str| s.trim().parse::<f64>().map_err(|e| format!("{s:?}: {e}"));
    if let Some(lo) = text.strip_prefix('>') {
        return Ok((num(lo)?, true, None, false));
    }
    if let Some(lo) = text.strip_prefix('≥') {
        return Ok((num(lo)?, false, None, false));
    }
    let lo_open = match text.chars().next() {
        Some('(') => true,
        Some('[') => false,
        _ => return Err("expected > a, ≥ a or an interval such as [a, b)".into()),
    };
    let hi_open = match text.chars().last() {
        Some(')') => true,
        Some(']') => false,
        _ => return Err("an interval ends with ] or )".into()),
    };
    let Some((lo, hi)) = text[1..text.len() - 1].split_once(',') else {
        return Err("an interval is two numbers: [a, b]".into());
    };
    Ok((num(lo)?, lo_open, Some(num(hi)?), hi_open))
}

/// serde's `rename_all` of a Rust name.
fn renamed(ident: &str, rule: Option<&str>) -> std::result::Result<String, String> {
    let ident = ident.trim_start_matches("r#");
    let snake = || {
        let mut s = String::new();
        for (i, c) in ident.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                s.push('_');
            }
            s.extend(c.to_lowercase());
        }
        s
    };
    match rule {
        None => Ok(ident.to_owned()),
        Some("snake_case") => Ok(snake()),
        Some("kebab-case") => Ok(snake().replace('_', "-")),
        Some("lowercase") => Ok(ident.to_lowercase()),
        Some(other) => Err(format!("Keys does not know rename_all = {other:?}")),
    }
}

/// Reads `#[doc]`, `#[serde(...)]` and `#[key(...)]`.
fn notes(attrs: &[Attribute]) -> Result<Notes> {
    let mut n = Notes::default();
    for attr in attrs {
        if attr.path().is_ident("doc") {
            if let syn::Meta::NameValue(nv) = &attr.meta {
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = &nv.value
                {
                    n.doc.push(s.value());
                }
            }
        } else if attr.path().is_ident("serde") {
            attr.parse_nested_meta(|meta| serde_meta(&mut n, meta))?;
        } else if attr.path().is_ident("key") {
            attr.parse_nested_meta(|meta| key_meta(&mut n, meta))?;
        }
    }
    Ok(n)
}

fn string(meta: &ParseNestedMeta) -> Result<String> {
    Ok(meta.value()?.parse::<LitStr>()?.value())
}

fn serde_meta(n: &mut Notes, meta: ParseNestedMeta) -> Result<()> {
    let p = &meta.path;
    if p.is_ident("rename") && meta.input.peek(syn::Token![=]) {
        n.rename = Some(string(&meta)?);
    } else if p.is_ident("rename_all") && meta.input.peek(syn::Token![=]) {
        n.rename_all = Some(string(&meta)?);
    } else if p.is_ident("tag") {
        n.tag = Some(string(&meta)?);
    } else if p.is_ident("alias") {
        n.aliases.push(string(&meta)?);
    } else if p.is_ident("skip") || p.is_ident("skip_deserializing") {
        n.skip = true;
    } else if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<syn::Lit>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|inner| {
            if inner.input.peek(syn::Token![=]) {
                inner.value()?.parse::<syn::Lit>()?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

fn key_meta(n: &mut Notes, meta: ParseNestedMeta) -> Result<()> {
    let p = &meta.path;
    let slot = if p.is_ident("table") {
        n.table = true;
        return Ok(());
    } else if p.is_ident("no_verl") {
        n.no_verl = true;
        return Ok(());
    } else if p.is_ident("unit") {
        &mut n.unit
    } else if p.is_ident("verl") {
        &mut n.verl
    } else if p.is_ident("unset") {
        &mut n.unset
    } else if p.is_ident("range") {
        n.range = string(&meta)?;
        if n.unit.is_empty() {
            n.unit = n.range.clone();
        }
        return Ok(());
    } else if p.is_ident("tag_doc") {
        &mut n.tag_doc
    } else if p.is_ident("tag_unit") {
        &mut n.tag_unit
    } else if p.is_ident("tag_verl") {
        &mut n.tag_verl
    } else {
        return Err(meta.error(
            "expected unit, verl, no_verl, unset, range, table, tag_doc, tag_unit or tag_verl",
        ));
    };
    *slot = string(&meta)?;
    Ok(())
}
