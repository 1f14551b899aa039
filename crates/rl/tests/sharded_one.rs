//! `[cluster] sharding = "full"` on one device, without Ray: the actor is
//! colo-train's sharded trainer with one shard (its gathers and
//! reduce-scatters copies, as a sharded rank of one runs on Ray with NCCL
//! at world size 1), and it trains as the unsharded actor does.

use std::path::Path;

use colo_rl::Config;

mod common;

use common::steps_of;

fn config(dir: &Path, sharding: &str) -> Config {
    common::parity_run(dir)
        .with(&format!(
            r#"
[model]
enable_gradient_checkpointing = true

[trainer]
dtype = "f32"
total_steps = 2
save_freq = -1
test_freq = -1

[cluster]
sharding = "{sharding}"
"#
        ))
        .config(dir)
}

#[test]
fn one_sharded_device_trains_as_the_unsharded_actor() {
    let dir = common::tmp("sharded-one", "run");
    let whole = dir.join("none");
    colo_rl::step::run(&config(&dir, "none"), &whole, false).unwrap();
    let sharded = dir.join("full");
    colo_rl::step::run(&config(&dir, "full"), &sharded, false).unwrap();
    let (a, b) = (steps_of(&whole), steps_of(&sharded));
    assert_eq!((a.len(), b.len()), (2, 2));
    for (step, (a, b)) in a.iter().zip(&b).enumerate() {
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-4 * y.abs().max(1e-3);
        assert!(
            close(b.pg_loss, a.pg_loss) && close(b.grad_norm, a.grad_norm),
            "step {step}: sharded pg_loss {} grad_norm {} against {} {}",
            b.pg_loss,
            b.grad_norm,
            a.pg_loss,
            a.grad_norm
        );
        // The sharded actor's collectives ran (and moved nothing: one
        // shard); the unsharded one has none.
        assert_eq!(b.reshard_sent_bytes, Some(0), "step {step}");
        assert_eq!(b.reshard_recv_bytes, Some(0), "step {step}");
        assert!(
            b.shard_collectives_s.is_some_and(|s| s > 0.0),
            "step {step}"
        );
        assert_eq!(a.reshard_sent_bytes, None, "step {step}");
    }
    // Its units were gathered into the pool's `gathered_params` tag.
    let timeline = std::fs::read_to_string(sharded.join("timeline.jsonl")).unwrap();
    assert!(
        timeline.contains("\"gathered_params\""),
        "no gathered_params tag"
    );
    let timeline = std::fs::read_to_string(whole.join("timeline.jsonl")).unwrap();
    assert!(!timeline.contains("\"gathered_params\""));
    std::fs::remove_dir_all(&dir).ok();
}
