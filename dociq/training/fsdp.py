"""Fully sharded data parallel (PyTorch's FSDP2, `fully_shard`) through Lightning's
ModelParallelStrategy, registered as `trainer.strategy: fsdp2` (configs/trainer/fsdp_cpu.yaml, fsdp.yaml).

Every rank holds 1/world of each weight, gradient and optimizer state (rows of dim 0: DTensors
with `Shard(0)`); a unit's weights are all-gathered for its forward and backward and its
gradients reduce-scattered after. The units (`shard_task`) are the blocks of the model's
layer lists (transformer blocks, whatever encoder they are in), and the task itself is the
root unit holding the rest. The task's steps call its models through methods other than
`forward` (`model.ground(...)`), so the root unit gathers its weights around `training_step`
and `validation_step` (`register_fsdp_forward_method`) instead of around a `forward`.

Every optimizer works on DTensor parameters; SubspaceNGD keeps its subspace state sharded too
(dociq/optim/sngd.py). Checkpoints are full single-file checkpoints by default
(`save_distributed_checkpoint: false`): rank 0 writes the same file a single process writes,
so the Predictor and a one-process resume read it as they read any other.
"""
from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch import nn

STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")


def _block_lists(module: nn.Module) -> list[nn.ModuleList]:
    """The outermost ModuleLists/Sequentials of `module` whose elements hold parameters."""
    found = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, (nn.ModuleList, nn.Sequential)) and len(child) > 1 \
                    and sum(1 for b in child if any(True for _ in b.parameters())) > 1:
                found.append(child)
            else:
                visit(child)
    visit(module)
    return found


def shard_task(task: nn.Module, mesh) -> None:
    """Apply `fully_shard` to every block of the task's layer lists, then to the task (the root
    unit, gathered around each step method)."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for blocks in _block_lists(task):
        for block in blocks:
            if any(True for _ in block.parameters()):
                fully_shard(block, mesh=mesh)
    fully_shard(task, mesh=mesh)
    for name in STEP_METHODS:
        if callable(getattr(task, name, None)):
            register_fsdp_forward_method(task, name)


class FSDP2Strategy(ModelParallelStrategy):
    """ModelParallelStrategy as pure data-parallel sharding: one mesh dimension over every
    process of every node, no tensor parallelism; full checkpoints unless asked otherwise."""

    strategy_name = "fsdp2"

    def __init__(self, save_distributed_checkpoint: bool = False, **kwargs) -> None:
        super().__init__(data_parallel_size=1, tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)

    def setup_environment(self) -> None:
        # The mesh is (data_parallel, tensor_parallel) = (every process, 1): FSDP shards over all of them.
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        # torch fills a full checkpoint's optimizer state into the state each rank already holds
        # (its shards are the templates); an optimizer that creates state lazily makes it now.
        for optimizer in self.optimizers:
            inner = getattr(optimizer, "optimizer", optimizer)
            if not inner.state and hasattr(inner, "init_state"):
                inner.init_state()
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)

    @classmethod
    def register_strategies(cls, registry) -> None:
        registry.register(cls.strategy_name, cls, override=True,
                          description="FSDP2 (fully_shard) over every process, full checkpoints")


def data_parallel_mesh(task: nn.Module):
    """The 1-D mesh FSDP shards over, from the strategy's (data_parallel, tensor_parallel) mesh;
    None when the task is not trained under fsdp2."""
    mesh = getattr(task, "_device_mesh", None)
    if mesh is None:
        return None
    if mesh.mesh_dim_names and "tensor_parallel" in mesh.mesh_dim_names and mesh["tensor_parallel"].size() > 1:
        raise ValueError("dociq shards with FSDP only (trainer.strategy=fsdp2); tensor parallelism is not supported")
    return mesh["data_parallel"] if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names else mesh


FSDP2Strategy.register_strategies(StrategyRegistry)
