//! The external-command reward against real child processes (python3 and sh).

mod common;

use std::time::{Duration, Instant};

use colo_reward::{self as reward, Error, ExternalReward, Reward, RewardInput, RewardSpec};
use common::TempDir;

/// Scores 1 when the completion equals the ground truth. Requests with
/// prompt "more" are held back and answered, in reverse order, with the next
/// request (colo must match answers by id). Dies on "CRASH", prints garbage
/// on "GARBAGE", hangs on "HANG".
const SCRIPT: &str = r#"
import json, sys, time
batch = []
def flush():
    for req in reversed(batch):
        print(json.dumps({"id": req["id"], "score": float(req["completion"].strip() == req["ground_truth"])}))
    sys.stdout.flush()
    batch.clear()
for line in sys.stdin:
    req = json.loads(line)
    c = req["completion"]
    if c == "CRASH":
        sys.stderr.write("boom: cannot score\n"); sys.stderr.flush(); sys.exit(3)
    if c == "GARBAGE":
        print("not json"); sys.stdout.flush(); continue
    if c == "HANG":
        time.sleep(30)
    batch.append(req)
    if req["prompt"] != "more":
        flush()
"#;

fn input<'a>(sample: u64, prompt: &'a str, completion: &'a str, truth: &'a str) -> RewardInput<'a> {
    RewardInput {
        sample,
        prompt_id: sample / 2,
        prompt,
        completion,
        ground_truth: truth,
        extra: None,
    }
}

fn python(dir: &TempDir, timeout: Duration, default: Option<f32>) -> ExternalReward {
    let script = dir.write("score.py", SCRIPT);
    ExternalReward::start(
        vec!["python3".into(), "-u".into(), script.display().to_string()],
        timeout,
        default,
    )
    .unwrap()
}

#[test]
fn scores_a_batch_answered_out_of_order_and_stays_alive() {
    let dir = TempDir::new("ext-ok");
    let mut r = python(&dir, Duration::from_secs(20), None);
    let batch = [
        input(10, "more", "19", "19"),
        input(11, "more", " 7\n", "7"),
        input(12, "last", "8", "9"),
    ];
    assert_eq!(r.score_batch(&batch).unwrap(), vec![1.0, 1.0, 0.0]);
    // The same process serves the next batch.
    assert_eq!(r.score(&input(13, "q", "x", "x")).unwrap(), 1.0);
    assert_eq!(r.failures, 0);
}

#[test]
fn built_from_the_config_enum() {
    let dir = TempDir::new("ext-spec");
    let script = dir.write("score.py", SCRIPT);
    let spec: RewardSpec = toml::from_str(&format!(
        "kind = \"external\"\ncommand = [\"python3\", {:?}]\ntimeout_s = 20",
        script.display().to_string()
    ))
    .unwrap();
    let mut r = reward::build(&spec).unwrap();
    assert_eq!(r.score(&input(0, "q", "a", "a")).unwrap(), 1.0);
    assert!(r.name().contains("score.py"), "{}", r.name());
}

#[test]
fn a_crash_names_the_sample_and_quotes_stderr_then_restarts() {
    let dir = TempDir::new("ext-crash");
    let mut r = python(&dir, Duration::from_secs(20), None);
    let e = r
        .score_batch(&[input(4, "more", "1", "1"), input(5, "last", "CRASH", "1")])
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::Score {
                sample: 4 | 5,
                prompt_id: 2,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("exited"), "{msg}");
    assert!(msg.contains("exit status: 3"), "{msg}");
    assert!(msg.contains("boom: cannot score"), "{msg}");
    // The next batch gets a fresh process.
    assert_eq!(r.score(&input(6, "q", "2", "2")).unwrap(), 1.0);
}

#[test]
fn bad_output_is_an_error_naming_the_sample() {
    let dir = TempDir::new("ext-bad");
    let mut r = python(&dir, Duration::from_secs(20), None);
    let e = r.score(&input(9, "q", "GARBAGE", "1")).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("reward `external `python3 -u"), "{msg}");
    assert!(
        msg.contains("failed on sample 9 (prompt 4): bad answer line \"not json\""),
        "{msg}"
    );
}

#[test]
fn a_hang_times_out() {
    let dir = TempDir::new("ext-hang");
    let mut r = python(&dir, Duration::from_millis(500), None);
    let t = Instant::now();
    let e = r.score(&input(1, "q", "HANG", "1")).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(
        e.to_string()
            .contains("sample 1 (prompt 0): no answer within 500ms"),
        "{e}"
    );
}

