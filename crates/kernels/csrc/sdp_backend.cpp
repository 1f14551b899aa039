// libtorch's cuDNN backend of scaled_dot_product_attention, on or off for
// the process (torch.backends.cuda.enable_cudnn_sdp in Python). On Hopper
// GPUs it compiles a kernel at run time for each new shape: 1.1-1.8 s each
// in bf16 on an H200 (BENCHMARKS.md, `colo gpu-check`), where the other
// backends take about a millisecond. A plain flag in libtorch's global
// context: safe to read and write from any thread between passes.

#include <ATen/Context.h>

extern "C" {

void colo_torch_set_cudnn_sdp(bool on) { at::globalContext().setSDPUseCuDNN(on); }

bool colo_torch_cudnn_sdp() { return at::globalContext().userEnabledCuDNNSDP(); }

}  // extern "C"
