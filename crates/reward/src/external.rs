//! A reward computed by a long-lived child process, for rewards written in
//! other languages.
//!
//! Protocol (JSON lines on the child's stdin and stdout): colo writes one
//! request per sample, `{"id": 7, "prompt": "…", "completion": "…",
//! "ground_truth": "…", "row": {…}}` (`row`: the dataset row's other
//! fields, when it has any), and the child answers each with one line
//! `{"id": 7, "score": 1.0}`, in any order; an answer may carry other
//! numbers, `"extra": {"acc": 1.0}` (a verl reward function's dict beyond
//! its score, [`super::Scored::extra`]). A child started with a
//! handshake (the `python` reward's adapter) first writes one line
//! `{"ready": …}` once it has loaded, so that a reward that cannot load is
//! an error before the run starts. The child is started once and
//! kept for the whole run; colo closes its stdin at the end. Its stderr is
//! kept (the last few KiB) and quoted when it fails.
//!
//! A failure — a line that is not such an answer, the child exiting, no
//! answer within `timeout` — stops the child (its state is unknown; it is
//! restarted for the next batch) and is an error naming the sample, or, with
//! a `default_score`, gives every sample still unanswered that score.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wait_timeout::ChildExt;

use super::{Reward, RewardInput, Scored};
use crate::{Error, Result};

/// How much of the child's stderr is kept for error messages.
const STDERR_TAIL: usize = 4096;

/// How long a child that stopped answering gets to exit, so that its status
/// and last words are in the error message.
const EXIT_GRACE: Duration = Duration::from_millis(200);

/// How long a child gets to finish after its stdin is closed at the end of
/// the run, before it is killed.
pub const FINISH_GRACE: Duration = Duration::from_secs(1);

/// See the module documentation.
pub struct ExternalReward {
    command: Vec<String>,
    /// What messages and metrics call it.
    label: String,
    /// Wait for a `{"ready": …}` line after each start.
    handshake: bool,
    timeout: Duration,
    default_score: Option<f32>,
    child: Option<Running>,
    /// Samples that got `default_score` because the command failed.
    pub failures: u64,
}

struct Running {
    child: Child,
    /// To the thread that writes the child's stdin (so that a child that
    /// stops reading cannot block us past the timeout); dropping it closes
    /// the child's stdin.
    requests: Option<Sender<Vec<u8>>>,
    lines: Receiver<std::io::Result<String>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

#[derive(Serialize)]
struct Request<'a> {
    id: u64,
    prompt: &'a str,
    completion: &'a str,
    ground_truth: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    row: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

#[derive(Deserialize)]
struct Response {
    id: u64,
    score: f64,
    #[serde(default)]
    extra: BTreeMap<String, f64>,
}

/// Why a batch stopped, and which sample is to blame.
struct Failure {
    index: usize,
    reason: String,
}

impl ExternalReward {
    /// Starts `command` (program and arguments).
    pub fn start(
        command: Vec<String>,
        timeout: Duration,
        default_score: Option<f32>,
    ) -> Result<Self> {
        let label = format!("external `{}`", command.join(" "));
        Self::start_labelled(command, label, false, timeout, default_score)
    }

    /// [`ExternalReward::start`] with the name messages use and, with
    /// `handshake`, a wait (up to `timeout`) for the child's `{"ready": …}`
    /// line after every start.
    pub(crate) fn start_labelled(
        command: Vec<String>,
        label: String,
        handshake: bool,
        timeout: Duration,
        default_score: Option<f32>,
    ) -> Result<Self> {
        let mut r = ExternalReward {
            command,
            label,
            handshake,
            timeout,
            default_score,
            child: None,
            failures: 0,
        };
        r.child = Some(r.spawn()?);
        Ok(r)
    }

