//! The pictures: well-formed XML, one group per series, the data's extremes.

use std::collections::BTreeMap;

use colo_mem::{Event, EventKind};
use colo_rl::plot;

/// A small XML well-formedness check: every tag closes in order, attribute
/// values are quoted, entities are the predefined ones. Returns the element
/// names in document order.
fn check_xml(doc: &str) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    let mut seen = Vec::new();
    let mut rest = doc.trim_start();
    if let Some(r) = rest.strip_prefix("<?xml") {
        rest = &r[r.find("?>").expect("unterminated declaration") + 2..];
    }
    while let Some(open) = rest.find('<') {
        check_text(&rest[..open]);
        let tail = &rest[open + 1..];
        let close = tail.find('>').expect("unterminated tag");
        let tag = &tail[..close];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
        } else {
            let self_closing = tag.ends_with('/');
            let body = tag.trim_end_matches('/');
            let name = body
                .split_whitespace()
                .next()
                .expect("empty tag")
                .to_owned();
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                "bad name {name}"
            );
            check_attributes(&body[name.len()..]);
            seen.push(name.clone());
            if !self_closing {
                stack.push(name);
            }
        }
        rest = &tail[close + 1..];
    }
    assert!(rest.trim().is_empty(), "text after the root");
    assert!(stack.is_empty(), "unclosed {stack:?}");
    assert_eq!(seen.first().map(String::as_str), Some("svg"));
    seen
}

fn check_text(text: &str) {
    let mut rest = text;
    while let Some(i) = rest.find('&') {
        let end = rest[i..].find(';').expect("bare &");
        let entity = &rest[i + 1..i + end];
        assert!(
            ["amp", "lt", "gt", "quot", "apos"].contains(&entity),
            "entity {entity}"
        );
        rest = &rest[i + end..];
    }
}

fn check_attributes(mut attrs: &str) {
    loop {
        attrs = attrs.trim_start();
        if attrs.is_empty() {
            return;
        }
        let eq = attrs.find('=').expect("attribute without value");
        assert!(
            !attrs[..eq].contains(char::is_whitespace),
            "attribute name {:?}",
            &attrs[..eq]
        );
        let value = attrs[eq + 1..]
            .strip_prefix('"')
            .expect("unquoted attribute");
        let end = value.find('"').expect("unterminated attribute");
        assert!(!value[..end].contains('<'));
        check_text(&value[..end]);
        attrs = &value[end + 1..];
    }
}

/// `(name, min, max)` of each series group.
fn series(doc: &str) -> Vec<(String, f64, f64)> {
    let attr = |s: &str, key: &str| -> String {
        let start = s.find(&format!("{key}=\"")).unwrap() + key.len() + 2;
        s[start..start + s[start..].find('"').unwrap()].to_owned()
    };
    doc.split("<g class=\"series\"")
        .skip(1)
        .map(|s| {
            let head = &s[..s.find('>').unwrap()];
            (
                attr(head, "data-name"),
                attr(head, "data-min").parse().unwrap(),
                attr(head, "data-max").parse().unwrap(),
            )
        })
        .collect()
}

fn event(t_s: f64, phase: &str, kind: EventKind, tags: &[(&str, u64)]) -> Event {
    let per_tag: BTreeMap<String, u64> = tags.iter().map(|(t, b)| (t.to_string(), *b)).collect();
    Event {
        t_s,
        phase: phase.into(),
        kind,
        tags: vec![],
        duration_s: 0.0,
        resident_bytes: per_tag.values().sum(),
        per_tag,
        untagged_bytes: 0,
    }
}

#[test]
fn memory_timeline_is_well_formed_with_one_band_per_tag() {
    const MIB: u64 = 1 << 20;
    let events = vec![
        event(
            0.0,
            "train",
            EventKind::Phase,
            &[("train_params", 40 * MIB), ("optimizer", 80 * MIB)],
        ),
        event(
            0.5,
            "train",
            EventKind::Pause,
            &[("train_params", 40 * MIB)],
        ),
        event(
            0.6,
            "wake weights",
            EventKind::Phase,
            &[("train_params", 40 * MIB), ("weights", 40 * MIB)],
        ),
        event(
            0.7,
            "free trainer <copy> & sync",
            EventKind::Phase,
            &[("weights", 40 * MIB)],
        ),
        event(
            0.8,
            "generate",
            EventKind::Phase,
            &[
                ("weights", 40 * MIB),
                ("kv_cache", 300 * MIB),
                ("custom", 1),
            ],
        ),
        event(
            2.0,
            "train",
            EventKind::Phase,
            &[("train_params", 40 * MIB), ("optimizer", 80 * MIB)],
        ),
    ];
    let doc = plot::memory_timeline(&events, Some(512 * MIB), "step 1 & 2");
    let names = check_xml(&doc);
    assert!(names.iter().filter(|n| *n == "path").count() >= 5);
    let s = series(&doc);
    let tags: Vec<&str> = s.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(
        tags,
        ["train_params", "optimizer", "weights", "kv_cache", "custom"],
        "stacking order"
    );
    assert_eq!(
        s[3],
        ("kv_cache".into(), 0.0, (300 * MIB) as f64),
        "extremes of kv_cache"
    );
    assert_eq!(s[0].2, (40 * MIB) as f64);
    assert!(doc.contains("capacity 512.0 MiB"));
    assert!(
        doc.contains("free trainer &lt;copy&gt; &amp; sync"),
        "phase labels escaped"
    );
    assert!(doc.contains(">generate</text>"));
    assert!(doc.contains("step 1 &amp; 2"));
}

#[test]
fn empty_timeline_is_still_a_picture() {
    let doc = plot::memory_timeline(&[], None, "nothing yet");
    check_xml(&doc);
    assert!(series(&doc).is_empty());
}

#[test]
fn reward_curve_has_two_series_and_their_extremes() {
    let scores: Vec<(usize, f64)> = (1..=50).map(|s| (s, 0.1 + 0.8 * s as f64 / 50.0)).collect();
    let acc = [(0, 0.22), (10, 0.31), (50, 0.71)];
    let doc = plot::reward_curve(&scores, &acc, "GRPO");
    let names = check_xml(&doc);
    assert_eq!(names.iter().filter(|n| *n == "polyline").count(), 2);
    assert_eq!(
        names.iter().filter(|n| *n == "circle").count(),
        3,
        "a marker per evaluation"
    );
    let s = series(&doc);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].0, "critic/score/mean");
    assert!(
        (s[0].1 - 0.116).abs() < 1e-9 && (s[0].2 - 0.9).abs() < 1e-9,
        "{s:?}"
    );
    assert_eq!(s[1], ("eval/accuracy".into(), 0.22, 0.71));
    assert!(doc.contains("step 50: 0.710"));
    // The highest point is drawn higher (smaller y) than the lowest.
    let ys: Vec<f64> = doc
        .split("<circle ")
        .skip(1)
        .map(|c| {
            c.split("cy=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(ys[2] < ys[0], "{ys:?}");
}
