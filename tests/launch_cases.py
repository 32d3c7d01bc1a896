"""Launch cases the issue names: dense, MoE on NVL72, uneven and interleaved splits,
FSDP with FP8 parameter gather, each precision, recompute and offload variants.

Shared by the recorded-name tests and the optional Megatron-LM integration test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parsearch.cost.memory import MemoryOptions
from parsearch.cost.options import CostOptions
from parsearch.launch import LaunchSettings, launch_for_cluster
from parsearch.layout import Layout
from parsearch.model.files import resolve_model
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.hardware import load_gpu_profile

FP8_GATHER = CostOptions(param_gather_bytes=1.0, memory=MemoryOptions(fp8_param_gather=True))


@dataclass(frozen=True)
class LaunchCase:
    name: str
    model_name: str
    cluster_name: str
    layout: Layout
    training: TrainingSpec
    options: CostOptions = field(default_factory=CostOptions)
    fp8_recipe: str = "auto"

    @property
    def model(self) -> ModelSpec:
        return resolve_model(self.model_name)

    @property
    def compute_capability(self) -> float:
        capability = load_gpu_profile(load_cluster(self.cluster_name).gpu).compute_capability
        assert capability is not None
        return capability

    def settings(self) -> LaunchSettings:
        return launch_for_cluster(self.model, self.training, self.layout,
                                  load_cluster(self.cluster_name), options=self.options,
                                  fp8_recipe=self.fp8_recipe)


def _t(**kw: object) -> TrainingSpec:
    base: dict[str, object] = {"seq_len": 8192, "global_batch": 256}
    base.update(kw)
    return TrainingSpec(**base)  # type: ignore[arg-type]


LAUNCH_CASES: tuple[LaunchCase, ...] = (
    LaunchCase("dense-bf16-h100", "llama3-70b", "dgx-h100",
               Layout(num_gpus=64, tp=8, pp=4, sp=True, mbs=1), _t()),
    LaunchCase("dense-interleaved", "llama3-70b", "dgx-h100",
               Layout(num_gpus=64, tp=4, pp=4, vpp=5, sp=True, mbs=1), _t()),
    LaunchCase("dense-uneven-split", "llama3-8b", "dgx-h100",
               Layout(num_gpus=24, tp=2, pp=3, sp=True, mbs=1), _t(global_batch=64)),
    LaunchCase("dense-uneven-interleaved", "llama3-8b", "dgx-h100",
               Layout(num_gpus=48, tp=2, pp=3, vpp=3, sp=True, mbs=1), _t(global_batch=64)),
    LaunchCase("dense-fp8-tensorwise-h100", "llama3-70b", "dgx-h100",
               Layout(num_gpus=64, tp=8, pp=2, sp=True, mbs=1), _t(precision="fp8")),
    LaunchCase("dense-fp8-mxfp8-b200", "llama3-70b", "dgx-b200",
               Layout(num_gpus=64, tp=4, pp=2, sp=True, mbs=1), _t(precision="fp8"),
               FP8_GATHER),
    LaunchCase("dense-fp4-b200", "llama3-70b", "dgx-b200",
               Layout(num_gpus=64, tp=4, pp=2, sp=True, mbs=1), _t(precision="fp4")),
    LaunchCase("fsdp-fp8-param-gather", "llama3-70b", "dgx-h100",
               Layout(num_gpus=64, tp=2, sp=True, mbs=1),
               _t(precision="fp8", fsdp=True), FP8_GATHER),
    LaunchCase("dense-selective-recompute", "llama3-8b", "dgx-h100",
               Layout(num_gpus=16, tp=2, sp=True, mbs=2, recompute="selective"),
               _t(global_batch=64, recompute_modules=("core_attn", "mlp"))),
    LaunchCase("dense-full-block-recompute", "llama3-70b", "dgx-h100",
               Layout(num_gpus=32, tp=8, pp=4, sp=True, mbs=1, recompute="full"),
               _t(recompute_num_layers=4)),
    LaunchCase("dense-offload", "llama3-8b", "dgx-h100",
               Layout(num_gpus=16, tp=2, sp=True, mbs=1), _t(activation_offload_layers=4),
               CostOptions()),
    LaunchCase("dense-cuda-graphs", "llama3-8b", "dgx-b200",
               Layout(num_gpus=16, tp=2, sp=True, mbs=1), _t(), CostOptions(cuda_graphs=True)),
    LaunchCase("dense-bf16-optimizer-state", "llama3-8b", "dgx-h100",
               Layout(num_gpus=16, tp=2, sp=True, mbs=1),
               _t(global_batch=64, grad_bytes=2.0, optimizer_bytes=8.0)),
    LaunchCase("moe-nvl72-flex", "deepseek-v3", "gb200-nvl72",
               Layout(num_gpus=256, tp=1, pp=8, ep=32, etp=1, vpp=1, mbs=1),
               _t(seq_len=4096, global_batch=4096, precision="fp8"),
               CostOptions(moe_dispatcher="flex")),
    LaunchCase("moe-mxfp8-fusions-gb300", "qwen3-30b-a3b", "gb300-nvl72",
               Layout(num_gpus=8, tp=1, pp=1, ep=8, mbs=8),
               _t(seq_len=4096, global_batch=512, precision="fp8"),
               CostOptions(moe_dispatcher="flex", moe_a2a_overlap=True, cuda_graphs=True,
                           fp8_attention=True, fp8_output_proj=True, fused_expert_mlp=True)),
    LaunchCase("moe-alltoall-a2a-overlap", "qwen3-30b-a3b", "dgx-h100",
               Layout(num_gpus=64, tp=1, pp=2, ep=8, mbs=1, vpp=2), _t(seq_len=4096),
               CostOptions(moe_a2a_overlap=True)),
    LaunchCase("moe-partial-last-node", "mixtral-8x7b", "dgx-h100",
               Layout(num_gpus=12, tp=2, pp=2, ep=2, mbs=1, sp=True), _t(global_batch=60)),
)
