//! The pictures: SVG well-formed and naming what it shows, PNG a valid
//! image of the stated size with the series' colours and rendered text.

use std::collections::BTreeMap;

use colo_mem::{Event, EventKind};
use colo_rl::plot::{self, Picture};

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
            ["amp", "lt", "gt", "quot", "apos"].contains(&entity) || entity.starts_with('#'),
            "entity {entity}"
        );
        rest = &rest[i + end..];
    }
}

/// The contents of the `<text>` elements, in document order.
fn texts(doc: &str) -> Vec<String> {
    doc.split("<text")
        .skip(1)
        .map(|t| {
            let body = &t[t.find('>').unwrap() + 1..];
            body[..body.find("</text>").unwrap()].trim().to_owned()
        })
        .collect()
}

/// Whether some `<text>` element reads `s` (XML-escaped as in the file).
fn has_text(doc: &str, s: &str) -> bool {
    texts(doc).iter().any(|t| t == s)
}

/// The PNG decoded: (width, height, RGB pixels).
fn decode(p: &Picture) -> (u32, u32, Vec<[u8; 3]>) {
    assert!(p.png.starts_with(b"\x89PNG\r\n\x1a\n"), "PNG signature");
    let mut reader = png::Decoder::new(std::io::Cursor::new(&p.png[..]))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let px = buf[..info.buffer_size()]
        .chunks(3)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    (info.width, info.height, px)
}

fn count(px: &[[u8; 3]], c: plotters::style::RGBColor) -> usize {
    px.iter().filter(|p| **p == [c.0, c.1, c.2]).count()
}

/// Dark pixels (text) in rows `rows` of a `width`-wide image.
fn dark_in_rows(px: &[[u8; 3]], width: u32, rows: std::ops::Range<usize>) -> usize {
    px.chunks(width as usize)
        .skip(rows.start)
        .take(rows.len())
        .flatten()
        .filter(|p| p.iter().all(|&v| v < 100))
        .count()
}

fn event(t_s: f64, phase: &str, kind: EventKind, tags: &[(&str, u64)]) -> Event {
    let per_tag: BTreeMap<String, u64> = tags.iter().map(|(t, b)| (t.to_string(), *b)).collect();
    Event {
        t_s,
        step: 0,
        phase: phase.into(),
        kind,
        tags: vec![],
        duration_s: 0.0,
        resident_bytes: per_tag.values().sum(),
        per_tag,
        untagged_bytes: 0,
    }
}

const MIB: u64 = 1 << 20;

fn step_events() -> Vec<Event> {
    vec![
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
    ]
}

