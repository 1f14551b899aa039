fn main() {
    colo_build::link_libtorch();
}
