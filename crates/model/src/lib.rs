//! colo-model (being written)