    fn spawn(&self) -> Result<Running> {
        let (program, args) = self.command.split_first().ok_or_else(|| Error::Setup {
            reward: "external".into(),
            reason: "empty command".into(),
        })?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Setup {
                reward: self.name(),
                reason: format!("cannot start `{program}`: {e}"),
            })?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut err_pipe = child.stderr.take().expect("piped");
        let tail = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                t.extend_from_slice(&buf[..n]);
                let excess = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..excess);
            }
        });
        let mut stdin = child.stdin.take().expect("piped");
        let (requests, rx) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for payload in rx {
                // A child that died is noticed on its stdout (EOF).
                if stdin
                    .write_all(&payload)
                    .and_then(|()| stdin.flush())
                    .is_err()
                {
                    break;
                }
            }
        });
        let mut run = Running {
            requests: Some(requests),
            child,
            lines,
            stderr,
        };
        if self.handshake {
            if let Err(reason) = self.wait_ready(&mut run) {
                let _ = run.child.kill();
                let _ = run.child.wait();
                return Err(Error::Setup {
                    reward: self.name(),
                    reason,
                });
            }
        }
        Ok(run)
    }

    /// The child's first line, which must be `{"ready": …}`.
    fn wait_ready(&self, run: &mut Running) -> std::result::Result<(), String> {
        let line = match run.lines.recv_timeout(self.timeout) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => return Err(format!("cannot read its output: {e}")),
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!("not ready within {:?}", self.timeout))
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(format!("it exited before it was ready{}", run.exit_note()))
            }
        };
        match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(v) if v.get("ready").is_some() => Ok(()),
            _ => Err(format!(
                "expected a {{\"ready\": …}} line first, got {line:?}"
            )),
        }
    }

    /// Sends the batch and collects the answers; `scores[i]` is filled for
    /// each answered sample.
    fn exchange(
        &mut self,
        inputs: &[RewardInput<'_>],
        scores: &mut [Option<Scored>],
    ) -> std::result::Result<(), Failure> {
        let mut index: HashMap<u64, usize> = HashMap::new();
        for (i, input) in inputs.iter().enumerate() {
            if index.insert(input.sample, i).is_some() {
                return Err(Failure {
                    index: i,
                    reason: "two samples of the batch have this id".into(),
                });
            }
        }
        if self.child.is_none() {
            self.child = Some(self.spawn().map_err(|e| Failure {
                index: 0,
                reason: e.to_string(),
            })?);
        }
        let run = self.child.as_mut().expect("started above");
        // One write of the whole batch (by the writer thread) while the
        // reader thread drains stdout: a child that answers as it reads
        // cannot deadlock us.
        let mut payload = Vec::new();
        for i in inputs {
            let req = Request {
                id: i.sample,
                prompt: i.prompt,
                completion: i.completion,
                ground_truth: i.ground_truth,
                row: i.extra.filter(|r| !r.is_empty()),
            };
            serde_json::to_writer(&mut payload, &req).expect("strings and JSON values serialise");
            payload.push(b'\n');
        }
        let sent = run.requests.as_ref().map(|tx| tx.send(payload));
        if !matches!(sent, Some(Ok(()))) {
            return Err(Failure {
                index: 0,
                reason: format!("cannot write to the command{}", run.exit_note()),
            });
        }
        let mut pending = inputs.len();
        while pending > 0 {
            let waiting = first_pending(scores);
            let line = match run.lines.recv_timeout(self.timeout) {
                Ok(Ok(line)) => line,
                Ok(Err(e)) => {
                    return Err(Failure {
                        index: waiting,
                        reason: format!("cannot read the command's output: {e}"),
                    })
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Failure {
                        index: waiting,
                        reason: format!("no answer within {:?}", self.timeout),
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Failure {
                        index: waiting,
                        reason: format!("the command exited{}", run.exit_note()),
                    })
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            let (i, score) = read_answer(&line, &index, waiting, scores)?;
            scores[i] = Some(score);
            pending -= 1;
        }
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(mut run) = self.child.take() {
            let _ = run.child.kill();
            let _ = run.child.wait();
        }
    }
}

/// `(index in the batch, score)` of one answer line; a bad line blames the
/// sample it names, or else the first one still `waiting`.
fn read_answer(
    line: &str,
    index: &HashMap<u64, usize>,
    waiting: usize,
    scores: &[Option<Scored>],
) -> std::result::Result<(usize, Scored), Failure> {
    let bad = |index, why: &str| Failure {
        index,
        reason: format!("bad answer line {line:?}: {why}"),
    };
    let resp: Response = serde_json::from_str(line).map_err(|e| {
        // Blame the sample the line names, if it names one.
        let named = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v["id"].as_u64())
            .and_then(|id| index.get(&id).copied());
        bad(
            named.unwrap_or(waiting),
            &format!(
                "expected {{\"id\", \"score\"}} and optionally \"extra\": {{name: number}} ({e})"
            ),
        )
    })?;
    let Some(&i) = index.get(&resp.id) else {
        return Err(bad(waiting, "unknown id"));
    };
    if scores[i].is_some() {
        return Err(bad(i, "second answer for this id"));
    }
    // Scores are float32 in training: one beyond its range (±3.4e38)
    // would be infinite there.
    let score = resp.score as f32;
    if !score.is_finite() {
        return Err(bad(
            i,
            &format!(
                "score {:e} is beyond float32's range (±3.4e38), which scores are kept in",
                resp.score
            ),
        ));
    }
    Ok((
        i,
        Scored {
            score,
            extra: resp.extra,
        },
    ))
}

fn first_pending(scores: &[Option<Scored>]) -> usize {
    scores.iter().position(Option::is_none).unwrap_or(0)
}

impl Running {
    /// ", status …; stderr: …" for a child that has exited, else "".
    fn exit_note(&mut self) -> String {
        // Give an exiting child a moment so that its status and last words
        // are in the message.
        let Ok(Some(status)) = self.child.wait_timeout(EXIT_GRACE) else {
            return String::new();
        };
        let tail = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let tail = String::from_utf8_lossy(&tail);
        match tail.trim() {
            "" => format!(" ({status})"),
            t => format!(" ({status}); its stderr ends with:\n{t}"),
        }
    }
}

impl Reward for ExternalReward {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn failures(&self) -> u64 {
        self.failures
    }

    fn score(&mut self, input: &RewardInput<'_>) -> Result<f32> {
        Ok(self.score_batch(std::slice::from_ref(input))?[0])
    }

    fn score_batch(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<f32>> {
        Ok(Scored::scores(self.score_batch_extra(inputs)?))
    }

    fn score_batch_extra(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<Scored>> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let mut scores = vec![None; inputs.len()];
        if let Err(f) = self.exchange(inputs, &mut scores) {
            self.stop();
            let Some(default) = self.default_score else {
                return Err(inputs[f.index].fail(&self.name(), f.reason));
            };
            for s in scores.iter_mut().filter(|s| s.is_none()) {
                *s = Some(Scored::plain(default));
                self.failures += 1;
            }
        }
        Ok(scores.into_iter().map(|s| s.expect("all filled")).collect())
    }
}

impl Drop for ExternalReward {
    /// Closes the child's stdin (its signal to finish) and gives it
    /// [`FINISH_GRACE`] before killing it.
    fn drop(&mut self) {
        if let Some(run) = self.child.as_mut() {
            drop(run.requests.take());
            if let Ok(Some(_)) = run.child.wait_timeout(FINISH_GRACE) {
                return;
            }
        }
        self.stop();
    }
}