#[test]
fn memory_timeline_names_every_tag_in_stacking_order_in_svg_and_png() {
    let pic = plot::memory_timeline(&step_events(), Some(512 * MIB), "step 1 & 2").unwrap();
    let doc = &pic.svg;
    check_xml(doc);
    // The legend: each tag with its largest size, in stacking order.
    let legend = [
        "train_params  (max 40.0 MiB)",
        "optimizer  (max 80.0 MiB)",
        "weights  (max 40.0 MiB)",
        "kv_cache  (max 300.0 MiB)",
        "custom  (max 1 B)",
    ];
    let all = texts(doc);
    let at: Vec<usize> = legend
        .iter()
        .map(|l| {
            all.iter()
                .position(|t| t == l)
                .unwrap_or_else(|| panic!("{l}: {all:?}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "stacking order {at:?}");
    assert!(has_text(doc, "capacity 512.0 MiB"));
    assert!(has_text(doc, "device capacity"));
    assert!(
        has_text(doc, "free trainer &lt;copy&gt; &amp; sync"),
        "phase labels escaped"
    );
    assert!(has_text(doc, "generate") && has_text(doc, "wake weights"));
    assert!(has_text(doc, "step 1 &amp; 2"), "the title");
    assert!(has_text(doc, "time (s)"));

    let (w, h, px) = decode(&pic);
    assert_eq!((w, h), (1000, 520));
    assert_eq!((pic.width, pic.height), (w, h));
    // Bands in the palette's colours: kv_cache (the 4th tag) fills a large
    // area, far more than its legend swatch.
    let kv = count(&px, plot::color(3));
    assert!(kv > 20_000, "{kv} kv_cache pixels");
    for k in 0..3 {
        assert!(count(&px, plot::color(k)) > 1_000, "tag {k}");
    }
    // The capacity line in red, and text (the title, rendered with the
    // embedded font) in the top rows.
    assert!(count(&px, plotters::style::RGBColor(0xcc, 0, 0)) > 300);
    assert!(
        dark_in_rows(&px, w, 0..30) > 100,
        "no title text in the PNG"
    );
}

#[test]
fn transitions_have_equal_widths_and_say_so() {
    let pic = plot::memory_transitions(&step_events(), None, "one step").unwrap();
    check_xml(&pic.svg);
    assert!(has_text(&pic.svg, "transition (equal widths, not time)"));
    assert!(!pic.svg.contains("capacity"));
    let (w, h, _) = decode(&pic);
    assert_eq!((w, h), (1000, 520));
}

#[test]
fn a_long_run_labels_each_phase_once() {
    let mut events = Vec::new();
    // A long first step, then 39 short ones: 80 phase changes.
    for step in 0..40 {
        let (t, len) = match step {
            0 => (0.0, 5.0),
            s => (10.0 + s as f64 * 0.5, 0.25),
        };
        events.push(event(t, "generate", EventKind::Phase, &[("kv_cache", MIB)]));
        events.push(event(
            t + len,
            "train",
            EventKind::Phase,
            &[("optimizer", MIB)],
        ));
    }
    let pic = plot::memory_timeline(&events, None, "80 phase changes").unwrap();
    assert_eq!(
        texts(&pic.svg).iter().filter(|t| *t == "generate").count(),
        1
    );
    assert_eq!(texts(&pic.svg).iter().filter(|t| *t == "train").count(), 1);
}

#[test]
fn a_long_run_is_thinned_keeping_its_peaks_and_phases() {
    let mark = |i: usize, bytes: u64| {
        event(
            i as f64,
            "generate",
            EventKind::Mark,
            &[("kv_cache", bytes)],
        )
    };
    let mut events: Vec<Event> = (0..50_000).map(|i| mark(i, (i % 7) as u64)).collect();
    events[0].kind = EventKind::Phase;
    events[31_337] = mark(31_337, 1000); // one spike
    events[40_000] = event(40_000.0, "train", EventKind::Phase, &[("kv_cache", 0)]);
    let drawn = plot::thin(&events, plot::TIME_SLICES);
    assert!(drawn.len() <= plot::TIME_SLICES + 3, "{}", drawn.len());
    assert!(drawn.iter().any(|e| e.resident_bytes == 1000), "the spike");
    assert!(drawn.iter().any(|e| e.phase == "train"), "the phase change");
    assert_eq!(drawn.first(), events.first());
    assert_eq!(drawn.last(), events.last());
    assert!(drawn.windows(2).all(|w| w[0].t_s < w[1].t_s), "in order");
    // A short run is drawn whole.
    let short = &events[..plot::MAX_DRAWN_EVENTS];
    assert_eq!(plot::thin(short, plot::TIME_SLICES).len(), short.len());
}

/// A 10,000-step run's ~170,000 events make a picture of bounded size (it
/// is drawn thinned), whose legend still gives each tag's whole-run peak.
#[test]
fn a_very_long_run_draws_a_bounded_picture_with_its_peaks() {
    let events: Vec<Event> = (0..170_000)
        .map(|i| {
            let kv = if i == 123_457 {
                9 * MIB
            } else {
                (i % 3) as u64 * MIB
            };
            event(
                i as f64 * 0.01,
                "generate",
                EventKind::Mark,
                &[("kv_cache", kv), ("optimizer", MIB)],
            )
        })
        .collect();
    let pic = plot::memory_timeline(&events, None, "10,000 steps").unwrap();
    check_xml(&pic.svg);
    assert!(pic.svg.len() < 2 << 20, "{} bytes of SVG", pic.svg.len());
    assert!(
        has_text(&pic.svg, "kv_cache  (max 9.0 MiB)"),
        "{:?}",
        texts(&pic.svg)
    );
    let workers = [("worker 0".to_string(), events)];
    let pic = plot::workers_timeline(&workers, None, "one worker").unwrap();
    assert!(pic.svg.len() < 2 << 20, "{} bytes of SVG", pic.svg.len());
    assert!(
        texts(&pic.svg).iter().any(|t| t.contains("peak 10.0 MiB")),
        "{:?}",
        texts(&pic.svg)
    );
}

#[test]
fn empty_timeline_is_still_a_picture() {
    let pic = plot::memory_timeline(&[], None, "nothing yet").unwrap();
    check_xml(&pic.svg);
    assert!(has_text(&pic.svg, "nothing yet"));
    decode(&pic);
}

#[test]
fn reward_curve_has_both_series_their_ranges_and_the_end_accuracies() {
    let scores: Vec<(usize, f64)> = (1..=50).map(|s| (s, 0.1 + 0.8 * s as f64 / 50.0)).collect();
    let acc = [(0, 0.22), (10, 0.31), (50, 0.71)];
    let pic = plot::reward_curve(&scores, &acc, &[], "GRPO").unwrap();
    let doc = &pic.svg;
    let names = check_xml(doc);
    assert!(
        names.iter().filter(|n| *n == "circle").count() >= 3,
        "markers"
    );
    assert!(
        has_text(doc, "critic/score/mean  (0.12–0.90)"),
        "{:?}",
        texts(doc)
    );
    assert!(has_text(doc, "eval/accuracy  (0.22–0.71)"));
    assert!(has_text(doc, "0.22") && has_text(doc, "0.71"), "end values");
    assert!(has_text(doc, "step") && has_text(doc, "GRPO"));
    let (w, h, px) = decode(&pic);
    assert_eq!((w, h), (900, 420));
    assert!(count(&px, plot::color(0)) > 500, "the score line");
    assert!(count(&px, plot::color(1)) > 200, "the accuracy line");
    assert!(dark_in_rows(&px, w, 0..30) > 20, "no title text in the PNG");
}

/// Held-out rows of two data sources: a thinner line each, named and
/// ranged in the legend; one source alone is the overall line, not drawn
/// twice.
#[test]
fn reward_curve_has_a_line_per_data_source() {
    let scores = [(1, 0.2), (10, 0.5)];
    let acc = [(0, 0.3), (10, 0.6)];
    let sources = [
        ("gsm8k".to_owned(), vec![(0, 0.4), (10, 0.8)]),
        ("math".to_owned(), vec![(0, 0.2), (10, 0.4)]),
    ];
    let pic = plot::reward_curve(&scores, &acc, &sources, "GRPO").unwrap();
    check_xml(&pic.svg);
    assert!(
        has_text(&pic.svg, "eval/accuracy/gsm8k  (0.40–0.80)"),
        "{:?}",
        texts(&pic.svg)
    );
    assert!(has_text(&pic.svg, "eval/accuracy/math  (0.20–0.40)"));
    let (_, _, px) = decode(&pic);
    assert!(
        count(&px, plot::color(2)) > 50 && count(&px, plot::color(3)) > 50,
        "both lines"
    );
    let one = plot::reward_curve(&scores, &acc, &sources[..1], "GRPO").unwrap();
    assert!(!has_text(&one.svg, "eval/accuracy/gsm8k  (0.40–0.80)"));
}

#[test]
fn a_picture_is_written_as_svg_and_png_side_by_side() {
    let dir = std::env::temp_dir().join(format!("colo-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pic = plot::reward_curve(&[(1, 0.5)], &[], &[], "one point").unwrap();
    pic.write(&dir, "curve").unwrap();
    assert_eq!(std::fs::read(dir.join("curve.png")).unwrap(), pic.png);
    assert_eq!(
        std::fs::read_to_string(dir.join("curve.svg")).unwrap(),
        pic.svg
    );
    let e = pic.write(&dir.join("missing"), "curve").unwrap_err();
    assert!(e.to_string().contains("missing/curve.svg"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
