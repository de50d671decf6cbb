"""Every DistOpt method on 2 CPU ranks (distopt_worker.py under `tandem launch -n 2`)."""
import sys

from conftest import HERE, needs_gloo, run, tandem_command

CHECKS = ["all_reduce", "synchronize", "all_reduce without wait", "synchronize without wait", "__call__", "backward_and_update", "sync_parameters", "backward_and_update_half",
          "backward_and_update_half clipping", "backward_and_partial_update", "backward_and_sync", "clip_grad_norm",
          "update", "no_sync", "powerSGD",
          "backward_and_sparse_update topK corr", "backward_and_sparse_update threshold",
          "backward_and_sparse_update defaults", "backward_and_sparse_update defaults as C++'s",
          "backward_and_sparse_update positional", "backward_and_update_half positional", "fused_all_reduce",
          "all_reduce_half", "fused_all_reduce_half", "sparsification", "sparsification accumulation",
          "fused_sparsification", "update(param, grad)",
          "parameters from the graph", "average_buffers", "convert_sync_batch_norm",
          "uneven inputs --shard none", "uneven inputs --shard optimizer", "uneven inputs --shard gradients"]


@needs_gloo
def test_every_method_on_two_ranks():
    rc, out = run([tandem_command(), "launch", "-n", "2", "--", sys.executable, str(HERE / "distopt_worker.py")])
    assert rc == 0, out
    for rank in (0, 1):
        for name in CHECKS:
            assert f"rank {rank} ok {name}\n" in out, f"rank {rank} did not pass {name}:\n{out}"
        assert f"rank {rank} done" in out, out


STATE_CHECKS = ["saved state --shard optimizer", "going on after saving --shard optimizer", "resumed --shard optimizer",
                "saved state --shard gradients", "going on after saving --shard gradients", "resumed --shard gradients",
                "a group added after compile --shard optimizer", "a group added after compile --shard gradients",
                "a group moved into after compile --shard optimizer",
                "a group moved into after compile --shard gradients", "frozen parameters from rank 0",
                "frozen parameters stay frozen", "check_consistency and sync_parameters of frozen parameters",
                "frozen after DistOpt took the parameters"]


@needs_gloo
def test_state_groups_and_frozen_parameters_on_two_ranks(tmp_path):
    rc, out = run([tandem_command(), "launch", "-n", "2", "--", sys.executable, str(HERE / "distopt_state_worker.py"),
                   str(tmp_path)])
    assert rc == 0, out
    for rank in (0, 1):
        for name in STATE_CHECKS:
            assert f"rank {rank} ok {name}\n" in out, f"rank {rank} did not pass {name}:\n{out}"
        assert f"rank {rank} done" in out, out
