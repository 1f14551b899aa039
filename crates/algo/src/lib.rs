//! colo-algo (being written)
