//! LoRA in the plan: training state for the adapters only, no reference
//! copy, and what that buys at a fixed device.

use colo_plan::config::{ModelSource, PlanInput, GIB};
use colo_plan::lora::LoraInput;
use colo_plan::memory::{component_sizes, estimate};
use colo_plan::report::Component;

fn one_device(model: &str, gib: f64, lora: Option<u64>) -> PlanInput {
    PlanInput {
        model: ModelSource::Preset(model.into()),
        devices: 1,
        device_memory_gib: gib,
        reference: true,
        lora: lora.map(|rank| LoraInput {
            rank,
            target_modules: vec!["all-linear".into()],
        }),
        ..Default::default()
    }
}

#[test]
fn lora_optimizer_bytes_are_under_a_tenth_of_full_fine_tunings() {
    for model in ["qwen2.5-0.5b", "qwen2.5-7b"] {
        let full = component_sizes(&one_device(model, 141.0, None).validate().unwrap());
        let plan = one_device(model, 141.0, Some(8)).validate().unwrap();
        let lora = component_sizes(&plan);
        let adapters = plan.model.lora_params(plan.lora.as_ref().unwrap());
        assert!(
            lora.optimizer * 10 < full.optimizer,
            "{model}: {} vs {}",
            lora.optimizer,
            full.optimizer
        );
        // Mixed-precision AdamW: 12 bytes of float32 state, 2 of
        // gradient per adapter parameter; the weights stay, frozen.
        assert_eq!(lora.optimizer, 12 * adapters, "{model}");
        assert_eq!(lora.train_grads, 2 * adapters, "{model}");
        assert_eq!(lora.train_params, full.train_params + 2 * adapters);
        assert_eq!(lora.ref_params, 0, "{model}: the reference is the base");
        assert!(full.ref_params > 0);
    }
}

#[test]
fn a_lora_step_holds_no_reference_copy_and_fits_where_full_fine_tuning_does_not() {
    // An 80 GiB GPU (an H100), a KV cache of 32 Ki tokens.
    let on_h100 = |lora| PlanInput {
        kv_tokens: Some(32 * 1024),
        ..one_device("qwen2.5-7b", 80.0, lora)
    };
    let full = estimate(&on_h100(None).validate().unwrap()).unwrap();
    let lora = estimate(&on_h100(Some(16)).validate().unwrap()).unwrap();
    assert!(lora.phases.iter().all(|p| p.get(Component::RefParams) == 0));
    assert!(full.phase("ref_logprob").unwrap().get(Component::RefParams) > 0);
    // The reference pass reads the trainer's weights.
    assert!(
        lora.phase("ref_logprob")
            .unwrap()
            .get(Component::TrainParams)
            > 0
    );
    let (f, l) = (
        full.phase("training").unwrap(),
        lora.phase("training").unwrap(),
    );
    // Gradients and AdamW state of 7.6 B parameters (14 + 85 GiB) are gone.
    assert!(
        l.total_bytes + 95 * GIB < f.total_bytes,
        "{} vs {}",
        l.total_bytes,
        f.total_bytes
    );
    // A 7B model's full fine-tuning (bf16 mixed precision) does not fit
    // one 80 GiB device; LoRA does, with its reference.
    assert!(
        !full.fits && lora.fits,
        "{} / {} GiB",
        full.peak_bytes / GIB,
        lora.peak_bytes / GIB
    );
}

#[test]
fn the_sync_holds_one_merged_layer_beside_the_weights() {
    let base = one_device("qwen2.5-0.5b", 80.0, None);
    let plan = one_device("qwen2.5-0.5b", 80.0, Some(8))
        .validate()
        .unwrap();
    let (full, lora) = (
        component_sizes(&base.validate().unwrap()),
        component_sizes(&plan),
    );
    let merged = plan
        .model
        .lora_merged_layer_params(plan.lora.as_ref().unwrap())
        * 2;
    assert_eq!(lora.sync_buffer, lora.train_params + merged);
    assert!(lora.sync_buffer < full.sync_buffer + merged + lora.train_params / 50);
}
