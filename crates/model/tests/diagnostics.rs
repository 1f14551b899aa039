//! colo-model's diagnostics go through `log`, so that the program using it
//! decides where they go and how loud (`colo` prints them on stderr).

mod common;

use std::sync::Mutex;

use colo_model::{Model, ModelConfig, Weights};
use common::*;
use tch::{Device, Kind};

/// Every record colo-model logged in this test binary.
static RECORDS: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        if record.target().starts_with("colo_model") {
            let line = (record.level(), record.args().to_string());
            RECORDS.lock().unwrap().push(line);
        }
    }
    fn flush(&self) {}
}

/// A config.json with fewer layers than its weights: one warning naming
/// the directory and the unused tensors, however often it is loaded.
#[test]
fn unused_tensors_are_one_logged_warning_per_checkpoint() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let dir = fixture_dir("tiny-llama");
    let w = Weights::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
    let mut cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    cfg.num_layers -= 1;
    Model::load(&cfg, &w).unwrap();
    Model::load(&cfg, &w).unwrap();
    let records = RECORDS.lock().unwrap().clone();
    let [(level, msg)] = &records[..] else {
        panic!("expected one record, got {records:?}");
    };
    assert_eq!(*level, log::Level::Warn);
    let unused = format!("model.layers.{}.", cfg.num_layers);
    assert!(
        msg.starts_with(&format!("{}: ", dir.display()))
            && msg.contains("tensors of the checkpoint are not used by the model")
            && msg.contains(&unused),
        "{msg}"
    );
}
