//! colo-plan (being written)