#[test]
fn default_score_replaces_failures_and_counts_them() {
    let dir = TempDir::new("ext-default");
    let mut r = python(&dir, Duration::from_secs(20), Some(-1.0));
    let s = r
        .score_batch(&[
            input(0, "q", "3", "3"),
            input(1, "q", "CRASH", "3"),
            input(2, "q", "3", "3"),
        ])
        .unwrap();
    assert_eq!(
        s,
        vec![1.0, -1.0, -1.0],
        "answered before the crash are kept"
    );
    assert_eq!(r.failures, 2);
    assert_eq!(r.score(&input(3, "q", "4", "4")).unwrap(), 1.0, "restarted");
}

#[test]
fn shell_commands_work_too_and_missing_programs_are_setup_errors() {
    // A reward in sh: every answer scores 0.5 (ids echoed with sed).
    let mut r = ExternalReward::start(
        vec![
            "sh".into(),
            "-c".into(),
            r#"while read -r line; do echo "$line" | sed 's/^{"id":\([0-9]*\).*/{"id":\1,"score":0.5}/'; done"#.into(),
        ],
        Duration::from_secs(20),
        None,
    )
    .unwrap();
    assert_eq!(
        r.score_batch(&[input(0, "a", "b", "c"), input(1, "a", "b", "c")])
            .unwrap(),
        vec![0.5, 0.5]
    );

    let e = ExternalReward::start(
        vec!["/nonexistent/scorer".into()],
        Duration::from_secs(1),
        None,
    )
    .err()
    .unwrap();
    assert!(
        e.to_string().contains("cannot start `/nonexistent/scorer`"),
        "{e}"
    );
}

/// A child that never answers and ignores its stdin closing: `sh` writes
/// its pid, then becomes `sleep 30`.
fn sleeper(dir: &TempDir, timeout: Duration) -> (ExternalReward, u32) {
    let pid_file = dir.path().join("pid");
    let r = ExternalReward::start(
        vec![
            "sh".into(),
            "-c".into(),
            format!("echo $$ > '{}'; exec sleep 30", pid_file.display()),
        ],
        timeout,
        Some(0.25),
    )
    .unwrap();
    let t = Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no pid written");
        std::thread::sleep(Duration::from_millis(10));
    };
    (r, pid)
}

fn alive(pid: u32) -> bool {
    // The child is reaped by colo, so a dead one has no /proc entry left.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_timeout_kills_a_sleeping_child_within_the_bound() {
    let dir = TempDir::new("ext-sleep");
    let (mut r, pid) = sleeper(&dir, Duration::from_millis(300));
    assert!(alive(pid));
    let t = Instant::now();
    let s = r.score(&input(0, "q", "a", "a")).unwrap();
    let took = t.elapsed();
    assert_eq!(s, 0.25, "the default score");
    assert_eq!(r.failures, 1);
    // 300 ms for the answer, at most 200 ms for an exit status, then kill.
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(!alive(pid), "the child {pid} was killed");
}

#[test]
fn dropping_kills_a_child_that_ignores_its_stdin_closing() {
    let dir = TempDir::new("ext-drop");
    let (r, pid) = sleeper(&dir, Duration::from_secs(20));
    let t = Instant::now();
    drop(r);
    let took = t.elapsed();
    assert!(
        took >= reward::FINISH_GRACE && took < reward::FINISH_GRACE + Duration::from_secs(2),
        "{took:?}"
    );
    assert!(!alive(pid), "the child {pid} was killed");
}

/// An answer may carry other numbers beside its score (`"extra"`); one
/// whose `extra` holds text is a bad answer naming its sample.
#[test]
fn an_answer_may_carry_extra_numbers() {
    let dir = TempDir::new("ext-extra");
    let script = dir.write(
        "extra.py",
        "import json, sys\n\
         for line in sys.stdin:\n\
         \x20   req = json.loads(line)\n\
         \x20   extra = {'len': len(req['completion'])} if req['completion'] != 'TEXT' else {'pred': 'x'}\n\
         \x20   print(json.dumps({'id': req['id'], 'score': 0.5, 'extra': extra}), flush=True)\n",
    );
    let command = vec!["python3".into(), script.display().to_string()];
    let mut r = ExternalReward::start(command, Duration::from_secs(20), None).unwrap();
    let scored = r
        .score_batch_extra(&[input(0, "q", "abc", "x"), input(1, "q", "", "x")])
        .unwrap();
    let lens: Vec<(f32, f64)> = scored.iter().map(|s| (s.score, s.extra["len"])).collect();
    assert_eq!(lens, vec![(0.5, 3.0), (0.5, 0.0)]);
    let msg = r
        .score_batch_extra(&[input(7, "q", "TEXT", "x")])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("failed on sample 7") && msg.contains("optionally \"extra\": {name: number}"),
        "{msg}"
    );
}
