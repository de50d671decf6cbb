"""DistOpt(shard="parameters") (ZeRO stage 3) on SINGA-style Python models: the model's layers as layer
groups, on 2 and 3 CPU ranks (distopt_shard_params_worker.py under `tandem launch`)."""
import sys

import pytest

from conftest import HERE, needs_gloo, run, tandem_command

TRAINED = [f"{kind} {optimizer}: {what} as shard none"
           for kind, optimizer in (("mlp", "sgd"), ("mlp", "adam"), ("cnn", "sgd"), ("cnn", "adam"),
                                   ("branches", "adam"), ("tied", "sgd"), ("tied", "adam"))
           for what in ("losses", "parameters", "states", "evaluated")]
CHECKS = TRAINED + [
    "same training as shard none", "groups in the order forward calls the layers",
    "parameter groups set before compile, as shard none", "parameter groups after compile",
    "checkpoint of shard parameters (sgd) into an unsharded model",
    "going on after saving under shard parameters (sgd)",
    "loaded under shard parameters (sgd)", "resumed under shard parameters (sgd)",
    "checkpoint of shard parameters (adam) into an unsharded model",
    "going on after saving under shard parameters (adam)", "loaded under shard parameters (adam)",
    "resumed under shard parameters (adam)", "set_states under shard parameters",
    "training after set_states under shard parameters", "set_params under shard parameters",
    "a parameter of the model itself", "a parameter read without calling its layer",
    "a layer of a group called outside it", "a layer returning an object", "a second DistOpt of sharded parameters",
    "a loss without a model"]


@needs_gloo
@pytest.mark.parametrize("ranks", [2, 3])
def test_sharded_parameters_train_as_unsharded(tmp_path, ranks):
    """2 ranks: the parameters and losses of shard="none" bit for bit; 3 ranks: within 1e-6."""
    rc, out = run([tandem_command(), "launch", "-n", str(ranks), "--", sys.executable,
                   str(HERE / "distopt_shard_params_worker.py"), str(tmp_path)])
    assert rc == 0, out
    for rank in range(ranks):
        for name in CHECKS:
            assert f"rank {rank} ok {name}\n" in out, f"rank {rank} did not pass {name}:\n{out}"
        assert f"rank {rank} done" in out, out
